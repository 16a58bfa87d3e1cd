/* bench.c — `twinstack bench`: the namespace comparison rig.
 *
 * The rig itself is bench/rig.py (python3, standard library only) in the source tree: this
 * subcommand execs `python3 <source-dir>/bench/rig.py --bin <this binary> ARGS...`, so the
 * binary under test is always the one that was invoked. The source dir comes from the compile
 * definition TS_SOURCE_DIR; the environment variable TWINSTACK_SOURCE_DIR overrides it (for an
 * installed or relocated binary).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

/* Is DIR/bench/rig.py readable? Writes the path into rig. */
static int find_rig(const char *dir, char *rig, size_t len)
{
	if ((size_t)snprintf(rig, len, "%s/bench/rig.py", dir) >= len)
		return 0;
	return access(rig, R_OK) == 0;
}

void usage_bench(FILE *out)
{
	fputs("usage: twinstack bench [--quick | --ablation | --via socks5 | --sniff]\n"
	      "                       [--link] [--subject NAME=COMMAND] [--stacks system,lwip]\n"
	      "                       [--out DIR] [--reps N] [--io-mode offload|per-packet]\n"
	      "                       [--dry-run] [--cc NAME|host] [--perf DIR]\n"
	      "       twinstack bench --report-from FILE | --across FILE|DIR FILE|DIR ...\n"
	      "       twinstack bench --ab BASE_BINARY [--quick] [--stacks system,lwip]\n"
	      "                       [--reps N] [--ab-cells LIST] [--ab-min-effect PCT]\n"
	      "                       [--ab-nice N] [--ab-pin on|off] [--ab-throttle PCT]\n"
	      "\n"
	      "Build a namespace testbed, measure both stacks and two baselines (bare veth, TUN\n"
	      "reflector) side by side, and write results.json, report.md and SVG charts to DIR\n"
	      "(default bench-results/). Needs root and /dev/net/tun. Runs bench/rig.py from the\n"
	      "source tree (TWINSTACK_SOURCE_DIR overrides its location).\n"
	      "\n"
	      "options:\n"
	      "  --quick             one repetition, short workloads (< 3 minutes)\n"
	      "  --ablation          TCP bulk only, every TUN I/O mode: per-packet, offload and\n"
	      "                      offload + 2 queues (system), per-packet, offload and offload\n"
	      "                      without GSO output trains (lwip), per-packet and offload\n"
	      "                      (reflector); the acceptance targets as PASS/MISS (< 30 minutes)\n"
	      "  --via socks5        each stack with its outbound pointed at a SOCKS5 server\n"
	      "                      (dante in the server namespace) next to the same stack direct\n"
	      "                      and a plain SOCKS5 client without a TUN (proxychains4 +\n"
	      "                      iperf3, load udp --socks5): TCP bulk and UDP echo, each\n"
	      "                      stack's ratio to the plain client as PASS/MISS (>= 0.8;\n"
	      "                      ~16 minutes, with --quick ~2)\n"
	      "  --sniff             each stack with route.sniff off, on with no flow looked at\n"
	      "                      and on with every connection looked at: connection rate\n"
	      "                      and latency, the ratios to the stack without sniffing\n"
	      "                      (~4 minutes, with --quick ~1)\n"
	      "  --link              link conditions: the client behind a delay line with loss\n"
	      "                      (RTT 10 and 50 ms, loss 0, 0.1 and 1 %), veth vs each stack:\n"
	      "                      TCP bulk, a 4 MiB download's completion time, retransmits\n"
	      "                      (~15 minutes, with --quick ~2)\n"
	      "  --subject NAME=COMMAND  also measure another TUN proxy started by COMMAND, with\n"
	      "                      the placeholders {tun}, {addr}, {ip}, {prefix}, {mtu},\n"
	      "                      {mark} and, with --via socks5, {socks5} (rig.py --help)\n"
	      "  --ab BASE_BINARY    A/B gate: BASE_BINARY (an older build) against this binary,\n"
	      "                      each stack started fresh per round, base and candidate\n"
	      "                      alternating; judged per cell on the paired differences\n"
	      "                      (TCP bulk up/down x1 and x16, connection rate; --quick:\n"
	      "                      bulk up/down x1) with a tolerance from the run's own spread;\n"
	      "                      exit 1 on a regression (make ab BASE=REV builds both)\n"
	      "  --ab-cells LIST     the cells: up1,down1,up16,down16,up64,down64,connrate,udp64\n"
	      "                      (a subset; udp64: UDP echo packets/s, 64 B)\n"
	      "  --ab-min-effect PCT the smallest change judged (default 5)\n"
	      "  --ab-nice N         the testbed at nice -N for the run (default 10; 0: normal)\n"
	      "  --ab-pin on|off     the proxy on CPUs of its own, the rest of the testbed on the\n"
	      "                      others (default on)\n"
	      "  --ab-throttle PCT   test aid: the candidate's proxy in a CPU cgroup limited to\n"
	      "                      (100 - PCT) % of the base's CPU per cell: an injected slowdown\n"
	      "  --stacks LIST       stacks to measure (default system,lwip)\n"
	      "  --out DIR           output directory (default bench-results)\n"
	      "  --reps N            repetitions per figure (default 3; --quick: 1; --ab: 6,\n"
	      "                      with --quick 5)\n"
	      "  --io-mode MODE      TUN I/O of the stacks and reflector (default offload)\n"
	      "  --dry-run           print the plan and the time estimate, run nothing\n"
	      "  --cc NAME|host      TCP congestion control pinned in the testbed (default reno;\n"
	      "                      host: the host's default, e.g. a pacing bbr)\n"
	      "  --perf DIR          record a system-wide perf profile of every bulk run, and\n"
	      "                      report the TUN's copies and the bound they set\n"
	      "  --report-from FILE  redraw the report of an earlier run's results.json\n"
	      "  --across FILE|DIR ...  several runs' targets side by side: per target the runs\n"
	      "                      that passed and the range of figures (a run's results.json\n"
	      "                      or its output directory; two or more of one kind)\n"
	      "  --smoke             the test suite's sanity run of the rig (not for comparison)\n"
	      "  -h, --help          this text (python3 bench/rig.py --help lists every option)\n"
	      "\n"
	      "Exit: 0 done, 1 a run failed (--ab: or a regression, or a cell with fewer than 3\n"
	      "pairs), 2 cannot run (not root, no TUN, bad arguments, a --cc the namespaces may\n"
	      "not select).\n",
	      out);
}

int cmd_bench(int argc, char **argv)
{
	char self[PATH_MAX], rig[PATH_MAX];
	const char *src = getenv("TWINSTACK_SOURCE_DIR");
	ssize_t n;
	char **args;
	int k = 0;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage_bench(stdout);
			return EXIT_OK;
		}
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0) {
		fprintf(stderr, "twinstack bench: readlink /proc/self/exe: %s\n", strerror(errno));
		return EXIT_RUNTIME;
	}
	self[n] = '\0';
	/* TWINSTACK_SOURCE_DIR, else the compiled-in source dir, else the binary's parent dir
	 * (build/twinstack in a checkout). */
	if (src && *src) {
		if (!find_rig(src, rig, sizeof(rig))) {
			fprintf(stderr, "twinstack bench: cannot read %s: %s\n", rig, strerror(errno));
			return EXIT_USAGE;
		}
	} else {
		char up[PATH_MAX + 4];
		char *slash;
		int found = 0;
#ifdef TS_SOURCE_DIR
		found = find_rig(TS_SOURCE_DIR, rig, sizeof(rig));
#endif
		snprintf(up, sizeof(up), "%s", self);
		slash = strrchr(up, '/');
		if (!found && slash) {
			strcpy(slash, "/..");
			found = find_rig(up, rig, sizeof(rig));
		}
		if (!found) {
			fprintf(stderr, "twinstack bench: cannot find bench/rig.py (set "
					"TWINSTACK_SOURCE_DIR to the source tree)\n");
			return EXIT_USAGE;
		}
	}
	args = calloc((size_t)argc + 5, sizeof(*args));
	if (!args) {
		fprintf(stderr, "twinstack bench: out of memory\n");
		return EXIT_RUNTIME;
	}
	args[k++] = "python3";
	args[k++] = rig;
	args[k++] = "--bin";
	args[k++] = self;
	for (int i = 1; i < argc; i++)
		args[k++] = argv[i];
	args[k] = NULL;
	fflush(NULL);
	execvp("python3", args);
	fprintf(stderr, "twinstack bench: cannot run python3: %s\n", strerror(errno));
	free(args);
	return EXIT_USAGE;
}
