#!/usr/bin/env bash
# gate_cli.sh — the `twinstack gate` command-line contract on the fixtures of this folder:
# exit 0 pass, 1 regression, 2 bad usage, unreadable/invalid input (message naming the file
# and the JSON path on stderr) or files measured under different TCP congestion controls.
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
grep -q "missing" <("$bin" gate -b "$b" -c "$dir/current_missing.json") ||
	{ echo "FAIL missing rows not listed in the table"; failed=$((failed + 1)); }

[ "$failed" -eq 0 ] || { echo "gate_cli: $failed failed"; exit 1; }
echo "gate_cli: all passed"
