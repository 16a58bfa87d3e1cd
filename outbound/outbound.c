/* outbound.c — outbound sockets, dispatch by outbound type, and the attempt's life cycle
 * (conn.h): deferred results, finishing, cancelling. Also the reject outbound, which is only a
 * deferred -ECONNREFUSED.
 */
#include "outbound/outbound.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "outbound/conn.h"

int outbound_socket(const struct ts_outbound *ob, int family, int type, int *fd_out)
{
	int fd, ret, domain;

	if (family == 4)
		domain = AF_INET;
	else if (family == 6)
		domain = AF_INET6;
	else
		return -EAFNOSUPPORT;
	fd = socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* Mark and bind before connect/sendto: the first packet must already avoid the TUN. */
	if (ob->has_routing_mark &&
	    setsockopt(fd, SOL_SOCKET, SO_MARK, &ob->routing_mark, sizeof(ob->routing_mark)) != 0)
		goto fail;
	if (ob->bind_interface[0] &&
	    setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, ob->bind_interface,
		       (socklen_t)strlen(ob->bind_interface)) != 0)
		goto fail;
	*fd_out = fd;
	return 0;
fail:
	ret = -errno;
	close(fd);
	return ret;
}

int obc_sock_error(int fd)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
		return -errno;
	return -err;
}

int obc_connect(struct outbound_conn *c, const struct ts_outbound *ob, const struct sockaddr *sa,
		socklen_t salen, int *connect_err)
{
	int family = sa->sa_family == AF_INET6 ? 6 : 4;
	int ret;

	assert(c->fd < 0);
	if ((ret = outbound_socket(ob, family, SOCK_STREAM, &c->fd)) != 0)
		return ret;
	*connect_err = 0;
	while (connect(c->fd, sa, salen) != 0) {
		if (errno == EINTR)
			continue;
		if (errno != EINPROGRESS)
			*connect_err = -errno;
		break;
	}
	return 0;
}

/* The timer's one callback: a deferred result, or the deadline of the whole attempt. */
static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct outbound_conn *c = arg;

	obc_finish(c, c->deferred ? c->deferred_err : -ETIMEDOUT, NULL, 0);
}

struct outbound_conn *obc_new(struct event_base *base, outbound_done_fn done, void *arg)
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

void obc_free(struct outbound_conn *c)
{
	release_events(c);
	if (c->fd >= 0)
		close(c->fd);
	free(c->s5);
	free(c);
}

int obc_defer(struct outbound_conn *c, int err)
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

void obc_finish(struct outbound_conn *c, int err, const uint8_t *early, size_t early_len)
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
	obc_free(c);
}

/* reject: the attempt is refused without touching the network. */
static int reject_start(struct outbound_conn *c, const struct ts_outbound *ob,
			const struct flow_key *key, uint32_t timeout_ms)
{
	return obc_defer(c, -ECONNREFUSED);
}

typedef int (*start_fn)(struct outbound_conn *c, const struct ts_outbound *ob,
			const struct flow_key *key, uint32_t timeout_ms);

static const start_fn starts[] = {
	[TS_OUT_DIRECT] = direct_start,
	[TS_OUT_SOCKS5] = socks5_start,
	[TS_OUT_REJECT] = reject_start,
};

int outbound_connect(struct event_base *base, const struct ts_outbound *ob,
		     const struct flow_key *key, uint32_t timeout_ms, outbound_done_fn done,
		     void *arg, struct outbound_conn **out)
{
	struct outbound_conn *c;
	int ret;

	if (!base || !ob || !key || !done || !out || timeout_ms == 0)
		return -EINVAL;
	if ((unsigned)ob->type >= sizeof(starts) / sizeof(starts[0]) || !starts[ob->type])
		return -EINVAL;
	if (key->family != 4 && key->family != 6)
		return -EAFNOSUPPORT;
	c = obc_new(base, done, arg);
	if (!c)
		return -ENOMEM;
	if ((ret = starts[ob->type](c, ob, key, timeout_ms)) != 0) {
		obc_free(c);
		return ret;
	}
	*out = c;
	return 0;
}

void outbound_conn_cancel(struct outbound_conn *c)
{
	if (c)
		obc_free(c);
}
