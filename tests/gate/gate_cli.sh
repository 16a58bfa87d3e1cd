#!/usr/bin/env bash
# gate_cli.sh — the `twinstack gate` command-line contract on the fixtures of this folder:
# exit 0 pass, 1 regression, 2 bad usage, unreadable/invalid input (message naming the file
# and the JSON path on stderr), a baseline with nothing to gate (only the old ceiling_fraction
# rows: the message says how to regenerate it; no gated row at all) or files measured under
# different TCP congestion controls.
#
# usage: gate_cli.sh TWINSTACK_BINARY
set -uo pipefail

bin=${1:?usage: gate_cli.sh TWINSTACK_BINARY}
dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

# expect WANT_RC STDERR_REGEX DESCRIPTION -- ARGS...
expect() {
	local want=$1 re=$2 what=$3
	shift 4
	"$bin" gate "$@" >"$work/out" 2>"$work/err"
	local rc=$?
	if [ "$rc" -ne "$want" ]; then
		echo "FAIL $what: exit $rc, want $want"; sed 's/^/  /' "$work/out" "$work/err"
		failed=$((failed + 1))
	elif [ -n "$re" ] && ! grep -Eq -- "$re" "$work/err"; then
		echo "FAIL $what: stderr lacks /$re/"; sed 's/^/  /' "$work/err"
		failed=$((failed + 1))
	else
		echo "ok   $what (exit $rc)"
	fi
}

b=$dir/baseline.json
expect 0 "" "--help" -- --help
expect 2 "required" "no arguments" --
expect 2 "unexpected argument" "unknown option" -- --baseline "$b" --current "$b" --bogus
expect 2 "needs a value" "option without value" -- --baseline "$b" --current
expect 2 "percentage" "bad tolerance" -- -b "$b" -c "$b" --instr-tolerance x
expect 0 "" "identical files" -- --baseline "$b" --current "$b"
expect 0 "" "noise (+-3 %)" -- --baseline "$b" --current "$dir/current_noise.json"
expect 1 "" "injected 15 % slowdown" -- --baseline "$b" --current "$dir/current_slow15.json"
expect 2 "with TCP congestion control reno, .*current_bbr.json with bbr" \
	"different congestion controls" -- -b "$dir/baseline_reno.json" -c "$dir/current_bbr.json"
expect 0 "" "same congestion control" -- -b "$dir/baseline_reno.json" -c "$dir/baseline_reno.json"
expect 0 "" "15 % slowdown under --ratio-tolerance 20" -- -b "$b" \
	-c "$dir/current_slow15.json" --ratio-tolerance 20
expect 1 "" "instructions +3 % at 2 %" -- -b "$b" -c "$dir/current_instr3.json"
expect 0 "" "instructions +3 % at 5 %" -- -b "$b" -c "$dir/current_instr3.json" \
	--instr-tolerance=5
expect 0 "" "missing rows" -- -b "$b" -c "$dir/current_missing.json"
expect 1 "" "missing rows --strict" -- -b "$b" -c "$dir/current_missing.json" --strict
expect 0 "" "callgrind format as current" -- -b "$b" -c "$dir/callgrind_ok.json"
expect 2 "bad_json.json: \\$: not valid JSON" "malformed JSON" -- -b "$b" -c "$dir/bad_json.json"
expect 2 "bad_type.json: \\$\\.rows\\[4\\]\\.median: expected a number" "wrong type" -- \
	-b "$dir/bad_type.json" -c "$b"
expect 2 "nope.json: cannot read" "missing file" -- -b "$b" -c "$work/nope.json"
old=$dir/baseline_old_metric.json
re="baseline_old_metric.json: only has the old ceiling_fraction metric \(4 rows\), no"
re="$re redirect_fraction row.*make bench BENCH_ARGS=--ablation, then copy its results.json"
re="$re .* to bench/baseline/ablation.json"
expect 2 "$re" "old-metric baseline (ceiling_fraction only)" -- -b "$old" -c "$b"
expect 0 "" "old-metric current: redirect rows missing" -- -b "$b" -c "$old"
expect 1 "" "old-metric current --strict" -- -b "$b" -c "$old" --strict
echo '{"rows": [{"stack": "system", "workload": "tcp_bulk", "metric": "throughput_gbps",
	"median": 2}]}' >"$work/ungated.json"
expect 2 "ungated.json: \\$: no instructions_per_op or redirect_fraction rows: nothing to compare" \
	"baseline without gated rows" -- -b "$work/ungated.json" -c "$b"
grep -q "missing" <("$bin" gate -b "$b" -c "$dir/current_missing.json") ||
	{ echo "FAIL missing rows not listed in the table"; failed=$((failed + 1)); }
grep -q "^gate: note: .*baseline_old_metric.json has only the old ceiling_fraction metric" \
	<("$bin" gate -b "$b" -c "$old") ||
	{ echo "FAIL an old-metric current file gets no note"; failed=$((failed + 1)); }
grep -q "system/per-packet/q1/connrate/-/-" <("$bin" gate -b "$b" -c "$dir/current_noise.json") ||
	{ echo "FAIL the connrate row is not in the table"; failed=$((failed + 1)); }
"$bin" gate --help | grep -q "redirect_fraction" ||
	{ echo "FAIL --help does not describe redirect_fraction"; failed=$((failed + 1)); }

[ "$failed" -eq 0 ] || { echo "gate_cli: $failed failed"; exit 1; }
echo "gate_cli: all passed"
