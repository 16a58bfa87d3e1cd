/* socks5.c — the SOCKS5 CONNECT outbound on libevent: TCP connect to the server from a
 * marked/bound socket, then the handshake of socks5_codec (greeting, optional RFC 1929
 * authentication, CONNECT to the flow's original destination as ATYP 1 or 4).
 *
 * This file only moves bytes; every protocol decision is in the codec. One io event follows
 * what the attempt waits for (EV_WRITE while connecting or sending, EV_READ otherwise); the
 * attempt's timer is one deadline for the whole attempt. Bytes the server sends past its
 * CONNECT reply are the stream's first bytes and go to done() as early bytes.
 *
 * Server names: the running proxy resolves a server given as a host name once, at start and at
 * each reload, off its loop and before auto_route captures anything (ts_hostport.pinned: addr
 * holds the answer), and connections use that address. An outbound used without that (a test,
 * another program, a name not pinned) resolves at connect time, asynchronously, with the
 * resolver of ob->resolver (or, without one, a resolver of the attempt's own, whose sockets
 * carry the outbound's mark), then connects to the answers with Happy Eyeballs (happy.h). The
 * attempt's deadline covers resolution, connect and handshake; a name that does not resolve
 * fails the attempt with -ENXIO (-EAGAIN temporary failure, -ETIMEDOUT no answer).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/event.h>

#include "core/netaddr.h"
#include "outbound/conn.h"
#include "outbound/happy.h"
#include "outbound/resolver.h"
#include "outbound/socks5.h"
#include "outbound/socks5_codec.h"

/* Room for the longest reply plus early bytes; more early bytes simply stay in the socket. */
#define S5_IN_CAP 1024
/* Requests go out one at a time; the longest is the RFC 1929 one. */
#define S5_OUT_CAP SOCKS5_AUTH_MAX

struct socks5_conn {
	struct socks5_client cl;
	bool connected;          /* TCP connect to the server finished */
	short io_flags;          /* what c->io currently waits for; 0 = not armed */
	size_t out_off, out_len; /* out[out_off..out_len) still to send */
	size_t in_len;           /* in[0..in_len) received, not yet consumed */
	/* A server given by name, not pinned: */
	struct ts_outbound *ob;        /* a copy (happy connects with it after the lookup) */
	struct resolver *own_res;      /* without ob->resolver: this attempt's own */
	struct resolver_query *rq;     /* the lookup in progress */
	struct happy *he;              /* the connect attempts in progress */
	uint8_t out[S5_OUT_CAP];
	uint8_t in[S5_IN_CAP];
};

/* The server's address when it is known without a lookup: a literal, or pinned. */
static int server_sockaddr(const struct ts_hostport *hp, struct sockaddr_storage *ss,
			   socklen_t *len)
{
	*len = (socklen_t)netaddr_sockaddr(hp->addr.family, hp->addr.a, htons(hp->port), ss);
	return *len ? 0 : -EAFNOSUPPORT;
}

void socks5_state_free(struct socks5_conn *s)
{
	if (!s)
		return;
	resolver_cancel(s->rq);
	happy_cancel(s->he);
	resolver_free(s->own_res);
	free(s->ob);
	free(s);
}

static void on_io(evutil_socket_t fd, short what, void *arg);

/* Wait for flags on the fd; re-assigning is only legal while the event is not pending. */
static int arm(struct outbound_conn *c, short flags)
{
	struct socks5_conn *s = c->s5;

	if (s->io_flags == flags)
		return 0;
	if (s->io_flags)
		event_del(c->io);
	s->io_flags = 0;
	if (event_assign(c->io, c->base, c->fd, flags, on_io, c) != 0 ||
	    event_add(c->io, NULL) != 0)
		return -EIO;
	s->io_flags = flags;
	return 0;
}

/* Send what is pending. 0 (maybe partially: EV_WRITE will resume) or -errno. */
static int flush(struct outbound_conn *c)
{
	struct socks5_conn *s = c->s5;
	ssize_t n;

	while (s->out_off < s->out_len) {
		/* MSG_NOSIGNAL: a server that went away is an error, not a SIGPIPE. */
		n = send(c->fd, s->out + s->out_off, s->out_len - s->out_off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
		}
		s->out_off += (size_t)n;
	}
	return 0;
}

/* One recv into the free part of in. 0 or -errno; a close before the handshake ends is the
 * server breaking the protocol: -EPROTO. */
static int fill(struct outbound_conn *c)
{
	struct socks5_conn *s = c->s5;
	ssize_t n;

	if (s->in_len == sizeof(s->in))
		return -EPROTO;  /* unreachable: no reply is that long (advance() checks) */
	do {
		n = recv(c->fd, s->in + s->in_len, sizeof(s->in) - s->in_len, 0);
	} while (n < 0 && errno == EINTR);
	if (n == 0)
		return -EPROTO;
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
	s->in_len += (size_t)n;
	return 0;
}

/* Feed buffered bytes to the codec, one message at a time, sending each request before the
 * next reply is looked at. Returns 1 when the handshake is complete, 0 to wait for the
 * socket, -errno on failure. */
static int advance(struct outbound_conn *c)
{
	struct socks5_conn *s = c->s5;
	size_t out_len;
	int n;

	for (;;) {
		if ((n = flush(c)) < 0)
			return n;
		if (s->out_off < s->out_len)
			return 0;
		if (s->cl.state == SOCKS5_CL_DONE)
			return 1;
		if (s->in_len == 0)
			return 0;
		n = socks5_client_input(&s->cl, s->in, s->in_len, s->out, sizeof(s->out),
					&out_len);
		if (n < 0)
			return n;
		if (n == SOCKS5_NEED_MORE)
			return s->in_len == sizeof(s->in) ? -EPROTO : 0;
		s->in_len -= (size_t)n;
		memmove(s->in, s->in + n, s->in_len);
		s->out_off = 0;
		s->out_len = out_len;
	}
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
	struct outbound_conn *c = arg;
	struct socks5_conn *s = c->s5;
	int ret;

	if (!s->connected) {
		s->io_flags = 0;  /* the connect wait was one-shot */
		if ((ret = conn_sock_error(c->fd)) != 0)
			goto fail;
		s->connected = true;
	}
	if ((what & EV_READ) && (ret = fill(c)) < 0)
		goto fail;
	if ((ret = advance(c)) < 0)
		goto fail;
	if (ret == 1) {
		conn_finish(c, 0, s->in, s->in_len);
		return;
	}
	if (s->out_off < s->out_len)
		ret = arm(c, EV_WRITE | EV_PERSIST);
	else
		ret = arm(c, EV_READ | EV_PERSIST);
	if (ret == 0)
		return;
fail:
	conn_finish(c, ret, NULL, 0);
}

/* The handshake state: CONNECT to the flow's original destination, greeting queued. */
static int prepare(struct outbound_conn *c, const struct ts_outbound *ob,
		   const struct flow_key *key)
{
	struct socks5_addr dst;
	int ret;

	c->s5 = calloc(1, sizeof(*c->s5));
	if (!c->s5)
		return -ENOMEM;
	if ((ret = socks5_addr_ip(&dst, key->family, key->dst, ntohs(key->dport_be))) != 0)
		return ret;
	ret = socks5_client_start(&c->s5->cl, &dst, ob->has_auth ? ob->username : NULL,
				  ob->has_auth ? ob->password : NULL, c->s5->out,
				  sizeof(c->s5->out));
	if (ret < 0)
		return ret;
	c->s5->out_len = (size_t)ret;
	return 0;
}

/* The connect to the server finished (happy.h): the handshake starts with the greeting. */
static void on_server_connected(void *arg, int err, int fd)
{
	struct outbound_conn *c = arg;
	struct socks5_conn *s = c->s5;

	s->he = NULL;
	if (err != 0) {
		conn_finish(c, err, NULL, 0);
		return;
	}
	c->fd = fd;
	s->connected = true;
	if (!(c->io = event_new(c->base, c->fd, EV_WRITE, on_io, c)) || event_add(c->io, NULL) != 0) {
		conn_finish(c, -ENOMEM, NULL, 0);
		return;
	}
	s->io_flags = EV_WRITE;
}

static void on_resolved(void *arg, int err, const struct netaddr *addrs, size_t n)
{
	struct outbound_conn *c = arg;
	struct socks5_conn *s = c->s5;
	struct sockaddr_storage ss[HAPPY_MAX_ADDRS];
	uint16_t port_be = htons(s->ob->server.port);
	size_t m = 0;

	s->rq = NULL;
	for (size_t i = 0; err == 0 && i < n && m < HAPPY_MAX_ADDRS; i++)
		if (netaddr_sockaddr(addrs[i].family, addrs[i].a, port_be, &ss[m]))
			m++;
	if (err == 0 && m == 0)
		err = -ENXIO;
	if (err == 0)
		err = happy_start(c->base, s->ob, ss, m, HAPPY_DELAY_MS, on_server_connected, c,
				  &s->he);
	if (err != 0)
		conn_finish(c, err, NULL, 0);
}

/* A server name not pinned: look it up without blocking, then connect (on_resolved). */
static int start_by_name(struct outbound_conn *c, const struct ts_outbound *ob)
{
	struct socks5_conn *s = c->s5;
	struct resolver *r = ob->resolver;
	int ret;

	if (!(s->ob = malloc(sizeof(*s->ob))))
		return -ENOMEM;
	*s->ob = *ob;
	if (!r) {
		struct resolver_config cfg = { .sock = ob };

		if ((ret = resolver_new(c->base, &cfg, &s->own_res)) != 0)
			return ret;
		r = s->own_res;
	}
	ret = resolver_lookup(r, ob->server.host, 0, on_resolved, c, &s->rq);
	return ret == -EINVAL ? -ENXIO : ret;
}

int socks5_start(struct outbound_conn *c, const struct ts_outbound *ob,
		 const struct flow_key *key, uint32_t timeout_ms)
{
	struct sockaddr_storage ss;
	struct timeval tv = conn_timeval(timeout_ms);
	socklen_t len = 0;
	int ret, cerr;

	if (!ob->has_server)
		return -EINVAL;
	if ((ret = prepare(c, ob, key)) != 0)
		return ret;
	if (!ob->server.is_addr && !ob->server.pinned) {
		if ((ret = start_by_name(c, ob)) != 0)
			return ret;
		return event_add(c->timer, &tv) != 0 ? -EIO : 0;
	}
	if ((ret = server_sockaddr(&ob->server, &ss, &len)) != 0)
		return ret;
	if ((ret = conn_connect(c, ob, (const struct sockaddr *)&ss, len, &cerr)) != 0)
		return ret;
	c->io = event_new(c->base, c->fd, EV_WRITE, on_io, c);
	if (!c->io)
		return -ENOMEM;
	if (cerr != 0)
		return conn_defer(c, cerr);
	if (event_add(c->timer, &tv) != 0 || event_add(c->io, NULL) != 0)
		return -EIO;
	c->s5->io_flags = EV_WRITE;
	return 0;
}
