/* test_route.c — rule matching and first-match outbound selection (dispatch/route.c). */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"
#include "dispatch/route.h"
#include "failalloc.h"
#include "testutil.h"

static struct ts_config cfg;

static void load(const char *json)
{
	char err[TS_ERRLEN];
	config_init(&cfg);
	cr_assert_eq(config_load_string(json, &cfg, err, sizeof(err)), 0, "%s", err);
}

static struct flow_key key(const char *dst, uint16_t port, uint8_t proto)
{
	struct flow_key k;
	memset(&k, 0, sizeof(k));
	k.family = (uint8_t)tu_addr(k.dst, dst);
	tu_addr(k.src, k.family == 4 ? "10.0.0.9" : "fd00::9");
	k.proto = proto;
	k.sport_be = htons(40000);
	k.dport_be = htons(port);
	return k;
}

static uint32_t sel(const char *dst, uint16_t port, uint8_t proto)
{
	struct flow_key k = key(dst, port, proto);
	return route_select(&cfg.route, &k, NULL);
}

static uint32_t seln(const char *dst, const char *name)
{
	struct flow_key k = key(dst, 443, IPPROTO_TCP);
	return route_select(&cfg.route, &k, name);
}

Test(route, first_match_wins_and_final)
{
	load("{\"outbounds\":[{\"tag\":\"d\",\"type\":\"direct\"},{\"tag\":\"r\",\"type\":\"reject\"},"
	     "{\"tag\":\"d2\",\"type\":\"direct\"}],"
	     "\"route\":{\"rules\":["
	     "{\"cidr\":[\"10.200.1.0/24\",\"2001:db8::/32\"],\"outbound\":\"r\"},"
	     "{\"port\":[53,\"8000-8080\"],\"network\":\"udp\",\"outbound\":\"d2\"},"
	     "{\"cidr\":[\"10.0.0.0/8\"],\"port\":[443],\"outbound\":\"d2\"}],"
	     "\"final\":\"d\"}}");
	cr_assert_eq(sel("10.200.1.2", 80, IPPROTO_TCP), 1);
	cr_assert_eq(sel("10.200.2.2", 80, IPPROTO_TCP), 0, "outside the /24: final");
	cr_assert_eq(sel("2001:db8::5", 80, IPPROTO_TCP), 1);
	cr_assert_eq(sel("2001:db9::5", 80, IPPROTO_TCP), 0);
	cr_assert_eq(sel("1.1.1.1", 53, IPPROTO_UDP), 2);
	cr_assert_eq(sel("1.1.1.1", 53, IPPROTO_TCP), 0, "network matcher");
	cr_assert_eq(sel("1.1.1.1", 8080, IPPROTO_UDP), 2, "range upper bound");
	cr_assert_eq(sel("1.1.1.1", 8081, IPPROTO_UDP), 0);
	cr_assert_eq(sel("10.9.9.9", 443, IPPROTO_TCP), 2, "cidr AND port");
	cr_assert_eq(sel("10.9.9.9", 444, IPPROTO_TCP), 0);
	cr_assert_eq(sel("10.200.1.9", 443, IPPROTO_TCP), 1, "earlier rule first");
	config_fini(&cfg);
}

Test(route, no_rules_is_final)
{
	load("{\"outbounds\":[{\"tag\":\"a\",\"type\":\"direct\"},{\"tag\":\"b\",\"type\":\"reject\"}],"
	     "\"route\":{\"final\":\"b\"}}");
	cr_assert_eq(sel("1.2.3.4", 1, IPPROTO_TCP), 1);
	config_fini(&cfg);
}

Test(route, name_matchers)
{
	load("{\"outbounds\":[{\"tag\":\"d\",\"type\":\"direct\"},{\"tag\":\"r\",\"type\":\"reject\"},"
	     "{\"tag\":\"d2\",\"type\":\"direct\"}],"
	     "\"route\":{\"rules\":["
	     "{\"domain\":[\"exact.example\"],\"domain_keyword\":[\"ads\"],\"outbound\":\"r\"},"
	     "{\"domain_suffix\":[\"corp.example\"],\"cidr\":[\"10.0.0.0/8\"],\"outbound\":\"d2\"},"
	     "{\"domain_regex\":[\"^cdn[0-9]+\\\\.\"],\"outbound\":\"r\"}],"
	     "\"final\":\"d\"}}");
	cr_assert(cfg.route.has_names);
	cr_assert_eq(seln("192.0.2.1", "exact.example"), 1);
	cr_assert_eq(seln("192.0.2.1", "ads.exact.example"), 1, "the keyword, in the same set");
	cr_assert_eq(seln("192.0.2.1", "a.exact.example"), 0);
	cr_assert_eq(seln("10.1.2.3", "Host.Corp.Example."), 2, "suffix AND cidr");
	cr_assert_eq(seln("192.0.2.1", "host.corp.example"), 0, "the cidr does not match");
	cr_assert_eq(seln("192.0.2.1", "cdn42.example.net"), 1);
	cr_assert_eq(seln("10.1.2.3", NULL), 0, "no name: no rule with a name matcher matches");
	config_fini(&cfg);
}

Test(route, name_matchers_refuse_bad_entries_naming_the_path)
{
	char err[TS_ERRLEN];

	config_init(&cfg);
	cr_assert_eq(config_load_string("{\"route\":{\"rules\":[{\"domain_suffix\":[\"ok.test\","
					"\"bad name\"],\"outbound\":\"direct\"}]}}",
					&cfg, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "$.route.rules[0].domain_suffix[1]"), "%s", err);
	config_fini(&cfg);
	config_init(&cfg);
	cr_assert_eq(config_load_string("{\"route\":{\"rules\":[{\"domain_regex\":[\"(open\"],"
					"\"outbound\":\"direct\"}]}}",
					&cfg, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "$.route.rules[0].domain_regex[0]"), "%s", err);
	config_fini(&cfg);
}

/* A rule with rule_set matches a name in any of its sets or in its own names; its other
 * matchers still AND. */
Test(route, rule_set_matcher)
{
	char dir[] = "/tmp/test_route_XXXXXX", ads[300], cn[300], json[1024];
	FILE *f;

	cr_assert_not_null(mkdtemp(dir));
	snprintf(ads, sizeof(ads), "%s/ads.txt", dir);
	snprintf(cn, sizeof(cn), "%s/cn.txt", dir);
	cr_assert_not_null(f = fopen(ads, "w"));
	fputs("0.0.0.0 ads.example\n0.0.0.0 pixel.example\n", f);
	fclose(f);
	cr_assert_not_null(f = fopen(cn, "w"));
	fputs("cn.example\nfull:only.example\n", f);
	fclose(f);
	snprintf(json, sizeof(json),
		 "{\"outbounds\":[{\"tag\":\"d\",\"type\":\"direct\"},{\"tag\":\"r\",\"type\":\"reject\"},"
		 "{\"tag\":\"d2\",\"type\":\"direct\"}],"
		 "\"rule_sets\":[{\"tag\":\"ads\",\"format\":\"hosts\",\"path\":\"%s\"},"
		 "{\"tag\":\"cn\",\"format\":\"v2fly\",\"path\":\"%s\"}],"
		 "\"route\":{\"rules\":["
		 "{\"rule_set\":[\"ads\"],\"domain\":[\"own.example\"],\"outbound\":\"r\"},"
		 "{\"rule_set\":[\"cn\"],\"network\":\"tcp\",\"cidr\":[\"10.0.0.0/8\"],"
		 "\"outbound\":\"d2\"}],"
		 "\"final\":\"d\"}}",
		 ads, cn);
	load(json);
	cr_assert(cfg.route.has_names);
	cr_assert_eq(seln("192.0.2.1", "ads.example"), 1, "in the hosts set");
	cr_assert_eq(seln("192.0.2.1", "Pixel.Example."), 1);
	cr_assert_eq(seln("192.0.2.1", "x.ads.example"), 0, "hosts entries are exact");
	cr_assert_eq(seln("192.0.2.1", "own.example"), 1, "the rule's own names still match");
	cr_assert_eq(seln("10.1.2.3", "www.cn.example"), 2, "suffix AND cidr AND tcp");
	cr_assert_eq(seln("192.0.2.1", "www.cn.example"), 0, "the cidr does not match");
	cr_assert_eq(seln("10.1.2.3", "only.example"), 2);
	cr_assert_eq(seln("10.1.2.3", "a.only.example"), 0, "full: is exact");
	cr_assert_eq(seln("10.1.2.3", NULL), 0, "no name: a rule_set rule does not match");
	struct flow_key k = key("10.1.2.3", 443, IPPROTO_UDP);
	cr_assert_eq(route_select(&cfg.route, &k, "www.cn.example"), 0, "network still ANDs");
	config_fini(&cfg);
	unlink(ads);
	unlink(cn);
	rmdir(dir);
}

static bool matters(const char *dst, uint16_t port, uint8_t proto)
{
	struct flow_key k = key(dst, port, proto);
	return route_name_matters(&cfg.route, &k);
}

/* Whether a flow is worth sniffing: only when a rule with names could match it before a rule
 * without names decides it. */
Test(route, name_matters_only_where_a_name_rule_comes_first)
{
	load("{\"outbounds\":[{\"tag\":\"d\",\"type\":\"direct\"},{\"tag\":\"b\",\"type\":\"reject\"}],"
	     "\"route\":{\"rules\":["
	     "{\"port\":[53],\"outbound\":\"b\"},"
	     "{\"cidr\":[\"10.1.0.0/16\"],\"outbound\":\"d\"},"
	     "{\"domain_suffix\":[\"ads.test\"],\"port\":[443],\"network\":\"tcp\",\"outbound\":\"b\"},"
	     "{\"domain\":[\"x.test\"],\"cidr\":[\"192.0.2.0/24\"],\"outbound\":\"b\"}],"
	     "\"final\":\"d\"}}");
	cr_assert(matters("10.2.0.1", 443, IPPROTO_TCP), "the suffix rule covers it");
	cr_assert_not(matters("10.2.0.1", 443, IPPROTO_UDP), "the suffix rule is TCP only");
	cr_assert_not(matters("10.2.0.1", 53, IPPROTO_TCP), "port 53 is decided first");
	cr_assert_not(matters("10.1.0.1", 443, IPPROTO_TCP), "the CIDR rule decides first");
	cr_assert_not(matters("10.2.0.1", 80, IPPROTO_TCP), "no name rule covers port 80");
	cr_assert(matters("192.0.2.7", 80, IPPROTO_UDP), "the last rule covers that network");
	config_fini(&cfg);

	load("{\"route\":{\"rules\":[{\"port\":[1],\"outbound\":\"direct\"}]}}");
	cr_assert_not(matters("10.2.0.1", 443, IPPROTO_TCP), "no rule has names");
	config_fini(&cfg);

	/* A name rule that leads where the address does changes nothing. */
	load("{\"outbounds\":[{\"tag\":\"d\",\"type\":\"direct\"},{\"tag\":\"p\",\"type\":\"reject\"}],"
	     "\"route\":{\"rules\":[{\"domain_suffix\":[\"cn.test\"],\"outbound\":\"d\"},"
	     "{\"cidr\":[\"1.2.3.0/24\"],\"outbound\":\"d\"}],\"final\":\"p\"}}");
	cr_assert_not(matters("1.2.3.4", 22, IPPROTO_TCP), "every name leads to d, as the address");
	cr_assert(matters("1.2.4.4", 22, IPPROTO_TCP), "the name would lead to d, the address to p");
	config_fini(&cfg);
}

/* ---- every allocation refused in turn (failalloc.h) ---- */

struct nomem {
	char dir[32];
	char json[2048];
};

static const struct {
	const char *dst, *name;
	uint32_t out;
} nomem_cases[] = {
	{ "192.0.2.1", "ads.example", 1 },      { "192.0.2.1", "x.ads.example", 0 },
	{ "192.0.2.1", "tracker.example", 1 },  { "10.1.2.3", "www.cn.example", 2 },
	{ "192.0.2.1", "www.cn.example", 0 },   { "10.1.2.3", "only.example", 2 },
	{ "10.1.2.3", "a.only.example", 0 },    { "10.1.2.3", "abcnzzb.test", 2 },
	{ "10.1.2.3", "img9.cdn.example", 2 },  { "192.0.2.1", "a.blocked.test", 1 },
	{ "192.0.2.1", "own.example", 1 },      { "192.0.2.1", "x.own-suffix.example", 1 },
	{ "192.0.2.1", "telemetry-x.test", 1 }, { "192.0.2.1", "ad7.test", 1 },
	{ "192.0.2.1", "other.test", 0 },       { "192.0.2.1", NULL, 0 },
};

/* The configuration loaded with three rule-set files (hosts, v2fly with every kind of entry,
 * plain) and rules naming them beside their own names: it loads whole or fails with -ENOMEM
 * (leaving nothing); loaded, every name goes where the rules say. */
static void nomem_scenario(void *arg, bool sweep)
{
	struct nomem *nm = arg;
	char err[TS_ERRLEN];
	int rc;

	config_init(&cfg);
	rc = config_load_string(nm->json, &cfg, err, sizeof(err));
	if (rc != 0) {
		cr_assert(sweep && rc == -ENOMEM, "rc %d: %s", rc, err);
		cr_assert_null(cfg.rule_sets);
		cr_assert_eq(cfg.route.n_rules, 0);
		config_fini(&cfg);
		return;
	}
	cr_assert_not(sweep && failalloc_fired(), "a refused allocation still loaded");
	cr_assert_eq(cfg.n_rule_sets, 3);
	cr_assert_eq(cfg.rule_sets[1].stats.added, 6);
	cr_assert_eq(cfg.rule_sets[1].stats.bad, 1);
	for (size_t i = 0; i < sizeof(nomem_cases) / sizeof(nomem_cases[0]); i++)
		cr_assert_eq(seln(nomem_cases[i].dst, nomem_cases[i].name), nomem_cases[i].out,
			     "%s %s", nomem_cases[i].dst, nomem_cases[i].name);
	config_fini(&cfg);
}

static void put_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	cr_assert_not_null(f, "%s", path);
	fputs(text, f);
	cr_assert_eq(fclose(f), 0);
}

Test(route, each_allocation_refused_in_turn)
{
	struct nomem nm = { .dir = "/tmp/test_route_XXXXXX" };
	char ads[64], cn[64], blk[64];

	cr_assert_not_null(mkdtemp(nm.dir));
	snprintf(ads, sizeof(ads), "%s/ads.hosts", nm.dir);
	snprintf(cn, sizeof(cn), "%s/cn.v2fly", nm.dir);
	snprintf(blk, sizeof(blk), "%s/blocked.txt", nm.dir);
	put_file(ads, "# hosts\n0.0.0.0 ads.example tracker.example\n::1 pixel.example\n");
	put_file(cn, "cn.example @cn\nfull:only.example\ndomain:cn2.example\nkeyword:bcnz\n"
		     "regexp:^img[0-9]+\\.cdn\\.example$\nbad line here\ninclude:other\n"
		     "full:dup.example\n");
	put_file(blk, "blocked.test\n\n# comment\n");
	snprintf(nm.json, sizeof(nm.json),
		 "{\"outbounds\":[{\"tag\":\"d\",\"type\":\"direct\"},{\"tag\":\"r\",\"type\":\"reject\"},"
		 "{\"tag\":\"d2\",\"type\":\"direct\"}],"
		 "\"rule_sets\":[{\"tag\":\"ads\",\"format\":\"hosts\",\"path\":\"%s\"},"
		 "{\"tag\":\"cn\",\"format\":\"v2fly\",\"path\":\"%s\"},"
		 "{\"tag\":\"blk\",\"format\":\"plain\",\"path\":\"%s\"}],"
		 "\"route\":{\"rules\":["
		 "{\"rule_set\":[\"ads\",\"blk\"],\"domain\":[\"own.example\"],"
		 "\"domain_suffix\":[\"own-suffix.example\"],\"domain_keyword\":[\"telemetry\"],"
		 "\"domain_regex\":[\"^ad[0-9]\\\\.test$\"],\"outbound\":\"r\"},"
		 "{\"rule_set\":[\"cn\"],\"network\":\"tcp\",\"cidr\":[\"10.0.0.0/8\"],"
		 "\"outbound\":\"d2\"}],"
		 "\"final\":\"d\"}}",
		 ads, cn, blk);
	cr_log_info("%ld allocations refused in turn", failalloc_sweep(nomem_scenario, &nm, 10,
								      1000));
	unlink(ads);
	unlink(cn);
	unlink(blk);
	rmdir(nm.dir);
}
