#!/usr/bin/env bash
# ab.sh REV [BENCH_ARGS...] — `make ab BASE=REV`: the A/B regression gate of the working tree
# (the candidate) against revision REV (the base), on this machine, in one run.
#  1. REV checked out in a git worktree (detached, under build-ab/; removed again at exit,
#     on signals and on errors) and built Release (twinstack, twinstack-micro) in its own
#     build directory there; the two binaries copied to OUT/base/.
#  2. The candidate built in build/ (the same two targets).
#  3. Throughput: `build/twinstack bench --ab OUT/base/twinstack --out OUT BENCH_ARGS`: both
#     binaries interleaved on one testbed, judged on their paired differences (root).
#  4. Instructions: each tree's bench/callgrind.sh --json on its own twinstack-micro, then
#     `build/twinstack gate --baseline base.json --current cand.json` (2 % per case).
# The base runs the candidate rig's configuration files (bench/launch.py), so REV must accept
# them: a revision from before a configuration key the rig writes cannot be a base.
# Environment: OUT (default bench-results/ab), JOBS (build jobs, default 2), CAND_BUILD (the
# candidate's build directory, default build), AB_DIR (where the base's worktree goes, default
# build-ab), TS_LWIP_DIR (lwIP's source, default build/deps/lwip of this checkout).
# Exit 0 both parts pass, 1 a part found a regression (or the A/B run failed), 2 cannot run
# (bad REV, a build failed, not root, valgrind missing).
set -uo pipefail
rev=${1:?usage: ab.sh REV [twinstack bench arguments...]}
shift
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src" || exit 2
out=${OUT:-bench-results/ab}
jobs=${JOBS:-2}
cand=${CAND_BUILD:-build}
abdir=${AB_DIR:-$src/build-ab}
sha=$(git rev-parse --verify --quiet "$rev^{commit}") ||
	{ echo "ab.sh: $rev is not a revision of this repository" >&2; exit 2; }
tok=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
wt=$abdir/base-${sha:0:12}-$tok

cleanup() {
	if [ -d "$wt" ]; then
		git worktree remove --force "$wt" >/dev/null 2>&1 || rm -rf "$wt"
		git worktree prune >/dev/null 2>&1
	fi
	rmdir "$abdir" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# lwIP's source is fetched once by scripts/setup.sh into the checkout's build/deps (never
# committed): the worktree's build uses that copy.
lwip=${TS_LWIP_DIR:-$src/build/deps/lwip}
build() { # build SOURCE BUILD_DIR LOG: Release, the two targets the gate runs
	cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DTS_WERROR=ON -DTS_LWIP_DIR="$lwip" \
		>"$3" 2>&1 &&
		cmake --build "$2" -j"$jobs" --target twinstack twinstack-micro >>"$3" 2>&1 ||
		{ tail -n 20 "$3" >&2; echo "ab.sh: building $1 failed (log: $3)" >&2; return 1; }
}

mkdir -p "$abdir" "$out/base" || exit 2
echo "ab.sh: base $rev (${sha:0:12}) in $wt"
git worktree add --detach "$wt" "$sha" >/dev/null 2>&1 ||
	{ echo "ab.sh: git worktree add $wt $sha failed" >&2; exit 2; }
build "$wt" "$wt/build" "$out/build-base.log" || exit 2
cp "$wt/build/twinstack" "$wt/build/twinstack-micro" "$out/base/" || exit 2
echo "ab.sh: candidate: the working tree, built in $cand"
build "$src" "$cand" "$out/build-cand.log" || exit 2

# ---- throughput: the interleaved A/B run ----
rm -f "$out/report.md" "$out/results.json"     # never summarise an earlier run's report
"$cand/twinstack" bench --ab "$out/base/twinstack" --out "$out" "$@"
rc_ab=$?
ab_line=$(grep -m1 '^ab: ' "$out/report.md" 2>/dev/null ||
	echo "ab: no report (twinstack bench exited $rc_ab)")

# ---- instructions: callgrind on both trees' micro-benchmarks ----
rc_instr=2
instr_line="instructions: not measured (valgrind not installed)"
if command -v valgrind >/dev/null; then
	if bash "$wt/bench/callgrind.sh" --json "$out/instr-base.json" "$out/base/twinstack-micro" \
		>"$out/instr-base.txt" 2>&1 &&
		bash bench/callgrind.sh --json "$out/instr-cand.json" "$cand/twinstack-micro" \
			>"$out/instr-cand.txt" 2>&1; then
		"$cand/twinstack" gate --baseline "$out/instr-base.json" --current "$out/instr-cand.json" \
			| tee "$out/instr-gate.txt"
		rc_instr=${PIPESTATUS[0]}
		instr_line="instructions: $(tail -n 1 "$out/instr-gate.txt")"
	else
		instr_line="instructions: callgrind.sh failed (logs: $out/instr-base.txt, $out/instr-cand.txt)"
	fi
fi

verdict() { case $1 in 0) echo pass ;; 1) echo FAIL ;; *) echo "could not run" ;; esac; }
echo "make ab: base ${sha:0:12} vs the working tree: throughput $(verdict "$rc_ab") ($ab_line);" \
	"$instr_line: $(verdict "$rc_instr")"
if [ "$rc_ab" -eq 0 ] && [ "$rc_instr" -eq 0 ]; then
	exit 0
fi
if [ "$rc_ab" -eq 1 ] || [ "$rc_instr" -eq 1 ]; then
	exit 1
fi
exit 2
