#!/usr/bin/env bash
# long.sh FUZZ_BUILD_DIR OUTDIR [TARGET...] — the long fuzzing runs: each target until 10^7
# executions or 30 minutes, whichever comes first (FUZZ_RUNS, FUZZ_MAX_SECONDS override), from
# the committed seed corpus, PARALLEL targets at a time (default 2, one core apiece). Writes
# OUTDIR/<target>.log and prints one table row per target: executions, exec/s, covered edges at
# 60 s and at the end, when the last new edge was found, crashes. Exit 1 if any target failed.
# REPORT_ONLY=1: no run, the table from the logs already in OUTDIR.
set -uo pipefail
build=${1:?usage: long.sh FUZZ_BUILD_DIR OUTDIR [TARGET...]}
out=${2:?usage: long.sh FUZZ_BUILD_DIR OUTDIR [TARGET...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
runs=${FUZZ_RUNS:-10000000}
maxs=${FUZZ_MAX_SECONDS:-1800}
par=${PARALLEL:-2}
mkdir -p "$out"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
	for f in "$here"/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi

one() {
	local t=$1 work="$out/$1"
	rm -rf "$work"; mkdir -p "$work/corpus" "$work/artifacts"
	local t0=$SECONDS rc=0
	"$build/$t" -runs="$runs" -max_total_time="$maxs" -timeout=10 -rss_limit_mb=2048 \
		-print_final_stats=1 -artifact_prefix="$work/artifacts/" \
		"$work/corpus" "$here/corpus/$t" >"$out/$t.log" 2>&1 || rc=$?
	echo "$t $rc $((SECONDS - t0))" >"$out/$t.rc"
}

running=0
[ "${REPORT_ONLY:-0}" = 1 ] && targets_run=() || targets_run=("${targets[@]}")
for t in "${targets_run[@]}"; do
	[ -x "$build/$t" ] || { echo "long.sh: no $build/$t" >&2; exit 2; }
	one "$t" &
	running=$((running + 1))
	if [ "$running" -ge "$par" ]; then wait -n; running=$((running - 1)); fi
done
wait

# A row from each log. libFuzzer prints "#N <event> cov: C ... exec/s: R" lines and final
# stats; the first line past 60 s and the last NEW/REDUCE line give the levelling-off figures.
fail=0
echo "| target | run | executions | exec/s | cov at 60 s | final cov | last new edge at | crashes |"
echo "|---|---|---|---|---|---|---|---|"
for t in "${targets[@]}"; do
	[ -f "$out/$t.rc" ] || { echo "| $t | not run | | | | | | |"; continue; }
	read -r _ rc secs <"$out/$t.rc"
	python3 - "$out/$t.log" "$rc" "$secs" "$t" "$out/$t/artifacts" <<'PY' || fail=1
import os, re, sys
log, rc, secs, name, arts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
execs = rate = 0
cov60 = covend = None
lastnew = 0
t0 = None
for line in open(log, errors="replace"):
    m = re.match(r"#(\d+)\s+(\w+)\s+cov: (\d+).*?exec/s: (\d+)", line)
    if m:
        n, ev, cov, r = int(m[1]), m[2], int(m[3]), int(m[4])
        # exec/s over the run so far gives the elapsed time of this line
        el = n / r if r else 0
        if cov60 is None and el >= 60:
            cov60 = cov
        if ev in ("NEW", "REDUCE") and (covend is None or cov > covend):
            lastnew = el
        covend = cov if covend is None else max(covend, cov)
    m = re.match(r"stat::number_of_executed_units: (\d+)", line)
    if m:
        execs = int(m[1])
    m = re.match(r"stat::average_exec_per_sec:\s+(\d+)", line)
    if m:
        rate = int(m[1])
crashes = len(os.listdir(arts)) if os.path.isdir(arts) else 0
run = f"{secs // 60} min {secs % 60} s" if secs >= 60 else f"{secs} s"
print(f"| {name} | {run} | {execs:,} | {rate:,} | {cov60 if cov60 is not None else covend:,} "
      f"| {covend or 0:,} | {lastnew:.0f} s | {crashes} |")
sys.exit(1 if rc != 0 or crashes else 0)
PY
done
exit $fail
