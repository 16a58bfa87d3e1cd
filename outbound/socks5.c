/* socks5.c — the SOCKS5 outbound on libevent: TCP connect to the server from a marked/bound
 * socket, then the handshake of socks5_codec (greeting, optional RFC 1929 authentication,
 * CONNECT to the flow's original destination as ATYP 1 or 4, or to the session's name as
 * ATYP 3). The same handshake with UDP ASSOCIATE (outbound_udp_associate) sets up the control
 * connection of a UDP association; the datagrams themselves are the UDP path's.
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
#include <unistd.h>

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
	/* UDP ASSOCIATE: the caller's callback (the attempt's own done is assoc_finish). */
	outbound_assoc_fn assoc_done;
	void *assoc_arg;
};

void socks5_state_free(struct socks5_conn *s)
{
	if (!s)
		return;
	server_link_fini(&s->link);
	free(s);
}

/* The handshake's step (server_link.h): feed buffered bytes to the codec, one message at a
 * time, sending each request before the next reply is looked at. 1 when the handshake is
 * complete (what is left in `in` is the stream's: *early 0), 0 to wait for the socket, -errno
 * on failure. */
static int advance(struct outbound_conn *c, size_t *early)
{
	struct socks5_conn *s = c->s5;
	size_t out_len;
	int n;

	for (;;) {
		if ((n = server_link_flush(c)) < 0)
			return n;
		if (s->link.out_off < s->link.out_len)
			return 0;
		if (s->cl.state == SOCKS5_CL_DONE) {
			*early = 0;
			return 1;
		}
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

/* The attempt's SOCKS5 state with cmd to dst as its request, the greeting queued. */
static int handshake_new(struct outbound_conn *c, const struct ts_outbound *ob, uint8_t cmd,
			 const struct socks5_addr *dst)
{
	int ret;

	if (!(c->s5 = calloc(1, sizeof(*c->s5))))
		return -ENOMEM;
	c->s5->link.out = c->s5->out;
	c->s5->link.in = c->s5->in;
	c->s5->link.in_cap = sizeof(c->s5->in);
	ret = socks5_client_start_cmd(&c->s5->cl, cmd, dst, ob->has_auth ? ob->username : NULL,
				      ob->has_auth ? ob->password : NULL, c->s5->out,
				      sizeof(c->s5->out));
	if (ret < 0)
		return ret;
	c->s5->link.out_len = (size_t)ret;
	return 0;
}

/* CONNECT to name (ATYP 3, the server resolves it) or without one to the flow's original
 * destination (ATYP 1 or 4). */
static int prepare(struct outbound_conn *c, const struct ts_outbound *ob,
		   const struct flow_key *key, const char *name)
{
	struct socks5_addr dst;
	int ret;

	if (name)
		ret = socks5_addr_domain(&dst, name, strlen(name), ntohs(key->dport_be));
	else
		ret = socks5_addr_ip(&dst, key->family, key->dst, ntohs(key->dport_be));
	if (ret != 0)
		return ret;
	return handshake_new(c, ob, SOCKS5_CMD_CONNECT, &dst);
}

int socks5_start(struct outbound_conn *c, const struct ts_outbound *ob,
		 const struct flow_key *key, const char *name, uint32_t timeout_ms)
{
	int ret;

	if (!ob->has_server)
		return -EINVAL;
	if ((ret = prepare(c, ob, key, name)) != 0)
		return ret;
	return server_link_start(c, &c->s5->link, ob, advance, timeout_ms);
}

/* ---- UDP ASSOCIATE ------------------------------------------------------------------------ */

/* The relay endpoint from the reply's BND and the server the control connection reached. */
static int assoc_relay(int fd, const struct socks5_addr *bnd, struct outbound_assoc *a)
{
	struct socks5_addr server, relay, b = *bnd;
	uint8_t addr[16];
	uint16_t port_be;
	int family, ret;

	a->server_len = sizeof(a->server);
	if (getpeername(fd, (struct sockaddr *)&a->server, &a->server_len) != 0)
		return -errno;
	family = netaddr_from_sockaddr(&a->server, addr, &port_be);
	if (family != 4 && family != 6)
		return -EPROTO;
	if ((ret = socks5_addr_ip(&server, family, addr, ntohs(port_be))) != 0)
		return ret;
	/* A name: the server's own address (see outbound_udp_associate). */
	if (b.atyp == SOCKS5_ATYP_DOMAIN && b.len > 0)
		(void)socks5_addr_ip(&b, family, addr, bnd->port);
	if ((ret = socks5_udp_relay_endpoint(&b, &server, &relay)) != 0)
		return ret;
	a->relay_len = (socklen_t)netaddr_sockaddr(relay.atyp == SOCKS5_ATYP_IPV4 ? 4 : 6,
						   relay.a, htons(relay.port), &a->relay);
	return a->relay_len ? 0 : -EPROTO;
}

/* The attempt's done (its arg is the attempt itself, alive until this returns). */
static void assoc_finish(void *arg, int err, int fd, const uint8_t *early, size_t early_len)
{
	struct outbound_conn *c = arg;
	struct socks5_conn *s = c->s5;
	struct outbound_assoc a;

	(void)early;
	(void)early_len; /* a server has nothing to say on the control connection */
	if (err == 0 && (err = assoc_relay(fd, &s->cl.bnd, &a)) != 0)
		close(fd);
	if (err != 0) {
		s->assoc_done(s->assoc_arg, err, NULL);
		return;
	}
	a.ctl_fd = fd;
	s->assoc_done(s->assoc_arg, 0, &a);
}

int outbound_udp_associate(struct event_base *base, const struct ts_outbound *ob,
			   uint32_t timeout_ms, outbound_assoc_fn done, void *arg,
			   struct outbound_conn **out)
{
	static const uint8_t any4[4];
	struct socks5_addr src;
	struct outbound_conn *c;
	int ret;

	if (!base || !ob || !done || !out || timeout_ms == 0 || ob->type != TS_OUT_SOCKS5 ||
	    !ob->has_server)
		return -EINVAL;
	if (!(c = conn_new(base, assoc_finish, NULL)))
		return -ENOMEM;
	c->arg = c;
	(void)socks5_addr_ip(&src, 4, any4, 0);
	if ((ret = handshake_new(c, ob, SOCKS5_CMD_UDP_ASSOCIATE, &src)) != 0)
		goto fail;
	c->s5->assoc_done = done;
	c->s5->assoc_arg = arg;
	if ((ret = server_link_start(c, &c->s5->link, ob, advance, timeout_ms)) != 0)
		goto fail;
	*out = c;
	return 0;
fail:
	conn_free(c);
	return ret;
}
