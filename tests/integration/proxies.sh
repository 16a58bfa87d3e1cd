#!/usr/bin/env bash
# proxies.sh — twinstack's proxy outbounds against real proxy servers: HTTP CONNECT through
# tinyproxy (with and without Basic authentication; 407 and 401 refusals), SOCKS5 UDP
# ASSOCIATE through dante-server (with and without username authentication) and through a
# scripted misbehaving SOCKS5 server (tests/integration/bad_socks5.py).
#
#   ns D: clients + twinstack run                          ns S: proxy servers + destinations
#   curl, dig, udpcheck.py                                 on the veth address 10.203.0.2:
#     | main table: 10.203.0.0/16, fd00:203::/44 -> tun     tinyproxy :8888, BasicAuth :8889
#     v (the veth's own /24 and /64 stay on the veth)        danted :1080, username auth :1081
#   tun 198.18.0.1/15, fd00:7f::1/64 (twinstack's)           bad_socks5.py :1100.. (a mode each)
#     |  ^                                                 10.203.0.3: the "foreign" source
#     v  |                                                 on lo (destinations):
#   twinstack: outbounds routing_mark 1,                     http.server :80 (20 MiB), any addr
#   fwmark 1 -> table 100: default via S                     10.203.4.2, fd00:203:4::2: udp
#                                                              echo :7, dnsmasq :53
#                                                            10.203.{1,5,6,8}.2, fd00:203:5::2:
#                                                              udp echo :7
#   vpd 10.203.0.1/24, fd00:203::1/64 --------------------- vps 10.203.0.2/24, .3, fd00:203::2/64
#
# Which destination goes through which outbound (twinstack's route.rules, by destination):
#   10.203.1.0/24 hp   tinyproxy :8888          10.203.4.0/24, fd00:203:4::/64 s5   danted :1080
#   10.203.2.0/24 hpa  tinyproxy :8889 (auth)   10.203.5.0/24, fd00:203:5::/64 s5a  danted :1081
#   10.203.3.0/24 hpx  :8889, wrong password    10.203.6.0/24 s5x  :1081, wrong password
#   10.203.7.0/24 hpn  :8889, no credentials    10.203.8.0/24 s5nu :1080 with "udp": false
#   10.203.(16+i).0/24 bad_MODE  bad_socks5.py, mode i of BAD_MODES, on :(1100+i)
# The servers are on S's loopback, so only twinstack's marked sockets reach them (over the
# veth); the proxy servers are on the veth address, reached by those sockets directly.
#
# Before twinstack starts, the harness proves its servers: SOCKS5 UDP ASSOCIATE spoken to
# dante directly (udpcheck.py s5), with and without authentication, tinyproxy's answers, and
# the bad server's well-behaved modes.
#
# usage: proxies.sh [--stack system|lwip] [--bin PATH] [--keep] [-v]
# Output: 'ok - NAME (detail)' / 'not ok - NAME: REASON' lines, '#' notes, 'N passed, N failed'.
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun), 1 otherwise.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"
suite_args proxies -- "$@"
DANTED=$(command -v danted || echo /usr/sbin/danted)
suite_begin proxies ip ss curl jq dig dnsmasq tinyproxy unshare openssl sha256sum "$DANTED"
chmod 755 "$TMP" # tinyproxy runs as nobody and reads its config from here
NS_D=tspD-$TOK NS_S=tspS-$TOK V_DS=tspd$TOK V_SD=tsps$TOK TUN=tspt$TOK
D4=10.203.0.1 S4=10.203.0.2 F4=10.203.0.3 D6=fd00:203::1 S6=fd00:203::2
GW4=198.18.0.1 GW6=fd00:7f::1
P_STATS=9193 TS_USER=tsp$TOK TS_PASS=pw$TOK
BAD_MODES=(zero loopback family otherport truncated rsv frag atyp9 v6src name emptyname foreign)
inD() { ip netns exec "$NS_D" "$@"; }
ucheck() { inD "$PY" "$HERE/udpcheck.py" "$@"; }
stats() { inD curl -s --max-time 2 "http://127.0.0.1:$P_STATS/stats"; }
# sget JSON KEY: a dotted /stats key's value, "missing" when the document has no such key.
sget() { jq -r --arg k "$2" 'getpath($k | split(".")) // "missing"' <<<"$1"; }
# delta BEFORE AFTER KEY: how much a counter moved (missing keys read as 0).
delta() {
	local a b
	a=$(sget "$1" "$3") b=$(sget "$2" "$3")
	[ "$a" = missing ] && a=0
	[ "$b" = missing ] && b=0
	echo $((b - a))
}

T0=$(date +%s%N)
note "proxy outbounds: stack=$STACK token=$TOK"

# --- topology and servers ----------------------------------------------------------------

topology() {
	netns_add "$NS_D" && netns_add "$NS_S" || return 1
	ip link add "$V_DS" netns "$NS_D" type veth peer name "$V_SD" netns "$NS_S" || return 1
	ip -n "$NS_D" link set "$V_DS" up && ip -n "$NS_S" link set "$V_SD" up || return 1
	ip -n "$NS_D" addr add "$D4/24" dev "$V_DS"
	ip -n "$NS_D" addr add "$D6/64" dev "$V_DS" nodad
	ip -n "$NS_S" addr add "$S4/24" dev "$V_SD"
	ip -n "$NS_S" addr add "$F4/24" dev "$V_SD"
	ip -n "$NS_S" addr add "$S6/64" dev "$V_SD" nodad
	local n
	for n in 1 2 3 4 5 6 8; do ip -n "$NS_S" addr add "10.203.$n.2/32" dev lo || return 1; done
	ip -n "$NS_S" addr add fd00:203:4::2/128 dev lo nodad || return 1
	ip -n "$NS_S" addr add fd00:203:5::2/128 dev lo nodad || return 1
	# twinstack's marked sockets leave by the veth; everything else of 10.203/16 enters the TUN
	# once it exists (routes_tun).
	ip -n "$NS_D" rule add fwmark 1 lookup 100 pref 100 || return 1
	ip -n "$NS_D" -6 rule add fwmark 1 lookup 100 pref 100 || return 1
	ip -n "$NS_D" route add default via "$S4" dev "$V_DS" table 100 || return 1
	ip -n "$NS_D" -6 route add default via "$S6" dev "$V_DS" table 100 || return 1
}

routes_tun() {
	ip -n "$NS_D" route replace 10.203.0.0/16 dev "$TUN" src "$GW4" &&
		ip -n "$NS_D" -6 route replace fd00:203::/44 dev "$TUN" src "$GW6"
}

write_dante_conf() { # FILE PORT METHOD
	cat >"$1" <<EOF
logoutput: stderr
internal: $S4 port = $2
external: $V_SD
socksmethod: $3
clientmethod: none
user.privileged: root
user.unprivileged: nobody
client pass {
	from: 0/0 to: 0/0
}
socks pass {
	from: 0/0 to: 0/0
	command: udpassociate udpreply connect
	log: error
}
EOF
}

write_tinyproxy_conf() { # FILE PORT [BasicAuth line]
	cat >"$1" <<EOF
User nobody
Group nogroup
Port $2
Listen $S4
Timeout 30
MaxClients 64
LogLevel Warning
Allow 10.203.0.0/16
ConnectPort 80
DisableViaHeader Yes
${3:-}
EOF
}

# The test user of the authenticating dante: it checks usernames against the passwd and shadow
# databases, so it runs in a private mount namespace where /etc/passwd and /etc/shadow are
# replaced by bind mounts of files of our own (invisible to the host): root and nobody (dante's
# privileged and unprivileged users) and the test user, whose password only this run knows.
# Nothing is copied from the host's files.
write_user_db() {
	local hash nobody
	hash=$(openssl passwd -6 "$TS_PASS") || return 1
	nobody=$(getent passwd nobody) || return 1
	{
		echo "root:x:0:0:root:/root:/bin/sh"
		echo "$nobody"
		echo "$TS_USER:x:64999:64999:twinstack test:/nonexistent:/usr/sbin/nologin"
	} >"$TMP/passwd"
	{
		echo "root:*:19000:0:99999:7:::"
		echo "nobody:*:19000:0:99999:7:::"
		echo "$TS_USER:$hash:19000:0:99999:7:::"
	} >"$TMP/shadow"
	chmod 644 "$TMP/passwd" && chmod 600 "$TMP/shadow"
}

servers() {
	local i
	head -c $((20 << 20)) /dev/urandom >"$TMP/blob" || return 1
	SHA=$(sha256sum <"$TMP/blob" | cut -d' ' -f1)
	mkdir -p "$TMP/www" && mv "$TMP/blob" "$TMP/www/blob"
	spawn "$NS_S" "$TMP/httpd.log" "$PY" -m http.server --bind :: --directory "$TMP/www" 80
	spawn "$NS_S" "$TMP/echo.log" "$PY" "$HERE/udpcheck.py" echo --bind 10.203.4.2:7 \
		--bind '[fd00:203:4::2]:7' --bind 10.203.5.2:7 --bind '[fd00:203:5::2]:7' --bind 10.203.6.2:7 \
		--bind 10.203.1.2:7 --bind 10.203.8.2:7
	spawn "$NS_S" "$TMP/dnsmasq.log" dnsmasq --no-daemon --conf-file=/dev/null --no-resolv \
		--no-hosts --address=/test.twinstack/10.9.8.7 --listen-address=10.203.4.2 \
		--listen-address=fd00:203:4::2 --bind-interfaces -p 53 --pid-file="$TMP/dnsmasq.pid" \
		--user=root
	write_tinyproxy_conf "$TMP/tinyproxy.conf" 8888
	write_tinyproxy_conf "$TMP/tinyproxy-auth.conf" 8889 "BasicAuth $TS_USER $TS_PASS"
	spawn "$NS_S" "$TMP/tinyproxy.log" tinyproxy -d -c "$TMP/tinyproxy.conf"
	spawn "$NS_S" "$TMP/tinyproxy-auth.log" tinyproxy -d -c "$TMP/tinyproxy-auth.conf"
	write_dante_conf "$TMP/danted.conf" 1080 none
	write_dante_conf "$TMP/danted-auth.conf" 1081 username
	write_user_db || return 1
	spawn "$NS_S" "$TMP/danted.log" "$DANTED" -f "$TMP/danted.conf" -p "$TMP/danted.pid"
	# shellcheck disable=SC2016 # expanded by that sh
	spawn "$NS_S" "$TMP/danted-auth.log" unshare -m --propagation private sh -c \
		'mount --bind "$1" /etc/passwd && mount --bind "$2" /etc/shadow && exec "$3" -f "$4" -p "$5"' \
		sh "$TMP/passwd" "$TMP/shadow" "$DANTED" "$TMP/danted-auth.conf" "$TMP/danted-auth.pid"
	spawn "$NS_S" "$TMP/bad_socks5.log" "$PY" "$HERE/bad_socks5.py" --listen "$S4" --port 1100 \
		--mode "$(IFS=,; echo "${BAD_MODES[*]}")" --addr6 "$S6" --foreign "$F4"
	for i in 80:tcp 7:udp 53:udp 8888:tcp 8889:tcp 1080:tcp 1081:tcp $((1100 + ${#BAD_MODES[@]} - 1)):tcp; do
		wait_listen "$NS_S" "${i#*:}" "${i%:*}" 100 || { echo "nothing listens on ${i%:*}/${i#*:} in S"; return 1; }
	done
}

# --- the harness, without twinstack ---------------------------------------------------------

connect_status() { # EXPECTED PROXY_URL: the status of a CONNECT through PROXY_URL
	local st
	st=$(inD curl -s -o /dev/null -w '%{http_connect}' --max-time 5 -p -x "$2" http://10.203.1.2/)
	echo "status $st"
	[ "$st" = "$1" ]
}

# The harness's checks run at the same time, each into its own file, reported in order.
harness() {
	local names=() pids=() i rc
	hjob() { # NAME CMD...: one check in the background
		names+=("$1")
		shift
		"$@" >"$TMP/h.${#names[@]}" 2>&1 &
		pids+=($!)
	}
	hjob "harness: dante relays UDP (ASSOCIATE spoken directly, v4 destination)" \
		ucheck s5 --server "$S4:1080" --dst 10.203.4.2:7 --count 50 --interval-ms 1
	hjob "harness: dante relays UDP to a v6 destination" \
		ucheck s5 --server "$S4:1080" --dst '[fd00:203:4::2]:7' --count 50 --interval-ms 1
	hjob "harness: dante with username auth relays UDP for the test user" \
		ucheck s5 --server "$S4:1081" --dst 10.203.5.2:7 --count 50 --interval-ms 1 \
		--user "$TS_USER" --password "$TS_PASS"
	hjob "harness: dante refuses a wrong password" negate ucheck s5 --server "$S4:1081" \
		--dst 10.203.5.2:7 --count 1 --user "$TS_USER" --password wrong
	hjob "harness: tinyproxy CONNECT without auth" connect_status 200 "http://$S4:8888"
	# tinyproxy 1.11 answers a CONNECT without credentials with 407, and 401 to a wrong
	# password.
	hjob "harness: tinyproxy with BasicAuth answers 407 without credentials" connect_status 407 \
		"http://$S4:8889"
	hjob "harness: tinyproxy with BasicAuth answers 401 to a wrong password" connect_status 401 \
		"http://$TS_USER:wrong@$S4:8889"
	for i in 0 1 2 3; do # the well-behaved modes of bad_socks5.py
		hjob "harness: bad_socks5 --mode ${BAD_MODES[$i]} relays" ucheck s5 \
			--server "$S4:$((1100 + i))" --dst 10.203.$((16 + i)).2:7 --count 20 --interval-ms 1
	done
	for i in "${!pids[@]}"; do
		wait "${pids[$i]}"
		rc=$?
		if [ "$rc" -eq 0 ]; then ok "${names[$i]}" "$(tail -n 1 "$TMP/h.$((i + 1))")"
		else not_ok "${names[$i]}" "$(tail -n 1 "$TMP/h.$((i + 1))")"; fi
	done
}
negate() { ! "$@"; }

# --- twinstack ------------------------------------------------------------------------------

write_config() {
	jq -n --arg st "$STACK" --arg tun "$TUN" --arg l "127.0.0.1:$P_STATS" --arg s4 "$S4" \
		--arg u "$TS_USER" --arg p "$TS_PASS" --arg modes "${BAD_MODES[*]}" '
	($modes | split(" ") | to_entries) as $m
	| ([$m[] | {tag: "bad_\(.value)", type: "socks5", server: "\($s4):\(1100 + .key)", udp: true,
	            routing_mark: 1}]) as $bad
	| ([$m[] | {cidr: ["10.203.\(16 + .key).0/24"], outbound: "bad_\(.value)"}]) as $badrules
	| {stack: $st,
	 tun: {name: $tun, address: "198.18.0.1/15", address6: "fd00:7f::1/64"},
	 timeouts: {udp_idle_ms: 1000, connect_ms: 3000},
	 outbounds: ([
	  {tag: "direct", type: "direct", routing_mark: 1},
	  {tag: "hp", type: "http", server: "\($s4):8888", routing_mark: 1},
	  {tag: "hpa", type: "http", server: "\($s4):8889", username: $u, password: $p, routing_mark: 1},
	  {tag: "hpx", type: "http", server: "\($s4):8889", username: $u, password: "wrong", routing_mark: 1},
	  {tag: "hpn", type: "http", server: "\($s4):8889", routing_mark: 1},
	  {tag: "s5nu", type: "socks5", server: "\($s4):1080", udp: false, routing_mark: 1},
	  {tag: "s5", type: "socks5", server: "\($s4):1080", udp: true, routing_mark: 1},
	  {tag: "s5a", type: "socks5", server: "\($s4):1081", username: $u, password: $p, udp: true, routing_mark: 1},
	  {tag: "s5x", type: "socks5", server: "\($s4):1081", username: $u, password: "wrong", udp: true, routing_mark: 1}
	 ] + $bad),
	 route: {rules: ([
	  {cidr: ["10.203.1.0/24"], outbound: "hp"},
	  {cidr: ["10.203.2.0/24"], outbound: "hpa"},
	  {cidr: ["10.203.3.0/24"], outbound: "hpx"},
	  {cidr: ["10.203.7.0/24"], outbound: "hpn"},
	  {cidr: ["10.203.8.0/24"], outbound: "s5nu"},
	  {cidr: ["10.203.4.0/24", "fd00:203:4::/64"], outbound: "s5"},
	  {cidr: ["10.203.5.0/24", "fd00:203:5::/64"], outbound: "s5a"},
	  {cidr: ["10.203.6.0/24"], outbound: "s5x"}
	 ] + $badrules), final: "direct"},
	 stats: {listen: $l},
	 log: {level: "debug"}}' >"$TMP/cfg.json"
}

# bad_config JQ_EDIT PATH_REGEX WHAT: the config edited so is refused by `twinstack check`
# with exit 2 and a message naming the JSON path.
bad_config() {
	local rc
	jq "$1" "$TMP/cfg.json" >"$TMP/bad.json" || return 1
	"$BIN" check --config "$TMP/bad.json" >"$TMP/bad.out" 2>&1
	rc=$?
	if [ "$rc" -eq 2 ] && grep -q "$2" "$TMP/bad.out"; then ok "config: $3 exits 2" "$(head -n 1 "$TMP/bad.out")"
	else not_ok "config: $3 exits 2" "exit $rc: $(head -n 1 "$TMP/bad.out")"; fi
}

# The SOCKS5 UDP keys the suite reads; every one must be in /stats.
S5_KEYS=(udp.assocs udp.assocs_total udp.assoc_failures udp.assoc_control_closed udp.sessions
	udp.drops.assoc_failed udp.drops.s5_truncated udp.drops.s5_rsv udp.drops.s5_frag
	udp.drops.s5_atyp udp.drops.s5_name udp.drops.s5_foreign udp.drops.s5_family
	udp.drops.s5_unknown_name udp.drops.unsupported_outbound fds sessions.refused)
check_keys() {
	local s k missing=()
	s=$(stats)
	for k in "${S5_KEYS[@]}"; do
		[ "$(sget "$s" "$k")" = missing ] && missing+=("$k")
	done
	[ ${#missing[@]} -eq 0 ] && { echo "${#S5_KEYS[@]} keys"; return 0; }
	echo "missing: ${missing[*]}"
	return 1
}

# --- the cases ------------------------------------------------------------------------------

# Runs in the background during phase A; each writes its result files under $TMP/a.
http_download() { # NAME ADDR
	local sum
	sum=$(inD curl -sS --max-time 20 "http://$2/blob" 2>"$TMP/a/$1.err" | sha256sum | cut -d' ' -f1)
	echo "$sum" >"$TMP/a/$1.sum"
}
# http_refused NAME ADDR: curl's exit status and its own total time (ms), which leaves out the
# start-up of the processes running at the same time.
http_refused() {
	local t rc
	t=$(inD curl -sS -o /dev/null -w '%{time_total}' --max-time 5 "http://$2/blob" 2>"$TMP/a/$1.err")
	rc=$?
	echo "$rc $(awk -v t="$t" 'BEGIN { printf "%d", t * 1000 }')" >"$TMP/a/$1.res"
}

phase_a() {
	local before after pids=() heavy=() i good=() bad=()
	mkdir -p "$TMP/a"
	before=$(stats)
	http_download plain 10.203.1.2 & heavy+=($!)
	http_download auth 10.203.2.2 & heavy+=($!)
	http_refused 407 10.203.7.2 & pids+=($!)
	http_refused 401 10.203.3.2 & pids+=($!)
	inD dig +time=3 +tries=1 +short @10.203.4.2 test.twinstack A >"$TMP/a/dig4" 2>&1 & pids+=($!)
	inD dig +time=3 +tries=1 +short @fd00:203:4::2 test.twinstack A >"$TMP/a/dig6" 2>&1 & pids+=($!)
	ucheck stream --dst 10.203.5.2:7 --count 100 --interval-ms 2 --wait 1.5 >"$TMP/a/auth-ok" 2>&1 &
	pids+=($!)
	ucheck stream --dst 10.203.6.2:7 --count 5 --interval-ms 100 --wait 1.5 --min-pct 0 \
		>"$TMP/a/auth-bad" 2>&1 & pids+=($!)
	for i in "${!BAD_MODES[@]}"; do
		case ${BAD_MODES[$i]} in
		zero | loopback | family | otherport) good+=(--dst "10.203.$((16 + i)).2:7") ;;
		*) bad+=(--dst "10.203.$((16 + i)).2:7") ;;
		esac
	done
	ucheck stream "${good[@]}" --count 50 --interval-ms 5 --wait 1.5 >"$TMP/a/bad-good" 2>&1 &
	pids+=($!)
	ucheck probe "${bad[@]}" --quiet-ms 700 --wait 2 >"$TMP/a/bad-probe" 2>&1 & pids+=($!)
	# UDP to an http outbound and to a socks5 one with "udp": false: dropped, never direct.
	ucheck stream --dst 10.203.1.2:7 --dst 10.203.8.2:7 --count 3 --interval-ms 10 --wait 0.7 \
		--min-pct 0 >"$TMP/a/no-udp" 2>&1 & pids+=($!)
	# The paced echo streams measure loss: they start once the downloads are done so that
	# those do not starve them of CPU (the rest of this phase is mostly waiting).
	wait "${heavy[@]}"
	for i in 64 1400; do
		ucheck stream --dst 10.203.4.2:7 --dst '[fd00:203:4::2]:7' --size "$i" --count 500 \
			--interval-ms 2 --wait 1.5 >"$TMP/a/echo-$i" 2>&1 &
		pids+=($!)
	done
	wait "${pids[@]}"
	sleep 0.2
	after=$(stats)
	echo "$before" >"$TMP/a/before.json"
	echo "$after" >"$TMP/a/after.json"
}

# udp_errors NS: the kernel's UDP receive-buffer and error counters in NS (a loss's witness).
udp_errors() {
	ip netns exec "$1" nstat -az 2>/dev/null |
		awk '/^Udp6?(RcvbufErrors|InErrors) / { printf "%s %s ", $1, $2 }'
}

# counted NAME BEFORE AFTER KEY N: ok when KEY is in /stats and moved by exactly N.
counted() {
	local d
	if [ "$(sget "$3" "$4")" = missing ]; then not_ok "$1" "/stats has no $4"; return; fi
	d=$(delta "$2" "$3" "$4")
	if [ "$d" -eq "$5" ]; then ok "$1" "+$d"; else not_ok "$1" "+$d, expected +$5"; fi
}

report_http() {
	local before after rc ms
	before=$(cat "$TMP/a/before.json") after=$(cat "$TMP/a/after.json")
	if [ "$(cat "$TMP/a/plain.sum")" = "$SHA" ]; then ok "1. http: 20 MiB through tinyproxy, sha256 equal"
	else not_ok "1. http: 20 MiB through tinyproxy, sha256 equal" "got $(cat "$TMP/a/plain.sum") $(cat "$TMP/a/plain.err")"; fi
	if [ "$(cat "$TMP/a/auth.sum")" = "$SHA" ]; then ok "2. http: 20 MiB through tinyproxy with BasicAuth, sha256 equal"
	else not_ok "2. http: 20 MiB through tinyproxy with BasicAuth, sha256 equal" "got $(cat "$TMP/a/auth.sum") $(cat "$TMP/a/auth.err")"; fi
	# 7: refused at connect, 56: reset after the handshake, seen by curl's read; 55: the same
	# reset seen by its send, when it came before curl had written its request (a loaded
	# machine). 52 (a clean EOF) or 28 (a timeout) would mean the refusal was not a reset.
	for f in 407:"no credentials" 401:"wrong password"; do
		read -r rc ms <"$TMP/a/${f%%:*}.res"
		if { [ "$rc" -eq 7 ] || [ "$rc" -eq 55 ] || [ "$rc" -eq 56 ]; } && [ "$ms" -lt 1000 ]; then
			ok "3. http ${f%%:*} (${f#*:}): the app's connection is reset promptly" "curl exit $rc in $ms ms"
		else not_ok "3. http ${f%%:*} (${f#*:}): the app's connection is reset promptly" \
			"curl exit $rc in $ms ms: $(head -c 200 "$TMP/a/${f%%:*}.err")"; fi
	done
	check "3. http 407 and 401: sessions.refused grows by 2" test "$(delta "$before" "$after" sessions.refused)" -eq 2
	# 407 and 401 fail the attempt as access denied, any other status as refused
	# (docs/config.md); the statuses are logged at debug level.
	counted "3. http 407 and 401: counted as sessions.failed.denied" "$before" "$after" \
		sessions.failed.denied 2
	counted "3. http: nothing counted as refused" "$before" "$after" \
		sessions.failed.connect_refused 0
	if grep -q 'answered CONNECT with status 407' "$TMP/twinstack.log" &&
		grep -q 'answered CONNECT with status 401' "$TMP/twinstack.log"; then
		ok "3. http: both statuses logged at debug level"
	else not_ok "3. http: both statuses logged at debug level" "$(grep -c . "$TMP/twinstack.log") log lines"; fi
}

report_udp() {
	local before after f res d r m lost=0
	before=$(cat "$TMP/a/before.json") after=$(cat "$TMP/a/after.json")
	for f in 64:1:10.203.4.2 64:2:fd00:203:4::2 1400:1:10.203.4.2 1400:2:fd00:203:4::2; do
		res=$(sed -n "$(cut -d: -f2 <<<"$f")p" "$TMP/a/echo-${f%%:*}")
		d="${f%%:*} B to ${f#*:*:}"
		if jq -e '.delivered >= 495 and .corrupt == 0 and .duplicates == 0' <<<"$res" >/dev/null 2>&1; then
			ok "4. socks5 udp echo through dante, $d (>= 99 %, intact)" "$res"
		else not_ok "4. socks5 udp echo through dante, $d (>= 99 %, intact)" "$res"; lost=1; fi
	done
	[ "$lost" -eq 1 ] && note "UDP errors: D: $(udp_errors "$NS_D"); S: $(udp_errors "$NS_S")"
	for f in dig4 dig6; do
		r=$(tr '\n' ' ' <"$TMP/a/$f")
		if [ "$r" = "10.9.8.7 " ]; then ok "5. dns through socks5 udp ($f: dig to dnsmasq on S)" "$r"
		else not_ok "5. dns through socks5 udp ($f: dig to dnsmasq on S)" "answer '$r'"; fi
	done
	res=$(tail -n 1 "$TMP/a/auth-ok")
	if jq -e '.delivered >= 99 and .corrupt == 0' <<<"$res" >/dev/null 2>&1; then
		ok "8. socks5 udp through dante with username auth" "$res"
	else not_ok "8. socks5 udp through dante with username auth" "$res"; fi
	res=$(tail -n 1 "$TMP/a/auth-bad")
	if jq -e '.delivered == 0' <<<"$res" >/dev/null 2>&1; then ok "8. wrong password: no datagram delivered" "$res"
	else not_ok "8. wrong password: no datagram delivered" "$res"; fi
	if [ "$(jq -s 'map(.delivered) | add' "$TMP/a/no-udp" 2>/dev/null)" = 0 ]; then
		ok "udp to an http outbound and to socks5 with udp false: nothing delivered"
	else not_ok "udp to an http outbound and to socks5 with udp false: nothing delivered" "$(tr '\n' ' ' <"$TMP/a/no-udp")"; fi
	counted "udp to those outbounds: counted as udp.drops.unsupported_outbound" "$before" "$after" \
		udp.drops.unsupported_outbound 6
	check "8. wrong password: udp.assoc_failures grows" test "$(delta "$before" "$after" udp.assoc_failures)" -ge 1
	check "8. wrong password: udp.drops.assoc_failed grows" test "$(delta "$before" "$after" udp.drops.assoc_failed)" -ge 1
	local ngood=0 nbad=0
	for m in "${BAD_MODES[@]}"; do
		case $m in
		zero | loopback | family | otherport) ngood=$((ngood + 1)); res=$(sed -n "${ngood}p" "$TMP/a/bad-good") ;;
		*) nbad=$((nbad + 1)); res=$(sed -n "${nbad}p" "$TMP/a/bad-probe") ;;
		esac
		case $m in
		zero | loopback | family | otherport)
			if jq -e '.delivered >= 49 and .corrupt == 0' <<<"$res" >/dev/null 2>&1; then
				ok "9. bad server $m: datagrams relayed" "$res"
			else not_ok "9. bad server $m: datagrams relayed" "$res"; fi ;;
		*)
			local key=s5_$m
			case $m in atyp9) key=s5_atyp ;; v6src) key=s5_family ;; name) key=s5_unknown_name ;;
			emptyname) key=s5_name ;; esac
			if jq -e '.leaked == 0 and .good_echoed' <<<"$res" >/dev/null 2>&1; then
				ok "9. bad server $m: the bad reply dropped, a good one after it delivered" "$res"
			else not_ok "9. bad server $m: the bad reply dropped, a good one after it delivered" "$res"; fi
			counted "9. bad server $m: counted as udp.drops.$key" "$before" "$after" "udp.drops.$key" 1 ;;
		esac
	done
}

# wait_idle: until udp.sessions and udp.assocs are 0 (at most 8 s); prints the last values.
idle_now() {
	local s
	s=$(stats)
	IDLE_S=$(sget "$s" udp.sessions) IDLE_A=$(sget "$s" udp.assocs) IDLE_F=$(sget "$s" fds)
	[ "$IDLE_S" = 0 ] && { [ "$IDLE_A" = 0 ] || [ "$IDLE_A" = missing ]; }
}
wait_idle() { wait_until 80 0.1 idle_now; }

case_flows() {
	local before after fd0 res max_s=0 max_f=0 s u f
	wait_idle || note "UDP sessions before the flows: $IDLE_S, assocs $IDLE_A"
	before=$(stats)
	fd0=$(sget "$before" fds)
	ucheck flows --dst 10.203.4.2:7 --count 1000 --per 2 --inflight 100 --seconds 2.5 --timeout 5 \
		>"$TMP/flows.json" 2>&1 &
	local fp=$!
	while kill -0 "$fp" 2>/dev/null; do
		s=$(stats)
		u=$(sget "$s" udp.sessions) f=$(sget "$s" fds)
		[ "${u:-0}" -gt "$max_s" ] 2>/dev/null && max_s=$u
		[ "${f:-0}" -gt "$max_f" ] 2>/dev/null && max_f=$f
		sleep 0.2
	done
	wait "$fp"
	res=$(tail -n 1 "$TMP/flows.json")
	note "1,000 flows: $res; udp.sessions max $max_s, fds $fd0 before, max $max_f"
	if jq -e '.distinct_ports == 1000 and .answered >= 1980 and .corrupt == 0' <<<"$res" >/dev/null 2>&1; then
		ok "6. 1,000 udp flows through socks5 associations answered (>= 99 %)" "$res"
	else not_ok "6. 1,000 udp flows through socks5 associations answered (>= 99 %)" "$res"; fi
	after=$(stats)
	note "udp.assocs_total +$(delta "$before" "$after" udp.assocs_total), assoc_failures +$(delta "$before" "$after" udp.assoc_failures), udp drops: $(jq -nc --argjson a "$before" --argjson b "$after" '[$b.udp.drops | to_entries[] | select(.value > ($a.udp.drops[.key] // 0)) | "\(.key) +\(.value - ($a.udp.drops[.key] // 0))"] | join(", ")'), tun drops: $(jq -nc --argjson a "$before" --argjson b "$after" '[($b.drops // {}) | to_entries[] | select((.value|type) == "number" and .value > ($a.drops[.key] // 0)) | "\(.key) +\(.value - ($a.drops[.key] // 0))"] | join(", ")')"
	check "6. one association per flow (udp.assocs_total grows by >= 990)" \
		test "$(delta "$before" "$after" udp.assocs_total)" -ge 990
	if wait_idle; then ok "6. udp.sessions and udp.assocs back to 0 after the idle timeout"
	else not_ok "6. udp.sessions and udp.assocs back to 0 after the idle timeout" "sessions $IDLE_S, assocs $IDLE_A"; fi
	if wait_until 30 0.1 fds_back "$fd0"; then ok "6. the proxy's fds back to the value before the flows" "$IDLE_F, $fd0 before"
	else not_ok "6. the proxy's fds back to the value before the flows" "$IDLE_F, $fd0 before"; fi
}
fds_back() { IDLE_F=$(sget "$(stats)" fds); [ "$IDLE_F" -le "$1" ] 2>/dev/null; }

one_control() { [ "$(inD ss -Htn state established "( dst $S4 and dport = :1080 )" | wc -l)" -eq 1 ]; }

# A session whose datagrams keep flowing (every 50 ms, well inside udp_idle_ms) has its control
# connection destroyed under it: the session ends with it, the next datagram sets up a new
# association (so assocs_total grows by 2 in all) and the stream goes on; once idle, nothing of
# either association is left.
case_control_closed() {
	local before after fd0 res sp n
	wait_idle || note "UDP sessions before the kill: $IDLE_S, assocs $IDLE_A"
	before=$(stats)
	fd0=$(sget "$before" fds)
	ucheck stream --dst 10.203.4.2:7 --count 40 --interval-ms 50 --wait 0.5 --min-pct 0 \
		>"$TMP/c7.json" 2>&1 &
	sp=$!
	if wait_until 20 0.05 one_control; then
		sleep 0.3
		inD ss -K -Htn state established "( dst $S4 and dport = :1080 )" >/dev/null
	else
		n=$(inD ss -Htn state established "( dst $S4 and dport = :1080 )" | wc -l)
		not_ok "7. control connection killed: exactly one control connection to dante" "$n"
	fi
	wait "$sp"
	res=$(tail -n 1 "$TMP/c7.json")
	after=$(stats)
	check "7. control connection killed: udp.assoc_control_closed grows by 1" \
		test "$(delta "$before" "$after" udp.assoc_control_closed)" -eq 1
	check "7. control connection killed: a new association carries the rest (assocs_total +2)" \
		test "$(delta "$before" "$after" udp.assocs_total)" -eq 2
	if jq -e '.delivered >= 35 and .corrupt == 0' <<<"$res" >/dev/null 2>&1; then
		ok "7. control connection killed: the stream goes on (>= 35 of 40)" "$res"
	else not_ok "7. control connection killed: the stream goes on (>= 35 of 40)" "$res"; fi
	if wait_idle; then ok "7. control connection killed: udp.sessions and udp.assocs back to 0"
	else not_ok "7. control connection killed: udp.sessions and udp.assocs back to 0" "sessions $IDLE_S, assocs $IDLE_A"; fi
	if wait_until 30 0.1 fds_back "$fd0"; then ok "7. control connection killed: fds back to the baseline" "$IDLE_F, $fd0 before"
	else not_ok "7. control connection killed: fds back to the baseline" "$IDLE_F, $fd0 before"; fi
}

# --- run ------------------------------------------------------------------------------------

check "setup: namespaces, veth, routes" topology || { echo "$PASSED passed, $FAILED failed"; exit 1; }
check "setup: servers (http, udp echo, dnsmasq, tinyproxy x2, danted x2, bad_socks5)" \
	servers || { tail -n 5 "$TMP"/*.log | sed 's/^/# /'; echo "$PASSED passed, $FAILED failed"; exit 1; }
vnote "servers up at $(elapsed_ms "$T0") ms"
harness
vnote "harness done at $(elapsed_ms "$T0") ms"
write_config
check "twinstack check accepts the config" "$BIN" check --config "$TMP/cfg.json"
bad_config '(.outbounds[] | select(.tag == "hp")).udp = true' 'outbounds\[1\]\.udp' \
	"udp on an http outbound"
bad_config '(.outbounds[] | select(.tag == "s5")).udp = "yes"' 'outbounds\[6\]\.udp' \
	"udp not a boolean"
check "start (stack $STACK)" ts_start || { echo "$PASSED passed, $FAILED failed"; exit 1; }
check "/stats has the SOCKS5 UDP keys" check_keys
if [ "$VERBOSE" -eq 1 ]; then inD ip -4 route; inD ip -6 route; inD ip -6 addr; fi | sed 's/^/# /'
phase_a
vnote "phase A done at $(elapsed_ms "$T0") ms"
report_http
report_udp
case_flows
vnote "flows done at $(elapsed_ms "$T0") ms"
case_control_closed
if kill -0 "$TS_PID" 2>/dev/null; then ok "the proxy is alive after every case"
else not_ok "the proxy is alive after every case" "exited"; fi
check "SIGTERM: exit 0" ts_sigterm
if [ "$VERBOSE" -eq 1 ]; then
	jq -c '{udp, sessions, drops}' "$TMP/a/after.json" | sed 's/^/# /'
	grep -v ' debug ' "$TMP/twinstack.log" | tail -n 20 | sed 's/^/# log: /'
fi
note "elapsed $(elapsed_ms "$T0") ms"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
