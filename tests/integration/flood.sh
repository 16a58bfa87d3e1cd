#!/usr/bin/env bash
# flood.sh — floods through the TUN while an application keeps connecting.
#
# --mode syn (default): spoofed SYNs
# (sources from 10.250.0.0/20, a range this test owns and blackholes, so the proxy's SYN-ACKs
# go nowhere) are written into the TUN with AF_PACKET (tests/integration/synflood.py) at
# --rate per second for --seconds, while curl fetches a page from a server behind the uplink
# every 100 ms. Passes when every curl succeeds, the NAT's half-open entries stay under
# nat_entries / 2 at every sample, the flood is counted (the stack's drop counters, or
# nat.half_open bounded) and the proxy is alive afterwards.
#
# --mode dns: --count DNS queries over --seconds (tests/integration/dnsflood.py), each from its
# own socket on a distinct source port, as stub resolvers send them, to 10.202.9.2:53 — an
# address with no resolver, routed into the TUN and answered through the proxy's DNS hijack by
# dnsmasq on the uplink. Passes when the answers are right, the proxy's UDP sessions and fds
# stay bounded at every sample (a session per query kept for the 60 s idle timeout would reach
# --count), every query's session is closed by its answer (udp.dns_done), and the fetches
# keep succeeding.
#
#   ns D: proxy (auto_route) + curl + the injector         ns S: server on lo 10.202.9.2:80
#   vDS 10.202.0.1/24 ------------------------------------ vSD 10.202.0.2/24
#   blackhole 10.250.0.0/20 (the spoofed sources)          route 198.18.0.0/15 via D
#                                                          dnsmasq 10.202.0.2:53 (--mode dns)
#
# --resolver (with --mode dns): the queries are answered by the proxy's own resolver
# (dns.servers, with TCP/53 hijack on) instead of being forwarded: no UDP session at all, and
# the resolver's waiting queries (dns.pending) stay bounded.
#
# usage: flood.sh [--stack system|lwip] [--bin PATH] [--mode syn|dns] [--resolver] [--rate N]
#                 [--count N] [--seconds S] [--keep] [-v]
# Output: 'ok - NAME' / 'not ok - NAME: REASON' lines, then 'N passed, N failed'.
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun), 1 otherwise.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODE=syn
RATE=5000
COUNT=5000
SECONDS_FLOOD=4
RESOLVER=0

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"
suite_args flood --mode MODE --resolver RESOLVER=1 --rate RATE --count COUNT --seconds SECONDS_FLOOD -- "$@"
case $MODE in syn | dns) ;; *) echo "flood.sh: --mode is syn or dns" >&2; exit 2 ;; esac

need=(ip curl jq)
[ "$MODE" = dns ] && need+=(dnsmasq)
suite_begin flood "${need[@]}"
NS_D=tsfD-$TOK NS_S=tsfS-$TOK V_DS=tsfds$TOK V_SD=tsfsd$TOK TUN=tsft$TOK
SRV=10.202.9.2 P_STATS=9191
inD() { ip netns exec "$NS_D" "$@"; }
stats() { inD curl -s --max-time 2 "http://127.0.0.1:$P_STATS/stats"; }

T0=$(date +%s)
if [ "$MODE" = syn ]; then note "SYN flood: stack=$STACK rate=$RATE/s for ${SECONDS_FLOOD}s token=$TOK"
else note "DNS flood: stack=$STACK $COUNT queries in ${SECONDS_FLOOD}s token=$TOK"; fi
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

if [ "$MODE" = dns ]; then
	spawn "$NS_S" "$TMP/dnsmasq.log" dnsmasq --no-daemon --conf-file=/dev/null --no-resolv \
		--no-hosts --address=/test.twinstack/10.9.8.7 --listen-address=10.202.0.2 \
		--bind-interfaces -p 53 --pid-file="$TMP/dnsmasq.pid" --user=root --dns-forward-max=1000
	wait_listen "$NS_S" udp 53 100 || { not_ok setup "no dnsmasq"; exit 1; }
fi
jq -n --arg s "$STACK" --arg t "$TUN" --arg l "127.0.0.1:$P_STATS" --arg m "$MODE" --arg r "$RESOLVER" \
	'{stack: $s, tun: {name: $t, auto_route: true}, stats: {listen: $l},
	  log: {level: "warn"}, budgets: {nat_entries: 8192}}
	 + (if $m != "dns" then {}
	    elif $r == "1" then {dns: {hijack: true, servers: [{tag: "s", address: "10.202.0.2"}]}}
	    else {dns: {hijack: true, upstream: "10.202.0.2:53"}} end)' \
	>"$TMP/cfg.json"
spawn "$NS_D" "$TMP/twinstack.log" "$BIN" run --config "$TMP/cfg.json"
TS_PID=$SPAWNED
wait_until 100 0.1 stats >/dev/null || { not_ok start "no stats: $(tail -n 3 "$TMP/twinstack.log")"; exit 1; }
# The configured NAT table (budgets.nat_entries above): small enough that the flood, unchecked,
# would fill more than half of it with half-open entries.
entries=8192
cap=$((entries / 2))

# syn_flood: the spoofed SYNs, sampling the NAT's half-open entries every 200 ms.
syn_flood() {
	local before after sent oks fails h max_half d_drops d_drops0 d_half
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
	# Refused (drops.half_open: the NAT's share, or lwIP's full backlog) or evicted (lwIP's
	# stale half-open handshakes making room).
	d_half=$(jq -n --argjson a "$before" --argjson b "$after" '
		def n(d): (d.drops.half_open // 0) + (d.stack_counters.syn_rcvd_evicted // 0);
		n($b) - n($a)')
	note "stack drop counters: +$((d_drops - d_drops0)); refused or evicted half-open +$d_half"
	# The flood outran the half-open limits: the checks above ran against a flood that was
	# refused, not one the limits never met.
	check "the flood met the half-open limits (drops.half_open or evictions moved)" \
		test "$d_half" -gt 0
	if [ "$STACK" = system ]; then
		check "the flood filled the NAT's half-open share (half-open seen)" test "$max_half" -gt 0
	fi
}

# dns_flood: the queries, sampling the proxy's UDP sessions and fds every 200 ms.
dns_flood() {
	local before after sent serr answered correct oks fails s u f p max_u=0 max_f=0 max_p=0 fd0 done0
	local done1 unique=()
	before=$(stats)
	fd0=$(jq '.fds // 0' <<<"$before")
	# The resolver would answer one name from its cache: every question is new instead.
	[ "$RESOLVER" = 1 ] && unique=(--unique)
	inD "$PY" "$HERE/dnsflood.py" --server "$SRV" --expect 10.9.8.7 --count "$COUNT" \
		--seconds "$SECONDS_FLOOD" "${unique[@]}" >"$TMP/flood.json" 2>"$TMP/flood.err" &
	FLOOD_PID=$!
	while kill -0 "$FLOOD_PID" 2>/dev/null; do
		s=$(stats)
		u=$(jq '.udp.sessions // 0' <<<"$s" 2>/dev/null)
		f=$(jq '.fds // 0' <<<"$s" 2>/dev/null)
		p=$(jq '.dns.pending // 0' <<<"$s" 2>/dev/null)
		[ "${u:-0}" -gt "$max_u" ] && max_u=$u
		[ "${f:-0}" -gt "$max_f" ] && max_f=$f
		[ "${p:-0}" -gt "$max_p" ] && max_p=$p
		sleep 0.2
	done
	wait "$FLOOD_PID"
	wait "$CURL_PID"
	after=$(stats)
	sent=$(jq '.sent // 0' "$TMP/flood.json" 2>/dev/null || echo 0)
	answered=$(jq '.answered // 0' "$TMP/flood.json" 2>/dev/null || echo 0)
	correct=$(jq '.correct // 0' "$TMP/flood.json" 2>/dev/null || echo 0)
	done0=$(jq '.udp.dns_done // 0' <<<"$before")
	done1=$(jq '.udp.dns_done // 0' <<<"$after")
	oks=$(grep -c '^ok' "$TMP/curl.out")
	fails=$(grep -c '^fail' "$TMP/curl.out")
	note "queries: $(cat "$TMP/flood.json" 2>/dev/null); curl $oks ok, $fails failed"
	note "udp sessions max $max_u; fds $fd0 before, max $max_f; udp.dns_done +$((done1 - done0)); udp.sessions after $(jq '.udp.sessions' <<<"$after")"
	serr=$(jq '.send_errors // -1' "$TMP/flood.json" 2>/dev/null || echo -1)
	check "every query sent (no send error)" test "$sent" -eq "$COUNT" -a "$serr" -eq 0
	# UDP may lose a datagram; the proxy must not lose more than one in a thousand.
	check "the queries are answered through the hijack (>= 99.9%)" \
		test $((answered * 1000)) -ge $((COUNT * 999))
	check "every answer is dnsmasq's record" test "$correct" -eq "$answered"
	if [ "$fails" -eq 0 ] && [ "$oks" -gt 5 ]; then ok "every fetch during the queries succeeded" "$oks fetches"
	else not_ok "every fetch during the queries succeeded" "$fails of $((oks + fails)) failed"; fi
	# Bounded: a session per query kept for the idle timeout would reach COUNT; answered ones
	# close at once, so the live ones are the queries in flight.
	if [ "$max_u" -le $((COUNT / 20)) ]; then ok "UDP sessions stay bounded" "max $max_u for $COUNT queries"
	else not_ok "UDP sessions stay bounded" "max $max_u > $((COUNT / 20))"; fi
	if [ "$max_f" -le $((fd0 + COUNT / 20)) ]; then ok "the proxy's fds stay bounded" "max $max_f, $fd0 before"
	else not_ok "the proxy's fds stay bounded" "max $max_f > $fd0 + $((COUNT / 20))"; fi
	if [ "$RESOLVER" = 1 ]; then
		note "resolver: dns.pending max $max_p; $(jq -c '.dns | {answered, drops, upstream, cache: {entries: .cache.entries, evictions: .cache.evictions}}' <<<"$after")"
		check "no UDP session for a query the resolver answers" test "$max_u" -eq 0
		check "the resolver answered each one from upstream (dns.answered.upstream)" \
			test $(($(jq '.dns.answered.upstream' <<<"$after") - $(jq '.dns.answered.upstream' <<<"$before"))) -ge "$answered"
		check "its waiting queries stay bounded (dns.pending max $max_p)" test "$max_p" -le 1024
	else
		check "each answered query closed its session (udp.dns_done)" \
			test $((done1 - done0)) -ge "$answered"
	fi
}

# The application: a fetch every 100 ms for the whole flood and a second after it.
(
	end=$(($(date +%s) + SECONDS_FLOOD + 2))
	while [ "$(date +%s)" -lt "$end" ]; do
		if inD curl -s -o /dev/null --max-time 3 "http://$SRV/index.html"; then echo ok; else echo fail; fi
		sleep 0.1
	done
) >"$TMP/curl.out" 2>&1 &
CURL_PID=$!
PIDS+=("$CURL_PID")
sleep 0.5
if [ "$MODE" = syn ]; then syn_flood; else dns_flood; fi
if kill -0 "$TS_PID" 2>/dev/null; then ok "the proxy is alive after the flood"
else not_ok "the proxy is alive after the flood" "exited"; fi
[ "$VERBOSE" -eq 1 ] && stats | jq -c ".stack_counters, .drops, .sessions"
stop_pid "$TS_PID" 3
note "elapsed $(($(date +%s) - T0)) s"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
