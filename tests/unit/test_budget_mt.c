/* test_budget_mt.c — several workers acquiring and releasing admission permits, UDP slots, fds,
 * pool buffers and accounted heap blocks at once, while another thread flips pressure tiers.
 * Limits must never be overshot (a second run holds the critical tier so 48 wanted permits race
 * for 16) and every final count must be exact. Run in the TSan tree.
 * Under TSan it runs from tests/unit/mt.h's own main() (see there why). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt.h"

#include "core/budget.h"
#include "core/bufpool.h"
#include "core/log.h"
#include "testutil.h"

#define THREADS 8
#define ITERS 20000
#define HOLD 6 /* permits/buffers a worker may hold at once */

struct shared {
	struct budget *b;
	struct bufpool *pool;
	struct log lg;
	struct log_ratelimit rl;
	atomic_bool stop;
	atomic_uint max_seen_tcp;   /* highest in-use count a worker observed right after acquire */
};

struct worker {
	pthread_t th;
	struct shared *sh;
	unsigned id;
	uint64_t tcp_ok, tcp_busy, udp_ok, udp_busy, fd_ok, fd_busy;
	uint64_t buf_ok, buf_null, heap_ok, heap_null, logged;
	int corrupt;
};

static uint32_t rnd(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

static void raise_max(atomic_uint *m, unsigned v)
{
	unsigned cur = atomic_load(m);

	while (cur < v && !atomic_compare_exchange_weak(m, &cur, v))
		;
}

/* Fill a buffer with our id and check it later: two owners of one buffer would show up here
 * (and as a data race under TSan). */
static void stamp(void *buf, size_t n, unsigned id)
{
	memset(buf, (int)(id & 0xFF), n);
}

static int stamp_ok(const void *buf, size_t n, unsigned id)
{
	const uint8_t *p = buf;

	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)id)
			return 0;
	return 1;
}

static void step_tcp(struct worker *w, int *held, uint32_t *seed)
{
	if (*held < HOLD && (rnd(seed) & 1)) {
		if (budget_tcp_acquire(w->sh->b) == 0) {
			struct budget_stats s;
			(*held)++;
			w->tcp_ok++;
			budget_get_stats(w->sh->b, &s);
			raise_max(&w->sh->max_seen_tcp, s.tcp_in_use);
		} else {
			w->tcp_busy++;
		}
	} else if (*held > 0) {
		budget_tcp_release(w->sh->b);
		(*held)--;
	}
}

static void step_udp_fd(struct worker *w, uint32_t *seed)
{
	if (budget_udp_acquire(w->sh->b) == 0) {
		w->udp_ok++;
		budget_udp_release(w->sh->b);
	} else {
		w->udp_busy++;
	}
	uint32_t n = 1 + rnd(seed) % 4;
	if (budget_fd_reserve(w->sh->b, n) == 0) {
		w->fd_ok++;
		budget_fd_release(w->sh->b, n);
	} else {
		w->fd_busy++;
	}
}

static void step_buf(struct worker *w, void **bufs, int *nbufs, uint32_t *seed)
{
	size_t sz = bufpool_buf_size(w->sh->pool);

	if (*nbufs < HOLD && (rnd(seed) & 1)) {
		void *p = bufpool_get(w->sh->pool);
		if (p) {
			stamp(p, sz, w->id);
			bufs[(*nbufs)++] = p;
			w->buf_ok++;
		} else {
			w->buf_null++;
		}
	} else if (*nbufs > 0) {
		void *p = bufs[--(*nbufs)];
		if (!stamp_ok(p, sz, w->id))
			w->corrupt++;
		bufpool_put(w->sh->pool, p);
	}
}

static void step_heap(struct worker *w, uint32_t *seed)
{
	size_t n = 1 + rnd(seed) % 3000;
	uint8_t *p = budget_malloc(w->sh->b, n);

	if (!p) {
		w->heap_null++;
		if (log_warn_rl(&w->sh->lg, &w->sh->rl, (int64_t)w->heap_null, "heap full"))
			w->logged++;
		return;
	}
	w->heap_ok++;
	stamp(p, n, w->id);
	if (!stamp_ok(p, n, w->id))
		w->corrupt++;
	budget_mfree(w->sh->b, p);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	void *bufs[HOLD];
	int held = 0, nbufs = 0;
	uint32_t seed = 0x9E3779B9u * (w->id + 1);

	for (int i = 0; i < ITERS; i++) {
		step_tcp(w, &held, &seed);
		step_buf(w, bufs, &nbufs, &seed);
		if ((i & 7) == 0) {
			step_udp_fd(w, &seed);
			step_heap(w, &seed);
		}
	}
	while (held-- > 0)
		budget_tcp_release(w->sh->b);
	while (nbufs > 0) {
		void *p = bufs[--nbufs];
		if (!stamp_ok(p, bufpool_buf_size(w->sh->pool), w->id))
			w->corrupt++;
		bufpool_put(w->sh->pool, p);
	}
	return NULL;
}

static void *tier_flipper(void *arg)
{
	struct shared *sh = arg;
	uint64_t samples[] = { 0, 40ull << 20, 46ull << 20, 10ull << 20 };
	unsigned i = 0;

	while (!atomic_load(&sh->stop)) {
		budget_update_tier(sh->b, samples[i++ % 4]);
		if ((i & 15) == 0)
			budget_force_tier(sh->b, (i & 16) ? BUDGET_CRITICAL : -1);
	}
	budget_force_tier(sh->b, -1);
	return NULL;
}

static void discard_sink(void *arg, enum log_level level, const char *line, size_t len)
{
	(void)arg;
	(void)level;
	(void)line;
	(void)len;
}

static void setup(struct shared *sh, const struct budget_limits *l)
{
	memset(sh, 0, sizeof(*sh));
	CHECK_EQ(budget_new(l, &sh->b), 0);
	CHECK_EQ(bufpool_new(sh->b, "mt", 2048, 24, &sh->pool), 0);
	bufpool_set_cache_cap(sh->pool, 8);
	log_init(&sh->lg, LOG_LEVEL_WARN, -1);
	sh->lg.clock = NULL;
	sh->lg.sink = discard_sink;
}

/* Run THREADS workers (and the tier flipper if asked) to completion; sum their tallies. */
static void run(struct shared *sh, struct worker *w, bool flip, struct worker *sum)
{
	pthread_t flipper;

	if (flip)
		CHECK_EQ(pthread_create(&flipper, NULL, tier_flipper, sh), 0);
	for (unsigned i = 0; i < THREADS; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		w[i].sh = sh;
		w[i].id = i + 1;
		CHECK_EQ(pthread_create(&w[i].th, NULL, worker_main, &w[i]), 0);
	}
	for (unsigned i = 0; i < THREADS; i++)
		CHECK_EQ(pthread_join(w[i].th, NULL), 0);
	atomic_store(&sh->stop, true);
	if (flip)
		CHECK_EQ(pthread_join(flipper, NULL), 0);

	memset(sum, 0, sizeof(*sum));
	for (unsigned i = 0; i < THREADS; i++) {
		CHECK_EQ(w[i].corrupt, 0, "worker %u saw a buffer it did not own", i);
		sum->tcp_ok += w[i].tcp_ok;
		sum->tcp_busy += w[i].tcp_busy;
		sum->udp_ok += w[i].udp_ok;
		sum->udp_busy += w[i].udp_busy;
		sum->fd_ok += w[i].fd_ok;
		sum->fd_busy += w[i].fd_busy;
		sum->buf_ok += w[i].buf_ok;
		sum->buf_null += w[i].buf_null;
		sum->heap_ok += w[i].heap_ok;
		sum->heap_null += w[i].heap_null;
		sum->logged += w[i].logged;
	}
}

/* Every gauge back at zero, every counter equal to what the workers saw, no limit overshot. */
static void check_budget(struct shared *sh, const struct worker *sum, uint32_t tcp_limit)
{
	struct budget_stats s;

	budget_get_stats(sh->b, &s);
	CHECK_EQ(s.tcp_in_use, 0);
	CHECK_EQ(s.tcp_admitted, sum->tcp_ok);
	CHECK_EQ(s.tcp_refused[0] + s.tcp_refused[1] + s.tcp_refused[2], sum->tcp_busy);
	CHECK_LEQ(s.tcp_peak, tcp_limit);
	CHECK_LEQ(atomic_load(&sh->max_seen_tcp), tcp_limit);
	CHECK_EQ(s.udp_in_use, 0);
	CHECK_EQ(s.udp_admitted, sum->udp_ok);
	CHECK_EQ(s.udp_refused, sum->udp_busy);
	CHECK_LEQ(s.udp_peak, 4);
	CHECK_EQ(s.fds_in_use, 0);
	CHECK_EQ(s.fd_refused, sum->fd_busy);
	CHECK_LEQ(s.fds_peak, 10);
	CHECK_EQ(s.buffer_bytes_in_use, 0);
	CHECK_LEQ(s.buffer_bytes_peak, 40 * 1024);
	CHECK_EQ(s.malloc_bytes_in_use, 0);
	CHECK_EQ(s.malloc_blocks, 0);
	CHECK_EQ(s.malloc_refused, sum->heap_null);
	CHECK_EQ(s.release_underflow, 0);
	CHECK_EQ(ctr_get(&sh->lg.lines[LOG_LEVEL_WARN]), sum->logged);
	CHECK_EQ(ctr_get(&sh->lg.suppressed) + sum->logged, sum->heap_null);
}

static void check_pool(struct shared *sh, const struct worker *sum)
{
	struct bufpool_stats ps;
	struct budget_stats s;

	budget_get_stats(sh->b, &s);
	bufpool_get_stats(sh->pool, &ps);
	CHECK_EQ(ps.bufs_in_use, 0);
	CHECK_EQ(ps.gets, sum->buf_ok);
	CHECK_EQ(ps.puts, sum->buf_ok);
	CHECK_EQ(ps.refused_pool + ps.refused_budget, sum->buf_null);
	CHECK_EQ(s.buffer_refused, ps.refused_budget + s.malloc_refused);
	CHECK_LEQ(ps.bufs_peak, 24);
	CHECK_LEQ(ps.bufs_cached, 8);
	CHECK_EQ(ps.mallocs - ps.frees, ps.bufs_cached, "every buffer is cached or freed");
}

static void limits(struct budget_limits *l)
{
	budget_limits_profile(l, BUDGET_PROFILE_MOBILE); /* tcp 64/32/16, 50 MiB */
	l->udp_sessions = 4;
	l->fds = 10;
	l->buffer_bytes = 40 * 1024; /* pool (2 KiB x up to 48 held) and heap compete for this */
}

MT_TEST(budget_mt, concurrent_permits_buffers_and_heap_are_exact)
{
	static struct shared sh;
	static struct worker w[THREADS];
	struct budget_limits l;
	struct worker sum;

	limits(&l);
	setup(&sh, &l);
	run(&sh, w, true, &sum);
	check_budget(&sh, &sum, 64);
	check_pool(&sh, &sum);
	/* Work was done. Whether refusals happened depends on how the scheduler interleaves the
	 * workers (on one core they run one after another and never collide), so it is not
	 * asserted here; test_budget covers refusal at the limit deterministically. */
	CHECK_GT(sum.tcp_ok, 1000);
	CHECK_GT(sum.buf_ok, 1000);
	bufpool_free(sh.pool);
	budget_free(sh.b);
}

/* Held at critical the whole run: 8 workers wanting up to 6 permits each (48) race for 16;
 * the CAS must never let a 17th in. */
MT_TEST(budget_mt, critical_limit_is_never_overshot)
{
	static struct shared sh;
	static struct worker w[THREADS];
	struct budget_limits l;
	struct worker sum;

	limits(&l);
	setup(&sh, &l);
	budget_force_tier(sh.b, BUDGET_CRITICAL);
	run(&sh, w, false, &sum);
	check_budget(&sh, &sum, 16);
	check_pool(&sh, &sum);
	struct budget_stats s;
	budget_get_stats(sh.b, &s);
	CHECK_EQ(s.tcp_refused[BUDGET_CRITICAL], sum.tcp_busy);
	bufpool_free(sh.pool);
	budget_free(sh.b);
}

