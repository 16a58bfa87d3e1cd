/* test_udp_names.c — dispatch/udp with a namer and a direct outbound: a datagram whose
 * destination has a name goes to the name's address (resolved without blocking by the
 * resolver module, against a fake DNS server on loopback), waits for the answer, and its replies
 * come back from the address the client sent to, whatever family the answer had; the
 * outbound's domain_strategy picks the family; a name that does not resolve drops what waited
 * and is not asked again for a second.
 *
 * Everything is on loopback: the addresses the client "sends to" are 127.0.0.x, and the names
 * resolve to echo servers on 127.0.0.1 and ::1.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <event2/event.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/clock.h"
#include "core/config.h"
#include "dispatch/udp.h"
#include "dispatch/udp_int.h"
#include "core/evmem.h"
#include "failalloc.h"
#include "fakedns.h"
#include "outbound/resolver.h"
#include "testutil.h"
#include "udptest.h"

#define MAX_CAPS 16

struct echo {
	int fd;
	uint16_t port;
	struct event *ev;
	int received;
};

struct env {
	struct event_base *base;
	struct ts_config cfg;
	struct budget *b;
	struct udp_path *up;
	struct resolver *res;
	struct dns dns;
	struct echo e4, e6;
	uint8_t caps[MAX_CAPS][2048];
	size_t caplen[MAX_CAPS];
	int ncap;
	int namer_calls;
};

static const struct rr names[] = {
	{ .name = "echo6.test", .ttl = 60, .aaaa = { "::1" } },
	{ .name = "echo4.test", .ttl = 60, .a = { "127.0.0.1" } },
	{ .name = "both.test", .ttl = 60, .a = { "127.0.0.1" }, .aaaa = { "::1" } },
	{ .name = "nx.test", .nx = true },
	{ 0 },
};

static void echo_cb(evutil_socket_t fd, short what, void *arg)
{
	struct echo *s = arg;
	uint8_t buf[2048];
	struct sockaddr_storage peer;
	socklen_t plen = sizeof(peer);
	ssize_t n = recvfrom(fd, buf, sizeof(buf), 0, (struct sockaddr *)&peer, &plen);

	if (n < 0)
		return;
	s->received++;
	cr_assert_eq(sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&peer, plen), n);
}

static void echo_open(struct event_base *base, struct echo *s, int family, uint16_t port)
{
	struct sockaddr_storage ss;
	socklen_t len;

	memset(s, 0, sizeof(*s));
	len = (socklen_t)netaddr_sockaddr(family, family == 4 ? (const uint8_t *)"\x7f\0\0\x01"
							       : (const uint8_t *)"\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x01",
					  htons(port), &ss);
	s->fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(s->fd, 0);
	cr_assert_eq(bind(s->fd, (struct sockaddr *)&ss, len), 0, "bind: %s", strerror(errno));
	cr_assert_eq(getsockname(s->fd, (struct sockaddr *)&ss, &len), 0);
	s->port = ntohs(((struct sockaddr_in *)&ss)->sin_port); /* same offset in sockaddr_in6 */
	s->ev = event_new(base, s->fd, EV_READ | EV_PERSIST, echo_cb, s);
	cr_assert_eq(event_add(s->ev, NULL), 0);
}

static void echo_close(struct echo *s)
{
	event_free(s->ev);
	close(s->fd);
}

static int fake_tx(void *arg, const uint8_t *pkt, size_t len)
{
	struct env *e = arg;

	cr_assert_lt(e->ncap, MAX_CAPS);
	memcpy(e->caps[e->ncap], pkt, len);
	e->caplen[e->ncap++] = len;
	return 0;
}

/* 127.0.0.9 is "echo6.test", 127.0.0.8 "echo4.test", 127.0.0.7 "both.test", 127.0.0.6
 * "nx.test"; anything else has no name. */
static const char *namer(void *arg, int family, const uint8_t *dst, uint16_t dport)
{
	struct env *e = arg;

	e->namer_calls++;
	if (family != 4 || dst[0] != 127 || dst[1] != 0 || dst[2] != 0)
		return NULL;
	switch (dst[3]) {
	case 9: return "echo6.test";
	case 8: return "echo4.test";
	case 7: return "both.test";
	case 6: return "nx.test";
	default: return NULL;
	}
}

static void env_start_json(struct env *e, const char *json);

static void env_start(struct env *e, const char *strategy)
{
	char json[512];

	snprintf(json, sizeof(json),
		 "{\"outbounds\":[{\"tag\":\"direct\",\"type\":\"direct\"%s%s%s}]}",
		 strategy ? ",\"domain_strategy\":\"" : "", strategy ? strategy : "",
		 strategy ? "\"" : "");
	env_start_json(e, json);
}

static void env_start_json(struct env *e, const char *json)
{
	char err[TS_ERRLEN];
	struct resolver_config rc = { 0 };

	memset(e, 0, sizeof(*e));
	e->base = event_base_new();
	cr_assert_not_null(e->base);
	dns_start(&e->dns, e->base, names);
	echo_open(e->base, &e->e4, 4, 0);
	/* The v6 echo on the v4 echo's port: a name of either family reaches "the same" port. */
	echo_open(e->base, &e->e6, 6, e->e4.port);
	cr_assert_eq(config_load_string(json, &e->cfg, err, sizeof(err)), 0, "%s", err);
	rc.servers = e->dns.servers;
	cr_assert_eq(resolver_new(e->base, &rc, &e->res), 0);
	e->cfg.outbounds[0].resolver = e->res;
	cr_assert_eq(budget_new(&e->cfg.budget, &e->b), 0);
	cr_assert_eq(udp_path_new(e->base, &e->cfg, e->b, fake_tx, e, &e->up), 0);
	cr_assert_eq(udp_path_set_uptrains(e->up, true), 0); /* as the proxy runs it */
	udp_path_set_namer(e->up, namer, e);
}

static void env_fini(struct env *e)
{
	ut_path_free_checked(e->up, e->b);
	resolver_free(e->res);
	budget_free(e->b);
	config_fini(&e->cfg);
	echo_close(&e->e4);
	echo_close(&e->e6);
	dns_stop(&e->dns);
	event_base_free(e->base);
}

static struct udp_path_stats stats(struct env *e)
{
	return ut_stats(e->up);
}

#define PUMP_UNTIL(e, cond, timeout_ms) UT_PUMP_UNTIL((e)->base, cond, timeout_ms)

/* A datagram from the client 10.0.0.9:5000 to dst at the echo servers' port. */
static void tun_send(struct env *e, const char *dst, const void *payload, size_t len)
{
	ut_tun_send(e->up, "10.0.0.9", 5000, dst, e->e4.port, payload, len);
}

/* Capture i is an IPv4 reply (the client's family, whatever the answer's) from src at the
 * echo port to the client, carrying payload. */
static void check_reply(struct env *e, int i, const char *src, const void *payload, size_t plen)
{
	ut_check_reply(e->caps[i], e->caplen[i], src, e->e4.port, "10.0.0.9", 5000, payload, plen);
}

Test(udp_names, a_name_goes_to_its_answer_and_replies_come_from_the_address_asked)
{
	struct env e;

	env_start(&e, NULL);
	/* Three datagrams before the loop runs: all wait for the answer, in order. */
	tun_send(&e, "127.0.0.9", "a", 1);
	tun_send(&e, "127.0.0.9", "bb", 2);
	tun_send(&e, "127.0.0.9", "ccc", 3);
	cr_assert_eq(stats(&e).up_queued, 3);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 3, 3000), "got %d", e.ncap);
	check_reply(&e, 0, "127.0.0.9", "a", 1);
	check_reply(&e, 1, "127.0.0.9", "bb", 2);
	check_reply(&e, 2, "127.0.0.9", "ccc", 3);
	cr_assert_eq(e.e6.received, 3, "echo6.test is ::1 only");
	cr_assert_eq(e.e4.received, 0);
	cr_assert_eq(e.dns.queries, 2, "one lookup (A and AAAA) for the name");
	/* Known now: straight out. */
	tun_send(&e, "127.0.0.9", "dddd", 4);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 4, 2000));
	check_reply(&e, 3, "127.0.0.9", "dddd", 4);
	cr_assert_eq(e.dns.queries, 2);
	/* No name: by address (127.0.0.1 is the v4 echo). */
	tun_send(&e, "127.0.0.1", "plain", 5);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 5, 2000));
	check_reply(&e, 4, "127.0.0.1", "plain", 5);
	cr_assert_eq(e.e4.received, 1);
	struct udp_path_stats st = stats(&e);
	for (int i = 0; i < UDP_DROP_MAX; i++)
		cr_assert_eq(st.drops[i], 0, "drop %s", udp_drop_name((enum udp_drop)i));
	env_fini(&e);
}

Test(udp_names, domain_strategy_picks_the_family)
{
	static const struct {
		const char *strategy;
		bool want6;
	} cases[] = {
		{ NULL, true }, { "prefer_ipv6", true }, { "prefer_ipv4", false },
		{ "ipv4_only", false }, { "ipv6_only", true },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct env e;

		env_start(&e, cases[i].strategy);
		tun_send(&e, "127.0.0.7", "x", 1);
		cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 3000), "case %zu", i);
		check_reply(&e, 0, "127.0.0.7", "x", 1);
		cr_assert_eq(e.e6.received, cases[i].want6 ? 1 : 0, "case %zu", i);
		cr_assert_eq(e.e4.received, cases[i].want6 ? 0 : 1, "case %zu", i);
		env_fini(&e);
	}
}

Test(udp_names, ipv6_only_for_a_v4_only_name_fails)
{
	struct env e;

	env_start(&e, "ipv6_only");
	tun_send(&e, "127.0.0.8", "x", 1);
	cr_assert(PUMP_UNTIL(&e, stats(&e).resolve_failures == 1, 3000));
	cr_assert_eq(stats(&e).drops[UDP_DROP_resolve_failed], 1);
	cr_assert_eq(e.e4.received, 0, "never sent to the v4 answer");
	env_fini(&e);
}

Test(udp_names, a_name_that_does_not_resolve_drops_and_waits_before_asking_again)
{
	struct env e;

	env_start(&e, NULL);
	tun_send(&e, "127.0.0.6", "a", 1);
	tun_send(&e, "127.0.0.6", "b", 1);
	cr_assert(PUMP_UNTIL(&e, stats(&e).resolve_failures == 1, 3000));
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_resolve_failed], 2, "both waiting datagrams");
	cr_assert_eq(st.up_queued, 0);
	int q = e.dns.queries;
	tun_send(&e, "127.0.0.6", "c", 1);
	cr_assert_eq(stats(&e).drops[UDP_DROP_resolve_failed], 3, "in the retry wait: dropped");
	cr_assert_eq(e.dns.queries, q, "and not asked again");
	cr_assert_eq(e.ncap, 0);
	/* Other destinations of the same session are unaffected. */
	tun_send(&e, "127.0.0.8", "d", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 3000));
	check_reply(&e, 0, "127.0.0.8", "d", 1);
	env_fini(&e);
}

/* A new session whose first datagram to a name is dropped before anything waits for the answer
 * (no memory for the named destination) holds nothing: it is freed, not kept for the idle
 * timeout with its budget slot and its name. */
Test(udp_names, a_fresh_session_dropped_before_its_lookup_is_not_kept)
{
	struct budget_buffer_stats bs;
	struct env e;
	uint64_t keep, held;

	env_start(&e, NULL);
	tun_send(&e, "127.0.0.8", "a", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 3000));
	cr_assert_eq(stats(&e).sessions, 1);
	/* Room for a session and the name it keeps ("echo4.test"), not for its destination. */
	budget_buffer_stats(e.b, 0, &bs);
	keep = ((sizeof(struct udp_session) + 15) / 16) * 16 + sizeof("echo4.test");
	held = bs.bytes_limit - bs.bytes_in_use - keep;
	cr_assert_eq(budget_bytes_reserve(e.b, held), 0);
	ut_tun_send(e.up, "10.0.0.9", 5001, "127.0.0.8", e.e4.port, "b", 1);
	budget_bytes_release(e.b, held);
	struct udp_path_stats st = stats(&e);
	cr_assert_eq(st.drops[UDP_DROP_no_buffer], 1, "the destination found no memory");
	cr_assert_eq(st.up_queued, 0);
	cr_assert_eq(st.sessions, 1, "the new session holds nothing: freed");
	/* The same client port again, with memory: a session of its own, answered. */
	ut_tun_send(e.up, "10.0.0.9", 5001, "127.0.0.8", e.e4.port, "c", 1);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 3000));
	cr_assert_eq(stats(&e).sessions, 2);
	env_fini(&e);
}

Test(udp_names, route_rules_see_the_name)
{
	struct env e;

	env_start_json(&e, "{\"outbounds\":[{\"tag\":\"direct\",\"type\":\"direct\"},"
			   "{\"tag\":\"block\",\"type\":\"reject\"}],"
			   "\"route\":{\"rules\":[{\"domain_suffix\":[\"echo4.test\"],"
			   "\"outbound\":\"block\"}],\"final\":\"direct\"}}");
	tun_send(&e, "127.0.0.8", "no", 2);
	cr_assert_eq(stats(&e).drops[UDP_DROP_rejected], 1, "echo4.test is blocked by name");
	cr_assert_eq(e.namer_calls, 1);
	tun_send(&e, "127.0.0.9", "yes", 3);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 1, 3000));
	check_reply(&e, 0, "127.0.0.9", "yes", 3);
	cr_assert_eq(e.namer_calls, 2, "a new session's name is asked once, before the route");
	tun_send(&e, "127.0.0.9", "again", 5);
	cr_assert(PUMP_UNTIL(&e, e.ncap == 2, 3000));
	cr_assert_eq(e.namer_calls, 2, "and kept for the session's next datagrams");
	/* The session that went to echo6.test turns to echo4.test: blocked by name too. */
	tun_send(&e, "127.0.0.8", "no", 2);
	cr_assert_eq(stats(&e).drops[UDP_DROP_rejected], 2);
	cr_assert_eq(e.e4.received, 0);
	env_fini(&e);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* A datagram from the client 10.0.0.9:sport to dst at the echo port, as if later_ms had
 * passed (the retry of a name that failed waits a second). */
static void send_later(struct env *e, uint16_t sport, const char *dst, int later_ms)
{
	struct tu_spec sp;
	uint8_t pkt[256];
	size_t n;

	tu_spec_udp(&sp, "10.0.0.9", sport, dst, e->e4.port);
	sp.payload = (const uint8_t *)"x";
	sp.payload_len = 1;
	n = tu_build(&sp, pkt, sizeof(pkt));
	udp_path_input(e->up, pkt, n, ts_now_ns() + MS(later_ms));
	udp_path_batch_end(e->up);
}

/* The path's life: datagrams to a name, to a name that does not resolve, to an address, and
 * to the failed name twice more, each after its retry wait. Each is echoed or counted as a
 * drop; every unit comes back at the free. */
static void nomem_scenario(void *arg, bool sweep)
{
	static const char *dst[] = { "127.0.0.8", "127.0.0.6", "127.0.0.1", "127.0.0.6",
				     "127.0.0.6" };
	static const uint16_t sport[] = { 5000, 5001, 5002, 5001, 5001 };
	static const int later[] = { 0, 0, 0, 2000, 4000 };
	struct env *e = arg;
	struct resolver_config rc = { .servers = e->dns.servers, .timeout_ms = 300, .tries = 1 };
	char err[TS_ERRLEN];
	int ret;

	e->ncap = 0;
	e->b = NULL;
	e->res = NULL;
	ret = config_load_string("{\"outbounds\":[{\"tag\":\"direct\",\"type\":\"direct\"}]}",
				 &e->cfg, err, sizeof(err));
	if (ret) {
		cr_assert(sweep && ret == -ENOMEM, "%s", err);
		goto out;
	}
	if ((ret = resolver_new(e->base, &rc, &e->res)) != 0) {
		cr_assert(sweep && ret == -ENOMEM);
		goto out;
	}
	e->cfg.outbounds[0].resolver = e->res;
	if ((ret = budget_new(&e->cfg.budget, &e->b)) != 0) {
		cr_assert(sweep && ret == -ENOMEM);
		goto out;
	}
	if ((ret = udp_path_new(e->base, &e->cfg, e->b, fake_tx, e, &e->up)) != 0) {
		cr_assert(sweep && (ret == -ENOMEM || ret == -ENOBUFS), "udp_path_new: %d", ret);
		goto out;
	}
	ret = udp_path_set_uptrains(e->up, true);
	cr_assert(ret == 0 || (sweep && (ret == -ENOMEM || ret == -ENOBUFS)), "uptrains %d", ret);
	udp_path_set_namer(e->up, namer, e);
	for (int i = 0; i < 5; i++) {
		uint64_t before = ut_drops_total(e->up);
		int got = e->ncap;

		send_later(e, sport[i], dst[i], later[i]);
		cr_assert(PUMP_UNTIL(e, e->ncap > got || ut_drops_total(e->up) > before, 3000),
			  "datagram %d to %s: neither echoed nor counted as a drop", i, dst[i]);
		if (!sweep)
			cr_assert_eq(e->ncap, got + (dst[i][8] == '6' ? 0 : 1), "datagram %d", i);
	}
	ut_path_free_checked(e->up, e->b);
out:
	resolver_free(e->res);
	budget_free(e->b);
	config_fini(&e->cfg);
}

Test(udp_names, each_allocation_refused_in_turn)
{
	struct env e;

	/* libevent allocates through the project's allocator, as twinstack runs it. */
	cr_assert_eq(evmem_install(), 0);

	memset(&e, 0, sizeof(e));
	e.base = event_base_new();
	cr_assert_not_null(e.base);
	dns_start(&e.dns, e.base, names);
	echo_open(e.base, &e.e4, 4, 0);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, &e, 10,
								      1000));
	echo_close(&e.e4);
	dns_stop(&e.dns);
	event_base_free(e.base);
}
