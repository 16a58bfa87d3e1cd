#!/usr/bin/env bash
# hostile.sh — malformed and hostile packets written into the TUN while downloads run through
# the proxy, one per outbound type: direct (v4 and v6), SOCKS5 (microsocks) and HTTP CONNECT
# (tinyproxy). tests/integration/hostile.py writes the packets with an AF_PACKET socket on the
# TUN, so the proxy reads them as if an application behind the TUN had sent them; each class is
# a burst of a few hundred packets, every class a different number of them.
#
#   ns D: clients + twinstack run + hostile.py          ns S: servers
#   curl -> 10.204.{1,2,3}.2, fd00:204:1::2             on lo: 10.204.1.2, .2.2, .3.2,
#     | main table: 10.204.0.0/16, fd00:204::/44 -> tun   fd00:204:1::2: http.server :80
#     v (the veth's /24 and /64 stay on the veth)         (16 MiB)
#   tun 198.18.0.1/15, fd00:7f::1/64 (twinstack's)      on the veth address 10.204.0.2:
#     |  ^   <- hostile.py (AF_PACKET on the tun)         microsocks :1080, tinyproxy :8888
#     v  |                                               10.204.9.9, fd00:204:9::9: nothing
#   twinstack: outbounds routing_mark 1,                   (the hostile packets' "foreign"
#   fwmark 1 -> table 100: default via S                   destination)
#   vhd 10.204.0.1/24, fd00:204::1/64 ----------------- vhs 10.204.0.2/24, fd00:204::2/64
#
# Outbounds by destination: 10.204.2.0/24 socks5 (microsocks), 10.204.3.0/24 http (tinyproxy),
# everything else direct.
#
# Passes when every download's sha256 equals the file's, the proxy still answers /stats and a
# new connection afterwards, and each class moved its own counter (the table CLASS_KEY below:
# `stack_counters.*` in /stats) by exactly the packets the proxy read of it — every one, unless
# the TUN device itself dropped some (its tx_dropped, from /sys/class/net/TUN/statistics) —
# while no other drop counter moved by as much as the smallest burst, no hostile packet reached
# the UDP path or became a session, and the public drops.* figures add up. The one class that
# is not dropped (valid IPv6 extension headers before an ACK of no connection) must come back
# as a RST per packet, each matched to its packet by hostile.py on the TUN.
#
# usage: hostile.sh [--stack system|lwip] [--bin PATH] [--count N] [--keep] [-v]
#   --count  packets in the first class's burst (class i sends N + i; default 200)
# Output: 'ok - NAME (detail)' / 'not ok - NAME: REASON' lines, '#' notes, 'N passed, N failed'.
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun), 1 otherwise.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
COUNT=200

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"
suite_args hostile --count COUNT -- "$@"
case $COUNT in '' | *[!0-9]*) echo "hostile.sh: --count is a number" >&2; exit 2 ;; esac

suite_begin hostile ip ss curl jq microsocks tinyproxy sha256sum
chmod 755 "$TMP" # tinyproxy runs as nobody and reads its config from here
NS_D=tshD-$TOK NS_S=tshS-$TOK V_DS=tshd$TOK V_SD=tshs$TOK TUN=tsht$TOK
D4=10.204.0.1 S4=10.204.0.2 D6=fd00:204::1 S6=fd00:204::2
GW4=198.18.0.1 GW6=fd00:7f::1 NAT_ADDRS=4
P_STATS=9194
inD() { ip netns exec "$NS_D" "$@"; }

# Where each class must land, per stack (a key of /stats). The classes are hostile.py's.
# Parse drops are the shared parser's reasons (core/pkt.h); own_address, nat_address and
# from_nat_address the shared policy's (stacks/common/l3policy.h); downlink_no_mapping the
# system stack's NAT. v6_ext_ok is the one class that must NOT be dropped: valid extension
# headers before an ACK of no connection, which each stack answers with a RST (the system stack
# itself, counted in rst_sent; lwIP from its listener, counted nowhere of its own: the
# downloads' segments move to_lwip too). Its check is the answers hostile.py saw, one per
# packet (ANSWERED), and on the system stack rst_sent as well, which nothing else here moves.
declare -A CLASS_KEY=(
	[v4_truncated]=drop_parse_v4_truncated
	[v4_bad_ihl]=drop_parse_v4_bad_ihl
	[v4_bad_total_length]=drop_parse_v4_bad_total_length
	[v4_bad_options]=drop_parse_v4_bad_options
	[v4_bad_checksum]=drop_parse_v4_bad_checksum
	[v4_fragment]=drop_parse_v4_fragment
	[tcp_bad_data_offset]=drop_parse_tcp_bad_data_offset
	[udp_bad_length]=drop_parse_udp_bad_length
	[v6_truncated]=drop_parse_v6_truncated
	[v6_bad_payload_length]=drop_parse_v6_bad_payload_length
	[v6_routing]=drop_parse_v6_routing_segments_left
	[v6_ext_too_many]=drop_parse_v6_ext_too_many
	[v6_ext_truncated]=drop_parse_v6_ext_truncated
	[v6_fragment]=drop_parse_v6_fragment
	[from_nat_address]=drop_from_nat_address
	[to_gateway]=drop_own_address
	[bad_version]=drop_parse_bad_version
	[empty]=drop_parse_empty
)
ANSWERED=v6_ext_ok
if [ "$STACK" = system ]; then
	CLASS_KEY[downlink_lookalike]=drop_downlink_no_mapping
	CLASS_KEY[v6_ext_ok]=rst_sent
else
	CLASS_KEY[downlink_lookalike]=drop_nat_address
fi

T0=$(date +%s%N)
note "hostile packets: stack=$STACK count=$COUNT token=$TOK"

# --- topology and servers ----------------------------------------------------------------

topology() {
	netns_add "$NS_D" && netns_add "$NS_S" || return 1
	ip link add "$V_DS" netns "$NS_D" type veth peer name "$V_SD" netns "$NS_S" || return 1
	ip -n "$NS_D" link set "$V_DS" up && ip -n "$NS_S" link set "$V_SD" up || return 1
	ip -n "$NS_D" addr add "$D4/24" dev "$V_DS"
	ip -n "$NS_D" addr add "$D6/64" dev "$V_DS" nodad
	ip -n "$NS_S" addr add "$S4/24" dev "$V_SD"
	ip -n "$NS_S" addr add "$S6/64" dev "$V_SD" nodad
	local n
	for n in 1 2 3; do ip -n "$NS_S" addr add "10.204.$n.2/32" dev lo || return 1; done
	ip -n "$NS_S" addr add fd00:204:1::2/128 dev lo nodad || return 1
	ip -n "$NS_D" rule add fwmark 1 lookup 100 pref 100 || return 1
	ip -n "$NS_D" -6 rule add fwmark 1 lookup 100 pref 100 || return 1
	ip -n "$NS_D" route add default via "$S4" dev "$V_DS" table 100 || return 1
	ip -n "$NS_D" -6 route add default via "$S6" dev "$V_DS" table 100 || return 1
	echo "D and S up"
}

routes_tun() {
	ip -n "$NS_D" route replace 10.204.0.0/16 dev "$TUN" src "$GW4" &&
		ip -n "$NS_D" -6 route replace fd00:204::/44 dev "$TUN" src "$GW6"
}

servers() {
	mkdir -p "$TMP/www" && head -c $((16 << 20)) /dev/urandom >"$TMP/www/blob" || return 1
	head -c 65536 /dev/urandom >"$TMP/www/small" || return 1
	SHA=$(sha256sum <"$TMP/www/blob" | cut -d' ' -f1)
	spawn "$NS_S" "$TMP/httpd.log" "$PY" -m http.server --bind :: --directory "$TMP/www" 80
	spawn "$NS_S" "$TMP/microsocks.log" microsocks -i "$S4" -p 1080
	cat >"$TMP/tinyproxy.conf" <<EOF
User nobody
Group nogroup
Port 8888
Listen $S4
Timeout 30
MaxClients 16
LogLevel Warning
Allow 10.204.0.0/16
ConnectPort 80
DisableViaHeader Yes
EOF
	spawn "$NS_S" "$TMP/tinyproxy.log" tinyproxy -d -c "$TMP/tinyproxy.conf"
	local i
	for i in 80 1080 8888; do
		wait_listen "$NS_S" tcp "$i" 100 || { echo "nothing listens on $i in S"; return 1; }
	done
	echo "http, microsocks, tinyproxy; file sha256 ${SHA:0:16}..."
}

write_config() {
	jq -n --arg st "$STACK" --arg tun "$TUN" --arg l "127.0.0.1:$P_STATS" --arg s4 "$S4" \
		--argjson n "$NAT_ADDRS" '
	{stack: $st,
	 tun: {name: $tun, address: "198.18.0.1/15", address6: "fd00:7f::1/64"},
	 outbounds: [
	  {tag: "direct", type: "direct", routing_mark: 1},
	  {tag: "s5", type: "socks5", server: "\($s4):1080", routing_mark: 1},
	  {tag: "hp", type: "http", server: "\($s4):8888", routing_mark: 1}],
	 route: {rules: [
	  {cidr: ["10.204.2.0/24"], outbound: "s5"},
	  {cidr: ["10.204.3.0/24"], outbound: "hp"}], final: "direct"},
	 stats: {listen: $l},
	 log: {level: "info"}}' >"$TMP/cfg.json"
}

# The system stack's kernel listeners on the gateway, per family (their ports make the
# downlink look-alikes); lwIP has none, so any port does.
gw_ports() { inD ss -ltnH "src $1" | awk '{ n = split($4, a, ":"); print a[n] }' | sort -un | paste -sd, -; }
listener_ports() {
	if [ "$STACK" = system ]; then
		LPORTS=$(gw_ports "$GW4") LPORTS6=$(gw_ports "[$GW6]")
		if [ -z "$LPORTS" ] || [ -z "$LPORTS6" ]; then echo "no listener on $GW4 or $GW6"; return 1; fi
	else
		LPORTS=80 LPORTS6=80
	fi
	echo "v4 $LPORTS, v6 $LPORTS6"
}

# --- the run --------------------------------------------------------------------------------

dev_stat() { inD cat "/sys/class/net/$TUN/statistics/$1" 2>/dev/null || echo 0; }

# download NAME URL: curl through the proxy at a limited rate (so the downloads outlast the
# injection), its sha256 into $TMP/NAME.sum.
download() {
	inD curl -sS -g --max-time 20 --limit-rate 8M "$2" 2>"$TMP/$1.err" | sha256sum | cut -d' ' -f1 >"$TMP/$1.sum"
}

DL=(direct4:http://10.204.1.2/blob "direct6:http://[fd00:204:1::2]/blob"
	socks5:http://10.204.2.2/blob http:http://10.204.3.2/blob)

run() {
	local pids=() d hp
	rm -f "$TMP/go" "$TMP/built" "$TMP/sent"
	# The injector builds its packets first and sends them once told to.
	inD "$PY" "$HERE/hostile.py" --dev "$TUN" --client4 "$D4" --client6 "$D6" --gw4 "$GW4" \
		--gw6 "$GW6" --nat-addrs "$NAT_ADDRS" --lports "$LPORTS" --lports6 "$LPORTS6" \
		--count "$COUNT" --answers "$ANSWERED" --ready "$TMP/built" --go "$TMP/go" --sent "$TMP/sent" >"$TMP/hostile.json" 2>"$TMP/hostile.err" &
	hp=$!
	wait_until 300 0.05 test -e "$TMP/built" || { echo "hostile.py built nothing in 15 s: $(tail -n 2 "$TMP/hostile.err")"; return 1; }
	BEFORE=$(stats) || { echo "no /stats before"; return 1; }
	DEV0_DROP=$(dev_stat tx_dropped) DEV0_TX=$(dev_stat tx_packets)
	for d in "${DL[@]}"; do
		download "${d%%:*}" "${d#*:}" &
		pids+=($!)
	done
	sleep 0.5 # the downloads are under way
	touch "$TMP/go"
	# The last packet went in while every download still ran (they take 2 s at the limited
	# rate); hostile.py then waits for the answers.
	# shellcheck disable=SC2317 # called by wait_until
	sent_or_gone() { [ -e "$TMP/sent" ] || ! kill -0 "$hp" 2>/dev/null; }
	wait_until 600 0.05 sent_or_gone
	INJECT_DONE_MS=$(elapsed_ms "$T0")
	OVERLAP=0
	for d in "${pids[@]}"; do kill -0 "$d" 2>/dev/null && OVERLAP=$((OVERLAP + 1)); done
	wait "$hp"
	HOSTILE_RC=$?
	for d in "${pids[@]}"; do wait "$d"; done
	sleep 0.2
	AFTER=$(stats) || { echo "no /stats after"; return 1; }
	DEV1_DROP=$(dev_stat tx_dropped) DEV1_TX=$(dev_stat tx_packets)
	[ "$HOSTILE_RC" -eq 0 ] || { echo "hostile.py exit $HOSTILE_RC: $(tail -n 2 "$TMP/hostile.err")"; return 1; }
	echo "$(jq '[.classes[].sent] | add' "$TMP/hostile.json") packets in $(jq -r .seconds "$TMP/hostile.json") s, $OVERLAP of ${#DL[@]} downloads still running at the end"
}

# All the figures the report reads, in two jq runs: SENT[class], REFUSED[class], EINVAL[class]
# and ANSWERS[class] (the RSTs that came back, -1 for a class not asked about) from hostile.py's
# line, and D[key] (how much a counter grew) and HAS[key] for every numeric key of the stack's
# counters ("sc.NAME") and of the public document (its dotted key).
declare -A SENT REFUSED EINVAL ANSWERS D HAS
load_figures() {
	local c n f e r k d
	while read -r c n f e r; do
		SENT[$c]=$n REFUSED[$c]=$f EINVAL[$c]=$e ANSWERS[$c]=$r
	done < <(jq -r '.classes | to_entries[] | "\(.key) \(.value.sent) \(.value.failed) \(.value.errors["Invalid argument"] // 0) \(.value.answered // -1)"' "$TMP/hostile.json")
	while read -r k d; do
		D[$k]=$d HAS[$k]=1
	done < <(jq -rn --argjson a "$BEFORE" --argjson b "$AFTER" '
		def flat: [paths(numbers) as $p | {key: ($p | map(tostring) | join(".")), value: getpath($p)}];
		($a | flat | from_entries) as $x
		| ($b | flat)[] | .key as $k
		| "\(if ($k | startswith("stack_counters.")) then "sc." + ($k | ltrimstr("stack_counters.")) else $k end) \(.value - ($x[$k] // 0))"')
}

report() {
	local d c k n dn lost dtx rx key f e r others="" worst=0 parse_exp=0 parse_got=0
	load_figures
	if [ "$OVERLAP" -eq "${#DL[@]}" ]; then ok "every download ran while the packets went in"
	else not_ok "every download ran while the packets went in" "$OVERLAP of ${#DL[@]} still running"; fi
	for d in "${DL[@]}"; do
		if [ "$(cat "$TMP/${d%%:*}.sum")" = "$SHA" ]; then
			ok "download ${d%%:*} (${d#*:}): 16 MiB, sha256 equal"
		else
			not_ok "download ${d%%:*} (${d#*:}): 16 MiB, sha256 equal" \
				"got $(cut -c1-16 "$TMP/${d%%:*}.sum"): $(head -c 200 "$TMP/${d%%:*}.err")"
		fi
	done
	# Packets the TUN device dropped before the proxy read them (its queue full): each is one
	# hostile packet fewer that the counters can see.
	lost=$((DEV1_DROP - DEV0_DROP))
	dtx=$((DEV1_TX - DEV0_TX)) rx=${D[tun.rx_packets]:-0}
	note "tun device: tx_packets +$dtx, tx_dropped +$lost; the proxy read +$rx"
	# What the device handed over is what the proxy read (a stray packet of the kernel's own,
	# IPv6 MLD or the like, may fall between the two readings).
	if [ "$rx" -le "$dtx" ] && [ "$rx" -ge $((dtx - 2)) ]; then ok "the proxy read every packet the TUN device sent" "$rx of $dtx"
	else not_ok "the proxy read every packet the TUN device sent" "$rx of $dtx"; fi
	for c in "${CLASSES[@]}"; do
		n=${SENT[$c]:-0} key=${CLASS_KEY[$c]:-}
		if [ "$c" = "$ANSWERED" ]; then
			# Not dropped: each packet answered by a RST of its own (and on the system stack
			# counted as one: nothing else in this run is answered so).
			r=${ANSWERS[$c]:--1}
			if [ "$r" -le "$n" ] && [ "$r" -ge $((n - lost)) ] && [ "$n" -ge "$COUNT" ]; then
				ok "class $c: $n sent, not dropped: each answered with a RST" "$r answers"
			else not_ok "class $c: $n sent, not dropped: each answered with a RST" \
				"$r answers, expected $n$( [ "$lost" -gt 0 ] && echo " (>= $((n - lost)): the device dropped $lost)")"; fi
			[ -n "$key" ] || continue
		fi
		if [ -z "$key" ]; then not_ok "class $c: has an expected counter" "none in CLASS_KEY"; continue; fi
		if [ -z "${HAS[sc.$key]:-}" ]; then not_ok "class $c: counted as $key" "/stats has no stack_counters.$key"; continue; fi
		dn=${D[sc.$key]}
		case $c in
		empty)
			# The kernel refuses to send a zero-length packet on the TUN (AF_PACKET's send
			# returns EINVAL; the TUN driver would drop a zero-length skb on transmit too),
			# so none ever reaches a reader: every send fails, nothing is counted anywhere.
			f=${REFUSED[$c]:-0} e=${EINVAL[$c]:-0}
			if [ "$n" -eq 0 ] && [ "$e" -eq "$f" ] && [ "$f" -ge "$COUNT" ] && [ "$dn" -eq 0 ]; then
				ok "class empty: refused by the kernel ($f sends, EINVAL), never read" "$key +0"
			else not_ok "class empty: refused by the kernel ($f sends, EINVAL), never read" \
				"sent $n, EINVAL $e of $f, $key +$dn"; fi ;;
		*)
			if [ "$dn" -le "$n" ] && [ "$dn" -ge $((n - lost)) ] && [ "$n" -ge "$COUNT" ]; then
				ok "class $c: $n sent, $key +$dn"
			else
				not_ok "class $c: $n sent, $key +$dn" "expected $n$( [ "$lost" -gt 0 ] && echo " (>= $((n - lost)): the device dropped $lost)")"
			fi ;;
		esac
		case $key in drop_parse_*) parse_exp=$((parse_exp + n)) ;; esac
	done
	# Every other drop counter of the stack moved by less than the smallest burst: no class was
	# counted somewhere else as well. The parse drops add up to the malformed classes' packets.
	local mine=" ${CLASS_KEY[*]} "
	for k in "${!D[@]}"; do
		case $k in sc.drop*) ;; *) continue ;; esac
		case $k in sc.drop_parse_*) parse_got=$((parse_got + D[$k])) ;; esac
		case $mine in *" ${k#sc.} "*) continue ;; esac
		[ "${D[$k]}" -gt 0 ] && others+="${others:+, }${k#sc.} +${D[$k]}"
		[ "${D[$k]}" -gt "$worst" ] && worst=${D[$k]}
	done
	if [ "$worst" -lt "$COUNT" ]; then ok "no other drop counter moved by a burst" "${others:-none moved}"
	else not_ok "no other drop counter moved by a burst" "$others"; fi
	if [ "$parse_got" -le "$parse_exp" ] && [ "$parse_got" -ge $((parse_exp - lost)) ]; then
		ok "parse drops add up" "+$parse_got of $parse_exp sent"
	else not_ok "parse drops add up" "+$parse_got, expected $parse_exp"; fi
	# The public figures: fragments, and the own-address family of drops.
	n=$((SENT[v4_fragment] + SENT[v6_fragment])) dn=${D[drops.fragment]:-0}
	if [ "$dn" -le "$n" ] && [ "$dn" -ge $((n - lost)) ]; then ok "drops.fragment grew by the fragments" "+$dn of $n"
	else not_ok "drops.fragment grew by the fragments" "+$dn of $n"; fi
	n=$((SENT[to_gateway] + SENT[from_nat_address])) dn=${D[drops.own_address]:-0}
	[ "$STACK" = lwip ] && n=$((n + SENT[downlink_lookalike]))
	if [ "$dn" -le "$n" ] && [ "$dn" -ge $((n - lost)) ]; then ok "drops.own_address grew by the own-address classes" "+$dn of $n"
	else not_ok "drops.own_address grew by the own-address classes" "+$dn of $n"; fi
	# Nothing hostile reached the UDP path or became a connection.
	if [ "${D[sc.udp]:-x}" = 0 ]; then ok "no hostile datagram reached the UDP path" "stack_counters.udp +0"
	else not_ok "no hostile datagram reached the UDP path" "stack_counters.udp +${D[sc.udp]:-missing}"; fi
	if [ "${D[sessions.total]:-x}" = "${#DL[@]}" ]; then ok "no hostile packet became a session" "sessions.total +${#DL[@]}, the downloads"
	else not_ok "no hostile packet became a session" "sessions.total +${D[sessions.total]:-missing}, ${#DL[@]} downloads"; fi
}

alive() {
	local s sum
	s=$(stats) || { echo "no /stats"; return 1; }
	[ "$(stat_key stack "$s")" = "$STACK" ] || { echo "stack $(stat_key stack "$s")"; return 1; }
	sum=$(inD curl -sS --max-time 5 http://10.204.1.2/small | sha256sum | cut -d' ' -f1)
	[ "$sum" = "$(sha256sum <"$TMP/www/small" | cut -d' ' -f1)" ] ||
		{ echo "new connection: wrong or no bytes"; return 1; }
	echo "/stats answers, a new connection carries 64 KiB intact"
}

check "setup: namespaces, veth, routes" topology || { echo "$PASSED passed, $FAILED failed"; exit 1; }
check "setup: servers" servers || { tail -n 5 "$TMP"/*.log | sed 's/^/# /'; echo "$PASSED passed, $FAILED failed"; exit 1; }
vnote "servers up at $(elapsed_ms "$T0") ms"
write_config
check "start (stack $STACK)" ts_start || { echo "$PASSED passed, $FAILED failed"; exit 1; }
check "the gateway's listener ports" listener_ports || { echo "$PASSED passed, $FAILED failed"; exit 1; }
vnote "proxy up at $(elapsed_ms "$T0") ms"
mapfile -t CLASSES < <("$PY" "$HERE/hostile.py" --list)
check "downloads with hostile packets injected meanwhile" run || { echo "$PASSED passed, $FAILED failed"; exit 1; }
vnote "injection done at $INJECT_DONE_MS ms, downloads at $(elapsed_ms "$T0") ms"
report
check "the proxy is alive: /stats and a new connection" alive
if [ "$VERBOSE" -eq 1 ]; then
	for k in "${!D[@]}"; do
		case $k in sc.* | drops.* | driver.*) [ "${D[$k]}" != 0 ] && echo "# $k +${D[$k]}" ;; esac
	done | sort
fi
check "SIGTERM: exit 0" ts_sigterm
if grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$TMP/twinstack.log"; then
	not_ok "no sanitizer report in the proxy's log" "$(grep -m1 -E 'Sanitizer|runtime error' "$TMP/twinstack.log")"
fi
note "elapsed $(elapsed_ms "$T0") ms"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
