/* test_loopguard_mt.c — the loop guard's port record (core/loopguard.c) under concurrent use.
 *
 * Two writers record datagram sockets into the same table at once, keeping one in 32 open and
 * closing the rest, so the table is rebuilt again and again (it fills up with the closed
 * sockets' entries and drops them) while two readers check the ports of the sockets kept so
 * far: each must be found every time, whichever buffer the check lands in. Each writer finds
 * its socket right after recording it. At the end, with the threads joined, every kept port is
 * found and, once closed, none is. Run in the TSan tree.
 * Under TSan it runs from tests/unit/mt.h's own main() (see there why). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mt.h"

#include "core/loopguard.h"

#define WRITERS 2
#define READERS 2
#define SOCKETS 4000 /* per writer */
#define KEEP_EVERY 32 /* few live ports: a small table, rebuilt every hundred records or so */
#define KEPT (SOCKETS / KEEP_EVERY)
#define RUNS 4

struct writer {
	pthread_t th;
	struct loopguard *lg;
	_Atomic int n; /* ports published so far (release: port[] before it) */
	uint16_t port[KEPT];
	int fd[KEPT];
};

struct reader {
	pthread_t th;
	struct writer *w;
	atomic_bool *stop;
	uint32_t seed;
	uint64_t checks;
};

static uint16_t port_of(int fd)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);

	CHECK_EQ(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	return ntohs(sa.sin_port);
}

static void *write_main(void *arg)
{
	struct writer *w = arg;

	for (int i = 0; i < SOCKETS; i++) {
		int fd = socket(AF_INET, SOCK_DGRAM, 0);
		uint16_t port;

		CHECK_GEQ(fd, 0);
		CHECK_EQ(loopguard_bind(w->lg, fd, 4, SOCK_DGRAM), 0);
		port = port_of(fd);
		CHECK(loopguard_hit(w->lg, 1, 4, htons(port)));
		if (i % KEEP_EVERY) {
			close(fd);
			continue;
		}
		int n = atomic_load_explicit(&w->n, memory_order_relaxed);
		w->port[n] = port;
		w->fd[n] = fd;
		atomic_store_explicit(&w->n, n + 1, memory_order_release);
	}
	return NULL;
}

static uint32_t rnd(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

static void *read_main(void *arg)
{
	struct reader *r = arg;

	while (!atomic_load(r->stop)) {
		for (int k = 0; k < WRITERS; k++) {
			struct writer *w = &r->w[k];
			int n = atomic_load_explicit(&w->n, memory_order_acquire);

			if (n == 0)
				continue;
			CHECK(loopguard_hit(w->lg, 1, 4, htons(w->port[rnd(&r->seed) % (uint32_t)n])));
			r->checks++;
		}
	}
	return NULL;
}

/* One run: the writers and readers at once on a fresh record. */
static void run(void)
{
	static struct writer w[WRITERS];
	struct reader r[READERS];
	struct loopguard *lg;
	atomic_bool stop = false;

	CHECK_EQ(loopguard_new(NULL, NULL, &lg), 0);
	for (int k = 0; k < WRITERS; k++) {
		w[k].lg = lg;
		atomic_store(&w[k].n, 0);
	}
	for (int k = 0; k < READERS; k++) {
		r[k] = (struct reader){ .w = w, .stop = &stop, .seed = 2463534242u + (uint32_t)k };
		CHECK_EQ(pthread_create(&r[k].th, NULL, read_main, &r[k]), 0);
	}
	for (int k = 0; k < WRITERS; k++)
		CHECK_EQ(pthread_create(&w[k].th, NULL, write_main, &w[k]), 0);
	for (int k = 0; k < WRITERS; k++)
		CHECK_EQ(pthread_join(w[k].th, NULL), 0);
	atomic_store(&stop, true);
	for (int k = 0; k < READERS; k++) {
		CHECK_EQ(pthread_join(r[k].th, NULL), 0);
		CHECK_GT(r[k].checks, 0);
	}
	for (int k = 0; k < WRITERS; k++) {
		CHECK_EQ(atomic_load(&w[k].n), KEPT);
		for (int i = 0; i < KEPT; i++)
			CHECK(loopguard_hit(lg, 1, 4, htons(w[k].port[i])));
	}
	for (int k = 0; k < WRITERS; k++)
		for (int i = 0; i < KEPT; i++)
			close(w[k].fd[i]);
	for (int k = 0; k < WRITERS; k++)
		for (int i = 0; i < KEPT; i++)
			CHECK(!loopguard_hit(lg, 1, 4, htons(w[k].port[i])));
	loopguard_free(lg);
}

MT_TEST(loopguard_mt, concurrent_records_and_checks_across_rebuilds)
{
	/* A check that lands in a buffer just retired is rare: a few runs give it its chances. */
	for (int i = 0; i < RUNS; i++)
		run();
}
