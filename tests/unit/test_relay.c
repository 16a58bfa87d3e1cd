/* test_relay.c — the relay over real loopback sockets, driven by a real libevent loop.
 *
 *   peer A (app) ══TCP══ stream a ─┐            ┌─ stream b ══TCP══ peer B (server)
 *                                  └── relay ───┘
 *
 * Peers are test code on the same loop: each sends a PRNG stream (hashed as generated) and
 * hashes what it receives, so "arrives byte-identical" is a hash and length comparison. Every
 * wait is bounded (run_until with a deadline) and loopback only (127.0.0.1, AF_UNIX).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/bufpool.h"
#include "core/evmem.h"
#include "dispatch/pipepool.h"
#include "dispatch/relay.h"
#include "dispatch/stream.h"
#include "failalloc.h"
#include "testutil.h"

#define MIB (1u << 20)
#define CHUNK (64u << 10)
#define BUF_SIZE (64u << 10)
#define PIPE_SIZE (256u << 10)

/* ---- a streaming hash independent of chunk boundaries ---------------------------------- */

struct hash {
	uint64_t h, carry, len;
	unsigned n; /* bytes in carry */
};

static void hash_init(struct hash *x)
{
	*x = (struct hash){ .h = 0xcbf29ce484222325ULL };
}

static void hash_word(struct hash *x, uint64_t w)
{
	x->h = (x->h ^ w) * 0x100000001b3ULL;
	x->h ^= x->h >> 29;
}

static void hash_update(struct hash *x, const uint8_t *p, size_t n)
{
	x->len += n;
	for (; n && x->n; n--, p++) {
		x->carry |= (uint64_t)*p << (8 * x->n);
		if (++x->n == 8) {
			hash_word(x, x->carry);
			x->carry = 0;
			x->n = 0;
		}
	}
	for (; n >= 8; n -= 8, p += 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		hash_word(x, w);
	}
	for (; n; n--, p++)
		x->carry |= (uint64_t)*p << (8 * x->n++);
}

static uint64_t hash_final(const struct hash *x)
{
	struct hash t = *x;

	hash_word(&t, t.carry);
	hash_word(&t, t.len);
	return t.h;
}

/* ---- the environment: loop, budget, pools ---------------------------------------------- */

struct env {
	struct event_base *base;
	struct budget *budget;
	struct bufpool *bufs;
	struct pipepool *pipes;
	struct relay_counters ctr;
	struct event *tick;
};

static struct env E;

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
}

static void env_fini(void)
{
	if (!E.base)
		return;
	event_free(E.tick);
	pipepool_free(E.pipes);
	bufpool_free(E.bufs);
	budget_free(E.budget);
	event_base_free(E.base);
	memset(&E, 0, sizeof(E));
}

static void suite_fini(void)
{
	env_fini();
	CHECK_LEAKS();
}

static void env_init(uint32_t fds, uint32_t pool_idle_ms, uint32_t max_bufs)
{
	struct budget_limits lim;
	struct pipepool_params pp;
	struct timeval tv = { 0, 5000 };

	env_fini(); /* a test may re-create the suite's environment with other limits */
	signal(SIGPIPE, SIG_IGN); /* splice into a reset socket raises it (relay.h) */
	E.base = event_base_new();
	cr_assert(E.base);
	budget_limits_profile(&lim, BUDGET_PROFILE_DESKTOP);
	lim.fds = fds;
	cr_assert_eq(budget_new(&lim, &E.budget), 0);
	cr_assert_eq(bufpool_new(E.budget, "relay", BUF_SIZE, max_bufs, &E.bufs), 0);
	pipepool_params_default(&pp);
	pp.pipe_size = PIPE_SIZE;
	pp.idle_ms = pool_idle_ms;
	cr_assert_eq(pipepool_new(E.base, E.budget, &pp, &E.pipes), 0);
	/* A heartbeat so EVLOOP_ONCE never blocks past a run_until deadline. */
	E.tick = event_new(E.base, -1, EV_PERSIST, on_tick, NULL);
	event_add(E.tick, &tv);
}

static void setup(void)
{
	env_init(16384, 200, 1024);
}

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Run the loop until pred(arg) or timeout_ms; returns pred's final value. */
static bool run_until(bool (*pred)(void *), void *arg, int timeout_ms)
{
	int64_t end = mono_ns() + (int64_t)timeout_ms * 1000000LL;

	while (!pred(arg) && mono_ns() < end)
		event_base_loop(E.base, EVLOOP_ONCE);
	return pred(arg);
}

static bool never(void *arg)
{
	return false;
}

static void run_for(int ms)
{
	run_until(never, NULL, ms);
}

/* ---- sockets ----------------------------------------------------------------------------- */

static void set_nonblock(int fd)
{
	cr_assert_eq(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
}

/* A connected loopback TCP pair. small: 32 KiB socket buffers on both (set before connect,
 * inherited by the accepted socket) so back-pressure reaches the sender quickly. */
static void tcp_pair(int *x, int *y, bool small)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int one = 1, sz = 32 << 10;
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert(l >= 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	*x = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(*x >= 0);
	if (small) {
		setsockopt(l, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
		setsockopt(l, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
		setsockopt(*x, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
		setsockopt(*x, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	}
	cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(l, 4), 0);
	cr_assert_eq(getsockname(l, (struct sockaddr *)&sa, &len), 0);
	cr_assert_eq(connect(*x, (struct sockaddr *)&sa, sizeof(sa)), 0);
	*y = accept4(l, NULL, NULL, SOCK_CLOEXEC);
	cr_assert(*y >= 0);
	close(l);
	set_nonblock(*x);
	set_nonblock(*y);
}

static void rst_close(int fd)
{
	struct linger lg = { 1, 0 };

	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

/* ---- peers: the apps on both ends ----------------------------------------------------------- */

struct peer {
	int fd;
	struct event *rd, *wr;
	/* sending */
	uint64_t to_send, generated, sent;
	bool send_after_eof; /* start sending only once EOF was read */
	bool shut_when_sent; /* shutdown(SHUT_WR) after to_send bytes */
	bool shut;
	struct tu_rng rng;
	struct hash tx;
	size_t tx_off, tx_len;
	/* receiving */
	bool paused;
	uint64_t pause_at;   /* nonzero: stop reading (paused) once this many bytes arrived */
	bool rx_past_tx_err; /* a send error ends sending only: reading goes on to EOF */
	int tx_err;          /* with rx_past_tx_err: the send error */
	uint64_t received;
	uint64_t sent_at_eof;
	struct hash rx;
	bool eof;
	int err; /* the first error any call on fd returned */
	uint8_t txbuf[CHUNK], rxbuf[CHUNK];
};

static void peer_fail(struct peer *p, int err)
{
	if (!p->err)
		p->err = err;
	event_del(p->rd);
	event_del(p->wr);
}

static void peer_want_write(struct peer *p)
{
	if (!p->err && !p->shut && (!p->send_after_eof || p->eof))
		event_add(p->wr, NULL);
}

static void peer_on_read(evutil_socket_t fd, short what, void *arg)
{
	struct peer *p = arg;

	for (int i = 0; i < 16; i++) {
		size_t want = CHUNK;
		ssize_t n;

		if (p->pause_at && p->pause_at - p->received < want)
			want = p->pause_at - p->received;
		if (want == 0) {
			p->paused = true;
			event_del(p->rd);
			return;
		}
		n = recv(p->fd, p->rxbuf, want, 0);
		if (n > 0) {
			hash_update(&p->rx, p->rxbuf, (size_t)n);
			p->received += (uint64_t)n;
			continue;
		}
		if (n == 0) {
			p->eof = true;
			p->sent_at_eof = p->sent;
			event_del(p->rd);
			peer_want_write(p);
		} else if (errno != EAGAIN) {
			peer_fail(p, errno);
		}
		return;
	}
}

static void peer_on_write(evutil_socket_t fd, short what, void *arg)
{
	struct peer *p = arg;

	for (int i = 0; i < 16; i++) {
		ssize_t n;
		if (p->tx_off == p->tx_len) {
			size_t k = p->to_send - p->generated < CHUNK ? p->to_send - p->generated
								     : CHUNK;
			if (k == 0) {
				if (p->shut_when_sent && shutdown(p->fd, SHUT_WR) == 0)
					p->shut = true;
				event_del(p->wr);
				return;
			}
			tu_rand_bytes(&p->rng, p->txbuf, k);
			hash_update(&p->tx, p->txbuf, k);
			p->generated += k;
			p->tx_off = 0;
			p->tx_len = k;
		}
		n = send(p->fd, p->txbuf + p->tx_off, p->tx_len - p->tx_off, MSG_NOSIGNAL);
		if (n > 0) {
			p->tx_off += (size_t)n;
			p->sent += (uint64_t)n;
			continue;
		}
		if (errno != EAGAIN && p->rx_past_tx_err) {
			p->tx_err = errno;
			event_del(p->wr);
		} else if (errno != EAGAIN) {
			peer_fail(p, errno);
		}
		return;
	}
}

static struct peer *peer_new_on(struct event_base *base, int fd, uint64_t seed,
				uint64_t to_send, bool shut_when_sent)
{
	struct peer *p = calloc(1, sizeof(*p));

	cr_assert(p);
	p->fd = fd;
	p->to_send = to_send;
	p->shut_when_sent = shut_when_sent;
	tu_rng_seed(&p->rng, seed);
	hash_init(&p->tx);
	hash_init(&p->rx);
	p->rd = event_new(base, fd, EV_READ | EV_PERSIST, peer_on_read, p);
	p->wr = event_new(base, fd, EV_WRITE | EV_PERSIST, peer_on_write, p);
	cr_assert(p->rd && p->wr);
	return p;
}

static struct peer *peer_new(int fd, uint64_t seed, uint64_t to_send, bool shut_when_sent)
{
	return peer_new_on(E.base, fd, seed, to_send, shut_when_sent);
}

static void peer_start(struct peer *p)
{
	if (!p->paused)
		event_add(p->rd, NULL);
	peer_want_write(p);
}

static void peer_resume(struct peer *p)
{
	p->paused = false;
	p->pause_at = 0;
	event_add(p->rd, NULL);
}

static void peer_free(struct peer *p)
{
	if (!p)
		return;
	event_free(p->rd);
	event_free(p->wr);
	if (p->fd >= 0)
		close(p->fd);
	free(p);
}

/* ---- the relay under test ------------------------------------------------------------------ */

struct h {
	struct peer *a, *b;
	struct relay *r;
	int done_calls;
	enum relay_end reason;
	struct relay_stats st;
	int64_t t_start, t_done;
};

static void on_done(void *arg, enum relay_end reason, const struct relay_stats *st)
{
	struct h *h = arg;

	h->done_calls++;
	h->reason = reason;
	h->st = *st;
	h->r = NULL;
	h->t_done = mono_ns();
}

struct h_opts {
	enum ts_relay_mode mode;
	uint32_t idle_ms;
	const uint8_t *early;
	size_t early_len;
	bool small;           /* small socket buffers */
};

static void h_relay(struct h *h, struct stream *sa, struct stream *sb, const struct h_opts *o)
{
	struct relay_params p = {
		.mode = o->mode,
		.bufs = E.bufs,
		.pipes = E.pipes,
		.budget = E.budget,
		.idle_ms = o->idle_ms,
		.early = o->early,
		.early_len = o->early_len,
		.counters = &E.ctr,
	};

	h->t_start = mono_ns();
	cr_assert_eq(relay_new(E.base, sa, sb, &p, on_done, h, &h->r), 0);
}

/* Two TCP pairs, the relay between them, peers not started yet. */
static void h_start(struct h *h, const struct h_opts *o)
{
	int a_app, a_rel, b_rel, b_app;
	struct stream *sa, *sb;

	memset(h, 0, sizeof(*h));
	tcp_pair(&a_app, &a_rel, o->small);
	tcp_pair(&b_rel, &b_app, o->small);
	cr_assert_eq(stream_sock_new(E.base, a_rel, &sa), 0);
	cr_assert_eq(stream_sock_new(E.base, b_rel, &sb), 0);
	h->a = peer_new(a_app, 0xA, 0, false);
	h->b = peer_new(b_app, 0xB, 0, false);
	h_relay(h, sa, sb, o);
}

static void h_fini(struct h *h)
{
	if (h->r)
		relay_cancel(h->r);
	peer_free(h->a);
	peer_free(h->b);
	h->a = h->b = NULL;
}

static bool all_done(void *arg)
{
	struct h *h = arg;

	return h->a->eof && h->b->eof && h->done_calls > 0;
}

static void expect_intact(const struct peer *from, const struct peer *to)
{
	cr_assert_eq(to->received, from->sent, "received %llu, sent %llu",
		     (unsigned long long)to->received, (unsigned long long)from->sent);
	cr_assert_eq(hash_final(&to->rx), hash_final(&from->tx), "payload differs");
}

/* Run until both peers saw EOF and the relay ended, then: every byte arrived both ways, and
 * the relay ended as done. */
static void run_to_done_intact(struct h *h, int timeout_ms)
{
	cr_assert(run_until(all_done, h, timeout_ms));
	expect_intact(h->a, h->b);
	expect_intact(h->b, h->a);
	cr_assert_eq(h->reason, RELAY_DONE);
}

TestSuite(relay, .init = setup, .fini = suite_fini, .timeout = 120);

/* ---- bulk: 20 MiB each way at once --------------------------------------------------------- */

/* The peers run on their own loop in a second thread, so the relay's loop thread measures the
 * relay (splice vs copy) rather than the peers' PRNG and hashing. */
struct peer_thread {
	struct event_base *base;
	struct peer *a, *b;
	atomic_bool finished;
};

static void *peer_thread_main(void *arg)
{
	struct peer_thread *t = arg;
	struct event *tick = event_new(t->base, -1, EV_PERSIST, on_tick, NULL);
	struct timeval tv = { 0, 5000 };
	int64_t end = mono_ns() + 60 * 1000000000LL;

	event_add(tick, &tv);
	peer_start(t->a);
	peer_start(t->b);
	while (!(t->a->eof && t->b->eof) && !t->a->err && !t->b->err && mono_ns() < end)
		event_base_loop(t->base, EVLOOP_ONCE);
	event_free(tick);
	atomic_store(&t->finished, true);
	return NULL;
}

struct bulk_wait {
	struct h *h;
	struct peer_thread *t;
};

static bool bulk_done(void *arg)
{
	struct bulk_wait *w = arg;

	return w->h->done_calls > 0 && atomic_load(&w->t->finished);
}

static int64_t thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Returns MiB/s of wall time (both directions summed); *cpu_mibs: MiB per CPU-second of the
 * relay's thread, the relay's own cost whichever side is the bottleneck. */
static double bulk(enum ts_relay_mode mode, double *cpu_mibs)
{
	struct h h;
	struct h_opts o = { .mode = mode };
	struct peer_thread t = { .base = event_base_new() };
	struct bulk_wait w = { &h, &t };
	int a_app, a_rel, b_rel, b_app;
	struct stream *sa, *sb;
	struct pipepool_stats ps;
	struct bufpool_stats bs;
	pthread_t th;
	double secs;
	int64_t cpu0;

	cr_assert(t.base);
	memset(&h, 0, sizeof(h));
	tcp_pair(&a_app, &a_rel, false);
	tcp_pair(&b_rel, &b_app, false);
	cr_assert_eq(stream_sock_new(E.base, a_rel, &sa), 0);
	cr_assert_eq(stream_sock_new(E.base, b_rel, &sb), 0);
	h.a = t.a = peer_new_on(t.base, a_app, 0xA, 20 * MIB, true);
	h.b = t.b = peer_new_on(t.base, b_app, 0xB, 20 * MIB, true);
	h_relay(&h, sa, sb, &o);
	cpu0 = thread_cpu_ns();
	cr_assert_eq(pthread_create(&th, NULL, peer_thread_main, &t), 0);
	run_until(bulk_done, &w, 60000);
	*cpu_mibs = 40.0 / ((double)(thread_cpu_ns() - cpu0) / 1e9);
	pthread_join(th, NULL);
	cr_assert(bulk_done(&w), "transfer did not complete");
	expect_intact(h.a, h.b);
	expect_intact(h.b, h.a);
	cr_assert_eq(h.done_calls, 1);
	cr_assert_eq(h.reason, RELAY_DONE);
	cr_assert_eq(h.st.bytes[RELAY_UP], 20 * MIB);
	cr_assert_eq(h.st.bytes[RELAY_DOWN], 20 * MIB);
	if (mode == TS_RELAY_SPLICE) {
		cr_assert_eq(h.st.splice_bytes, 40 * MIB);
		cr_assert_eq(h.st.copy_bytes, 0);
	} else {
		cr_assert_eq(h.st.splice_bytes, 0);
		cr_assert_eq(h.st.copy_bytes, 40 * MIB);
	}
	/* Nothing held after the end: pipes back in the pool, buffers back in theirs. */
	pipepool_get_stats(E.pipes, &ps);
	cr_assert_eq(ps.lent, 0);
	cr_assert_eq(ps.created > 0, mode == TS_RELAY_SPLICE);
	bufpool_get_stats(E.bufs, &bs);
	cr_assert_eq(bs.bufs_in_use, 0);
	cr_assert_eq(ctr_get(&E.ctr.active), 0);
	cr_assert_eq(ctr_get(&E.ctr.pipe_bytes_inflight), 0);
	cr_assert_eq(ctr_get(&E.ctr.buf_bytes_inflight), 0);
	secs = (double)(h.t_done - h.t_start) / 1e9;
	h_fini(&h);
	event_base_free(t.base);
	return 40.0 / secs;
}

Test(relay, bulk_splice_20mib_each_way)
{
	double cpu, mibs = bulk(TS_RELAY_SPLICE, &cpu);
	fprintf(stderr, "relay splice: 20 MiB each way: %.0f MiB/s wall (both directions summed), "
		"%.0f MiB per relay-thread CPU second\n", mibs, cpu);
}

Test(relay, bulk_copy_20mib_each_way)
{
	double cpu, mibs = bulk(TS_RELAY_COPY, &cpu);
	fprintf(stderr, "relay copy:   20 MiB each way: %.0f MiB/s wall (both directions summed), "
		"%.0f MiB per relay-thread CPU second\n", mibs, cpu);
}

/* ---- half-close ---------------------------------------------------------------------------- */

struct half_state {
	struct h *h;
	struct peer *first;
};

static bool first_eof_seen(void *arg)
{
	struct half_state *s = arg;
	struct peer *other = s->first == s->h->a ? s->h->b : s->h->a;

	return other->eof;
}

/* `first` sends 1 MiB and shuts down; the other side starts sending 2 MiB only after it has
 * read that EOF, so the second direction provably flows after the half-close. */
static void half_close(enum ts_relay_mode mode, bool a_first)
{
	struct h h;
	struct h_opts o = { .mode = mode };
	struct peer *first, *second;
	struct half_state hs;
	struct relay_stats st;

	h_start(&h, &o);
	first = a_first ? h.a : h.b;
	second = a_first ? h.b : h.a;
	first->to_send = MIB;
	first->shut_when_sent = true;
	second->to_send = 2 * MIB;
	second->send_after_eof = true;
	second->shut_when_sent = true;
	peer_start(first);
	peer_start(second);
	hs = (struct half_state){ &h, first };
	cr_assert(run_until(first_eof_seen, &hs, 10000));
	/* The EOF came after all the data before it, and the relay is still up. */
	expect_intact(first, second);
	cr_assert_eq(h.done_calls, 0);
	relay_get_stats(h.r, &st);
	cr_assert(st.finished[a_first ? RELAY_UP : RELAY_DOWN]);
	cr_assert(!st.finished[a_first ? RELAY_DOWN : RELAY_UP]);
	cr_assert(run_until(all_done, &h, 10000));
	expect_intact(second, first);
	cr_assert_eq(second->sent, 2 * MIB);
	cr_assert_eq(h.reason, RELAY_DONE);
	cr_assert_eq(h.done_calls, 1);
	h_fini(&h);
}

Test(relay, half_close_a_first_splice)
{
	half_close(TS_RELAY_SPLICE, true);
}

Test(relay, half_close_b_first_splice)
{
	half_close(TS_RELAY_SPLICE, false);
}

Test(relay, half_close_a_first_copy)
{
	half_close(TS_RELAY_COPY, true);
}

Test(relay, half_close_b_first_copy)
{
	half_close(TS_RELAY_COPY, false);
}

/* ---- resets -------------------------------------------------------------------------------- */

static bool peer_b_failed(void *arg)
{
	struct h *h = arg;

	return h->b->err != 0 && h->done_calls > 0;
}

static void reset_idle(enum ts_relay_mode mode)
{
	struct h h;
	struct h_opts o = { .mode = mode };

	h_start(&h, &o);
	peer_start(h.a);
	peer_start(h.b);
	run_for(20);
	event_del(h.a->rd);
	rst_close(h.a->fd);
	h.a->fd = -1;
	cr_assert(run_until(peer_b_failed, &h, 2000));
	cr_assert_eq(h.b->err, ECONNRESET, "B saw %s", strerror(h.b->err));
	cr_assert_eq(h.reason, RELAY_ERROR_A);
	cr_assert_eq(h.done_calls, 1);
	h_fini(&h);
}

Test(relay, reset_propagates_splice)
{
	reset_idle(TS_RELAY_SPLICE);
}

Test(relay, reset_propagates_copy)
{
	reset_idle(TS_RELAY_COPY);
}

static bool peer_a_failed(void *arg)
{
	struct h *h = arg;

	return h->a->err != 0 && h->done_calls > 0;
}

/* B stops reading while A streams, so the relay holds bytes for B; then B resets. The relay's
 * pending write fails, A gets a RST, and the pipe still holding data is discarded, not reused. */
static void reset_mid_transfer(enum ts_relay_mode mode)
{
	struct h h;
	struct h_opts o = { .mode = mode, .small = true };
	struct relay_stats st;
	struct pipepool_stats before, after;

	h_start(&h, &o);
	h.a->to_send = 64 * MIB;
	h.b->paused = true;
	peer_start(h.a);
	peer_start(h.b);
	run_for(200);
	relay_get_stats(h.r, &st);
	pipepool_get_stats(E.pipes, &before);
	event_del(h.b->rd);
	rst_close(h.b->fd);
	h.b->fd = -1;
	cr_assert(run_until(peer_a_failed, &h, 2000));
	cr_assert_eq(h.a->err, ECONNRESET, "A saw %s", strerror(h.a->err));
	cr_assert_eq(h.reason, RELAY_ERROR_B);
	pipepool_get_stats(E.pipes, &after);
	cr_assert_eq(after.lent, 0);
	if (st.pipe_inflight[RELAY_UP] > 0)
		cr_assert_eq(after.discarded, before.discarded + 1);
	cr_assert_eq(ctr_get(&E.ctr.pipe_bytes_inflight), 0);
	cr_assert_eq(ctr_get(&E.ctr.buf_bytes_inflight), 0);
	h_fini(&h);
}

Test(relay, reset_mid_transfer_splice)
{
	reset_mid_transfer(TS_RELAY_SPLICE);
}

Test(relay, reset_mid_transfer_copy)
{
	reset_mid_transfer(TS_RELAY_COPY);
}

/* ---- a complete response, its FIN, then a reset (HTTP "413, then RST") --------------------- */

/* The response tail A leaves unread until after the reset: more than A's receive buffer and
 * the relay's send buffer toward A can hold (32 KiB each, doubled by the kernel), so part of it
 * is still inside the relay (pipe or copy buffer) or its socket from B when the reset comes. */
#define FIN_RST_TAIL (160u << 10)
/* A tail that does fit there (and is not all acknowledged while A does not read). */
#define FIN_RST_SMALL_TAIL (64u << 10)

/* Bytes fd has sent (and its FIN) that the other end has not acknowledged yet. */
static int unacked_bytes(int fd)
{
	int n = -1;

	cr_assert_eq(ioctl(fd, SIOCOUTQ, &n), 0, "SIOCOUTQ: %s", strerror(errno));
	return n;
}

/* The resetting peer (`sender`) and the one that must get everything (`receiver`). */
struct fin_rst {
	struct h *h;
	struct peer *sender, *receiver;
};

static bool sent_and_receiver_paused(void *arg)
{
	struct fin_rst *f = arg;

	return f->sender->shut && unacked_bytes(f->sender->fd) == 0 && f->receiver->paused;
}

static bool receiver_read_to_end(void *arg)
{
	struct fin_rst *f = arg;

	return (f->receiver->eof || f->receiver->err) && f->h->done_calls > 0;
}

/* The sender sends 1 MiB and its FIN, then, while the receiver keeps sending to it, reads a
 * little and resets (SO_LINGER {1, 0}): with the sender as the server, HTTP's "413, then RST".
 * The relay's socket acknowledged all of the sender's data and FIN before the reset, so without
 * the proxy the receiver would read every byte. The receiver stops reading `tail` short of the
 * end until after the reset, so that tail is still on its way when the reset comes.
 * Sets up and resets; the caller resumes the receiver (or not). */
static void fin_then_reset_start(struct fin_rst *f, struct h *h, enum ts_relay_mode mode,
				 bool server_resets, uint32_t idle_ms, uint32_t tail)
{
	struct h_opts o = { .mode = mode, .small = true, .idle_ms = idle_ms };
	uint8_t little[4096];

	h_start(h, &o);
	*f = (struct fin_rst){ h, server_resets ? h->b : h->a, server_resets ? h->a : h->b };
	f->receiver->to_send = 64 * MIB;
	f->receiver->pause_at = MIB - tail;
	f->receiver->rx_past_tx_err = true;
	f->sender->to_send = MIB;
	f->sender->shut_when_sent = true;
	f->sender->paused = true;
	peer_start(h->a);
	peer_start(h->b);
	cr_assert(run_until(sent_and_receiver_paused, f, 10000),
		  "the 1 MiB was not all acknowledged (the receiver read %llu)",
		  (unsigned long long)f->receiver->received);
	cr_assert(recv(f->sender->fd, little, sizeof(little), 0) > 0, "the sender reads a little");
	rst_close(f->sender->fd);
	f->sender->fd = -1;
	run_for(100); /* the relay meets the reset while the receiver is not reading */
}

/* The receiver gets the whole 1 MiB (hash) and then EOF, not a reset; the relay ends as the
 * sender's error with the sender's direction finished, its other stream closed gracefully. */
static void fin_then_reset(enum ts_relay_mode mode, bool server_resets)
{
	struct h h;
	struct fin_rst f;
	enum relay_dir_id dir = server_resets ? RELAY_DOWN : RELAY_UP;
	uint64_t drained = ctr_get(&E.ctr.drained_ends);

	fin_then_reset_start(&f, &h, mode, server_resets, 0, FIN_RST_TAIL);
	cr_assert_eq(h.done_calls, 0, "the relay ended before the tail was delivered");
	peer_resume(f.receiver);
	cr_assert(run_until(receiver_read_to_end, &f, 10000), "got %llu bytes, no EOF",
		  (unsigned long long)f.receiver->received);
	/* The bytes first: once an upload has consumed a reset, the read reports EOF too. */
	expect_intact(f.sender, f.receiver);
	cr_assert_eq(f.receiver->received, MIB);
	cr_assert_eq(f.receiver->err, 0, "the read ended with %s, not EOF",
		     strerror(f.receiver->err));
	cr_assert(f.receiver->eof);
	cr_assert_eq(h.reason, server_resets ? RELAY_ERROR_B : RELAY_ERROR_A);
	cr_assert_eq(h.done_calls, 1);
	cr_assert(h.st.finished[dir]);
	cr_assert(!h.st.finished[1 - dir]);
	cr_assert_eq(h.st.bytes[dir], MIB);
	cr_assert_eq(ctr_get(&E.ctr.drained_ends), drained + 1);
	cr_assert_eq(ctr_get(&E.ctr.pipe_bytes_inflight), 0);
	cr_assert_eq(ctr_get(&E.ctr.buf_bytes_inflight), 0);
	cr_assert_eq(ctr_get(&E.ctr.active), 0);
	h_fini(&h);
}

Test(relay, fin_then_reset_delivers_response_splice)
{
	fin_then_reset(TS_RELAY_SPLICE, true);
}

Test(relay, fin_then_reset_delivers_response_copy)
{
	fin_then_reset(TS_RELAY_COPY, true);
}

Test(relay, app_fin_then_reset_delivers_request_splice)
{
	fin_then_reset(TS_RELAY_SPLICE, false);
}

Test(relay, app_fin_then_reset_delivers_request_copy)
{
	fin_then_reset(TS_RELAY_COPY, false);
}

static bool relay_ended(void *arg)
{
	return ((struct h *)arg)->done_calls > 0;
}

/* A receiver that never reads a tail small enough for its socket buffers: the relay hands it
 * all over with the FIN, then lingers for acknowledgements that never come, and the idle
 * timeout ends that with aborts, not with a graceful close. */
Test(relay, fin_then_reset_linger_bounded_by_idle)
{
	struct h h;
	struct fin_rst f;
	uint64_t drained = ctr_get(&E.ctr.drained_ends);
	int64_t t0;
	double ms;

	fin_then_reset_start(&f, &h, TS_RELAY_SPLICE, true, 300, FIN_RST_SMALL_TAIL);
	t0 = mono_ns();
	cr_assert(run_until(relay_ended, &h, 3000));
	ms = (double)(h.t_done - t0) / 1e6;
	cr_assert(ms < 1000, "ended %.0f ms after the reset", ms);
	cr_assert_eq(h.reason, RELAY_IDLE);
	cr_assert(h.st.finished[RELAY_DOWN], "the tail and FIN were handed to A's socket");
	cr_assert_eq(ctr_get(&E.ctr.drained_ends), drained);
	cr_assert(f.receiver->received < MIB);
	h_fini(&h);
}

/* ---- idle timeout -------------------------------------------------------------------------- */

static bool both_failed(void *arg)
{
	struct h *h = arg;

	return h->a->err && h->b->err && h->done_calls > 0;
}

Test(relay, idle_timeout_aborts_both)
{
	struct h h;
	struct h_opts o = { .mode = TS_RELAY_SPLICE, .idle_ms = 150 };
	double ms;

	h_start(&h, &o);
	peer_start(h.a);
	peer_start(h.b);
	cr_assert(run_until(both_failed, &h, 3000));
	ms = (double)(h.t_done - h.t_start) / 1e6;
	cr_assert(ms >= 140 && ms < 1000, "idle end after %.0f ms", ms);
	cr_assert_eq(h.reason, RELAY_IDLE);
	cr_assert_eq(h.a->err, ECONNRESET);
	cr_assert_eq(h.b->err, ECONNRESET);
	h_fini(&h);
}

struct trickle {
	struct h *h;
	int left;
};

static void on_trickle(evutil_socket_t fd, short what, void *arg)
{
	struct trickle *t = arg;

	if (t->left-- > 0 && t->h->a->fd >= 0)
		cr_assert_eq(send(t->h->a->fd, "ping", 4, MSG_NOSIGNAL), 4);
}

/* Traffic every 50 ms keeps a 150 ms idle timer from firing; silence then ends it. */
Test(relay, idle_timer_reset_by_traffic)
{
	struct h h;
	struct h_opts o = { .mode = TS_RELAY_COPY, .idle_ms = 150 };
	struct trickle t = { &h, 10 };
	struct timeval tv = { 0, 50000 };
	struct event *ev;

	h_start(&h, &o);
	peer_start(h.a);
	peer_start(h.b);
	ev = event_new(E.base, -1, EV_PERSIST, on_trickle, &t);
	event_add(ev, &tv);
	run_for(450);
	cr_assert_eq(h.done_calls, 0, "idle fired despite traffic");
	cr_assert(h.b->received >= 24);
	cr_assert(run_until(both_failed, &h, 3000));
	cr_assert_eq(h.reason, RELAY_IDLE);
	event_free(ev);
	h_fini(&h);
}

/* ---- back-pressure ------------------------------------------------------------------------- */

struct bp_sample {
	struct h *h;
	uint64_t max_pipe, max_buf, max_pool_bytes;
};

static void bp_sample(struct bp_sample *s)
{
	struct relay_stats st;
	struct bufpool_stats bs;

	relay_get_stats(s->h->r, &st);
	bufpool_get_stats(E.bufs, &bs);
	if (st.pipe_inflight[RELAY_UP] > s->max_pipe)
		s->max_pipe = st.pipe_inflight[RELAY_UP];
	if (st.buf_inflight[RELAY_UP] > s->max_buf)
		s->max_buf = st.buf_inflight[RELAY_UP];
	if (bs.bytes_in_use > s->max_pool_bytes)
		s->max_pool_bytes = bs.bytes_in_use;
}

static bool bp_never(void *arg)
{
	bp_sample(arg);
	return false;
}

/* B does not read for 300 ms while A pushes 32 MiB: A is blocked by TCP, the relay holds at
 * most one pipe / one buffer for the direction; then B reads and everything arrives. */
static void back_pressure(enum ts_relay_mode mode)
{
	struct h h;
	struct h_opts o = { .mode = mode, .small = true };
	struct bp_sample s = { &h, 0, 0, 0 };
	struct relay_stats st;

	h_start(&h, &o);
	h.a->to_send = 32 * MIB;
	h.a->shut_when_sent = true;
	h.b->shut_when_sent = true;
	h.b->paused = true;
	peer_start(h.a);
	peer_start(h.b);
	run_until(bp_never, &s, 300);
	relay_get_stats(h.r, &st);
	cr_assert(h.a->sent < 8 * MIB, "sender was not held back: %llu sent",
		  (unsigned long long)h.a->sent);
	cr_assert(st.pipe_inflight[RELAY_UP] + st.buf_inflight[RELAY_UP] > 0,
		  "the relay should be holding the stalled bytes");
	cr_assert(s.max_pipe <= PIPE_SIZE, "pipe held %llu", (unsigned long long)s.max_pipe);
	cr_assert(s.max_buf <= BUF_SIZE, "buffer held %llu", (unsigned long long)s.max_buf);
	/* One buffer per direction at most (and none in splice mode). */
	cr_assert(s.max_pool_bytes <= (mode == TS_RELAY_COPY ? 2 * BUF_SIZE : 0),
		  "pool bytes %llu", (unsigned long long)s.max_pool_bytes);
	if (mode == TS_RELAY_SPLICE)
		cr_assert(s.max_pipe > 0);
	else
		cr_assert(s.max_buf > 0);
	peer_resume(h.b);
	cr_assert(run_until(all_done, &h, 30000));
	expect_intact(h.a, h.b);
	cr_assert_eq(h.b->received, 32 * MIB);
	cr_assert_eq(h.reason, RELAY_DONE);
	h_fini(&h);
}

Test(relay, back_pressure_splice)
{
	back_pressure(TS_RELAY_SPLICE);
}

Test(relay, back_pressure_copy)
{
	back_pressure(TS_RELAY_COPY);
}

/* ---- early bytes --------------------------------------------------------------------------- */

/* 100 KiB of early bytes (more than one write into a small socket buffer) reach A before the
 * 1 MiB B sends at once: A's hash must equal hash(early || B's stream). */
static void early_bytes(enum ts_relay_mode mode)
{
	struct h h;
	static uint8_t early[100 << 10];
	struct h_opts o = { .mode = mode, .early = early, .early_len = sizeof(early),
			    .small = true };
	struct tu_rng rng;
	struct budget_stats bs;

	tu_rng_seed(&rng, 77);
	tu_rand_bytes(&rng, early, sizeof(early));
	h_start(&h, &o);
	hash_update(&h.b->tx, early, sizeof(early)); /* expected: early first, then B's data */
	h.b->to_send = MIB;
	h.b->shut_when_sent = true;
	h.a->shut_when_sent = true;
	peer_start(h.a);
	peer_start(h.b);
	cr_assert(run_until(all_done, &h, 10000));
	cr_assert_eq(h.a->received, sizeof(early) + MIB);
	cr_assert_eq(hash_final(&h.a->rx), hash_final(&h.b->tx), "early bytes not first");
	cr_assert_eq(h.st.bytes[RELAY_DOWN], sizeof(early) + MIB);
	if (mode == TS_RELAY_SPLICE) {
		cr_assert_eq(h.st.copy_bytes, sizeof(early));
		cr_assert_eq(h.st.splice_bytes, MIB);
	}
	budget_get_stats(E.budget, &bs);
	cr_assert_eq(bs.malloc_bytes_in_use, 0, "early copy not freed");
	h_fini(&h);
}

Test(relay, early_bytes_first_splice)
{
	early_bytes(TS_RELAY_SPLICE);
}

Test(relay, early_bytes_first_copy)
{
	early_bytes(TS_RELAY_COPY);
}

/* ---- pipes: lent only in flight, pool shrinks to zero -------------------------------------- */

static bool pool_empty(void *arg)
{
	struct pipepool_stats ps;

	pipepool_get_stats(E.pipes, &ps);
	return ps.idle == 0 && ps.lent == 0;
}

/* With the default 1 s idle time: after a transfer the pipes are idle in the pool (none
 * lent), still there half a second later, gone (and their fds back in the budget) after ~1 s. */
Test(relay, pipes_returned_and_pool_shrinks)
{
	struct h h;
	struct h_opts o = { .mode = TS_RELAY_SPLICE };
	struct pipepool_stats ps;
	struct budget_stats bs;
	int64_t t0;
	double ms;

	env_init(16384, 0, 1024);
	h_start(&h, &o);
	h.a->to_send = h.b->to_send = 4 * MIB;
	h.a->shut_when_sent = h.b->shut_when_sent = true;
	peer_start(h.a);
	peer_start(h.b);
	cr_assert(run_until(all_done, &h, 10000));
	t0 = mono_ns();
	pipepool_get_stats(E.pipes, &ps);
	cr_assert_eq(ps.lent, 0);
	cr_assert(ps.idle >= 1 && ps.idle <= 2, "idle %u", ps.idle);
	cr_assert(ps.reused > 0, "pipes should be reused across chunks");
	cr_assert(ps.timer_pending);
	budget_get_stats(E.budget, &bs);
	cr_assert_eq(bs.fds_in_use, 2 * ps.idle);
	run_for(500);
	pipepool_get_stats(E.pipes, &ps);
	cr_assert(ps.idle >= 1, "closed too early");
	cr_assert(run_until(pool_empty, NULL, 3000));
	ms = (double)(mono_ns() - t0) / 1e6;
	cr_assert(ms > 900 && ms < 2000, "shrunk after %.0f ms", ms);
	pipepool_get_stats(E.pipes, &ps);
	cr_assert(!ps.timer_pending);
	cr_assert_eq(ps.pipe_bytes, 0);
	budget_get_stats(E.budget, &bs);
	cr_assert_eq(bs.fds_in_use, 0);
	h_fini(&h);
}

/* ---- fd budget exhausted: copy fallback ---------------------------------------------------- */

Test(relay, fd_budget_exhausted_falls_back_to_copy)
{
	struct h h;
	struct h_opts o = { .mode = TS_RELAY_SPLICE };
	struct pipepool_stats ps;

	env_init(1, 200, 1024); /* a pipe needs 2 */
	h_start(&h, &o);
	h.a->to_send = h.b->to_send = 2 * MIB;
	h.a->shut_when_sent = h.b->shut_when_sent = true;
	peer_start(h.a);
	peer_start(h.b);
	run_to_done_intact(&h, 10000);
	cr_assert_eq(h.st.splice_bytes, 0);
	cr_assert_eq(h.st.copy_bytes, 4 * MIB);
	cr_assert(!h.st.splice[RELAY_UP] && !h.st.splice[RELAY_DOWN]);
	cr_assert_eq(ctr_get(&E.ctr.pipe_fallbacks), 2);
	pipepool_get_stats(E.pipes, &ps);
	cr_assert_eq(ps.refused_budget, 2);
	cr_assert_eq(ps.created, 0);
	h_fini(&h);
}

/* ---- buffer pool exhausted: wait and retry, never spin or drop ---------------------------- */

static bool down_waiting(void *arg)
{
	return ctr_get(&E.ctr.buf_waits) > 0;
}

static struct stream *nofd_wrap(struct stream *inner);

/* One relay buffer in the whole pool. B does not read, so the up direction keeps the buffer
 * with bytes for B; B's own data then finds no buffer, and B's stream cannot be looked into
 * (no peek, so nothing can be passed through): the down direction waits (counted) instead of
 * spinning. When B reads again the buffer frees up and everything arrives. */
Test(relay, buffer_pool_exhausted_waits_then_resumes)
{
	struct h h;
	struct h_opts o = { .mode = TS_RELAY_COPY, .small = true };
	struct relay_stats st;
	int a_app, a_rel, b_rel, b_app;
	struct stream *sa, *sb;

	env_init(16384, 200, 1);
	memset(&h, 0, sizeof(h));
	tcp_pair(&a_app, &a_rel, true);
	tcp_pair(&b_rel, &b_app, true);
	cr_assert_eq(stream_sock_new(E.base, a_rel, &sa), 0);
	cr_assert_eq(stream_sock_new(E.base, b_rel, &sb), 0);
	h.a = peer_new(a_app, 0xA, 0, false);
	h.b = peer_new(b_app, 0xB, 0, false);
	h_relay(&h, sa, nofd_wrap(sb), &o);
	h.a->to_send = 8 * MIB;
	h.a->shut_when_sent = true;
	h.b->paused = true;
	peer_start(h.a);
	peer_start(h.b);
	run_for(100);
	relay_get_stats(h.r, &st);
	cr_assert_eq(st.bufs_held, 1, "the up direction holds the only buffer");
	h.b->to_send = 2 * MIB;
	h.b->shut_when_sent = true;
	peer_start(h.b); /* sends, still does not read */
	cr_assert(run_until(down_waiting, NULL, 2000));
	run_for(100);
	cr_assert(ctr_get(&E.ctr.buf_waits) < 20, "retries are paced, not spinning: %llu",
		  (unsigned long long)ctr_get(&E.ctr.buf_waits));
	peer_resume(h.b);
	run_to_done_intact(&h, 20000);
	h_fini(&h);
}

/* The whole buffer budget is held elsewhere (as lwIP's received segments can hold it): no
 * relay buffer can be had, yet both directions arrive intact, each passed through a buffer on
 * the stack (a socket can be peeked), instead of waiting for a buffer that only draining
 * those segments would free. */
Test(relay, buffer_budget_spent_passes_through)
{
	struct h h;
	struct h_opts o = { .mode = TS_RELAY_COPY };
	struct bufpool_stats bs;
	uint64_t all = budget_get_limits(E.budget)->buffer_bytes;

	cr_assert_eq(budget_bytes_reserve(E.budget, all), 0);
	h_start(&h, &o);
	h.a->to_send = 4 * MIB;
	h.a->shut_when_sent = true;
	h.b->to_send = 4 * MIB;
	h.b->shut_when_sent = true;
	peer_start(h.a);
	peer_start(h.b);
	run_to_done_intact(&h, 20000);
	cr_assert_eq(h.st.copy_bytes, 8 * MIB);
	bufpool_get_stats(E.bufs, &bs);
	cr_assert_eq(bs.gets, 0, "no buffer was ever handed out");
	cr_assert(bs.refused_budget > 0);
	cr_assert_eq(ctr_get(&E.ctr.buf_bytes_inflight), 0);
	budget_bytes_release(E.budget, all);
	h_fini(&h);
}

/* ---- a stream without fd (as an lwIP pcb will be): copy mode is forced -------------------- */

struct nofd {
	struct stream s;
	struct stream *inner;
};

static void nofd_readable(void *arg)
{
	struct nofd *n = arg;
	n->s.cb.readable(n->s.cb_arg);
}

static void nofd_writable(void *arg)
{
	struct nofd *n = arg;
	n->s.cb.writable(n->s.cb_arg);
}

static ssize_t nofd_read(struct stream *s, void *buf, size_t n)
{
	return stream_read(((struct nofd *)s)->inner, buf, n);
}

static ssize_t nofd_write(struct stream *s, const void *buf, size_t n)
{
	return stream_write(((struct nofd *)s)->inner, buf, n);
}

static int nofd_shutdown(struct stream *s)
{
	return stream_shutdown_write(((struct nofd *)s)->inner);
}

static void nofd_interest(struct stream *s, bool r, bool w)
{
	stream_set_interest(((struct nofd *)s)->inner, r, w);
}

static int nofd_fd(const struct stream *s)
{
	return -1;
}

static void nofd_abort(struct stream *s)
{
	stream_abort(((struct nofd *)s)->inner);
	free(s);
}

static void nofd_close(struct stream *s)
{
	stream_close(((struct nofd *)s)->inner);
	free(s);
}

static ssize_t nofd_unacked(const struct stream *s)
{
	return stream_unacked(((const struct nofd *)s)->inner);
}

static size_t nofd_write_room(const struct stream *s)
{
	return stream_write_room(((const struct nofd *)s)->inner);
}

static const struct stream_ops nofd_ops = {
	nofd_read, nofd_write, nofd_shutdown, nofd_interest, nofd_fd, nofd_abort, nofd_close,
	nofd_unacked, NULL, NULL, /* no peek: never sniffed */
	nofd_write_room, NULL, NULL, NULL, /* no gather */
};

static struct stream *nofd_wrap(struct stream *inner)
{
	static const struct stream_cbs fwd = { nofd_readable, nofd_writable, NULL };
	struct nofd *n = calloc(1, sizeof(*n));

	cr_assert(n);
	n->s.ops = &nofd_ops;
	n->inner = inner;
	stream_set_callbacks(inner, &fwd, n);
	return &n->s;
}

/* a is an AF_UNIX socketpair end hidden behind a stream with no fd: splice is asked for, copy
 * must be used, and both directions still arrive intact. */
Test(relay, stream_without_fd_uses_copy)
{
	struct h h;
	struct h_opts o = { .mode = TS_RELAY_SPLICE };
	int sp[2], b_rel, b_app;
	struct stream *inner, *sb;

	memset(&h, 0, sizeof(h));
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	set_nonblock(sp[0]);
	set_nonblock(sp[1]);
	tcp_pair(&b_rel, &b_app, false);
	cr_assert_eq(stream_sock_new(E.base, sp[1], &inner), 0);
	cr_assert_eq(stream_sock_new(E.base, b_rel, &sb), 0);
	h.a = peer_new(sp[0], 0xA, 4 * MIB, true);
	h.b = peer_new(b_app, 0xB, 4 * MIB, true);
	h_relay(&h, nofd_wrap(inner), sb, &o);
	peer_start(h.a);
	peer_start(h.b);
	run_to_done_intact(&h, 10000);
	cr_assert_eq(h.st.splice_bytes, 0);
	cr_assert_eq(h.st.copy_bytes, 8 * MIB);
	cr_assert_eq(ctr_get(&E.ctr.pipe_fallbacks), 0, "copy was chosen, not fallen back to");
	h_fini(&h);
}

/* ---- a source that lends its buffers (as an lwIP pcb's received pbufs): gather ------------ */

#define LEND_STAGE (300u << 10) /* more than one gather's worth */

/* What a lender saw; the test's, so it outlives the stream the relay frees. */
struct lend_tally {
	uint64_t peekvs, skipped, reads;
	int max_iov;
	bool skip_over; /* a skip of more than the last peekv returned */
	uint64_t writes, eagains; /* the destination's writev calls that took bytes; found none */
};

/* The bytes arrive on an inner socket stream and are read ahead into a stage, lent by peekv
 * as views of pieces of 1, 1460, 7000 and 65536 bytes in turn (a pbuf queue's shapes).
 * Readable is level-triggered like an lwIP stream's: while bytes are staged and read interest
 * is on, it fires once per loop iteration, whatever the inner socket says. */
struct lender {
	struct nofd w; /* first: the pass-through half (writes, callbacks, close) */
	uint8_t stage[LEND_STAGE];
	size_t off, len;
	size_t last_peek;
	bool want_rd;
	struct event *ev;
	struct lend_tally *t;
};

static void lend_due(struct lender *l)
{
	static const struct timeval next_iteration = { 0, 0 };

	if (l->want_rd && l->off < l->len)
		event_add(l->ev, &next_iteration);
}

static void lend_on_ev(evutil_socket_t fd, short what, void *arg)
{
	struct lender *l = arg;

	if (!l->want_rd || l->off == l->len)
		return;
	l->w.s.cb.readable(l->w.s.cb_arg); /* may close the stream */
}

static void lend_interest(struct stream *s, bool r, bool w)
{
	struct lender *l = (struct lender *)s;

	l->want_rd = r;
	stream_set_interest(l->w.inner, r, w);
	lend_due(l);
}

static void lend_abort(struct stream *s)
{
	event_free(((struct lender *)s)->ev);
	nofd_abort(s);
}

static void lend_close(struct stream *s)
{
	event_free(((struct lender *)s)->ev);
	nofd_close(s);
}

static ssize_t lend_fill(struct lender *l, size_t n)
{
	ssize_t r;

	if (l->off < l->len)
		return (ssize_t)(l->len - l->off);
	l->off = l->len = 0;
	r = stream_read(l->w.inner, l->stage, n < sizeof(l->stage) ? n : sizeof(l->stage));
	if (r > 0)
		l->len = (size_t)r;
	return r;
}

static ssize_t lend_peekv(struct stream *s, struct iovec *iov, int *cnt, size_t n)
{
	static const size_t piece[4] = { 1, 1460, 7000, 65536 };
	struct lender *l = (struct lender *)s;
	ssize_t r = lend_fill(l, n);
	size_t done = 0, at = l->off;
	int k = 0;

	l->t->peekvs++;
	if (r <= 0) {
		l->last_peek = 0;
		return r;
	}
	while (done < n && at < l->len && k < *cnt) {
		size_t c = piece[k % 4];

		if (c > l->len - at)
			c = l->len - at;
		if (c > n - done)
			c = n - done;
		iov[k].iov_base = l->stage + at;
		iov[k].iov_len = c;
		at += c;
		done += c;
		k++;
	}
	*cnt = k;
	if (k > l->t->max_iov)
		l->t->max_iov = k;
	l->last_peek = done;
	return (ssize_t)done;
}

static void lend_skip(struct stream *s, size_t n)
{
	struct lender *l = (struct lender *)s;

	if (n > l->last_peek)
		l->t->skip_over = true;
	l->off += n;
	l->last_peek -= n < l->last_peek ? n : l->last_peek;
	l->t->skipped += n;
	lend_due(l);
}

static ssize_t lend_read(struct stream *s, void *buf, size_t n)
{
	struct lender *l = (struct lender *)s;
	ssize_t r;

	l->t->reads++;
	if ((r = lend_fill(l, n)) <= 0)
		return r;
	if ((size_t)r > n)
		r = (ssize_t)n;
	memcpy(buf, l->stage + l->off, (size_t)r);
	l->off += (size_t)r;
	return r;
}

static const struct stream_ops lend_ops = {
	.read = lend_read, .write = nofd_write, .shutdown_write = nofd_shutdown,
	.set_interest = lend_interest, .fd = nofd_fd, .abort = lend_abort, .close = lend_close,
	.unacked = nofd_unacked, .peekv = lend_peekv, .skip = lend_skip,
};

/* The destination: a socket behind a stream that counts its writev calls. */
struct taker {
	struct nofd w;
	struct lend_tally *t;
};

static ssize_t take_writev(struct stream *s, const struct iovec *iov, int cnt)
{
	struct taker *k = (struct taker *)s;
	ssize_t r = stream_writev(k->w.inner, iov, cnt);

	if (r == -EAGAIN)
		k->t->eagains++;
	else if (r > 0)
		k->t->writes++;
	return r;
}

static const struct stream_ops take_ops = {
	.read = nofd_read, .write = nofd_write, .shutdown_write = nofd_shutdown,
	.set_interest = nofd_interest, .fd = nofd_fd, .abort = nofd_abort, .close = nofd_close,
	.unacked = nofd_unacked, .write_room = nofd_write_room, .writev = take_writev,
};

static struct stream *taker_wrap(struct stream *inner, struct lend_tally *t)
{
	static const struct stream_cbs fwd = { nofd_readable, nofd_writable, NULL };
	struct taker *k = calloc(1, sizeof(*k));

	cr_assert(k);
	k->w.s.ops = &take_ops;
	k->w.inner = inner;
	k->t = t;
	stream_set_callbacks(inner, &fwd, k);
	return &k->w.s;
}

static struct stream *lender_wrap(struct stream *inner, struct lend_tally *t)
{
	static const struct stream_cbs fwd = { nofd_readable, nofd_writable, NULL };
	struct lender *l = calloc(1, sizeof(*l));

	cr_assert(l);
	l->w.s.ops = &lend_ops;
	l->w.inner = inner;
	l->t = t;
	l->ev = event_new(E.base, -1, 0, lend_on_ev, l);
	cr_assert(l->ev);
	stream_set_callbacks(inner, &fwd, l);
	return &l->w.s;
}

/* a lends its buffers, b is a socket: a's bytes reach b's app by gather (views of a's stage,
 * several per writev, into small socket buffers: short writes and waits for room) without a
 * relay buffer, and b's bytes come back by copy; both intact. */
static void gather_case(uint64_t down_bytes)
{
	struct h h;
	struct h_opts o = { .mode = TS_RELAY_SPLICE, .small = true };
	struct lend_tally t = { 0 };
	struct bufpool_stats ps;
	int sp[2], b_rel, b_app;
	struct stream *inner, *sb;
	uint64_t waits0 = ctr_get(&E.ctr.room_waits);

	memset(&h, 0, sizeof(h));
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
	set_nonblock(sp[0]);
	set_nonblock(sp[1]);
	tcp_pair(&b_rel, &b_app, true);
	cr_assert_eq(stream_sock_new(E.base, sp[1], &inner), 0);
	cr_assert_eq(stream_sock_new(E.base, b_rel, &sb), 0);
	h.a = peer_new(sp[0], 0xA, 8 * MIB, true);
	h.b = peer_new(b_app, 0xB, down_bytes, true);
	h_relay(&h, lender_wrap(inner, &t), taker_wrap(sb, &t), &o);
	peer_start(h.a);
	peer_start(h.b);
	run_to_done_intact(&h, 20000);
	cr_assert_eq(ctr_get(&E.ctr.gather_bytes), 8 * MIB, "every up byte by gather");
	cr_assert_eq(h.st.bytes[RELAY_UP], 8 * MIB);
	cr_assert_eq(h.st.copy_bytes, 8 * MIB + down_bytes);
	cr_assert_eq(t.skipped, 8 * MIB, "exactly what b took was skipped in a");
	cr_assert_not(t.skip_over, "never more skipped than lent");
	cr_assert_eq(t.reads, 0, "the up direction never read a into a buffer");
	cr_assert_gt(t.max_iov, 2, "several views per writev");
	cr_assert_gt(ctr_get(&E.ctr.room_waits), waits0, "b's small buffers filled: waits for room");
	/* A full socket is waited for (its writable), not tried again and again while a stays
	 * readable: a writev that finds no room at all is rare. */
	cr_assert_leq(t.eagains, 16 + t.writes / 16, "writev found no room %llu times in %llu",
		      (unsigned long long)t.eagains, (unsigned long long)t.writes);
	bufpool_get_stats(E.bufs, &ps);
	if (down_bytes == 0) /* copying 8 MiB would take 128 */
		cr_assert_leq(ps.gets, 2, "no relay buffer but for the down direction's EOF read");
	else
		cr_assert_gt(ps.gets, 0, "the down direction copies through relay buffers");
	cr_assert_eq(ctr_get(&E.ctr.buf_bytes_inflight), 0);
	h_fini(&h);
}

Test(relay, gather_hands_the_source_buffers_to_the_socket)
{
	gather_case(0);
}

Test(relay, gather_up_copy_down_both_intact)
{
	gather_case(4 * MIB);
}

/* ---- a destination that tells its room (as an lwIP pcb's share of the send buffers does) ---- */

#define ROOMY_STEP 5000u        /* room added per refill (not a divisor of anything here) */
#define ROOMY_MAX (48u << 10)   /* room never grows past this: less than one relay buffer */

/* What a roomy stream saw; the test's, so it outlives the stream the relay frees. */
struct roomy_tally {
	uint64_t writes, over;   /* writes offered; of them, more than the room */
	uint64_t refills, held;  /* refills; of them, finding down bytes in a relay buffer */
};

struct roomy {
	struct nofd w;           /* first: the pass-through half (nofd_read and the callbacks) */
	struct event *refill;
	struct relay **r;        /* the relay to sample between callbacks */
	struct roomy_tally *t;
	size_t room;             /* what write() takes now */
	bool want_r, want_w;
};

static void roomy_apply(struct roomy *y)
{
	stream_set_interest(y->w.inner, y->want_r, y->want_w && y->room > 0);
}

static ssize_t roomy_write(struct stream *s, const void *buf, size_t n)
{
	struct roomy *y = (struct roomy *)s;
	ssize_t w;

	y->t->writes++;
	y->t->over += n > y->room;
	if (y->room == 0)
		return -EAGAIN;
	w = stream_write(y->w.inner, buf, n < y->room ? n : y->room);
	if (w > 0)
		y->room -= (size_t)w;
	return w;
}

static int roomy_shutdown(struct stream *s)
{
	return stream_shutdown_write(((struct roomy *)s)->w.inner);
}

static void roomy_interest(struct stream *s, bool r, bool w)
{
	struct roomy *y = (struct roomy *)s;

	y->want_r = r;
	y->want_w = w;
	roomy_apply(y);
}

static int roomy_fd(const struct stream *s)
{
	return -1;
}

static void roomy_free(struct roomy *y)
{
	event_free(y->refill);
	free(y);
}

static void roomy_abort(struct stream *s)
{
	stream_abort(((struct roomy *)s)->w.inner);
	roomy_free((struct roomy *)s);
}

static void roomy_close(struct stream *s)
{
	stream_close(((struct roomy *)s)->w.inner);
	roomy_free((struct roomy *)s);
}

static size_t roomy_write_room(const struct stream *s)
{
	return ((const struct roomy *)s)->room;
}

static const struct stream_ops roomy_ops = {
	.read = nofd_read, .write = roomy_write, .shutdown_write = roomy_shutdown,
	.set_interest = roomy_interest, .fd = roomy_fd, .abort = roomy_abort,
	.close = roomy_close, .write_room = roomy_write_room,
};

/* Every millisecond, between callbacks: note whether the relay holds down bytes in its copy
 * buffer, then give the destination more room (write interest comes back with it). */
static void roomy_on_refill(evutil_socket_t fd, short what, void *arg)
{
	struct roomy *y = arg;
	struct relay_stats st;

	if (*y->r) {
		relay_get_stats(*y->r, &st);
		y->t->refills++;
		y->t->held += st.buf_inflight[RELAY_DOWN] > 0;
	}
	y->room = y->room + ROOMY_STEP > ROOMY_MAX ? ROOMY_MAX : y->room + ROOMY_STEP;
	roomy_apply(y);
}

static struct roomy *roomy_wrap(struct stream *inner, struct relay **r, struct roomy_tally *t)
{
	static const struct stream_cbs fwd = { nofd_readable, nofd_writable, NULL };
	static const struct timeval ms = { 0, 1000 };
	struct roomy *y = calloc(1, sizeof(*y));

	cr_assert(y);
	y->w.s.ops = &roomy_ops;
	y->w.inner = inner;
	y->r = r;
	y->t = t;
	y->room = ROOMY_STEP;
	y->refill = event_new(E.base, -1, EV_PERSIST, roomy_on_refill, y);
	cr_assert(y->refill);
	event_add(y->refill, &ms);
	stream_set_callbacks(inner, &fwd, y);
	return y;
}

/* The download's destination takes a few KiB a millisecond and says so (write_room): the relay
 * reads no more than that from the server's socket, so it never offers the destination more
 * than its room, never holds down bytes in a copy buffer between callbacks (the rest waits in
 * the kernel), waits for room with write interest instead of spinning, and both directions
 * arrive intact. */
Test(relay, reads_no_more_than_the_destination_room)
{
	struct h h;
	struct h_opts o = { .mode = TS_RELAY_SPLICE };
	int a_app, a_rel, b_rel, b_app;
	struct stream *sa, *sb;
	struct roomy_tally t = { 0 };
	struct roomy *y;
	uint64_t waits0 = ctr_get(&E.ctr.room_waits);

	memset(&h, 0, sizeof(h));
	tcp_pair(&a_app, &a_rel, false);
	tcp_pair(&b_rel, &b_app, false);
	cr_assert_eq(stream_sock_new(E.base, a_rel, &sa), 0);
	cr_assert_eq(stream_sock_new(E.base, b_rel, &sb), 0);
	h.a = peer_new(a_app, 0xA, 1 * MIB, true);
	h.b = peer_new(b_app, 0xB, 1 * MIB, true);
	y = roomy_wrap(sa, &h.r, &t);
	h_relay(&h, &y->w.s, sb, &o);
	peer_start(h.a);
	peer_start(h.b);
	run_to_done_intact(&h, 20000);
	cr_assert_eq(h.st.splice_bytes, 0, "no fd on one side: copy");
	cr_assert_gt(t.writes, 1 * MIB / ROOMY_MAX, "the room paced the download");
	cr_assert_eq(t.over, 0, "%llu of %llu writes offered more than the room",
		     (unsigned long long)t.over, (unsigned long long)t.writes);
	cr_assert_gt(t.refills, 50);
	cr_assert_eq(t.held, 0, "down bytes sat in a relay buffer at %llu of %llu refills",
		     (unsigned long long)t.held, (unsigned long long)t.refills);
	cr_assert_gt(ctr_get(&E.ctr.room_waits), waits0, "no read ever waited for room");
	cr_assert_eq(ctr_get(&E.ctr.buf_bytes_inflight), 0);
	h_fini(&h);
}

/* ---- cancel -------------------------------------------------------------------------------- */

Test(relay, cancel_aborts_both_and_calls_done_once)
{
	struct h h;
	struct h_opts o = { .mode = TS_RELAY_SPLICE };

	h_start(&h, &o);
	h.a->to_send = 64 * MIB;
	peer_start(h.a);
	peer_start(h.b);
	run_for(30);
	relay_cancel(h.r);
	cr_assert_eq(h.done_calls, 1);
	cr_assert_eq(h.reason, RELAY_CANCELLED);
	cr_assert(run_until(both_failed, &h, 2000));
	cr_assert_eq(h.b->err, ECONNRESET);
	cr_assert_eq(ctr_get(&E.ctr.active), 0);
	h_fini(&h);
}

/* TCP urgent data (send with MSG_OOB) from either peer: splice stops in front of the urgent
 * byte and never steps over it, while the socket stays readable with the bytes behind it. The
 * direction copies from then on (recv steps over the mark; the urgent byte itself is not part
 * of the stream), so what follows arrives and the loop does not spin until the idle timeout. */
static void urgent_byte(bool from_app)
{
	struct h h;
	struct h_opts o = { .mode = TS_RELAY_SPLICE };
	int a_app, a_rel, b_rel, b_app, from, to;
	struct stream *sa, *sb;
	char got[32];
	size_t n = 0;
	uint64_t fallbacks = ctr_get(&E.ctr.pipe_fallbacks);
	int64_t end;

	memset(&h, 0, sizeof(h));
	tcp_pair(&a_app, &a_rel, false);
	tcp_pair(&b_rel, &b_app, false);
	cr_assert_eq(stream_sock_new(E.base, a_rel, &sa), 0);
	cr_assert_eq(stream_sock_new(E.base, b_rel, &sb), 0);
	h_relay(&h, sa, sb, &o);
	from = from_app ? a_app : b_app;
	to = from_app ? b_app : a_app;
	cr_assert_eq(send(from, "hello", 5, 0), 5);
	run_for(30);
	cr_assert_eq(send(from, "X", 1, MSG_OOB), 1);
	run_for(20);
	cr_assert_eq(send(from, "world", 5, 0), 5);
	end = mono_ns() + 2000 * 1000000LL;
	while (n < 10 && mono_ns() < end) {
		ssize_t k;

		event_base_loop(E.base, EVLOOP_ONCE);
		if ((k = recv(to, got + n, sizeof(got) - n, 0)) > 0)
			n += (size_t)k;
	}
	cr_assert_eq(n, 10, "%zu bytes past the urgent byte", n);
	cr_assert_eq(memcmp(got, "helloworld", 10), 0);
	cr_assert_eq(ctr_get(&E.ctr.pipe_fallbacks), fallbacks + 1, "that direction copies");
	cr_assert_eq(h.done_calls, 0);
	relay_cancel(h.r);
	close(a_app);
	close(b_app);
}

Test(relay, urgent_byte_from_the_app_does_not_stall_splice) { urgent_byte(true); }
Test(relay, urgent_byte_from_the_server_does_not_stall_splice) { urgent_byte(false); }

/* ---- libevent's allocations refused in turn (failalloc.h, evmem.h) ---------------------------- */

/* With evmem installed libevent allocates through the project's allocator, so relay_new's own
 * calls into libevent (its events, the idle timer's place in the timer heap, the first watch
 * of a socket) are refused in turn too. Each run has a fresh loop, so those first-time
 * allocations happen inside relay_new; the peers, the sockets and the streams are the test's.
 * talk: A sends 256 KiB and its FIN, B its own and a FIN, both read to the end, under a 10 s
 * idle timeout: each run ends as done with every byte through, or (a refusal) the relay says
 * -ENOMEM or ends at once with both aborted; never waiting for the idle timeout. silent:
 * nobody sends, and a 100 ms idle timeout must end the relay (or relay_new says -ENOMEM). */
struct nomem_relay {
	bool talk;
};

static bool nomem_ended(void *arg)
{
	struct h *h = arg;

	return h->done_calls > 0 && (h->a->eof || h->a->err) && (h->b->eof || h->b->err);
}

static void on_beat(evutil_socket_t fd, short what, void *arg)
{
}

static void nomem_relay_scenario(void *arg, bool sweep)
{
	const struct nomem_relay *o = arg;
	struct relay_params p = {
		.mode = TS_RELAY_COPY,
		.bufs = E.bufs,
		.budget = E.budget,
		.idle_ms = o->talk ? 10000 : 100,
		.counters = &E.ctr,
	};
	struct timeval beat = { 0, 5000 };
	int a_app, a_rel, b_rel, b_app, rc;
	struct stream *sa, *sb;
	struct event_base *base;
	struct event *tick;
	struct h h;
	int64_t end;

	memset(&h, 0, sizeof(h));
	failalloc_hold(true); /* the loop, the sockets, the streams, the peers */
	cr_assert_not_null(base = event_base_new());
	tcp_pair(&a_app, &a_rel, false);
	tcp_pair(&b_rel, &b_app, false);
	cr_assert_eq(stream_sock_new(base, a_rel, &sa), 0);
	cr_assert_eq(stream_sock_new(base, b_rel, &sb), 0);
	h.a = peer_new_on(base, a_app, 0xA, o->talk ? 256 << 10 : 0, o->talk);
	h.b = peer_new_on(base, b_app, 0xB, o->talk ? 256 << 10 : 0, o->talk);
	failalloc_hold(false);
	h.t_start = mono_ns();
	rc = relay_new(base, sa, sb, &p, on_done, &h, &h.r);
	failalloc_hold(true);
	if (rc != 0) {
		cr_assert(sweep && rc == -ENOMEM, "relay_new: %d", rc);
		stream_abort(sa);
		stream_abort(sb);
		goto out;
	}
	tick = event_new(base, -1, EV_PERSIST, on_beat, NULL);
	cr_assert_eq(event_add(tick, &beat), 0);
	peer_start(h.a);
	peer_start(h.b);
	failalloc_hold(false);
	end = mono_ns() + 3000 * 1000000LL;
	while (!nomem_ended(&h) && mono_ns() < end)
		event_base_loop(base, EVLOOP_ONCE);
	failalloc_hold(true);
	cr_assert(nomem_ended(&h), "the relay never ended (%s)", o->talk ? "talk" : "silent");
	if (o->talk && h.reason == RELAY_DONE) {
		expect_intact(h.a, h.b);
		expect_intact(h.b, h.a);
	} else if (o->talk) {
		cr_assert(sweep && (h.reason == RELAY_NO_MEMORY || h.st.err == -ENOMEM),
			  "ended as %s (%d)", relay_end_name(h.reason), h.st.err);
		cr_assert((h.t_done - h.t_start) / 1000000 < 2000, "ended only after %lld ms",
			  (long long)((h.t_done - h.t_start) / 1000000));
		cr_assert(h.a->err && h.b->err, "both aborted");
	} else {
		/* A refusal: the idle timer could not be armed, or a stream could not be
		 * watched and failed with -ENOMEM. */
		cr_assert(h.reason == RELAY_IDLE ||
			  (sweep && (h.reason == RELAY_NO_MEMORY || h.st.err == -ENOMEM)),
			  "ended as %s (%d)", relay_end_name(h.reason), h.st.err);
	}
	event_free(tick);
out:
	peer_free(h.a);
	peer_free(h.b);
	event_base_free(base);
	failalloc_hold(false);
	cr_assert_eq(ctr_get(&E.ctr.active), 0);
	cr_assert_eq(ctr_get(&E.ctr.buf_bytes_inflight), 0);
}

Test(relay, talk_with_libevent_allocations_refused_in_turn)
{
	struct nomem_relay o = { .talk = true };

	cr_assert_eq(evmem_install(), 0);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_relay_scenario, &o, 3,
									   200));
}

Test(relay, silence_with_libevent_allocations_refused_in_turn)
{
	struct nomem_relay o = { .talk = false };

	cr_assert_eq(evmem_install(), 0);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_relay_scenario, &o, 3,
									   200));
}
