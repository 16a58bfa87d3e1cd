/* test_resolver.c — outbound/resolver.c against a fake DNS server on 127.0.0.1 (a UDP socket
 * served by the same libevent loop, answering A and AAAA from a table with chosen TTLs, or
 * NXDOMAIN, or nothing at all). The cache's clock is a virtual one the tests move.
 *
 *   test ──resolver_lookup──► resolver (c-ares) ──UDP──► fake DNS (same loop) ──► answers
 *
 * Every wait is bounded by a guard timer. Runs as root: SO_MARK needs CAP_NET_ADMIN.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/evmem.h"
#include "core/libmem.h"
#include "failalloc.h"
#include "fakedns.h"
#include "outbound/resolver.h"
#include "testutil.h"

#define WAIT_MS 3000

/* ---- a virtual clock for the cache, results, the loop ---- */

struct vclock {
	int64_t ms;
};

static int64_t vclock_now(void *arg)
{
	return ((struct vclock *)arg)->ms;
}

static int64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct res {
	int calls;
	int err;
	size_t n;
	struct netaddr addrs[RESOLVER_MAX_ADDRS];
	int64_t at_ms;
};

static void on_res(void *arg, int err, const struct netaddr *addrs, size_t n)
{
	struct res *r = arg;

	r->calls++;
	r->err = err;
	r->n = n;
	r->at_ms = wall_ms();
	cr_assert_leq(n, RESOLVER_MAX_ADDRS);
	cr_assert(err != 0 || (n > 0 && addrs));
	cr_assert(err == 0 || n == 0);
	if (n)
		memcpy(r->addrs, addrs, n * sizeof(*addrs));
}

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
	*(bool *)arg = true;
}

/* Run base until *calls is non-zero or ms passed (ms < 0: run exactly -ms). */
static bool run_until(struct event_base *base, const int *calls, int ms)
{
	bool expired = false;
	int wait = ms < 0 ? -ms : ms;
	struct timeval tv = { wait / 1000, (wait % 1000) * 1000 };
	struct event *guard;

	failalloc_hold(true); /* the test's guard, not the code under test */
	guard = evtimer_new(base, on_guard, &expired);
	cr_assert_not_null(guard);
	cr_assert_eq(evtimer_add(guard, &tv), 0);
	failalloc_hold(false);
	while (!expired && (ms < 0 || *calls == 0))
		event_base_loop(base, EVLOOP_ONCE);
	event_free(guard);
	return *calls > 0;
}

struct fixture {
	struct event_base *base;
	struct dns dns;
	struct vclock clk;
	struct resolver_config cfg;
	struct resolver *r;
};

static void fx_start(struct fixture *fx, const struct rr *table)
{
	memset(fx, 0, sizeof(*fx));
	fx->base = event_base_new();
	cr_assert_not_null(fx->base);
	dns_start(&fx->dns, fx->base, table);
	fx->clk.ms = 1000000;
	fx->cfg.servers = fx->dns.servers;
	fx->cfg.timeout_ms = 300;
	fx->cfg.tries = 1;
	fx->cfg.now_ms = vclock_now;
	fx->cfg.now_arg = &fx->clk;
}

static void fx_resolver(struct fixture *fx)
{
	cr_assert_eq(resolver_new(fx->base, &fx->cfg, &fx->r), 0);
}

static void fx_stop(struct fixture *fx)
{
	resolver_free(fx->r);
	dns_stop(&fx->dns);
	event_base_free(fx->base);
	CHECK_LEAKS();
}

/* One lookup run to its result; done must not run inside resolver_lookup. */
static void lookup(struct fixture *fx, const char *name, int pref, struct res *out)
{
	struct resolver_query *q = NULL;

	memset(out, 0, sizeof(*out));
	cr_assert_eq(resolver_lookup(fx->r, name, pref, on_res, out, &q), 0);
	cr_assert_not_null(q);
	cr_assert_eq(out->calls, 0, "done ran inside resolver_lookup");
	cr_assert(run_until(fx->base, &out->calls, WAIT_MS), "no result for %s", name);
	cr_assert_eq(out->calls, 1);
}

static void assert_addr(const struct netaddr *a, const char *text)
{
	struct netaddr want;

	cr_assert_eq(netaddr_parse(text, &want), 0);
	cr_assert_eq(a->family, want.family, "family of %s", text);
	cr_assert_arr_eq(a->a, want.a, a->family == 4 ? 4 : 16, "address %s", text);
}

static const struct rr TABLE[] = {
	{ .name = "both.test", .ttl = 30, .a = { "192.0.2.1", "192.0.2.2", "192.0.2.3" },
	  .aaaa = { "2001:db8::1", "2001:db8::2" } },
	{ .name = "short.test", .ttl = 5, .a = { "192.0.2.9" } },
	{ .name = "v6only.test", .ttl = 60, .aaaa = { "2001:db8::6" } },
	{ .name = "gone.test", .nx = true },
	{ .name = "silent.test", .silent = true },
	{ .name = NULL },
};

/* ---- tests ---- */

Test(resolver, answers_both_families_interleaved_ipv6_first)
{
	struct fixture fx;
	struct res r;

	fx_start(&fx, TABLE);
	fx_resolver(&fx);
	lookup(&fx, "both.test", 0, &r);
	cr_assert_eq(r.err, 0, "%s", strerror(-r.err));
	cr_assert_eq(r.n, 5);
	assert_addr(&r.addrs[0], "2001:db8::1");
	assert_addr(&r.addrs[1], "192.0.2.1");
	assert_addr(&r.addrs[2], "2001:db8::2");
	assert_addr(&r.addrs[3], "192.0.2.2");
	assert_addr(&r.addrs[4], "192.0.2.3");
	cr_assert_eq(fx.dns.q_a, 1);
	cr_assert_eq(fx.dns.q_aaaa, 1);
	fx_stop(&fx);
}

Test(resolver, cached_until_the_ttl_expires)
{
	struct resolver_stats st;
	struct fixture fx;
	struct res r;

	fx_start(&fx, TABLE);
	fx_resolver(&fx);
	lookup(&fx, "both.test", 0, &r);
	cr_assert_eq(fx.dns.queries, 2);
	fx.clk.ms += 29 * 1000;
	lookup(&fx, "BOTH.test.", 0, &r);  /* same name: case and final dot do not matter */
	cr_assert_eq(r.err, 0);
	cr_assert_eq(r.n, 5);
	assert_addr(&r.addrs[0], "2001:db8::1");
	cr_assert_eq(fx.dns.queries, 2, "a cached name is not asked again");
	fx.clk.ms += 2 * 1000;  /* 31 s: past the TTL of 30 */
	lookup(&fx, "both.test", 0, &r);
	cr_assert_eq(r.err, 0);
	cr_assert_eq(fx.dns.queries, 4, "an expired name is asked again");
	resolver_get_stats(fx.r, &st);
	cr_assert_eq(st.lookups, 3);
	cr_assert_eq(st.cache_hits, 1);
	cr_assert_eq(st.queries, 4);
	fx_stop(&fx);
}

Test(resolver, smallest_ttl_rules_and_max_ttl_caps)
{
	struct fixture fx;
	struct res r;

	fx_start(&fx, TABLE);
	fx.cfg.max_ttl_s = 10;
	fx_resolver(&fx);
	lookup(&fx, "short.test", 0, &r);  /* A with TTL 5, no AAAA */
	cr_assert_eq(r.err, 0);
	cr_assert_eq(r.n, 1);
	fx.clk.ms += 4999;
	lookup(&fx, "short.test", 0, &r);
	cr_assert_eq(fx.dns.queries, 2);
	fx.clk.ms += 1;
	lookup(&fx, "short.test", 0, &r);
	cr_assert_eq(fx.dns.queries, 4, "TTL 5 s honoured");
	lookup(&fx, "both.test", 0, &r);  /* TTL 30, capped at 10 */
	cr_assert_eq(fx.dns.queries, 6);
	fx.clk.ms += 10 * 1000;
	lookup(&fx, "both.test", 0, &r);
	cr_assert_eq(fx.dns.queries, 8, "max_ttl_s caps a long TTL");
	fx_stop(&fx);
}

Test(resolver, family_preference_filters)
{
	struct fixture fx;
	struct res r;

	fx_start(&fx, TABLE);
	fx_resolver(&fx);
	lookup(&fx, "both.test", 4, &r);
	cr_assert_eq(r.err, 0);
	cr_assert_eq(r.n, 3);
	for (size_t i = 0; i < r.n; i++)
		cr_assert_eq(r.addrs[i].family, 4);
	lookup(&fx, "both.test", 6, &r);
	cr_assert_eq(r.n, 2);
	assert_addr(&r.addrs[0], "2001:db8::1");
	lookup(&fx, "v6only.test", 4, &r);
	cr_assert_eq(r.err, -ENXIO, "no address of the family asked for");
	lookup(&fx, "v6only.test", 0, &r);
	cr_assert_eq(r.err, 0);
	cr_assert_eq(r.n, 1);
	fx_stop(&fx);
}

Test(resolver, negative_answers_cached_briefly)
{
	struct resolver_stats st;
	struct fixture fx;
	struct res r;

	fx_start(&fx, TABLE);
	fx.cfg.neg_ttl_s = 3;
	fx_resolver(&fx);
	lookup(&fx, "gone.test", 0, &r);
	cr_assert_eq(r.err, -ENXIO);
	cr_assert_eq(fx.dns.queries, 2);
	lookup(&fx, "gone.test", 0, &r);
	cr_assert_eq(r.err, -ENXIO);
	cr_assert_eq(fx.dns.queries, 2, "NXDOMAIN cached");
	fx.clk.ms += 3000;
	lookup(&fx, "gone.test", 0, &r);
	cr_assert_eq(r.err, -ENXIO);
	cr_assert_eq(fx.dns.queries, 4, "a negative answer expires after neg_ttl_s");
	resolver_get_stats(fx.r, &st);
	cr_assert_eq(st.nxdomain, 2);
	cr_assert_eq(st.cache_neg_hits, 1);
	fx_stop(&fx);
}

Test(resolver, silent_server_times_out_bounded_and_not_cached)
{
	struct resolver_stats st;
	struct fixture fx;
	struct res r;
	int64_t t0;

	fx_start(&fx, TABLE);
	fx_resolver(&fx);  /* 300 ms, one try */
	t0 = wall_ms();
	lookup(&fx, "silent.test", 0, &r);
	cr_assert_eq(r.err, -ETIMEDOUT, "%d", r.err);
	cr_assert_geq(r.at_ms - t0, 250);
	cr_assert_lt(r.at_ms - t0, 1500, "took %lld ms", (long long)(r.at_ms - t0));
	lookup(&fx, "silent.test", 0, &r);
	cr_assert_eq(r.err, -ETIMEDOUT);
	cr_assert_eq(fx.dns.queries, 4, "a timeout is not cached");
	resolver_get_stats(fx.r, &st);
	cr_assert_eq(st.timeouts, 2);
	fx_stop(&fx);
}

Test(resolver, unreachable_server_is_temporary)
{
	struct fixture fx;
	struct res r;
	int fd;

	fx_start(&fx, TABLE);
	/* A closed port: the server's ICMP port unreachable is a temporary failure. */
	fd = fx.dns.fd;
	event_del(fx.dns.ev);
	close(fd);
	fx.dns.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);  /* dns_stop closes it */
	fx_resolver(&fx);
	lookup(&fx, "both.test", 0, &r);
	cr_assert(r.err == -EAGAIN || r.err == -ETIMEDOUT, "%d", r.err);
	fx_stop(&fx);
}

struct hook_log {
	int calls;
	int bad_marks;
	int types[8];
};

static int mark_hook(void *arg, int fd, int family, int type)
{
	struct hook_log *h = arg;
	uint32_t mark = 0;
	socklen_t len = sizeof(mark);

	if (getsockopt(fd, SOL_SOCKET, SO_MARK, &mark, &len) != 0 || mark != 0x7a5)
		h->bad_marks++;
	if (h->calls < 8)
		h->types[h->calls] = type;
	h->calls++;
	return 0;
}

Test(resolver, sockets_carry_the_outbound_mark_and_hook)
{
	struct ts_outbound ob;
	struct hook_log h = { 0 };
	struct resolver_stats st;
	struct fixture fx;
	struct res r;

	memset(&ob, 0, sizeof(ob));
	ob.type = TS_OUT_DIRECT;
	ob.has_routing_mark = true;
	ob.routing_mark = 0x7a5;
	ob.sock_hook.fn = mark_hook;
	ob.sock_hook.arg = &h;
	fx_start(&fx, TABLE);
	fx.cfg.sock = &ob;
	fx_resolver(&fx);
	lookup(&fx, "both.test", 0, &r);
	cr_assert_eq(r.err, 0);
	cr_assert_geq(h.calls, 1, "every resolver socket goes through the hook");
	cr_assert_eq(h.bad_marks, 0, "a resolver socket without SO_MARK");
	cr_assert_eq(h.types[0], SOCK_DGRAM);
	resolver_get_stats(fx.r, &st);
	cr_assert_eq(st.sockets, (uint64_t)h.calls);
	fx_stop(&fx);
}

static int refusing_hook(void *arg, int fd, int family, int type)
{
	(*(int *)arg)++;
	return -EPERM;
}

Test(resolver, socket_refused_by_hook_fails_the_lookup)
{
	struct ts_outbound ob;
	struct resolver_stats st;
	struct fixture fx;
	struct res r;
	int refused = 0;

	memset(&ob, 0, sizeof(ob));
	ob.sock_hook.fn = refusing_hook;
	ob.sock_hook.arg = &refused;
	fx_start(&fx, TABLE);
	fx.cfg.sock = &ob;
	fx_resolver(&fx);
	lookup(&fx, "both.test", 0, &r);
	cr_assert_lt(r.err, 0);
	cr_assert_eq(fx.dns.queries, 0, "no query may leave by an unhooked socket");
	cr_assert_geq(refused, 1);
	resolver_get_stats(fx.r, &st);
	cr_assert_geq(st.socket_errors, 1);
	fx_stop(&fx);
}

Test(resolver, cancel_before_the_answer_and_before_a_cache_hit)
{
	struct resolver_query *q = NULL;
	struct fixture fx;
	struct res r = { 0 }, r2;
	int never = 0;

	fx_start(&fx, TABLE);
	fx_resolver(&fx);
	cr_assert_eq(resolver_lookup(fx.r, "both.test", 0, on_res, &r, &q), 0);
	resolver_cancel(q);
	run_until(fx.base, &never, -300);
	cr_assert_eq(r.calls, 0, "done ran after cancel");
	cr_assert_eq(fx.dns.queries, 2);
	/* The resolution went on and filled the cache. */
	lookup(&fx, "both.test", 0, &r2);
	cr_assert_eq(r2.err, 0);
	cr_assert_eq(fx.dns.queries, 2);
	/* A cache hit is delivered from the loop: cancel it before that. */
	cr_assert_eq(resolver_lookup(fx.r, "both.test", 0, on_res, &r, &q), 0);
	resolver_cancel(q);
	run_until(fx.base, &never, -50);
	cr_assert_eq(r.calls, 0, "done ran after cancel");
	fx_stop(&fx);
}

/* The only waiter cancelled while its resolution is out, then the name asked again before the
 * answer: the new ask joins the resolution that goes on (it has no waiter left). */
Test(resolver, ask_again_after_the_only_waiter_was_cancelled)
{
	struct resolver_query *q = NULL;
	struct resolver_stats st;
	struct fixture fx;
	struct res r = { 0 }, r2;

	fx_start(&fx, TABLE);
	fx_resolver(&fx);
	cr_assert_eq(resolver_lookup(fx.r, "both.test", 0, on_res, &r, &q), 0);
	resolver_cancel(q);
	lookup(&fx, "both.test", 4, &r2);
	cr_assert_eq(r2.err, 0);
	cr_assert_eq(r2.n, 3);
	cr_assert_eq(r.calls, 0, "done ran after cancel");
	cr_assert_eq(fx.dns.queries, 2, "one resolution");
	resolver_get_stats(fx.r, &st);
	cr_assert_eq(st.coalesced, 1);
	fx_stop(&fx);
}

Test(resolver, concurrent_lookups_share_one_resolution)
{
	struct resolver_query *q1, *q2, *q3;
	struct resolver_stats st;
	struct fixture fx;
	struct res r1 = { 0 }, r2 = { 0 }, r3 = { 0 };

	fx_start(&fx, TABLE);
	fx_resolver(&fx);
	cr_assert_eq(resolver_lookup(fx.r, "both.test", 0, on_res, &r1, &q1), 0);
	cr_assert_eq(resolver_lookup(fx.r, "both.test", 4, on_res, &r2, &q2), 0);
	cr_assert_eq(resolver_lookup(fx.r, "both.test", 6, on_res, &r3, &q3), 0);
	resolver_cancel(q2);
	run_until(fx.base, &r3.calls, WAIT_MS);
	run_until(fx.base, &r1.calls, WAIT_MS);
	cr_assert_eq(r1.calls, 1);
	cr_assert_eq(r1.n, 5);
	cr_assert_eq(r2.calls, 0);
	cr_assert_eq(r3.calls, 1);
	cr_assert_eq(r3.n, 2);
	cr_assert_eq(fx.dns.queries, 2);
	resolver_get_stats(fx.r, &st);
	cr_assert_eq(st.coalesced, 2);
	fx_stop(&fx);
}

Test(resolver, ip_literal_needs_no_query)
{
	struct fixture fx;
	struct res r;

	fx_start(&fx, TABLE);
	fx_resolver(&fx);
	lookup(&fx, "192.0.2.77", 0, &r);
	cr_assert_eq(r.err, 0);
	cr_assert_eq(r.n, 1);
	assert_addr(&r.addrs[0], "192.0.2.77");
	lookup(&fx, "2001:db8::77", 4, &r);
	cr_assert_eq(r.err, -ENXIO, "an IPv6 literal has no IPv4 address");
	cr_assert_eq(fx.dns.queries, 0);
	fx_stop(&fx);
}

Test(resolver, cache_is_bounded_lru)
{
	static const struct rr many[] = {
		{ .name = "a.test", .ttl = 300, .a = { "192.0.2.1" } },
		{ .name = "b.test", .ttl = 300, .a = { "192.0.2.2" } },
		{ .name = "c.test", .ttl = 300, .a = { "192.0.2.3" } },
		{ .name = NULL },
	};
	struct resolver_stats st;
	struct fixture fx;
	struct res r;

	fx_start(&fx, many);
	fx.cfg.max_names = 2;
	fx_resolver(&fx);
	lookup(&fx, "a.test", 0, &r);
	lookup(&fx, "b.test", 0, &r);
	lookup(&fx, "a.test", 0, &r);  /* a is now the most recent */
	cr_assert_eq(fx.dns.queries, 4);
	lookup(&fx, "c.test", 0, &r);  /* evicts b */
	cr_assert_eq(fx.dns.queries, 6);
	lookup(&fx, "a.test", 0, &r);
	cr_assert_eq(fx.dns.queries, 6, "the recently used name stays");
	lookup(&fx, "b.test", 0, &r);
	cr_assert_eq(fx.dns.queries, 8, "the least recently used name was evicted");
	assert_addr(&r.addrs[0], "192.0.2.2");
	resolver_get_stats(fx.r, &st);
	cr_assert_geq(st.evictions, 2);
	fx_stop(&fx);
}

struct free_ctx {
	struct fixture *fx;
	int calls;
};

static void free_in_done(void *arg, int err, const struct netaddr *addrs, size_t n)
{
	struct free_ctx *c = arg;

	c->calls++;
	resolver_free(c->fx->r);  /* the other lookup in flight is dropped */
	c->fx->r = NULL;
}

Test(resolver, free_with_lookups_in_flight_and_from_done)
{
	struct resolver_query *q;
	struct fixture fx;
	struct free_ctx c = { .fx = &fx };
	struct res r = { 0 };
	int never = 0;

	fx_start(&fx, TABLE);
	fx_resolver(&fx);
	cr_assert_eq(resolver_lookup(fx.r, "silent.test", 0, on_res, &r, &q), 0);
	cr_assert_eq(resolver_lookup(fx.r, "both.test", 0, on_res, &r, &q), 0);
	resolver_free(fx.r);  /* done never runs for either */
	fx.r = NULL;
	run_until(fx.base, &never, -100);
	cr_assert_eq(r.calls, 0);
	fx_resolver(&fx);
	cr_assert_eq(resolver_lookup(fx.r, "silent.test", 0, on_res, &r, &q), 0);
	cr_assert_eq(resolver_lookup(fx.r, "both.test", 0, free_in_done, &c, &q), 0);
	cr_assert(run_until(fx.base, &c.calls, WAIT_MS), "done did not run");
	cr_assert_null(fx.r);
	run_until(fx.base, &never, -500);  /* past the silent query's timeout */
	cr_assert_eq(r.calls, 0);
	fx_stop(&fx);
}

Test(resolver, bad_arguments)
{
	struct resolver_config bad = { .servers = "not a server" };
	struct resolver_query *q;
	struct fixture fx;
	struct resolver *r2 = NULL;
	char longname[300];

	fx_start(&fx, TABLE);
	fx_resolver(&fx);
	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	cr_assert_eq(resolver_lookup(fx.r, "", 0, on_res, NULL, &q), -EINVAL);
	cr_assert_eq(resolver_lookup(fx.r, ".", 0, on_res, NULL, &q), -EINVAL);
	cr_assert_eq(resolver_lookup(fx.r, longname, 0, on_res, NULL, &q), -EINVAL);
	cr_assert_eq(resolver_lookup(fx.r, "x.test", 5, on_res, NULL, &q), -EINVAL);
	cr_assert_eq(resolver_lookup(fx.r, "x.test", 0, NULL, NULL, &q), -EINVAL);
	cr_assert_eq(resolver_new(fx.base, &bad, &r2), -EINVAL);
	cr_assert_null(r2);
	fx_stop(&fx);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

/* Start a lookup and run the loop until its done ran (bounded): the lookup's rc. A refused
 * lookup calls nothing and leaves the handle NULL, which the caller may cancel. */
static int nomem_lookup(struct fixture *fx, const char *name, struct res *out, bool sweep)
{
	struct resolver_query *q = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = resolver_lookup(fx->r, name, 0, on_res, out, &q);
	if (rc < 0) {
		cr_assert(sweep && rc == -ENOMEM, "lookup %s: %d", name, rc);
		cr_assert_eq(out->calls, 0, "a refused lookup called back");
		resolver_cancel(q); /* as a caller's teardown does with the handle it kept */
		return rc;
	}
	cr_assert(run_until(fx->base, &out->calls, WAIT_MS), "no result for %s", name);
	cr_assert_eq(out->calls, 1);
	/* A socket the resolver could not watch leaves c-ares to time its query out. */
	cr_assert(out->err == 0 || out->err == -ENXIO ||
		  (sweep && (out->err == -ENOMEM || out->err == -ETIMEDOUT)),
		  "%s: %d", name, out->err);
	return 0;
}

/* One resolver's life: a name (then from the cache), a name that does not exist, a lookup
 * cancelled and its name asked again while its resolution goes on, one left pending at the
 * free (its done never runs). */
static void nomem_scenario(void *arg, bool sweep)
{
	struct fixture *fx = arg;
	struct resolver_query *q = NULL;
	struct res r;
	int rc;

	fx->r = NULL;
	rc = resolver_new(fx->base, &fx->cfg, &fx->r);
	if (rc) {
		cr_assert(sweep && rc == -ENOMEM, "resolver_new: %d", rc);
		cr_assert_null(fx->r);
		return;
	}
	if (nomem_lookup(fx, "both.test", &r, sweep) == 0 && !sweep)
		cr_assert(r.err == 0 && r.n == 5);
	(void)nomem_lookup(fx, "both.test", &r, sweep);
	if (nomem_lookup(fx, "gone.test", &r, sweep) == 0 && !sweep)
		cr_assert_eq(r.err, -ENXIO);
	memset(&r, 0, sizeof(r));
	rc = resolver_lookup(fx->r, "short.test", 0, on_res, &r, &q);
	cr_assert(rc == 0 || (sweep && rc == -ENOMEM));
	resolver_cancel(q);
	(void)nomem_lookup(fx, "short.test", &r, sweep);
	memset(&r, 0, sizeof(r));
	q = NULL;
	rc = resolver_lookup(fx->r, "v6only.test", 0, on_res, &r, &q);
	cr_assert(rc == 0 || (sweep && rc == -ENOMEM));
	resolver_free(fx->r);
	fx->r = NULL;
	cr_assert_eq(r.calls, 0, "a lookup pending at the free called back");
}

Test(resolver, each_allocation_refused_in_turn)
{
	struct fixture fx;

	/* libevent and c-ares allocate through the project's allocator, as twinstack runs them:
	 * c-ares' own allocations are refused in turn too. */
	cr_assert_eq(evmem_install(), 0);
	cr_assert_eq(libmem_install(), 0);

	fx_start(&fx, TABLE);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, &fx, 10,
								      1000));
	fx_stop(&fx);
}

/* ---- libevent's allocations refused in turn, a silent server (failalloc.h, evmem.h) ---- */

/* c-ares's timer may find no room in libevent's timer heap, which grows when its count
 * reaches 8, 16, ... pending timers. Each run has a fresh loop with `pad` far timers of the
 * test's already pending, so that the resolver's timer meets the heap's growth. The server
 * never answers: the lookup must end with -ETIMEDOUT (or, a refusal, -ENOMEM), never wait for
 * good. */
struct silent_fx {
	int pad;
};

static void silent_scenario(void *arg, bool sweep)
{
	const struct silent_fx *o = arg;
	struct event *pads[16];
	struct fixture fx;
	struct resolver_query *q = NULL;
	struct res r = { 0 };
	int rc;

	failalloc_hold(true); /* the loop, the server, the padding */
	fx_start(&fx, TABLE);
	fx.cfg.timeout_ms = 100;
	failalloc_hold(false);
	failalloc_pad_timers(fx.base, pads, o->pad);
	if ((rc = resolver_new(fx.base, &fx.cfg, &fx.r)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "resolver_new: %d", rc);
		goto out;
	}
	if ((rc = resolver_lookup(fx.r, "silent.test", 0, on_res, &r, &q)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "lookup: %d", rc);
	} else {
		cr_assert(run_until(fx.base, &r.calls, 2000), "the lookup never ended (pad %d)",
			  o->pad);
		cr_assert(r.err == -ETIMEDOUT || (sweep && r.err == -ENOMEM), "%d", r.err);
	}
	resolver_free(fx.r);
out:
	failalloc_unpad(pads, o->pad);
	failalloc_hold(true);
	fx.r = NULL;
	fx_stop(&fx);
	failalloc_hold(false);
}

Test(resolver, silent_with_libevent_allocations_refused_in_turn)
{
	static const int pads[] = { 0, 8 };

	cr_assert_eq(evmem_install(), 0);
	cr_assert_eq(libmem_install(), 0);
	for (size_t i = 0; i < sizeof(pads) / sizeof(pads[0]); i++) {
		struct silent_fx o = { pads[i] };

		cr_log_info("pad %d: %ld allocations refused in turn", pads[i],
			    failalloc_sweep(silent_scenario, &o, 3, 300));
	}
}
