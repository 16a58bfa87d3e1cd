/* test_pipepool.c — the splice pipe pool: budgeted descriptors, reuse, LIFO, sizing, and the
 * shrink timer that exists only while idle pipes do (real pipes, a real libevent loop). */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/evmem.h"
#include "dispatch/pipepool.h"
#include "failalloc.h"
#include "testutil.h"

static struct event_base *base;
static struct budget *budget;
static struct pipepool *pool;
static struct event *tick;

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
}

static void make(uint32_t fds, size_t size, uint32_t idle_ms, uint32_t max_idle)
{
	struct budget_limits lim;
	struct pipepool_params p = { size, idle_ms, max_idle };
	struct timeval tv = { 0, 5000 };

	base = event_base_new();
	cr_assert(base);
	budget_limits_profile(&lim, BUDGET_PROFILE_DESKTOP);
	lim.fds = fds;
	cr_assert_eq(budget_new(&lim, &budget), 0);
	cr_assert_eq(pipepool_new(base, budget, &p, &pool), 0);
	tick = event_new(base, -1, EV_PERSIST, on_tick, NULL);
	event_add(tick, &tv);
}

static void teardown(void)
{
	if (!base)
		return;
	pipepool_free(pool);
	event_free(tick);
	budget_free(budget);
	event_base_free(base);
	base = NULL;
	CHECK_LEAKS();
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void run_for(int ms)
{
	int64_t end = mono_ms() + ms;

	while (mono_ms() < end)
		event_base_loop(base, EVLOOP_ONCE);
}

static struct pipepool_stats stats(void)
{
	struct pipepool_stats s;

	pipepool_get_stats(pool, &s);
	return s;
}

static uint32_t fds_in_use(void)
{
	struct budget_stats s;

	budget_get_stats(budget, &s);
	return s.fds_in_use;
}

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

TestSuite(pipepool, .fini = teardown, .timeout = 30);

Test(pipepool, get_reserves_two_fds_and_sizes_the_pipe)
{
	struct pipepool_pipe *p;
	struct pipepool_stats s;
	size_t max = pipepool_max_size();

	make(100, 256 << 10, 1000, 8);
	cr_assert_eq(pipepool_get(pool, &p), 0);
	cr_assert(fd_open(p->rd) && fd_open(p->wr));
	cr_assert(fcntl(p->rd, F_GETFL) & O_NONBLOCK);
	cr_assert(fcntl(p->wr, F_GETFD) & FD_CLOEXEC);
	cr_assert_eq((size_t)fcntl(p->wr, F_GETPIPE_SZ), p->cap);
	if (max == 0 || max >= (256u << 10))
		cr_assert_eq(p->cap, 256u << 10);
	cr_assert_eq(fds_in_use(), 2);
	s = stats();
	cr_assert_eq(s.lent, 1);
	cr_assert_eq(s.idle, 0);
	cr_assert_eq(s.created, 1);
	cr_assert_eq(s.pipe_bytes, p->cap);
	cr_assert(!s.timer_pending, "no idle pipe: no timer");
	/* It is a working pipe. */
	cr_assert_eq(write(p->wr, "abc", 3), 3);
	char buf[4];
	cr_assert_eq(read(p->rd, buf, sizeof(buf)), 3);
	pipepool_put(pool, p);
	s = stats();
	cr_assert_eq(s.lent, 0);
	cr_assert_eq(s.idle, 1);
	cr_assert(s.timer_pending);
	cr_assert_eq(fds_in_use(), 2, "an idle pipe keeps its descriptors");
}

Test(pipepool, size_bounded_by_pipe_max_size)
{
	size_t max = pipepool_max_size();
	struct pipepool_pipe *p;

	cr_assert(max >= 4096, "pipe-max-size readable on Linux");
	make(100, 4 * max, 1000, 8);
	cr_assert_eq(stats().pipe_size, max);
	cr_assert_eq(pipepool_get(pool, &p), 0);
	cr_assert(p->cap <= max);
	pipepool_put(pool, p);
}

Test(pipepool, reuse_is_lifo_and_needs_no_new_fds)
{
	struct pipepool_pipe *p1, *p2, *q;
	struct pipepool_stats s;

	make(100, 0, 1000, 8);
	cr_assert_eq(pipepool_get(pool, &p1), 0);
	cr_assert_eq(pipepool_get(pool, &p2), 0);
	cr_assert_eq(fds_in_use(), 4);
	pipepool_put(pool, p1);
	pipepool_put(pool, p2);
	cr_assert_eq(pipepool_get(pool, &q), 0);
	cr_assert_eq(q, p2, "the most recently returned pipe is reused first");
	s = stats();
	cr_assert_eq(s.reused, 1);
	cr_assert_eq(s.created, 2);
	cr_assert_eq(fds_in_use(), 4);
	cr_assert(s.timer_pending, "p1 is still idle");
	cr_assert_eq(pipepool_get(pool, &q), 0);
	cr_assert_eq(q, p1);
	cr_assert(!stats().timer_pending, "nothing idle: the timer is gone");
	pipepool_put(pool, p1);
	pipepool_put(pool, p2);
}

/* A pipe the budget has no room for is the pool's refusal (the relay copies instead), not the
 * budget's count of refused work. */
Test(pipepool, budget_refusal_then_reuse)
{
	struct pipepool_pipe *p, *q;
	struct budget_stats bs;

	make(3, 0, 1000, 8); /* room for one pipe only */
	cr_assert_eq(pipepool_get(pool, &p), 0);
	cr_assert_eq(pipepool_get(pool, &q), -EMFILE);
	cr_assert_eq(stats().refused_budget, 1);
	cr_assert_eq(fds_in_use(), 2);
	budget_get_stats(budget, &bs);
	cr_assert_eq(bs.fd_refused, 0);
	pipepool_put(pool, p);
	cr_assert_eq(pipepool_get(pool, &q), 0, "an idle pipe needs no new descriptors");
	cr_assert_eq(q, p);
	pipepool_put(pool, q);
}

Test(pipepool, shrinks_to_zero_when_idle)
{
	struct pipepool_pipe *p[3];
	struct pipepool_stats s;

	make(100, 0, 150, 8);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(pipepool_get(pool, &p[i]), 0);
	for (int i = 0; i < 3; i++)
		pipepool_put(pool, p[i]);
	cr_assert_eq(fds_in_use(), 6);
	run_for(60);
	cr_assert_eq(stats().idle, 3, "closed before idle_ms");
	run_for(200);
	s = stats();
	cr_assert_eq(s.idle, 0);
	cr_assert_eq(s.closed_idle, 3);
	cr_assert_eq(s.pipe_bytes, 0);
	cr_assert(!s.timer_pending, "no idle pipes: no timer");
	cr_assert_eq(fds_in_use(), 0);
}

/* Each pipe is closed idle_ms after ITS return: the older one goes first. */
Test(pipepool, staggered_expiry)
{
	struct pipepool_pipe *p1, *p2;
	struct pipepool_stats s;

	make(100, 0, 200, 8);
	cr_assert_eq(pipepool_get(pool, &p1), 0);
	cr_assert_eq(pipepool_get(pool, &p2), 0);
	pipepool_put(pool, p1);
	run_for(120);
	pipepool_put(pool, p2);
	run_for(130); /* p1 idle ~250 ms, p2 ~130 ms */
	s = stats();
	cr_assert_eq(s.idle, 1);
	cr_assert_eq(s.closed_idle, 1);
	cr_assert(s.timer_pending);
	cr_assert_eq(pipepool_get(pool, &p1), 0);
	cr_assert_eq(p1, p2, "the survivor is the younger pipe");
	pipepool_put(pool, p1);
	run_for(300);
	cr_assert_eq(stats().idle, 0);
	cr_assert_eq(fds_in_use(), 0);
}

Test(pipepool, discard_closes_a_pipe_with_data)
{
	struct pipepool_pipe *p;
	struct pipepool_stats s;
	int rd, wr;

	make(100, 0, 1000, 8);
	cr_assert_eq(pipepool_get(pool, &p), 0);
	rd = p->rd;
	wr = p->wr;
	cr_assert_eq(write(p->wr, "stale", 5), 5);
	pipepool_discard(pool, p);
	cr_assert(!fd_open(rd) && !fd_open(wr));
	s = stats();
	cr_assert_eq(s.discarded, 1);
	cr_assert_eq(s.lent, 0);
	cr_assert_eq(s.idle, 0, "a pipe with stale bytes is never reused");
	cr_assert_eq(fds_in_use(), 0);
}

Test(pipepool, max_idle_caps_the_idle_list)
{
	struct pipepool_pipe *p[3];
	struct pipepool_stats s;

	make(100, 0, 1000, 2);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(pipepool_get(pool, &p[i]), 0);
	for (int i = 0; i < 3; i++)
		pipepool_put(pool, p[i]);
	s = stats();
	cr_assert_eq(s.idle, 2);
	cr_assert_eq(s.closed_full, 1);
	cr_assert_eq(fds_in_use(), 4);
}

Test(pipepool, free_closes_idle_pipes_and_releases_fds)
{
	struct pipepool_pipe *p;
	int rd;

	make(100, 0, 1000, 8);
	cr_assert_eq(pipepool_get(pool, &p), 0);
	rd = p->rd;
	pipepool_put(pool, p);
	pipepool_free(pool);
	pool = NULL;
	cr_assert(!fd_open(rd));
	cr_assert_eq(fds_in_use(), 0);
}

static uint64_t fd_refused(void)
{
	struct budget_stats s;

	budget_get_stats(budget, &s);
	return s.fd_refused;
}

/* Idle pipes are a cache: a reservation the budget would refuse (a new session's socket)
 * closes them first, and is neither refused nor counted as refused. */
Test(pipepool, idle_pipes_give_way_to_a_reservation)
{
	struct pipepool_pipe *idle, *lent;
	int rd, wr;

	make(5, 0, 60000, 8);
	cr_assert_eq(pipepool_get(pool, &idle), 0);
	cr_assert_eq(pipepool_get(pool, &lent), 0);
	rd = idle->rd, wr = idle->wr;
	pipepool_put(pool, idle);
	cr_assert_eq(fds_in_use(), 4);
	cr_assert_eq(budget_fd_reserve(budget, 3), 0, "the idle pipe's two descriptors make room");
	cr_assert_eq(fds_in_use(), 5);
	cr_assert(!fd_open(rd) && !fd_open(wr), "the idle pipe is closed");
	cr_assert_eq(stats().idle, 0);
	cr_assert_eq(stats().reclaimed, 1);
	cr_assert(!stats().timer_pending, "nothing idle: the timer is gone");
	cr_assert_eq(fd_refused(), 0);
	/* A lent pipe carries bytes: it is never taken. */
	cr_assert_eq(budget_fd_reserve(budget, 1), -EMFILE);
	cr_assert_eq(fd_refused(), 1);
	cr_assert_eq(stats().lent, 1);
	cr_assert(fd_open(lent->rd) && fd_open(lent->wr));
	budget_fd_release(budget, 3);
	pipepool_put(pool, lent);
}

/* The coldest idle pipes go first, and no more of them than the reservation needs. */
Test(pipepool, reclaim_takes_the_coldest_and_only_what_is_needed)
{
	struct pipepool_pipe *p[3], *q;

	make(6, 0, 60000, 8);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(pipepool_get(pool, &p[i]), 0);
	for (int i = 0; i < 3; i++)
		pipepool_put(pool, p[i]); /* p[0] idle the longest */
	cr_assert_eq(budget_fd_reserve(budget, 2), 0);
	cr_assert_eq(stats().idle, 2);
	cr_assert_eq(stats().reclaimed, 1);
	cr_assert_eq(fds_in_use(), 6);
	cr_assert_eq(pipepool_get(pool, &q), 0);
	cr_assert_eq(q, p[2], "the warmest stays");
	cr_assert_eq(pipepool_get(pool, &q), 0);
	cr_assert_eq(q, p[1]);
	/* Nothing idle and the budget full: refused, counted once. */
	cr_assert_eq(budget_fd_reserve(budget, 3), -EMFILE);
	cr_assert_eq(fd_refused(), 1);
	pipepool_put(pool, p[1]);
	pipepool_put(pool, p[2]);
	budget_fd_release(budget, 2);
}

/* A freed pool is no longer the budget's hook. */
Test(pipepool, free_removes_the_reclaim_hook)
{
	make(2, 0, 60000, 8);
	pipepool_free(pool);
	pool = NULL;
	cr_assert_eq(budget_fd_reserve(budget, 2), 0);
	cr_assert_eq(budget_fd_reserve(budget, 1), -EMFILE);
	cr_assert_eq(fd_refused(), 1);
	budget_fd_release(budget, 2);
}

/* ---- libevent's allocations refused (failalloc.h, evmem.h) ---- */

/* A pipe given back when libevent has no memory for the shrink timer (its timer heap, 8 timers
 * full here, must grow): no timer would ever close it, so it is closed at once, its
 * descriptors back in the budget, rather than kept idle for good. */
Test(pipepool, a_pipe_no_timer_could_close_is_closed_at_once)
{
	struct pipepool_pipe *p;
	struct event *pads[7];
	struct pipepool_stats s;

	cr_assert_eq(evmem_install(), 0);
	make(100, 0, 100, 8);
	failalloc_pad_timers(base, pads, 7); /* with the tick: the heap's first eight places */
	cr_assert_eq(pipepool_get(pool, &p), 0);
	failalloc_arm(1); /* the heap's growth for the shrink timer */
	pipepool_put(pool, p);
	failalloc_arm(0);
	cr_assert(failalloc_fired(), "the timer needed no memory: nothing tested");
	run_for(300);
	s = stats();
	cr_assert_eq(s.idle, 0, "an idle pipe with no timer to close it");
	cr_assert_eq(fds_in_use(), 0);
	cr_assert(!s.timer_pending);
	failalloc_unpad(pads, 7);
}
