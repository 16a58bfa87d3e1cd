/* gate.c — `twinstack gate`: the CI performance regression gate. The comparison
 * lives in cli/gate_lib.c; this file is the command line. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/gate_lib.h"

void usage_gate(FILE *out)
{
	fputs("usage: twinstack gate --baseline FILE --current FILE [--instr-tolerance PCT]\n"
	      "                      [--ratio-tolerance PCT] [--strict]\n"
	      "\n"
	      "Compare two result files (the rig's results.json, or bench/callgrind.sh --json\n"
	      "output) and print a table of what moved. Gated: instructions_per_op (regression if\n"
	      "current > baseline x (1 + instr tolerance)) and redirect_fraction (regression if\n"
	      "current median < baseline median x (1 - ratio tolerance)): a subject's TCP bulk\n"
	      "throughput or connection rate over the same round's redirect baseline (`twinstack\n"
	      "redirect`, nftables REDIRECT to the product's relay with no TUN: the cheapest\n"
	      "terminating proxy the kernel allows). Both sides are measured in the same round\n"
	      "on the same machine, so its speed and load largely cancel: the ratio carries\n"
	      "across machines where raw Gbit/s do not.\n"
	      "Rows missing from the current file are reported; they fail the gate only with\n"
	      "--strict. ceiling_fraction is not gated: a rig baseline with ceiling_fraction\n"
	      "rows but no redirect_fraction row (recorded before the redirect baseline) is\n"
	      "refused; regenerate it with\n"
	      "`make bench BENCH_ARGS=--ablation` and copy its results.json to\n"
	      "bench/baseline/ablation.json.\n"
	      "Exit 0 pass, 1 regression, 2 bad usage, an unreadable/invalid file, a baseline with\n"
	      "nothing to compare (no gated row, or only ceiling_fraction rows), or files\n"
	      "measured under different TCP congestion controls (meta.tcp_congestion).\n"
	      "\n"
	      "options:\n"
	      "  -b, --baseline FILE        the reference results (required)\n"
	      "  -c, --current FILE         the results to judge (required)\n"
	      "      --instr-tolerance PCT  instruction-count tolerance, default 2\n"
	      "      --ratio-tolerance PCT  redirect-fraction tolerance; default per row:\n"
	      "                             max(10, the row's (max-min) in either file over\n"
	      "                             the baseline's median), at most 50\n"
	      "      --strict               a row missing from the current file is a failure\n"
	      "  -h, --help                 this text\n",
	      out);
}

static int parse_pct(const char *opt, const char *v, double *out)
{
	char *end;
	double d;

	errno = 0;
	d = strtod(v, &end);
	if (errno || end == v || *end || !(d >= 0 && d < 100)) {
		fprintf(stderr, "twinstack gate: %s '%s': expected a percentage in [0, 100)\n",
			opt, v);
		return -EINVAL;
	}
	*out = d;
	return 0;
}

/* One option at argv[*i]: 0 taken, 1 --help, -1 bad usage (message printed). */
static int take(int argc, char **argv, int *i, const char **base, const char **cur,
		struct gate_opts *o)
{
	const char *v = NULL;
	int r;

	if (strcmp(argv[*i], "-h") == 0 || strcmp(argv[*i], "--help") == 0)
		return 1;
	if (strcmp(argv[*i], "--strict") == 0) {
		o->strict = true;
		return 0;
	}
	if ((r = cli_take_option(argc, argv, i, "--baseline", "-b", base)) != 0)
		goto taken;
	if ((r = cli_take_option(argc, argv, i, "--current", "-c", cur)) != 0)
		goto taken;
	if ((r = cli_take_option(argc, argv, i, "--instr-tolerance", "--instr-tolerance", &v)) > 0)
		return parse_pct("--instr-tolerance", v, &o->instr_tol_pct) ? -1 : 0;
	if (r == 0 &&
	    (r = cli_take_option(argc, argv, i, "--ratio-tolerance", "--ratio-tolerance", &v)) > 0)
		return parse_pct("--ratio-tolerance", v, &o->ratio_tol_pct) ? -1 : 0;
	if (r == 0) {
		fprintf(stderr, "twinstack gate: unexpected argument '%s'\n", argv[*i]);
		usage_gate(stderr);
		return -1;
	}
taken:
	if (r < 0) {
		fprintf(stderr, "twinstack gate: %s needs a value\n", argv[*i]);
		return -1;
	}
	return 0;
}

int cmd_gate(int argc, char **argv)
{
	const char *base = NULL, *cur = NULL;
	char err[1024] = "";
	struct gate_opts o;
	int ret;

	gate_opts_init(&o);
	for (int i = 1; i < argc; i++) {
		if ((ret = take(argc, argv, &i, &base, &cur, &o)) > 0) {
			usage_gate(stdout);
			return EXIT_OK;
		}
		if (ret < 0)
			return EXIT_USAGE;
	}
	if (!base || !cur) {
		fprintf(stderr, "twinstack gate: --baseline FILE and --current FILE are required\n");
		usage_gate(stderr);
		return EXIT_USAGE;
	}
	ret = gate_run(base, cur, &o, stdout, err, sizeof(err));
	if (err[0])
		fprintf(stderr, "%s\n", err);
	return ret;
}
