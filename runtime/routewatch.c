/* routewatch.c — netlink notifications of routing changes, folded into one callback per burst
 * (see routewatch.h). */
#include "runtime/routewatch.h"

#include <errno.h>
#include <stdbool.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#define RCVBUF (1 << 20)

struct routewatch {
	int fd;
	struct event *rd;
	struct event *timer;
	routewatch_fn fn;
	void *arg;
	uint64_t events;
};

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct routewatch *rw = arg;

	(void)fd;
	(void)what;
	rw->fn(rw->arg);
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
	static const struct timeval delay = { 0, ROUTEWATCH_DELAY_MS * 1000 };
	struct routewatch *rw = arg;
	char buf[8192];
	bool changed = false;

	(void)what;
	/* Drain: only the fact of a change matters, the callback re-reads the state. */
	for (int i = 0; i < 256; i++) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0 || (n < 0 && errno == ENOBUFS)) {
			changed = true;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		break;
	}
	if (!changed)
		return;
	rw->events++;
	/* A burst that cannot be timed (no memory for the timer) is reported now, unfolded:
	 * otherwise no callback would come until the next change. */
	if (!evtimer_pending(rw->timer, NULL) && evtimer_add(rw->timer, &delay) != 0)
		rw->fn(rw->arg);
}

static int join(int fd, unsigned group)
{
	return setsockopt(fd, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, &group, sizeof(group)) == 0
		       ? 0
		       : -errno;
}

int routewatch_new(struct event_base *base, routewatch_fn fn, void *arg, struct routewatch **out)
{
	static const unsigned groups[] = { RTNLGRP_LINK, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE,
					   RTNLGRP_IPV4_RULE, RTNLGRP_IPV6_RULE };
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	struct routewatch *rw;
	int ret, sz = RCVBUF;

	if (!(rw = calloc(1, sizeof(*rw))))
		return -ENOMEM;
	rw->fn = fn;
	rw->arg = arg;
	rw->fd = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (rw->fd < 0 || bind(rw->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		ret = -errno;
		goto fail;
	}
	/* A larger buffer makes overruns rare; one is harmless (it counts as a change). */
	if (setsockopt(rw->fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)) != 0)
		(void)setsockopt(rw->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	for (size_t i = 0; i < sizeof(groups) / sizeof(groups[0]); i++) {
		if ((ret = join(rw->fd, groups[i])) != 0)
			goto fail;
	}
	rw->rd = event_new(base, rw->fd, EV_READ | EV_PERSIST, on_read, rw);
	rw->timer = evtimer_new(base, on_timer, rw);
	if (!rw->rd || !rw->timer || event_add(rw->rd, NULL) != 0) {
		ret = -ENOMEM;
		goto fail;
	}
	*out = rw;
	return 0;
fail:
	routewatch_free(rw);
	return ret;
}

void routewatch_free(struct routewatch *rw)
{
	if (!rw)
		return;
	if (rw->rd)
		event_free(rw->rd);
	if (rw->timer)
		event_free(rw->timer);
	if (rw->fd >= 0)
		close(rw->fd);
	free(rw);
}

uint64_t routewatch_events(const struct routewatch *rw)
{
	return rw->events;
}
