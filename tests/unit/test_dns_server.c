/* test_dns_server.c — dns/server.c, the proxy's own resolver front, against a fake upstream on
 * 127.0.0.1 (fakedns.h) driven by the test's loop: hosts, rules (server, refuse, empty), the
 * AAAA policy, the cache (a second query never reaches the upstream), coalescing (two clients,
 * one upstream query), SERVFAIL when the upstream is gone, malformed and header-error queries,
 * the size limit (TC), cancellation, and the pending bound; a forged answer whose name reads
 * a TTL's bytes (answered, never cached) and an ask without memory (counted), each query
 * ending in one outcome; a client that leaves before its answer (cancelled, or a DNS-over-TCP
 * connection reset mid-query) is an outcome of its own.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "core/budget.h"
#include "core/config.h"
#include "core/dns_msg.h"
#include "dispatch/dns_tcp.h"
#include "dispatch/stream.h"
#include "dns/fakeip.h"
#include "dns/server.h"
#include "core/evmem.h"
#include "failalloc.h"
#include "fakedns.h"
#include "testutil.h"

static const struct rr table[] = {
	{ .name = "a.test", .ttl = 300, .a = { "192.0.2.1" }, .aaaa = { "2001:db8::1" } },
	{ .name = "big.test", .ttl = 300,
	  .a = { "192.0.2.11", "192.0.2.12", "192.0.2.13", "192.0.2.14" } },
	{ .name = "slow.test", .silent = true },
	{ .name = "corp.example", .ttl = 60, .a = { "10.1.1.1" } },
	{ .name = "forged.test", .ttl = 60, .a = { "192.0.2.21", "192.0.2.22" },
	  .ttl_pointer = true },
	{ 0 },
};

struct fix {
	struct event_base *base;
	struct budget *b;
	struct ts_config cfg;
	struct dns_server *s;
	struct dns up, up2;
};

/* Run base for about ms milliseconds. */
static void loop_ms(struct event_base *base, int ms)
{
	struct timeval tv = { 0, ms * 1000 };

	failalloc_hold(true); /* the test's exit timer, not the code under test */
	cr_assert_eq(event_base_loopexit(base, &tv), 0);
	failalloc_hold(false);
	event_base_dispatch(base);
}

struct got {
	int calls;
	uint8_t msg[2048];
	size_t len;
};

static void on_reply(void *arg, const uint8_t *msg, size_t len)
{
	struct got *g = arg;

	g->calls++;
	g->len = len;
	if (len)
		memcpy(g->msg, msg, len < sizeof(g->msg) ? len : sizeof(g->msg));
}

/* A client query: id, RD, one question for name/type, optionally an OPT of udp_size. */
static size_t mkq(uint8_t *b, uint16_t id, const char *name, uint16_t type, uint16_t udp_size)
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
	n += 4;
	if (udp_size) {
		tu_put16(b + 10, 1);
		b[n] = 0;
		tu_put16(b + n + 1, 41);
		tu_put16(b + n + 3, udp_size);
		memset(b + n + 5, 0, 6);
		n += 11;
	}
	return n;
}

static void setup(struct fix *f, const char *dns_json_fmt)
{
	struct budget_limits l;
	char json[2048], err[256];

	memset(f, 0, sizeof(*f));
	cr_assert_not_null(f->base = event_base_new());
	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(budget_new(&l, &f->b), 0);
	dns_start(&f->up, f->base, table);
	dns_start(&f->up2, f->base, table);
	snprintf(json, sizeof(json), dns_json_fmt, f->up.port, f->up2.port);
	config_init(&f->cfg);
	cr_assert_eq(config_load_string(json, &f->cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(dns_server_new(f->base, &f->cfg, f->b, &f->s), 0);
}

static void teardown(struct fix *f)
{
	dns_server_free(f->s);
	config_fini(&f->cfg);
	dns_stop(&f->up);
	dns_stop(&f->up2);
	budget_free(f->b);
	event_base_free(f->base);
}

static const char *basic =
	"{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"u\",\"address\":\"udp://127.0.0.1:%u\"},"
	"{\"tag\":\"corp\",\"address\":\"127.0.0.1:%u\"}],"
	"\"rules\":[{\"domain_suffix\":[\"corp.example\"],\"server\":\"corp\"},"
	"{\"domain\":[\"ads.test\"],\"action\":\"refuse\"},"
	"{\"domain_keyword\":[\"tracker\"],\"action\":\"empty\"}],"
	"\"hosts\":{\"printer.lan\":[\"10.0.0.9\",\"fd00::9\"]},\"cache\":{\"size\":64}}}";

/* Ask and run the loop until the reply came (bounded). */
static void ask(struct fix *f, const uint8_t *q, size_t n, bool tcp, struct got *g)
{
	struct dns_ticket *t;

	cr_assert_eq(dns_server_query(f->s, q, n, tcp, 1472, on_reply, g, &t), 0);
	for (int i = 0; i < 300 && g->calls == 0; i++)
		loop_ms(f->base, 10);
	cr_assert_eq(g->calls, 1, "one reply");
}

static uint16_t rcode(const struct got *g)
{
	return tu_get16(g->msg + 2) & 0xf;
}

static uint16_t ancount(const struct got *g)
{
	return tu_get16(g->msg + 6);
}

Test(dns_server, upstream_answer_then_cache_hit)
{
	struct fix f;
	struct got g1 = { 0 }, g2 = { 0 };
	struct dns_server_stats st;
	uint8_t q[512];
	size_t n;

	setup(&f, basic);
	n = mkq(q, 0x1234, "A.Test", DNS_T_A, 0);
	ask(&f, q, n, false, &g1);
	cr_assert_eq(tu_get16(g1.msg), 0x1234, "the client's id");
	cr_assert_eq(rcode(&g1), 0);
	cr_assert_eq(ancount(&g1), 1);
	cr_assert_eq(memcmp(g1.msg + 12, q + 12, n - 12), 0, "the client's question bytes and case");
	cr_assert_eq(f.up.queries, 1);
	n = mkq(q, 0x4321, "a.test", DNS_T_A, 0);
	ask(&f, q, n, false, &g2);
	cr_assert_eq(tu_get16(g2.msg), 0x4321);
	cr_assert_eq(ancount(&g2), 1);
	cr_assert_eq(f.up.queries, 1, "the second answer came from the cache");
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.queries, 2);
	cr_assert_eq(st.answered_upstream, 1);
	cr_assert_eq(st.answered_cache, 1);
	cr_assert_eq(st.cache_hits, 1);
	cr_assert_eq(st.cache_entries, 1);
	cr_assert_eq(st.pending, 0);
	teardown(&f);
}

Test(dns_server, hosts_rules_and_policies)
{
	struct fix f;
	uint8_t q[512];
	size_t n;
	struct dns_server_stats st;

	setup(&f, basic);
	struct got g = { 0 };
	n = mkq(q, 1, "Printer.LAN", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(ancount(&g), 1);
	cr_assert_eq(memcmp(g.msg + g.len - 4, "\x0a\x00\x00\x09", 4), 0, "10.0.0.9");
	memset(&g, 0, sizeof(g));
	n = mkq(q, 2, "printer.lan", DNS_T_AAAA, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(ancount(&g), 1);
	memset(&g, 0, sizeof(g));
	n = mkq(q, 3, "printer.lan", DNS_T_HTTPS, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(rcode(&g), 0);
	cr_assert_eq(ancount(&g), 0, "other types of a hosts name: empty");
	memset(&g, 0, sizeof(g));
	n = mkq(q, 4, "ads.test", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(rcode(&g), DNS_R_REFUSED);
	memset(&g, 0, sizeof(g));
	n = mkq(q, 5, "x.tracker.test", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(rcode(&g), 0);
	cr_assert_eq(ancount(&g), 0);
	memset(&g, 0, sizeof(g));
	n = mkq(q, 6, "www.corp.example", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(f.up.queries, 0, "nothing reached the final server");
	cr_assert_eq(f.up2.queries, 1, "the rule's server was asked");
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.answered_hosts, 3);
	cr_assert_eq(st.answered_refused, 1);
	cr_assert_eq(st.answered_empty, 1);
	cr_assert_eq(st.answered_upstream, 1, "www.corp.example: NXDOMAIN from its server");
	teardown(&f);
}

Test(dns_server, ipv6_empty)
{
	struct fix f;
	struct got g = { 0 };
	uint8_t q[512];
	size_t n;

	setup(&f, "{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"u\",\"address\":"
		  "\"127.0.0.1:%u\"},{\"tag\":\"v\",\"address\":\"127.0.0.1:%u\"}],\"ipv6\":\"empty\"}}");
	n = mkq(q, 7, "a.test", DNS_T_AAAA, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(rcode(&g), 0);
	cr_assert_eq(ancount(&g), 0);
	cr_assert_eq(f.up.queries, 0, "never asked upstream");
	teardown(&f);
}

Test(dns_server, coalescing_and_cancel)
{
	struct fix f;
	struct got g1 = { 0 }, g2 = { 0 }, g3 = { 0 };
	struct dns_ticket *t1, *t2, *t3;
	struct dns_server_stats st;
	uint8_t q[512];
	size_t n;

	setup(&f, basic);
	n = mkq(q, 10, "a.test", DNS_T_A, 0);
	cr_assert_eq(dns_server_query(f.s, q, n, false, 1472, on_reply, &g1, &t1), 0);
	tu_put16(q, 11);
	cr_assert_eq(dns_server_query(f.s, q, n, false, 1472, on_reply, &g2, &t2), 0);
	tu_put16(q, 12);
	cr_assert_eq(dns_server_query(f.s, q, n, false, 1472, on_reply, &g3, &t3), 0);
	cr_assert_not_null(t1);
	cr_assert_not_null(t2);
	dns_server_cancel(f.s, t3);
	for (int i = 0; i < 300 && (g1.calls == 0 || g2.calls == 0); i++)
		loop_ms(f.base, 10);
	cr_assert_eq(g1.calls, 1);
	cr_assert_eq(g2.calls, 1);
	cr_assert_eq(g3.calls, 0, "a cancelled query gets nothing");
	cr_assert_eq(tu_get16(g1.msg), 10);
	cr_assert_eq(tu_get16(g2.msg), 11);
	cr_assert_eq(f.up.queries, 1, "three clients, one upstream query");
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.coalesced, 2);
	cr_assert_eq(st.pending, 0);
	cr_assert_eq(st.answered_upstream, 2);
	cr_assert_eq(st.drops_client_gone, 1, "the cancelled one");
	teardown(&f);
}

Test(dns_server, servfail_and_bad_queries)
{
	struct fix f;
	struct got g = { 0 };
	struct dns_server_stats st;
	struct dns_ticket *t;
	uint8_t q[512];
	size_t n;

	setup(&f, basic);
	/* The upstream's socket goes: the ask fails (refused) and the client gets SERVFAIL. */
	event_del(f.up.ev);
	close(f.up.fd);
	f.up.fd = socket(AF_INET, SOCK_DGRAM, 0); /* for dns_stop */
	n = mkq(q, 20, "gone.test", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(rcode(&g), DNS_R_SERVFAIL);
	/* Malformed: dropped (a call with nothing to send). */
	memset(&g, 0, sizeof(g));
	cr_assert_eq(dns_server_query(f.s, q, 7, false, 1472, on_reply, &g, &t), 0);
	cr_assert_eq(g.calls, 1);
	cr_assert_eq(g.len, 0);
	/* Two questions: FORMERR, header only. */
	memset(&g, 0, sizeof(g));
	tu_put16(q + 4, 2);
	cr_assert_eq(dns_server_query(f.s, q, n, false, 1472, on_reply, &g, &t), 0);
	cr_assert_eq(g.len, DNS_HDR_LEN);
	cr_assert_eq(rcode(&g), DNS_R_FORMERR);
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.answered_servfail, 1);
	cr_assert_eq(st.drops_malformed, 1);
	teardown(&f);
}

Test(dns_server, udp_limit_truncates)
{
	struct fix f;
	struct got g = { 0 };
	uint8_t q[512];
	size_t n;

	setup(&f, basic);
	/* 4 A records fit 512 bytes easily: make the path MTU the limit instead. */
	n = mkq(q, 30, "big.test", DNS_T_A, 0);
	struct dns_ticket *t;
	cr_assert_eq(dns_server_query(f.s, q, n, false, 60, on_reply, &g, &t), 0);
	for (int i = 0; i < 300 && g.calls == 0; i++)
		loop_ms(f.base, 10);
	cr_assert_eq(g.calls, 1);
	cr_assert(g.len <= 60, "within the path's limit: %zu bytes", g.len);
	cr_assert(tu_get16(g.msg + 2) & DNS_F_TC, "truncated, so the client asks over TCP");
	cr_assert_eq(ancount(&g), 0);
	/* Over TCP the whole answer. */
	memset(&g, 0, sizeof(g));
	ask(&f, q, n, true, &g);
	cr_assert_eq(ancount(&g), 4);
	cr_assert_eq(tu_get16(g.msg + 2) & DNS_F_TC, 0);
	teardown(&f);
}

Test(dns_server, free_with_waiting_queries_tells_their_owners)
{
	struct fix f;
	struct got g = { 0 };
	struct dns_ticket *t;
	uint8_t q[512];
	size_t n;

	setup(&f, basic);
	n = mkq(q, 40, "slow.test", DNS_T_A, 0);
	cr_assert_eq(dns_server_query(f.s, q, n, false, 1472, on_reply, &g, &t), 0);
	cr_assert_not_null(t);
	loop_ms(f.base, 20);
	dns_server_free(f.s);
	f.s = NULL;
	cr_assert_eq(g.calls, 1);
	cr_assert_eq(g.len, 0);
	teardown(&f);
}

/* ---- fake-IP ---- */

static const char *fake_cfg =
	"{\"tun\":{\"address6\":\"fd00:7f::1/64\"},\"dns\":{\"hijack\":true,\"servers\":["
	"{\"tag\":\"u\",\"address\":\"udp://127.0.0.1:%u\"},"
	"{\"tag\":\"corp\",\"address\":\"127.0.0.1:%u\"}],"
	"\"rules\":[{\"domain_suffix\":[\"corp.example\"],\"server\":\"corp\"}],"
	"\"fakeip\":{\"exclude\":{\"domain\":[\"a.test\"]}}}}";

/* The answer's one address (A or AAAA, the last RR of the reply). */
static void last_addr(const struct got *g, int family, uint8_t out[16])
{
	memset(out, 0, 16);
	memcpy(out, g->msg + g->len - (family == 4 ? 4 : 16), family == 4 ? 4 : 16);
}

Test(dns_server, fakeip_answers_and_names)
{
	struct fix f;
	struct got g = { 0 }, g2 = { 0 };
	struct dns_server_stats st;
	uint8_t q[512], a4[16], a6[16], other[16] = { 198, 19, 200, 200 };
	char name[256];
	size_t n;

	setup(&f, fake_cfg);
	n = mkq(q, 1, "www.Example.org", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(ancount(&g), 1);
	cr_assert_eq(tu_get32(g.msg + g.len - 10), 1, "TTL 1 s");
	last_addr(&g, 4, a4);
	cr_assert(a4[0] == 198 && a4[1] == 19, "from 198.19.0.0/16");
	n = mkq(q, 2, "www.example.org", DNS_T_A, 0);
	ask(&f, q, n, false, &g2);
	cr_assert_eq(memcmp(g2.msg + g2.len - 4, a4, 4), 0, "the same name, the same address");
	cr_assert_eq(dns_server_fake_name(f.s, 4, a4, name, sizeof(name)), 15);
	cr_assert_str_eq(name, "www.example.org", "stored in lower case");
	cr_assert_eq(dns_server_fake_name(f.s, 4, other, name, sizeof(name)), 0,
		     "in the range, mapped to nothing: refuse");
	cr_assert_eq(dns_server_fake_name(f.s, 4, (const uint8_t[16]){ 192, 0, 2, 1 }, name,
					  sizeof(name)), -ENOENT, "not a fake address");
	memset(&g, 0, sizeof(g));
	n = mkq(q, 3, "www.example.org", DNS_T_AAAA, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(ancount(&g), 1);
	last_addr(&g, 6, a6);
	cr_assert(a6[0] == 0xfd && a6[8] & 0x80, "from the upper half of fd00:7f::/64");
	memset(&g, 0, sizeof(g));
	n = mkq(q, 4, "www.example.org", DNS_T_HTTPS, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(rcode(&g), 0);
	cr_assert_eq(ancount(&g), 0, "HTTPS of a fake name: empty");
	cr_assert_eq(f.up.queries, 0, "nothing above reached an upstream");
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.answered_fake, 3);
	cr_assert_eq(st.fake_mappings, 2, "one name, one address per family");
	teardown(&f);
}

/* dns.fakeip.persist: the minute's save writes from a thread of its own and comes back whole
 * (dns_server_fake_restore of a second server reads the same names); a save that cannot write
 * is reported when joined, and the next start saves again. */
Test(dns_server, fakeip_saved_by_a_thread_and_read_back)
{
	char dir[] = "/tmp/test_dns_fake_XXXXXX", fmt[1024], path[256], name[256];
	struct fakeip_load_stats ls;
	struct fix f, f2;
	struct got g = { 0 };
	uint8_t q[512], a4[16];
	size_t n;

	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/fake.txt", dir);
	snprintf(fmt, sizeof(fmt),
		 "{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"u\",\"address\":"
		 "\"udp://127.0.0.1:%%u\"},{\"tag\":\"v\",\"address\":\"127.0.0.1:%%u\"}],"
		 "\"fakeip\":{\"persist\":\"%s\"}}}", path);
	setup(&f, fmt);
	cr_assert_eq(dns_server_fake_save_start(f.s), 0, "nothing to save yet");
	cr_assert_eq(dns_server_fake_save_wait(f.s), 0);
	cr_assert_eq(access(path, F_OK), -1, "no file for no mappings");
	n = mkq(q, 1, "saved.example", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	last_addr(&g, 4, a4);
	cr_assert_eq(dns_server_fake_save_start(f.s), 0);
	cr_assert_eq(dns_server_fake_save_wait(f.s), 0);
	cr_assert_eq(access(path, R_OK), 0, "written");
	setup(&f2, fmt);
	cr_assert_eq(dns_server_fake_restore(f2.s, &ls), 0);
	cr_assert_eq(dns_server_fake_name(f2.s, 4, a4, name, sizeof(name)), 13);
	cr_assert_str_eq(name, "saved.example");
	/* A directory in the file's place: the write fails, reported when joined. */
	unlink(path);
	cr_assert_eq(mkdir(path, 0700), 0);
	memset(&g, 0, sizeof(g));
	n = mkq(q, 2, "another.example", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(dns_server_fake_save_start(f.s), 0);
	cr_assert_lt(dns_server_fake_save_wait(f.s), 0);
	rmdir(path);
	/* ... and the next start writes again (nothing new since, yet not saved). */
	cr_assert_eq(dns_server_fake_save_start(f.s), 0);
	cr_assert_eq(dns_server_fake_save_wait(f.s), 0);
	cr_assert_eq(access(path, R_OK), 0, "written on the retry");
	teardown(&f2);
	teardown(&f);
	unlink(path);
	rmdir(dir);
}

Test(dns_server, fakeip_exclusions_rules_and_real_lookups)
{
	struct fix f;
	struct got g = { 0 };
	struct dns_ticket *t;
	uint8_t q[512];
	size_t n;

	setup(&f, fake_cfg);
	n = mkq(q, 1, "a.test", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(memcmp(g.msg + g.len - 4, "\xc0\x00\x02\x01", 4), 0, "excluded: the real 192.0.2.1");
	memset(&g, 0, sizeof(g));
	n = mkq(q, 2, "captive.apple.com", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(f.up.queries, 2, "a built-in exclusion goes upstream (NXDOMAIN there)");
	cr_assert_eq(rcode(&g), DNS_R_NXDOMAIN);
	memset(&g, 0, sizeof(g));
	n = mkq(q, 3, "corp.example", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(memcmp(g.msg + g.len - 4, "\x0a\x01\x01\x01", 4), 0,
		     "a name a rule sends to a server gets that server's real answer");
	cr_assert_eq(f.up2.queries, 1);
	/* The proxy's own lookups never get fake answers. */
	memset(&g, 0, sizeof(g));
	n = mkq(q, 4, "big.test", DNS_T_A, 0);
	cr_assert_eq(dns_server_query_real(f.s, q, n, on_reply, &g, &t), 0);
	for (int i = 0; i < 300 && g.calls == 0; i++)
		loop_ms(f.base, 10);
	cr_assert_eq(ancount(&g), 4, "the upstream's four real addresses");
	teardown(&f);
}

Test(dns_server, fakeip_without_ipv6_and_with_ipv6_empty)
{
	struct fix f;
	struct got g = { 0 };
	uint8_t q[512];
	size_t n;

	/* No tun.address6: AAAA of a fake name is empty. */
	setup(&f, "{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"u\",\"address\":"
		  "\"127.0.0.1:%u\"},{\"tag\":\"v\",\"address\":\"127.0.0.1:%u\"}],\"fakeip\":{}}}");
	n = mkq(q, 1, "www.example.org", DNS_T_AAAA, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(rcode(&g), 0);
	cr_assert_eq(ancount(&g), 0);
	teardown(&f);
	/* ipv6 "empty" wins over an IPv6 fake range. */
	memset(&g, 0, sizeof(g));
	setup(&f, "{\"tun\":{\"address6\":\"fd00:7f::1/64\"},\"dns\":{\"hijack\":true,"
		  "\"servers\":[{\"tag\":\"u\",\"address\":\"127.0.0.1:%u\"},{\"tag\":\"v\","
		  "\"address\":\"127.0.0.1:%u\"}],\"ipv6\":\"empty\",\"fakeip\":{}}}");
	ask(&f, q, n, false, &g);
	cr_assert_eq(ancount(&g), 0);
	struct dns_server_stats st;
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.fake_mappings, 0, "no IPv6 mapping was made");
	teardown(&f);
}

/* Reload: new rules are taken when the servers, cache and fake pool are the running ones. */
Test(dns_server, reconfigure_takes_rules_but_not_servers)
{
	struct fix f;
	struct ts_config c2, c3;
	struct got g = { 0 };
	char json[2048], err[256];
	uint8_t q[512];
	size_t n;

	setup(&f, basic);
	snprintf(json, sizeof(json),
		 "{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"u\",\"address\":\"udp://127.0.0.1:%u\"},"
		 "{\"tag\":\"corp\",\"address\":\"127.0.0.1:%u\"}],"
		 "\"rules\":[{\"domain\":[\"a.test\"],\"action\":\"refuse\"}],\"cache\":{\"size\":64}}}",
		 f.up.port, f.up2.port);
	config_init(&c2);
	cr_assert_eq(config_load_string(json, &c2, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(dns_server_reconfigure(f.s, &c2), 0);
	cr_assert_eq(dns_server_config(f.s), &c2);
	n = mkq(q, 1, "a.test", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(rcode(&g), DNS_R_REFUSED, "the new rule");
	memset(&g, 0, sizeof(g));
	n = mkq(q, 2, "printer.lan", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(ancount(&g), 0, "the old hosts are gone with the old configuration");
	snprintf(json, sizeof(json),
		 "{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"u\",\"address\":\"udp://127.0.0.1:%u\"}]}}",
		 f.up.port);
	config_init(&c3);
	cr_assert_eq(config_load_string(json, &c3, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(dns_server_reconfigure(f.s, &c3), -EBUSY, "other servers: a restart");
	cr_assert_eq(dns_server_config(f.s), &c2, "nothing changed");
	teardown(&f);
	config_fini(&c2);
	config_fini(&c3);
}

/* ---- every query ends in one outcome ---- */

/* The answers and drops together (a client that left included): with nothing waiting
 * (pending 0), each query received is exactly one of them. */
static uint64_t outcomes(const struct dns_server_stats *st)
{
	return st->answered_hosts + st->answered_fake + st->answered_cache +
	       st->answered_upstream + st->answered_refused + st->answered_empty +
	       st->answered_servfail + st->drops_malformed + st->drops_busy +
	       st->drops_no_memory + st->drops_client_gone;
}

/* libevent's allocator, made to fail on demand: an upstream ask's timer is the last thing it
 * allocates, so a failing one is an ask refused for want of memory (-ENOMEM). */
static bool ev_fail;

static void *ev_malloc(size_t n)
{
	return ev_fail ? NULL : malloc(n);
}

static void *ev_realloc(void *p, size_t n)
{
	return ev_fail ? NULL : realloc(p, n);
}

Test(dns_server, an_ask_without_memory_is_counted)
{
	struct dns_server_stats st;
	struct dns_ticket *t = NULL;
	struct got g = { 0 };
	struct fix f;
	uint8_t q[512];
	size_t n;

	event_set_mem_functions(ev_malloc, ev_realloc, free);
	setup(&f, basic);
	n = mkq(q, 50, "a.test", DNS_T_A, 0);
	ev_fail = true;
	cr_assert_eq(dns_server_query(f.s, q, n, false, 1472, on_reply, &g, &t), -ENOMEM);
	ev_fail = false;
	cr_assert_null(t);
	cr_assert_eq(g.calls, 0, "nothing will be called");
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.queries, 1);
	cr_assert_eq(st.drops_no_memory, 1);
	cr_assert_eq(st.drops_busy, 0, "not the budget's refusal");
	cr_assert_eq(st.pending, 0);
	cr_assert_eq(outcomes(&st), st.queries, "%llu queries, %llu outcomes",
		     (unsigned long long)st.queries, (unsigned long long)outcomes(&st));
	/* Nothing of it stays: the same question is asked and answered afterwards. */
	ask(&f, q, n, false, &g);
	cr_assert_eq(ancount(&g), 1);
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(outcomes(&st), st.queries);
	teardown(&f);
}

/* A forged answer, a name of which points into a TTL's bytes (fakedns.h, ttl_pointer): the
 * client gets it as it came, but the cache never keeps it (aged or capped, that name would read
 * as another one): each query goes upstream, counted. */
Test(dns_server, a_forged_answer_whose_name_reads_a_ttl_is_never_cached)
{
	struct dns_server_stats st;
	struct got g = { 0 };
	struct fix f;
	uint8_t q[512];
	size_t n;

	setup(&f, "{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"u\",\"address\":"
		  "\"127.0.0.1:%u\"},{\"tag\":\"v\",\"address\":\"127.0.0.1:%u\"}],"
		  "\"cache\":{\"size\":64,\"max_ttl_s\":86400}}}");
	n = mkq(q, 60, "forged.test", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	cr_assert_eq(rcode(&g), DNS_R_NOERROR);
	cr_assert_eq(ancount(&g), 2, "the answer as it came");
	cr_assert_eq(f.up.queries, 1);
	memset(&g, 0, sizeof(g));
	tu_put16(q, 61);
	ask(&f, q, n, false, &g);
	cr_assert_eq(ancount(&g), 2);
	cr_assert_eq(f.up.queries, 2, "asked upstream again: nothing was cached");
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.cache_not_stored_name_in_ttl, 2);
	cr_assert_eq(st.cache_entries, 0);
	cr_assert_eq(st.cache_hits, 0);
	cr_assert_eq(st.cache_misses, 2);
	cr_assert_eq(st.answered_cache, 0);
	cr_assert_eq(st.answered_upstream, 2);
	cr_assert_eq(outcomes(&st), st.queries);
	/* An ordinary answer is still cached. */
	memset(&g, 0, sizeof(g));
	n = mkq(q, 62, "a.test", DNS_T_A, 0);
	ask(&f, q, n, false, &g);
	memset(&g, 0, sizeof(g));
	tu_put16(q, 63);
	ask(&f, q, n, false, &g);
	cr_assert_eq(ancount(&g), 1);
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.answered_cache, 1);
	cr_assert_eq(st.cache_not_stored_name_in_ttl, 2);
	teardown(&f);
}

/* ---- a client that leaves before its answer ---- */

/* The identity /stats promises: every query received is answered, dropped (a client that left
 * included) or still waiting. */
static void identity_holds(const struct dns_server_stats *st)
{
	cr_assert_eq(st->queries, outcomes(st) + st->pending,
		     "%llu queries, %llu outcomes, %llu pending", (unsigned long long)st->queries,
		     (unsigned long long)outcomes(st), (unsigned long long)st->pending);
}

/* Two clients wait on one flight (slow.test is never answered); each leaves in turn: each is
 * one outcome of its own, and the one still waiting is pending until it leaves too. */
Test(dns_server, a_client_that_leaves_mid_query_is_counted)
{
	struct dns_server_stats st;
	struct got g1 = { 0 }, g2 = { 0 };
	struct dns_ticket *t1, *t2;
	struct fix f;
	uint8_t q[512];
	size_t n;

	setup(&f, basic);
	n = mkq(q, 70, "slow.test", DNS_T_A, 0);
	cr_assert_eq(dns_server_query(f.s, q, n, false, 1472, on_reply, &g1, &t1), 0);
	tu_put16(q, 71);
	cr_assert_eq(dns_server_query(f.s, q, n, false, 1472, on_reply, &g2, &t2), 0);
	cr_assert_not_null(t1);
	cr_assert_not_null(t2);
	loop_ms(f.base, 20);
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.pending, 2);
	identity_holds(&st);
	dns_server_cancel(f.s, t1);
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.pending, 1);
	identity_holds(&st);
	cr_assert_eq(st.drops_client_gone, 1);
	dns_server_cancel(f.s, t2);
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.pending, 0);
	identity_holds(&st);
	cr_assert_eq(st.drops_client_gone, 2);
	cr_assert_eq(g1.calls + g2.calls, 0, "a client that left gets nothing");
	teardown(&f);
}

struct tcp_client {
	int done;
};

static void tcp_done(void *arg)
{
	((struct tcp_client *)arg)->done++;
}

/* A DNS-over-TCP client asks through a connection to the real resolver, then resets the
 * connection while its query waits for the upstream: the connection cancels the query, and
 * the query ends in exactly one outcome. */
Test(dns_server, a_tcp_client_that_resets_mid_query_is_counted)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct linger lg = { 1, 0 };
	socklen_t sl = sizeof(sa);
	struct dns_tcp_counters ctr;
	struct dns_tcp_resolver res;
	struct dns_tcp_params p = { .resolver = &res, .idle_ms = 5000, .counters = &ctr };
	struct dns_server_stats st;
	struct tcp_client cl = { 0 };
	struct stream *s;
	struct fix f;
	uint8_t q[514];
	size_t n;
	int l, app, acc;

	setup(&f, basic);
	memset(&ctr, 0, sizeof(ctr));
	dns_tcp_resolver_server(&res, f.s);
	p.budget = f.b;
	cr_assert_geq(l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), 0);
	cr_assert_eq(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(l, 1), 0);
	cr_assert_eq(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
	cr_assert_geq(app = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), 0);
	cr_assert_eq(connect(app, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_geq(acc = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK), 0);
	close(l);
	cr_assert_eq(stream_sock_new(f.base, acc, &s), 0);
	cr_assert_eq(dns_tcp_new(f.base, s, &p, tcp_done, &cl, NULL), 0);
	n = mkq(q + 2, 80, "slow.test", DNS_T_A, 0);
	tu_put16(q, (uint16_t)n);
	cr_assert_eq(send(app, q, n + 2, MSG_NOSIGNAL), (ssize_t)(n + 2));
	for (int i = 0; i < 200 && (dns_server_get_stats(f.s, &st), st.pending == 0); i++)
		loop_ms(f.base, 10);
	cr_assert_eq(st.pending, 1, "the query waits for the upstream");
	cr_assert_eq(st.queries_tcp, 1);
	identity_holds(&st);
	cr_assert_eq(setsockopt(app, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
	close(app);
	for (int i = 0; i < 200 && !cl.done; i++)
		loop_ms(f.base, 10);
	cr_assert_eq(cl.done, 1, "the connection ended");
	cr_assert_eq(ctr_get(&ctr.closed_reset), 1);
	dns_server_get_stats(f.s, &st);
	cr_assert_eq(st.pending, 0);
	identity_holds(&st);
	cr_assert_eq(st.drops_client_gone, 1);
	teardown(&f);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

struct nomem {
	struct event_base *base;
	struct dns up, up2;
	const char *cfg_fmt;
};

static const struct {
	const char *name;
	uint16_t type;
	bool tcp;
} nomem_asks[] = {
	{ "a.test", DNS_T_A, false },       { "a.test", DNS_T_A, false }, /* the cache */
	{ "a.test", DNS_T_AAAA, true },     { "printer.lan", DNS_T_A, false },
	{ "ads.test", DNS_T_A, false },     { "x.tracker.test", DNS_T_A, false },
	{ "corp.example", DNS_T_A, false }, { "www.example.org", DNS_T_A, false },
	{ "www.example.org", DNS_T_AAAA, false }, { "www.example.org", DNS_T_HTTPS, true },
};

/* One server's life: every ask gets exactly one reply, or is refused at once (-ENOBUFS,
 * -ENOMEM: nothing called); one ask left pending at the free gets its one reply then (or had
 * it at once); every budget byte comes back. */
static void nomem_scenario(void *arg, bool sweep)
{
	struct nomem *nm = arg;
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
	if ((rc = budget_new(&l, &b)) != 0) {
		cr_assert(sweep && rc == -ENOMEM);
		return;
	}
	snprintf(json, sizeof(json), nm->cfg_fmt, nm->up.port, nm->up2.port);
	if ((rc = config_load_string(json, &cfg, err, sizeof(err))) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "%s", err);
		goto out;
	}
	if ((rc = dns_server_new(nm->base, &cfg, b, &s)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "dns_server_new: %d", rc);
		goto out;
	}
	for (size_t i = 0; i < sizeof(nomem_asks) / sizeof(nomem_asks[0]); i++) {
		struct got g = { 0 };

		n = mkq(q, (uint16_t)(i + 1), nomem_asks[i].name, nomem_asks[i].type, 0);
		rc = dns_server_query(s, q, n, nomem_asks[i].tcp, 1472, on_reply, &g, &t);
		if (rc) {
			cr_assert(sweep && (rc == -ENOBUFS || rc == -ENOMEM), "ask %zu: %d", i, rc);
			cr_assert_eq(g.calls, 0);
			continue;
		}
		for (int k = 0; k < 300 && g.calls == 0; k++)
			loop_ms(nm->base, 10);
		loop_ms(nm->base, 1); /* a second reply would show here */
		cr_assert_eq(g.calls, 1, "ask %zu: one reply", i);
		cr_assert(sweep || g.len > 0, "ask %zu dropped", i);
	}
	(void)dns_server_fake_name(s, 4, fake, name, sizeof(name));
	n = mkq(q, 99, "slow.test", DNS_T_A, 0);
	rc = dns_server_query(s, q, n, false, 1472, on_reply, &pend, &t);
	cr_assert(rc == 0 || (sweep && (rc == -ENOBUFS || rc == -ENOMEM)));
	dns_server_free(s);
	cr_assert_eq(pend.calls, rc == 0 ? 1 : 0, "the pending ask's one reply");
	budget_get_stats(b, &bs);
	cr_assert_eq(bs.buffer_bytes_in_use, 0, "budget bytes kept");
out:
	config_fini(&cfg);
	budget_free(b);
}

Test(dns_server, each_allocation_refused_in_turn)
{
	struct nomem nm;

	/* libevent allocates through the project's allocator, as twinstack runs it. */
	cr_assert_eq(evmem_install(), 0);

	cr_assert_not_null(nm.base = event_base_new());
	dns_start(&nm.up, nm.base, table);
	dns_start(&nm.up2, nm.base, table);
	nm.cfg_fmt = basic;
	cr_log_info("hosts, rules, cache: %ld allocations refused in turn",
		    failalloc_sweep(nomem_scenario, &nm, 10, 2000));
	nm.cfg_fmt = fake_cfg;
	cr_log_info("fake-IP: %ld allocations refused in turn",
		    failalloc_sweep(nomem_scenario, &nm, 10, 2000));
	dns_stop(&nm.up);
	dns_stop(&nm.up2);
	event_base_free(nm.base);
}

/* ---- fake-IP's persistence, every allocation refused in turn ---- */

#define PERSIST_NAMES 6

struct persist {
	struct event_base *base;
	struct dns up, up2;
	char dir[40], path[80], fmt[1024];
};

static int file_lines(const char *path)
{
	FILE *fp = fopen(path, "r");
	int n = 0, c;

	if (!fp)
		return -1;
	while ((c = fgetc(fp)) != EOF)
		n += c == '\n';
	fclose(fp);
	return n;
}

/* A server with dns.fakeip.persist: names mapped (each answered with its fake address, or
 * SERVFAIL when its mapping found no memory), a save by the writer thread, the save at the
 * free; a second server reads the file back: each line loaded or counted as refused for
 * memory, and each name loaded stands for its address again. A save that found no memory
 * leaves no file (there was none), and the read of no file loads nothing. */
static void persist_scenario(void *arg, bool sweep)
{
	struct persist *p = arg;
	struct budget_limits l;
	struct budget_stats bs;
	struct budget *b = NULL;
	struct dns_server *s = NULL;
	struct fakeip_load_stats ls;
	struct ts_config cfg;
	uint8_t q[512], addr[PERSIST_NAMES][16];
	bool mapped[PERSIST_NAMES] = { false };
	char json[1024], err[TS_ERRLEN], name[256], want[32];
	int rc, lines, n_mapped = 0;

	unlink(p->path);
	config_init(&cfg);
	budget_limits_profile(&l, BUDGET_PROFILE_DESKTOP);
	if ((rc = budget_new(&l, &b)) != 0) {
		cr_assert(sweep && rc == -ENOMEM);
		return;
	}
	snprintf(json, sizeof(json), p->fmt, p->up.port, p->up2.port);
	if ((rc = config_load_string(json, &cfg, err, sizeof(err))) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "%s", err);
		goto out;
	}
	if ((rc = dns_server_new(p->base, &cfg, b, &s)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "dns_server_new: %d", rc);
		goto out;
	}
	for (int i = 0; i < PERSIST_NAMES; i++) {
		struct dns_ticket *t;
		struct got g = { 0 };

		snprintf(want, sizeof(want), "n%d.saved.example", i);
		rc = dns_server_query(s, q, mkq(q, (uint16_t)(i + 1), want, DNS_T_A, 0), false, 1472,
				      on_reply, &g, &t);
		if (rc != 0) {
			cr_assert(sweep && (rc == -ENOMEM || rc == -ENOBUFS), "ask %d: %d", i, rc);
			continue;
		}
		for (int k = 0; k < 300 && g.calls == 0; k++)
			loop_ms(p->base, 10);
		cr_assert_eq(g.calls, 1, "ask %d: one reply", i);
		if (DNS_RCODE(tu_get16(g.msg + 2)) == DNS_R_SERVFAIL) {
			cr_assert(sweep, "ask %d: SERVFAIL", i);
			continue;
		}
		cr_assert_eq(ancount(&g), 1, "ask %d", i);
		last_addr(&g, 4, addr[i]);
		mapped[i] = true;
		n_mapped++;
	}
	cr_assert(sweep || n_mapped == PERSIST_NAMES);
	rc = dns_server_fake_save_start(s);
	cr_assert(rc == 0 || (sweep && rc == -ENOMEM), "save_start: %d", rc);
	cr_assert_eq(dns_server_fake_save_wait(s), 0);
	dns_server_free(s); /* saves again, at once */
	s = NULL;
	lines = file_lines(p->path);
	cr_assert(lines == n_mapped || (sweep && lines == -1), "%d lines for %d names", lines,
		  n_mapped);
	if ((rc = dns_server_new(p->base, &cfg, b, &s)) != 0) {
		cr_assert(sweep && rc == -ENOMEM, "dns_server_new: %d", rc);
		goto out;
	}
	rc = dns_server_fake_restore(s, &ls);
	if (rc != 0) {
		cr_assert(sweep && rc == -ENOMEM, "restore: %d", rc);
	} else {
		cr_assert_eq(ls.bad + ls.outside + ls.duplicates + ls.full, 0);
		cr_assert_eq(ls.loaded + ls.no_memory, (uint64_t)(lines < 0 ? 0 : lines),
			     "a line neither loaded nor counted");
		cr_assert(sweep || ls.loaded == PERSIST_NAMES);
		for (int i = 0; i < PERSIST_NAMES; i++) {
			if (!mapped[i])
				continue;
			snprintf(want, sizeof(want), "n%d.saved.example", i);
			rc = dns_server_fake_name(s, 4, addr[i], name, sizeof(name));
			cr_assert(rc == 0 || (rc == (int)strlen(want) && !strcmp(name, want)),
				  "%s: %d %s", want, rc, name);
			cr_assert(sweep || lines < 0 || rc > 0, "%s not read back", want);
		}
	}
	dns_server_free(s);
	s = NULL;
	budget_get_stats(b, &bs);
	cr_assert_eq(bs.buffer_bytes_in_use, 0, "budget bytes kept");
out:
	dns_server_free(s);
	config_fini(&cfg);
	budget_free(b);
}

Test(dns_server, fakeip_persistence_each_allocation_refused_in_turn)
{
	struct persist p;

	memset(&p, 0, sizeof(p));
	strcpy(p.dir, "/tmp/test_dns_persist_XXXXXX");
	cr_assert_not_null(mkdtemp(p.dir));
	snprintf(p.path, sizeof(p.path), "%s/fake.txt", p.dir);
	snprintf(p.fmt, sizeof(p.fmt),
		 "{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"u\",\"address\":"
		 "\"udp://127.0.0.1:%%u\"},{\"tag\":\"v\",\"address\":\"127.0.0.1:%%u\"}],"
		 "\"fakeip\":{\"persist\":\"%s\"}}}", p.path);
	cr_assert_not_null(p.base = event_base_new());
	dns_start(&p.up, p.base, table);
	dns_start(&p.up2, p.base, table);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(persist_scenario, &p, 10,
								      2000));
	dns_stop(&p.up);
	dns_stop(&p.up2);
	event_base_free(p.base);
	unlink(p.path);
	rmdir(p.dir);
}
