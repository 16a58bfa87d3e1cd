/* gate_lib.h — the performance regression gate's logic (`twinstack gate`), apart from the CLI
 * so the unit tests can drive it: load two result files, compare the figures that survive a
 * noisy machine, print a table, decide an exit code.
 *
 * Two figures are gated (docs/benchmarks.md, "Regression gate"):
 *   instructions_per_op  callgrind counts of the micro-benchmarks (deterministic): a regression
 *                        when current > baseline x (1 + instr_tol).
 *   redirect_fraction    a subject's throughput (tcp_bulk) or connection rate (connrate) over
 *                        the same round's redirect baseline (`twinstack redirect`: nftables
 *                        REDIRECT to the product's relay, no TUN): a regression when current
 *                        median < baseline median x (1 - ratio_tol), where ratio_tol defaults
 *                        to max(10 %, the relative spread (max - min) / median of that row in
 *                        either file).
 * Every other metric in the files is ignored, ceiling_fraction (the fraction of the two-hop
 * ceiling, which the gate judged before) included: only counted, so that a rig baseline with
 * those rows but no redirect_fraction row is refused (it predates the redirect baseline and
 * would pass any throughput) instead of comparing no throughput row at all.
 *
 * Accepted files (docs/benchmarks.md "Regression gate"):
 *   - the rig's results.json: {"rows": [row, ...]} or a bare [row, ...], row =
 *     {stack, io_mode, queues, workload, direction, streams, metric, unit, median, min, max, n};
 *   - bench/callgrind.sh --json: {"callgrind": {case: {"instructions": N, "target": T}}}, read
 *     as instructions_per_op rows of stack "micro" with workload = case.
 * Instruction rows are keyed by workload (the micro case) alone, so the two formats compare
 * with each other; redirect rows by stack/io_mode/queues/workload/direction/streams (a null
 * field is "-").
 *
 * Two results files whose testbeds ran different TCP congestion controls are not compared
 * (exit 2): a pacing algorithm caps a single flow through the TUN near its timer's rate, so the
 * figures move for reasons that are not the code's.
 */
#ifndef TS_CLI_GATE_LIB_H
#define TS_CLI_GATE_LIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define GATE_WUR __attribute__((warn_unused_result))

#define GATE_KEY_MAX 160
#define GATE_FILE_MAX (64u << 20) /* a results file larger than this is not ours */
#define GATE_DEFAULT_INSTR_TOL_PCT 2.0
#define GATE_DEFAULT_RATIO_TOL_PCT 10.0
#define GATE_MAX_RATIO_TOL_PCT 50.0 /* the spread-derived tolerance never exceeds this */

enum gate_metric { GATE_INSTR, GATE_REDIRECT };

/* One gated figure of one file. min/max equal median when the file has no spread. */
struct gate_entry {
	enum gate_metric metric;
	char key[GATE_KEY_MAX];
	double median, min, max;
};

#define GATE_CC_MAX 24

/* The gated figures of one file (heap array; gate_set_fini frees it, idempotent), the TCP
 * congestion control its testbed ran ($.meta.tcp_congestion.testbed; "" when not recorded:
 * callgrind files, rig runs before it was recorded), whether it is a rig file (rows, not
 * callgrind) and how many rows of the old, no longer gated ceiling_fraction metric it has. */
struct gate_set {
	struct gate_entry *e;
	size_t n, cap;
	char cc[GATE_CC_MAX];
	bool rig;
	size_t old_ceiling;
};

struct gate_opts {
	double instr_tol_pct;  /* >= 0 */
	double ratio_tol_pct;  /* < 0: from the spread, floor GATE_DEFAULT_RATIO_TOL_PCT, cap
				* GATE_MAX_RATIO_TOL_PCT */
	bool strict;           /* a row missing from current is a failure */
};

enum gate_verdict { GATE_OK, GATE_BETTER, GATE_REGRESSION, GATE_MISSING, GATE_NEW };

struct gate_line {
	enum gate_metric metric;
	char key[GATE_KEY_MAX];
	double base, cur;      /* medians; base unused for NEW, cur unused for MISSING */
	double change_pct;     /* (cur - base) / base x 100 */
	double tol_pct;        /* the tolerance applied */
	enum gate_verdict verdict;
};

struct gate_report {
	struct gate_line *l;
	size_t n, cap;
	size_t compared, regressions, missing, added;
};

void gate_opts_init(struct gate_opts *o);
void gate_set_fini(struct gate_set *s);
void gate_report_fini(struct gate_report *r);

/* Parse the text of a result file (either format above) into *out (empty on entry). 0, or
 * -EINVAL (bad JSON, wrong types, duplicate rows: err says "NAME: $.path: what") or -ENOMEM.
 * name is only used in messages. */
int gate_parse(const char *name, const char *text, size_t len, struct gate_set *out, char *err,
	       size_t errlen) GATE_WUR;
/* gate_parse of a file's contents; an unreadable file is -errno with "PATH: reason". */
int gate_load(const char *path, struct gate_set *out, char *err, size_t errlen) GATE_WUR;

/* Compare: one line per baseline entry (OK/BETTER/REGRESSION/MISSING), then one per entry only
 * in current (NEW). 0 or -ENOMEM. */
int gate_compare(const struct gate_set *base, const struct gate_set *cur,
		 const struct gate_opts *o, struct gate_report *out) GATE_WUR;

/* The exit code for a report: 1 on a regression (or a missing row under strict), else 0. */
int gate_exit_code(const struct gate_report *r, const struct gate_opts *o);

/* The readable table and a one-line summary. */
void gate_print(FILE *f, const struct gate_report *r);

const char *gate_metric_name(enum gate_metric m);
const char *gate_verdict_name(enum gate_verdict v);

/* Whether a baseline can be compared against: 0, or -EINVAL with the reason in err (naming
 * the file): a rig file with ceiling_fraction rows but no redirect_fraction row (from before
 * the redirect baseline: it says how to regenerate it), or a file with no gated row at all
 * (it would pass anything). name is only used in messages. */
int gate_check_baseline(const char *name, const struct gate_set *b, char *err,
			size_t errlen) GATE_WUR;

/* The number of entries of metric m in s. */
size_t gate_count(const struct gate_set *s, enum gate_metric m);

/* The whole gate: load both files, refuse an unusable baseline (gate_check_baseline), compare,
 * print to f; returns the exit code (0 pass, 1 regression, 2 unreadable or invalid input, an
 * unusable baseline, or files measured under different congestion controls, with the message
 * in err). A current rig file with only ceiling_fraction rows is compared (its redirect rows
 * are missing: a failure only under strict) with a note after the table saying why. */
int gate_run(const char *baseline, const char *current, const struct gate_opts *o, FILE *f,
	     char *err, size_t errlen);

#endif
