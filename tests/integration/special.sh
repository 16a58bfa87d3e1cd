#!/usr/bin/env bash
# special.sh — a connection to a special destination (stacks/common/l3policy.h) fails at once:
# the proxy refuses its first SYN, and its answer must be one the kernel of the app's host
# accepts, or the app waits out its SYN retransmissions instead.
#
#   ns C: routed client                  ns D: proxy + apps, no uplink
#   vcd 10.208.0.2/24 ------------------ vdc 10.208.0.1/24     tun 198.18.0.1/15, fd00:7f::1/64
#       fd00:208::2/64                       fd00:208::1/64    default (v4, v6) dev tun
#   default via D                        forwarding on         127.1.2.0/24 dev tun (table local)
#                                        rp_filter 1 (strict)
#
# Each case must end within 2 s with ECONNREFUSED, EHOSTUNREACH or ENETUNREACH (an app) or an
# answer quoting the SYN (a raw SYN), and move drops.special_destination and the stack's
# answers sent (stack_counters.icmp_unreach) by exactly one:
#  1. an app in D to 0.1.2.3:80 (0/8 but 0.0.0.0 is routed like any unicast address)
#  2. an app in D to 127.1.2.3:80, routed into the TUN by a route in D's local table that is
#     more specific than lo's 127.0.0.0/8 (without it the kernel keeps 127/8 to itself)
#  3. an app in D to [::1.2.3.4]:80 (IPv4-compatible)
#  4. an app in C to 0.1.2.3:80, forwarded by D
#  5. an app in C to [::1.2.3.4]:80, forwarded by D
#  6. a SYN written by C to [::]:80 (no app can connect there: Linux makes :: into ::1)
#  7. a SYN written by C to [::ffff:127.0.0.1]:80 (an app's would be IPv4)
# Controls: an app in D to 224.1.2.3:80 and [ff02::1]:80 is refused by its own kernel
# (ENETUNREACH) and never reaches the TUN: drops.special_destination does not move.
# Kernel counters of D, where an answer the kernel refuses dies: Ip6InAddrErrors
# (/proc/net/snmp6) must not move over case 6 or 7; for case 2 the martian sources the
# kernel saw (/proc/net/stat/rt_cache, every namespace's) are noted.
#
# usage: special.sh [--stack system|lwip] [--bin PATH] [--keep] [-v]
# Output: 'ok - NAME (detail)' / 'not ok - NAME: REASON' lines, then 'N passed, N failed'.
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun), 1 otherwise.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"
suite_args special -- "$@"
suite_begin special ip jq curl
NS_D=tsxD-$TOK NS_C=tsxC-$TOK V_DC=tsxdc$TOK V_CD=tsxcd$TOK TUN=tsxt$TOK
P_STATS=9195 WITHIN=2
inD() { ip netns exec "$NS_D" "$@"; }
inC() { ip netns exec "$NS_C" "$@"; }

topology() {
	netns_add "$NS_D" && netns_add "$NS_C" || return 1
	ip link add "$V_DC" netns "$NS_D" type veth peer name "$V_CD" netns "$NS_C" || return 1
	ip -n "$NS_D" link set "$V_DC" up && ip -n "$NS_C" link set "$V_CD" up || return 1
	ip -n "$NS_D" addr add 10.208.0.1/24 dev "$V_DC" &&
		ip -n "$NS_D" addr add fd00:208::1/64 dev "$V_DC" nodad &&
		ip -n "$NS_C" addr add 10.208.0.2/24 dev "$V_CD" &&
		ip -n "$NS_C" addr add fd00:208::2/64 dev "$V_CD" nodad || return 1
	ip -n "$NS_C" route add default via 10.208.0.1 &&
		ip -n "$NS_C" -6 route add default via fd00:208::1 || return 1
	# Strict reverse-path filtering in D: an answer's source must route back into the TUN.
	inD sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
		net.ipv4.conf.all.rp_filter=1 >/dev/null || return 1
	echo "D and C up, rp_filter 1 in D"
}

routes_tun() {
	ip -n "$NS_D" route add default dev "$TUN" &&
		ip -n "$NS_D" -6 route add default dev "$TUN" &&
		ip -n "$NS_D" route add 127.1.2.0/24 dev "$TUN" src 198.18.0.1 table local
}

# special_drops: drops.special_destination now.
special_drops() { stat_key drops.special_destination "$(stats)"; }
addr_errors6() { inD sed -n 's/^Ip6InAddrErrors[[:space:]]*//p' /proc/net/snmp6; }
# martian_sources: in_martian_src of /proc/net/stat/rt_cache (hex, one line per CPU), summed.
martian_sources() {
	local s=0 f
	while read -r -a f; do
		[[ ${f[7]:-} =~ ^[0-9a-f]+$ ]] && s=$((s + 16#${f[7]}))
	done < <(tail -n +2 /proc/net/stat/rt_cache 2>/dev/null)
	echo "$s"
}

# attempt NAME CMD...: CMD (a special.py client) must succeed; the drop counter and the
# stack's count of answers sent must each move by one.
attempt() {
	local name=$1 s0 s1 out rc d a
	shift
	s0=$(stats)
	out=$("$@" 2>&1)
	rc=$?
	s1=$(stats)
	if [ "$rc" -eq 0 ]; then ok "$name: answered" "$out"; else not_ok "$name: answered within $WITHIN s" "$out"; fi
	d=$(delta drops.special_destination "$s0" "$s1")
	a=$(delta stack_counters.icmp_unreach "$s0" "$s1")
	if [ "$d" = 1 ] && [ "$a" = 1 ]; then
		ok "$name: drops.special_destination +1, stack_counters.icmp_unreach +1"
	else
		not_ok "$name: drops.special_destination +1, stack_counters.icmp_unreach +1" "+$d, +$a"
	fi
}

# attempt6 NAME DST: attempt with a SYN written by C; D's kernel must not drop the answer.
attempt6() {
	local a0 a1
	a0=$(addr_errors6)
	attempt "$1" inC "${SYN6[@]}" --dst "$2"
	a1=$(addr_errors6)
	if [ "$a0" = "$a1" ]; then ok "${1%% *} Ip6InAddrErrors of D unchanged" "$a1"; else
		not_ok "${1%% *} Ip6InAddrErrors of D unchanged" "$a0 -> $a1: D dropped the answer"; fi
}

# control NAME HOST: refused by D's own kernel, nothing reaches the TUN.
control() {
	local before after out
	before=$(special_drops)
	out=$(inD "$PY" "$HERE/special.py" connect --host "$2" --port 80 --within "$WITHIN" 2>&1)
	after=$(special_drops)
	case $out in
	ENETUNREACH*) if [ "$before" = "$after" ]; then ok "$1" "$out; the proxy saw nothing"; else
		not_ok "$1" "$out, but drops.special_destination $before -> $after"; fi ;;
	*) not_ok "$1" "want ENETUNREACH from the kernel: $out" ;;
	esac
}

T0=$(date +%s%N)
note "special destinations: stack=$STACK token=$TOK"
check "topology" topology || exit 1
jq -n --arg st "$STACK" --arg tun "$TUN" --arg l "127.0.0.1:$P_STATS" '
	{stack: $st, tun: {name: $tun, address: "198.18.0.1/15", address6: "fd00:7f::1/64"},
	 stats: {listen: $l}, log: {level: "warn"}}' >"$TMP/cfg.json"
check "start (stack $STACK)" ts_start || exit 1
MAC_D=$(ip -n "$NS_D" -j link show "$V_DC" | jq -r '.[0].address')
CONNECT=("$PY" "$HERE/special.py" connect --port 80 --within "$WITHIN")
SYN6=("$PY" "$HERE/special.py" syn6 --ifname "$V_CD" --mac "$MAC_D" --src fd00:208::2 --port 80
	--within "$WITHIN")

attempt "1. D -> 0.1.2.3" inD "${CONNECT[@]}" --host 0.1.2.3
m0=$(martian_sources)
attempt "2. D -> 127.1.2.3 (routed into the TUN)" inD "${CONNECT[@]}" --host 127.1.2.3
note "2. martian sources the kernel dropped meanwhile (all namespaces): $(($(martian_sources) - m0))"
attempt "3. D -> [::1.2.3.4]" inD "${CONNECT[@]}" --host ::1.2.3.4
attempt "4. C -> 0.1.2.3 (forwarded)" inC "${CONNECT[@]}" --host 0.1.2.3
attempt "5. C -> [::1.2.3.4] (forwarded)" inC "${CONNECT[@]}" --host ::1.2.3.4
attempt6 "6. SYN from C -> [::]" ::
attempt6 "7. SYN from C -> [::ffff:127.0.0.1]" ::ffff:127.0.0.1
control "control: D -> 224.1.2.3 refused by the kernel" 224.1.2.3
control "control: D -> [ff02::1] refused by the kernel" ff02::1

if kill -0 "$TS_PID" 2>/dev/null; then ok "the proxy is alive"; else not_ok "the proxy is alive" "exited"; fi
[ "$VERBOSE" -eq 1 ] && stats | jq -c '.drops'
check "SIGTERM" ts_sigterm
note "$(elapsed_ms "$T0") ms"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
