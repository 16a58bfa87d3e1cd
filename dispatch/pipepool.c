/* pipepool.c — budgeted pipes for splice, lent while data is in flight, shrunk when idle.
 *
 * Invariants: fds reserved from the budget == 2 * (lent + idle); pipe_bytes == sum of cap over
 * lent + idle; the shrink timer is pending iff idle > 0; the idle list is ordered newest first,
 * so its tail holds the pipe idle the longest.
 */
#include "dispatch/pipepool.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

TAILQ_HEAD(pipe_list, pipepool_pipe);

struct pipepool {
	struct budget *budget;
	struct event *timer;
	struct pipe_list idle_list;
	size_t pipe_size;
	int64_t idle_ns;
	uint32_t max_idle;
	bool timer_pending;
	uint32_t lent, idle;
	uint64_t pipe_bytes;
	uint64_t created, closed_idle, closed_full, discarded, reused, refused_budget, failed;
	uint64_t resize_failed, reclaimed;
};

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void pipepool_params_default(struct pipepool_params *p)
{
	p->pipe_size = PIPEPOOL_DEFAULT_SIZE;
	p->idle_ms = PIPEPOOL_DEFAULT_IDLE_MS;
	p->max_idle = PIPEPOOL_DEFAULT_MAX_IDLE;
}

size_t pipepool_max_size(void)
{
	FILE *f = fopen("/proc/sys/fs/pipe-max-size", "re");
	unsigned long v = 0;

	if (!f)
		return 0;
	if (fscanf(f, "%lu", &v) != 1)
		v = 0;
	fclose(f);
	return v;
}

/* 0, or -ENOMEM: libevent had no memory for the timer. */
static int arm_timer(struct pipepool *pp, int64_t delay_ns)
{
	struct timeval tv;

	if (delay_ns < 0)
		delay_ns = 0;
	tv.tv_sec = delay_ns / 1000000000LL;
	tv.tv_usec = (delay_ns % 1000000000LL) / 1000 + 1; /* round up: never fire early */
	if (event_add(pp->timer, &tv) != 0)
		return -ENOMEM;
	pp->timer_pending = true;
	return 0;
}

static void close_pipe(struct pipepool *pp, struct pipepool_pipe *p)
{
	close(p->rd);
	close(p->wr);
	pp->pipe_bytes -= p->cap;
	budget_fd_release(pp->budget, 2);
	free(p);
}

/* Take p off the idle list; the last idle pipe gone, the shrink timer has nothing to wait for. */
static void unidle(struct pipepool *pp, struct pipepool_pipe *p)
{
	TAILQ_REMOVE(&pp->idle_list, p, link);
	pp->idle--;
	if (pp->idle == 0 && pp->timer_pending) {
		event_del(pp->timer);
		pp->timer_pending = false;
	}
}

/* Close the pipes idle for idle_ns or longer (from the tail), then re-arm for the next one;
 * if the timer cannot be armed again (no memory), the rest are closed now: no timer would
 * close them later. */
static void on_shrink(evutil_socket_t fd, short what, void *arg)
{
	struct pipepool *pp = arg;
	int64_t now = now_ns();
	struct pipepool_pipe *p;

	pp->timer_pending = false;
	while ((p = TAILQ_LAST(&pp->idle_list, pipe_list)) != NULL) {
		if (p->idle_since_ns + pp->idle_ns > now &&
		    arm_timer(pp, p->idle_since_ns + pp->idle_ns - now) == 0)
			return;
		unidle(pp, p);
		pp->closed_idle++;
		close_pipe(pp, p);
	}
}

/* The budget's reclaim hook: a reservation about to be refused takes the coldest idle pipes,
 * as many as give back n descriptors or all there are. A lent pipe carries a session's bytes
 * and is never taken. */
static void on_reclaim(void *arg, uint32_t n)
{
	struct pipepool *pp = arg;
	struct pipepool_pipe *p;
	uint32_t freed = 0;

	while (freed < n && (p = TAILQ_LAST(&pp->idle_list, pipe_list)) != NULL) {
		unidle(pp, p);
		pp->reclaimed++;
		close_pipe(pp, p);
		freed += 2;
	}
}

int pipepool_new(struct event_base *base, struct budget *b, const struct pipepool_params *p,
		 struct pipepool **out)
{
	struct pipepool *pp;
	size_t max;

	*out = NULL;
	if (!base || !b || !p)
		return -EINVAL;
	pp = calloc(1, sizeof(*pp));
	if (!pp)
		return -ENOMEM;
	pp->timer = evtimer_new(base, on_shrink, pp);
	if (!pp->timer) {
		free(pp);
		return -ENOMEM;
	}
	TAILQ_INIT(&pp->idle_list);
	pp->budget = b;
	pp->pipe_size = p->pipe_size;
	max = pipepool_max_size();
	if (max && pp->pipe_size > max)
		pp->pipe_size = max;
	pp->idle_ns = (int64_t)(p->idle_ms ? p->idle_ms : PIPEPOOL_DEFAULT_IDLE_MS) * 1000000LL;
	pp->max_idle = p->max_idle ? p->max_idle : PIPEPOOL_DEFAULT_MAX_IDLE;
	budget_set_fd_reclaim(b, on_reclaim, pp);
	*out = pp;
	return 0;
}

void pipepool_free(struct pipepool *pp)
{
	struct pipepool_pipe *p;

	if (!pp)
		return;
	assert(pp->lent == 0);
	budget_clear_fd_reclaim(pp->budget, pp);
	while ((p = TAILQ_FIRST(&pp->idle_list)) != NULL) {
		unidle(pp, p);
		close_pipe(pp, p);
	}
	event_free(pp->timer);
	free(pp);
}

/* A fresh pipe with its two descriptors already reserved by the caller. */
static int open_pipe(struct pipepool *pp, struct pipepool_pipe **out)
{
	struct pipepool_pipe *p = calloc(1, sizeof(*p));
	int fds[2], sz;

	if (!p)
		return -ENOMEM;
	if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
		int ret = -errno;
		free(p);
		return ret;
	}
	/* A larger pipe moves more per splice call; EPERM (the user's pipe quota,
	 * pipe-user-pages-soft) leaves the default, which still works. */
	if (pp->pipe_size && fcntl(fds[1], F_SETPIPE_SZ, (int)pp->pipe_size) < 0)
		pp->resize_failed++;
	sz = fcntl(fds[1], F_GETPIPE_SZ);
	p->rd = fds[0];
	p->wr = fds[1];
	p->cap = sz > 0 ? (size_t)sz : 65536;
	*out = p;
	return 0;
}

int pipepool_get(struct pipepool *pp, struct pipepool_pipe **out)
{
	struct pipepool_pipe *p = TAILQ_FIRST(&pp->idle_list);
	int ret;

	if (p) {
		unidle(pp, p);
		pp->reused++;
	} else {
		if (budget_fd_reserve_optional(pp->budget, 2) != 0) {
			pp->refused_budget++;
			return -EMFILE;
		}
		if ((ret = open_pipe(pp, &p)) != 0) {
			budget_fd_release(pp->budget, 2);
			pp->failed++;
			return ret;
		}
		pp->created++;
		pp->pipe_bytes += p->cap;
	}
	pp->lent++;
	*out = p;
	return 0;
}

void pipepool_put(struct pipepool *pp, struct pipepool_pipe *p)
{
#ifndef NDEBUG
	int pending = -1;
	assert(ioctl(p->rd, FIONREAD, &pending) == 0 && pending == 0);
#endif
	assert(pp->lent > 0);
	pp->lent--;
	if (pp->idle >= pp->max_idle) {
		pp->closed_full++;
		close_pipe(pp, p);
		return;
	}
	/* An idle pipe no timer would close (no memory for it) is closed now. */
	if (!pp->timer_pending && arm_timer(pp, pp->idle_ns) != 0) {
		pp->closed_idle++;
		close_pipe(pp, p);
		return;
	}
	p->idle_since_ns = now_ns();
	TAILQ_INSERT_HEAD(&pp->idle_list, p, link);
	pp->idle++;
}

void pipepool_discard(struct pipepool *pp, struct pipepool_pipe *p)
{
	assert(pp->lent > 0);
	pp->lent--;
	pp->discarded++;
	close_pipe(pp, p);
}

void pipepool_get_stats(const struct pipepool *pp, struct pipepool_stats *out)
{
	out->lent = pp->lent;
	out->idle = pp->idle;
	out->pipe_bytes = pp->pipe_bytes;
	out->pipe_size = pp->pipe_size;
	out->created = pp->created;
	out->closed_idle = pp->closed_idle;
	out->closed_full = pp->closed_full;
	out->discarded = pp->discarded;
	out->reused = pp->reused;
	out->refused_budget = pp->refused_budget;
	out->failed = pp->failed;
	out->resize_failed = pp->resize_failed;
	out->reclaimed = pp->reclaimed;
	out->timer_pending = pp->timer_pending;
}
