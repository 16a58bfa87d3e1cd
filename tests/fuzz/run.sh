#!/usr/bin/env bash
# run.sh FUZZER CORPUS WORKDIR SECONDS — run a libFuzzer target for SECONDS from the committed
# seed corpus (read-only) plus a scratch corpus in WORKDIR. Any crash, leak or timeout fails.
set -euo pipefail
fuzzer=$1 corpus=$2 work=$3 secs=$4
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
"$fuzzer" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	-artifact_prefix="$work/artifacts/" "$work/corpus" "$corpus" 2>"$work/log" || {
	tail -n 40 "$work/log"
	echo "fuzz: $(basename "$fuzzer") failed; artifacts in $work/artifacts" >&2
	exit 1
}
grep -E '^(stat::number_of_executed_units|#[0-9]+.*DONE)' "$work/log" | tail -n 2 || true
echo "fuzz: $(basename "$fuzzer") ran ${secs}s without failure"
