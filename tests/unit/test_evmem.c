/* test_evmem.c — libevent's smallest blocks from a region of their own: libevent's
 * per-descriptor records land there (not on the heap) and are kept for the base's life, cells
 * are reused, larger blocks and blocks from before the install go to and come back from
 * malloc, and threads may allocate at once. */
#include <criterion/criterion.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/evmem.h"

static void noop(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
}

static uint64_t cells(void)
{
	struct evmem_stats st;

	evmem_get_stats(&st);
	return st.cells;
}

/* The records an event base keeps per descriptor number come from the region, stay while the
 * base lives (even after the descriptors close) and go back with the base. */
Test(evmem, the_records_of_watched_descriptors_live_in_the_region)
{
	enum { N = 200 };
	int sv[N][2];
	struct event *ev[N];

	cr_assert_eq(evmem_install(), 0);
	cr_assert_eq(evmem_install(), 0, "a second install returns the first's result");
	struct event_base *base = event_base_new();
	cr_assert_not_null(base);
	uint64_t c0 = cells();
	for (int i = 0; i < N; i++) {
		cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]), 0);
		ev[i] = event_new(base, sv[i][0], EV_READ | EV_PERSIST, noop, NULL);
		cr_assert_not_null(ev[i]);
		cr_assert_eq(event_add(ev[i], NULL), 0);
	}
	uint64_t c1 = cells();
	cr_expect_geq(c1 - c0, N, "one record per descriptor watched: %llu cells for %d",
		      (unsigned long long)(c1 - c0), N);
	for (int i = 0; i < N; i++) {
		event_free(ev[i]);
		close(sv[i][0]);
		close(sv[i][1]);
	}
	cr_expect_eq(cells(), c1, "the records stay for the base's life");
	event_base_free(base);
	cr_expect_leq(cells(), c0, "the base took its records with it");
}

Test(evmem, cells_are_reused_and_larger_blocks_go_to_malloc)
{
	struct evmem_stats a, b;

	cr_assert_eq(evmem_install(), 0);
	uint8_t *p = evmem_malloc(EVMEM_CELL);
	cr_assert_not_null(p);
	memset(p, 0xab, EVMEM_CELL);
	evmem_get_stats(&a);
	evmem_free(p);
	uint8_t *q = evmem_malloc(7);
	evmem_get_stats(&b);
	cr_expect_eq(q, p, "the freed cell is handed out again");
	cr_expect_eq(b.cells_high, a.cells_high, "no new cell for a reused one");
	cr_expect_eq(b.cells, a.cells);

	/* Shrinking in place, growing out of the region with the bytes kept. */
	memset(q, 0x5a, EVMEM_CELL);
	cr_expect_eq(evmem_realloc(q, 3), q);
	uint8_t *r = evmem_realloc(q, 100);
	cr_assert_not_null(r);
	cr_expect_neq(r, q);
	for (unsigned i = 0; i < EVMEM_CELL; i++)
		cr_expect_eq(r[i], 0x5a);
	evmem_get_stats(&b);
	cr_expect_eq(b.cells, a.cells - 1, "the cell went back when the block grew out of it");
	r = evmem_realloc(r, 5000);
	cr_assert_not_null(r);
	cr_expect_eq(r[EVMEM_CELL - 1], 0x5a);
	evmem_free(r);

	/* A block from malloc (libevent's, from before the install) comes back to free. */
	void *m = malloc(12);
	cr_assert_not_null(m);
	evmem_free(m);
	evmem_free(NULL);
	/* Nothing or more than a cell: malloc's. */
	void *big = evmem_malloc(EVMEM_CELL + 1);
	evmem_get_stats(&b);
	cr_expect_eq(b.cells, a.cells - 1);
	evmem_free(big);
	void *z = evmem_realloc(NULL, 9);
	evmem_get_stats(&b);
	cr_expect_eq(b.cells, a.cells, "realloc of NULL is an allocation");
	evmem_free(z);
}

#define PER_THREAD 20000

static void *churn(void *arg)
{
	uintptr_t tag = (uintptr_t)arg;
	static __thread uint64_t *held[64];

	for (int i = 0; i < PER_THREAD; i++) {
		int slot = i % 64;
		if (held[slot]) {
			if (held[slot][0] != tag * 1000003u + (uint64_t)slot)
				return (void *)1; /* another thread wrote into our cell */
			evmem_free(held[slot]);
		}
		held[slot] = evmem_malloc(EVMEM_CELL);
		if (!held[slot])
			return (void *)1;
		held[slot][0] = tag * 1000003u + (uint64_t)slot;
		held[slot][1] = tag;
	}
	for (int s = 0; s < 64; s++) {
		if (held[s][1] != tag)
			return (void *)1;
		evmem_free(held[s]);
		held[s] = NULL;
	}
	return NULL;
}

Test(evmem, threads_never_share_a_cell)
{
	pthread_t t[4];
	void *ret;

	cr_assert_eq(evmem_install(), 0);
	uint64_t c0 = cells();
	for (uintptr_t i = 0; i < 4; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, churn, (void *)(i + 1)), 0);
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(pthread_join(t[i], &ret), 0);
		cr_expect_null(ret, "thread %d saw a cell written by another", i);
	}
	cr_expect_eq(cells(), c0, "every cell back");
}
