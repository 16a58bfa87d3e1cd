/* test_outbound_name.c — outbound_connect_name (outbound/outbound.h): connecting to a
 * destination given by name, on loopback only (127.0.0.1 and ::1).
 *
 *   test (libevent loop) ──socks5──► recording SOCKS5 server thread   (ATYP 3 + the name)
 *   test (libevent loop) ──http────► recording HTTP proxy thread      (CONNECT name:port)
 *   test (libevent loop) ──direct──► resolver ──UDP──► fake DNS (same loop)
 *                                    └──Happy Eyeballs──► listeners on 127.0.0.1 / ::1
 *
 * The flow's own destination is 203.0.113.7 (TEST-NET-3, RFC 5737): it is never dialled, so a
 * result that reached a listener proves the name was used. Every wait is bounded.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "failalloc.h"
#include "fakedns.h"
#include "outbound/outbound.h"
#include "outbound/resolver.h"
#include "testutil.h"

#define WAIT_MS 3000
#define NAME "www.example.test"

/* ---- helpers ---- */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static socklen_t loop_sa(int family, uint16_t port, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (family == 4) {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		s->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		return sizeof(*s);
	}
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
	s6->sin6_family = AF_INET6;
	s6->sin6_port = htons(port);
	s6->sin6_addr = in6addr_loopback;
	return sizeof(*s6);
}

/* A socket bound to the loopback address of family at port (0: the kernel picks), listening
 * unless listen_too is false (then it only holds the port: connections are refused). -1 if
 * the port is taken. */
static int bind_loopback(int family, uint16_t *port, bool listen_too)
{
	struct sockaddr_storage ss;
	socklen_t len = loop_sa(family, *port, &ss);
	int fd = socket(family == 4 ? AF_INET : AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	cr_assert_geq(fd, 0);
	if (family == 6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, len) != 0) {
		close(fd);
		return -1;
	}
	if (listen_too)
		cr_assert_eq(listen(fd, 8), 0);
	len = sizeof(ss);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
	*port = ntohs(family == 4 ? ((struct sockaddr_in *)&ss)->sin_port
				  : ((struct sockaddr_in6 *)&ss)->sin6_port);
	return fd;
}

/* One port with a socket on 127.0.0.1 and one on ::1 (each listening or only holding it). */
struct pair {
	uint16_t port;
	int fd4, fd6;
};

static void pair_open(struct pair *p, bool listen4, bool listen6)
{
	for (int i = 0; i < 50; i++) {
		p->port = 0;
		p->fd4 = bind_loopback(4, &p->port, listen4);
		cr_assert_geq(p->fd4, 0);
		p->fd6 = bind_loopback(6, &p->port, listen6);
		if (p->fd6 >= 0)
			return;
		close(p->fd4);
	}
	cr_assert_fail("no port free on both 127.0.0.1 and ::1");
}

static void pair_close(struct pair *p)
{
	close(p->fd4);
	close(p->fd6);
}

static void key_named(struct flow_key *k, uint16_t dport)
{
	memset(k, 0, sizeof(*k));
	k->family = 4;
	k->proto = IPPROTO_TCP;
	k->sport_be = htons(40000);
	k->dport_be = htons(dport);
	tu_addr(k->dst, "203.0.113.7");  /* never dialled */
	tu_addr(k->src, "198.18.0.9");
}

static void ob_proxy(struct ts_outbound *ob, enum ts_outbound_type type, uint16_t port)
{
	memset(ob, 0, sizeof(*ob));
	strcpy(ob->tag, "proxy");
	ob->type = type;
	ob->has_server = true;
	ob->server.is_addr = true;
	strcpy(ob->server.host, "127.0.0.1");
	ob->server.addr.family = 4;
	tu_addr(ob->server.addr.a, "127.0.0.1");
	ob->server.port = port;
}

/* ---- running an attempt ---- */

struct result {
	int calls;
	int err;
	int fd;
	int64_t at_ms;
};

static void on_done(void *arg, int err, int fd, const uint8_t *early, size_t early_len)
{
	struct result *r = arg;

	r->calls++;
	r->err = err;
	r->fd = fd;
	r->at_ms = now_ms();
}

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
	*(bool *)arg = true;
}

/* Run base until r has its result, or for ms whatever happens (until_done false). */
static void run(struct event_base *base, struct result *r, int ms, bool until_done)
{
	bool expired = false;
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
	struct event *guard = evtimer_new(base, on_guard, &expired);

	evtimer_add(guard, &tv);
	while (!expired && (!until_done || r->calls == 0))
		event_base_loop(base, EVLOOP_ONCE);
	event_free(guard);
}

/* Start by name, check nothing completed re-entrantly, run to the result (exactly one). */
static void connect_name(struct event_base *base, const struct ts_outbound *ob,
			 const struct flow_key *k, const char *name, uint32_t timeout_ms,
			 struct result *r)
{
	struct outbound_conn *c = NULL;
	int ret;

	memset(r, 0, sizeof(*r));
	r->fd = -2;
	ret = outbound_connect_name(base, ob, k, name, timeout_ms, on_done, r, &c);
	cr_assert_eq(ret, 0, "outbound_connect_name: %s", strerror(-ret));
	cr_assert_eq(r->calls, 0, "done ran inside outbound_connect_name");
	run(base, r, (int)timeout_ms + WAIT_MS, true);
	cr_assert_eq(r->calls, 1, "no result in time");
	cr_assert(r->err ? r->fd == -1 : r->fd >= 0);
	event_base_loop(base, EVLOOP_NONBLOCK);
	cr_assert_eq(r->calls, 1, "done ran twice");
}

/* ---- the recording servers ---- */

enum rec_kind { REC_SOCKS5, REC_HTTP };

struct rec {
	enum rec_kind kind;
	int lfd;
	uint16_t port;
	pthread_t th;
	uint8_t req[1024];  /* socks5: the request after the greeting; http: the request head */
	size_t req_len;
	bool ok;
	char why[128];
};

/* Read exactly n bytes within WAIT_MS. */
static bool rd(int fd, uint8_t *buf, size_t n)
{
	int64_t end = now_ms() + WAIT_MS;
	size_t got = 0;

	while (got < n) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t k;

		if (poll(&p, 1, (int)(end - now_ms())) != 1)
			return false;
		if ((k = recv(fd, buf + got, n - got, 0)) <= 0)
			return false;
		got += (size_t)k;
	}
	return true;
}

static bool rec_socks5(struct rec *s, int fd)
{
	static const uint8_t pick[] = { 5, 0 }, reply[] = { 5, 0, 0, 1, 0, 0, 0, 0, 0, 0 };
	uint8_t greet[3];
	size_t rest;

	if (!rd(fd, greet, 3) || memcmp(greet, "\x05\x01\x00", 3) != 0)
		return snprintf(s->why, sizeof(s->why), "greeting"), false;
	if (send(fd, pick, sizeof(pick), MSG_NOSIGNAL) != sizeof(pick) || !rd(fd, s->req, 5))
		return snprintf(s->why, sizeof(s->why), "request head"), false;
	/* ATYP 1: 4 address bytes, 4: 16, 3: the length octet (already read) then the name. */
	rest = s->req[3] == 1 ? 3 + 2 : s->req[3] == 4 ? 15 + 2 : (size_t)s->req[4] + 2;
	if (!rd(fd, s->req + 5, rest))
		return snprintf(s->why, sizeof(s->why), "request body"), false;
	s->req_len = 5 + rest;
	return send(fd, reply, sizeof(reply), MSG_NOSIGNAL) == sizeof(reply);
}

static bool rec_http(struct rec *s, int fd)
{
	static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";

	while (s->req_len < 4 || memcmp(s->req + s->req_len - 4, "\r\n\r\n", 4) != 0) {
		if (s->req_len == sizeof(s->req) - 1 || !rd(fd, s->req + s->req_len, 1))
			return snprintf(s->why, sizeof(s->why), "request head"), false;
		s->req_len++;
	}
	s->req[s->req_len] = '\0';
	return send(fd, ok, sizeof(ok) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(ok) - 1;
}

static void *rec_main(void *arg)
{
	struct rec *s = arg;
	struct pollfd p = { .fd = s->lfd, .events = POLLIN };
	int fd;

	if (poll(&p, 1, WAIT_MS) != 1 || (fd = accept(s->lfd, NULL, NULL)) < 0) {
		snprintf(s->why, sizeof(s->why), "no connection");
		return NULL;
	}
	s->ok = s->kind == REC_SOCKS5 ? rec_socks5(s, fd) : rec_http(s, fd);
	/* Hold the tunnel until the client is done with it. */
	rd(fd, (uint8_t[1]){ 0 }, 1);
	close(fd);
	return NULL;
}

static void rec_start(struct rec *s, enum rec_kind kind)
{
	memset(s, 0, sizeof(*s));
	s->kind = kind;
	s->lfd = bind_loopback(4, &s->port, true);
	cr_assert_geq(s->lfd, 0);
	cr_assert_eq(pthread_create(&s->th, NULL, rec_main, s), 0);
}

static void rec_join(struct rec *s)
{
	pthread_join(s->th, NULL);
	close(s->lfd);
	cr_assert(s->ok, "recording server: %s", s->why);
}

/* ---- names ---- */

Test(outbound_name, valid_names)
{
	char longest[OUTBOUND_NAME_MAX + 2];

	cr_assert(outbound_name_valid("example.com"));
	cr_assert(outbound_name_valid("xn--bcher-kva.example"));
	cr_assert(outbound_name_valid("_srv.a-b.C9."));
	cr_assert(outbound_name_valid("1.2.3.4"), "digits and dots are a name too");
	cr_assert_not(outbound_name_valid(NULL));
	cr_assert_not(outbound_name_valid(""));
	cr_assert_not(outbound_name_valid("a b"));
	cr_assert_not(outbound_name_valid("a\r\nHost: evil"));
	cr_assert_not(outbound_name_valid("::1"));
	cr_assert_not(outbound_name_valid("a:80"));
	cr_assert_not(outbound_name_valid("a/b"));
	cr_assert_not(outbound_name_valid("u@a"));
	cr_assert_not(outbound_name_valid("caf\xc3\xa9.example"));
	memset(longest, 'a', sizeof(longest));
	longest[OUTBOUND_NAME_MAX] = '\0';
	cr_assert(outbound_name_valid(longest), "%d bytes", OUTBOUND_NAME_MAX);
	longest[OUTBOUND_NAME_MAX] = 'a';
	longest[OUTBOUND_NAME_MAX + 1] = '\0';
	cr_assert_not(outbound_name_valid(longest), "%d bytes", OUTBOUND_NAME_MAX + 1);
}

/* A name that is not valid starts nothing, whatever the type. */
Test(outbound_name, invalid_name_is_einval)
{
	struct event_base *base = event_base_new();
	struct outbound_conn *c = NULL;
	struct ts_outbound ob;
	struct flow_key k;
	struct result r = { 0 };

	key_named(&k, 443);
	memset(&ob, 0, sizeof(ob));
	ob.type = TS_OUT_DIRECT;
	cr_assert_eq(outbound_connect_name(base, &ob, &k, "a b", 1000, on_done, &r, &c), -EINVAL);
	ob_proxy(&ob, TS_OUT_HTTP, 9);
	cr_assert_eq(outbound_connect_name(base, &ob, &k, "", 1000, on_done, &r, &c), -EINVAL);
	ob_proxy(&ob, TS_OUT_SOCKS5, 9);
	cr_assert_eq(outbound_connect_name(base, &ob, &k, "x\n", 1000, on_done, &r, &c), -EINVAL);
	run(base, &r, 50, false);
	cr_assert_eq(r.calls, 0);
	event_base_free(base);
}

/* ---- socks5 and http: the name goes to the proxy ---- */

Test(outbound_name, socks5_connect_carries_atyp3_and_the_name)
{
	static const uint8_t want[] = "\x05\x01\x00\x03\x10" NAME "\x01\xbb";
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	struct rec s;

	rec_start(&s, REC_SOCKS5);
	ob_proxy(&ob, TS_OUT_SOCKS5, s.port);
	key_named(&k, 443);
	connect_name(base, &ob, &k, NAME, 2000, &r);
	cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
	close(r.fd);
	rec_join(&s);
	cr_assert_eq(s.req_len, sizeof(want) - 1, "request of %zu bytes", s.req_len);
	cr_assert_arr_eq(s.req, want, sizeof(want) - 1, "CONNECT ATYP 3, 16, the name, port 443");
	event_base_free(base);
}

/* Without a name the same outbound still sends the address (ATYP 1). */
Test(outbound_name, socks5_without_a_name_sends_the_address)
{
	static const uint8_t want[] = { 5, 1, 0, 1, 203, 0, 113, 7, 0x01, 0xbb };
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	struct rec s;

	rec_start(&s, REC_SOCKS5);
	ob_proxy(&ob, TS_OUT_SOCKS5, s.port);
	key_named(&k, 443);
	connect_name(base, &ob, &k, NULL, 2000, &r);
	cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
	close(r.fd);
	rec_join(&s);
	cr_assert_eq(s.req_len, sizeof(want));
	cr_assert_arr_eq(s.req, want, sizeof(want));
	event_base_free(base);
}

Test(outbound_name, http_connect_line_and_host_carry_the_name)
{
	static const char want[] = "CONNECT " NAME ":8443 HTTP/1.1\r\nHost: " NAME ":8443\r\n";
	struct event_base *base = event_base_new();
	struct ts_outbound ob;
	struct flow_key k;
	struct result r;
	struct rec s;

	rec_start(&s, REC_HTTP);
	ob_proxy(&ob, TS_OUT_HTTP, s.port);
	key_named(&k, 8443);
	connect_name(base, &ob, &k, NAME, 2000, &r);
	cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
	close(r.fd);
	rec_join(&s);
	cr_assert(strncmp((char *)s.req, want, sizeof(want) - 1) == 0, "request:\n%s", s.req);
	cr_assert_null(strstr((char *)s.req, "203.0.113.7"), "the address leaked:\n%s", s.req);
	event_base_free(base);
}

/* ---- direct: resolved here, domain_strategy, Happy Eyeballs ---- */

static const struct rr NAMES[] = {
	{ .name = "dual.test", .ttl = 60, .a = { "127.0.0.1" }, .aaaa = { "::1" } },
	{ .name = "v4.test", .ttl = 60, .a = { "127.0.0.1" } },
	{ .name = "v6.test", .ttl = 60, .aaaa = { "::1" } },
	{ .name = "silent.test", .silent = true },
	{ .name = NULL },
};

struct dfx {
	struct event_base *base;
	struct dns dns;
	struct resolver *res;
	struct ts_outbound ob;
	struct flow_key k;
};

static void dfx_start(struct dfx *f, enum ts_domain_strategy ds, uint16_t port)
{
	struct resolver_config cfg = { .timeout_ms = 1000, .tries = 1 };

	memset(f, 0, sizeof(*f));
	f->base = event_base_new();
	cr_assert_not_null(f->base);
	dns_start(&f->dns, f->base, NAMES);
	cfg.servers = f->dns.servers;
	cr_assert_eq(resolver_new(f->base, &cfg, &f->res), 0);
	strcpy(f->ob.tag, "direct");
	f->ob.type = TS_OUT_DIRECT;
	f->ob.domain_strategy = ds;
	f->ob.resolver = f->res;
	key_named(&f->k, port);
}

static void dfx_stop(struct dfx *f)
{
	resolver_free(f->res);
	dns_stop(&f->dns);
	event_base_free(f->base);
}

/* The family of the peer a connected outbound socket reached. */
static int peer_family(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	cr_assert_eq(getpeername(fd, (struct sockaddr *)&ss, &len), 0, "%s", strerror(errno));
	return ss.ss_family == AF_INET6 ? 6 : 4;
}

/* Connect to name under ds with both listeners up; the family the connection reached (or the
 * error, negative). */
static int direct_family(enum ts_domain_strategy ds, const char *name)
{
	struct pair p;
	struct dfx f;
	struct result r;
	int ret;

	pair_open(&p, true, true);
	dfx_start(&f, ds, p.port);
	connect_name(f.base, &f.ob, &f.k, name, 2000, &r);
	ret = r.err ? r.err : peer_family(r.fd);
	if (r.fd >= 0)
		close(r.fd);
	dfx_stop(&f);
	pair_close(&p);
	return ret;
}

Test(outbound_name, direct_strategy_chooses_the_family)
{
	cr_assert_eq(direct_family(TS_DS_PREFER_IPV6, "dual.test"), 6, "prefer_ipv6: AAAA first");
	cr_assert_eq(direct_family(TS_DS_PREFER_IPV4, "dual.test"), 4, "prefer_ipv4: A first");
	cr_assert_eq(direct_family(TS_DS_IPV4_ONLY, "dual.test"), 4);
	cr_assert_eq(direct_family(TS_DS_IPV6_ONLY, "dual.test"), 6);
	cr_assert_eq(direct_family(TS_DS_PREFER_IPV6, "v4.test"), 4, "the other family if alone");
	cr_assert_eq(direct_family(TS_DS_PREFER_IPV4, "v6.test"), 6, "the other family if alone");
	cr_assert_eq(direct_family(TS_DS_IPV4_ONLY, "v6.test"), -ENXIO, "no address allowed");
	cr_assert_eq(direct_family(TS_DS_IPV6_ONLY, "v4.test"), -ENXIO, "no address allowed");
}

/* "only" means only: with the IPv4 port refusing, prefer_ipv4 falls back to IPv6 at once, but
 * ipv4_only fails with the refusal; the same the other way round. */
Test(outbound_name, direct_only_never_tries_the_other_family)
{
	static const struct {
		bool listen4, listen6;
		enum ts_domain_strategy ds;
		int want;
	} c[] = {
		{ false, true, TS_DS_PREFER_IPV4, 6 },
		{ false, true, TS_DS_IPV4_ONLY, -ECONNREFUSED },
		{ true, false, TS_DS_PREFER_IPV6, 4 },
		{ true, false, TS_DS_IPV6_ONLY, -ECONNREFUSED },
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct pair p;
		struct dfx f;
		struct result r;
		int got;

		pair_open(&p, c[i].listen4, c[i].listen6);
		dfx_start(&f, c[i].ds, p.port);
		connect_name(f.base, &f.ob, &f.k, "dual.test", 2000, &r);
		got = r.err ? r.err : peer_family(r.fd);
		cr_assert_eq(got, c[i].want, "case %zu: got %d", i, got);
		if (r.fd >= 0)
			close(r.fd);
		dfx_stop(&f);
		pair_close(&p);
	}
}

/* An unknown name fails promptly with -ENXIO (NXDOMAIN, from the loop), long before the
 * deadline; a name nobody answers for fails at the attempt's deadline with -ETIMEDOUT. */
Test(outbound_name, direct_unknown_name_fails_promptly)
{
	struct dfx f;
	struct result r;
	int64_t t0;

	dfx_start(&f, TS_DS_PREFER_IPV6, 443);
	t0 = now_ms();
	connect_name(f.base, &f.ob, &f.k, "nosuch.test", 5000, &r);
	cr_assert_eq(r.err, -ENXIO, "%s", strerror(-r.err));
	cr_assert_lt(r.at_ms - t0, 500, "took %lld ms", (long long)(r.at_ms - t0));
	cr_assert_eq(f.dns.queries, 2, "A and AAAA asked once each");
	t0 = now_ms();
	connect_name(f.base, &f.ob, &f.k, "silent.test", 400, &r);
	cr_assert_eq(r.err, -ETIMEDOUT, "%s", strerror(-r.err));
	cr_assert_geq(r.at_ms - t0, 390);
	cr_assert_lt(r.at_ms - t0, 900, "took %lld ms", (long long)(r.at_ms - t0));
	dfx_stop(&f);
}

/* The lookup runs on the loop: the call returns at once, and a cancel before the answer ends
 * it without done (the resolver is freed afterwards with nothing left of the attempt). */
Test(outbound_name, direct_lookup_does_not_block_and_cancels)
{
	struct outbound_conn *c = NULL;
	struct dfx f;
	struct result r = { 0 };
	int64_t t0;

	dfx_start(&f, TS_DS_PREFER_IPV6, 443);
	t0 = now_ms();
	cr_assert_eq(outbound_connect_name(f.base, &f.ob, &f.k, "silent.test", 5000, on_done, &r,
					   &c), 0);
	cr_assert_lt(now_ms() - t0, 50, "outbound_connect_name blocked");
	run(f.base, &r, 100, false);
	cr_assert_eq(r.calls, 0);
	outbound_conn_cancel(c);
	run(f.base, &r, 100, false);
	cr_assert_eq(r.calls, 0, "done after cancel");
	dfx_stop(&f);
}

/* Without ob->resolver the attempt makes a resolver of its own (the system's configuration:
 * "localhost" from /etc/hosts). */
Test(outbound_name, direct_with_a_resolver_of_its_own)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai;
	struct event_base *base = event_base_new();
	struct ts_outbound ob = { .type = TS_OUT_DIRECT, .domain_strategy = TS_DS_IPV4_ONLY };
	struct flow_key k;
	struct result r;
	struct pair p;

	if (getaddrinfo("localhost", NULL, &hints, &ai) != 0)
		cr_skip_test("localhost has no IPv4 address here");
	freeaddrinfo(ai);
	pair_open(&p, true, true);
	key_named(&k, p.port);
	connect_name(base, &ob, &k, "localhost", 3000, &r);
	cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
	cr_assert_eq(peer_family(r.fd), 4);
	close(r.fd);
	pair_close(&p);
	event_base_free(base);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* Accept and close whatever connected to fd (a listener), without waiting. */
static void drain(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int c;

	while (poll(&p, 1, 0) == 1 && (c = accept(fd, NULL, NULL)) >= 0)
		close(c);
}

struct nm {
	struct event_base *base;
	struct dns dns;
	struct pair both, v4;     /* both listening; only 127.0.0.1 listening */
};

/* One attempt to dual.test (prefer_ipv6) at port: refused at once (-ENOMEM, nothing called),
 * or done called once, promptly: a stream to the family expected, or -ENOMEM, or -ETIMEDOUT at
 * the lookup's timeout (the resolver leaves a query whose socket it had no memory to watch to
 * c-ares's timeout: outbound/resolver.c). Returns whether a stream was made. */
static bool nm_attempt(struct nm *nm, struct resolver *res, uint16_t port, int family,
		       bool sweep)
{
	struct ts_outbound ob = { .type = TS_OUT_DIRECT, .domain_strategy = TS_DS_PREFER_IPV6,
				  .resolver = res };
	struct outbound_conn *c = NULL;
	struct result r = { .fd = -2 };
	struct flow_key k;
	int rc;

	key_named(&k, port);
	rc = outbound_connect_name(nm->base, &ob, &k, "dual.test", 2000, on_done, &r, &c);
	if (rc != 0) {
		cr_assert(sweep && rc == -ENOMEM, "outbound_connect_name: %d", rc);
		return false;
	}
	cr_assert_eq(r.calls, 0, "done ran inside outbound_connect_name");
	run(nm->base, &r, WAIT_MS, true);
	cr_assert_eq(r.calls, 1, "no result in time");
	event_base_loop(nm->base, EVLOOP_NONBLOCK);
	cr_assert_eq(r.calls, 1, "done ran twice");
	if (r.err != 0) {
		cr_assert(sweep && (r.err == -ENOMEM || r.err == -ETIMEDOUT), "%d", r.err);
		cr_assert_eq(r.fd, -1);
		return false;
	}
	cr_assert_eq(peer_family(r.fd), family);
	close(r.fd);
	return true;
}

/* A resolver of the scenario's own, then Happy Eyeballs to a name with both families: once
 * with both listeners up (IPv6 wins), once with IPv6 refusing (IPv4 at once after the
 * refusal); each ends in a stream or a prompt error; every descriptor comes back. */
static void nm_scenario(void *arg, bool sweep)
{
	struct nm *nm = arg;
	struct resolver_config cfg = { .servers = nm->dns.servers, .timeout_ms = 300, .tries = 1 };
	struct resolver *res = NULL;
	int fds = tu_dir_entries("/proc/self/fd"), made = 0, rc;

	if ((rc = resolver_new(nm->base, &cfg, &res)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "resolver_new: %d", rc);
		return;
	}
	made += nm_attempt(nm, res, nm->both.port, 6, sweep);
	made += nm_attempt(nm, res, nm->v4.port, 4, sweep);
	cr_assert(sweep || made == 2);
	resolver_free(res);
	drain(nm->both.fd4);
	drain(nm->both.fd6);
	drain(nm->v4.fd4);
	cr_assert_eq(tu_dir_entries("/proc/self/fd"), fds, "a descriptor left open");
}

Test(outbound_name, direct_each_allocation_refused_in_turn)
{
	struct nm nm;

	memset(&nm, 0, sizeof(nm));
	cr_assert_not_null(nm.base = event_base_new());
	dns_start(&nm.dns, nm.base, NAMES);
	pair_open(&nm.both, true, true);
	pair_open(&nm.v4, true, false);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nm_scenario, &nm, 5, 500));
	pair_close(&nm.both);
	pair_close(&nm.v4);
	dns_stop(&nm.dns);
	event_base_free(nm.base);
}
