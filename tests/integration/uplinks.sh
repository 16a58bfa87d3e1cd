#!/usr/bin/env bash
# uplinks.sh — the system stack's UDP flows in the kernel when the uplink is not the Ethernet
# device itself: a bridge with the veth as its port (a desktop whose network card is bridged
# for its virtual machines), and a macvlan on the veth (a container's uplink). The flows'
# egress program hands their datagrams to the uplink's neighbour output and the reply program
# sits on the uplink's ingress: both must work on such a device as on the veth itself.
#
#   ns D: apps + proxy                                     ns S: server
#   tun 198.18.0.1/15, fd00:7f::1/64                       vsd 10.209.0.2/24, fd00:209::2/64
#   10.209.1.0/24, fd00:209:1::/64 dev tun                 lo 10.209.1.2, fd00:209:1::2
#   UPLINK (bridge with vds as its port, or a macvlan       udpcheck.py echo :5007 on both
#     on vds) 10.209.0.1/24, fd00:209::1/64 --- vds ------ routes back via D's UPLINK address
#   fwmark 1 -> table 100: default via S over UPLINK
#
# Per uplink kind, one proxy (direct outbound, marked): a 1.5 s UDP stream each way to the
# echo server, v4 then v6, every datagram checked (sequence and hash, 99 % back), and the
# fast path's counters must show the kernel carried most of it (fast_path.udp_datagrams_out
# and _in at least +750 each, fast_path.uplinks 1, nothing dropped, no flow refused for want
# of an uplink), the datagrams having crossed the veth (S's vsd counters); then SIGTERM.
#
# usage: uplinks.sh [--bin PATH] [--keep] [-v]
# Output: 'ok - NAME (detail)' / 'not ok - NAME: REASON' lines, then 'N passed, N failed'.
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun), 1 otherwise.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"
SUITE_NO_STACK=1
suite_args uplinks -- "$@"
suite_begin uplinks ip jq curl
STACK=system
V_DS=tsuds$TOK V_SD=tsusd$TOK UP=tsuu$TOK TUN=tsut$TOK
SRV4=10.209.1.2 SRV6=fd00:209:1::2 D4=10.209.0.1 D6=fd00:209::1 S4=10.209.0.2 S6=fd00:209::2
P_STATS=9196 P_ECHO=5007
inD() { ip netns exec "$NS_D" "$@"; }
inS() { ip netns exec "$NS_S" "$@"; }

# topology KIND: D and S joined by a veth, D's end under an uplink of KIND (bridge or
# macvlan) that holds D's addresses; the echo server in S.
topology() {
	local kind=$1
	netns_add "$NS_D" && netns_add "$NS_S" || return 1
	ip link add "$V_DS" netns "$NS_D" type veth peer name "$V_SD" netns "$NS_S" || return 1
	case $kind in
	bridge)
		ip -n "$NS_D" link add "$UP" type bridge &&
			ip -n "$NS_D" link set "$V_DS" master "$UP" || return 1 ;;
	macvlan)
		ip -n "$NS_D" link add "$UP" link "$V_DS" type macvlan mode bridge || return 1 ;;
	*) echo "unknown uplink kind $kind"; return 1 ;;
	esac
	ip -n "$NS_D" link set "$V_DS" up && ip -n "$NS_D" link set "$UP" up &&
		ip -n "$NS_S" link set "$V_SD" up || return 1
	ip -n "$NS_D" addr add "$D4/24" dev "$UP" && ip -n "$NS_D" addr add "$D6/64" dev "$UP" nodad &&
		ip -n "$NS_S" addr add "$S4/24" dev "$V_SD" &&
		ip -n "$NS_S" addr add "$S6/64" dev "$V_SD" nodad &&
		ip -n "$NS_S" addr add "$SRV4/32" dev lo && ip -n "$NS_S" addr add "$SRV6/128" dev lo nodad ||
		return 1
	ip -n "$NS_D" rule add fwmark 1 lookup 100 pref 100 &&
		ip -n "$NS_D" -6 rule add fwmark 1 lookup 100 pref 100 &&
		ip -n "$NS_D" route add default via "$S4" dev "$UP" table 100 &&
		ip -n "$NS_D" -6 route add default via "$S6" dev "$UP" table 100 || return 1
	ip -n "$NS_S" route add 198.18.0.0/15 via "$D4" &&
		ip -n "$NS_S" -6 route add fd00:7f::/64 via "$D6" || return 1
	spawn "$NS_S" "$TMP/echo.$kind.log" "$PY" "$HERE/udpcheck.py" echo \
		--bind "$SRV4:$P_ECHO" --bind "[$SRV6]:$P_ECHO"
	ECHO_PID=$SPAWNED
	wait_listen "$NS_S" udp "$P_ECHO" 100 || { echo "no echo server in S"; return 1; }
	echo "$kind $UP over $V_DS in D, echo server in S"
}

routes_tun() {
	ip -n "$NS_D" route replace 10.209.1.0/24 dev "$TUN" src 198.18.0.1 &&
		ip -n "$NS_D" -6 route replace fd00:209:1::/64 dev "$TUN" src fd00:7f::1
}

# fast_state: the fast path on, its UDP flows too.
fast_state() {
	local d
	d=$(stats) || { echo "no /stats"; return 1; }
	jq -r '"fast_path.state \(.fast_path.state), udp_state \(.fast_path.udp_state)"' <<<"$d"
	jq -e '.fast_path.state == "on" and .fast_path.udp_state == "on"' <<<"$d" >/dev/null
}

# veth_rx: the bytes S's end of the veth has received. Bytes, not packets: datagrams the
# userspace path sends before the kernel takes the flow may go as one UDP GSO train, which
# crosses the veth as one packet.
veth_rx() { ip -n "$NS_S" -j -s link show "$V_SD" | jq -r '.[0].stats64.rx.bytes'; }

# stream HOST: 1,500 datagrams of 1,000 bytes, 1 ms apart, echoed and checked; the kernel
# carried most of them both ways through the uplink, which S's veth saw: every delivered
# datagram's 1,000 bytes at least.
stream() {
	local b a out r0 r1 n
	b=$(stats) && r0=$(veth_rx) || { echo "no /stats"; return 1; }
	out=$(inD "$PY" "$HERE/udpcheck.py" stream --dst "$1:$P_ECHO" --size 1000 --count 1500 \
		--interval-ms 1 --wait 3 --min-pct 99) || { echo "$out"; return 1; }
	a=$(stats) && r1=$(veth_rx) || { echo "no /stats"; return 1; }
	echo "$out; $(jq -rn --argjson b "$b" --argjson a "$a" '"fast_path.udp_datagrams_out +\($a.fast_path.udp_datagrams_out - $b.fast_path.udp_datagrams_out), _in +\($a.fast_path.udp_datagrams_in - $b.fast_path.udp_datagrams_in), uplinks \($a.fast_path.uplinks)"'), S's veth +$((r1 - r0)) bytes"
	n=$(jq -r .delivered <<<"$out") || { echo "no delivered count"; return 1; }
	[ "$n" -ge 1485 ] && [ $((r1 - r0)) -ge $((n * 1000)) ] ||
		{ echo "S's veth received $((r1 - r0)) bytes for $n delivered, want $((n * 1000)) or more"; return 1; }
	jq -en --argjson b "$b" --argjson a "$a" '
		($a.fast_path.udp_datagrams_out - $b.fast_path.udp_datagrams_out) >= 750 and
		($a.fast_path.udp_datagrams_in - $b.fast_path.udp_datagrams_in) >= 750 and
		$a.fast_path.uplinks == 1 and
		$a.fast_path.udp_no_uplink == $b.fast_path.udp_no_uplink and
		$a.fast_path.udp_dropped == $b.fast_path.udp_dropped' >/dev/null ||
		{ echo "want _out and _in +750 or more, uplinks 1, no flow without an uplink, no drops"; return 1; }
}

# one KIND: in namespaces of its own, the topology, a proxy, a stream each family, SIGTERM.
one() {
	local kind=$1
	NS_D=tsuD${kind:0:1}-$TOK NS_S=tsuS${kind:0:1}-$TOK
	check "$kind: topology" topology "$kind" || return 1
	jq -n --arg tun "$TUN" --arg l "127.0.0.1:$P_STATS" '
		{stack: "system", tun: {name: $tun, address: "198.18.0.1/15", address6: "fd00:7f::1/64"},
		 outbounds: [{tag: "direct", type: "direct", routing_mark: 1}],
		 route: {final: "direct"}, timeouts: {udp_idle_ms: 1000},
		 stats: {listen: $l}, log: {level: "info"}}' >"$TMP/cfg.json"
	check "$kind: start" ts_start || return 1
	check "$kind: stats: fast path on, its UDP flows too" fast_state
	check "$kind: udp v4: a stream through the kernel over the $kind, intact" stream "$SRV4"
	check "$kind: udp v6: a stream through the kernel over the $kind, intact" stream "[$SRV6]"
	if grep -q 'stay in userspace' "$TMP/twinstack.log"; then
		not_ok "$kind: no flow left in userspace" "$(grep -m1 'stay in userspace' "$TMP/twinstack.log" | cut -c1-200)"
	else
		ok "$kind: no flow left in userspace" "the log has no 'stay in userspace' line"
	fi
	check "$kind: SIGTERM" ts_sigterm
	cp "$TMP/twinstack.log" "$TMP/twinstack.$kind.log"
	stop_pid "$ECHO_PID"
}

T0=$(date +%s%N)
note "uplinks: bridge and macvlan, token=$TOK"
one bridge
one macvlan
note "$(elapsed_ms "$T0") ms"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
