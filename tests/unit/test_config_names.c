/* test_config_names.c — the configuration's name matchers (core/config_names.c): "rule_sets"
 * files in each format loaded from temporary files, their stats, bounds and errors naming the
 * JSON path, rule_set tags resolved, config_names_match, the summary and the log lines, and a
 * 100,000-line set. Routing by a rule set is tested in test_route.c.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/config.h"

static char dir[] = "/tmp/test_config_names_XXXXXX";

static void setup(void)
{
	cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	cr_expect_eq(system(cmd), 0);
}

TestSuite(config_names, .init = setup, .fini = teardown);

/* Write text to dir/name; path receives its full name. */
static void put(const char *name, const char *text, char *path, size_t len)
{
	FILE *f;

	snprintf(path, len, "%s/%s", dir, name);
	cr_assert_not_null(f = fopen(path, "w"));
	cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
	cr_assert_eq(fclose(f), 0);
}

static int load(const char *json, struct ts_config *cfg, char *err)
{
	return config_load_string(json, cfg, err, TS_ERRLEN);
}

/* A config with one rule set (tag "s") of format fmt at path, and one rule naming it. */
static void one_set_json(char *json, size_t len, const char *fmt, const char *path)
{
	snprintf(json, len,
		 "{\"rule_sets\":[{\"tag\":\"s\",\"format\":\"%s\",\"path\":\"%s\"}],"
		 "\"route\":{\"rules\":[{\"rule_set\":[\"s\"],\"outbound\":\"direct\"}]}}",
		 fmt, path);
}

static bool in_rule(const struct ts_config *cfg, const char *name)
{
	return config_names_match(cfg->rule_sets, &cfg->route.rules[0].names, name, strlen(name));
}

Test(config_names, plain_format)
{
	char path[256], json[512], err[TS_ERRLEN];
	struct ts_config cfg;

	put("plain.txt",
	    "# suffixes\n"
	    "example.com\n"
	    "  .Sub.Example.ORG.  # a leading dot means the same suffix\n"
	    "\n"
	    "bad name\n"
	    "example.com\n",
	    path, sizeof(path));
	one_set_json(json, sizeof(json), "plain", path);
	cr_assert_eq(load(json, &cfg, err), 0, "%s", err);
	cr_assert_eq(cfg.n_rule_sets, 1);
	cr_assert_str_eq(cfg.rule_sets[0].tag, "s");
	cr_assert_eq(cfg.rule_sets[0].format, DOMAIN_FMT_PLAIN);
	cr_assert_str_eq(cfg.rule_sets[0].path, path);
	cr_assert_eq(cfg.rule_sets[0].stats.added, 2);
	cr_assert_eq(cfg.rule_sets[0].stats.bad, 1);
	cr_assert_eq(cfg.rule_sets[0].stats.duplicates, 1);
	cr_assert(cfg.route.has_names);
	cr_assert_eq(cfg.route.rules[0].names.n_sets, 1);
	cr_assert_eq(cfg.route.rules[0].names.sets[0], 0);
	cr_assert(in_rule(&cfg, "example.com"));
	cr_assert(in_rule(&cfg, "www.Example.com."));
	cr_assert(in_rule(&cfg, "a.b.sub.example.org"));
	cr_assert_not(in_rule(&cfg, "badexample.com"));
	cr_assert_not(in_rule(&cfg, "example.org"));
	config_fini(&cfg);
	cr_assert_eq(cfg.rule_sets, NULL, "fini frees and resets");
	cr_assert_eq(cfg.n_rule_sets, 0);
}

Test(config_names, hosts_format)
{
	char path[256], json[512], err[TS_ERRLEN];
	struct ts_config cfg;

	put("hosts",
	    "127.0.0.1 localhost\n"
	    "0.0.0.0 ads.example tracker.example # two names\n"
	    "::1\n"
	    "0.0.0.0 bad_name!\n",
	    path, sizeof(path));
	one_set_json(json, sizeof(json), "hosts", path);
	cr_assert_eq(load(json, &cfg, err), 0, "%s", err);
	cr_assert_eq(cfg.rule_sets[0].format, DOMAIN_FMT_HOSTS);
	cr_assert_eq(cfg.rule_sets[0].stats.added, 3);
	cr_assert_eq(cfg.rule_sets[0].stats.bad, 2, "an address alone, a bad name");
	cr_assert(in_rule(&cfg, "ads.example"));
	cr_assert(in_rule(&cfg, "TRACKER.example"));
	cr_assert_not(in_rule(&cfg, "x.ads.example"), "hosts names are exact");
	config_fini(&cfg);
}

Test(config_names, v2fly_format)
{
	char path[256], json[512], err[TS_ERRLEN];
	struct ts_config cfg;

	put("v2fly.txt",
	    "full:exact.example\n"
	    "domain:suffix.example\n"
	    "bare.example @cn\n"
	    "keyword:tracker\n"
	    "regexp:^ads[0-9]+\\.\n"
	    "include:other-list\n"
	    "unknown:x.example\n",
	    path, sizeof(path));
	one_set_json(json, sizeof(json), "v2fly", path);
	cr_assert_eq(load(json, &cfg, err), 0, "%s", err);
	cr_assert_eq(cfg.rule_sets[0].format, DOMAIN_FMT_V2FLY);
	cr_assert_eq(cfg.rule_sets[0].stats.added, 5);
	cr_assert_eq(cfg.rule_sets[0].stats.includes, 1);
	cr_assert_eq(cfg.rule_sets[0].stats.bad, 1);
	cr_assert(in_rule(&cfg, "exact.example"));
	cr_assert_not(in_rule(&cfg, "a.exact.example"));
	cr_assert(in_rule(&cfg, "a.suffix.example"));
	cr_assert(in_rule(&cfg, "bare.example"));
	cr_assert(in_rule(&cfg, "mytracker.net"));
	cr_assert(in_rule(&cfg, "ads42.example.net"));
	cr_assert_not(in_rule(&cfg, "ads.example.net"));
	config_fini(&cfg);
}

Test(config_names, own_names_or_any_set)
{
	char p1[256], p2[256], json[1024], err[TS_ERRLEN];
	struct ts_config cfg;

	put("a.txt", "a.example\n", p1, sizeof(p1));
	put("b.txt", "full:b.example\n", p2, sizeof(p2));
	snprintf(json, sizeof(json),
		 "{\"rule_sets\":[{\"tag\":\"a\",\"format\":\"plain\",\"path\":\"%s\"},"
		 "{\"tag\":\"b\",\"format\":\"v2fly\",\"path\":\"%s\"}],"
		 "\"route\":{\"rules\":[{\"rule_set\":[\"b\",\"a\"],\"domain\":[\"own.example\"],"
		 "\"outbound\":\"direct\"}]}}",
		 p1, p2);
	cr_assert_eq(load(json, &cfg, err), 0, "%s", err);
	cr_assert_eq(cfg.route.rules[0].names.sets[0], 1, "tags resolved in the rule's order");
	cr_assert_eq(cfg.route.rules[0].names.sets[1], 0);
	cr_assert_eq(cfg.route.rule_sets, cfg.rule_sets);
	cr_assert(in_rule(&cfg, "own.example"));
	cr_assert(in_rule(&cfg, "x.a.example"));
	cr_assert(in_rule(&cfg, "b.example"));
	cr_assert_not(in_rule(&cfg, "x.b.example"));
	cr_assert_not(config_names_match(cfg.rule_sets, &cfg.route.rules[0].names, NULL, 0));
	struct ts_names empty = { 0 };
	cr_assert(config_names_empty(&empty));
	cr_assert_not(config_names_match(cfg.rule_sets, &empty, "a.example", 9));
	cr_assert_eq(config_rule_set_index(&cfg, "b"), 1);
	cr_assert_eq(config_rule_set_index(&cfg, "c"), -1);
	config_fini(&cfg);
}

/* The error is exactly "config: <path>: <reason...>", one line, and nothing stays allocated. */
static void expect_err(const char *json, const char *path, const char *reason)
{
	char err[TS_ERRLEN], prefix[256];
	struct ts_config cfg;
	int ret = load(json, &cfg, err);

	snprintf(prefix, sizeof(prefix), "config: %s: ", path);
	cr_expect_eq(ret, -EINVAL, "%s: rc %d", json, ret);
	cr_expect(strncmp(err, prefix, strlen(prefix)) == 0, "want %s, got: %s", prefix, err);
	cr_expect(strstr(err, reason) != NULL, "want '%s', got: %s", reason, err);
	cr_expect(strchr(err, '\n') == NULL, "one line: %s", err);
	cr_expect_eq(cfg.rule_sets, NULL);
	cr_expect_eq(cfg.route.rules, NULL);
	config_fini(&cfg);
}

Test(config_names, file_errors_name_the_path)
{
	char ok[256], bad[256], json[1024];

	put("ok.txt", "ok.example\n", ok, sizeof(ok));
	put("bad.txt", "0.0.0.0 a.example\n0.0.0.0 b.example\n", bad, sizeof(bad));

	expect_err("{\"rule_sets\":[{\"tag\":\"x\",\"format\":\"plain\","
		   "\"path\":\"/nonexistent/twinstack-set\"}]}",
		   "$.rule_sets[0].path",
		   "cannot read /nonexistent/twinstack-set: No such file or directory");
	snprintf(json, sizeof(json), "{\"rule_sets\":[{\"tag\":\"x\",\"format\":\"plain\","
				     "\"path\":\"%s\"}]}", dir);
	expect_err(json, "$.rule_sets[0].path", "not a regular file");
	/* hosts lines read as v2fly: every line bad, so the format must be wrong. */
	snprintf(json, sizeof(json),
		 "{\"rule_sets\":[{\"tag\":\"o\",\"format\":\"plain\",\"path\":\"%s\"},"
		 "{\"tag\":\"x\",\"format\":\"v2fly\",\"path\":\"%s\"}]}", ok, bad);
	expect_err(json, "$.rule_sets[1].path",
		   "no valid entry (2 bad lines): is \"format\": \"v2fly\" right?");

	/* Over 64 MiB (a sparse file: nothing is written). */
	char big[256];
	snprintf(big, sizeof(big), "%s/big.txt", dir);
	FILE *f = fopen(big, "w");
	cr_assert_not_null(f);
	cr_assert_eq(ftruncate(fileno(f), (off_t)TS_RULE_SET_FILE_MAX + 1), 0);
	fclose(f);
	snprintf(json, sizeof(json), "{\"rule_sets\":[{\"tag\":\"x\",\"format\":\"plain\","
				     "\"path\":\"%s\"}]}", big);
	expect_err(json, "$.rule_sets[0].path", "larger than 64 MiB");
}

Test(config_names, schema_errors_name_the_path)
{
	char ok[256], json[1024];

	put("ok.txt", "ok.example\n", ok, sizeof(ok));
	snprintf(json, sizeof(json),
		 "{\"rule_sets\":[{\"tag\":\"a\",\"format\":\"plain\",\"path\":\"%s\"},"
		 "{\"tag\":\"a\",\"format\":\"plain\",\"path\":\"%s\"}]}", ok, ok);
	expect_err(json, "$.rule_sets[1].tag", "\"a\" is the tag of rule_sets[0] too");
	snprintf(json, sizeof(json),
		 "{\"rule_sets\":[{\"tag\":\"a\",\"format\":\"plain\",\"path\":\"%s\"}],"
		 "\"route\":{\"rules\":[{\"cidr\":[\"10.0.0.0/8\"],\"outbound\":\"direct\"},"
		 "{\"rule_set\":[\"a\",\"nope\"],\"outbound\":\"direct\"}]}}", ok);
	expect_err(json, "$.route.rules[1].rule_set[1]", "no rule set is tagged \"nope\"");
	snprintf(json, sizeof(json),
		 "{\"rule_sets\":[{\"tag\":\"a\",\"format\":\"plain\",\"path\":\"%s\"}],"
		 "\"route\":{\"rules\":[{\"rule_set\":[\"a\",\"a\"],\"outbound\":\"direct\"}]}}", ok);
	expect_err(json, "$.route.rules[0].rule_set[1]", "\"a\" is listed twice");
	expect_err("{\"route\":{\"rules\":[{\"rule_set\":[\"a\"],\"outbound\":\"direct\"}]}}",
		   "$.route.rules[0].rule_set[0]", "no rule set is tagged \"a\"");
	expect_err("{\"route\":{\"rules\":[{\"rule_set\":[],\"outbound\":\"direct\"}]}}",
		   "$.route.rules[0].rule_set", "");
	expect_err("{\"route\":{\"rules\":[{\"rule_set\":[7],\"outbound\":\"direct\"}]}}",
		   "$.route.rules[0].rule_set[0]", "expected a string");
	expect_err("{\"rule_sets\":[{\"format\":\"plain\",\"path\":\"/x\"}]}",
		   "$.rule_sets[0].tag", "required");
	expect_err("{\"rule_sets\":[{\"tag\":\"a\",\"path\":\"/x\"}]}",
		   "$.rule_sets[0].format", "required");
	expect_err("{\"rule_sets\":[{\"tag\":\"a\",\"format\":\"plain\"}]}",
		   "$.rule_sets[0].path", "required");
	expect_err("{\"rule_sets\":[{\"tag\":\"a\",\"format\":\"clash\",\"path\":\"/x\"}]}",
		   "$.rule_sets[0].format", "expected one of \"plain\", \"hosts\", \"v2fly\"");
	expect_err("{\"rule_sets\":[{\"tag\":\"a\",\"format\":\"plain\",\"path\":\"\"}]}",
		   "$.rule_sets[0].path", "");
	expect_err("{\"rule_sets\":[{\"tag\":\"a\",\"format\":\"plain\",\"path\":\"/x\",\"y\":1}]}",
		   "$.rule_sets[0].y", "unknown key");
	expect_err("{\"rule_sets\":{}}", "$.rule_sets", "expected an array");

	/* At most 64 sets. */
	size_t cap = 70 * 300, n = 0;
	char *many = malloc(cap);
	cr_assert_not_null(many);
	n += (size_t)snprintf(many + n, cap - n, "{\"rule_sets\":[");
	for (int i = 0; i < TS_MAX_RULE_SETS + 1; i++)
		n += (size_t)snprintf(many + n, cap - n,
				      "%s{\"tag\":\"t%d\",\"format\":\"plain\",\"path\":\"%s\"}",
				      i ? "," : "", i, ok);
	snprintf(many + n, cap - n, "]}");
	expect_err(many, "$.rule_sets", "64");
	free(many);
}

Test(config_names, empty_file_and_empty_list_are_fine)
{
	char path[256], json[512], err[TS_ERRLEN], sum[512];
	struct ts_config cfg;

	put("empty.txt", "# nothing yet\n\n", path, sizeof(path));
	one_set_json(json, sizeof(json), "plain", path);
	cr_assert_eq(load(json, &cfg, err), 0, "%s", err);
	cr_assert_eq(cfg.rule_sets[0].stats.added, 0);
	cr_assert_not(in_rule(&cfg, "a.example"));
	config_summary(&cfg, sum, sizeof(sum));
	cr_assert(strstr(sum, " rules=1 rule_sets=1 [s: 0 entries, 0 bad lines, "), "%s", sum);
	config_fini(&cfg);

	cr_assert_eq(load("{\"rule_sets\":[]}", &cfg, err), 0, "%s", err);
	cr_assert_eq(cfg.n_rule_sets, 0);
	config_summary(&cfg, sum, sizeof(sum));
	cr_assert_null(strstr(sum, "rule_sets"), "%s", sum);
	config_fini(&cfg);
}

static void sink(void *arg, enum log_level level, const char *line, size_t len)
{
	char *out = arg;
	size_t used = strlen(out);

	cr_assert_eq(level, LOG_LEVEL_INFO);
	if (used + len < 1024)
		memcpy(out + used, line, len), out[used + len] = '\0';
}

Test(config_names, log_line_per_set)
{
	char p1[256], p2[256], json[1024], err[TS_ERRLEN], lines[1024] = "";
	struct ts_config cfg;
	struct log lg;

	put("a.txt", "a.example\nb.example\nbad name\n", p1, sizeof(p1));
	put("b.txt", "full:c.example\n", p2, sizeof(p2));
	snprintf(json, sizeof(json),
		 "{\"rule_sets\":[{\"tag\":\"a\",\"format\":\"plain\",\"path\":\"%s\"},"
		 "{\"tag\":\"b\",\"format\":\"v2fly\",\"path\":\"%s\"}]}", p1, p2);
	cr_assert_eq(load(json, &cfg, err), 0, "%s", err);
	log_init(&lg, LOG_LEVEL_INFO, -1);
	lg.clock = NULL;
	lg.sink = sink;
	lg.sink_arg = lines;
	config_log_rule_sets(&cfg, &lg);
	cr_assert(strstr(lines, "rule set \"a\": 2 entries, 1 bad lines, "), "%s", lines);
	cr_assert(strstr(lines, "rule set \"b\": 1 entries, 0 bad lines, "), "%s", lines);
	cr_assert(strstr(lines, p2), "the path is named: %s", lines);
	config_fini(&cfg);
}

/* 100,000 suffixes: all loaded. The time is printed, not asserted (it depends on the host). */
Test(config_names, hundred_thousand_suffixes)
{
	char path[256], json[512], err[TS_ERRLEN];
	struct timespec t0, t1;
	struct ts_config cfg;
	FILE *f;

	snprintf(path, sizeof(path), "%s/big-plain.txt", dir);
	cr_assert_not_null(f = fopen(path, "w"));
	for (int i = 0; i < 100000; i++)
		fprintf(f, "site%d.example%d.com\n", i, i % 97);
	cr_assert_eq(fclose(f), 0);
	one_set_json(json, sizeof(json), "plain", path);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert_eq(load(json, &cfg, err), 0, "%s", err);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cr_assert_eq(cfg.rule_sets[0].stats.added, 100000);
	cr_assert_eq(cfg.rule_sets[0].stats.bad, 0);
	cr_assert(in_rule(&cfg, "www.site99999.example89.com"));
	cr_assert_not(in_rule(&cfg, "site99999.example90.com"));
	printf("rule set of 100000 suffixes: loaded in %u ms (config load %.1f ms)\n",
	       cfg.rule_sets[0].load_ms,
	       (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
	config_fini(&cfg);
}
