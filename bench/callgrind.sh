#!/usr/bin/env bash
# callgrind.sh [--check] [--json FILE] MICRO_BINARY — deterministic instruction counts per
# iteration of every twinstack-micro case: (Ir(N2) - Ir(N1)) / (N2 - N1) / units-per-iteration,
# so setup and teardown cancel out. With --check, exit 1 if a case exceeds its target.
set -euo pipefail

check=0 json=""
while [ $# -gt 1 ]; do
	case "$1" in
	--check) check=1; shift ;;
	--json) json=$2; shift 2 ;;
	*) break ;;
	esac
done
micro=${1:?usage: callgrind.sh [--check] [--json FILE] path/to/twinstack-micro}
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind not installed" >&2; exit 2; }

# case  N1  N2  units-per-iteration  target (instructions per unit)
cases=(
	"rewrite4     10000 110000 1    120"
	"rewrite6     10000 110000 1    200"
	"nat_steady   10000 110000 1    400"
	"nat_new1024  2     12     1024 1500"
	"rewrite4_gso 10000 110000 1    160"
	"gso_train    100   1100   44   450"
	"sys_udp4     10000 110000 1    190"
	"sys_udp6     10000 110000 1    190"
	"sys_syn4     10000 110000 1    490"
	"sys_syn6     10000 110000 1    610"
	"sys_udp4_path     10000 110000 1 600"
	"sys_udp6_path     10000 110000 1 620"
	"sys_udp4_path_raw 10000 110000 1 700"
	"sys_udp4_path_train16 1000 11000 16 600"
	"lw_udp4      10000 110000 1    170"
	"lw_udp6      10000 110000 1    290"
	"lw_syn4      1000  11000  1    2250"
	"lw_syn6      1000  11000  1    2350"
	"domain_suffix_100k 10000 110000 1 2000"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

instr() { # case iterations tag -> total instructions (runs of different tags may overlap)
	valgrind --tool=callgrind --callgrind-out-file="$tmp/out.$3" "$micro" --case "$1" \
		--iterations "$2" 2>"$tmp/err.$3" >/dev/null || { cat "$tmp/err.$3" >&2; return 1; }
	awk '/Collected :/ { print $NF }' "$tmp/err.$3"
}

fail=0 rows=""
printf '%-12s %12s %8s  %s\n' case instr/unit target verdict
for row in "${cases[@]}"; do
	read -r name n1 n2 per target <<<"$row"
	# The two counts are independent: run them side by side (instruction counts do not
	# depend on what else runs; the wall time halves).
	instr "$name" "$n1" a >"$tmp/i1" &
	instr "$name" "$n2" b >"$tmp/i2" || { wait; exit 1; }
	wait $! || exit 1
	i1=$(cat "$tmp/i1") i2=$(cat "$tmp/i2")
	per_unit=$(awk -v a="$i1" -v b="$i2" -v n1="$n1" -v n2="$n2" -v p="$per" \
		'BEGIN { printf "%.1f", (b - a) / (n2 - n1) / p }')
	verdict=ok
	if awk -v x="$per_unit" -v t="$target" 'BEGIN { exit !(x > t) }'; then
		verdict=OVER
		fail=1
	fi
	printf '%-12s %12s %8s  %s\n' "$name" "$per_unit" "$target" "$verdict"
	rows="$rows${rows:+,}\"$name\":{\"instructions\":$per_unit,\"target\":$target}"
done
[ -z "$json" ] || echo "{\"callgrind\":{$rows}}" >"$json"
if [ "$check" = 1 ] && [ "$fail" = 1 ]; then
	echo "callgrind.sh: instruction targets exceeded" >&2
	exit 1
fi
exit 0
