#!/usr/bin/env bash
# sniff.sh — route.sniff end to end: the name a connection announces (TLS SNI, HTTP Host)
# chooses its route, without fake-IP and with addresses the apps got elsewhere (curl --resolve).
#
# Cases, each checked by what arrives (the body, compared) and by who was asked for what:
#  1. HTTPS to www.via.sniff.test (SNI) goes to the SOCKS5 outbound, and dante is asked for the
#     name (override_destination): it resolves it through dnsmasq, from its own address.
#  2. HTTP with Host h.via.sniff.test: the same through the Host header.
#  3. HTTPS with SNI other.sniff.test: no rule names it, so the direct outbound, which resolves
#     the name through the proxy's own resolver (dnsmasq asked from the proxy's address).
#  4. A ClientHello sent in 3 TCP segments 40 ms apart: found, routed, the page intact.
#  7. QUIC (ngtcp2's client and server, HTTP/3) to quic.via.sniff.test: the SNI of the client's
#     Initial routes the flow to dante's UDP ASSOCIATE, asked for the name; the file intact.
#  5. A server that speaks first: the client hears it after at most the sniff timeout (counted
#     as a timeout).
#  6. Without override_destination: routed by the SNI, but dante is asked for the address; a
#     flow to a port no name rule covers is not looked at (sniff.started does not move).
#
#   ns D: proxy (auto_route) + clients            ns S: dnsmasq 10.202.0.2:53, danted :1080
#   vDS 10.202.0.1/24 ---------------------------- vSD 10.202.0.2/24
#                                                  lo 10.202.9.80: https :443, http :80,
#                                                  banners :2525 and :2526
#
# usage: sniff.sh [--stack system|lwip] [--bin PATH] [--keep] [-v]
# Output: 'ok - NAME' / 'not ok - NAME: REASON' lines, then 'N passed, N failed'.
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun), 1 otherwise.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"
suite_args sniff -- "$@"
suite_begin sniff ip curl jq dnsmasq danted openssl gtlsclient gtlsserver
NS_D=tssD-$TOK NS_S=tssS-$TOK V_DS=tssds$TOK V_SD=tsssd$TOK TUN=tsst$TOK
P_STATS=9193 WEB=10.202.9.80 SNIFF_MS=300
inD() { ip netns exec "$NS_D" "$@"; }
# asked NAME FROM: how many A queries for NAME dnsmasq got from address FROM.
asked() { grep -c "query\[A\] $1 from $2\$" "$TMP/dnsmasq.log"; }
https() { # NAME -> curl's status; the body in $TMP/body
	rm -f "$TMP/body"
	inD curl -sk --max-time 5 -o "$TMP/body" --resolve "$1:443:$WEB" "https://$1/index.html"
}
http() { # NAME
	rm -f "$TMP/body"
	inD curl -s --max-time 5 -o "$TMP/body" --resolve "$1:80:$WEB" "http://$1/index.html"
}
same_body() { cmp -s "$TMP/body" "$TMP/index.html" && echo "$(wc -c <"$TMP/body") bytes"; }
# expect KEY N BEFORE AFTER: KEY grew by exactly N.
expect() { local d; d=$(delta "$1" "$3" "$4"); echo "$1 +$d"; [ "$d" = "$2" ]; }

T0=$(date +%s)
note "sniff: stack=$STACK token=$TOK"
netns_add "$NS_D" && netns_add "$NS_S" || { not_ok setup "namespaces"; exit 1; }
ip link add "$V_DS" netns "$NS_D" type veth peer name "$V_SD" netns "$NS_S"
ip -n "$NS_D" link set "$V_DS" up
ip -n "$NS_S" link set "$V_SD" up
ip -n "$NS_D" addr add 10.202.0.1/24 dev "$V_DS"
ip -n "$NS_S" addr add 10.202.0.2/24 dev "$V_SD"
ip -n "$NS_D" route add default via 10.202.0.2
ip -n "$NS_S" route add 198.18.0.0/15 via 10.202.0.1
ip -n "$NS_S" addr add "$WEB/32" dev lo
spawn "$NS_S" "$TMP/dnsmasq.log" dnsmasq --keep-in-foreground --log-facility=- \
	--conf-file=/dev/null --no-resolv --no-hosts --log-queries --local-ttl=300 \
	--address=/sniff.test/"$WEB" --listen-address=10.202.0.2 --bind-interfaces -p 53 \
	--pid-file="$TMP/dnsmasq.pid" --user=root
cat >"$TMP/danted.conf" <<EOF2
logoutput: stderr
internal: 10.202.0.2 port = 1080
external: 10.202.0.2
socksmethod: none
clientmethod: none
user.privileged: root
user.unprivileged: nobody
client pass {
	from: 0/0 to: 0/0
}
socks pass {
	from: 0/0 to: 0/0
	command: connect udpassociate udpreply
	log: connect
}
EOF2
# dante resolves the names it is asked for through dnsmasq: a resolv.conf of ours, bind-mounted
# in a mount namespace of its own (the host's file is untouched).
echo "nameserver 10.202.0.2" >"$TMP/resolv.conf"
spawn "$NS_S" "$TMP/danted.log" unshare -m --propagation private sh -c \
	'mount --bind "$1" /etc/resolv.conf && exec "$2" -f "$3"' sh "$TMP/resolv.conf" \
	"$(command -v danted || echo /usr/sbin/danted)" "$TMP/danted.conf"
head -c 300000 /dev/urandom | base64 >"$TMP/index.html"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=sniff.test" \
	-keyout "$TMP/key.pem" -out "$TMP/cert.pem" >/dev/null 2>&1 ||
	{ not_ok setup "openssl req"; exit 1; }
spawn "$NS_S" "$TMP/https.log" "$PY" "$HERE/sniffsrv.py" tls "$WEB" 443 "$TMP/cert.pem" "$TMP/key.pem" "$TMP"
spawn "$NS_S" "$TMP/httpd.log" "$PY" -m http.server --bind "$WEB" --directory "$TMP" 80
spawn "$NS_S" "$TMP/banner1.log" "$PY" "$HERE/sniffsrv.py" banner "$WEB" 2525
spawn "$NS_S" "$TMP/banner2.log" "$PY" "$HERE/sniffsrv.py" banner "$WEB" 2526
spawn "$NS_S" "$TMP/quic.log" "$(command -v gtlsserver || echo /usr/sbin/gtlsserver)" -q \
	-d "$TMP" "$WEB" 443 "$TMP/key.pem" "$TMP/cert.pem"
for p in 53 1080 443 80 2525 2526; do
	wait_listen "$NS_S" tcp "$p" 100 || { not_ok setup "nothing listens on :$p"; exit 1; }
done
wait_listen "$NS_S" udp 443 100 || { not_ok setup "no QUIC server on udp :443"; exit 1; }

conf() { # FILE OVERRIDE(true|false)
	jq -n --arg s "$STACK" --arg t "$TUN" --arg l "127.0.0.1:$P_STATS" \
		--argjson o "$2" --argjson ms "$SNIFF_MS" \
		'{stack: $s, tun: {name: $t, auto_route: true}, stats: {listen: $l},
		  log: {level: "warn"},
		  outbounds: [{tag: "direct", type: "direct"},
			      {tag: "proxy", type: "socks5", server: "10.202.0.2:1080"}],
		  route: {sniff: {timeout_ms: $ms, override_destination: $o},
			  rules: [{domain_suffix: ["via.sniff.test"], port: [80, 443, 2525],
				   outbound: "proxy"}],
			  final: "direct"},
		  dns: {hijack: true,
			servers: [{tag: "plain", address: "udp://10.202.0.2", detour: "direct"}]}}' >"$1"
}
start() { # CONFIG LOG
	spawn "$NS_D" "$2" "$BIN" run --config "$1"
	TS_PID=$SPAWNED
	wait_until 100 0.1 stats >/dev/null || { not_ok "start" "$(tail -n 3 "$2")"; exit 1; }
}

conf "$TMP/cfg.json" true
start "$TMP/cfg.json" "$TMP/twinstack.log"
ok "start (stack $STACK, override_destination)" "pid $TS_PID"
# QUIC sniffing decrypts Initials with libcrypto, which the program opens only when a config
# needs it: here, at the start.
check "start: QUIC sniffing on, OpenSSL opened at the start" grep -q 'libcrypto\.so' "/proc/$TS_PID/maps"

s0=$(stats)
https www.via.sniff.test
check "1. https by SNI through dante arrives intact" same_body
check "1. dante was asked for www.via.sniff.test" test "$(asked www.via.sniff.test 10.202.0.2)" -ge 1
s1=$(stats)
check "1. sniff.tls +1" expect sniff.tls 1 "$s0" "$s1"
check "1. sniff.route_changed +1" expect sniff.route_changed 1 "$s0" "$s1"
check "1. sniff.overridden +1" expect sniff.overridden 1 "$s0" "$s1"

http h.via.sniff.test
check "2. http by Host through dante arrives intact" same_body
check "2. dante was asked for h.via.sniff.test" test "$(asked h.via.sniff.test 10.202.0.2)" -ge 1
s2=$(stats)
check "2. sniff.http +1" expect sniff.http 1 "$s1" "$s2"

https other.sniff.test
check "3. https with a name no rule names arrives intact (direct)" same_body
check "3. the name was resolved by the proxy's resolver, not dante" \
	test "$(asked other.sniff.test 10.202.0.1)" -ge 1 -a "$(asked other.sniff.test 10.202.0.2)" -eq 0
s3=$(stats)
check "3. sniff.route_changed did not move" expect sniff.route_changed 0 "$s2" "$s3"

rm -f "$TMP/body"
inD "$PY" "$HERE/sniffsrv.py" split-hello "$WEB" 443 split.via.sniff.test /index.html 3 40 \
	>"$TMP/body" 2>"$TMP/split.err"
check "4. a ClientHello in 3 segments: the page arrives intact" same_body
check "4. dante was asked for split.via.sniff.test" test "$(asked split.via.sniff.test 10.202.0.2)" -ge 1
s4=$(stats)
check "4. sniff.tls +1, no timeout" eval 'expect sniff.tls 1 "$s3" "$s4" && expect sniff.timeouts 0 "$s3" "$s4"'

ms=$(inD "$PY" "$HERE/sniffsrv.py" first-bytes "$WEB" 2525 2>&1)
s5=$(stats)
case $ms in
'' | *[!0-9]*) not_ok "5. server speaks first on a sniffed port" "$ms" ;;
*) if [ "$ms" -le $((SNIFF_MS + 1500)) ]; then ok "5. server speaks first on a sniffed port: heard within the timeout" "$ms ms, timeout $SNIFF_MS ms"
   else not_ok "5. server speaks first on a sniffed port: heard within the timeout" "$ms ms"; fi ;;
esac
check "5. counted as a sniff timeout" expect sniff.timeouts 1 "$s4" "$s5"
# 7. QUIC: the Initial's SNI sends the flow through dante's UDP relay, to the name.
s6=$(stats)
mkdir -p "$TMP/dl"
# ngtcp2's client sends the host it was given as the SNI ("localhost" for an address): it gets
# the name, found through a hosts file of ours bind-mounted in a mount namespace of its own.
echo "$WEB quic.via.sniff.test" >"$TMP/hosts"
inD unshare -m --propagation private sh -c 'mount --bind "$1" /etc/hosts && shift && exec "$@"' \
	sh "$TMP/hosts" timeout 20 gtlsclient -q --exit-on-all-streams-close --timeout=10s \
	--download "$TMP/dl" quic.via.sniff.test 443 https://quic.via.sniff.test/index.html \
	>"$TMP/quic-client.log" 2>&1
check "7. QUIC by its Initial's SNI through dante arrives intact" cmp "$TMP/dl/index.html" "$TMP/index.html"
s7=$(stats)
check "7. sniff.quic +1" expect sniff.quic 1 "$s6" "$s7"
check "7. through a SOCKS5 association" test "$(delta udp.assocs_total "$s6" "$s7")" -ge 1
check "7. dante was asked for quic.via.sniff.test" test "$(asked quic.via.sniff.test 10.202.0.2)" -ge 1
check "5. no session refused, none left waiting" \
	test "$(stat_key sessions.refused "$s5")" = 0 -a "$(stat_key sniff.active "$s5")" = 0
stop_pid "$TS_PID" 3

conf "$TMP/cfg2.json" false
start "$TMP/cfg2.json" "$TMP/twinstack2.log"
t0=$(stats)
https addr.via.sniff.test
check "6. without override_destination: through dante, intact" same_body
t1=$(stats)
check "6. routed by the name (sniff.route_changed +1)" expect sniff.route_changed 1 "$t0" "$t1"
check "6. dante was asked for the address, not the name" \
	test "$(asked addr.via.sniff.test 10.202.0.2)" -eq 0 -a "$(grep -c "$WEB\.443" "$TMP/danted.log")" -ge 1
# Without override_destination only flows whose route a name could change are looked at.
ms=$(inD "$PY" "$HERE/sniffsrv.py" first-bytes "$WEB" 2526 2>&1)
t2=$(stats)
check "6. on a port no name rule covers nothing is looked at ($ms ms)" expect sniff.started 0 "$t1" "$t2"
stop_pid "$TS_PID" 3
note "elapsed $(($(date +%s) - T0)) s"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
