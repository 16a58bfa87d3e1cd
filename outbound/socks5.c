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
#include "outbound/server_link.h"
#include "outbound/socks5.h"
#include "outbound/socks5_codec.h"

/* Room for the longest reply plus early bytes; more early bytes simply stay in the socket. */
#define S5_IN_CAP 1024
/* Requests go out one at a time; the longest is the RFC 1929 one. */
#define S5_OUT_CAP SOCKS5_AUTH_MAX

struct socks5_conn {
	struct socks5_client cl;
	struct server_link link; /* the connection to the server (server_link.h) */
	uint8_t out[S5_OUT_CAP];
	uint8_t in[S5_IN_CAP];
};

void socks5_state_free(struct socks5_conn *s)
{
	if (!s)
		return;
	server_link_fini(&s->link);
	free(s);
}

static void on_io(evutil_socket_t fd, short what, void *arg);

/* Feed buffered bytes to the codec, one message at a time, sending each request before the
 * next reply is looked at. Returns 1 when the handshake is complete, 0 to wait for the
 * socket, -errno on failure. */
static int advance(struct outbound_conn *c)
{
	struct socks5_conn *s = c->s5;
	size_t out_len;
	int n;

	for (;;) {
		if ((n = server_link_flush(c)) < 0)
			return n;
		if (s->link.out_off < s->link.out_len)
			return 0;
		if (s->cl.state == SOCKS5_CL_DONE)
			return 1;
		if (s->link.in_len == 0)
			return 0;
		n = socks5_client_input(&s->cl, s->in, s->link.in_len, s->out, sizeof(s->out),
					&out_len);
		if (n < 0)
			return n;
		if (n == SOCKS5_NEED_MORE)
			return s->link.in_len == sizeof(s->in) ? -EPROTO : 0;
		s->link.in_len -= (size_t)n;
		memmove(s->in, s->in + n, s->link.in_len);
		s->link.out_off = 0;
		s->link.out_len = out_len;
	}
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
	struct outbound_conn *c = arg;
	struct socks5_conn *s = c->s5;
	int ret;

	if (!s->link.connected) {
		s->link.io_flags = 0;  /* the connect wait was one-shot */
		if ((ret = conn_sock_error(c->fd)) != 0)
			goto fail;
		s->link.connected = true;
	}
	if ((what & EV_READ) && (ret = server_link_fill(c)) < 0)
		goto fail;
	if ((ret = advance(c)) < 0)
		goto fail;
	if (ret == 1) {
		conn_finish(c, 0, s->in, s->link.in_len);
		return;
	}
	if (s->link.out_off < s->link.out_len)
		ret = server_link_arm(c, EV_WRITE | EV_PERSIST);
	else
		ret = server_link_arm(c, EV_READ | EV_PERSIST);
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
	c->s5->link.out = c->s5->out;
	c->s5->link.in = c->s5->in;
	c->s5->link.in_cap = sizeof(c->s5->in);
	if ((ret = socks5_addr_ip(&dst, key->family, key->dst, ntohs(key->dport_be))) != 0)
		return ret;
	ret = socks5_client_start(&c->s5->cl, &dst, ob->has_auth ? ob->username : NULL,
				  ob->has_auth ? ob->password : NULL, c->s5->out,
				  sizeof(c->s5->out));
	if (ret < 0)
		return ret;
	c->s5->link.out_len = (size_t)ret;
	return 0;
}

int socks5_start(struct outbound_conn *c, const struct ts_outbound *ob,
		 const struct flow_key *key, uint32_t timeout_ms)
{
	int ret;

	if (!ob->has_server)
		return -EINVAL;
	if ((ret = prepare(c, ob, key)) != 0)
		return ret;
	return server_link_start(c, &c->s5->link, ob, on_io, timeout_ms);
}
