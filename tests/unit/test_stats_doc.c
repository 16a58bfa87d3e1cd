/* test_stats_doc.c — the key/value document: JSON nesting, order and escaping, Prometheus
 * lines byte for byte, key rules and sticky errors. JSON output is also parsed with cJSON (an
 * independent parser) to prove it is valid. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/stats_doc.h"
#include "testutil.h"

static struct stats_doc *doc;

static void setup(void)
{
	doc = stats_doc_new();
	cr_assert_not_null(doc);
}

static void teardown(void)
{
	stats_doc_free(doc);
	doc = NULL;
}

TestSuite(stats_doc, .init = setup, .fini = teardown);

/* Render to JSON, check it against want exactly, and return it parsed (caller deletes). */
static cJSON *json_is(const char *want)
{
	char *out;
	size_t len;
	cJSON *j;

	cr_assert_eq(stats_doc_json(doc, &out, &len), 0);
	cr_assert_eq(len, strlen(out));
	cr_assert_str_eq(out, want);
	j = cJSON_Parse(out);
	cr_assert_not_null(j, "cJSON rejects: %s", out);
	free(out);
	return j;
}

static void prom_is(const char *want)
{
	char *out;
	size_t len;

	cr_assert_eq(stats_doc_prometheus(doc, &out, &len), 0);
	cr_assert_eq(len, strlen(out));
	cr_assert_str_eq(out, want);
	free(out);
}

Test(stats_doc, nesting_follows_first_insertion)
{
	cJSON *j;

	cr_assert_eq(stats_doc_add_str(doc, "stack", "system"), 0);
	cr_assert_eq(stats_doc_gauge(doc, "uptime_s", 5), 0);
	cr_assert_eq(stats_doc_counter(doc, "tun.rx_packets", 1), 0);
	cr_assert_eq(stats_doc_counter(doc, "drops.malformed", 2), 0);
	/* Added after "drops": still lands inside "tun", which keeps its first position. */
	cr_assert_eq(stats_doc_counter(doc, "tun.tx_packets", 3), 0);
	cr_assert_eq(stats_doc_gauge(doc, "a.b.c.d", 4), 0);
	cr_assert_eq(stats_doc_gauge(doc, "a.b.e", 6), 0);
	cr_assert_eq(stats_doc_count(doc), 7);
	j = json_is("{\"stack\":\"system\",\"uptime_s\":5,"
		    "\"tun\":{\"rx_packets\":1,\"tx_packets\":3},\"drops\":{\"malformed\":2},"
		    "\"a\":{\"b\":{\"c\":{\"d\":4},\"e\":6}}}\n");
	cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "tun"), "tx_packets")->valuedouble,
		     3);
	cJSON_Delete(j);
}

Test(stats_doc, empty_document)
{
	cJSON_Delete(json_is("{}\n"));
	prom_is("");
}

Test(stats_doc, numbers)
{
	cJSON *j;

	stats_doc_add_u64(doc, "u.max", STATS_COUNTER, UINT64_MAX);
	stats_doc_add_i64(doc, "i.neg", STATS_GAUGE, INT64_MIN);
	stats_doc_add_double(doc, "d.tenth", STATS_GAUGE, 0.1);
	stats_doc_add_double(doc, "d.big", STATS_GAUGE, 1e300);
	stats_doc_add_double(doc, "d.third", STATS_GAUGE, 1.0 / 3.0);
	stats_doc_add_double(doc, "d.sum", STATS_GAUGE, 0.1 + 0.2); /* needs all 17 digits */
	stats_doc_add_double(doc, "d.nan", STATS_GAUGE, NAN);
	stats_doc_add_double(doc, "d.pinf", STATS_GAUGE, INFINITY);
	stats_doc_add_double(doc, "d.ninf", STATS_GAUGE, -INFINITY);
	cr_assert_eq(stats_doc_error(doc, NULL), 0);
	j = json_is("{\"u\":{\"max\":18446744073709551615},\"i\":{\"neg\":-9223372036854775808},"
		    "\"d\":{\"tenth\":0.1,\"big\":1e+300,\"third\":0.3333333333333333,"
		    "\"sum\":0.30000000000000004,"
		    "\"nan\":null,\"pinf\":null,\"ninf\":null}}\n");
	cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "d"), "third")->valuedouble,
		     1.0 / 3.0);
	cJSON_Delete(j);
	prom_is("# TYPE twinstack_u_max counter\ntwinstack_u_max 18446744073709551615\n"
		"# TYPE twinstack_i_neg gauge\ntwinstack_i_neg -9223372036854775808\n"
		"# TYPE twinstack_d_tenth gauge\ntwinstack_d_tenth 0.1\n"
		"# TYPE twinstack_d_big gauge\ntwinstack_d_big 1e+300\n"
		"# TYPE twinstack_d_third gauge\ntwinstack_d_third 0.3333333333333333\n"
		"# TYPE twinstack_d_sum gauge\ntwinstack_d_sum 0.30000000000000004\n"
		"# TYPE twinstack_d_nan gauge\ntwinstack_d_nan NaN\n"
		"# TYPE twinstack_d_pinf gauge\ntwinstack_d_pinf +Inf\n"
		"# TYPE twinstack_d_ninf gauge\ntwinstack_d_ninf -Inf\n");
}

Test(stats_doc, json_string_escaping)
{
	cJSON *j;

	stats_doc_add_str(doc, "s.quote", "a\"b\\c/d");
	stats_doc_add_str(doc, "s.ctl", "\n\t\r\b\f\x01\x1f\x7f");
	stats_doc_add_str(doc, "s.utf8", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
	/* 0xff, a truncated 2-byte sequence, an overlong '/', a surrogate, above U+10FFFF. */
	stats_doc_add_str(doc, "s.bad", "\xff|\xc3|\xc0\xaf|\xed\xa0\x80|\xf4\x90\x80\x80");
	stats_doc_add_str(doc, "s.empty", "");
	cr_assert_eq(stats_doc_error(doc, NULL), 0);
	j = json_is("{\"s\":{\"quote\":\"a\\\"b\\\\c/d\","
		    "\"ctl\":\"\\u000a\\u0009\\u000d\\u0008\\u000c\\u0001\\u001f\x7f\","
		    "\"utf8\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\","
		    "\"bad\":\"\xef\xbf\xbd|\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd|"
		    "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
		    "\xef\xbf\xbd\",\"empty\":\"\"}}\n");
	cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "s"), "quote")->valuestring,
			 "a\"b\\c/d");
	cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "s"), "ctl")->valuestring,
			 "\n\t\r\b\f\x01\x1f\x7f");
	cJSON_Delete(j);
}

Test(stats_doc, prometheus_exact)
{
	stats_doc_add_str(doc, "stack", "system");
	stats_doc_counter(doc, "tun.rx_packets", 10);
	stats_doc_gauge(doc, "sessions.active", 2);
	stats_doc_add_str(doc, "tun.name", "tun0");
	stats_doc_add_str(doc, "note", "a\"b\\c\nd\xff");
	stats_doc_add_i64(doc, "clock.skew_ns", STATS_COUNTER, -5);
	cr_assert_eq(stats_doc_error(doc, NULL), 0);
	/* Strings: one info sample, first, labels in insertion order, values escaped. */
	prom_is("# TYPE twinstack_info gauge\n"
		"twinstack_info{stack=\"system\",tun_name=\"tun0\","
		"note=\"a\\\"b\\\\c\\nd\xef\xbf\xbd\"} 1\n"
		"# TYPE twinstack_tun_rx_packets counter\n"
		"twinstack_tun_rx_packets 10\n"
		"# TYPE twinstack_sessions_active gauge\n"
		"twinstack_sessions_active 2\n"
		"# TYPE twinstack_clock_skew_ns counter\n"
		"twinstack_clock_skew_ns -5\n");
}

Test(stats_doc, key_rules)
{
	static const char *const bad[] = { "", ".a", "a.", "a..b", "1abc", "_a", "a-b", "a b",
					   "a/b", "tun.rx packets", "\xc3\xa9" };
	char longkey[STATS_KEY_MAX + 2];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(stats_doc_gauge(doc, bad[i], 1), -EINVAL, "key \"%s\"", bad[i]);
	memset(longkey, 'k', sizeof(longkey));
	longkey[STATS_KEY_MAX + 1] = '\0';
	cr_assert_eq(stats_doc_gauge(doc, longkey, 1), -EINVAL);
	longkey[STATS_KEY_MAX] = '\0';
	cr_assert_eq(stats_doc_gauge(doc, longkey, 1), 0, "exactly STATS_KEY_MAX bytes is fine");
	cr_assert_eq(stats_doc_gauge(doc, "A.b_9.C", 1), 0);
	cr_assert_eq(stats_doc_count(doc), 2);
}

Test(stats_doc, conflicts)
{
	cr_assert_eq(stats_doc_gauge(doc, "tun.rx", 1), 0);
	cr_assert_eq(stats_doc_gauge(doc, "tun.rx", 2), -EEXIST, "duplicate");
	cr_assert_eq(stats_doc_add_str(doc, "tun.rx", "x"), -EEXIST, "duplicate, other type");
	cr_assert_eq(stats_doc_gauge(doc, "tun", 2), -EEXIST, "value where an object is");
	cr_assert_eq(stats_doc_gauge(doc, "tun.rx.x", 2), -EEXIST, "object where a value is");
	cr_assert_eq(stats_doc_gauge(doc, "tun_rx", 2), -EEXIST, "same metric name");
	cr_assert_eq(stats_doc_gauge(doc, "a.b_c", 1), 0);
	cr_assert_eq(stats_doc_gauge(doc, "a_b.c", 1), -EEXIST, "same metric name");
	cr_assert_eq(stats_doc_gauge(doc, "info", 1), -EINVAL, "reserved for the info metric");
	cr_assert_eq(stats_doc_add_str(doc, "info", "a string may use it"), 0);
	cr_assert_eq(stats_doc_count(doc), 3);
	/* The refused adds left nothing behind. */
	cJSON_Delete(json_is("{\"tun\":{\"rx\":1},\"a\":{\"b_c\":1},"
			     "\"info\":\"a string may use it\"}\n"));
}

Test(stats_doc, first_error_is_sticky_and_reset_clears_it)
{
	const char *why = NULL;

	cr_assert_eq(stats_doc_gauge(doc, "ok", 1), 0);
	cr_assert_eq(stats_doc_gauge(doc, "bad key", 1), -EINVAL);
	cr_assert_eq(stats_doc_gauge(doc, "ok", 2), -EEXIST);
	cr_assert_eq(stats_doc_gauge(doc, "still.fine", 3), 0, "later adds still work");
	cr_assert_eq(stats_doc_error(doc, &why), -EINVAL);
	cr_assert_not_null(strstr(why, "\"bad key\""), "%s", why);
	cr_assert_not_null(strstr(why, "only letters"), "%s", why);
	stats_doc_reset(doc);
	cr_assert_eq(stats_doc_error(doc, &why), 0);
	cr_assert_str_eq(why, "");
	cr_assert_eq(stats_doc_count(doc), 0);
	cr_assert_eq(stats_doc_gauge(doc, "ok", 7), 0, "the old key is gone");
	cJSON_Delete(json_is("{\"ok\":7}\n"));
}

/* Enough keys and text to grow every array many times; every value must come back. */
Test(stats_doc, many_keys)
{
	char key[64], *out;
	size_t len;
	cJSON *j;

	for (int i = 0; i < 3000; i++) {
		snprintf(key, sizeof(key), "g%d.k%d", i % 37, i);
		cr_assert_eq(stats_doc_counter(doc, key, (uint64_t)i * 3), 0);
	}
	cr_assert_eq(stats_doc_count(doc), 3000);
	cr_assert_eq(stats_doc_json(doc, &out, &len), 0);
	j = cJSON_Parse(out);
	cr_assert_not_null(j);
	cr_assert_eq(cJSON_GetArraySize(j), 37);
	for (int i = 0; i < 3000; i += 97) {
		char g[16], k[16];
		snprintf(g, sizeof(g), "g%d", i % 37);
		snprintf(k, sizeof(k), "k%d", i);
		cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, g), k)->valuedouble,
			     (double)i * 3);
	}
	cJSON_Delete(j);
	free(out);
	cr_assert_eq(stats_doc_prometheus(doc, &out, &len), 0);
	cr_assert_not_null(strstr(out, "# TYPE twinstack_g4_k2964 counter\n"
				       "twinstack_g4_k2964 8892\n"));
	free(out);
}
