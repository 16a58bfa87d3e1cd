/* conn.c — the life of one outbound connection attempt (conn.h): its socket and
 * non-blocking connect, its deadline, results deferred to the loop, finishing and freeing. */
#include "outbound/conn.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/loopguard.h"
#include "outbound/direct.h"
#include "outbound/http.h"
#include "outbound/socks5.h"

int conn_sock_error(int fd)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
		return -errno;
	return -err;
}

int conn_open(const struct ts_outbound *ob, const struct sockaddr *sa, socklen_t salen,
	      int *fd_out, int *connect_err)
{
	int family = sa->sa_family == AF_INET6 ? 6 : 4;
	int ret, fd;

	if ((ret = outbound_socket(ob, family, SOCK_STREAM, &fd)) != 0)
		return ret;
	*connect_err = 0;
	while (connect(fd, sa, salen) != 0) {
		if (errno == EINTR)
			continue;
		if (errno != EINPROGRESS)
			*connect_err = -errno;
		break;
	}
	/* Routed into our own TUN? Then its SYN is on its way there: on record now, before this
	 * loop reads the TUN again (core/loopguard.h). */
	if (*connect_err == 0 && ob->loopguard &&
	    loopguard_connected(ob->loopguard, fd, family) < 0) {
		/* getsockname on a socket we just connected cannot fail short of a kernel bug;
		 * the socket still works, only unguarded */
	}
	*fd_out = fd;
	return 0;
}

int conn_connect(struct outbound_conn *c, const struct ts_outbound *ob, const struct sockaddr *sa,
		 socklen_t salen, int *connect_err)
{
	assert(c->fd < 0);
	return conn_open(ob, sa, salen, &c->fd, connect_err);
}

/* The timer's one callback: a deferred result, or the deadline of the whole attempt. */
static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct outbound_conn *c = arg;

	conn_finish(c, c->deferred ? c->deferred_err : -ETIMEDOUT, NULL, 0);
}

struct outbound_conn *conn_new(struct event_base *base, outbound_done_fn done, void *arg)
{
	struct outbound_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->base = base;
	c->done = done;
	c->arg = arg;
	c->fd = -1;
	c->timer = evtimer_new(base, on_timer, c);
	if (!c->timer) {
		free(c);
		return NULL;
	}
	return c;
}

static void release_events(struct outbound_conn *c)
{
	/* event_free also takes an event out of the active queue, so nothing fires later. */
	if (c->io) {
		event_free(c->io);
		c->io = NULL;
	}
	if (c->timer) {
		event_free(c->timer);
		c->timer = NULL;
	}
}

void conn_free(struct outbound_conn *c)
{
	release_events(c);
	if (c->fd >= 0)
		close(c->fd);
	socks5_state_free(c->s5);
	http_state_free(c->http);
	direct_state_free(c->direct);
	free(c);
}

int conn_defer(struct outbound_conn *c, int err)
{
	if (c->io)
		event_del(c->io);
	if (event_del(c->timer) != 0)
		return -EIO;
	c->deferred = true;
	c->deferred_err = err;
	/* Active, not merely pending: it runs in the loop's next pass, never inside our caller. */
	event_active(c->timer, EV_TIMEOUT, 1);
	return 0;
}

void conn_finish(struct outbound_conn *c, int err, const uint8_t *early, size_t early_len)
{
	int fd = -1;

	release_events(c);
	if (err == 0) {
		fd = c->fd;
		c->fd = -1;
	} else if (c->fd >= 0) {
		/* Close before done so the fd budget the caller keeps is already accurate. */
		close(c->fd);
		c->fd = -1;
	}
	if (err != 0)
		early_len = 0;
	c->done(c->arg, err, fd, early_len ? early : NULL, early_len);
	conn_free(c);
}

/* reject: the attempt is refused without touching the network. */
