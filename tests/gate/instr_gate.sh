#!/usr/bin/env bash
# instr_gate.sh — the instruction-count regression gate: count the micro-benchmarks' instructions
# with callgrind now, check each case's absolute target and gate them against the committed baseline (docs/benchmarks.md
# "Regression gate"). Exit 0 pass, 1 regression (or a tool failed), 2 unreadable input,
# 77 skipped (no valgrind).
#
# usage: instr_gate.sh SOURCE_DIR TWINSTACK_MICRO TWINSTACK [GATE OPTIONS...]
# Regenerate the baseline (Release build, after an intended change):
#   bench/callgrind.sh --json bench/baseline/micro.json build/twinstack-micro
set -uo pipefail

src=${1:?usage: instr_gate.sh SOURCE_DIR TWINSTACK_MICRO TWINSTACK}
micro=${2:?usage: instr_gate.sh SOURCE_DIR TWINSTACK_MICRO TWINSTACK}
bin=${3:?usage: instr_gate.sh SOURCE_DIR TWINSTACK_MICRO TWINSTACK}
shift 3
command -v valgrind >/dev/null || { echo "instr_gate: valgrind not installed: skipped"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One count serves both checks: each case's absolute target (--check) and the baseline.
"$src/bench/callgrind.sh" --check --json "$tmp/current.json" "$micro"
targets=$?
[ -s "$tmp/current.json" ] || {
	echo "instr_gate: bench/callgrind.sh failed" >&2
	exit 1
}
"$bin" gate --baseline "$src/bench/baseline/micro.json" --current "$tmp/current.json" "$@"
rc=$?
[ "$rc" -ne 0 ] && exit "$rc"
exit "$targets"
