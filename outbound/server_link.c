/* server_link.c — connecting to a proxy server by address or by name (see server_link.h). */
#include "outbound/server_link.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/netaddr.h"
#include "outbound/conn.h"
#include "outbound/happy.h"
#include "outbound/resolver.h"

void server_link_fini(struct server_link *l)
{
	resolver_cancel(l->rq);
	l->rq = NULL;
	happy_cancel(l->he);
	l->he = NULL;
	resolver_free(l->own_res);
	l->own_res = NULL;
	free(l->ob);
	l->ob = NULL;
}

static void on_io(evutil_socket_t fd, short what, void *arg);

int server_link_arm(struct outbound_conn *c, short flags)
{
	struct server_link *l = c->link;

	if (l->io_flags == flags)
		return 0;
	if (l->io_flags)
		event_del(c->io);
	l->io_flags = 0;
	if (event_assign(c->io, c->base, c->fd, flags, on_io, c) != 0 ||
	    event_add(c->io, NULL) != 0)
		return -ENOMEM;
	l->io_flags = flags;
	return 0;
}

int server_link_flush(struct outbound_conn *c)
{
	struct server_link *l = c->link;
	ssize_t n;

	while (l->out_off < l->out_len) {
		/* MSG_NOSIGNAL: a server that went away is an error, not a SIGPIPE. */
		n = send(c->fd, l->out + l->out_off, l->out_len - l->out_off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
		}
		l->out_off += (size_t)n;
	}
	return 0;
}

int server_link_fill(struct outbound_conn *c)
{
	struct server_link *l = c->link;
	ssize_t n;

	if (l->in_len == l->in_cap)
		return -EPROTO;
	do {
		n = recv(c->fd, l->in + l->in_len, l->in_cap - l->in_len, 0);
	} while (n < 0 && errno == EINTR);
	if (n == 0)
		return -EPROTO;
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
	l->in_len += (size_t)n;
	return 0;
}

/* The handshake's I/O: the connect's result first, then read, step, re-arm. */
static void on_io(evutil_socket_t fd, short what, void *arg)
{
	struct outbound_conn *c = arg;
	struct server_link *l = c->link;
	size_t early = 0;
	int ret;

	if (!l->connected) {
		l->io_flags = 0;  /* the connect wait was one-shot */
		if ((ret = conn_sock_error(c->fd)) != 0)
			goto fail;
		l->connected = true;
	}
	if ((what & EV_READ) && (ret = server_link_fill(c)) < 0)
		goto fail;
	if ((ret = l->advance(c, &early)) < 0)
		goto fail;
	if (ret == 1) {
		conn_finish(c, 0, l->in + early, l->in_len - early);
		return;
	}
	ret = server_link_arm(c, l->out_off < l->out_len ? EV_WRITE | EV_PERSIST
							: EV_READ | EV_PERSIST);
	if (ret == 0)
		return;
fail:
	conn_finish(c, ret, NULL, 0);
}

/* The connect to the server finished (happy.h): the handshake starts when it can write. */
static void on_connected(void *arg, int err, int fd)
{
	struct outbound_conn *c = arg;
	struct server_link *l = c->link;

	l->he = NULL;
	if (err != 0) {
		conn_finish(c, err, NULL, 0);
		return;
	}
	c->fd = fd;
	l->connected = true;
	if (!(c->io = event_new(c->base, c->fd, EV_WRITE, on_io, c)) ||
	    event_add(c->io, NULL) != 0) {
		conn_finish(c, -ENOMEM, NULL, 0);
		return;
	}
	l->io_flags = EV_WRITE;
}

static void on_resolved(void *arg, int err, const struct netaddr *addrs, size_t n)
{
	struct outbound_conn *c = arg;
	struct server_link *l = c->link;
	struct sockaddr_storage ss[HAPPY_MAX_ADDRS];
	uint16_t port_be = htons(l->ob->server.port);
	size_t m = 0;

	l->rq = NULL;
	for (size_t i = 0; err == 0 && i < n && m < HAPPY_MAX_ADDRS; i++)
		if (netaddr_sockaddr(addrs[i].family, addrs[i].a, port_be, &ss[m]))
			m++;
	if (err == 0 && m == 0)
		err = -ENXIO;
	if (err == 0)
		err = happy_start(c->base, l->ob, ss, m, HAPPY_DELAY_MS, on_connected, c, &l->he);
	if (err != 0)
		conn_finish(c, err, NULL, 0);
}

/* A server name not pinned: look it up without blocking, then connect (on_resolved). */
static int start_by_name(struct outbound_conn *c, struct server_link *l,
			 const struct ts_outbound *ob)
{
	struct resolver *r = ob->resolver;
	int ret;

	if (!(l->ob = malloc(sizeof(*l->ob))))
		return -ENOMEM;
	*l->ob = *ob;
	if (!r) {
		struct resolver_config cfg = { .sock = ob };

		if ((ret = resolver_new(c->base, &cfg, &l->own_res)) != 0)
			return ret;
		r = l->own_res;
	}
	ret = resolver_lookup(r, ob->server.host, 0, on_resolved, c, &l->rq);
	return ret == -EINVAL ? -ENXIO : ret;
}

int server_link_start(struct outbound_conn *c, struct server_link *l,
		      const struct ts_outbound *ob,
		      int (*advance)(struct outbound_conn *c, size_t *early), uint32_t timeout_ms)
{
	const struct ts_hostport *hp = &ob->server;
	struct timeval tv = conn_timeval(timeout_ms);
	struct sockaddr_storage ss;
	socklen_t len;
	int ret, cerr;

	if (!ob->has_server)
		return -EINVAL;
	c->link = l;
	l->advance = advance;
	if (!hp->is_addr && !hp->pinned) {
		if ((ret = start_by_name(c, l, ob)) != 0)
			return ret;
		return event_add(c->timer, &tv) != 0 ? -ENOMEM : 0;
	}
	/* Known without a lookup: a literal, or pinned by the running proxy. */
	len = (socklen_t)netaddr_sockaddr(hp->addr.family, hp->addr.a, htons(hp->port), &ss);
	if (!len)
		return -EAFNOSUPPORT;
	if ((ret = conn_connect(c, ob, (const struct sockaddr *)&ss, len, &cerr)) != 0)
		return ret;
	if (!(c->io = event_new(c->base, c->fd, EV_WRITE, on_io, c)))
		return -ENOMEM;
	if (cerr != 0)
		return conn_defer(c, cerr);
	if (event_add(c->timer, &tv) != 0 || event_add(c->io, NULL) != 0)
		return -ENOMEM;
	l->io_flags = EV_WRITE;
	return 0;
}
