/* happy.c — Happy Eyeballs connection attempts (happy.h): one non-blocking connect per address,
 * staggered by the Connection Attempt Delay on one timer; the first socket to connect is handed
 * over, every other one closed.
 */
#include "outbound/happy.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "outbound/conn.h"

struct happy;

struct htry {
	struct happy *h;
	int fd;                   /* -1: not started, or over */
	struct event *ev;
};

struct happy {
	struct event_base *base;
	const struct ts_outbound *ob;
	happy_fn done;
	void *arg;
	struct event *timer;      /* the next attempt's delay, or the deferred failure */
	bool failed;              /* timer reports last_err */
	int last_err;
	uint32_t delay_ms;
	size_t n, next, active;
	/* Descriptors: the caller holds one for the connection; each socket open beside the
	 * first takes one more from ob->fd_budget (extra), given back as sockets close. */
	size_t open;              /* sockets open now, the winner's until it is handed over */
	uint32_t extra;
	struct sockaddr_storage addrs[HAPPY_MAX_ADDRS];
	struct htry tries[HAPPY_MAX_ADDRS];
};

/* One socket fewer: the descriptors reserved beyond the caller's one follow the count. */
static void fd_gone(struct happy *h)
{
	h->open--;
	if (h->extra > (h->open ? h->open - 1 : 0)) {
		budget_fd_release(h->ob->fd_budget, 1);
		h->extra--;
	}
}

/* May one more socket open now? The first is the caller's; each other needs a descriptor of
 * ob->fd_budget (none: unbudgeted), or waits for an attempt to end. */
static bool fd_take(struct happy *h)
{
	if (h->open > 0 && h->ob->fd_budget) {
		if (budget_fd_reserve_optional(h->ob->fd_budget, 1) != 0)
			return false;
		h->extra++;
	}
	h->open++;
	return true;
}

static void try_close(struct htry *t)
{
	if (t->ev) {
		event_free(t->ev);
		t->ev = NULL;
	}
	if (t->fd >= 0) {
		close(t->fd);
		t->fd = -1;
		fd_gone(t->h);
	}
}

void happy_cancel(struct happy *h)
{
	if (!h)
		return;
	for (size_t i = 0; i < h->n; i++)
		try_close(&h->tries[i]);
	/* What is left open is the winner, handed over on the caller's own descriptor. */
	if (h->extra)
		budget_fd_release(h->ob->fd_budget, h->extra);
	if (h->timer)
		event_free(h->timer);
	free(h);
}

/* Hand over (err 0: fd) or fail, from a loop callback: h is freed before done runs. */
static void finish(struct happy *h, int err, int fd)
{
	happy_fn done = h->done;
	void *arg = h->arg;

	happy_cancel(h);
	done(arg, err, fd);
}

static void on_writable(evutil_socket_t fd, short what, void *arg);

/* Start attempts until one is in progress (then arm the delay before the next) or none is
 * left; with nothing in progress and nothing left, the failure goes out from the timer. With
 * no descriptor for another socket, the next attempt waits for the delay again, or for an
 * attempt in progress to fail. A delay libevent has no memory to time is not waited for: the
 * next attempt starts when the one in progress fails, and the caller's connect timeout (armed
 * before the attempts start) bounds the whole. */
static void start_next(struct happy *h)
{
	struct timeval tv = conn_timeval(h->delay_ms);

	while (h->next < h->n) {
		struct htry *t = &h->tries[h->next];
		const struct sockaddr *sa = (const struct sockaddr *)&h->addrs[h->next];
		socklen_t len = sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
							  : sizeof(struct sockaddr_in);
		int ret, cerr;

		if (!fd_take(h)) { /* only while another attempt is open: active > 0 */
			(void)evtimer_add(h->timer, &tv);
			return;
		}
		h->next++;
		if ((ret = conn_open(h->ob, sa, len, &t->fd, &cerr)) != 0) {
			t->fd = -1;
			fd_gone(h);
			h->last_err = ret;
			continue;
		}
		if (cerr == 0 && (t->ev = event_new(h->base, t->fd, EV_WRITE, on_writable, t)) &&
		    event_add(t->ev, NULL) == 0) {
			h->active++;
			if (h->next < h->n)
				(void)evtimer_add(h->timer, &tv);
			return;
		}
		h->last_err = cerr ? cerr : -ENOMEM;
		try_close(t);
	}
	if (h->active == 0) {
		h->failed = true;
		event_active(h->timer, EV_TIMEOUT, 1);
	}
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	struct htry *t = arg;
	struct happy *h = t->h;
	int err = conn_sock_error(t->fd);

	if (err == 0) {
		int won = t->fd;

		t->fd = -1;  /* not closed by finish */
		finish(h, 0, won);
		return;
	}
	h->last_err = err;
	try_close(t);
	h->active--;
	/* A failure starts the next attempt at once, without waiting for the delay. */
	evtimer_del(h->timer);
	start_next(h);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct happy *h = arg;

	if (h->failed) {
		finish(h, h->last_err ? h->last_err : -ECONNREFUSED, -1);
		return;
	}
	start_next(h);
}

int happy_start(struct event_base *base, const struct ts_outbound *ob,
		const struct sockaddr_storage *addrs, size_t n, uint32_t delay_ms, happy_fn done,
		void *arg, struct happy **out)
{
	struct happy *h;

	if (!base || !ob || !addrs || n == 0 || !done || !out)
		return -EINVAL;
	if (!(h = calloc(1, sizeof(*h))))
		return -ENOMEM;
	h->base = base;
	h->ob = ob;
	h->done = done;
	h->arg = arg;
	h->delay_ms = delay_ms;
	h->n = n < HAPPY_MAX_ADDRS ? n : HAPPY_MAX_ADDRS;
	memcpy(h->addrs, addrs, h->n * sizeof(*addrs));
	for (size_t i = 0; i < h->n; i++)
		h->tries[i] = (struct htry){ .h = h, .fd = -1 };
	if (!(h->timer = evtimer_new(base, on_timer, h))) {
		free(h);
		return -ENOMEM;
	}
	start_next(h);
	*out = h;
	return 0;
}
