/* test_udp_socks5.c — dispatch/udp through a SOCKS5 outbound (UDP ASSOCIATE, RFC 1928 section
 * 7) against a scripted SOCKS5 server on loopback: the handshake (with and without RFC 1929
 * authentication), encapsulation both ways, datagrams that wait for the association, the
 * control connection's end, a failed association and its retry, and the relay quirks and
 * malformed headers, each dropped and counted by its own reason.
 *
 * The scripted server runs on the test's libevent base; its parsing of the client's datagram
 * header is written here by hand, independent of outbound/socks5_codec. Destinations named in
 * SOCKS5 headers are loopback addresses and only ever reach the scripted relay.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <event2/event.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "dispatch/udp.h"
#include "core/evmem.h"
#include "failalloc.h"
#include "testutil.h"
#include "udptest.h"

#define MAX_CAPS 32
#define MAX_CONNS 8

struct cap {
	uint8_t buf[2048];
	size_t len;
};

/* How the scripted relay answers. */
enum relay_mode {
	R_ECHO,          /* header (source = the destination asked) + the payload */
	R_OTHER_PORT,    /* the same, from another port of the relay's address */
	R_FRAG,          /* FRAG 1 */
	R_RSV,           /* RSV 0x0100 */
	R_ATYP,          /* ATYP 9 */
	R_TRUNC,         /* an IPv4 header cut after its address */
	R_NAME,          /* ATYP 3 "example.test" as the source */
	R_FAMILY,        /* an IPv6 source (::1) whatever was asked */
	R_FOREIGN,       /* the echo, sent from 127.0.0.3 (neither relay nor server) */
	R_DNS,           /* a DNS answer: the query with QR set */
	R_DNS_OTHER,     /* the same, its SOCKS5 source 127.0.0.77 (not the upstream asked) */
};

/* How the scripted server fills BND in its ASSOCIATE reply. */
enum bnd_mode {
	BND_EXACT,
	BND_ZERO,
	BND_LOOP_OTHER,
	BND_MAPPED_EXACT, /* ATYP 4 ::ffff:127.0.0.1, as a dual-stack server prints its socket */
	BND_MAPPED_ZERO,  /* ATYP 4 ::ffff:0.0.0.0 */
};

struct s5conn {
	struct s5srv *srv;
	int fd;
	struct event *ev;
	uint8_t in[600];
	size_t in_len;
	int stage;                     /* 0 greeting, 1 auth, 2 request, 3 associated */
	int ufd;                       /* the relay socket */
	struct event *uev;
};

struct s5srv {
	struct event_base *base;
	int lfd;
	uint16_t port;
	struct event *lev;
	struct s5conn conns[MAX_CONNS];
	int nconns;
	const char *user, *pass;       /* NULL: no authentication */
	enum bnd_mode bnd;
	enum relay_mode mode;
	int other_fd;                  /* R_OTHER_PORT: replies from here */
	int foreign_fd;                /* R_FOREIGN: bound to 127.0.0.3 */
	int datagrams;                 /* datagrams the relay received */
	uint8_t last_atyp;
	uint8_t last_dst[16];
	uint16_t last_port;
	char last_name[256];           /* ATYP 3: the name asked */
	bool auth_failed;
};

struct env {
	struct event_base *base;
	struct ts_config cfg;
	struct budget *b;
	struct udp_path *up;
	struct cap caps[MAX_CAPS];
	int ncap;
	struct s5srv srv;
};

/* ---- the scripted SOCKS5 server ----------------------------------------------------------- */

static int udp_socket_on(const char *addr, uint16_t *port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	socklen_t len = sizeof(sin);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	cr_assert_geq(fd, 0);
	cr_assert_eq(inet_pton(AF_INET, addr, &sin.sin_addr), 1);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0, "bind %s", addr);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
	if (port)
		*port = ntohs(sin.sin_port);
	return fd;
}

/* A datagram from the proxy: parse the header by hand, answer as the mode says. */
static void relay_cb(evutil_socket_t fd, short what, void *arg)
{
	struct s5conn *c = arg;
	struct s5srv *s = c->srv;
	uint8_t buf[2100], out[2200];
	struct sockaddr_storage peer;
	socklen_t plen = sizeof(peer);
	ssize_t n = recvfrom(fd, buf, sizeof(buf), 0, (struct sockaddr *)&peer, &plen);
	size_t alen, hl, o = 0;
	int send_fd = fd;

	if (n < 10)
		return;
	s->datagrams++;
	cr_assert_eq(buf[0] | buf[1] | buf[2], 0, "RSV and FRAG from the proxy are 0");
	s->last_atyp = buf[3];
	cr_assert(buf[3] == 1 || buf[3] == 3 || buf[3] == 4, "ATYP %u", buf[3]);
	memset(s->last_dst, 0, 16);
	if (buf[3] == 3) {
		/* The name is echoed as the answer's source: alen covers its length octet. */
		alen = 1u + buf[4];
		memcpy(s->last_name, buf + 5, buf[4]);
		s->last_name[buf[4]] = 0;
	} else {
		alen = buf[3] == 1 ? 4 : 16;
		memcpy(s->last_dst, buf + 4, alen);
	}
	hl = 4 + alen + 2;
	cr_assert_geq((size_t)n, hl);
	s->last_port = (uint16_t)(buf[4 + alen] << 8 | buf[5 + alen]);
	memcpy(out, buf, hl); /* the source of the answer is the destination asked */
	o = hl;
	switch (s->mode) {
	case R_FRAG: out[2] = 1; break;
	case R_RSV: out[0] = 1; break;
	case R_ATYP: out[3] = 9; break;
	case R_TRUNC: o = 4 + alen; break;
	case R_NAME:
		out[3] = 3;
		out[4] = 12;
		memcpy(out + 5, "example.test", 12);
		out[17] = buf[4 + alen];
		out[18] = buf[5 + alen];
		o = 19;
		break;
	case R_FAMILY:
		out[3] = 4;
		memset(out + 4, 0, 16);
		out[19] = 1;
		out[20] = buf[4 + alen];
		out[21] = buf[5 + alen];
		o = 22;
		break;
	case R_OTHER_PORT: send_fd = s->other_fd; break;
	case R_FOREIGN: send_fd = s->foreign_fd; break;
	case R_DNS_OTHER:
		cr_assert_eq(out[3], 1, "an IPv4 upstream");
		out[7] = 77;
		break;
	default: break;
	}
	if (s->mode != R_TRUNC) {
		memcpy(out + o, buf + hl, (size_t)n - hl);
		if (s->mode == R_DNS || s->mode == R_DNS_OTHER)
			out[o + 2] |= 0x80;
		o += (size_t)n - hl;
	}
	cr_assert_eq(sendto(send_fd, out, o, 0, (struct sockaddr *)&peer, plen), (ssize_t)o);
}

static void ctl_send(struct s5conn *c, const void *p, size_t n)
{
	cr_assert_eq(send(c->fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void conn_drop(struct s5conn *c)
{
	if (c->ev) {
		event_free(c->ev);
		c->ev = NULL;
	}
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}

/* Consume one message if whole: 1, or 0 to wait. */
static int ctl_step(struct s5conn *c)
{
	struct s5srv *s = c->srv;
	uint8_t r[10] = { 5, 0, 0, 1 };
	uint16_t uport;

	if (c->stage == 0) {
		if (c->in_len < 2 || c->in_len < 2u + c->in[1])
			return 0;
		c->in_len -= 2u + c->in[1];
		memmove(c->in, c->in + 2 + c->in[1] - 0, c->in_len);
		uint8_t m[2] = { 5, s->user ? 2 : 0 };
		ctl_send(c, m, 2);
		c->stage = s->user ? 1 : 2;
		return 1;
	}
	if (c->stage == 1) {
		size_t ul, pl;
		if (c->in_len < 2 || c->in_len < 3u + c->in[1])
			return 0;
		ul = c->in[1];
		pl = c->in[2 + ul];
		if (c->in_len < 3 + ul + pl)
			return 0;
		bool good = ul == strlen(s->user) && !memcmp(c->in + 2, s->user, ul) &&
			    pl == strlen(s->pass) && !memcmp(c->in + 3 + ul, s->pass, pl);
		uint8_t st[2] = { 1, good ? 0 : 1 };
		ctl_send(c, st, 2);
		c->in_len = 0;
		if (!good) {
			s->auth_failed = true;
			conn_drop(c);
			return 0;
		}
		c->stage = 2;
		return 1;
	}
	if (c->stage == 2) {
		if (c->in_len < 10)
			return 0;
		cr_assert_eq(c->in[1], 3, "UDP ASSOCIATE");
		cr_assert_eq(c->in[3], 1, "DST ATYP 1");
		c->in_len = 0;
		c->ufd = udp_socket_on("127.0.0.1", &uport);
		failalloc_hold(true); /* the scripted server, not the code under test */
		c->uev = event_new(s->base, c->ufd, EV_READ | EV_PERSIST, relay_cb, c);
		cr_assert_eq(event_add(c->uev, NULL), 0);
		failalloc_hold(false);
		if (s->bnd == BND_MAPPED_EXACT || s->bnd == BND_MAPPED_ZERO) {
			uint8_t r6[22] = { 5, 0, 0, 4, [14] = 0xff, [15] = 0xff };

			if (s->bnd == BND_MAPPED_EXACT)
				r6[16] = 127, r6[19] = 1;
			r6[20] = (uint8_t)(uport >> 8);
			r6[21] = (uint8_t)uport;
			ctl_send(c, r6, sizeof(r6));
			c->stage = 3;
			return 1;
		}
		if (s->bnd == BND_EXACT) {
			r[4] = 127, r[7] = 1;
		} else if (s->bnd == BND_LOOP_OTHER) {
			r[4] = 127, r[5] = 9, r[7] = 9; /* 127.9.0.9: loopback, not the relay */
		}
		r[8] = (uint8_t)(uport >> 8);
		r[9] = (uint8_t)uport;
		ctl_send(c, r, sizeof(r));
		c->stage = 3;
		return 1;
	}
	return 0;
}

static void ctl_cb(evutil_socket_t fd, short what, void *arg)
{
	struct s5conn *c = arg;
	ssize_t n = recv(fd, c->in + c->in_len, sizeof(c->in) - c->in_len, 0);

	if (n <= 0) {
		conn_drop(c);
		return;
	}
	c->in_len += (size_t)n;
	while (c->fd >= 0 && ctl_step(c))
		;
}

static void accept_cb(evutil_socket_t fd, short what, void *arg)
{
	struct s5srv *s = arg;
	int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	struct s5conn *c;

	if (cfd < 0)
		return;
	cr_assert_lt(s->nconns, MAX_CONNS);
	c = &s->conns[s->nconns++];
	memset(c, 0, sizeof(*c));
	c->srv = s;
	c->fd = cfd;
	c->ufd = -1;
	failalloc_hold(true); /* the scripted server, not the code under test */
	c->ev = event_new(s->base, cfd, EV_READ | EV_PERSIST, ctl_cb, c);
	cr_assert_eq(event_add(c->ev, NULL), 0);
	failalloc_hold(false);
}

static void srv_open(struct s5srv *s, struct event_base *base)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sin);

	memset(s, 0, sizeof(*s));
	s->base = base;
	s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(s->lfd, 0);
	cr_assert_eq(bind(s->lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	cr_assert_eq(listen(s->lfd, 16), 0);
	cr_assert_eq(getsockname(s->lfd, (struct sockaddr *)&sin, &len), 0);
	s->port = ntohs(sin.sin_port);
	failalloc_hold(true); /* the scripted server, not the code under test */
	s->lev = event_new(base, s->lfd, EV_READ | EV_PERSIST, accept_cb, s);
	cr_assert_eq(event_add(s->lev, NULL), 0);
	failalloc_hold(false);
	s->other_fd = udp_socket_on("127.0.0.1", NULL);
	s->foreign_fd = udp_socket_on("127.0.0.3", NULL);
}

static void srv_close(struct s5srv *s)
{
	for (int i = 0; i < s->nconns; i++) {
		conn_drop(&s->conns[i]);
		if (s->conns[i].uev)
			event_free(s->conns[i].uev);
		if (s->conns[i].ufd >= 0)
			close(s->conns[i].ufd);
	}
	event_free(s->lev);
	close(s->lfd);
	close(s->other_fd);
	close(s->foreign_fd);
}

/* ---- the path under test ------------------------------------------------------------------ */

static int fake_tx(void *arg, const uint8_t *pkt, size_t len)
{
	struct env *e = arg;

	cr_assert_lt(e->ncap, MAX_CAPS);
	cr_assert_leq(len, sizeof(e->caps[0].buf));
	memcpy(e->caps[e->ncap].buf, pkt, len);
	e->caps[e->ncap].len = len;
	e->ncap++;
	return 0;
}

/* The scripted server, then the path with a socks5 outbound to it as `final` (extra: more
 * JSON members of that outbound, e.g. credentials). */
static void env_start(struct env *e, const char *extra, const char *more_cfg)
{
	char json[2048], err[TS_ERRLEN];

	memset(e, 0, sizeof(*e));
	e->base = event_base_new();
	cr_assert_not_null(e->base);
	srv_open(&e->srv, e->base);
	snprintf(json, sizeof(json),
		 "{\"outbounds\":[{\"tag\":\"proxy\",\"type\":\"socks5\","
		 "\"server\":\"127.0.0.1:%u\"%s}]%s}",
		 e->srv.port, extra ? extra : "", more_cfg ? more_cfg : "");
	cr_assert_eq(config_load_string(json, &e->cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(budget_new(&e->cfg.budget, &e->b), 0);
	cr_assert_eq(udp_path_new(e->base, &e->cfg, e->b, fake_tx, e, &e->up), 0);
	cr_assert_eq(udp_path_set_uptrains(e->up, true), 0); /* as the proxy runs it */
}

static uint32_t fds_in_use(struct env *e)
{
	struct budget_stats bs;

	budget_get_stats(e->b, &bs);
	return bs.fds_in_use;
}

static void env_fini(struct env *e)
{
	ut_path_free_checked(e->up, e->b);
	srv_close(&e->srv);
	budget_free(e->b);
	config_fini(&e->cfg);
	event_base_free(e->base);
}

static struct udp_path_stats stats(struct env *e)
{
	return ut_stats(e->up);
}

static void no_drops(struct env *e)
{
	struct udp_path_stats st = stats(e);

	for (int i = 0; i < UDP_DROP_MAX; i++)
		cr_assert_eq(st.drops[i], 0, "drop %s", udp_drop_name((enum udp_drop)i));
}

#define PUMP_UNTIL(e, cond, timeout_ms) UT_PUMP_UNTIL((e)->base, cond, timeout_ms)

static void pump_for(struct env *e, int ms)
{
	ut_pump_for(e->base, ms);
}

static void tun_send(struct env *e, const char *src, uint16_t sport, const char *dst,
		     uint16_t dport, const void *payload, size_t len)
{
	ut_tun_send(e->up, src, sport, dst, dport, payload, len);
}

static void check_reply(const struct cap *c, const char *src, uint16_t sport, const char *dst,
			uint16_t dport, const void *payload, size_t plen)
{
	ut_check_reply(c->buf, c->len, src, sport, dst, dport, payload, plen);
}

/* ---- tests -------------------------------------------------------------------------------- */

Test(udp_socks5, echo_both_families_through_one_association_each)
{
	struct env e;
	const char m4[] = "over SOCKS5 UDP, v4", m6[] = "over SOCKS5 UDP, v6";

	env_start(&e, NULL, NULL);
	tun_send(&e, "10.0.0.9", 5353, "127.0.0.2", 7, m4, sizeof(m4));
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000), "no v4 reply");
	check_reply(&e.caps[0], "127.0.0.2", 7, "10.0.0.9", 5353, m4, sizeof(m4));
	cr_assert_eq(e.srv.last_atyp, 1);
	cr_assert_eq(e.srv.last_port, 7);
	/* The same session to an IPv6 destination would need a v6 client; a v6 client is its
	 * own session and association. */
	tun_send(&e, "fd00::9", 5353, "::1", 9, m6, sizeof(m6));
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 2000), "no v6 reply");
	check_reply(&e.caps[1], "::1", 9, "fd00::9", 5353, m6, sizeof(m6));
	cr_assert_eq(e.srv.last_atyp, 4, "an IPv6 destination is ATYP 4");

	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.sessions, 2);
	cr_assert_eq(st.assocs, 2);
	cr_assert_eq(st.assocs_total, 2);
	cr_assert_eq(e.srv.nconns, 2, "one control connection per session");
	cr_assert_eq(fds_in_use(&e), 4, "two descriptors per association");
	cr_assert_eq(st.up_datagrams, 2);
	cr_assert_eq(st.down_datagrams, 2);
	no_drops(&e);
	env_fini(&e);
}

Test(udp_socks5, datagrams_wait_for_the_association_in_order)
{
	struct env e;
	char m[8][8];

	env_start(&e, NULL, NULL);
	for (int i = 0; i < 8; i++) {
		memcpy(m[i], "dg 0...", 8);
		m[i][3] = (char)('0' + i);
		tun_send(&e, "10.0.0.9", 4000, "127.0.0.2", (uint16_t)(100 + i), m[i], 8);
	}
	cr_assert_eq(stats(&e).up_queued, 8, "all wait for the handshake");
	cr_assert(PUMP_UNTIL(&e, e.ncap == 8, 2000), "got %d", e.ncap);
	for (int i = 0; i < 8; i++)
		check_reply(&e.caps[i], "127.0.0.2", (uint16_t)(100 + i), "10.0.0.9", 4000, m[i], 8);
	cr_assert_eq(e.srv.nconns, 1, "one session, one association, many destinations");
	cr_assert_eq(stats(&e).up_queued, 0);
	no_drops(&e);
	env_fini(&e);
}

Test(udp_socks5, credentials_are_sent_and_a_refusal_fails_then_retries)
{
	struct env e;

	env_start(&e, ",\"username\":\"alice\",\"password\":\"wrong\"", NULL);
	e.srv.user = "alice";
	e.srv.pass = "secret";
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "a", 1);
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "b", 1);
	cr_assert(PUMP_UNTIL(&e, stats(&e).assoc_failures == 1, 2000));
	cr_assert(e.srv.auth_failed);
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_assoc_failed], 2, "both waiting datagrams");
	cr_assert_eq(st.up_queued, 0);
	/* Within the retry wait: dropped, no new connection. */
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "c", 1);
	cr_assert_eq(stats(&e).drops[UDP_DROP_assoc_failed], 3);
	pump_for(&e, 50);
	cr_assert_eq(e.srv.nconns, 1, "no attempt before the retry time");
	/* After it: a new attempt (which fails again). */
	pump_for(&e, UDP_ASSOC_RETRY_MS);
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "d", 1);
	cr_assert(PUMP_UNTIL(&e, stats(&e).assoc_failures == 2, 2000));
	cr_assert_eq(e.srv.nconns, 2);
	cr_assert_eq(e.ncap, 0);
	env_fini(&e);
}

Test(udp_socks5, right_credentials_carry_the_datagrams)
{
	struct env e;

	env_start(&e, ",\"username\":\"alice\",\"password\":\"secret\"", NULL);
	e.srv.user = "alice";
	e.srv.pass = "secret";
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "hello", 5);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000));
	check_reply(&e.caps[0], "127.0.0.2", 7, "10.0.0.9", 5000, "hello", 5);
	cr_assert_not(e.srv.auth_failed);
	no_drops(&e);
	env_fini(&e);
}

Test(udp_socks5, the_control_connection_closing_ends_the_session)
{
	struct env e;

	env_start(&e, NULL, NULL);
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "x", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000));
	cr_assert_eq(fds_in_use(&e), 2);
	conn_drop(&e.srv.conns[0]);
	cr_assert(PUMP_UNTIL(&e, stats(&e).sessions == 0, 2000), "the session outlived its control");
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.assoc_control_closed, 1);
	cr_assert_eq(st.assocs, 0);
	cr_assert_eq(st.sockets, 0);
	cr_assert_eq(fds_in_use(&e), 0, "both descriptors back in the budget");
	/* The client sends again: a new session and a new association. */
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "y", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 2000));
	cr_assert_eq(e.srv.nconns, 2);
	env_fini(&e);
}

Test(udp_socks5, bnd_quirks_and_replies_from_another_port_work)
{
	/* The IPv4-mapped forms: the IPv4 address they carry (the path's IPv6 sockets are
	 * IPv6-only, so a mapped relay taken as IPv6 could never be reached). */
	static const enum bnd_mode bnds[] = { BND_ZERO, BND_LOOP_OTHER, BND_EXACT,
					      BND_MAPPED_EXACT, BND_MAPPED_ZERO };

	for (size_t i = 0; i < sizeof(bnds) / sizeof(bnds[0]); i++) {
		struct env e;

		env_start(&e, NULL, NULL);
		e.srv.bnd = bnds[i];
		e.srv.mode = i == 2 ? R_OTHER_PORT : R_ECHO;
		tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "q", 1);
		/* BND_LOOP_OTHER: the server itself is on loopback, so its loopback BND
		 * 127.9.0.9 is kept (another address of 127/8): nothing listens there. */
		if (bnds[i] == BND_LOOP_OTHER) {
			pump_for(&e, 100);
			cr_assert_eq(e.srv.datagrams, 0);
		} else {
			cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000), "case %zu", i);
			check_reply(&e.caps[0], "127.0.0.2", 7, "10.0.0.9", 5000, "q", 1);
			no_drops(&e);
		}
		env_fini(&e);
	}
}

Test(udp_socks5, malformed_replies_are_dropped_by_reason)
{
	static const struct {
		enum relay_mode mode;
		enum udp_drop reason;
	} cases[] = {
		{ R_FRAG, UDP_DROP_s5_frag },       { R_RSV, UDP_DROP_s5_rsv },
		{ R_ATYP, UDP_DROP_s5_atyp },       { R_TRUNC, UDP_DROP_s5_truncated },
		{ R_NAME, UDP_DROP_s5_unknown_name }, { R_FAMILY, UDP_DROP_s5_family },
		{ R_FOREIGN, UDP_DROP_s5_foreign },
	};
	struct env e;

	env_start(&e, NULL, NULL);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		e.srv.mode = cases[i].mode;
		tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "bad", 3);
		cr_assert(PUMP_UNTIL(&e, stats(&e).drops[cases[i].reason] == 1, 2000),
			  "case %zu: %s", i, udp_drop_name(cases[i].reason));
	}
	struct udp_path_stats st = stats(&e);
	uint64_t all = 0;
	for (int i = 0; i < UDP_DROP_MAX; i++)
		all += st.drops[i];
	cr_assert_eq(all, sizeof(cases) / sizeof(cases[0]), "one drop each, nothing else");
	cr_assert_eq(e.ncap, 0, "nothing malformed reached the TUN");
	/* Still working: a good answer gets through. */
	e.srv.mode = R_ECHO;
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "good", 4);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000));
	check_reply(&e.caps[0], "127.0.0.2", 7, "10.0.0.9", 5000, "good", 4);
	cr_assert_eq(e.srv.nconns, 1, "one association throughout");
	env_fini(&e);
}

Test(udp_socks5, hijacked_dns_goes_through_the_association)
{
	struct env e;
	uint8_t q[16] = { 0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 'q', 'q', 'q', 0 };
	uint8_t a[16];

	env_start(&e, NULL, ",\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.2:53\"}");
	e.srv.mode = R_DNS;
	tun_send(&e, "10.0.0.9", 6000, "198.18.0.1", 53, q, sizeof(q));
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000));
	cr_assert_eq(e.srv.last_port, 53, "sent to the upstream through the relay");
	memcpy(a, q, sizeof(q));
	a[2] |= 0x80;
	check_reply(&e.caps[0], "198.18.0.1", 53, "10.0.0.9", 6000, a, sizeof(a));
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.dns_answers, 1);
	cr_assert(PUMP_UNTIL(&e, stats(&e).sessions == 0, 500), "a DNS-only session ends with its answer");
	cr_assert_eq(stats(&e).dns_done, 1);
	cr_assert_eq(fds_in_use(&e), 0);
	env_fini(&e);
}

/* Through an association the kernel no longer lets only the upstream answer (a relay passes
 * on what any host sends to its port): a hijacked query's answer must come from the upstream
 * asked, and be an answer (QR set). Neither a datagram from another source with the query's
 * id, nor the query echoed back, reaches the client. */
Test(udp_socks5, hijacked_dns_answers_only_from_the_upstream)
{
	enum relay_mode modes[2] = { R_DNS_OTHER, R_ECHO };
	struct env e;
	uint8_t q[16] = { 0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 'q', 'q', 'q', 0 };

	for (int i = 0; i < 2; i++) {
		env_start(&e, NULL, ",\"dns\":{\"hijack\":true,\"upstream\":\"127.0.0.2:53\"}");
		e.srv.mode = modes[i];
		tun_send(&e, "10.0.0.9", 6000, "198.18.0.1", 53, q, sizeof(q));
		cr_assert(PUMP_UNTIL(&e, stats(&e).drops[UDP_DROP_dns_unmatched] == 1, 2000),
			  "mode %d: %d delivered", i, e.ncap);
		pump_for(&e, 50);
		cr_assert_eq(e.ncap, 0, "mode %d: nothing delivered", i);
		cr_assert_eq(stats(&e).dns_answers, 0);
		env_fini(&e);
	}
}

Test(udp_socks5, an_unreachable_server_fails_promptly)
{
	struct env e;
	int fd;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sin);
	char json[512], err[TS_ERRLEN];

	env_start(&e, NULL, NULL);
	/* A port nothing listens on: bound, closed. */
	fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
	close(fd);
	udp_path_free(e.up);
	config_fini(&e.cfg);
	snprintf(json, sizeof(json),
		 "{\"outbounds\":[{\"tag\":\"proxy\",\"type\":\"socks5\",\"server\":\"127.0.0.1:%u\"}]}",
		 ntohs(sin.sin_port));
	cr_assert_eq(config_load_string(json, &e.cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(udp_path_new(e.base, &e.cfg, e.b, fake_tx, &e, &e.up), 0);
	cr_assert_eq(udp_path_set_uptrains(e.up, true), 0); /* as the proxy runs it */
	int64_t t0 = ts_now_ns();
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "x", 1);
	cr_assert(PUMP_UNTIL(&e, stats(&e).assoc_failures == 1, 2000));
	cr_assert_lt(ts_now_ns() - t0, MS(1000), "refused at once, not at the timeout");
	cr_assert_eq(stats(&e).drops[UDP_DROP_assoc_failed], 1);
	env_fini(&e);
}

/* The test's namer: 127.0.0.2:7 is "svc.example.test", 127.0.0.2:8 a name no proxy may get. */
static const char *namer(void *arg, int family, const uint8_t *dst, uint16_t dport)
{
	int *calls = arg;
	static const uint8_t lo2[4] = { 127, 0, 0, 2 };

	(*calls)++;
	if (family != 4 || memcmp(dst, lo2, 4) != 0)
		return NULL;
	return dport == 7 ? "svc.example.test" : dport == 8 ? "bad name\r\n" : NULL;
}

Test(udp_socks5, named_destinations_go_as_atyp3_and_replies_come_back_from_the_address)
{
	struct env e;
	int calls = 0;

	env_start(&e, NULL, NULL);
	udp_path_set_namer(e.up, namer, &calls);
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "one", 3);
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "two", 3);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 2000), "got %d", e.ncap);
	cr_assert_eq(e.srv.last_atyp, 3, "a named destination is ATYP 3");
	cr_assert_str_eq(e.srv.last_name, "svc.example.test");
	cr_assert_eq(e.srv.last_port, 7);
	/* The relay answered from the name: the client sees the address it sent to. */
	check_reply(&e.caps[0], "127.0.0.2", 7, "10.0.0.9", 5000, "one", 3);
	check_reply(&e.caps[1], "127.0.0.2", 7, "10.0.0.9", 5000, "two", 3);
	cr_assert_eq(calls, 1, "consecutive datagrams to one place ask the namer once");
	/* No name: by address, same association. */
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.4", 9, "three", 5);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 3, 2000));
	cr_assert_eq(e.srv.last_atyp, 1);
	check_reply(&e.caps[2], "127.0.0.4", 9, "10.0.0.9", 5000, "three", 5);
	/* A name that could change a request's meaning is refused. */
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 8, "four", 4);
	cr_assert_eq(stats(&e).drops[UDP_DROP_bad_name], 1);
	pump_for(&e, 50);
	cr_assert_eq(e.ncap, 3);
	cr_assert_eq(e.srv.nconns, 1);
	env_fini(&e);
}

/* Refuses every control connection's socket while *arg is true (as an embedder's socket
 * hook may, or as socket() does at the descriptor limit); counts the attempts. */
static bool hook_refuse;
static int hook_stream_calls;

static int refusing_hook(void *arg, int fd, int family, int type)
{
	(void)arg;
	(void)fd;
	(void)family;
	if (type != SOCK_STREAM)
		return 0;
	hook_stream_calls++;
	return hook_refuse ? -EMFILE : 0;
}

Test(udp_socks5, an_attempt_refused_on_the_spot_waits_for_the_retry_like_a_failed_one)
{
	struct env e;

	env_start(&e, NULL, NULL);
	udp_path_free(e.up);
	e.cfg.outbounds[0].sock_hook.fn = refusing_hook;
	cr_assert_eq(udp_path_new(e.base, &e.cfg, e.b, fake_tx, &e, &e.up), 0);
	cr_assert_eq(udp_path_set_uptrains(e.up, true), 0);
	hook_refuse = true;
	hook_stream_calls = 0;
	/* The first attempt is refused at once: one attempt for all of these. */
	for (int i = 0; i < 20; i++)
		tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "x", 1);
	cr_assert_eq(hook_stream_calls, 1, "%d attempts", hook_stream_calls);
	cr_assert_eq(stats(&e).assoc_failures, 1);
	cr_assert_eq(stats(&e).drops[UDP_DROP_assoc_failed], 20);
	cr_assert_eq(stats(&e).drops[UDP_DROP_socket_error], 0);
	cr_assert_eq(stats(&e).sessions, 1, "the session keeps its failed association");
	cr_assert_eq(fds_in_use(&e), 2, "which holds its two descriptors, as a failed handshake's");
	/* The retry, refused at once too: again one attempt, then nothing until the next. */
	pump_for(&e, UDP_ASSOC_RETRY_MS + 100);
	for (int i = 0; i < 20; i++)
		tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "y", 1);
	cr_assert_eq(hook_stream_calls, 2, "%d attempts", hook_stream_calls);
	cr_assert_eq(stats(&e).assoc_failures, 2);
	cr_assert_eq(stats(&e).drops[UDP_DROP_assoc_failed], 40);
	/* Allowed again: the next retry carries the datagrams. */
	hook_refuse = false;
	pump_for(&e, UDP_ASSOC_RETRY_MS + 100);
	tun_send(&e, "10.0.0.9", 5000, "127.0.0.2", 7, "ok", 2);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 2000));
	check_reply(&e.caps[0], "127.0.0.2", 7, "10.0.0.9", 5000, "ok", 2);
	cr_assert_eq(hook_stream_calls, 3);
	cr_assert_eq(e.srv.nconns, 1);
	env_fini(&e);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* One datagram: echoed or counted as a drop, within the bound. */
static void nomem_send(struct env *e, const char *src, uint16_t sport, const char *dst,
		       uint16_t dport, bool sweep)
{
	uint64_t before = ut_drops_total(e->up);
	int got = e->ncap;

	tun_send(e, src, sport, dst, dport, "z", 1);
	cr_assert(PUMP_UNTIL(e, e->ncap > got || ut_drops_total(e->up) > before, 3000),
		  "%s -> %s: neither echoed nor counted as a drop", src, dst);
	cr_assert(sweep || e->ncap == got + 1, "%s -> %s: dropped", src, dst);
}

/* The path's life through an authenticating server: a v4 and a v6 session, each with its
 * association; the first's control connection closed by the server, and the client sending
 * again (a new association). Every descriptor, session and byte comes back at the free. */
static void nomem_scenario(void *arg, bool sweep)
{
	struct env *e = arg;
	char json[1024], err[TS_ERRLEN];
	int rc;

	memset(e, 0, sizeof(*e));
	failalloc_hold(true);
	cr_assert_not_null(e->base = event_base_new());
	failalloc_hold(false);
	srv_open(&e->srv, e->base);
	e->srv.user = "u";
	e->srv.pass = "p";
	snprintf(json, sizeof(json),
		 "{\"outbounds\":[{\"tag\":\"proxy\",\"type\":\"socks5\","
		 "\"server\":\"127.0.0.1:%u\",\"username\":\"u\",\"password\":\"p\"}]}",
		 e->srv.port);
	if ((rc = config_load_string(json, &e->cfg, err, sizeof(err))) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "%s", err);
		goto out;
	}
	if ((rc = budget_new(&e->cfg.budget, &e->b)) != 0) {
		cr_assert(sweep && rc == -ENOMEM);
		goto out;
	}
	if ((rc = udp_path_new(e->base, &e->cfg, e->b, fake_tx, e, &e->up)) != 0) {
		cr_assert(sweep && (rc == -ENOMEM || rc == -ENOBUFS), "udp_path_new: %d", rc);
		goto out;
	}
	rc = udp_path_set_uptrains(e->up, true);
	cr_assert(rc == 0 || (sweep && (rc == -ENOMEM || rc == -ENOBUFS)), "uptrains %d", rc);
	nomem_send(e, "10.0.0.9", 5000, "127.0.0.2", 7, sweep);
	nomem_send(e, "fd00::9", 5353, "::1", 9, sweep);
	if (e->srv.nconns > 0) {
		uint32_t sessions = stats(e).sessions;

		conn_drop(&e->srv.conns[0]);
		cr_assert(PUMP_UNTIL(e, stats(e).sessions < sessions, 2000) ||
			  (sweep && e->ncap < 2), "the session outlived its control");
	}
	nomem_send(e, "10.0.0.9", 5000, "127.0.0.2", 7, sweep);
	ut_path_free_checked(e->up, e->b);
out:
	srv_close(&e->srv);
	budget_free(e->b);
	config_fini(&e->cfg);
	event_base_free(e->base);
}

Test(udp_socks5, each_allocation_refused_in_turn)
{
	struct env e;

	/* libevent allocates through the project's allocator, as twinstack runs it. */
	cr_assert_eq(evmem_install(), 0);

	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, &e, 10,
								      2000));
}
