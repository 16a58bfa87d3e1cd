#!/usr/bin/env bash
# flood.sh — a SYN flood through the TUN while an application keeps connecting: spoofed SYNs
# (sources from 10.250.0.0/20, a range this test owns and blackholes, so the proxy's SYN-ACKs
# go nowhere) are written into the TUN with AF_PACKET (tests/integration/synflood.py) at
# --rate per second for --seconds, while curl fetches a page from a server behind the uplink
# every 100 ms. Passes when every curl succeeds, the NAT's half-open entries stay under
# nat_entries / 2 at every sample, the flood is counted (the stack's drop counters, or
# nat.half_open bounded) and the proxy is alive afterwards.
#
#   ns D: proxy (auto_route) + curl + the injector         ns S: server on lo 10.202.9.2:80
#   vDS 10.202.0.1/24 ------------------------------------ vSD 10.202.0.2/24
#   blackhole 10.250.0.0/20 (the spoofed sources)          route 198.18.0.0/15 via D
#
# usage: flood.sh [--stack system|lwip] [--bin PATH] [--rate N] [--seconds S] [--keep] [-v]
# Output: 'ok - NAME' / 'not ok - NAME: REASON' lines, then 'N passed, N failed'.
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun), 1 otherwise.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
STACK=system
BIN=$SRC/build/twinstack
RATE=5000
SECONDS_FLOOD=4
KEEP_TMP=0
VERBOSE=0

usage() { sed -n '/^# usage:/,/^# Output:/p' "$0" | sed 's/^# \{0,1\}//'; }
# shellcheck disable=SC2034 # KEEP_TMP and VERBOSE are read by lib.sh
while [ $# -gt 0 ]; do
	case $1 in
	--stack) STACK=${2:?}; shift 2 ;;
	--bin) BIN=${2:?}; shift 2 ;;
	--rate) RATE=${2:?}; shift 2 ;;
	--seconds) SECONDS_FLOOD=${2:?}; shift 2 ;;
	--keep) KEEP_TMP=1; shift ;;
	-v | --verbose) VERBOSE=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "flood.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
	esac
done
case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"

if [ "$(id -u)" -ne 0 ]; then echo "# SKIP: needs root"; exit 77; fi
if [ ! -c /dev/net/tun ]; then echo "# SKIP: no /dev/net/tun"; exit 77; fi
PY=$(command -v python3)
for t in ip curl jq "$PY"; do
	command -v "$t" >/dev/null 2>&1 || { echo "not ok - prerequisites: no $t"; echo "0 passed, 1 failed"; exit 1; }
done

TOK=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
TMP=$(mktemp -d "${TMPDIR:-/tmp}/twinstack-flood.XXXXXX")
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
NS_D=tsfD-$TOK NS_S=tsfS-$TOK V_DS=tsfds$TOK V_SD=tsfsd$TOK TUN=tsft$TOK
SRV=10.202.9.2 P_STATS=9191
inD() { ip netns exec "$NS_D" "$@"; }
stats() { inD curl -s --max-time 2 "http://127.0.0.1:$P_STATS/stats"; }

T0=$(date +%s)
note "SYN flood: stack=$STACK rate=$RATE/s for ${SECONDS_FLOOD}s token=$TOK"
netns_add "$NS_D" && netns_add "$NS_S" || { not_ok setup "namespaces"; exit 1; }
ip link add "$V_DS" netns "$NS_D" type veth peer name "$V_SD" netns "$NS_S"
ip -n "$NS_D" link set "$V_DS" up
ip -n "$NS_S" link set "$V_SD" up
ip -n "$NS_D" addr add 10.202.0.1/24 dev "$V_DS"
ip -n "$NS_S" addr add 10.202.0.2/24 dev "$V_SD"
ip -n "$NS_S" addr add "$SRV/32" dev lo
ip -n "$NS_D" route add default via 10.202.0.2
ip -n "$NS_D" route add blackhole 10.250.0.0/20
ip -n "$NS_S" route add 198.18.0.0/15 via 10.202.0.1
echo hello >"$TMP/index.html"
spawn "$NS_S" "$TMP/httpd.log" "$PY" -m http.server --bind "$SRV" --directory "$TMP" 80
wait_listen "$NS_S" tcp 80 100 || { not_ok setup "no server"; exit 1; }

jq -n --arg s "$STACK" --arg t "$TUN" --arg l "127.0.0.1:$P_STATS" \
	'{stack: $s, tun: {name: $t, auto_route: true}, stats: {listen: $l},
	  log: {level: "warn"}}' >"$TMP/cfg.json"
spawn "$NS_D" "$TMP/twinstack.log" "$BIN" run --config "$TMP/cfg.json"
TS_PID=$SPAWNED
wait_until 100 stats >/dev/null || { not_ok start "no stats: $(tail -n 3 "$TMP/twinstack.log")"; exit 1; }
entries=
for _ in 1 2 3 4 5; do
	entries=$(stats | jq '.budgets.nat_entries // 65536' 2>/dev/null)
	[ -n "$entries" ] && break
	sleep 0.2
done
case $entries in '' | *[!0-9]*) entries=65536 ;; esac
cap=$((entries / 2))

# The application: a fetch every 100 ms for the whole flood and a second after it.
(
	end=$(($(date +%s) + SECONDS_FLOOD + 2))
	while [ "$(date +%s)" -lt "$end" ]; do
		if inD curl -s -o /dev/null --max-time 3 "http://$SRV/index.html"; then echo ok; else echo fail; fi
		sleep 0.1
	done
) >"$TMP/curl.out" 2>&1 &
CURL_PID=$!
sleep 0.5
before=$(stats)
inD "$PY" "$HERE/synflood.py" --dev "$TUN" --src 10.250.0.0/20 --dst "$SRV" --dport 80 \
	--rate "$RATE" --seconds "$SECONDS_FLOOD" >"$TMP/flood.json" 2>"$TMP/flood.err" &
FLOOD_PID=$!
max_half=0
while kill -0 "$FLOOD_PID" 2>/dev/null; do
	h=$(stats | jq '.nat.half_open // 0')
	[ "${h:-0}" -gt "$max_half" ] && max_half=$h
	sleep 0.2
done
wait "$FLOOD_PID"
wait "$CURL_PID"
after=$(stats)
sent=$(jq '.sent' "$TMP/flood.json" 2>/dev/null || echo 0)
oks=$(grep -c '^ok' "$TMP/curl.out")
fails=$(grep -c '^fail' "$TMP/curl.out")
note "sent $sent SYNs; curl $oks ok, $fails failed; half-open max $max_half (cap $cap)"

check "flood sent" test "$sent" -gt $((RATE * SECONDS_FLOOD / 2))
if [ "$fails" -eq 0 ] && [ "$oks" -gt 5 ]; then ok "every fetch during the flood succeeded" "$oks fetches"
else not_ok "every fetch during the flood succeeded" "$fails of $((oks + fails)) failed"; fi
if [ "$max_half" -le "$cap" ]; then ok "half-open entries stay under nat_entries / 2" "max $max_half of $cap"
else not_ok "half-open entries stay under nat_entries / 2" "max $max_half > $cap"; fi
d_drops=$(jq -n --argjson a "$before" --argjson b "$after" \
	'[($b.stack_counters // {}) | to_entries[] | select(.key | test("drop|refused|limit")) | .value] | add // 0' )
d_drops0=$(jq -n --argjson a "$before" \
	'[($a.stack_counters // {}) | to_entries[] | select(.key | test("drop|refused|limit")) | .value] | add // 0' )
note "stack drop counters: +$((d_drops - d_drops0)); drops.half_open +$(( $(jq '.drops.half_open // 0' <<<"$after") - $(jq '.drops.half_open // 0' <<<"$before") ))"
if kill -0 "$TS_PID" 2>/dev/null; then ok "the proxy is alive after the flood"
else not_ok "the proxy is alive after the flood" "exited"; fi
[ "$VERBOSE" -eq 1 ] && jq -c ".stack_counters, .drops, .sessions" <<<"$after"
stop_pid "$TS_PID" 3
note "elapsed $(($(date +%s) - T0)) s"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
