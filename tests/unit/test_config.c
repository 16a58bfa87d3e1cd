/* test_config.c — the config schema (core/config.c): defaults, every field's accepted and
 * rejected values with the JSON path the error names, address roles, route rules and tags,
 * budget profiles and overrides, the loaders. The system stack's views of a config (NAT table
 * config, accepted send buffer) are tested in test_sys_config.c.
 *
 * JSON in this file is written with single quotes ('tag') and converted, to stay readable.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"
#include "core/config_dns.h"
#include "failalloc.h"
#include "testutil.h"

static char *dq(const char *s)
{
	char *out = strdup(s);

	cr_assert_not_null(out);
	for (char *c = out; *c; c++)
		if (*c == '\'')
			*c = '"';
	return out;
}

static int load(const char *sq, struct ts_config *cfg, char *err, size_t errlen)
{
	char *json = dq(sq);
	int ret = config_load_string(json, cfg, err, errlen);

	free(json);
	return ret;
}

/* Loads sq, which must be valid; the caller fini's cfg. */
static void load_ok(const char *sq, struct ts_config *cfg)
{
	char err[TS_ERRLEN];

	cr_assert_eq(load(sq, cfg, err, sizeof(err)), 0, "%s\n -> %s", sq, err);
}

static void expect_ok(const char *sq)
{
	struct ts_config cfg;

	load_ok(sq, &cfg);
	config_fini(&cfg);
}

/* The message is exactly "config: <path>: ..." and contains reason. */
static void expect_err(const char *sq, const char *path, const char *reason)
{
	struct ts_config cfg;
	char err[TS_ERRLEN], prefix[256];
	int ret = load(sq, &cfg, err, sizeof(err));

	snprintf(prefix, sizeof(prefix), "config: %s: ", path);
	cr_expect_eq(ret, -EINVAL, "%s: accepted (rc %d)", sq, ret);
	cr_expect(strncmp(err, prefix, strlen(prefix)) == 0, "%s\n  want path %s\n  got: %s", sq,
		  path, err);
	cr_expect(strstr(err, reason) != NULL, "%s\n  want reason '%s'\n  got: %s", sq, reason,
		  err);
	cr_expect(strchr(err, '\n') == NULL, "one line: %s", err);
	cr_expect_eq(cfg.outbounds, NULL, "a failed load leaves nothing allocated");
	config_fini(&cfg);
}

struct bad {
	const char *json, *path, *reason;
};

static void expect_bad_table(const struct bad *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		expect_err(b[i].json, b[i].path, b[i].reason);
}

#define BAD_TABLE(t) expect_bad_table((t), sizeof(t) / sizeof((t)[0]))

/* ---- defaults ------------------------------------------------------------------------------ */

Test(config, defaults)
{
	struct ts_config cfg;
	struct budget_limits desk;
	char buf[NETADDR_CIDR_STRLEN];

	load_ok("{}", &cfg);
	cr_assert_eq(cfg.stack, TS_STACK_SYSTEM);
	cr_assert_str_eq(cfg.tun.name, "tun0");
	cr_assert_str_eq(netaddr_cidr_format(&cfg.tun.addr4, buf, sizeof(buf)), "198.18.0.1/15");
	cr_assert_not(cfg.tun.has_addr6);
	cr_assert_eq(cfg.tun.mtu, 1500);
	cr_assert_eq(cfg.tun.txqueuelen, 10000);
	cr_assert_eq(cfg.tun.queues, TS_TUN_QUEUES_AUTO, "queues default to \"auto\"");
	cr_assert_eq(cfg.tun.offload, TS_OFFLOAD_AUTO);
	cr_assert_eq(cfg.nat.addresses, 4);
	cr_assert_eq(cfg.nat.listeners, 2);
	cr_assert_eq(cfg.nat.linger_ms, 10000);
	cr_assert_eq(cfg.nat.half_open_timeout_ms, 30000);
	cr_assert_eq(cfg.nat.port_quarantine_ms, 60000);
	cr_assert_eq(cfg.nat.accepted_sndbuf, TS_ACCEPTED_SNDBUF_AUTO);
	cr_assert_str_eq(cfg.nat.accepted_congestion, "reno");
	cr_assert_eq(cfg.nat.fast_path, TS_FAST_PATH_AUTO);
	cr_assert_eq(cfg.timeouts.connect_ms, 5000);
	cr_assert_eq(cfg.timeouts.relay_idle_ms, 300000);
	cr_assert_eq(cfg.timeouts.udp_idle_ms, 60000);
	cr_assert_eq(cfg.n_outbounds, 1);
	cr_assert_str_eq(cfg.outbounds[0].tag, "direct");
	cr_assert_eq(cfg.outbounds[0].type, TS_OUT_DIRECT);
	/* The proxy's own sockets are marked even when the config names no mark. */
	cr_assert(cfg.outbounds[0].has_routing_mark);
	cr_assert_eq(cfg.outbounds[0].routing_mark, TS_DEFAULT_MARK);
	cr_assert(cfg.outbounds[0].mark_is_default);
	cr_assert_eq(cfg.route.default_mark, 0x74000000u);
	cr_assert_not(cfg.tun.auto_route);
	cr_assert_not(cfg.tun.strict_route);
	cr_assert_eq(cfg.tun.route_table, 29811);
	cr_assert_eq(cfg.tun.route_rule_priority, 8700);
	cr_assert_str_eq(cfg.user, "");
	cr_assert_eq(cfg.relay_mode, TS_RELAY_SPLICE);
	cr_assert_eq(cfg.relay_buffer_bytes, 65536);
	cr_assert_eq(cfg.relay_pipe_bytes, 256u << 10);
	cr_assert_eq(cfg.route.n_rules, 0);
	cr_assert_str_eq(cfg.route.final_tag, "direct");
	cr_assert_eq(cfg.route.final, 0);
	cr_assert_not(cfg.dns.hijack);
	cr_assert_not(cfg.dns.has_upstream);
	cr_assert_eq(cfg.budget_profile, BUDGET_PROFILE_DESKTOP);
	budget_limits_profile(&desk, BUDGET_PROFILE_DESKTOP);
	cr_assert_eq(memcmp(&cfg.budget, &desk, sizeof(desk)), 0, "budget = desktop profile");
	cr_assert_not(cfg.stats.enabled);
	cr_assert_eq(cfg.log_level, LOG_LEVEL_INFO);
	cr_assert_eq(cfg.roles4.family, 4);
	cr_assert_eq(cfg.roles4.n_nat, 4);
	cr_assert_eq(cfg.roles6.family, 0);
	config_fini(&cfg);
	config_fini(&cfg); /* idempotent */
}

Test(config, summary)
{
	struct ts_config cfg;
	char buf[512];

	load_ok("{}", &cfg);
	cr_assert_str_eq(config_summary(&cfg, buf, sizeof(buf)),
			 "stack=system tun=tun0 198.18.0.1/15 nat=198.18.0.2-198.18.0.5 "
			 "outbounds=1 rules=0");
	config_fini(&cfg);
	load_ok("{'stack':'lwip','tun':{'name':'t1','address':'10.0.0.1/30',"
		"'address6':'fd00:7f::1/64'},'nat':{'addresses':1},"
		"'route':{'rules':[{'network':'udp','outbound':'direct'}]}}",
		&cfg);
	cr_assert_str_eq(config_summary(&cfg, buf, sizeof(buf)),
			 "stack=lwip tun=t1 10.0.0.1/30 nat=10.0.0.2 tun6=fd00:7f::1/64 "
			 "nat6=fd00:7f::2 outbounds=1 rules=1");
	config_fini(&cfg);
}

Test(config, init_without_load)
{
	struct ts_config cfg;

	config_init(&cfg);
	cr_assert_eq(cfg.n_outbounds, 0, "the default outbound comes from the loaders");
	cr_assert_eq(cfg.tun.mtu, 1500);
	config_fini(&cfg);
}

/* ---- JSON shape ---------------------------------------------------------------------------- */

Test(config, json_shape)
{
	static const struct bad b[] = {
		{ "[]", "$", "expected an object, got an array" },
		{ "'x'", "$", "expected an object, got a string" },
		{ "null", "$", "expected an object, got null" },
		{ "", "$", "empty input" },
		{ " \n\t ", "$", "empty input" },
		{ "{", "$", "invalid JSON at line 1" },
		{ "{'stack':}", "$", "invalid JSON at line 1, column 10" },
		{ "{\n'tun': {\n  'mtu': 1500,\n}\n}", "$", "invalid JSON at line 4" },
		{ "{} {}", "$", "unexpected text after the JSON value at line 1, column 4" },
		{ "{'foo':1}", "$.foo", "unknown key" },
		{ "{'Stack':'system'}", "$.Stack", "unknown key" },
		{ "{'stack':'lwip','stack':'system'}", "$.stack", "duplicate key" },
		{ "{'tun':{'mtu':1500,'mtu':1400}}", "$.tun.mtu", "duplicate key" },
		{ "{'tun':{'bogus':1}}", "$.tun.bogus", "unknown key" },
		{ "{'a\\nb':1}", "$.a?b", "unknown key" },
	};
	BAD_TABLE(b);
}

Test(config, buffer_with_nul_and_file_errors)
{
	struct ts_config cfg;
	char err[TS_ERRLEN];
	const char buf[] = "{}\0{'x':1}";

	cr_assert_eq(config_load_buffer(buf, sizeof(buf) - 1, &cfg, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "config: $: NUL byte at offset 2");
	cr_assert_eq(config_load_buffer("{}", 2, &cfg, err, sizeof(err)), 0, "no NUL needed");
	config_fini(&cfg);

	cr_assert_eq(config_load_file("/nonexistent/twinstack.json", &cfg, err, sizeof(err)),
		     -ENOENT);
	cr_assert_str_eq(err, "config: /nonexistent/twinstack.json: No such file or directory");
	cr_assert_eq(config_load_file("/", &cfg, err, sizeof(err)), -EISDIR);
	config_fini(&cfg);

	char path[] = "/tmp/test_config_XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	const char *json = "{\"tun\": {\"mtu\": 9000}}\n";
	cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
	close(fd);
	cr_assert_eq(config_load_file(path, &cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(cfg.tun.mtu, 9000);
	config_fini(&cfg);
	unlink(path);
}

/* cJSON decodes \u0000 into a NUL, which would end the C string early: "ab\u0000cd" would
 * be read as "ab". Refused like any other control character, at the field. */
Test(config, escaped_nul_is_refused_at_its_field)
{
	expect_err("{'tun':{'name':'ab\\u0000cd'}}", "$.tun.name", "control character");
	expect_err("{'user':'nobody\\u0000x'}", "$.user", "control character");
	expect_err("{'stack':'lwip\\u0000'}", "$.stack", "expected one of");
	expect_err("{'stack\\u0000zzz':'lwip'}", "$.stack?zzz", "unknown key");
	expect_err("{'outbounds':[{'tag':'p','type':'http','server':'1.2.3.4:1',"
		   "'headers':{'X-A\\u0000':'1'}}]}", "$.outbounds[0].headers.X-A?",
		   "not a header name");
	/* An escaped backslash before "u0000" is text, not an escape. */
	struct ts_config cfg;
	load_ok("{'tun':{'name':'a\\\\u0000'}}", &cfg);
	config_fini(&cfg);
}

Test(config, error_buffer_edges)
{
	struct ts_config cfg;
	char small[16];

	cr_assert_eq(config_load_string("{\"x\":1}", &cfg, small, sizeof(small)), -EINVAL);
	cr_assert_eq(strlen(small), sizeof(small) - 1, "truncated, terminated");
	cr_assert_eq(config_load_string("{\"x\":1}", &cfg, NULL, 0), -EINVAL);
	config_fini(&cfg);

	/* A very long unknown key: the path is cut, the message stays one bounded line. */
	char json[2048], err[TS_ERRLEN];
	memset(json, 'k', sizeof(json));
	memcpy(json, "{\"", 2);
	memcpy(json + sizeof(json) - 6, "\":1}", 5);
	cr_assert_eq(config_load_string(json, &cfg, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "config: $.kkk") == err, "%s", err);
	cr_assert(strstr(err, "unknown key") != NULL, "%s", err);
}

/* ---- stack, tun --------------------------------------------------------------------------- */

Test(config, stack_and_tun_values)
{
	struct ts_config cfg;
	char buf[NETADDR_CIDR_STRLEN];

	load_ok("{'stack':'lwip','tun':{'name':'tun-x.1','address':'10.0.0.250/29',"
		"'address6':'fd00:7f::1/64','mtu':2e3,'txqueuelen':1,'queues':1,'offload':'off'}}",
		&cfg);
	cr_assert_eq(cfg.stack, TS_STACK_LWIP);
	cr_assert_str_eq(cfg.tun.name, "tun-x.1");
	cr_assert_str_eq(netaddr_cidr_format(&cfg.tun.addr4, buf, sizeof(buf)), "10.0.0.250/29");
	cr_assert(cfg.tun.has_addr6);
	cr_assert_str_eq(netaddr_cidr_format(&cfg.tun.addr6, buf, sizeof(buf)), "fd00:7f::1/64");
	cr_assert_eq(cfg.roles6.family, 6);
	cr_assert_eq(cfg.tun.mtu, 2000);
	cr_assert_eq(cfg.tun.queues, 1);
	cr_assert_eq(cfg.tun.offload, TS_OFFLOAD_OFF);
	config_fini(&cfg);
	load_ok("{'stack':'system','tun':{'queues':16}}", &cfg);
	cr_assert_eq(cfg.tun.queues, 16);
	config_fini(&cfg);
	load_ok("{'stack':'lwip','tun':{'queues':'auto'}}", &cfg);
	cr_assert_eq(cfg.tun.queues, TS_TUN_QUEUES_AUTO);
	cr_assert_eq(cfg.tun.rps, TS_RPS_AUTO, "rps defaults to auto");
	cr_assert_eq(cfg.tun.io_uring, TS_IO_URING_AUTO, "io_uring defaults to auto");
	cr_assert(cfg.tun.gso_output, "gso_output defaults to true");
	cr_assert(cfg.tun.large_segments, "large_segments defaults to true");
	config_fini(&cfg);
	load_ok("{'tun':{'rps':'off','gso_output':false,'io_uring':'off','large_segments':false}}",
		&cfg);
	cr_assert_eq(cfg.tun.rps, TS_RPS_OFF);
	cr_assert_eq(cfg.tun.io_uring, TS_IO_URING_OFF);
	cr_assert(!cfg.tun.gso_output);
	cr_assert(!cfg.tun.large_segments);
	config_fini(&cfg);
	expect_ok("{'tun':{'name':'abcdefghijklmno','mtu':576,'offload':'on'}}");
	expect_ok("{'tun':{'mtu':65535,'txqueuelen':1000000,'queues':1}}");
	expect_ok("{'tun':{'address6':'fd00::1/64','mtu':1280}}");
}

Test(config, routing_values)
{
	struct ts_config cfg;

	load_ok("{'tun':{'auto_route':true,'strict_route':true,'route_address':['10.0.0.0/8',"
		"'fd00::1/8'],'route_exclude_address':['192.168.1.7/24'],'include_uid':[1000,"
		"'2000-2999','3000'],'exclude_uid':[0],'exclude_interface':['docker0','br-lan'],"
		"'route_table':100,'route_rule_priority':5000},'user':'nobody',"
		"'route':{'default_mark':0},'outbounds':[{'tag':'d','type':'direct'},"
		"{'tag':'m','type':'direct','routing_mark':7},{'tag':'r','type':'reject'}]}",
		&cfg);
	cr_assert(cfg.tun.auto_route && cfg.tun.strict_route);
	cr_assert_eq(cfg.tun.n_route_address, 2);
	cr_assert_eq(cfg.tun.route_address[1].prefix, 8);
	cr_assert_eq(cfg.tun.route_address[1].addr.a[1], 0, "host bits cleared");
	cr_assert_eq(cfg.tun.n_route_exclude_address, 1);
	cr_assert_eq(cfg.tun.route_exclude_address[0].addr.a[3], 0);
	cr_assert_eq(cfg.tun.n_include_uid, 3);
	cr_assert_eq(cfg.tun.include_uid[1].lo, 2000);
	cr_assert_eq(cfg.tun.include_uid[1].hi, 2999);
	cr_assert_eq(cfg.tun.include_uid[2].lo, 3000);
	cr_assert_eq(cfg.tun.include_uid[2].hi, 3000);
	cr_assert_eq(cfg.tun.n_exclude_uid, 1);
	cr_assert_eq(cfg.tun.exclude_uid[0].hi, 0);
	cr_assert_eq(cfg.tun.n_exclude_interface, 2);
	cr_assert_str_eq(cfg.tun.exclude_interface[1], "br-lan");
	cr_assert_eq(cfg.tun.route_table, 100);
	cr_assert_eq(cfg.tun.route_rule_priority, 5000);
	cr_assert_str_eq(cfg.user, "nobody");
	/* default_mark 0: no mark where none was asked for; an explicit one stays. */
	cr_assert_not(cfg.outbounds[0].has_routing_mark);
	cr_assert(cfg.outbounds[1].has_routing_mark && !cfg.outbounds[1].mark_is_default);
	cr_assert_eq(cfg.outbounds[1].routing_mark, 7);
	cr_assert_not(cfg.outbounds[2].has_routing_mark, "reject opens no sockets");
	config_fini(&cfg);

	load_ok("{'route':{'default_mark':5},'tun':{'strict_route':false}}", &cfg);
	cr_assert_eq(cfg.outbounds[0].routing_mark, 5);
	config_fini(&cfg);
}

Test(config, routing_rejects)
{
	static const struct bad b[] = {
		{ "{'tun':{'strict_route':true}}", "$.tun.strict_route", "only with \"auto_route\"" },
		{ "{'tun':{'route_address':['0.0.0.0/0']}}", "$.tun.route_address", "only with" },
		{ "{'tun':{'exclude_uid':[1]}}", "$.tun.exclude_uid", "only with" },
		{ "{'tun':{'route_table':7}}", "$.tun.route_table", "only with" },
		{ "{'tun':{'auto_route':1}}", "$.tun.auto_route", "expected true or false" },
		{ "{'tun':{'auto_route':true,'route_address':[]}}", "$.tun.route_address",
		  "must not be empty" },
		{ "{'tun':{'auto_route':true,'route_address':['10.0.0.1']}}",
		  "$.tun.route_address[0]", "expected an IPv4 or IPv6 CIDR" },
		{ "{'tun':{'auto_route':true,'route_exclude_address':['x/1']}}",
		  "$.tun.route_exclude_address[0]", "CIDR" },
		{ "{'tun':{'auto_route':true,'include_uid':['5-1']}}", "$.tun.include_uid[0]",
		  "reversed" },
		{ "{'tun':{'auto_route':true,'include_uid':['a']}}", "$.tun.include_uid[0]",
		  "expected a uid" },
		{ "{'tun':{'auto_route':true,'include_uid':['1-']}}", "$.tun.include_uid[0]",
		  "expected a uid" },
		{ "{'tun':{'auto_route':true,'include_uid':['-1']}}", "$.tun.include_uid[0]",
		  "expected a uid" },
		{ "{'tun':{'auto_route':true,'include_uid':['5- 6']}}", "$.tun.include_uid[0]",
		  "expected a uid" },
		{ "{'tun':{'auto_route':true,'include_uid':['5-+6']}}", "$.tun.include_uid[0]",
		  "expected a uid" },
		{ "{'tun':{'auto_route':true,'exclude_uid':[4294967295]}}", "$.tun.exclude_uid[0]",
		  "between 0 and 4294967294" },
		{ "{'tun':{'auto_route':true,'exclude_uid':[true]}}", "$.tun.exclude_uid[0]",
		  "expected a uid" },
		{ "{'tun':{'auto_route':true,'exclude_interface':['a/b']}}",
		  "$.tun.exclude_interface[0]", "not a valid interface name" },
		{ "{'tun':{'auto_route':true,'route_table':254}}", "$.tun.route_table",
		  "system table" },
		{ "{'tun':{'auto_route':true,'route_table':0}}", "$.tun.route_table", "between" },
		{ "{'tun':{'auto_route':true,'route_rule_priority':32750}}",
		  "$.tun.route_rule_priority", "between 1 and 32745" },
		{ "{'route':{'default_mark':-1}}", "$.route.default_mark", "between" },
		{ "{'user':''}", "$.user", "1 to 64 bytes" },
		{ "{'user':'a/b'}", "$.user", "not a user name or uid" },
		{ "{'user':5}", "$.user", "expected a string" },
	};
	BAD_TABLE(b);
}

Test(config, stack_and_tun_rejects)
{
	static const struct bad b[] = {
		{ "{'stack':'bsd'}", "$.stack", "expected one of \"system\", \"lwip\", got \"bsd\"" },
		{ "{'stack':1}", "$.stack", "expected a string, got a number" },
		{ "{'tun':[]}", "$.tun", "expected an object, got an array" },
		{ "{'tun':{'name':''}}", "$.tun.name", "must be 1 to 15 bytes long, got 0" },
		{ "{'tun':{'name':'abcdefghijklmnop'}}", "$.tun.name", "got 16" },
		{ "{'tun':{'name':'a/b'}}", "$.tun.name", "not a valid interface name" },
		{ "{'tun':{'name':'a:b'}}", "$.tun.name", "not a valid interface name" },
		{ "{'tun':{'name':'a b'}}", "$.tun.name", "not a valid interface name" },
		{ "{'tun':{'name':'..'}}", "$.tun.name", "not a valid interface name" },
		{ "{'tun':{'name':'a\\tb'}}", "$.tun.name", "control character" },
		{ "{'tun':{'name':5}}", "$.tun.name", "expected a string" },
		{ "{'tun':{'address':'10.0.0.1'}}", "$.tun.address", "expected an IPv4 CIDR" },
		{ "{'tun':{'address':'fd00::1/64'}}", "$.tun.address", "expected an IPv4 CIDR" },
		{ "{'tun':{'address':'10.0.0.1/33'}}", "$.tun.address", "expected an IPv4 CIDR" },
		{ "{'tun':{'address':'10.0.0.256/24'}}", "$.tun.address", "expected an IPv4 CIDR" },
		{ "{'tun':{'address':null}}", "$.tun.address", "expected a string, got null" },
		{ "{'tun':{'address6':'10.0.0.1/24'}}", "$.tun.address6", "expected an IPv6 CIDR" },
		{ "{'tun':{'address6':'fd00::1'}}", "$.tun.address6", "expected an IPv6 CIDR" },
		{ "{'tun':{'mtu':575}}", "$.tun.mtu", "must be between 576 and 65535, got 575" },
		{ "{'tun':{'mtu':65536}}", "$.tun.mtu", "must be between 576 and 65535" },
		{ "{'tun':{'mtu':-1}}", "$.tun.mtu", "must be between" },
		{ "{'tun':{'mtu':1500.5}}", "$.tun.mtu", "expected an integer, got 1500.5" },
		{ "{'tun':{'mtu':'1500'}}", "$.tun.mtu", "expected an integer, got a string" },
		{ "{'tun':{'mtu':1e400}}", "$.tun.mtu", "expected an integer" },
		{ "{'tun':{'mtu':1279,'address6':'fd00::1/64'}}", "$.tun.mtu", "at least 1280" },
		{ "{'tun':{'txqueuelen':0}}", "$.tun.txqueuelen", "between 1 and 1000000" },
		{ "{'tun':{'queues':0}}", "$.tun.queues", "between 1 and 16" },
		{ "{'tun':{'queues':17}}", "$.tun.queues", "between 1 and 16" },
		{ "{'tun':{'queues':'two'}}", "$.tun.queues", "expected \"auto\" or an integer 1-16" },
		{ "{'tun':{'queues':true}}", "$.tun.queues", "expected an integer, got a boolean" },
		{ "{'tun':{'rps':'maybe'}}", "$.tun.rps",
		  "expected one of \"auto\", \"on\", \"off\", got \"maybe\"" },
		{ "{'tun':{'gso_output':1}}", "$.tun.gso_output", "expected true or false, got a number" },
		{ "{'tun':{'large_segments':'yes'}}", "$.tun.large_segments",
		  "expected true or false, got a string" },
		{ "{'stack':'lwip','tun':{'queues':2}}", "$.tun.queues",
		  "2: the lwip stack runs on one queue (lwIP is single-threaded)" },
		{ "{'tun':{'offload':'yes'}}", "$.tun.offload",
		  "expected one of \"auto\", \"on\", \"off\", got \"yes\"" },
		{ "{'tun':{'offload':true}}", "$.tun.offload", "expected a string, got a boolean" },
		{ "{'tun':{'io_uring':'yes'}}", "$.tun.io_uring",
		  "expected one of \"auto\", \"on\", \"off\", got \"yes\"" },
		{ "{'tun':{'io_uring':false}}", "$.tun.io_uring", "expected a string, got a boolean" },
	};
	BAD_TABLE(b);
}

/* ---- address roles ------------------------------------------------------------------------ */

/* What "auto" stands for: a second queue (a second thread) only where it was measured to pay. */
Test(config, auto_queues)
{
	struct ts_config cfg;

	config_init(&cfg);
	cr_assert_eq(config_auto_queues(&cfg, false, 1), 1, "one CPU: one queue");
	cr_assert_eq(config_auto_queues(&cfg, false, 2), 2, "system stack, two CPUs");
	cr_assert_eq(config_auto_queues(&cfg, false, 64), TS_TUN_QUEUES_AUTO_MAX, "capped");
	cr_assert_eq(config_auto_queues(&cfg, true, 8), 1, "a caller's TUN keeps its one queue");
	cfg.tun.offload = TS_OFFLOAD_OFF;
	cr_assert_eq(config_auto_queues(&cfg, false, 8), 1, "per-packet I/O: one queue");
	cfg.tun.offload = TS_OFFLOAD_ON;
	cr_assert_eq(config_auto_queues(&cfg, false, 8), 2, "offload on");
	cfg.stack = TS_STACK_LWIP;
	cr_assert_eq(config_auto_queues(&cfg, false, 8), 1, "lwIP is single-threaded");
	config_fini(&cfg);
}

Test(config, address_roles)
{
	static const struct bad b[] = {
		{ "{'tun':{'address':'10.0.0.1/31'}}", "$.tun.address", "/31 prefix leaves no room" },
		{ "{'tun':{'address':'10.0.0.1/32'}}", "$.tun.address", "/32 prefix leaves no room" },
		{ "{'tun':{'address':'10.0.0.0/24'}}", "$.tun.address", "network address" },
		{ "{'tun':{'address':'10.0.0.255/24'}}", "$.tun.address", "broadcast address" },
		{ "{'tun':{'address':'10.0.0.1/30'}}", "$.tun.address",
		  "10.0.0.3 (gateway+2) would be the broadcast address of 10.0.0.0/30" },
		{ "{'tun':{'address':'10.0.0.251/29'}}", "$.tun.address",
		  "10.0.0.255 (gateway+4) would be the broadcast" },
		{ "{'tun':{'address':'10.0.0.1/29'},'nat':{'addresses':6}}", "$.tun.address",
		  "only 5 of the 6" },
		{ "{'tun':{'address6':'fd00::1/127'}}", "$.tun.address6", "/127 prefix" },
		{ "{'tun':{'address6':'fd00::1/128'}}", "$.tun.address6", "/128 prefix" },
		{ "{'tun':{'address6':'fd00::/64'}}", "$.tun.address6", "subnet-router anycast" },
		{ "{'tun':{'address6':'fd00::1/126'}}", "$.tun.address6",
		  "fd00::4 (gateway+3) lies outside fd00::/126" },
	};
	BAD_TABLE(b);
	expect_ok("{'tun':{'address':'10.0.0.250/29'}}");
	expect_ok("{'tun':{'address':'10.0.0.1/30'},'nat':{'addresses':1}}");
	expect_ok("{'tun':{'address':'10.0.0.1/29'},'nat':{'addresses':5}}");
	expect_ok("{'tun':{'address6':'fd00::1/125'}}");
	expect_ok("{'tun':{'address6':'fd00::1/126'},'nat':{'addresses':2}}");
}

Test(config, roles_are_usable)
{
	struct ts_config cfg;
	struct netaddr a;
	uint32_t k;
	char buf[NETADDR_STRLEN];

	load_ok("{'tun':{'address6':'fd00:7f::1/64'},'nat':{'addresses':8}}", &cfg);
	netaddr_roles_nat(&cfg.roles4, 7, &a);
	cr_assert_str_eq(netaddr_format(&a, buf, sizeof(buf)), "198.18.0.9");
	cr_assert_eq(netaddr_roles_classify(&cfg.roles4, a.a, &k), NETADDR_ROLE_NAT);
	cr_assert_eq(k, 7);
	netaddr_roles_nat(&cfg.roles6, 0, &a);
	cr_assert_str_eq(netaddr_format(&a, buf, sizeof(buf)), "fd00:7f::2");
	cr_assert_eq(netaddr_roles_classify(&cfg.roles6, cfg.tun.addr6.addr.a, NULL),
		     NETADDR_ROLE_GATEWAY);
	config_fini(&cfg);
}

/* ---- nat, timeouts, relay ------------------------------------------------------------------ */

/* nat.accepted_congestion: any name of the kernel's shape (the kernel is asked at start-up),
 * "host", and errors naming the field for what cannot be a name. */
Test(config, accepted_congestion)
{
	struct ts_config cfg;

	load_ok("{'nat':{'accepted_congestion':'host'}}", &cfg);
	cr_assert_str_eq(cfg.nat.accepted_congestion, "host");
	config_fini(&cfg);
	load_ok("{'nat':{'accepted_congestion':'bbr'}}", &cfg);
	cr_assert_str_eq(cfg.nat.accepted_congestion, "bbr");
	config_fini(&cfg);
	load_ok("{'nat':{'accepted_congestion':'abcdefghijklm_9'}}", &cfg); /* 15 bytes */
	cr_assert_str_eq(cfg.nat.accepted_congestion, "abcdefghijklm_9");
	config_fini(&cfg);

	static const struct bad b[] = {
		{ "{'nat':{'accepted_congestion':''}}", "$.nat.accepted_congestion",
		  "must be 1 to 15 bytes long, got 0" },
		{ "{'nat':{'accepted_congestion':'abcdefghijklmnop'}}", "$.nat.accepted_congestion",
		  "must be 1 to 15 bytes long, got 16" },
		{ "{'nat':{'accepted_congestion':'BBR'}}", "$.nat.accepted_congestion",
		  "congestion control's name" },
		{ "{'nat':{'accepted_congestion':'re no'}}", "$.nat.accepted_congestion",
		  "congestion control's name" },
		{ "{'nat':{'accepted_congestion':1}}", "$.nat.accepted_congestion",
		  "expected a string" },
	};
	BAD_TABLE(b);
}

/* nat.fast_path: the system stack's in-kernel fast path, "auto" unless the config says "on" or
 * "off"; anything else is an error naming the field. */
Test(config, fast_path)
{
	static const struct {
		const char *json;
		enum ts_fast_path want;
	} ok[] = {
		{ "{}", TS_FAST_PATH_AUTO },
		{ "{'nat':{}}", TS_FAST_PATH_AUTO },
		{ "{'nat':{'fast_path':'auto'}}", TS_FAST_PATH_AUTO },
		{ "{'nat':{'fast_path':'on'}}", TS_FAST_PATH_ON },
		{ "{'nat':{'fast_path':'off'}}", TS_FAST_PATH_OFF },
		{ "{'stack':'lwip','nat':{'fast_path':'on'}}", TS_FAST_PATH_ON },
	};
	struct ts_config cfg;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		load_ok(ok[i].json, &cfg);
		cr_expect_eq(cfg.nat.fast_path, ok[i].want, "%s: fast_path %d, want %d", ok[i].json,
			     (int)cfg.nat.fast_path, (int)ok[i].want);
		config_fini(&cfg);
	}

	static const struct bad b[] = {
		{ "{'nat':{'fast_path':'yes'}}", "$.nat.fast_path",
		  "expected one of \"auto\", \"on\", \"off\", got \"yes\"" },
		{ "{'nat':{'fast_path':'On'}}", "$.nat.fast_path",
		  "expected one of \"auto\", \"on\", \"off\", got \"On\"" },
		{ "{'nat':{'fast_path':''}}", "$.nat.fast_path", "expected one of" },
		{ "{'nat':{'fast_path':1}}", "$.nat.fast_path", "expected a string, got a number" },
		{ "{'nat':{'fast_path':true}}", "$.nat.fast_path",
		  "expected a string, got a boolean" },
		{ "{'nat':{'fast_path':null}}", "$.nat.fast_path", "expected a string, got null" },
	};
	BAD_TABLE(b);
}

Test(config, nat_timeouts_relay)
{
	struct ts_config cfg;

	load_ok("{'nat':{'addresses':64,'listeners':16,'linger_ms':1,'half_open_timeout_ms':3600000,"
		"'port_quarantine_ms':0,'accepted_sndbuf':0},'timeouts':{'connect_ms':600000,"
		"'relay_idle_ms':1,'udp_idle_ms':86400000},'relay':{'mode':'copy',"
		"'buffer_bytes':4096,'pipe_bytes':1048576}}",
		&cfg);
	cr_assert_eq(cfg.nat.addresses, 64);
	cr_assert_eq(cfg.nat.listeners, 16);
	cr_assert_eq(cfg.nat.linger_ms, 1);
	cr_assert_eq(cfg.nat.half_open_timeout_ms, 3600000);
	cr_assert_eq(cfg.nat.port_quarantine_ms, 0);
	cr_assert_eq(cfg.nat.accepted_sndbuf, 0); /* 0: the kernel autotunes */
	cr_assert_eq(cfg.timeouts.connect_ms, 600000);
	cr_assert_eq(cfg.timeouts.udp_idle_ms, 86400000);
	cr_assert_eq(cfg.relay_mode, TS_RELAY_COPY);
	cr_assert_eq(cfg.relay_buffer_bytes, 4096);
	cr_assert_eq(cfg.relay_pipe_bytes, 1u << 20);
	config_fini(&cfg);

	static const struct bad b[] = {
		{ "{'nat':{'addresses':0}}", "$.nat.addresses", "between 1 and 64" },
		{ "{'nat':{'addresses':65}}", "$.nat.addresses", "between 1 and 64" },
		{ "{'nat':{'listeners':0}}", "$.nat.listeners", "between 1 and 16" },
		{ "{'nat':{'listeners':17}}", "$.nat.listeners", "between 1 and 16" },
		{ "{'nat':{'linger_ms':0}}", "$.nat.linger_ms", "between 1 and 3600000" },
		{ "{'nat':{'half_open_timeout_ms':3600001}}", "$.nat.half_open_timeout_ms",
		  "between 1 and 3600000" },
		{ "{'nat':{'port_quarantine_ms':-1}}", "$.nat.port_quarantine_ms",
		  "between 0 and 3600000" },
		{ "{'nat':{'accepted_sndbuf':67108865}}", "$.nat.accepted_sndbuf",
		  "between 0 and 67108864" },
		{ "{'nat':{'accepted_sndbuf':-1}}", "$.nat.accepted_sndbuf",
		  "between 0 and 67108864" },
		{ "{'nat':{'accepted_sndbuf':'1M'}}", "$.nat.accepted_sndbuf",
		  "expected an integer, got a string" },
		{ "{'nat':{'ports':5}}", "$.nat.ports", "unknown key" },
		{ "{'nat':7}", "$.nat", "expected an object, got a number" },
		{ "{'timeouts':{'connect_ms':0}}", "$.timeouts.connect_ms", "between 1 and 600000" },
		{ "{'timeouts':{'relay_idle_ms':86400001}}", "$.timeouts.relay_idle_ms", "between" },
		{ "{'timeouts':{'udp_idle_ms':true}}", "$.timeouts.udp_idle_ms",
		  "expected an integer, got a boolean" },
		{ "{'timeouts':{'dns_ms':1}}", "$.timeouts.dns_ms", "unknown key" },
		{ "{'relay':{'mode':'sendfile'}}", "$.relay.mode",
		  "expected one of \"splice\", \"copy\"" },
		{ "{'relay':{'buffer_bytes':4095}}", "$.relay.buffer_bytes",
		  "between 4096 and 16777216" },
		{ "{'relay':{'buffer_bytes':16777217}}", "$.relay.buffer_bytes", "between" },
		{ "{'relay':{'buffer_bytes':131072},'budgets':{'buffer_bytes':65536}}",
		  "$.budgets.buffer_bytes", "smaller than one relay buffer" },
	};
	BAD_TABLE(b);
}

/* ---- outbounds ---------------------------------------------------------------------------- */

Test(config, outbounds_values)
{
	struct ts_config cfg;
	char buf[NETADDR_STRLEN];

	load_ok("{'outbounds':[{'tag':'d','type':'direct','routing_mark':4294967295,"
		"'bind_interface':'eth0'},"
		"{'tag':'s4','type':'socks5','server':'10.200.0.2:1080','username':'u',"
		"'password':'p','routing_mark':1},"
		"{'tag':'s6','type':'socks5','server':'[fd00:200::2]:1081'},"
		"{'tag':'sh','type':'socks5','server':'proxy-1.example_x.com:65535'},"
		"{'tag':'r','type':'reject'}]}",
		&cfg);
	cr_assert_eq(cfg.n_outbounds, 5);
	cr_assert(cfg.outbounds[0].has_routing_mark);
	cr_assert_eq(cfg.outbounds[0].routing_mark, 4294967295u);
	cr_assert_str_eq(cfg.outbounds[0].bind_interface, "eth0");
	cr_assert_not(cfg.outbounds[0].has_server);
	const struct ts_outbound *s4 = &cfg.outbounds[1];
	cr_assert_eq(s4->type, TS_OUT_SOCKS5);
	cr_assert(s4->server.is_addr);
	cr_assert_str_eq(netaddr_format(&s4->server.addr, buf, sizeof(buf)), "10.200.0.2");
	cr_assert_eq(s4->server.port, 1080);
	cr_assert(s4->has_auth);
	cr_assert_str_eq(s4->username, "u");
	cr_assert_str_eq(s4->password, "p");
	const struct ts_outbound *s6 = &cfg.outbounds[2];
	cr_assert(s6->server.is_addr);
	cr_assert_eq(s6->server.addr.family, 6);
	cr_assert_str_eq(s6->server.host, "fd00:200::2");
	cr_assert_eq(s6->server.port, 1081);
	cr_assert_not(s6->has_auth);
	const struct ts_outbound *sh = &cfg.outbounds[3];
	cr_assert_not(sh->server.is_addr);
	cr_assert_str_eq(sh->server.host, "proxy-1.example_x.com");
	cr_assert_eq(sh->server.port, 65535);
	cr_assert_eq(cfg.outbounds[4].type, TS_OUT_REJECT);
	cr_assert_eq(config_outbound_index(&cfg, "sh"), 3);
	cr_assert_eq(config_outbound_index(&cfg, "none"), -1);
	cr_assert_str_eq(cfg.route.final_tag, "d", "final defaults to the first outbound");
	config_fini(&cfg);
}

Test(config, outbounds_rejects)
{
	static const struct bad b[] = {
		{ "{'outbounds':{}}", "$.outbounds", "expected an array, got an object" },
		{ "{'outbounds':[]}", "$.outbounds", "must not be empty" },
		{ "{'outbounds':[1]}", "$.outbounds[0]", "expected an object, got a number" },
		{ "{'outbounds':[{'type':'direct'}]}", "$.outbounds[0].tag", "required" },
		{ "{'outbounds':[{'tag':'a'}]}", "$.outbounds[0].type", "required" },
		{ "{'outbounds':[{'tag':'','type':'direct'}]}", "$.outbounds[0].tag",
		  "1 to 64 bytes" },
		{ "{'outbounds':[{'tag':'a','type':'https'}]}", "$.outbounds[0].type",
		  "expected one of \"direct\", \"socks5\", \"reject\", \"http\", got \"https\"" },
		{ "{'outbounds':[{'tag':'a','type':'vmess'}]}", "$.outbounds[0].type", "got \"vmess\"" },
		{ "{'outbounds':[{'tag':'a','type':'direct'},{'tag':'a','type':'reject'}]}",
		  "$.outbounds[1].tag", "duplicate tag \"a\" (also $.outbounds[0])" },
		{ "{'outbounds':[{'tag':'a','type':'direct','via':'x'}]}", "$.outbounds[0].via",
		  "unknown key" },
		{ "{'outbounds':[{'tag':'s','type':'socks5'}]}", "$.outbounds[0].server",
		  "required for type socks5" },
		{ "{'outbounds':[{'tag':'d','type':'direct','server':'1.2.3.4:1'}]}",
		  "$.outbounds[0].server", "not allowed for type direct" },
		{ "{'outbounds':[{'tag':'r','type':'reject','server':'1.2.3.4:1'}]}",
		  "$.outbounds[0].server", "not allowed for type reject" },
		{ "{'outbounds':[{'tag':'r','type':'reject','routing_mark':1}]}",
		  "$.outbounds[0].routing_mark", "not allowed for type reject" },
		{ "{'outbounds':[{'tag':'r','type':'reject','bind_interface':'eth0'}]}",
		  "$.outbounds[0].bind_interface", "not allowed for type reject" },
		{ "{'outbounds':[{'tag':'d','type':'direct','username':'u','password':'p'}]}",
		  "$.outbounds[0].username", "only for types socks5 and http" },
		{ "{'outbounds':[{'tag':'d','type':'direct','password':'p'}]}",
		  "$.outbounds[0].password", "only for types socks5 and http" },
		{ "{'outbounds':[{'tag':'d','type':'direct','routing_mark':0}]}",
		  "$.outbounds[0].routing_mark", "between 1 and 4294967295, got 0" },
		{ "{'outbounds':[{'tag':'d','type':'direct','routing_mark':4294967296}]}",
		  "$.outbounds[0].routing_mark", "between 1 and 4294967295" },
		{ "{'outbounds':[{'tag':'d','type':'direct','routing_mark':'1'}]}",
		  "$.outbounds[0].routing_mark", "expected an integer" },
		{ "{'outbounds':[{'tag':'d','type':'direct','bind_interface':''}]}",
		  "$.outbounds[0].bind_interface", "1 to 15 bytes" },
		{ "{'outbounds':[{'tag':'d','type':'direct','bind_interface':'a/b'}]}",
		  "$.outbounds[0].bind_interface", "not a valid interface name" },
	};
	BAD_TABLE(b);
}

Test(config, socks5_server_and_auth)
{
	static const char *bad_servers[] = {
		"10.0.0.1", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:65536", "fd00::1:1080",
		"[fd00::1]1080", "[fd00::1]:", "[10.0.0.1]:1080", "exa mple:80", "-bad.example:80",
		"bad-.example:80", "a..b:80", ".a:80", "a.:80", "1.2.3:80", "256.1.1.1:80", ":80",
		"host:port", "host:+80", "ex@mple.com:80",
	};
	for (size_t i = 0; i < sizeof(bad_servers) / sizeof(bad_servers[0]); i++) {
		char json[256];
		snprintf(json, sizeof(json),
			 "{'outbounds':[{'tag':'d','type':'direct'},{'tag':'s','type':'socks5',"
			 "'server':'%s'}]}",
			 bad_servers[i]);
		expect_err(json, "$.outbounds[1].server", "expected \"host:port\"");
	}
	expect_ok("{'outbounds':[{'tag':'s','type':'socks5','server':'localhost:1080'}]}");
	expect_ok("{'outbounds':[{'tag':'s','type':'socks5','server':'a:1'}]}");
	expect_ok("{'outbounds':[{'tag':'s','type':'socks5','server':'1a.b2:1'}]}");

	/* An IPv4-mapped IPv6 address is the IPv4 address it carries (an IPv6 socket here is
	 * IPv6-only and could never reach it): the server, dns.upstream and a DNS server. */
	struct ts_config mc;
	char mb[NETADDR_EP_STRLEN];
	load_ok("{'outbounds':[{'tag':'s','type':'socks5','server':'[::ffff:192.0.2.7]:1080'}],"
		"'dns':{'hijack':true,'upstream':'[::FFFF:192.0.2.53]:53'}}", &mc);
	cr_assert(mc.outbounds[0].server.is_addr);
	cr_assert_eq(mc.outbounds[0].server.addr.family, 4);
	cr_assert_str_eq(mc.outbounds[0].server.host, "192.0.2.7");
	cr_assert_eq(mc.outbounds[0].server.port, 1080);
	cr_assert_str_eq(netaddr_ep_format(&mc.dns.upstream, mb, sizeof(mb)), "192.0.2.53:53");
	config_fini(&mc);
	load_ok("{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tcp://[::ffff:192.0.2.9]:5353'},"
		"{'tag':'b','address':'https://d.example/q','address_ip':'::ffff:192.0.2.10'}]}}", &mc);
	cr_assert_str_eq(netaddr_ep_format(&mc.dns.servers[0].addr, mb, sizeof(mb)), "192.0.2.9:5353");
	cr_assert_str_eq(netaddr_ep_format(&mc.dns.servers[1].addr, mb, sizeof(mb)), "192.0.2.10:443");
	config_fini(&mc);

	char json[1024], cred[300];
	memset(cred, 'x', sizeof(cred));
	cred[255] = '\0';
	snprintf(json, sizeof(json),
		 "{'outbounds':[{'tag':'s','type':'socks5','server':'h:1','username':'%s',"
		 "'password':'%s'}]}",
		 cred, cred);
	expect_ok(json);
	cred[255] = 'x';
	cred[256] = '\0';
	snprintf(json, sizeof(json),
		 "{'outbounds':[{'tag':'s','type':'socks5','server':'h:1','username':'%s',"
		 "'password':'p'}]}",
		 cred);
	expect_err(json, "$.outbounds[0].username", "1 to 255 bytes long, got 256");

	static const struct bad b[] = {
		{ "{'outbounds':[{'tag':'s','type':'socks5','server':'h:1','username':'u'}]}",
		  "$.outbounds[0].password", "required with username" },
		{ "{'outbounds':[{'tag':'s','type':'socks5','server':'h:1','password':'p'}]}",
		  "$.outbounds[0].username", "required with password" },
		{ "{'outbounds':[{'tag':'s','type':'socks5','server':'h:1','username':'',"
		  "'password':'p'}]}",
		  "$.outbounds[0].username", "1 to 255 bytes" },
		/* Our own addresses as a server: a loop. */
		{ "{'outbounds':[{'tag':'d','type':'direct'},{'tag':'s','type':'socks5',"
		  "'server':'198.18.0.3:1080'}]}",
		  "$.outbounds[1].server", "one of the TUN's own addresses" },
		{ "{'outbounds':[{'tag':'s','type':'socks5','server':'198.18.0.1:1080'}]}",
		  "$.outbounds[0].server", "own addresses" },
		{ "{'tun':{'address6':'fd00::1/64'},'outbounds':[{'tag':'s','type':'socks5',"
		  "'server':'[fd00::5]:1080'}]}",
		  "$.outbounds[0].server", "own addresses" },
		/* Anywhere else inside the TUN's prefix: sent into the TUN, a loop too. */
		{ "{'outbounds':[{'tag':'d','type':'direct'},{'tag':'s','type':'socks5',"
		  "'server':'198.18.0.6:1080'}]}",
		  "$.outbounds[1].server", "198.18.0.6 is inside the TUN's prefix" },
		{ "{'outbounds':[{'tag':'h','type':'http','server':'198.19.255.254:3128'}]}",
		  "$.outbounds[0].server", "inside the TUN's prefix" },
		{ "{'outbounds':[{'tag':'s','type':'socks5','server':'[::ffff:198.19.0.1]:1080'}]}",
		  "$.outbounds[0].server", "inside the TUN's prefix" },
		{ "{'tun':{'address6':'fd00::1/64'},'outbounds':[{'tag':'s','type':'socks5',"
		  "'server':'[fd00::1:0:0:99]:1080'}]}",
		  "$.outbounds[0].server", "fd00::1:0:0:99 is inside the TUN's prefix" },
		{ "{'tun':{'address':'10.0.0.1/24'},'outbounds':[{'tag':'s','type':'socks5',"
		  "'server':'10.0.0.200:1080'}]}",
		  "$.outbounds[0].server", "inside the TUN's prefix" },
	};
	BAD_TABLE(b);
	/* Just outside the prefix; an IPv6 server with no tun.address6; a name, which only the
	 * start's route check can judge (it may resolve anywhere). */
	expect_ok("{'outbounds':[{'tag':'s','type':'socks5','server':'198.20.0.1:1080'}]}");
	expect_ok("{'outbounds':[{'tag':'s','type':'socks5','server':'198.17.255.255:1080'}]}");
	expect_ok("{'outbounds':[{'tag':'s','type':'socks5','server':'[fd00::99]:1080'}]}");
	expect_ok("{'tun':{'address':'10.0.0.1/24'},'outbounds':[{'tag':'s','type':'socks5',"
		  "'server':'10.0.1.1:1080'}]}");
	expect_ok("{'outbounds':[{'tag':'s','type':'socks5','server':'proxy.example:1080'}]}");
	/* Bound to an interface: the prefix may be another network's there (overlapping
	 * subnets); the start's route check, which asks the kernel with the interface, judges. */
	expect_ok("{'outbounds':[{'tag':'s','type':'socks5','server':'198.18.0.6:1080',"
		  "'bind_interface':'eth1'}]}");
	expect_err("{'outbounds':[{'tag':'s','type':'socks5','server':'198.18.0.3:1080',"
		   "'bind_interface':'eth1'}]}", "$.outbounds[0].server", "own addresses");
}

Test(config, outbounds_limit)
{
	size_t cap = 64 + (TS_MAX_OUTBOUNDS + 1) * 40;
	char *json = malloc(cap);
	size_t used = 0;

	cr_assert_not_null(json);
	used += (size_t)snprintf(json + used, cap - used, "{'outbounds':[");
	for (int i = 0; i < TS_MAX_OUTBOUNDS + 1; i++)
		used += (size_t)snprintf(json + used, cap - used, "%s{'tag':'t%d','type':'direct'}",
					 i ? "," : "", i);
	snprintf(json + used, cap - used, "]}");
	expect_err(json, "$.outbounds", "too many entries (at most 256)");
	free(json);
}

/* ---- route -------------------------------------------------------------------------------- */

Test(config, route_values)
{
	struct ts_config cfg;
	char buf[NETADDR_CIDR_STRLEN];

	load_ok("{'outbounds':[{'tag':'direct','type':'direct'},{'tag':'block','type':'reject'}],"
		"'route':{'rules':[{'cidr':['10.1.2.3/8','fd00::1/16'],'outbound':'block'},"
		"{'port':[22,'6881-6889','443'],'network':'tcp','outbound':'direct'},"
		"{'network':'udp','outbound':'block'}],'final':'block'}}",
		&cfg);
	cr_assert_eq(cfg.route.n_rules, 3);
	const struct ts_rule *r0 = &cfg.route.rules[0], *r1 = &cfg.route.rules[1];
	cr_assert_eq(r0->n_cidrs, 2);
	cr_assert_str_eq(netaddr_cidr_format(&r0->cidrs[0], buf, sizeof(buf)), "10.0.0.0/8",
			 "host bits cleared");
	cr_assert_str_eq(netaddr_cidr_format(&r0->cidrs[1], buf, sizeof(buf)), "fd00::/16");
	cr_assert_eq(r0->n_ports, 0);
	cr_assert_eq(r0->network, TS_NET_ANY);
	cr_assert_eq(r0->outbound, 1);
	cr_assert_eq(r1->n_ports, 3);
	cr_assert_eq(r1->ports[0].lo, 22);
	cr_assert_eq(r1->ports[0].hi, 22);
	cr_assert_eq(r1->ports[1].lo, 6881);
	cr_assert_eq(r1->ports[1].hi, 6889);
	cr_assert_eq(r1->ports[2].lo, 443);
	cr_assert_eq(r1->ports[2].hi, 443);
	cr_assert_eq(r1->network, TS_NET_TCP);
	cr_assert_eq(r1->outbound, 0);
	cr_assert_eq(cfg.route.rules[2].network, TS_NET_UDP);
	cr_assert_eq(cfg.route.final, 1);
	cr_assert_str_eq(cfg.route.final_tag, "block");
	config_fini(&cfg);

	/* The route may come before the outbounds it names. */
	expect_ok("{'route':{'rules':[{'port':[1],'outbound':'x'}],'final':'x'},"
		  "'outbounds':[{'tag':'x','type':'reject'}]}");
	expect_ok("{'route':{'rules':[]}}");
	expect_ok("{'route':{'rules':[{'port':['1-65535','7-7'],'outbound':'direct'}]}}");
}

Test(config, route_rejects)
{
	static const struct bad b[] = {
		{ "{'route':[]}", "$.route", "expected an object" },
		{ "{'route':{'rules':{}}}", "$.route.rules", "expected an array" },
		{ "{'route':{'rules':[7]}}", "$.route.rules[0]", "expected an object" },
		{ "{'route':{'rules':[{}]}}", "$.route.rules[0]", "at least one matcher" },
		{ "{'route':{'rules':[{'outbound':'direct'}]}}", "$.route.rules[0]",
		  "at least one matcher" },
		{ "{'route':{'rules':[{'cidr':['10.0.0.0/8']}]}}", "$.route.rules[0].outbound",
		  "required" },
		{ "{'route':{'rules':[{'network':'tcp','outbound':'direct'},{'cidr':[],"
		  "'outbound':'direct'}]}}",
		  "$.route.rules[1].cidr", "must not be empty" },
		{ "{'route':{'rules':[{'cidr':'10.0.0.0/8','outbound':'direct'}]}}",
		  "$.route.rules[0].cidr", "expected an array, got a string" },
		{ "{'route':{'rules':[{'cidr':['10.0.0.0/33'],'outbound':'direct'}]}}",
		  "$.route.rules[0].cidr[0]", "expected an IPv4 or IPv6 CIDR" },
		{ "{'route':{'rules':[{'cidr':['10.0.0.0/8','10.0.0.1'],'outbound':'direct'}]}}",
		  "$.route.rules[0].cidr[1]", "expected an IPv4 or IPv6 CIDR" },
		{ "{'route':{'rules':[{'cidr':[5],'outbound':'direct'}]}}", "$.route.rules[0].cidr[0]",
		  "expected a string" },
		{ "{'route':{'rules':[{'port':[],'outbound':'direct'}]}}", "$.route.rules[0].port",
		  "must not be empty" },
		{ "{'route':{'rules':[{'port':[0],'outbound':'direct'}]}}",
		  "$.route.rules[0].port[0]", "between 1 and 65535, got 0" },
		{ "{'route':{'rules':[{'port':[80,65536],'outbound':'direct'}]}}",
		  "$.route.rules[0].port[1]", "between 1 and 65535" },
		{ "{'route':{'rules':[{'port':['90-80'],'outbound':'direct'}]}}",
		  "$.route.rules[0].port[0]", "range \"90-80\" is reversed" },
		{ "{'route':{'rules':[{'port':['0-80'],'outbound':'direct'}]}}",
		  "$.route.rules[0].port[0]", "\"a-b\" range" },
		{ "{'route':{'rules':[{'port':['80-'],'outbound':'direct'}]}}",
		  "$.route.rules[0].port[0]", "\"a-b\" range" },
		{ "{'route':{'rules':[{'port':['1-2-3'],'outbound':'direct'}]}}",
		  "$.route.rules[0].port[0]", "\"a-b\" range" },
		{ "{'route':{'rules':[{'port':['http'],'outbound':'direct'}]}}",
		  "$.route.rules[0].port[0]", "\"a-b\" range" },
		{ "{'route':{'rules':[{'port':[true],'outbound':'direct'}]}}",
		  "$.route.rules[0].port[0]", "expected a port number" },
		{ "{'route':{'rules':[{'port':[1.5],'outbound':'direct'}]}}",
		  "$.route.rules[0].port[0]", "expected an integer" },
		{ "{'route':{'rules':[{'network':'icmp','outbound':'direct'}]}}",
		  "$.route.rules[0].network", "expected one of \"tcp\", \"udp\"" },
		{ "{'route':{'rules':[{'network':'any','outbound':'direct'}]}}",
		  "$.route.rules[0].network", "got \"any\"" },
		{ "{'route':{'rules':[{'network':'tcp','outbound':'direct','action':'x'}]}}",
		  "$.route.rules[0].action", "unknown key" },
		{ "{'route':{'rules':[{'network':'tcp','outbound':'direct'},{'network':'udp',"
		  "'outbound':'nope'}]}}",
		  "$.route.rules[1].outbound", "no outbound is tagged \"nope\"" },
		{ "{'route':{'final':'nope'}}", "$.route.final", "no outbound is tagged \"nope\"" },
		{ "{'route':{'final':''}}", "$.route.final", "1 to 64 bytes" },
		{ "{'route':{'default':'direct'}}", "$.route.default", "unknown key" },
	};
	BAD_TABLE(b);
}

/* ---- dns, stats, log ---------------------------------------------------------------------- */

Test(config, dns_stats_log)
{
	struct ts_config cfg;
	char buf[NETADDR_EP_STRLEN];

	load_ok("{'dns':{'hijack':true,'upstream':'[2001:db8::53]:5353'},"
		"'stats':{'listen':'[::1]:9090'},'log':{'level':'debug'}}",
		&cfg);
	cr_assert(cfg.dns.hijack);
	cr_assert(cfg.dns.has_upstream);
	cr_assert_str_eq(netaddr_ep_format(&cfg.dns.upstream, buf, sizeof(buf)),
			 "[2001:db8::53]:5353");
	cr_assert(cfg.stats.enabled);
	cr_assert_eq(cfg.stats.listen.port, 9090);
	cr_assert_eq(cfg.log_level, LOG_LEVEL_DEBUG);
	config_fini(&cfg);
	expect_ok("{'dns':{'hijack':false}}");
	expect_ok("{'stats':{'listen':'127.0.0.1:1'},'log':{'level':'error'}}");
	expect_ok("{'stats':{'listen':'127.1.2.3:65535'},'log':{'level':'warn'}}");

	static const struct bad b[] = {
		{ "{'dns':{'hijack':'yes'}}", "$.dns.hijack", "expected true or false, got a string" },
		{ "{'dns':{'hijack':1}}", "$.dns.hijack", "expected true or false" },
		{ "{'dns':{'hijack':true}}", "$.dns.servers", "required when hijack is true" },
		{ "{'dns':{'upstream':'1.1.1.1:53'}}", "$.dns.upstream", "needs hijack: true" },
		{ "{'dns':{'upstream':'dns.google:53'}}", "$.dns.upstream", "expected \"ip:port\"" },
		{ "{'dns':{'upstream':'8.8.8.8'}}", "$.dns.upstream", "expected \"ip:port\"" },
		{ "{'dns':{'upstream':'::1:53'}}", "$.dns.upstream", "expected \"ip:port\"" },
		{ "{'dns':{'hijack':true,'upstream':'198.18.0.1:53'}}", "$.dns.upstream",
		  "one of the TUN's own addresses" },
		{ "{'dns':{'hijack':true,'upstream':'198.18.0.2:53'}}", "$.dns.upstream", "own addresses" },
		{ "{'dns':{'hijack':true,'upstream':'[::ffff:198.18.0.2]:53'}}", "$.dns.upstream",
		  "own addresses" },
		{ "{'dns':{'hijack':true,'servers':[]}}", "$.dns.servers", "must not be empty" },
		{ "{'stats':{'listen':'0.0.0.0:9090'}}", "$.stats.listen", "not a loopback address" },
		{ "{'stats':{'listen':'10.0.0.1:80'}}", "$.stats.listen", "not a loopback address" },
		{ "{'stats':{'listen':'[::]:9090'}}", "$.stats.listen", "not a loopback address" },
		{ "{'stats':{'listen':'127.0.0.1'}}", "$.stats.listen", "expected \"ip:port\"" },
		{ "{'stats':{'listen':'localhost:9090'}}", "$.stats.listen", "expected \"ip:port\"" },
		{ "{'stats':{'listen':'127.0.0.1:0'}}", "$.stats.listen", "expected \"ip:port\"" },
		{ "{'stats':{'listen':9090}}", "$.stats.listen", "expected a string" },
		{ "{'log':{'level':'trace'}}", "$.log.level",
		  "expected one of \"error\", \"warn\", \"info\", \"debug\", got \"trace\"" },
		{ "{'log':{'level':3}}", "$.log.level", "expected a string" },
		{ "{'log':{'file':'x'}}", "$.log.file", "unknown key" },
	};
	BAD_TABLE(b);
}

/* The proxy's own resolver: servers, rules, final, hosts, ipv6, cache. */
Test(config, dns_resolver)
{
	struct ts_config cfg;
	char err[256];

	config_init(&cfg);
	cr_assert_eq(config_load_string(
			     "{\"outbounds\":[{\"tag\":\"d\",\"type\":\"direct\"},"
			     "{\"tag\":\"p\",\"type\":\"socks5\",\"server\":\"127.0.0.1:1080\"}],"
			     "\"route\":{\"final\":\"p\"},"
			     "\"dns\":{\"hijack\":true,\"servers\":["
			     "{\"tag\":\"local\",\"address\":\"10.9.0.53\",\"detour\":\"d\"},"
			     "{\"tag\":\"remote\",\"address\":\"tcp://[2001:db8::53]:5353\"}],"
			     "\"rules\":[{\"domain_suffix\":[\"corp.example\"],\"server\":\"local\"},"
			     "{\"domain_keyword\":[\"ads\"],\"action\":\"refuse\"}],"
			     "\"final\":\"remote\",\"ipv6\":\"empty\","
			     "\"hosts\":{\"Printer.LAN.\":[\"10.9.0.9\",\"fd00::9\"],\"nas.lan\":\"10.9.0.10\"},"
			     "\"cache\":{\"size\":100,\"max_ttl_s\":600}}}",
			     &cfg, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(cfg.dns.n_servers, 2);
	cr_assert_eq(cfg.dns.servers[0].transport, TS_DNS_UDP);
	cr_assert_eq(cfg.dns.servers[0].addr.port, 53, "the port defaults to 53");
	cr_assert_eq(cfg.dns.servers[0].detour, 0);
	cr_assert_eq(cfg.dns.servers[1].transport, TS_DNS_TCP);
	cr_assert_eq(cfg.dns.servers[1].addr.port, 5353);
	cr_assert_eq(cfg.dns.servers[1].detour, 1, "no detour: route.final's outbound");
	cr_assert_eq(cfg.dns.n_rules, 2);
	cr_assert_eq(cfg.dns.rules[0].action, TS_DNS_ACT_SERVER);
	cr_assert_eq(cfg.dns.rules[0].server, 0);
	cr_assert_eq(cfg.dns.rules[1].action, TS_DNS_ACT_REFUSE);
	cr_assert_eq(cfg.dns.final, 1);
	cr_assert_eq(cfg.dns.ipv6, TS_DNS_IPV6_EMPTY);
	cr_assert_eq(cfg.dns.cache_size, 100);
	cr_assert_eq(cfg.dns.cache_max_ttl_s, 600);
	cr_assert_eq(cfg.dns.n_hosts, 2);
	const struct ts_dns_host *h = config_dns_host(&cfg.dns, "PRINTER.lan", 11);
	cr_assert_not_null(h, "names are kept in lower case without the trailing dot");
	cr_assert_eq(h->n4, 1);
	cr_assert_eq(h->n6, 1);
	cr_assert_null(config_dns_host(&cfg.dns, "printer", 7));
	config_fini(&cfg);

	config_init(&cfg);
	cr_assert_eq(config_load_string("{\"dns\":{\"hijack\":true,\"servers\":["
					"{\"tag\":\"a\",\"address\":\"udp://192.0.2.53:53\"}]}}",
					&cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(cfg.dns.final, 0, "no final: the first server");
	cr_assert_eq(cfg.dns.cache_size, 4096, "the cache is on by default");
	config_fini(&cfg);

	/* A cache object keeps the default of each member it leaves out. */
	static const struct {
		const char *cache;
		uint32_t size, ttl;
	} caches[] = { { "{\"max_ttl_s\":60}", 4096, 60 }, { "{}", 4096, 3600 },
		       { "{\"size\":0}", 0, 3600 } };
	for (size_t i = 0; i < sizeof(caches) / sizeof(caches[0]); i++) {
		char json[256];
		snprintf(json, sizeof(json), "{\"dns\":{\"hijack\":true,\"servers\":[{\"tag\":\"a\","
			 "\"address\":\"192.0.2.53\"}],\"cache\":%s}}", caches[i].cache);
		config_init(&cfg);
		cr_assert_eq(config_load_string(json, &cfg, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(cfg.dns.cache_size, caches[i].size, "%s", caches[i].cache);
		cr_assert_eq(cfg.dns.cache_max_ttl_s, caches[i].ttl, "%s", caches[i].cache);
		config_fini(&cfg);
	}

	/* A ca file is checked for a PEM certificate; its certificates are loaded at start. */
	char ca[] = "/tmp/test_config_ca_XXXXXX", key[] = "/tmp/test_config_key_XXXXXX";
	char json[512];
	int cfd = mkstemp(ca), kfd = mkstemp(key);
	const char pem[] = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
	const char pkey[] = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n";
	cr_assert(cfd >= 0 && kfd >= 0);
	cr_assert_eq(write(cfd, pem, sizeof(pem) - 1), (ssize_t)sizeof(pem) - 1);
	cr_assert_eq(write(kfd, pkey, sizeof(pkey) - 1), (ssize_t)sizeof(pkey) - 1);
	close(cfd);
	close(kfd);
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a',"
		 "'address':'tls://1.2.3.4','sni':'x.y','ca':'%s'}]}}", key);
	expect_err(json, "$.dns.servers[0].ca", "holds no PEM certificate");
	unlink(key);
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a',"
		 "'address':'1.2.3.4','ca':'%s'}]}}", ca);
	expect_err(json, "$.dns.servers[0].ca", "only for a tls:// or https://");
	config_init(&cfg);
	snprintf(json, sizeof(json), "{\"dns\":{\"hijack\":true,\"servers\":["
		 "{\"tag\":\"a\",\"address\":\"tls://192.0.2.53\","
		 "\"sni\":\"dns.example\",\"ca\":\"%s\"},"
		 "{\"tag\":\"b\",\"address\":\"tls://[2001:db8::53]:8853\","
		 "\"sni\":\"dns-2.example\"}]}}", ca);
	cr_assert_eq(config_load_string(json, &cfg, err, sizeof(err)), 0, "%s", err);
	unlink(ca);
	cr_assert_eq(cfg.dns.servers[0].transport, TS_DNS_TLS);
	cr_assert_eq(cfg.dns.servers[0].addr.port, 853, "tls: the port defaults to 853");
	cr_assert_str_eq(cfg.dns.servers[0].sni, "dns.example");
	cr_assert_str_eq(cfg.dns.servers[0].ca, ca);
	cr_assert_eq(cfg.dns.servers[1].transport, TS_DNS_TLS);
	cr_assert_eq(cfg.dns.servers[1].addr.port, 8853);
	cr_assert_str_eq(cfg.dns.servers[1].sni, "dns-2.example");
	cr_assert_null(cfg.dns.servers[1].ca, "no ca: the system's trust store");
	config_fini(&cfg);

	static const struct bad b[] = {
		{ "{'dns':{'hijack':true,'servers':[{'address':'1.2.3.4'}]}}", "$.dns.servers[0].tag", "required" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a'}]}}", "$.dns.servers[0].address", "required" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'quic://1.2.3.4'}]}}",
		  "$.dns.servers[0].address", "the transports are udp://, tcp://" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4'}]}}",
		  "$.dns.servers[0].sni", "required for tls://: the name the server's certificate" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':'a b'}]}}",
		  "$.dns.servers[0].sni", "a host name (letters, digits" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':'a..b'}]}}",
		  "$.dns.servers[0].sni", "a host name (letters, digits" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':'-x.example'}]}}",
		  "$.dns.servers[0].sni", "a host name (letters, digits" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':'x-.example'}]}}",
		  "$.dns.servers[0].sni", "a host name (letters, digits" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':'x.-example'}]}}",
		  "$.dns.servers[0].sni", "a host name (letters, digits" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://-dns.example/',"
		  "'address_ip':'192.0.2.2'}]}}", "$.dns.servers[0].address", "expected" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':'x.'}]}}",
		  "$.dns.servers[0].sni", "no trailing dot" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':'1.2.3.4'}]}}",
		  "$.dns.servers[0].sni", "a host name, not an address" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':''}]}}",
		  "$.dns.servers[0].sni", "must be 1 to 253 bytes long, got 0" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tcp://1.2.3.4','sni':'x.y'}]}}",
		  "$.dns.servers[0].sni", "only for a tls:// address" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':'x.y','ca':''}]}}",
		  "$.dns.servers[0].ca", "must be 1 to 4096 bytes long, got 0" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':'x.y',"
		  "'ca':'/nonexistent/ca.pem'}]}}",
		  "$.dns.servers[0].ca", "cannot read /nonexistent/ca.pem: No such file or directory" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':'x.y',"
		  "'ca':'/etc'}]}}", "$.dns.servers[0].ca", "/etc is not a regular file" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://1.2.3.4','sni':'x.y',"
		  "'ca':'/dev/null'}]}}", "$.dns.servers[0].ca", "/dev/null is not a regular file" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'dns.google'}]}}",
		  "$.dns.servers[0].address", "expected \"udp://ip[:port]\"" },
		/* IPv6 needs its brackets: fd00::1:5353 would otherwise be an address, port 53. */
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'udp://fd00::1:5353'}]}}",
		  "$.dns.servers[0].address", "(IPv6 in brackets)" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'fd00::1'}]}}",
		  "$.dns.servers[0].address", "(IPv6 in brackets)" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'},{'tag':'a','address':'1.2.3.5'}]}}",
		  "$.dns.servers[1].tag", "already the tag of servers[0]" },
		{ "{'dns':{'upstream':'1.2.3.4:53','servers':[{'tag':'a','address':'1.2.3.4'}]}}",
		  "$.dns.upstream", "not both" },
		{ "{'dns':{'rules':[]}}", "$.dns.rules", "needs servers" },
		{ "{'dns':{'servers':[{'tag':'a','address':'1.2.3.4'}]}}", "$.dns.hijack",
		  "must be true with servers" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'198.18.0.1'}]}}",
		  "$.dns.servers[0].address", "own addresses" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4','detour':'nope'}]}}",
		  "$.dns.servers[0].detour", "no outbound is tagged \"nope\"" },
		{ "{'outbounds':[{'tag':'p','type':'socks5','server':'127.0.0.1:1080'}],"
		  "'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}]}}",
		  "$.dns.servers[0].detour", "use \"tcp://\" for this server" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],'final':'b'}}", "$.dns.final",
		  "no server is tagged \"b\"" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],'rules':[{'domain':['x.y']}]}}",
		  "$.dns.rules[0]", "one of \"server\"" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],'rules':[{'server':'a'}]}}",
		  "$.dns.rules[0]", "needs a name matcher" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],"
		  "'rules':[{'domain':['x.y'],'server':'z'}]}}", "$.dns.rules[0].server",
		  "no server is tagged \"z\"" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],"
		  "'rules':[{'domain':['x.y'],'action':'drop'}]}}", "$.dns.rules[0].action",
		  "expected one of" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],'hosts':{'a b':'1.2.3.4'}}}",
		  "$.dns.hosts.a b", "not a host name" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],'hosts':{'x':'nope'}}}",
		  "$.dns.hosts.x", "not an IPv4 or IPv6 address" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],'hosts':{'x':'1.1.1.1','X':'1.1.1.2'}}}",
		  "$.dns.hosts", "listed twice" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],'ipv6':'no'}}", "$.dns.ipv6",
		  "expected one of" },
	};
	BAD_TABLE(b);
}

/* dns.fakeip: default ranges (the upper half of each TUN prefix) and the start checks. */
/* dns.servers with https:// (DNS over HTTPS): host, port, path, address_ip. */
Test(config, dns_https_servers)
{
	struct ts_config cfg;
	char err[256], buf[NETADDR_EP_STRLEN];

	config_init(&cfg);
	cr_assert_eq(config_load_string("{\"dns\":{\"hijack\":true,\"servers\":["
					"{\"tag\":\"a\",\"address\":\"https://dns.example/q\","
					"\"address_ip\":\"192.0.2.10\"},"
					"{\"tag\":\"b\",\"address\":\"https://[2001:db8::53]:8443\"}]}}",
					&cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(cfg.dns.servers[0].transport, TS_DNS_HTTPS);
	cr_assert_str_eq(cfg.dns.servers[0].sni, "dns.example");
	cr_assert_str_eq(cfg.dns.servers[0].path, "/q");
	cr_assert_str_eq(netaddr_ep_format(&cfg.dns.servers[0].addr, buf, sizeof(buf)),
			 "192.0.2.10:443");
	cr_assert_str_eq(cfg.dns.servers[1].sni, "2001:db8::53", "an address host: no brackets");
	cr_assert_str_eq(cfg.dns.servers[1].path, "/dns-query", "the RFC 8484 default path");
	cr_assert_eq(cfg.dns.servers[1].addr.port, 8443);
	cr_assert(cfg.dns.servers[1].host_is_addr);
	config_fini(&cfg);

	static const struct bad b[] = {
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://dns.example'}]}}",
		  "$.dns.servers[0].address_ip", "required for https:// with a host name" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://192.0.2.1',"
		  "'address_ip':'192.0.2.2'}]}}", "$.dns.servers[0].address_ip",
		  "only for https:// with a host name" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://bad host/'}]}}",
		  "$.dns.servers[0].address", "https://host[:port][/path]" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://d.example:0',"
		  "'address_ip':'192.0.2.2'}]}}", "$.dns.servers[0].address", "expected" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://d.example',"
		  "'address_ip':'192.0.2.2','sni':'x.example'}]}}", "$.dns.servers[0].sni",
		  "not for https://" },
		/* address_ip's faults are named as address_ip's. */
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://d.example/q',"
		  "'address_ip':'198.18.0.1'}]}}", "$.dns.servers[0].address_ip",
		  "one of the TUN's own addresses" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://d.example/q',"
		  "'address_ip':'198.18.5.5'}]}}", "$.dns.servers[0].address_ip",
		  "inside the TUN's prefix" },
		/* Its own address, though, is named as address's. */
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://198.18.5.5/q'}]}}",
		  "$.dns.servers[0].address", "inside the TUN's prefix" },
	};
	BAD_TABLE(b);
}

Test(config, dns_fakeip)
{
	struct ts_config cfg;
	char err[256], buf[NETADDR_CIDR_STRLEN];

	config_init(&cfg);
	cr_assert_eq(config_load_string("{\"tun\":{\"address6\":\"fd00:7f::1/64\"},\"dns\":{"
					"\"hijack\":true,\"servers\":[{\"tag\":\"a\",\"address\":"
					"\"192.0.2.53\"}],\"fakeip\":{\"exclude\":{\"domain_suffix\":"
					"[\"home.arpa\"]}}}}", &cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert(cfg.dns.fakeip.enabled, "writing the object turns it on");
	cr_assert_str_eq(netaddr_cidr_format(&cfg.dns.fakeip.range4, buf, sizeof(buf)),
			 "198.19.0.0/16");
	cr_assert_str_eq(netaddr_cidr_format(&cfg.dns.fakeip.range6, buf, sizeof(buf)),
			 "fd00:7f:0:0:8000::/65");
	cr_assert_eq(cfg.dns.fakeip.max_mappings, 65536);
	cr_assert_eq(cfg.dns.fakeip.reuse_after_s, 600);
	config_fini(&cfg);

	static const struct bad b[] = {
		{ "{'dns':{'fakeip':{}}}", "$.dns.fakeip", "needs servers" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],"
		  "'fakeip':{'inet4_range':'198.18.0.0/24'}}}", "$.dns.fakeip.inet4_range",
		  "holds 198.18.0.1, the TUN's gateway address" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],"
		  "'fakeip':{'inet4_range':'198.18.0.4/30'}}}", "$.dns.fakeip.inet4_range",
		  "the TUN's NAT address" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],"
		  "'fakeip':{'inet4_range':'198.19.0.0/31'}}}", "$.dns.fakeip.inet4_range",
		  "too few addresses" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],"
		  "'fakeip':{'inet6_range':'fd00:1::/64'}}}", "$.dns.fakeip.inet6_range",
		  "needs tun.address6" },
		{ "{'tun':{'auto_route':true,'route_exclude_address':['198.19.1.0/24']},"
		  "'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],'fakeip':{}}}",
		  "$.dns.fakeip.inet4_range", "overlaps tun.route_exclude_address" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],"
		  "'fakeip':{'persist':'relative.txt'}}}", "$.dns.fakeip.persist", "an absolute path" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'198.19.0.53'}]}}",
		  "$.dns.servers[0].address", "inside the TUN's prefix" },
		{ "{'tun':{'auto_route':true},'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		  "'100.64.0.53'}],'fakeip':{'inet4_range':'100.64.0.0/16'}}}",
		  "$.dns.servers[0].address", "inside the fake-IP range" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],"
		  "'hosts':{'x.lan':'198.19.0.9'},'fakeip':{}}}", "$.dns.hosts.x.lan",
		  "an address inside the fake-IP range" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'1.2.3.4'}],"
		  "'fakeip':{'exclude':{'rule_set':['x']}}}}", "$.dns.fakeip.exclude.rule_set[0]",
		  "no rule set is tagged" },
	};
	BAD_TABLE(b);
	config_init(&cfg);
	cr_assert_eq(config_load_string("{\"tun\":{\"auto_route\":true},\"dns\":{\"hijack\":true,"
					"\"servers\":[{\"tag\":\"a\",\"address\":\"192.0.2.53\"}],"
					"\"fakeip\":{\"inet4_range\":\"100.64.0.0/16\"}}}",
					&cfg, err, sizeof(err)), 0,
		     "outside the prefix with auto_route's default route: %s", err);
	config_fini(&cfg);
}

/* DNS addresses at the edges of what is accepted: a DoH path too long to keep, brackets, the
 * forwarder inside the TUN prefix, a fake range beside the NAT addresses. */
Test(config, dns_addresses_bounds)
{
	char json[700], path[400];

	/* A DoH path longer than the 255 bytes kept: refused, not cut. */
	memset(path, 'a', 300);
	path[300] = '\0';
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		 "'https://192.0.2.1/%s'}]}}", path);
	expect_err(json, "$.dns.servers[0].address", "path is longer than 255 bytes");
	path[254] = '\0'; /* with its '/', 255: kept whole */
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		 "'https://192.0.2.1/%s'}]}}", path);
	expect_ok(json);

	static const struct bad b[] = {
		/* Brackets hold an IPv6 address only. */
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://[dns.example]/q',"
		  "'address_ip':'192.0.2.1'}]}}", "$.dns.servers[0].address", "expected" },
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://[192.0.2.1]/q'}]}}",
		  "$.dns.servers[0].address", "expected" },
		/* The forwarder's upstream, like a server, not inside the TUN's prefix. */
		{ "{'dns':{'hijack':true,'upstream':'198.18.0.10:53'}}", "$.dns.upstream",
		  "inside the TUN's prefix" },
		/* DoT and DoH servers given by address: the same check as a UDP server's. */
		{ "{'dns':{'hijack':true,'servers':[{'tag':'a','address':'tls://198.19.0.53',"
		  "'sni':'dns.example'}]}}", "$.dns.servers[0].address", "inside the TUN's prefix" },
		{ "{'tun':{'address6':'fd00::1/64'},'dns':{'hijack':true,'servers':[{'tag':'a',"
		  "'address':'https://[fd00::1:0:0:53]/q'}]}}", "$.dns.servers[0].address",
		  "inside the TUN's prefix" },
	};
	BAD_TABLE(b);
	expect_ok("{'dns':{'hijack':true,'servers':[{'tag':'a','address':'https://[2001:db8::1]/q'}]}}");

	/* The fake range is checked against the NAT addresses there are: gateway + 1 .. + n. */
	expect_ok("{'nat':{'addresses':2},'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		  "'192.0.2.53'}],'fakeip':{'inet4_range':'198.18.0.4/30'}}}");
	expect_err("{'nat':{'addresses':3},'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		   "'192.0.2.53'}],'fakeip':{'inet4_range':'198.18.0.4/30'}}}",
		   "$.dns.fakeip.inet4_range", "holds 198.18.0.4, the TUN's NAT address");
	expect_ok("{'tun':{'address':'10.0.0.3/24'},'nat':{'addresses':4},'dns':{'hijack':true,"
		  "'servers':[{'tag':'a','address':'192.0.2.53'}],'fakeip':{'inet4_range':"
		  "'10.0.0.8/30'}}}");
}

/* A DoH URL too long in one of its parts is refused naming the part and its limit, however
 * long the whole URL; the address's own limit (600 bytes, every form) comes before. */
Test(config, dns_doh_url_lengths)
{
	char json[1400], part[700], path[256];
	struct ts_config cfg;

	/* A path of 540 bytes: the path's limit, not a generic "expected". */
	memset(part, 'a', 540);
	part[540] = '\0';
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		 "'https://192.0.2.1/%s'}]}}", part);
	expect_err(json, "$.dns.servers[0].address", "the URL's path is longer than 255 bytes");

	/* A host name of 254 bytes (with a port and a path, the URL stays under 600). */
	memset(part, 'a', 254);
	for (int i = 63; i < 254; i += 64)
		part[i] = '.';
	part[254] = '\0';
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		 "'https://%s:8443/dns-query','address_ip':'192.0.2.1'}]}}", part);
	expect_err(json, "$.dns.servers[0].address", "the URL's host is longer than 253 bytes");
	memset(part + 200, 'b', 260); /* one label of 260 bytes */
	part[460] = '\0';
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		 "'https://%s/q','address_ip':'192.0.2.1'}]}}", part);
	expect_err(json, "$.dns.servers[0].address", "the URL's host is longer than 253 bytes");

	/* A label of 64 bytes: longer than a DNS label, in the URL's host and as a server name;
	 * 63 is taken. */
	memset(part, 'a', 64);
	memcpy(part + 64, ".test", 6);
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		 "'https://%s/q','address_ip':'192.0.2.1'}]}}", part);
	expect_err(json, "$.dns.servers[0].address", "a label of the URL's host is longer than 63 "
		   "bytes");
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		 "'tls://192.0.2.1','sni':'%s'}]}}", part);
	expect_err(json, "$.dns.servers[0].sni", "labels of at most 63 bytes");
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		 "'https://%s/q','address_ip':'192.0.2.1'}]}}", part + 1);
	load_ok(json, &cfg);
	cr_assert_str_eq(cfg.dns.servers[0].sni, part + 1);
	config_fini(&cfg);

	/* 253 bytes of host and 255 of path (a URL of 524 bytes): both kept whole. */
	memset(part, 'a', 253);
	for (int i = 63; i < 253; i += 64)
		part[i] = '.';
	part[253] = '\0';
	memset(path, 'p', 254);
	path[254] = '\0';
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		 "'https://%s:65535/%s','address_ip':'192.0.2.1'}]}}", part, path);
	load_ok(json, &cfg);
	cr_assert_eq(strlen(cfg.dns.servers[0].sni), 253);
	cr_assert_eq(strlen(cfg.dns.servers[0].path), 255);
	cr_assert_eq(cfg.dns.servers[0].addr.port, 65535);
	config_fini(&cfg);

	/* Over the address's own limit. */
	memset(part, 'a', 600);
	part[600] = '\0';
	snprintf(json, sizeof(json), "{'dns':{'hijack':true,'servers':[{'tag':'a','address':"
		 "'https://192.0.2.1/%s'}]}}", part);
	expect_err(json, "$.dns.servers[0].address", "must be 1 to 600 bytes long, got 618");
}

/* ---- budgets ------------------------------------------------------------------------------ */

Test(config, budgets_profiles_and_overrides)
{
	struct ts_config cfg;
	struct budget_limits mob;

	budget_limits_profile(&mob, BUDGET_PROFILE_MOBILE);
	load_ok("{'budgets':{'profile':'mobile'}}", &cfg);
	cr_assert_eq(cfg.budget_profile, BUDGET_PROFILE_MOBILE);
	cr_assert_eq(memcmp(&cfg.budget, &mob, sizeof(mob)), 0);
	cr_assert_eq(cfg.budget.tcp_sessions[BUDGET_NORMAL], 64, "the mobile profile's admission values");
	cr_assert_eq(cfg.budget.tcp_sessions[BUDGET_ELEVATED], 32);
	cr_assert_eq(cfg.budget.tcp_sessions[BUDGET_CRITICAL], 16);
	config_fini(&cfg);

	/* Overrides apply on top of the profile, whatever the key order. */
	load_ok("{'budgets':{'tcp_sessions':100,'fds':2000,'profile':'mobile'}}", &cfg);
	cr_assert_eq(cfg.budget.tcp_sessions[BUDGET_NORMAL], 100);
	cr_assert_eq(cfg.budget.tcp_sessions[BUDGET_ELEVATED], 32);
	cr_assert_eq(cfg.budget.fds, 2000);
	cr_assert_eq(cfg.budget.nat_entries, mob.nat_entries);
	config_fini(&cfg);

	load_ok("{'budgets':{'memory_limit_mb':0,'nat_entries':1,'tcp_sessions':10,"
		"'tcp_sessions_elevated':10,'tcp_sessions_critical':1,'udp_sessions':7,"
		"'udp_up_queue':65536,'udp_down_queue':1,'listen_backlog':65535,"
		"'buffer_bytes':1125899906842624,'fds':1}}",
		&cfg);
	cr_assert_eq(cfg.budget.memory_limit_mb, 0);
	cr_assert_eq(cfg.budget.nat_entries, 1);
	cr_assert_eq(cfg.budget.tcp_sessions[BUDGET_NORMAL], 10);
	cr_assert_eq(cfg.budget.tcp_sessions[BUDGET_ELEVATED], 10, "equal tiers are fine");
	cr_assert_eq(cfg.budget.tcp_sessions[BUDGET_CRITICAL], 1);
	cr_assert_eq(cfg.budget.udp_sessions, 7);
	cr_assert_eq(cfg.budget.udp_up_queue, 65536);
	cr_assert_eq(cfg.budget.udp_down_queue, 1);
	cr_assert_eq(cfg.budget.listen_backlog, 65535);
	cr_assert_eq(cfg.budget.buffer_bytes, 1ULL << 50);
	cr_assert_eq(cfg.budget.fds, 1);
	cr_assert_eq(budget_limits_check(&cfg.budget, NULL), 0, "core/budget.c agrees");
	config_fini(&cfg);

	load_ok("{'budgets':{'memory_limit_mb':4294967295}}", &cfg);
	cr_assert_eq(cfg.budget.memory_limit_mb, 4294967295u);
	config_fini(&cfg);
}

Test(config, budgets_rejects)
{
	static const struct bad b[] = {
		{ "{'budgets':{'profile':'server'}}", "$.budgets.profile",
		  "expected one of \"desktop\", \"mobile\", got \"server\"" },
		{ "{'budgets':[]}", "$.budgets", "expected an object" },
		{ "{'budgets':{'nat_entries':0}}", "$.budgets.nat_entries", "between 1 and" },
		{ "{'budgets':{'tcp_sessions':0}}", "$.budgets.tcp_sessions", "between 1 and" },
		{ "{'budgets':{'tcp_sessions_critical':0}}", "$.budgets.tcp_sessions_critical",
		  "between 1 and" },
		{ "{'budgets':{'udp_sessions':16777217}}", "$.budgets.udp_sessions", "between 1 and" },
		{ "{'budgets':{'udp_up_queue':0}}", "$.budgets.udp_up_queue", "between 1 and 65536" },
		{ "{'budgets':{'udp_down_queue':65537}}", "$.budgets.udp_down_queue", "between" },
		{ "{'budgets':{'listen_backlog':65536}}", "$.budgets.listen_backlog", "between" },
		{ "{'budgets':{'buffer_bytes':4095}}", "$.budgets.buffer_bytes", "between 4096" },
		{ "{'budgets':{'buffer_bytes':1125899906842625}}", "$.budgets.buffer_bytes",
		  "between" },
		{ "{'budgets':{'fds':0}}", "$.budgets.fds", "between 1 and" },
		{ "{'budgets':{'memory_limit_mb':-1}}", "$.budgets.memory_limit_mb", "between 0" },
		{ "{'budgets':{'memory_limit_mb':4294967296}}", "$.budgets.memory_limit_mb",
		  "between 0 and 4294967295" },
		{ "{'budgets':{'tcp_sessions_normal':5}}", "$.budgets.tcp_sessions_normal",
		  "unknown key" },
		/* Tier order: normal >= elevated >= critical, blaming the key that was written. */
		{ "{'budgets':{'tcp_sessions':10,'tcp_sessions_elevated':11}}",
		  "$.budgets.tcp_sessions_elevated", "11 exceeds tcp_sessions (10)" },
		{ "{'budgets':{'tcp_sessions_elevated':5000}}", "$.budgets.tcp_sessions_elevated",
		  "exceeds tcp_sessions (4096)" },
		{ "{'budgets':{'tcp_sessions':100}}", "$.budgets.tcp_sessions",
		  "100 is below tcp_sessions_elevated (2048, from the profile)" },
		{ "{'budgets':{'tcp_sessions_elevated':8,'tcp_sessions_critical':9,"
		  "'tcp_sessions':10}}",
		  "$.budgets.tcp_sessions_critical", "9 exceeds tcp_sessions_elevated (8)" },
		{ "{'budgets':{'profile':'mobile','tcp_sessions_critical':33}}",
		  "$.budgets.tcp_sessions_critical", "exceeds tcp_sessions_elevated (32)" },
		{ "{'budgets':{'profile':'mobile','tcp_sessions_elevated':15}}",
		  "$.budgets.tcp_sessions_elevated",
		  "15 is below tcp_sessions_critical (16, from the profile)" },
	};
	BAD_TABLE(b);
	expect_ok("{'budgets':{'profile':'mobile','tcp_sessions_elevated':16}}");
}

Test(config, http_outbound_values)
{
	struct ts_config cfg;

	load_ok("{'outbounds':[{'tag':'h','type':'http','server':'[fd00::2]:3128','username':'u',"
		"'password':'p w','routing_mark':7,'bind_interface':'eth0',"
		"'headers':{'X-Tenant':'a b','User-Agent':'ts/1','X-Empty':''}},"
		"{'tag':'n','type':'http','server':'proxy.example:8080'}]}",
		&cfg);
	const struct ts_outbound *h = &cfg.outbounds[0];
	cr_assert_eq(h->type, TS_OUT_HTTP);
	cr_assert_str_eq(config_outbound_type_name(h->type), "http");
	cr_assert(h->server.is_addr);
	cr_assert_eq(h->server.port, 3128);
	cr_assert(h->has_auth);
	cr_assert_str_eq(h->password, "p w");
	cr_assert_eq(h->routing_mark, 7);
	cr_assert_str_eq(h->http_headers, "X-Tenant: a b\r\nUser-Agent: ts/1\r\nX-Empty: \r\n");
	cr_assert_not(cfg.outbounds[1].server.is_addr);
	cr_assert_not(cfg.outbounds[1].has_auth);
	cr_assert_str_eq(cfg.outbounds[1].http_headers, "");
	config_fini(&cfg);
}

Test(config, http_outbound_rejects)
{
	static char many[2048], big[8192];
	size_t off;

	expect_err("{'outbounds':[{'tag':'h','type':'http'}]}", "$.outbounds[0].server",
		   "required for type http");
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4'}]}",
		   "$.outbounds[0].server", "expected \"host:port\"");
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1','username':'u'}]}",
		   "$.outbounds[0].password", "required with username");
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1','username':'a:b',"
		   "'password':'p'}]}", "$.outbounds[0].username", "must not contain ':'");
	expect_err("{'outbounds':[{'tag':'h','type':'socks5','server':'1.2.3.4:1',"
		   "'headers':{}}]}", "$.outbounds[0].headers", "only for type http");
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1','headers':[]}]}",
		   "$.outbounds[0].headers", "expected an object, got an array");
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1',"
		   "'headers':{'X A':'1'}}]}", "$.outbounds[0].headers.X A", "not a header name");
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1',"
		   "'headers':{'X':1}}]}", "$.outbounds[0].headers.X", "expected a string");
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1',"
		   "'headers':{'X':'a\\r\\nEvil: 1'}}]}", "$.outbounds[0].headers.X",
		   "control character");
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1',"
		   "'headers':{'host':'x'}}]}", "$.outbounds[0].headers.host", "set by the proxy");
	/* Header names are case-insensitive: one name given twice is refused. */
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1',"
		   "'headers':{'X-A':'1','X-A':'2'}}]}", "$.outbounds[0].headers.X-A",
		   "given twice");
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1',"
		   "'headers':{'X-A':'1','X-B':'2','x-a':'3'}}]}", "$.outbounds[0].headers.x-a",
		   "given twice");
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1',"
		   "'headers':{'Transfer-Encoding':'chunked'}}]}",
		   "$.outbounds[0].headers.Transfer-Encoding", "set by the proxy");
	expect_err("{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1','username':'u',"
		   "'password':'p','headers':{'proxy-authorization':'Bearer t'}}]}",
		   "$.outbounds[0].headers", "Proxy-Authorization given");
	off = (size_t)snprintf(many, sizeof(many),
			       "{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1','headers':{");
	for (int i = 0; i < 17; i++)
		off += (size_t)snprintf(many + off, sizeof(many) - off, "%s'X-%d':'v'", i ? "," : "", i);
	snprintf(many + off, sizeof(many) - off, "}}]}");
	expect_err(many, "$.outbounds[0].headers.X-16", "too many headers (at most 16)");
	off = (size_t)snprintf(big, sizeof(big),
			       "{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1','headers':{");
	for (int i = 0; i < 2; i++) {
		off += (size_t)snprintf(big + off, sizeof(big) - off, "%s'X-%d':'", i ? "," : "", i);
		memset(big + off, 'v', 2050);  /* two fields of 2057 bytes as sent */
		off += 2050;
		big[off++] = '\'';
	}
	snprintf(big + off, sizeof(big) - off, "}}]}");
	expect_err(big, "$.outbounds[0].headers.X-1", "headers too long (at most 4096 bytes");
}

Test(config, direct_domain_strategy)
{
	static const struct {
		const char *value;
		enum ts_domain_strategy want;
	} ok[] = {
		{ "prefer_ipv6", TS_DS_PREFER_IPV6 },
		{ "prefer_ipv4", TS_DS_PREFER_IPV4 },
		{ "ipv4_only", TS_DS_IPV4_ONLY },
		{ "ipv6_only", TS_DS_IPV6_ONLY },
	};
	struct ts_config cfg;
	char json[256];

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		snprintf(json, sizeof(json),
			 "{'outbounds':[{'tag':'d','type':'direct','domain_strategy':'%s'}]}",
			 ok[i].value);
		load_ok(json, &cfg);
		cr_assert_eq(cfg.outbounds[0].domain_strategy, ok[i].want, "%s", ok[i].value);
		config_fini(&cfg);
	}
	load_ok("{'outbounds':[{'tag':'d','type':'direct'}]}", &cfg);
	cr_assert_eq(cfg.outbounds[0].domain_strategy, TS_DS_PREFER_IPV6, "the default");
	config_fini(&cfg);
}

Test(config, direct_domain_strategy_rejects)
{
	static const struct bad b[] = {
		{ "{'outbounds':[{'tag':'d','type':'direct','domain_strategy':'ipv4'}]}",
		  "$.outbounds[0].domain_strategy",
		  "expected one of \"prefer_ipv6\", \"prefer_ipv4\", \"ipv4_only\", \"ipv6_only\", "
		  "got \"ipv4\"" },
		{ "{'outbounds':[{'tag':'d','type':'direct','domain_strategy':''}]}",
		  "$.outbounds[0].domain_strategy", "got \"\"" },
		{ "{'outbounds':[{'tag':'d','type':'direct','domain_strategy':4}]}",
		  "$.outbounds[0].domain_strategy", "expected" },
		{ "{'outbounds':[{'tag':'s','type':'socks5','server':'1.2.3.4:1',"
		  "'domain_strategy':'ipv4_only'}]}",
		  "$.outbounds[0].domain_strategy", "only for type direct" },
		{ "{'outbounds':[{'tag':'h','type':'http','server':'1.2.3.4:1',"
		  "'domain_strategy':'prefer_ipv4'}]}",
		  "$.outbounds[0].domain_strategy", "only for type direct" },
		{ "{'outbounds':[{'tag':'r','type':'reject','domain_strategy':'prefer_ipv6'}]}",
		  "$.outbounds[0].domain_strategy", "only for type direct" },
	};
	BAD_TABLE(b);
}

/* ---- route.sniff -------------------------------------------------------------------------- */

Test(config, route_sniff)
{
	struct ts_config cfg;
	static const struct bad b[] = {
		{ "{'route':{'sniff':true}}", "$.route.sniff", "expected an object" },
		{ "{'route':{'sniff':{'timeout_ms':0}}}", "$.route.sniff.timeout_ms", "" },
		{ "{'route':{'sniff':{'timeout_ms':10001}}}", "$.route.sniff.timeout_ms", "" },
		{ "{'route':{'sniff':{'max_bytes':63}}}", "$.route.sniff.max_bytes", "" },
		{ "{'route':{'sniff':{'max_bytes':16390}}}", "$.route.sniff.max_bytes", "" },
		{ "{'route':{'sniff':{'protocols':['tls','smtp']}}}", "$.route.sniff.protocols[1]",
		  "smtp" },
		{ "{'route':{'sniff':{'protocols':['quic','quic']}}}", "$.route.sniff.protocols[1]",
		  "listed twice" },
		{ "{'route':{'sniff':{'protocols':'tls'}}}", "$.route.sniff.protocols",
		  "expected an array" },
		{ "{'route':{'sniff':{'override_destination':1}}}",
		  "$.route.sniff.override_destination", "" },
		{ "{'route':{'sniff':{'timeout':300}}}", "$.route.sniff.timeout", "unknown key" },
	};

	load_ok("{}", &cfg);
	cr_assert_not(cfg.route.sniff.present);
	cr_assert_not(ts_sniff_on(&cfg.route.sniff, TS_SNIFF_TLS), "absent: nothing is sniffed");
	config_fini(&cfg);

	load_ok("{'route':{'sniff':{}}}", &cfg);
	cr_assert(ts_sniff_on(&cfg.route.sniff, TS_SNIFF_TLS));
	cr_assert(ts_sniff_on(&cfg.route.sniff, TS_SNIFF_HTTP));
	cr_assert(ts_sniff_on(&cfg.route.sniff, TS_SNIFF_QUIC));
	cr_assert_eq(cfg.route.sniff.timeout_ms, 300);
	cr_assert_eq(cfg.route.sniff.max_bytes, 4096);
	cr_assert_not(cfg.route.sniff.override_destination);
	config_fini(&cfg);

	load_ok("{'route':{'sniff':{'protocols':['quic'],'timeout_ms':50,'max_bytes':16389,"
		"'override_destination':true}}}",
		&cfg);
	cr_assert_not(ts_sniff_on(&cfg.route.sniff, TS_SNIFF_TLS | TS_SNIFF_HTTP));
	cr_assert(ts_sniff_on(&cfg.route.sniff, TS_SNIFF_QUIC));
	cr_assert_eq(cfg.route.sniff.timeout_ms, 50);
	cr_assert_eq(cfg.route.sniff.max_bytes, 16389);
	cr_assert(cfg.route.sniff.override_destination);
	config_fini(&cfg);

	load_ok("{'route':{'sniff':{'enabled':false}}}", &cfg);
	cr_assert_not(ts_sniff_on(&cfg.route.sniff, TS_SNIFF_TLS | TS_SNIFF_HTTP | TS_SNIFF_QUIC));
	config_fini(&cfg);
	load_ok("{'route':{'sniff':{'protocols':[]}}}", &cfg);
	cr_assert_not(ts_sniff_on(&cfg.route.sniff, TS_SNIFF_TLS | TS_SNIFF_HTTP | TS_SNIFF_QUIC));
	config_fini(&cfg);
	BAD_TABLE(b);
}

/* ---- every allocation of the loader refused in turn (failalloc.h) ---- */

static char *read_doc(const char *path)
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
	return buf;
}

/* The blocks of doc that open with a line "```json" alone, up to the next "```" (cut there). */
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

/* It loads, or fails with -ENOMEM (only when an allocation was refused), leaving cfg as
 * config_init does. */
static void load_scenario(void *arg, bool sweep)
{
	char err[TS_ERRLEN];
	struct ts_config cfg;
	int rc = config_load_string(arg, &cfg, err, sizeof(err));

	if (rc == 0)
		cr_assert_not(sweep && failalloc_fired(), "a refused allocation still loaded");
	else
		cr_assert(sweep && rc == -ENOMEM, "rc %d: %s", rc, err);
	config_fini(&cfg);
}

Test(config, every_example_with_each_allocation_refused)
{
	char *blocks[16];
	char *doc = read_doc(TS_SOURCE_DIR "/docs/config.md");
	int nb = json_blocks(doc, blocks, 16);

	cr_assert_geq(nb, 2, "the complete and the desktop example");
	for (int b = 0; b < nb; b++)
		cr_log_info("example %d: %ld allocations refused in turn", b,
			    failalloc_sweep(load_scenario, blocks[b], 3, 1000));
	free(doc);
}
