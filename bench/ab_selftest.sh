#!/usr/bin/env bash
# ab_selftest.sh [--bin BIN] [--throttle PCT] [--reps R] [--lock FILE] [--out DIR] N
# [BENCH_ARGS...] — the A/B gate's own test (`make ab-selftest`, root): N quick A/B runs of
# identical code (the base a copy of the binary) and N with an injected slowdown
# (--ab-throttle PCT: the candidate's proxy in a CPU cgroup, bench/abcg.py), alternating, each
# `twinstack bench --ab COPY --quick --bulk-seconds 2 --reps R BENCH_ARGS`. Prints one line per
# run and cell (change, tolerance, verdict) and the tallies: false alarms (a run of identical
# code whose gate failed) and caught (a slowed run whose gate failed on a REGRESSION).
#   --bin BIN       the twinstack binary (default build/twinstack)
#   --throttle PCT  the CPU cut of the injected slowdown (default 9: the cut measured to cost
#                   about the 15 % of throughput the gate must catch; docs/benchmarks.md)
#   --reps R        rounds per A/B run (default 8: with the quick cells' 2 s bulk runs, fewer
#                   rounds missed that slowdown in some runs; docs/benchmarks.md)
#   --lock FILE     run each A/B run under `flock FILE` (a machine shared with other
#                   benchmarks: one at a time, others may run between the runs)
#   --out DIR       where the runs go (default bench-results/ab-selftest); DIR/selftest.md
#                   holds the table
# Exit 0 when no identical run failed and every slowed run was caught, 1 otherwise, 2 on bad
# usage.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
bin=$src/build/twinstack throttle=9 reps=8 lock="" out=bench-results/ab-selftest
while [ $# -gt 0 ]; do
	case $1 in
	--bin) bin=$2; shift 2 ;;
	--throttle) throttle=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--lock) lock=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	-h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) break ;;
	esac
done
n=${1:-}
usage() { echo "usage: ab_selftest.sh [options] N [bench arguments] (N >= 1)" >&2; exit 2; }
case $n in '' | *[!0-9]*) usage ;; esac
case $reps in '' | *[!0-9]*) usage ;; esac
shift
[ "$n" -ge 1 ] || usage
[ -x "$bin" ] || { echo "ab_selftest.sh: $bin is not executable" >&2; exit 2; }
mkdir -p "$out" || exit 2
cp "$bin" "$out/base-twinstack" || exit 2

run() { # run NAME [extra args]: one A/B run into $out/NAME
	local name=$1 t0
	shift
	rm -rf "${out:?}/$name"
	t0=$(date +%s)
	${lock:+flock "$lock"} "$bin" bench --ab "$out/base-twinstack" --quick --bulk-seconds 2 \
		--reps "$reps" --out "$out/$name" "$@" >"$out/$name.stdout" 2>"$out/$name.stderr"
	echo "$name exit $? $(($(date +%s) - t0)) s: $(grep -m1 '^ab: ' "$out/$name.stdout" ||
		echo 'no verdict')"
}
for i in $(seq 1 "$n"); do
	run "same-$i" "$@"
	run "slow-$i" --ab-throttle "$throttle" "$@"
done

python3 - "$out" "$n" "$throttle" <<'PY'
import json, os, statistics, sys
out, n, throttle = sys.argv[1], int(sys.argv[2]), sys.argv[3]
L = ["| run | cell | mean paired change | ± tolerance | candidate CPU | verdict |",
     "| --- | --- | ---: | ---: | ---: | --- |"]
alarms, caught, fails, achieved, improved = 0, 0, [], [], 0
def pct(v):
    return "n/a" if v is None else "%+.1f %%" % v
for kind in ("same", "slow"):
    for i in range(1, n + 1):
        name = "%s-%d" % (kind, i)
        try:
            j = json.load(open(os.path.join(out, name, "results.json")))
        except (OSError, ValueError):
            fails.append("%s: no results.json" % name)
            L.append("| %s | - | - | - | - | run failed |" % name)
            if kind == "same":
                alarms += 1
            continue
        rows = j["verdicts"]
        failed_run = bool(j["meta"]["failures"]) or any(r["verdict"] in ("REGRESSION",
                                                                         "INCOMPLETE")
                                                        for r in rows)
        for f in j["meta"]["failures"]:
            fails.append("%s: %s" % (name, f))
        for r in rows:
            L.append("| %s | %s %s | %s | %s | %s | %s |" % (
                name, r["stack"], r["cell"], pct(r["change_pct"]),
                "n/a" if r["tol_pct"] is None else "%.1f %%" % r["tol_pct"],
                pct(r["cpu_change_pct"]), r["verdict"]))
        if kind == "same" and failed_run:
            alarms += 1
        if kind == "same":
            improved += sum(1 for r in rows if r["verdict"] == "IMPROVED")
        else:
            achieved += [r["change_pct"] for r in rows if r["change_pct"] is not None]
        if kind == "slow" and any(r["verdict"] == "REGRESSION" for r in rows):
            caught += 1
L += ["", "false alarms %d/%d (identical code, the gate failed)" % (alarms, n),
      "caught %d/%d (candidate throttled to %g %% of the base's CPU, the gate failed on a "
      "REGRESSION)" % (caught, n, 100 - float(throttle))]
if achieved:
    achieved.sort()
    L.append("achieved slowdown of the throttled runs: mean paired change %+.1f %% over %d "
             "cells (median %+.1f %%, %+.1f %% to %+.1f %%)" % (
                 sum(achieved) / len(achieved), len(achieved),
                 statistics.median(achieved), achieved[0], achieved[-1]))
L.append("IMPROVED cells in the identical runs: %d (not a failure; a false signal all the same)"
         % improved)
if fails:
    L += ["", "run failures:"] + ["- " + f for f in fails]
text = "\n".join(L) + "\n"
open(os.path.join(out, "selftest.md"), "w").write(text)
sys.stdout.write(text)
sys.exit(0 if alarms == 0 and caught == n else 1)
PY
