/* test_nomem.c — every allocation of the project's own code refused in turn (failalloc.h):
 * the configuration loader on each example of docs/config.md, the resolver, and the UDP path
 * with destinations by name. For each n the nth allocation fails and the scenario runs from
 * start to teardown; the sweep ends at the first n the scenario never reached.
 *
 * What must hold at every n: nothing crashes; a call that fails says so (-ENOMEM or its own
 * error) and leaves nothing behind; a lookup's callback runs at most once; a datagram either
 * gets its reply or is counted as a drop; every budget unit comes back; in the ASan tree,
 * LeakSanitizer finds nothing after each scenario.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/dns_msg.h"
#include "dispatch/udp.h"
#include "dispatch/udp_int.h"
#include "dns/server.h"
#include "failalloc.h"
#include "fakedns.h"
#include "outbound/resolver.h"
#include "testutil.h"
#include "udptest.h"

/* A sweep that has not ended by this many allocations is itself a failure. */
#define SWEEP_MAX 20000

/* ---- the configuration loader: each json block of docs/config.md ---- */

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	cr_assert_not_null(f, "%s", path);
	cr_assert_eq(fseek(f, 0, SEEK_END), 0);
	n = ftell(f);
	cr_assert_gt(n, 0);
	rewind(f);
	buf = malloc((size_t)n + 1);
	cr_assert_not_null(buf);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	buf[n] = '\0';
	*len = (size_t)n;
	return buf;
}

/* The blocks that open with a line "```json" alone, up to the next "```". */
static int json_blocks(char *doc, char **blocks, int cap)
{
	int n = 0;
	char *p = doc;

	while ((p = strstr(p, "\n```json\n")) && n < cap) {
		char *start = p + strlen("\n```json\n");
		char *end = strstr(start, "\n```");

		cr_assert_not_null(end);
		*end = '\0';
		blocks[n++] = start;
		p = end + 1;
	}
	return n;
}

Test(nomem, config_loader_every_example)
{
	char *blocks[16], err[TS_ERRLEN];
	size_t len;
	char *doc = read_file(TS_SOURCE_DIR "/docs/config.md", &len);
	int nb = json_blocks(doc, blocks, 16);

	cr_assert_geq(nb, 2, "the complete and the desktop example");
	for (int b = 0; b < nb; b++) {
		struct ts_config cfg;
		long n;

		/* Unarmed, it loads. */
		cr_assert_eq(config_load_string(blocks[b], &cfg, err, sizeof(err)), 0,
			     "block %d: %s", b, err);
		config_fini(&cfg);
		for (n = 1; n < SWEEP_MAX; n++) {
			int rc;

			failalloc_arm(n);
			rc = config_load_string(blocks[b], &cfg, err, sizeof(err));
			failalloc_arm(0);
			if (rc == 0)
				cr_assert_not(failalloc_fired(), "block %d n %ld: a refused allocation "
					      "still loaded", b, n);
			else
				cr_assert_eq(rc, -ENOMEM, "block %d n %ld: rc %d (%s)", b, n, rc, err);
			config_fini(&cfg);
			CHECK_LEAKS();
			if (!failalloc_fired())
				break;
		}
		cr_assert_lt(n, SWEEP_MAX);
		cr_assert_gt(n, 3, "block %d: the loader allocates (is the wrapping linked?)", b);
		cr_log_info("config block %d: %ld allocations refused in turn", b, n - 1);
	}
	free(doc);
}

/* ---- the resolver ---- */

static const struct rr TABLE[] = {
	{ .name = "both.test", .ttl = 30, .a = { "192.0.2.1", "192.0.2.2" },
	  .aaaa = { "2001:db8::1" } },
	{ .name = "gone.test", .nx = true },
	{ .name = NULL },
};

struct res {
	int calls;
	int err;
	size_t n;
};

static void on_res(void *arg, int err, const struct netaddr *addrs, size_t n)
{
	struct res *r = arg;

	r->calls++;
	r->err = err;
	r->n = n;
	cr_assert(err != 0 || (n > 0 && addrs));
	cr_assert(err == 0 || n == 0);
}

/* Start a lookup; run the loop until its callback ran (bounded). Returns the lookup's rc. */
static int lookup_run(struct event_base *base, struct resolver *r, const char *name,
		      struct res *out)
{
	struct resolver_query *q = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = resolver_lookup(r, name, 0, on_res, out, &q);
	if (rc < 0) {
		cr_assert_eq(out->calls, 0, "a refused lookup called back");
		/* As a caller's teardown does with the handle it kept: harmless (NULL). */
		resolver_cancel(q);
		return rc;
	}
	cr_assert(UT_PUMP_UNTIL(base, out->calls > 0, 3000), "no result for %s", name);
	cr_assert_eq(out->calls, 1);
	return 0;
}

/* One resolver life: two names (one twice: the cache), a lookup cancelled and its name asked
 * again while its resolution runs on, then freed with nothing left. */
static void resolver_scenario(struct event_base *base, struct dns *dns, bool sweep)
{
	struct resolver_config rc = { .servers = dns->servers, .timeout_ms = 300, .tries = 1 };
	struct resolver *r = NULL;
	struct resolver_query *q = NULL;
	struct res a, b, c;
	int err;

	err = resolver_new(base, &rc, &r);
	if (err) {
		cr_assert(sweep && err == -ENOMEM, "resolver_new: %d", err);
		cr_assert_null(r);
		return;
	}
	err = lookup_run(base, r, "both.test", &a);
	cr_assert(err == 0 || (sweep && err == -ENOMEM), "lookup: %d", err);
	if (err == 0 && !sweep)
		cr_assert(a.err == 0 && a.n == 3);
	/* A socket the resolver could not watch leaves c-ares to time its query out. */
	if (err == 0 && a.err)
		cr_assert(sweep && (a.err == -ENOMEM || a.err == -ETIMEDOUT), "result: %d", a.err);
	err = lookup_run(base, r, "both.test", &a); /* cached, or asked again */
	cr_assert(err == 0 || (sweep && err == -ENOMEM));
	err = lookup_run(base, r, "gone.test", &b);
	cr_assert(err == 0 || (sweep && err == -ENOMEM));
	if (err == 0 && !sweep)
		cr_assert_neq(b.err, 0);
	/* Asked, cancelled at once, asked again: the second joins (or restarts) it. */
	memset(&c, 0, sizeof(c));
	err = resolver_lookup(r, "again.test", 0, on_res, &c, &q);
	if (err == 0) {
		resolver_cancel(q);
		err = lookup_run(base, r, "again.test", &c);
		cr_assert(err == 0 || (sweep && err == -ENOMEM));
	} else {
		cr_assert(sweep && err == -ENOMEM);
		cr_assert_eq(c.calls, 0);
		resolver_cancel(q);
	}
	/* One left pending at the free: its callback must not run. */
	memset(&c, 0, sizeof(c));
	q = NULL;
	err = resolver_lookup(r, "pending.test", 0, on_res, &c, &q);
	cr_assert(err == 0 || (sweep && err == -ENOMEM));
	resolver_free(r);
	cr_assert_eq(c.calls, 0, "a lookup pending at the free called back");
}

Test(nomem, resolver)
{
	struct event_base *base = event_base_new();
	struct dns dns;
	long n;

	cr_assert_not_null(base);
	dns_start(&dns, base, TABLE);
	resolver_scenario(base, &dns, false);
	for (n = 1; n < SWEEP_MAX; n++) {
		failalloc_arm(n);
		resolver_scenario(base, &dns, true);
		failalloc_arm(0);
		CHECK_LEAKS();
		if (!failalloc_fired())
			break;
	}
	cr_assert_lt(n, SWEEP_MAX);
	cr_assert_gt(n, 10, "the scenario allocates (is the wrapping linked?)");
	cr_log_info("resolver: %ld allocations refused in turn", n - 1);
	dns_stop(&dns);
	event_base_free(base);
}

/* ---- the UDP path with destinations by name ---- */

struct env {
	struct event_base *base;
	struct dns dns;
	int echo_fd;
	uint16_t echo_port;
	struct event *echo_ev;
	int echoed;
	int replies;
};

static const struct rr NAMES[] = {
	{ .name = "echo4.test", .ttl = 60, .a = { "127.0.0.1" } },
	{ .name = "nx.test", .nx = true },
	{ 0 },
};

static void echo_cb(evutil_socket_t fd, short what, void *arg)
{
	struct env *e = arg;
	uint8_t buf[2048];
	struct sockaddr_storage peer;
	socklen_t plen = sizeof(peer);
	ssize_t n = recvfrom(fd, buf, sizeof(buf), 0, (struct sockaddr *)&peer, &plen);

	if (n < 0)
		return;
	e->echoed++;
	cr_assert_eq(sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&peer, plen), n);
}

static int fake_tx(void *arg, const uint8_t *pkt, size_t len)
{
	((struct env *)arg)->replies++;
	return 0;
}

/* 127.0.0.8 is "echo4.test", 127.0.0.6 "nx.test"; others have no name. */
static const char *namer(void *arg, int family, const uint8_t *dst, uint16_t dport)
{
	if (family != 4 || dst[0] != 127 || dst[1] || dst[2])
		return NULL;
	return dst[3] == 8 ? "echo4.test" : dst[3] == 6 ? "nx.test" : NULL;
}

static uint64_t drops(const struct udp_path *up)
{
	struct udp_path_stats st = ut_stats(up);
	uint64_t sum = 0;

	for (int i = 0; i < UDP_DROP_MAX; i++)
		sum += st.drops[i];
	return sum;
}

/* A datagram from the client 10.0.0.9:sport to dst at port, as if later_ms had passed (the
 * retry of a name that failed waits a second). */
static void send_later(struct udp_path *up, uint16_t sport, const char *dst, uint16_t port,
		       int later_ms)
{
	struct tu_spec sp;
	uint8_t pkt[256];
	size_t n;

	tu_spec_udp(&sp, "10.0.0.9", sport, dst, port);
	sp.payload = (const uint8_t *)"x";
	sp.payload_len = 1;
	n = tu_build(&sp, pkt, sizeof(pkt));
	udp_path_input(up, pkt, n, ts_now_ns() + MS(later_ms));
	udp_path_batch_end(up);
}

/* Datagrams from the client: to a name, to a name that does not resolve, by address, and to
 * the failed name twice more, each after its retry wait; each gets its echo back or is
 * counted as a drop. Then the path goes, with every unit back. */
static void udp_scenario(struct env *e, bool sweep)
{
	static const char *json = "{\"outbounds\":[{\"tag\":\"direct\",\"type\":\"direct\"}]}";
	struct resolver_config rc = { .servers = e->dns.servers, .timeout_ms = 300, .tries = 1 };
	static const char *dst[] = { "127.0.0.8", "127.0.0.6", "127.0.0.1", "127.0.0.6",
				     "127.0.0.6" };
	char err[TS_ERRLEN];
	struct ts_config cfg;
	struct resolver *res = NULL;
	struct budget *b = NULL;
	struct udp_path *up = NULL;
	int rc_;

	e->echoed = e->replies = 0;
	rc_ = config_load_string(json, &cfg, err, sizeof(err));
	if (rc_) {
		cr_assert(sweep && rc_ == -ENOMEM, "%s", err);
		goto out_cfg;
	}
	rc_ = resolver_new(e->base, &rc, &res);
	if (rc_) {
		cr_assert(sweep && rc_ == -ENOMEM);
		goto out_cfg;
	}
	cfg.outbounds[0].resolver = res;
	rc_ = budget_new(&cfg.budget, &b);
	if (rc_) {
		cr_assert(sweep && rc_ == -ENOMEM);
		goto out_res;
	}
	rc_ = udp_path_new(e->base, &cfg, b, fake_tx, e, &up);
	if (rc_) {
		cr_assert(sweep && (rc_ == -ENOMEM || rc_ == -ENOBUFS), "udp_path_new: %d", rc_);
		goto out_budget;
	}
	rc_ = udp_path_set_uptrains(up, true);
	cr_assert(rc_ == 0 || (sweep && (rc_ == -ENOMEM || rc_ == -ENOBUFS)), "set_uptrains: %d",
		  rc_);
	udp_path_set_namer(up, namer, e);
	for (int i = 0; i < 5; i++) {
		uint64_t before = drops(up);
		int got = e->replies;

		/* The last two: from the nx datagram's source (its session), 2 and 4 s later. */
		send_later(up, (uint16_t)(5000 + (i < 3 ? i : 1)), dst[i], e->echo_port,
			   i < 3 ? 0 : 2000 * (i - 2));
		/* nx.test: its failure is a drop (resolve_failed). */
		cr_assert(UT_PUMP_UNTIL(e->base, e->replies > got || drops(up) > before, 3000),
			  "datagram %d to %s: neither echoed nor counted as a drop", i, dst[i]);
		if (!sweep)
			cr_assert_eq(e->replies, got + (dst[i][8] == '6' ? 0 : 1), "datagram %d", i);
	}
	ut_path_free_checked(up, b);
out_budget:
	budget_free(b);
out_res:
	resolver_free(res);
out_cfg:
	config_fini(&cfg);
}

Test(nomem, udp_path_with_names)
{
	struct env e;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001) };
	socklen_t len = sizeof(sin);
	long n;

	memset(&e, 0, sizeof(e));
	e.base = event_base_new();
	cr_assert_not_null(e.base);
	dns_start(&e.dns, e.base, NAMES);
	e.echo_fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	cr_assert_geq(e.echo_fd, 0);
	cr_assert_eq(bind(e.echo_fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	cr_assert_eq(getsockname(e.echo_fd, (struct sockaddr *)&sin, &len), 0);
	e.echo_port = ntohs(sin.sin_port);
	e.echo_ev = event_new(e.base, e.echo_fd, EV_READ | EV_PERSIST, echo_cb, &e);
	cr_assert_eq(event_add(e.echo_ev, NULL), 0);

	udp_scenario(&e, false);
	for (n = 1; n < SWEEP_MAX; n++) {
		failalloc_arm(n);
		udp_scenario(&e, true);
		failalloc_arm(0);
		CHECK_LEAKS();
		if (!failalloc_fired())
			break;
	}
	cr_assert_lt(n, SWEEP_MAX);
	cr_assert_gt(n, 10, "the scenario allocates (is the wrapping linked?)");
	cr_log_info("udp path: %ld allocations refused in turn", n - 1);
	event_free(e.echo_ev);
	close(e.echo_fd);
	dns_stop(&e.dns);
	event_base_free(e.base);
}

/* ---- the proxy's own DNS resolver front ---- */

static const struct rr DNS_TABLE[] = {
	{ .name = "a.test", .ttl = 300, .a = { "192.0.2.1" }, .aaaa = { "2001:db8::1" } },
	{ .name = "corp.example", .ttl = 60, .a = { "10.1.1.1" } },
	{ 0 },
};

struct got {
	int calls;
	size_t len;
};

static void on_reply(void *arg, const uint8_t *msg, size_t len)
{
	struct got *g = arg;

	g->calls++;
	g->len = len;
}

/* A query: id, RD, one question for name/type. */
static size_t mkq(uint8_t *b, uint16_t id, const char *name, uint16_t type)
{
	size_t n = 12;
	const char *p = name;

	memset(b, 0, 12);
	tu_put16(b, id);
	tu_put16(b + 2, 0x0100);
	tu_put16(b + 4, 1);
	while (*p) {
		const char *dot = strchr(p, '.');
		size_t l = dot ? (size_t)(dot - p) : strlen(p);

		b[n++] = (uint8_t)l;
		memcpy(b + n, p, l);
		n += l;
		p += l + (dot ? 1 : 0);
	}
	b[n++] = 0;
	tu_put16(b + n, type);
	tu_put16(b + n + 2, 1);
	return n + 4;
}

static const char *DNS_CFG[] = {
	/* servers, rules, hosts, the cache */
	"{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"u\",\"address\":\"udp://127.0.0.1:%u\"},"
	"{\"tag\":\"corp\",\"address\":\"127.0.0.1:%u\"}],"
	"\"rules\":[{\"domain_suffix\":[\"corp.example\"],\"server\":\"corp\"},"
	"{\"domain\":[\"ads.test\"],\"action\":\"refuse\"},"
	"{\"domain_keyword\":[\"tracker\"],\"action\":\"empty\"}],"
	"\"hosts\":{\"printer.lan\":[\"10.0.0.9\",\"fd00::9\"]},\"cache\":{\"size\":64}}}",
	/* fake-IP, one name excluded */
	"{\"tun\":{\"address6\":\"fd00:7f::1/64\"},\"dns\":{\"hijack\":true,\"servers\":["
	"{\"tag\":\"u\",\"address\":\"udp://127.0.0.1:%u\"},"
	"{\"tag\":\"corp\",\"address\":\"127.0.0.1:%u\"}],"
	"\"rules\":[{\"domain_suffix\":[\"corp.example\"],\"server\":\"corp\"}],"
	"\"fakeip\":{\"exclude\":{\"domain\":[\"a.test\"]}}}}",
};

static const struct {
	const char *name;
	uint16_t type;
	bool tcp;
} DNS_ASKS[] = {
	{ "a.test", DNS_T_A, false },       { "a.test", DNS_T_A, false }, /* the cache */
	{ "a.test", DNS_T_AAAA, true },     { "printer.lan", DNS_T_A, false },
	{ "ads.test", DNS_T_A, false },     { "x.tracker.test", DNS_T_A, false },
	{ "corp.example", DNS_T_A, false }, { "www.example.org", DNS_T_A, false },
	{ "www.example.org", DNS_T_AAAA, false }, { "www.example.org", DNS_T_HTTPS, true },
};

/* One server's life under config c: every ask gets exactly one reply, or is refused at once
 * (-ENOBUFS / -ENOMEM, no reply); one ask is left pending at the free (its one reply comes
 * then, or came at once); every budget byte comes back. */
static void dns_scenario(struct event_base *base, struct dns *up, struct dns *up2, int c,
			 bool sweep)
{
	struct budget_limits l;
	struct budget_stats bs;
	struct budget *b = NULL;
	struct dns_server *s = NULL;
	struct ts_config cfg;
	struct dns_ticket *t;
	struct got pend = { 0 };
	char json[2048], err[TS_ERRLEN], name[256];
	uint8_t q[512], fake[16] = { 198, 18, 0, 9 };
	size_t n;
	int rc;

	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	rc = budget_new(&l, &b);
	if (rc) {
		cr_assert(sweep && rc == -ENOMEM);
		return;
	}
	snprintf(json, sizeof(json), DNS_CFG[c], up->port, up2->port);
	rc = config_load_string(json, &cfg, err, sizeof(err));
	if (rc) {
		cr_assert(sweep && rc == -ENOMEM, "%s", err);
		goto out;
	}
	rc = dns_server_new(base, &cfg, b, &s);
	if (rc) {
		cr_assert(sweep && rc == -ENOMEM, "dns_server_new: %d", rc);
		cr_assert_null(s);
		goto out;
	}
	for (size_t i = 0; i < sizeof(DNS_ASKS) / sizeof(DNS_ASKS[0]); i++) {
		struct got g = { 0 };

		n = mkq(q, (uint16_t)(i + 1), DNS_ASKS[i].name, DNS_ASKS[i].type);
		rc = dns_server_query(s, q, n, DNS_ASKS[i].tcp, 1472, on_reply, &g, &t);
		if (rc) {
			cr_assert(sweep && (rc == -ENOBUFS || rc == -ENOMEM), "ask %zu: %d", i, rc);
			cr_assert_eq(g.calls, 0);
			continue;
		}
		cr_assert(UT_PUMP_UNTIL(base, g.calls > 0, 3000), "ask %zu: no reply", i);
		ut_pump_for(base, 1); /* a second reply would show here */
		cr_assert_eq(g.calls, 1, "ask %zu", i);
		cr_assert(sweep || g.len > 0, "ask %zu dropped", i);
	}
	(void)dns_server_fake_name(s, 4, fake, name, sizeof(name));
	n = mkq(q, 99, "pending.test", DNS_T_A);
	rc = dns_server_query(s, q, n, false, 1472, on_reply, &pend, &t);
	cr_assert(rc == 0 || (sweep && (rc == -ENOBUFS || rc == -ENOMEM)));
	dns_server_free(s);
	/* Its reply came at once (fake-IP, or a refusal), or from the free (len 0). */
	cr_assert_eq(pend.calls, rc == 0 ? 1 : 0, "the pending ask's one reply");
	budget_get_stats(b, &bs);
	cr_assert_eq(bs.buffer_bytes_in_use, 0, "budget bytes kept");
out:
	config_fini(&cfg);
	budget_free(b);
}

Test(nomem, dns_server)
{
	struct event_base *base = event_base_new();
	struct dns up, up2;

	cr_assert_not_null(base);
	dns_start(&up, base, DNS_TABLE);
	dns_start(&up2, base, DNS_TABLE);
	for (int c = 0; c < 2; c++) {
		long n;

		dns_scenario(base, &up, &up2, c, false);
		for (n = 1; n < SWEEP_MAX; n++) {
			failalloc_arm(n);
			dns_scenario(base, &up, &up2, c, true);
			failalloc_arm(0);
			CHECK_LEAKS();
			if (!failalloc_fired())
				break;
		}
		cr_assert_lt(n, SWEEP_MAX);
		cr_assert_gt(n, 10, "the scenario allocates (is the wrapping linked?)");
		cr_log_info("dns server, config %d: %ld allocations refused in turn", c, n - 1);
	}
	dns_stop(&up);
	dns_stop(&up2);
	event_base_free(base);
}
