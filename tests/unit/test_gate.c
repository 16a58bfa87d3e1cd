/* test_gate.c — the regression gate (cli/gate_lib.c): synthetic baselines and currents, from
 * in-memory JSON and from the fixtures in tests/gate/.
 *
 * The cli/ sources are linked only into the twinstack binary, so the library is compiled in
 * here. The fixtures are found next to this file (__FILE__ is absolute in a CMake build). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/gate_lib.c"

#define FIXTURES_DIR_LEN 512

/* The path of a fixture in tests/gate/ into buf. */
static const char *fixture(char *buf, size_t len, const char *name)
{
	const char *slash = strrchr(__FILE__, '/');
	int dir = slash ? (int)(slash - __FILE__) : 1;

	snprintf(buf, len, "%.*s/../gate/%s", dir, slash ? __FILE__ : ".", name);
	return buf;
}

struct run_out {
	int code;
	char err[1024];
	char *text; /* the printed table */
};

static void run_files(const char *base, const char *cur, const struct gate_opts *o,
		      struct run_out *out)
{
	char b[FIXTURES_DIR_LEN], c[FIXTURES_DIR_LEN];
	size_t len = 0;
	FILE *f;

	out->err[0] = '\0';
	out->text = NULL;
	cr_assert_not_null(f = open_memstream(&out->text, &len));
	out->code = gate_run(fixture(b, sizeof(b), base), fixture(c, sizeof(c), cur), o, f,
			     out->err, sizeof(out->err));
	fclose(f);
}

static int run_default(const char *base, const char *cur, struct run_out *out)
{
	struct gate_opts o;

	gate_opts_init(&o);
	run_files(base, cur, &o, out);
	return out->code;
}

/* ---- the fixtures: the cases the gate must decide ------------------------------------------ */

Test(gate, injected_15pct_slowdown_fails)
{
	struct run_out r;

	cr_expect_eq(run_default("baseline.json", "current_slow15.json", &r), 1, "%s", r.text);
	cr_expect(strstr(r.text, "system/per-packet/q1/tcp_bulk/upload/s16"), "%s", r.text);
	cr_expect(strstr(r.text, "-15.0%"), "%s", r.text);
	cr_expect(strstr(r.text, "REGRESSION"), "%s", r.text);
	cr_expect(strstr(r.text, "1 regression,"), "%s", r.text);
	/* the ceiling_fraction row that fell by half is not gated: not even listed */
	cr_expect_null(strstr(r.text, "ceiling_fraction"), "%s", r.text);
	free(r.text);
}

Test(gate, noise_level_differences_pass)
{
	struct run_out r;

	cr_expect_eq(run_default("baseline.json", "current_noise.json", &r), 0, "%s %s", r.text,
		     r.err);
	cr_expect_null(strstr(r.text, "REGRESSION"), "%s", r.text);
	cr_expect(strstr(r.text, "8 compared, 0 regressions"), "%s", r.text);
	/* the connrate row (-3 %), keyed with "-" for its null direction and stream count */
	cr_expect(strstr(r.text, "system/per-packet/q1/connrate/-/-"), "%s", r.text);
	cr_expect(strstr(r.text, "-3.0%"), "%s", r.text);
	free(r.text);
}

Test(gate, identical_files_pass)
{
	struct run_out r;

	cr_expect_eq(run_default("baseline.json", "baseline.json", &r), 0, "%s", r.text);
	free(r.text);
}

Test(gate, instructions_3pct_up_fails_at_2pct)
{
	struct gate_opts o;
	struct run_out r;

	cr_expect_eq(run_default("baseline.json", "current_instr3.json", &r), 1, "%s", r.text);
	cr_expect(strstr(r.text, "instructions_per_op"), "%s", r.text);
	cr_expect(strstr(r.text, "+3.0%"), "%s", r.text);
	free(r.text);

	gate_opts_init(&o);
	o.instr_tol_pct = 5;
	run_files("baseline.json", "current_instr3.json", &o, &r);
	cr_expect_eq(r.code, 0, "%s", r.text);
	free(r.text);
}

Test(gate, missing_rows_reported_not_failed)
{
	struct gate_opts o;
	struct run_out r;

	cr_expect_eq(run_default("baseline.json", "current_missing.json", &r), 0, "%s", r.text);
	cr_expect(strstr(r.text, "2 missing in current"), "%s", r.text);
	cr_expect(strstr(r.text, "nat_steady"), "%s", r.text);
	cr_expect(strstr(r.text, "missing"), "%s", r.text);
	free(r.text);

	gate_opts_init(&o);
	o.strict = true;
	run_files("baseline.json", "current_missing.json", &o, &r);
	cr_expect_eq(r.code, 1, "--strict: %s", r.text);
	free(r.text);
}

/* Files measured under different congestion controls are refused, naming both; a file that does
 * not record one (older runs, callgrind files) still compares. */
Test(gate, different_congestion_control_exits_2)
{
	struct run_out r;

	cr_expect_eq(run_default("baseline_reno.json", "current_bbr.json", &r), 2);
	cr_expect(strstr(r.err, "baseline_reno.json was measured with TCP congestion control reno"),
		  "%s", r.err);
	cr_expect(strstr(r.err, "current_bbr.json with bbr"), "%s", r.err);
	cr_expect(strstr(r.err, "--cc reno"), "%s", r.err);
	free(r.text);
	cr_expect_eq(run_default("baseline_reno.json", "baseline_reno.json", &r), 0, "%s", r.err);
	cr_expect(strstr(r.text, "0 regressions"), "%s", r.text);
	free(r.text);
	cr_expect_eq(run_default("baseline.json", "current_bbr.json", &r), 0, "%s", r.err);
	free(r.text);
	cr_expect_eq(run_default("current_bbr.json", "callgrind_ok.json", &r), 0, "%s", r.err);
	free(r.text);
}

/* The recorded name is read; null means not recorded; a parse resets what a set held. */
Test(gate, congestion_control_parsed)
{
	static const char *with = "{\"meta\":{\"tcp_congestion\":{\"testbed\":\"reno\"}},"
				  "\"rows\":[{\"metric\":\"redirect_fraction\",\"stack\":\"s\","
				  "\"workload\":\"w\",\"median\":1}]}";
	static const char *null = "{\"meta\":{\"tcp_congestion\":{\"testbed\":null}},\"rows\":[]}";
	struct gate_set s = { 0 };
	char err[256] = "";

	cr_assert_eq(gate_parse("a", with, strlen(with), &s, err, sizeof(err)), 0, "%s", err);
	cr_expect_str_eq(s.cc, "reno");
	cr_expect_eq(s.n, 1);
	gate_set_fini(&s);
	cr_expect_str_eq(s.cc, "");
	strcpy(s.cc, "bbr");
	cr_assert_eq(gate_parse("b", null, strlen(null), &s, err, sizeof(err)), 0, "%s", err);
	cr_expect_str_eq(s.cc, "");
	gate_set_fini(&s);
}

Test(gate, malformed_json_exits_2_naming_file)
{
	struct run_out r;

	cr_expect_eq(run_default("baseline.json", "bad_json.json", &r), 2);
	cr_expect(strstr(r.err, "bad_json.json: $: not valid JSON"), "%s", r.err);
	free(r.text);
}

Test(gate, wrong_type_exits_2_naming_path)
{
	struct run_out r;

	cr_expect_eq(run_default("bad_type.json", "baseline.json", &r), 2);
	cr_expect(strstr(r.err, "bad_type.json: $.rows[4].median: expected a number"), "%s",
		  r.err);
	free(r.text);
}

Test(gate, missing_file_exits_2_naming_file)
{
	struct run_out r;

	cr_expect_eq(run_default("baseline.json", "no_such_file.json", &r), 2);
	cr_expect(strstr(r.err, "no_such_file.json: cannot read"), "%s", r.err);
	free(r.text);
}

Test(gate, callgrind_format_compares_with_results_rows)
{
	struct run_out r;

	/* callgrind_ok.json has the instruction rows of baseline.json; its redirect rows are
	 * missing, which is reported but passes. */
	cr_expect_eq(run_default("baseline.json", "callgrind_ok.json", &r), 0, "%s", r.text);
	cr_expect(strstr(r.text, "3 compared, 0 regressions, 5 missing"), "%s", r.text);
	cr_expect_null(strstr(r.text, "note:"), "%s", r.text);
	free(r.text);
	cr_expect_eq(run_default("callgrind_ok.json", "current_instr3.json", &r), 1, "%s", r.text);
	free(r.text);
}

/* A rig baseline from before the redirect baseline (ceiling_fraction rows, none of
 * redirect_fraction) is refused with how to regenerate it, even though it has instruction
 * rows: it would pass any throughput. Nothing is printed to the table. */
Test(gate, old_metric_baseline_exits_2)
{
	struct run_out r;

	cr_expect_eq(run_default("baseline_old_metric.json", "baseline.json", &r), 2, "%s",
		     r.text);
	cr_expect(strstr(r.err, "baseline_old_metric.json: only has the old ceiling_fraction "
				"metric (4 rows), no redirect_fraction row"),
		  "%s", r.err);
	cr_expect(strstr(r.err, "make bench BENCH_ARGS=--ablation, then copy its results.json"),
		  "%s", r.err);
	cr_expect(strstr(r.err, "to bench/baseline/ablation.json"), "%s", r.err);
	cr_expect_str_eq(r.text, "");
	free(r.text);
	cr_expect_eq(run_default("baseline_old_metric.json", "baseline_old_metric.json", &r), 2);
	cr_expect(strstr(r.err, "only has the old ceiling_fraction metric"), "%s", r.err);
	free(r.text);
}

/* A current file with only the old rows compares: the baseline's redirect rows are missing
 * (a failure under --strict) and a note after the table says why. */
Test(gate, old_metric_current_reported_missing)
{
	struct gate_opts o;
	struct run_out r;

	cr_expect_eq(run_default("baseline.json", "baseline_old_metric.json", &r), 0, "%s %s",
		     r.text, r.err);
	cr_expect(strstr(r.text, "3 compared, 0 regressions, 5 missing in current, 0 new"), "%s",
		  r.text);
	cr_expect(strstr(r.text, "gate: note: "), "%s", r.text);
	cr_expect(strstr(r.text, "baseline_old_metric.json has only the old ceiling_fraction "
				 "metric, no redirect_fraction row"),
		  "%s", r.text);
	cr_expect(strstr(r.text, "the baseline's 5 redirect_fraction rows are missing"), "%s",
		  r.text);
	free(r.text);

	gate_opts_init(&o);
	o.strict = true;
	run_files("baseline.json", "baseline_old_metric.json", &o, &r);
	cr_expect_eq(r.code, 1, "--strict: %s", r.text);
	free(r.text);
}

/* ---- in-memory synthetic files: the rules themselves --------------------------------------- */

#define ROW(metric, stack, workload) \
	"{\"metric\":\"" metric "\",\"stack\":\"" stack "\",\"workload\":\"" workload "\"," \
	"\"median\":1}"

/* Which baselines can be compared against: each text parsed, then gate_check_baseline. */
Test(gate, baseline_check_table)
{
	static const struct {
		const char *text, *msg; /* msg NULL: accepted */
	} cases[] = {
		/* only the old metric: refused, naming it and how to regenerate */
		{ "{\"rows\":[" ROW("ceiling_fraction", "system", "tcp_bulk") "]}",
		  "b.json: only has the old ceiling_fraction metric (1 row)" },
		/* a bare array of rows is a rig file too */
		{ "[" ROW("ceiling_fraction", "system", "tcp_bulk") "," ROW("ceiling_fraction",
		  "lwip", "tcp_bulk") "]", "b.json: only has the old ceiling_fraction metric (2 rows)" },
		/* instruction rows do not make up for the missing redirect rows */
		{ "{\"rows\":[" ROW("instructions_per_op", "micro", "rewrite4") ","
		  ROW("ceiling_fraction", "system", "tcp_bulk") "]}", "regenerate it: make bench" },
		/* no gated row at all: nothing to compare */
		{ "{\"rows\":[]}", "b.json: $: no instructions_per_op or redirect_fraction rows: "
		  "nothing to compare against" },
		{ "[" ROW("throughput_gbps", "system", "tcp_bulk") "]", "nothing to compare against" },
		{ "{\"callgrind\":{}}", "nothing to compare against" },
		/* accepted: the new metric beside the old, instruction rows alone, callgrind */
		{ "{\"rows\":[" ROW("ceiling_fraction", "system", "tcp_bulk") ","
		  ROW("redirect_fraction", "system", "tcp_bulk") "]}", NULL },
		{ "[" ROW("redirect_fraction", "system", "connrate") "]", NULL },
		{ "[" ROW("instructions_per_op", "micro", "rewrite4") "]", NULL },
		{ "{\"callgrind\":{\"rewrite4\":{\"instructions\":100,\"target\":120}}}", NULL },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct gate_set s = { 0 };
		char err[512] = "";
		int ret;

		cr_assert_eq(gate_parse("b.json", cases[i].text, strlen(cases[i].text), &s, err,
					sizeof(err)), 0, "case %zu: %s", i, err);
		ret = gate_check_baseline("b.json", &s, err, sizeof(err));
		if (!cases[i].msg) {
			cr_expect_eq(ret, 0, "case %zu: %s", i, err);
		} else {
			cr_expect_eq(ret, -EINVAL, "case %zu", i);
			cr_expect(strstr(err, cases[i].msg), "case %zu: got '%s', want '%s'", i, err,
				  cases[i].msg);
		}
		gate_set_fini(&s);
	}
}

/* The old metric is counted per file (and reset by each parse), never gated. */
Test(gate, old_metric_counted_not_gated)
{
	static const char *both = "{\"rows\":[" ROW("ceiling_fraction", "system", "tcp_bulk") ","
				  ROW("ceiling_fraction", "lwip", "tcp_bulk") ","
				  ROW("redirect_fraction", "system", "tcp_bulk") "]}";
	static const char *cg = "{\"callgrind\":{\"rewrite4\":{\"instructions\":1}}}";
	struct gate_set s = { 0 };
	char err[256] = "";

	cr_assert_eq(gate_parse("a", both, strlen(both), &s, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(s.old_ceiling, 2);
	cr_expect(s.rig);
	cr_expect_eq(s.n, 1);
	cr_expect_eq(gate_count(&s, GATE_REDIRECT), 1);
	cr_expect_eq(gate_count(&s, GATE_INSTR), 0);
	gate_set_fini(&s);
	cr_assert_eq(gate_parse("b", cg, strlen(cg), &s, err, sizeof(err)), 0, "%s", err);
	cr_expect_eq(s.old_ceiling, 0);
	cr_expect(!s.rig);
	cr_expect_eq(gate_count(&s, GATE_INSTR), 1);
	gate_set_fini(&s);
}

/* One redirect_fraction row (tcp_bulk upload, 16 streams) as a results.json text. */
static void redirect_json(char *buf, size_t len, double median, double min, double max)
{
	snprintf(buf, len,
		 "{\"rows\":[{\"stack\":\"system\",\"io_mode\":\"per-packet\",\"queues\":1,"
		 "\"workload\":\"tcp_bulk\",\"direction\":\"upload\",\"streams\":16,"
		 "\"metric\":\"redirect_fraction\",\"unit\":\"ratio\",\"median\":%.6f,\"min\":%.6f,"
		 "\"max\":%.6f,\"n\":3}]}",
		 median, min, max);
}

/* A connrate redirect_fraction row (no direction, no stream count) beside a tcp_bulk one of
 * the same subject, as the rig writes them. */
static void connrate_json(char *buf, size_t len, double median)
{
	snprintf(buf, len,
		 "{\"rows\":[{\"stack\":\"system\",\"io_mode\":\"offload\",\"queues\":1,"
		 "\"workload\":\"connrate\",\"direction\":null,\"streams\":null,"
		 "\"metric\":\"redirect_fraction\",\"unit\":\"ratio\",\"median\":%.6f,\"min\":%.6f,"
		 "\"max\":%.6f,\"n\":3},"
		 "{\"stack\":\"system\",\"io_mode\":\"offload\",\"queues\":1,"
		 "\"workload\":\"tcp_bulk\",\"direction\":\"up\",\"streams\":1,"
		 "\"metric\":\"redirect_fraction\",\"unit\":\"ratio\",\"median\":0.9}]}",
		 median, median, median);
}

static int compare_text(const char *btext, const char *ctext, const struct gate_opts *o,
			struct gate_report *rep)
{
	struct gate_set b = { 0 }, c = { 0 };
	char err[512];
	int code;

	cr_assert_eq(gate_parse("base", btext, strlen(btext), &b, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(gate_parse("cur", ctext, strlen(ctext), &c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(gate_compare(&b, &c, o, rep), 0);
	code = gate_exit_code(rep, o);
	gate_set_fini(&b);
	gate_set_fini(&c);
	return code;
}

/* A redirect fraction may fall by the tolerance (10 % with no spread), not more; rises
 * pass. */
Test(gate, redirect_threshold_table)
{
	static const struct {
		double change_pct;
		int code;
		enum gate_verdict v;
	} cases[] = {
		{ 0, 0, GATE_OK },        { -3, 0, GATE_OK },       { +3, 0, GATE_OK },
		{ -9.9, 0, GATE_OK },     { -10.1, 1, GATE_REGRESSION }, { -15, 1, GATE_REGRESSION },
		{ -50, 1, GATE_REGRESSION }, { +15, 0, GATE_BETTER },
	};
	char b[512], c[512];
	struct gate_opts o;

	gate_opts_init(&o);
	redirect_json(b, sizeof(b), 0.5, 0.5, 0.5);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct gate_report rep = { 0 };
		double m = 0.5 * (1 + cases[i].change_pct / 100);
		redirect_json(c, sizeof(c), m, m, m);
		cr_expect_eq(compare_text(b, c, &o, &rep), cases[i].code, "change %.1f%%",
			     cases[i].change_pct);
		cr_expect_eq(rep.l[0].verdict, cases[i].v, "change %.1f%%", cases[i].change_pct);
		cr_expect_float_eq(rep.l[0].tol_pct, 10.0, 1e-9);
		gate_report_fini(&rep);
	}
}

/* Connection-rate rows (null direction and streams) are keyed with "-" and judged like the
 * bulk ones: lower is worse. The bulk row of the same subject is a separate row. */
Test(gate, connrate_rows_judged)
{
	static const struct {
		double median;
		int code;
		enum gate_verdict v;
	} cases[] = {
		{ 0.8, 0, GATE_OK }, { 0.74, 0, GATE_OK }, { 0.71, 1, GATE_REGRESSION },
		{ 0.4, 1, GATE_REGRESSION }, { 0.9, 0, GATE_BETTER },
	};
	char b[1024], c[1024];
	struct gate_opts o;

	gate_opts_init(&o);
	connrate_json(b, sizeof(b), 0.8);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct gate_report rep = { 0 };
		connrate_json(c, sizeof(c), cases[i].median);
		cr_expect_eq(compare_text(b, c, &o, &rep), cases[i].code, "median %.2f",
			     cases[i].median);
		cr_assert_eq(rep.n, 2);
		cr_expect_eq(rep.compared, 2);
		cr_expect_str_eq(rep.l[0].key, "system/offload/q1/connrate/-/-");
		cr_expect_eq(rep.l[0].metric, GATE_REDIRECT);
		cr_expect_eq(rep.l[0].verdict, cases[i].v, "median %.2f", cases[i].median);
		cr_expect_str_eq(rep.l[1].key, "system/offload/q1/tcp_bulk/up/s1");
		cr_expect_eq(rep.l[1].verdict, GATE_OK);
		gate_report_fini(&rep);
	}
}

/* Absent and null fields name the same cell; a second connrate row of a subject is a
 * duplicate. */
Test(gate, connrate_key_absent_equals_null)
{
	static const char *absent = "[{\"metric\":\"redirect_fraction\",\"stack\":\"lwip\","
				    "\"io_mode\":\"offload\",\"queues\":1,"
				    "\"workload\":\"connrate\",\"median\":0.5}]";
	static const char *null = "[{\"metric\":\"redirect_fraction\",\"stack\":\"lwip\","
				  "\"io_mode\":\"offload\",\"queues\":1,\"direction\":null,"
				  "\"streams\":null,\"workload\":\"connrate\",\"median\":0.3}]";
	struct gate_report rep = { 0 };
	struct gate_opts o;

	gate_opts_init(&o);
	cr_expect_eq(compare_text(absent, null, &o, &rep), 1);
	cr_assert_eq(rep.n, 1);
	cr_expect_str_eq(rep.l[0].key, "lwip/offload/q1/connrate/-/-");
	cr_expect_eq(rep.l[0].verdict, GATE_REGRESSION);
	cr_expect_float_eq(rep.l[0].change_pct, -40.0, 1e-9);
	gate_report_fini(&rep);
}

/* A wide measured spread widens the default tolerance; an explicit one overrides it. */
Test(gate, ratio_tolerance_from_spread)
{
	char b[512], c[512];
	struct gate_report rep = { 0 };
	struct gate_opts o;

	gate_opts_init(&o);
	redirect_json(b, sizeof(b), 0.5, 0.4, 0.6); /* spread 40 % */
	redirect_json(c, sizeof(c), 0.425, 0.425, 0.425); /* -15 % */
	cr_expect_eq(compare_text(b, c, &o, &rep), 0);
	cr_expect_float_eq(rep.l[0].tol_pct, 40.0, 1e-9);
	gate_report_fini(&rep);

	/* the spread of the current file counts too, as a share of the baseline's median */
	redirect_json(b, sizeof(b), 0.5, 0.5, 0.5);
	redirect_json(c, sizeof(c), 0.425, 0.34, 0.51); /* spread 0.17: 34 % of 0.5 */
	cr_expect_eq(compare_text(b, c, &o, &rep), 0);
	cr_expect_float_eq(rep.l[0].tol_pct, 34.0, 1e-6);
	gate_report_fini(&rep);

	/* A median that fell by more than half is a regression, whatever the spread: two bad
	 * rounds and a good one (measured against its own median, that spread was 140 %). */
	redirect_json(b, sizeof(b), 0.8, 0.78, 0.82);
	redirect_json(c, sizeof(c), 0.35, 0.30, 0.79);
	cr_expect_eq(compare_text(b, c, &o, &rep), 1);
	cr_expect_float_eq(rep.l[0].tol_pct, GATE_MAX_RATIO_TOL_PCT, 1e-9);
	cr_expect_eq(rep.l[0].verdict, GATE_REGRESSION);
	gate_report_fini(&rep);

	/* A stalled subject's tiny, erratic fractions: a spread of 150 % of their own median. */
	redirect_json(c, sizeof(c), 0.001, 0.0005, 0.002);
	cr_expect_eq(compare_text(b, c, &o, &rep), 1);
	cr_expect_eq(rep.l[0].verdict, GATE_REGRESSION);
	gate_report_fini(&rep);

	o.ratio_tol_pct = 5;
	redirect_json(b, sizeof(b), 0.5, 0.4, 0.6);
	redirect_json(c, sizeof(c), 0.465, 0.465, 0.465); /* -7 % */
	cr_expect_eq(compare_text(b, c, &o, &rep), 1);
	gate_report_fini(&rep);
}

Test(gate, instruction_threshold)
{
	const char *b = "{\"callgrind\":{\"rewrite4\":{\"instructions\":100,\"target\":120}}}";
	const char *up19 = "{\"callgrind\":{\"rewrite4\":{\"instructions\":101.9,\"target\":120}}}";
	const char *up21 = "{\"callgrind\":{\"rewrite4\":{\"instructions\":102.1,\"target\":120}}}";
	const char *down = "{\"callgrind\":{\"rewrite4\":{\"instructions\":90,\"target\":120}}}";
	struct gate_report rep = { 0 };
	struct gate_opts o;

	gate_opts_init(&o);
	cr_expect_eq(compare_text(b, up19, &o, &rep), 0);
	gate_report_fini(&rep);
	cr_expect_eq(compare_text(b, up21, &o, &rep), 1);
	gate_report_fini(&rep);
	cr_expect_eq(compare_text(b, down, &o, &rep), 0);
	cr_expect_eq(rep.l[0].verdict, GATE_BETTER);
	gate_report_fini(&rep);
}

Test(gate, new_rows_and_ungated_metrics)
{
	char b[512];
	const char *c = "[{\"stack\":\"micro\",\"workload\":\"rewrite9\",\"metric\":"
			"\"instructions_per_op\",\"median\":5},"
			"{\"stack\":\"system\",\"workload\":\"x\",\"metric\":\"pps\",\"median\":\"n/a\"},"
			"{\"stack\":\"system\",\"workload\":\"tcp_bulk\",\"metric\":"
			"\"ceiling_fraction\",\"median\":0.01}]";
	struct gate_report rep = { 0 };
	struct gate_opts o;

	gate_opts_init(&o);
	redirect_json(b, sizeof(b), 0.5, 0.5, 0.5);
	cr_expect_eq(compare_text(b, c, &o, &rep), 0);
	cr_expect_eq(rep.missing, 1);
	cr_expect_eq(rep.added, 1);
	cr_expect_eq(rep.n, 2);
	gate_report_fini(&rep);
}

/* Each malformed text is refused with the JSON path of the fault in the message. */
Test(gate, malformed_texts_name_the_path)
{
	static const struct {
		const char *text, *msg;
	} cases[] = {
		{ "", "f.json: $: not valid JSON" },
		{ "42", "f.json: $: expected an object or an array" },
		{ "{}", "f.json: $: neither \"rows\" nor \"callgrind\"" },
		{ "{\"rows\":{}}", "f.json: $.rows: expected an array" },
		{ "{\"rows\":[7]}", "f.json: $.rows[0]: expected an object" },
		{ "{\"rows\":[{\"median\":1}]}", "f.json: $.rows[0].metric: missing" },
		{ "[{\"metric\":\"redirect_fraction\",\"stack\":1}]", "f.json: $[0].stack: expected a string" },
		{ "[{\"metric\":\"redirect_fraction\",\"stack\":\"s\",\"workload\":\"w\"}]",
		  "f.json: $[0].median: missing" },
		{ "[{\"metric\":\"redirect_fraction\",\"stack\":\"s\",\"workload\":\"w\",\"median\":1,"
		  "\"streams\":\"16\"}]", "f.json: $[0].streams: expected a number" },
		{ "{\"callgrind\":{\"rewrite4\":{\"instructions\":\"1\"}}}",
		  "f.json: $.callgrind.rewrite4.instructions: expected a number" },
		{ "{\"callgrind\":[]}", "f.json: $.callgrind: expected an object" },
		{ "{\"meta\":{\"tcp_congestion\":{\"testbed\":3}},\"rows\":[]}",
		  "f.json: $.meta.tcp_congestion.testbed: expected a string" },
		{ "{\"meta\":{\"tcp_congestion\":{\"testbed\":\"abcdefghijklmnopqrstuvwxyz\"}},"
		  "\"rows\":[]}", "f.json: $.meta.tcp_congestion.testbed: longer than" },
		{ "{\"meta\":{\"tcp_congestion\":\"reno\"},\"rows\":[]}",
		  "f.json: $.meta.tcp_congestion: expected an object" },
		{ "{\"meta\":5,\"rows\":[]}", "f.json: $.meta: expected an object" },
		{ "[{\"metric\":\"instructions_per_op\",\"stack\":\"micro\",\"workload\":\"a\",\"median\":1},"
		  "{\"metric\":\"instructions_per_op\",\"stack\":\"micro\",\"workload\":\"a\",\"median\":2}]",
		  "f.json: $[1]: duplicate instructions_per_op row for \"a\"" },
		{ "[{\"metric\":\"redirect_fraction\",\"stack\":\"s\",\"workload\":\"connrate\","
		  "\"median\":1},{\"metric\":\"redirect_fraction\",\"stack\":\"s\","
		  "\"workload\":\"connrate\",\"direction\":null,\"median\":2}]",
		  "f.json: $[1]: duplicate redirect_fraction row for \"s/-/-/connrate/-/-\"" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct gate_set s = { 0 };
		char err[512] = "";
		int ret = gate_parse("f.json", cases[i].text, strlen(cases[i].text), &s, err,
				     sizeof(err));
		cr_expect_eq(ret, -EINVAL, "case %zu", i);
		cr_expect(strstr(err, cases[i].msg), "case %zu: got '%s', want '%s'", i, err,
			  cases[i].msg);
		cr_expect_null(s.e, "case %zu: set freed on error", i);
	}
}
