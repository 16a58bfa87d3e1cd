#!/usr/bin/env bash
# desktop.sh — "desktop routing" end to end: twinstack run on a machine whose only route out is
# its default route (no rule, no table made by hand), in namespaces created (and destroyed)
# per run.
#
#   ns L: LAN client            ns D: desktop (proxy + clients)          ns S: uplink + servers
#  +--------------------+   +--------------------------------------+   +------------------------+
#  | curl               |   | curl (root and nobody), python       |   | lo 10.201.9.2/32, .3   |
#  | default via D      |   |   |  default via 10.201.0.2 (+v6)    |   |  fd00:201:9::2/128, ::3|
#  |                    |   |   v  nothing else by hand            |   |  http.server :80       |
#  |                    |   | tun 198.18.0.1/15 (fd00:7f::1/64)    |   |   20 MiB, 100 MiB, txt |
#  |                    |   |   twinstack run: auto_route rules,   |   |  tcp echo :7 (python)  |
#  |                    |   |   its own sockets marked 0x74000000  |   |  udp echo :7 (socat)   |
#  | vL 10.201.3.2/24   |   | vDL 10.201.3.1/24    vDS 10.201.0.1  |   | vSD 10.201.0.2/24, .3  |
#  |  fd00:201:3::2/64 -------- fd00:201:3::1/64  fd00:201::1/64 -------- fd00:201::2/64      |
#  +--------------------+   | ip_forward on (L's traffic)          |   | routes the LAN back    |
#                           +--------------------------------------+   +------------------------+
#
# The servers sit on S's loopback, off the veth subnet: D reaches them only by its default
# route, which is what auto_route has to capture. 10.201.0.3 (on the veth subnet, not the
# gateway) tells the strict and the non-strict rule sets apart; 10.201.9.3 is the
# route_exclude_address target.
#
# Cases (each its own ok / not ok lines; the letters --only takes; A and I run first, as they
# need no auto_route):
#   A  routing loop without auto_route: default route into the TUN after start; the run-time
#      route check reports it, each app connection fails fast, drops.loop counts, sessions
#      stay few, the proxy lives
#   B  auto_route: 20 MiB v4/v6, UDP echo v4/v6, from D and from L; sessions.total grows by
#      exactly the connections made; the gateway and on-link addresses stay outside
#   C  cleanup: rules, routes and rp_filter/src_valid_mark sysctls in D exactly as before after
#      SIGTERM, after a failed start, after SIGKILL + a new start + SIGTERM; a second
#      auto_route proxy is refused without touching the first one's rules
#   D  exclude_uid, exclude_interface, route_exclude_address: not captured, still reachable
#   E  strict_route with an IPv4-only TUN: IPv6 fails instead of leaking, on-link captured;
#      with all.rp_filter 1 the TUN runs loose (2) and the uplink is warned about; control
#      without strict_route
#   F  a rule deleted by hand is back within 1 s, logged
#   G  SIGHUP reload: new rules for new connections, a running download intact, a broken
#      config refused
#   H  least privilege: CapEff 0x3000 on every thread, with and without "user": "nobody"
#   I  the TUN deleted under a download: exit 1 within 1 s, rules gone
#
# usage: desktop.sh [--stack system|lwip] [--bin PATH] [--only LETTERS] [--keep] [-v]
#   --stack   the configs' "stack" (default system)
#   --bin     the twinstack binary (default: build/twinstack of this checkout)
#   --only    run only these cases, e.g. --only AC (the topology and servers always run)
#   --keep    keep the work directory (configs, logs) after the run
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun, no namespaces), 1 otherwise.
# Output: 'ok - NAME' / 'not ok - NAME: REASON' lines, '#' notes, then 'N passed, N failed'.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ONLY=ABCDEFGHI

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"
suite_args desktop --only ONLY -- "$@"

# --- preconditions: 77 = cannot run here, not a failure --------------------------------------
if [ "$(id -u)" -ne 0 ]; then echo "# SKIP: needs root (network namespaces, TUN)"; exit 77; fi
if [ ! -c /dev/net/tun ]; then echo "# SKIP: no /dev/net/tun"; exit 77; fi
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
missing=()
for t in ip ss sysctl curl jq socat setpriv timeout sha256sum diff "$PY"; do
	command -v "$t" >/dev/null 2>&1 || missing+=("$t")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "not ok - prerequisites: missing ${missing[*]} (scripts/setup.sh installs them)"
	echo "0 passed, 1 failed"
	exit 1
fi
if ! "$BIN" run --help >/dev/null 2>&1; then
	echo "not ok - binary: '$BIN run --help' fails (build it)"
	echo "0 passed, 1 failed"
	exit 1
fi
if ! getent passwd nobody >/dev/null; then
	echo "not ok - prerequisites: no user 'nobody'"
	echo "0 passed, 1 failed"
	exit 1
fi
NOBODY=$(id -u nobody)
NOGROUP=$(id -g nobody)

TOK=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
TMP=$(mktemp -d "${TMPDIR:-/tmp}/twinstack-desktop.XXXXXX")
# "user": the dropped-privilege proxy re-opens its config file as that user.
chmod 0755 "$TMP"
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
T_START=$(date +%s%N)

# --- names and addresses ---------------------------------------------------------------------
NS_D=tsdD-$TOK NS_S=tsdS-$TOK NS_L=tsdL-$TOK
V_DS=tsds$TOK V_SD=tssd$TOK V_DL=tsdl$TOK V_LD=tsld$TOK
TUN=tsdt$TOK
D4=10.201.0.1 S4=10.201.0.2 S4B=10.201.0.3 D6=fd00:201::1 S6=fd00:201::2
DL4=10.201.3.1 L4=10.201.3.2 DL6=fd00:201:3::1 L6=fd00:201:3::2
SRV4=10.201.9.2 SRV6=fd00:201:9::2 EXC4=10.201.9.3 EXC6=fd00:201:9::3
GW6=fd00:7f::1
P_HTTP=80 P_ECHO=7 P_STATS=9091 P_BUSY=9092 P_STATS2=9093
FILE_BYTES=$((20 * 1024 * 1024))
BIG_BYTES=$((100 * 1024 * 1024))
TSNET=("$PY" "$HERE/tsnet.py")
RULE_PROTO=116
TS_PID=

inD() { ip netns exec "$NS_D" "$@"; }
inS() { ip netns exec "$NS_S" "$@"; }
inL() { ip netns exec "$NS_L" "$@"; }

note "twinstack desktop routing suite: stack=$STACK bin=$BIN token=$TOK"

# --- topology --------------------------------------------------------------------------------
topology() {
	netns_add "$NS_D" && netns_add "$NS_S" && netns_add "$NS_L" || return 1
	ip link add "$V_DS" netns "$NS_D" type veth peer name "$V_SD" netns "$NS_S" || return 1
	ip link add "$V_DL" netns "$NS_D" type veth peer name "$V_LD" netns "$NS_L" || return 1
	local ns dev
	for ns in "$NS_D:$V_DS" "$NS_D:$V_DL" "$NS_S:$V_SD" "$NS_L:$V_LD"; do
		dev=${ns#*:} ns=${ns%%:*}
		ip -n "$ns" link set "$dev" txqueuelen 10000 up || return 1
	done
	ip -n "$NS_D" addr add "$D4/24" dev "$V_DS"
	ip -n "$NS_D" addr add "$D6/64" dev "$V_DS" nodad
	ip -n "$NS_D" route add default via "$S4" || return 1
	ip -n "$NS_D" -6 route add default via "$S6" || return 1
	# The LAN side (exclude_interface): D forwards L's traffic.
	ip -n "$NS_D" addr add "$DL4/24" dev "$V_DL"
	ip -n "$NS_D" addr add "$DL6/64" dev "$V_DL" nodad
	inD sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 >/dev/null || return 1
	ip -n "$NS_L" addr add "$L4/24" dev "$V_LD"
	ip -n "$NS_L" addr add "$L6/64" dev "$V_LD" nodad
	ip -n "$NS_L" route add default via "$DL4" || return 1
	ip -n "$NS_L" -6 route add default via "$DL6" || return 1

	ip -n "$NS_S" addr add "$S4/24" dev "$V_SD"
	ip -n "$NS_S" addr add "$S4B/24" dev "$V_SD"
	ip -n "$NS_S" addr add "$S6/64" dev "$V_SD" nodad
	for a in "$SRV4/32" "$EXC4/32"; do ip -n "$NS_S" addr add "$a" dev lo || return 1; done
	for a in "$SRV6/128" "$EXC6/128"; do ip -n "$NS_S" addr add "$a" dev lo nodad || return 1; done
	# L's traffic that is not captured arrives with L's addresses.
	ip -n "$NS_S" route add 10.201.3.0/24 via "$D4" || return 1
	ip -n "$NS_S" -6 route add fd00:201:3::/64 via "$D6" || return 1
}

servers() {
	mkdir -p "$TMP/www" || return 1
	head -c "$FILE_BYTES" /dev/urandom >"$TMP/www/file.bin" || return 1
	head -c "$BIG_BYTES" /dev/urandom >"$TMP/www/big.bin" || return 1
	echo hello >"$TMP/www/small.txt"
	FILE_SHA=$(sha256sum "$TMP/www/file.bin" | cut -d' ' -f1)
	BIG_SHA=$(sha256sum "$TMP/www/big.bin" | cut -d' ' -f1)
	spawn "$NS_S" "$TMP/httpd.log" "$PY" -m http.server --bind :: --directory "$TMP/www" "$P_HTTP"
	spawn "$NS_S" "$TMP/tcp-echo.log" "${TSNET[@]}" tcp-echo --port "$P_ECHO"
	spawn "$NS_S" "$TMP/udp-echo4.log" socat -T 5 "UDP4-RECVFROM:$P_ECHO,bind=$SRV4,fork" EXEC:cat
	spawn "$NS_S" "$TMP/udp-echo6.log" socat -T 5 "UDP6-RECVFROM:$P_ECHO,bind=[$SRV6],fork" EXEC:cat
	local p
	for p in "tcp:$P_HTTP" "tcp:$P_ECHO" "udp:$P_ECHO"; do
		wait_listen "$NS_S" "${p%%:*}" "${p#*:}" 100 || { echo "no listener on $p in S"; return 1; }
	done
	echo "http, tcp/udp echo listening; 20 MiB sha256 ${FILE_SHA:0:16}..., 100 MiB ${BIG_SHA:0:16}..."
}

# --- configs and the proxy -------------------------------------------------------------------

# config FILE [OVERLAY_JSON]: the base (stack, TUN name, stats, short timeouts) deep-merged
# with OVERLAY. The TUN is IPv4-only unless OVERLAY sets tun.address6 (V6TUN below).
config() {
	local base overlay=${2:-'{}'}
	base=$(jq -n --arg s "$STACK" --arg t "$TUN" --arg l "127.0.0.1:$P_STATS" \
		'{stack: $s, tun: {name: $t}, stats: {listen: $l}, log: {level: "info"},
		  nat: {linger_ms: 300, port_quarantine_ms: 500},
		  timeouts: {connect_ms: 2000, udp_idle_ms: 1000}}')
	jq -n --argjson a "$base" --argjson b "$overlay" '$a * $b' >"$1.tmp" && mv "$1.tmp" "$1"
	chmod 0644 "$1"
}
V6TUN="\"address6\": \"$GW6/64\""
AUTO="\"auto_route\": true"

# ts_start CONFIG TAG: `twinstack run` in D; waits (10 s at most) for the ready byte. Sets
# TS_PID and TS_LOG; returns 1 (reason in TS_ERR) if it died or timed out.
ts_start() {
	local cfg=$1 tag=$2 i
	TS_LOG=$TMP/twinstack.$tag.log
	: >"$TMP/ready.$tag"
	ip netns exec "$NS_D" "$BIN" run --config "$cfg" --ready-fd 3 \
		3>"$TMP/ready.$tag" </dev/null >"$TS_LOG" 2>&1 &
	TS_PID=$!
	PIDS+=("$TS_PID")
	for ((i = 0; i < 100; i++)); do
		[ -s "$TMP/ready.$tag" ] && return 0
		kill -0 "$TS_PID" 2>/dev/null || break
		sleep 0.05
	done
	if kill -0 "$TS_PID" 2>/dev/null; then
		TS_ERR="no ready byte within 5 s; log: $(tail -n 3 "$TS_LOG" | tr '\n' ' ')"
	else
		wait "$TS_PID"
		TS_ERR="exited $? before ready; log: $(tail -n 3 "$TS_LOG" | tr '\n' ' ')"
	fi
	TS_PID=
	return 1
}

# start_case NAME CONFIG TAG: ts_start, with a not-ok line naming the case when it fails.
start_case() {
	ts_start "$2" "$3" && return 0
	not_ok "$1: start" "$TS_ERR"
	return 1
}

# reload_results: the reloads that have ended so far (one result line each).
reload_results() { grep -cE 'reload: (configuration [0-9]+ in use|refused)' "$TS_LOG"; }

# ts_sigterm: SIGTERM to TS_PID; ok if it exits 0 within 2 s (waits 5 s at most, then KILL).
ts_sigterm() {
	local t0 i rc ms
	[ -n "$TS_PID" ] || { echo "no proxy running"; return 1; }
	t0=$(date +%s%N)
	kill -TERM "$TS_PID" 2>/dev/null || { echo "process already gone"; TS_PID=; return 1; }
	for ((i = 0; i < 100; i++)); do
		kill -0 "$TS_PID" 2>/dev/null || break
		sleep 0.05
	done
	ms=$(elapsed_ms "$t0")
	if kill -0 "$TS_PID" 2>/dev/null; then
		kill -KILL "$TS_PID" 2>/dev/null
		wait "$TS_PID" 2>/dev/null
		TS_PID=
		echo "still running ${ms} ms after SIGTERM (killed)"
		return 1
	fi
	wait "$TS_PID"
	rc=$?
	TS_PID=
	wait_tun_gone
	[ "$rc" -eq 0 ] && [ "$ms" -le 2000 ] && { echo "exit 0 after ${ms} ms"; return 0; }
	echo "exit $rc after ${ms} ms; log: $(tail -n 2 "$TS_LOG" | tr '\n' ' ')"
	return 1
}

# ts_stop: stop TS_PID (if any) without an assertion.
ts_stop() {
	[ -n "$TS_PID" ] && stop_pid "$TS_PID" 2
	TS_PID=
	wait_tun_gone
}

# wait_tun_gone: the TUN is unregistered when the last fd closes; wait for it (2 s at most)
# so the next start can create it again.
wait_tun_gone() { wait_until 40 0.05 eval "! ip -n $NS_D link show $TUN >/dev/null 2>&1"; }

stats_json() { inD curl -sS --fail --max-time 3 "http://127.0.0.1:$P_STATS/stats"; }
stat_get() { stats_json | jq -r "$1 // \"absent\""; }
is_num() { [[ "$1" =~ ^[0-9]+$ ]]; }

# --- clients ---------------------------------------------------------------------------------

# download NS URL WANT_SHA [CURL_ARGS...]: curl piped to sha256sum, compared.
download() {
	local ns=$1 url=$2 want=$3 t0 rc hash ms
	shift 3
	t0=$(date +%s%N)
	ip netns exec "$ns" curl -sS --fail --connect-timeout 3 --max-time 20 "$@" -o - "$url" \
		2>"$TMP/curl.err" | sha256sum >"$TMP/dl.sha"
	rc=${PIPESTATUS[0]}
	ms=$(elapsed_ms "$t0")
	hash=$(cut -d' ' -f1 "$TMP/dl.sha")
	if [ "$rc" -ne 0 ]; then
		echo "curl exit $rc after ${ms} ms: $(head -c 200 "$TMP/curl.err")"
		return 1
	fi
	[ "$hash" = "$want" ] || { echo "sha256 ${hash:0:16}... differs from ${want:0:16}..."; return 1; }
	echo "sha256 equal, ${ms} ms"
}

# fetch NS URL [CURL_PREFIX...]: small GET that must succeed (small.txt says hello).
fetch() {
	local ns=$1 url=$2 out
	shift 2
	out=$(ip netns exec "$ns" "$@" curl -sS --fail --connect-timeout 2 --max-time 4 "$url" 2>&1)
	[ "$out" = hello ] && { echo "reached"; return 0; }
	echo "curl: $(head -c 200 <<<"$out")"
	return 1
}

# sessions_delta NAME WANT CMD...: runs CMD (must succeed), then sessions.total must have grown
# by exactly WANT.
sessions_delta() {
	local name=$1 want=$2 s0 s1 out
	shift 2
	s0=$(stat_get .sessions.total)
	if ! out=$("$@" 2>&1); then
		not_ok "$name" "$(tail -n 1 <<<"$out")"
		return 1
	fi
	s1=$(stat_get .sessions.total)
	if ! is_num "$s0" || ! is_num "$s1"; then
		not_ok "$name" "sessions.total '$s0' -> '$s1': not numbers"
		return 1
	fi
	if [ $((s1 - s0)) -ne "$want" ]; then
		not_ok "$name" "$(tail -n 1 <<<"$out"), but sessions.total $s0 -> $s1 (want +$want)"
		return 1
	fi
	ok "$name" "$(tail -n 1 <<<"$out"); sessions.total +$want"
}

# snapshot FILE: D's rules, routes of every table, rp_filter / src_valid_mark sysctls.
snapshot() {
	{
		echo "== ip -4 rule"; inD ip -4 rule
		echo "== ip -6 rule"; inD ip -6 rule
		echo "== ip -4 route show table all"; inD ip -4 route show table all
		echo "== ip -6 route show table all"; inD ip -6 route show table all
		echo "== sysctl"; inD sysctl -a 2>/dev/null | grep -E 'rp_filter|src_valid_mark'
	} >"$1" 2>&1
}

# same_as_before TAG: D's snapshot equals the one taken before the first start.
same_as_before() {
	snapshot "$TMP/snap.$1"
	if diff -u "$TMP/snap.before" "$TMP/snap.$1" >"$TMP/snap.$1.diff"; then
		echo "rules, routes (all tables) and sysctls identical"
		return 0
	fi
	echo "differs: $(grep '^[-+][^-+]' "$TMP/snap.$1.diff" | head -n 6 | tr '\n' ';')"
	return 1
}

# ours: the rules carrying the tag, both families, one per line.
ours() { { inD ip -4 rule; inD ip -6 rule; } | grep "proto $RULE_PROTO"; }

# installed: while an auto_route proxy runs, its tagged rules exist (a cleanup test that
# compares with "before" proves nothing when nothing was installed).
installed() {
	local n
	n=$(ours | wc -l)
	[ "$n" -gt 0 ] && { echo "$n rules with proto $RULE_PROTO"; return 0; }
	echo "no rule with proto $RULE_PROTO in D (auto_route installed nothing)"
	return 1
}

# =============================================================================================
topology >"$TMP/topology.out" 2>&1
topo_rc=$?
out=$(tr '\n' ' ' <"$TMP/topology.out")
if [ "$topo_rc" -eq 0 ]; then
	ok "topology: namespaces D, S, L, veths, default routes only" "$NS_D $NS_S $NS_L"
else
	if ! ip netns list >/dev/null 2>&1 || [[ "$out" == *"Operation not permitted"* ]]; then
		echo "# SKIP: cannot create network namespaces here: $out"
		exit 77
	fi
	not_ok "topology" "$out"
	echo "$PASSED passed, $FAILED failed"
	exit 1
fi
if ! check "servers in S" servers; then
	for f in "$TMP"/*.log; do vnote "$f: $(tail -n 2 "$f" | tr '\n' ' ')"; done
	echo "$PASSED passed, $FAILED failed"
	exit 1
fi
check "harness: D reaches the servers by its default route (no proxy)" \
	fetch "$NS_D" "http://$SRV4:$P_HTTP/small.txt"
# IPv6 link-local addresses (and their local-table routes) appear after DAD: let them settle
# so the "before" snapshot is the steady state.
settled() {
	[ -z "$(inD ip -6 addr show tentative)" ] &&
		[ "$(inD ip -6 addr show scope link | grep -c 'inet6 fe80')" -ge 2 ]
}
wait_until 50 0.1 settled || note "IPv6 addresses in D not settled after 5 s"
snapshot "$TMP/snap.before"
vnote "before: $(grep -c . "$TMP/snap.before") lines of rules/routes/sysctls"

# --- A: a routing loop without auto_route ----------------------------------------------------

# loop_tcp ADDR N: N sequential curls into the loop; each must fail (not time out) in < 1 s.
loop_tcp() {
	local addr=$1 n=$2 i t0 ms rc slow=() codes=()
	[[ "$addr" == *:* ]] && addr="[$addr]"
	for ((i = 0; i < n; i++)); do
		t0=$(date +%s%N)
		inD curl -s --max-time 3 -o /dev/null "http://$addr:$P_HTTP/small.txt"
		rc=$?
		ms=$(elapsed_ms "$t0")
		codes+=("$rc/${ms}ms")
		{ [ "$rc" -eq 0 ] || [ "$rc" -eq 28 ] || [ "$ms" -ge 1000 ]; } && slow+=("#$i")
	done
	[ ${#slow[@]} -eq 0 ] && { echo "curl exit/time: ${codes[*]}"; return 0; }
	echo "not a fast failure: ${slow[*]} (curl exit/time: ${codes[*]})"
	return 1
}

# udp_into_loop HOST N: N sockets in D, two datagrams each, to the UDP echo; no reply expected.
udp_into_loop() {
	inD "$PY" - "$1" "$2" "$P_ECHO" <<'EOF'
import socket, sys
host, n, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fam = socket.AF_INET6 if ":" in host else socket.AF_INET
replies = 0
for i in range(n):
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.settimeout(0.2)
    s.connect((host, port))
    for j in range(2):
        s.send(b"loop %d %d" % (i, j))
        try:
            s.recv(2048)
            replies += 1
        except (socket.timeout, OSError):
            pass
    s.close()
print("%d datagrams sent, %d replies" % (2 * n, replies))
EOF
}

loop_risk_seen() {
	local r
	r=$(stat_get .routes.loop_risk)
	is_num "$r" && [ "$r" -ge 1 ] && grep -q 'route check' "$TS_LOG"
}

case_a() {
	local j0 j1 l0 l1 s0 s1 u1 out
	config "$TMP/a.json" "{\"tun\": {$V6TUN}}"
	start_case "A: loop without auto_route" "$TMP/a.json" a || return
	if ! inD ip route replace default dev "$TUN" || ! inD ip -6 route replace default dev "$TUN"; then
		not_ok "A: default routes into $TUN" "ip route replace failed"
		ts_stop
		return
	fi
	# The run-time route check sees the change (netlink, 100 ms debounce) and warns.
	if wait_until 20 0.1 loop_risk_seen; then
		ok "A: the run-time route check reports the loop" "routes.loop_risk $(stat_get .routes.loop_risk); $(grep -m1 'route check' "$TS_LOG" | cut -c26-)"
	else
		not_ok "A: the run-time route check reports the loop" "after 2 s routes.loop_risk $(stat_get .routes.loop_risk), log: $(tail -n 1 "$TS_LOG")"
	fi
	j0=$(stats_json)
	if out=$(loop_tcp "$SRV4" 5); then
		ok "A: 5 curls into the loop (v4) each fail in < 1 s" "$out"
	else
		not_ok "A: 5 curls into the loop (v4) each fail in < 1 s" "$out"
	fi
	j1=$(stats_json)
	l0=$(jq -r '.drops.loop // "absent"' <<<"$j0") l1=$(jq -r '.drops.loop // "absent"' <<<"$j1")
	s0=$(jq -r '.sessions.total' <<<"$j0") s1=$(jq -r '.sessions.total' <<<"$j1")
	if is_num "$l0" && is_num "$l1" && is_num "$s0" && is_num "$s1" &&
		[ $((l1 - l0)) -ge 5 ] && [ $((s1 - s0)) -le 5 ]; then
		ok "A: drops.loop counts the loops, sessions stay few" "drops.loop $l0 -> $l1, sessions.total $s0 -> $s1"
	else
		not_ok "A: drops.loop counts the loops, sessions stay few" \
			"drops.loop $l0 -> $l1 (want +5 or more), sessions.total $s0 -> $s1 (want +5 at most)"
	fi
	if out=$(loop_tcp "$SRV6" 2); then
		l0=$l1
		l1=$(stat_get .drops.loop)
		if is_num "$l1" && [ $((l1 - l0)) -ge 2 ]; then
			ok "A: 2 curls into the loop (v6) each fail in < 1 s, counted" "$out; drops.loop $l0 -> $l1"
		else
			not_ok "A: 2 curls into the loop (v6) each fail in < 1 s, counted" "$out; drops.loop $l0 -> $l1 (want +2)"
		fi
	else
		not_ok "A: 2 curls into the loop (v6) each fail in < 1 s, counted" "$out"
		l1=$(stat_get .drops.loop)
	fi
	# Each datagram the proxy sends for the app comes back into the TUN: one loop drop each.
	out=$(udp_into_loop "$SRV4" 3 2>&1)
	sleep 0.2
	j1=$(stats_json)
	vnote "A: after UDP: $(jq -c '{udp, drops, sessions, tun: {rx_packets: .tun.rx_packets}}' <<<"$j1")"
	l0=$l1
	l1=$(jq -r '.drops.loop // "absent"' <<<"$j1") u1=$(jq -r '.udp.sessions // "absent"' <<<"$j1")
	if is_num "$l0" && is_num "$l1" && is_num "$u1" && [ $((l1 - l0)) -ge 6 ] && [ "$u1" -le 3 ]; then
		ok "A: UDP into the loop: dropped and counted, udp.sessions stay few" \
			"$out; drops.loop $l0 -> $l1, udp.sessions $u1"
	else
		not_ok "A: UDP into the loop: dropped and counted, udp.sessions stay few" \
			"$out; drops.loop $l0 -> $l1 (want +6 or more), udp.sessions $u1 (want 3 at most)"
	fi
	if kill -0 "$TS_PID" 2>/dev/null && stats_json >/dev/null; then
		ok "A: the proxy is alive and serves /stats after the loops" \
			"$(stats_json | jq -c '{sessions: .sessions.total, udp: .udp.sessions, loop: .drops.loop, fds}')"
	else
		not_ok "A: the proxy is alive after the loops" "pid $TS_PID gone or /stats silent; log: $(tail -n 2 "$TS_LOG" | tr '\n' ' ')"
	fi
	inD ip route replace default via "$S4" dev "$V_DS"
	inD ip -6 route replace default via "$S6" dev "$V_DS"
	check "A: SIGTERM exits 0" ts_sigterm
	check "A: default routes restored, D as before" same_as_before a
}

# --- B: auto_route captures everything; C(a): SIGTERM leaves D as before ----------------------

# downloads_through D0 N: the downloads since D0 (/stats then) went through the proxy, N files'
# worth: with the system stack's in-kernel fast path on, in fast_path.bytes (the kernel
# rewrote them on the TUN's egress) and tun.tx_bytes together (a connection joins the fast
# path 10 ms after its accept: what came before, all of a download that fast, crossed the
# TUN's userspace path; the namespace suite checks the fast path's share with larger files);
# otherwise in tun.tx_bytes (the proxy wrote them to the TUN), with fast_path.packets 0.
downloads_through() {
	local d0=$1 n=$2 d1 state tx fb fp
	d1=$(stats_json) || { echo "GET /stats failed"; return 1; }
	state=$(jq -r '.fast_path.state' <<<"$d1")
	tx=$(jq -r --argjson b "$d0" '.tun.tx_bytes - $b.tun.tx_bytes' <<<"$d1")
	fb=$(jq -r --argjson b "$d0" '.fast_path.bytes - $b.fast_path.bytes' <<<"$d1")
	fp=$(jq -r '.fast_path.packets' <<<"$d1")
	if ! is_num "$tx" || ! is_num "$fb" || ! is_num "$fp"; then
		echo "tun.tx_bytes +'$tx', fast_path.bytes +'$fb', fast_path.packets '$fp'"
		return 1
	fi
	echo "fast_path.state $state: fast_path.bytes +$((fb >> 20)) MiB," \
		"tun.tx_bytes +$((tx >> 20)) MiB"
	if [ "$state" = on ] && [ $((fb + tx)) -lt $((n * FILE_BYTES)) ]; then
		echo "fast_path.bytes +$fb and tun.tx_bytes +$tx, want +$((n * FILE_BYTES))" \
			"together (fast_path.state on)"
		return 1
	fi
	if [ "$state" != on ] && { [ "$tx" -lt $((n * FILE_BYTES)) ] || [ "$fp" -ne 0 ]; }; then
		echo "tun.tx_bytes +$tx, want +$((n * FILE_BYTES)); fast_path.packets $fp, want 0" \
			"(fast_path.state $state)"
		return 1
	fi
}

case_b() {
	local l0 d0 s0 s1
	config "$TMP/b.json" "{\"tun\": {$V6TUN, $AUTO}}"
	start_case "B: auto_route" "$TMP/b.json" b || return
	check "B: auto_route installed its rules" installed
	snapshot "$TMP/snap.b.running"
	l0=$(stat_get .drops.loop) d0=$(stats_json)
	sessions_delta "B: 20 MiB v4 from D through the proxy" 1 \
		download "$NS_D" "http://$SRV4:$P_HTTP/file.bin" "$FILE_SHA"
	sessions_delta "B: 20 MiB v6 from D through the proxy" 1 \
		download "$NS_D" "http://[$SRV6]:$P_HTTP/file.bin" "$FILE_SHA"
	sessions_delta "B: 20 MiB v4 from L (forwarded by D) through the proxy" 1 \
		download "$NS_L" "http://$SRV4:$P_HTTP/file.bin" "$FILE_SHA"
	sessions_delta "B: 20 connections to the TCP echo, each counted once" 20 \
		inD "${TSNET[@]}" echo-many --host "$SRV4" --port "$P_ECHO" -n 20 --timeout 10
	check "B: the downloads went through the proxy" downloads_through "${d0:-null}" 3
	check "B: UDP echo v4 through the proxy" inD "${TSNET[@]}" udp-echo --host "$SRV4" --port "$P_ECHO" --timeout 2
	check "B: UDP echo v6 through the proxy" inD "${TSNET[@]}" udp-echo --host "$SRV6" --port "$P_ECHO" --timeout 2
	s1=$(stat_get .udp.sessions)
	if is_num "$s1" && [ "$s1" -ge 1 ]; then
		ok "B: the UDP echoes were proxied" "udp.sessions $s1"
	else
		not_ok "B: the UDP echoes were proxied" "udp.sessions '$s1' right after two echo clients"
	fi
	if [ "$(stat_get .drops.loop)" = "$l0" ]; then
		ok "B: nothing looped" "drops.loop $l0"
	else
		not_ok "B: nothing looped" "drops.loop $l0 -> $(stat_get .drops.loop)"
	fi
	sessions_delta "B: the uplink gateway $S4 stays outside (automatic exclusion)" 0 \
		fetch "$NS_D" "http://$S4:$P_HTTP/small.txt"
	sessions_delta "B: on-link $S4B stays outside (non-strict: connected routes win)" 0 \
		fetch "$NS_D" "http://$S4B:$P_HTTP/small.txt"
	case_c_second
	check "C: SIGTERM of the auto_route proxy exits 0" ts_sigterm
	check "C: after SIGTERM, D as before" same_as_before c-sigterm
}

# C: a second auto_route proxy in the same namespace is refused and the first one's rules stay.
case_c_second() {
	local pid rc err i
	config "$TMP/c2.json" "{\"tun\": {\"name\": \"tsdu$TOK\", $AUTO}, \"stats\": {\"listen\": \"127.0.0.1:$P_STATS2\"}}"
	: >"$TMP/ready.c2"
	ip netns exec "$NS_D" "$BIN" run --config "$TMP/c2.json" --ready-fd 3 \
		3>"$TMP/ready.c2" </dev/null >"$TMP/c2.out" 2>&1 &
	pid=$!
	PIDS+=("$pid")
	for ((i = 0; i < 100; i++)); do
		[ -s "$TMP/ready.c2" ] && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	if [ -s "$TMP/ready.c2" ] || kill -0 "$pid" 2>/dev/null; then
		stop_pid "$pid" 2
		not_ok "C: a second auto_route proxy in D is refused" "it started; log: $(tail -n 1 "$TMP/c2.out")"
	else
		wait "$pid"
		rc=$?
		err=$(tail -n 2 "$TMP/c2.out" | tr '\n' ' ')
		if [ "$rc" -ne 0 ] && grep -qi 'another twinstack' "$TMP/c2.out"; then
			ok "C: a second auto_route proxy in D is refused" "exit $rc: $err"
		else
			not_ok "C: a second auto_route proxy in D is refused" "exit $rc: $err"
		fi
	fi
	snapshot "$TMP/snap.b.after2"
	if diff -q "$TMP/snap.b.running" "$TMP/snap.b.after2" >/dev/null; then
		ok "C: the refused start left the running proxy's rules alone"
	else
		not_ok "C: the refused start left the running proxy's rules alone" \
			"$(diff "$TMP/snap.b.running" "$TMP/snap.b.after2" | grep '^[<>]' | head -n 4 | tr '\n' ';')"
	fi
}

# --- C: cleanup after a failed start and after SIGKILL -----------------------------------------

case_c() {
	local rc blocker n mon
	# A failed start after the rules are in: stats.listen on a port already taken.
	spawn "$NS_D" "$TMP/busy.log" "$PY" -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); time.sleep(60)' "$P_BUSY"
	blocker=$SPAWNED
	if wait_listen "$NS_D" tcp "$P_BUSY" 50; then
		config "$TMP/c-busy.json" "{\"tun\": {$V6TUN, $AUTO}, \"stats\": {\"listen\": \"127.0.0.1:$P_BUSY\"}}"
		# The rule changes during the start: proof that it failed after installing something.
		spawn "$NS_D" "$TMP/c-busy.monitor" ip monitor rule
		mon=$SPAWNED
		sleep 0.2
		: >"$TMP/ready.busy"
		timeout -k 1 10 ip netns exec "$NS_D" "$BIN" run --config "$TMP/c-busy.json" --ready-fd 3 \
			3>"$TMP/ready.busy" </dev/null >"$TMP/c-busy.out" 2>&1
		rc=$?
		sleep 0.2
		stop_pid "$mon" 1
		n=$(grep "proto $RULE_PROTO" "$TMP/c-busy.monitor" | grep -vc '^Deleted')
		if [ "$n" -gt 0 ]; then
			ok "C: the failing start installed rules before it failed" "$n rules added, $(grep -c '^Deleted' "$TMP/c-busy.monitor") deleted"
		else
			not_ok "C: the failing start installed rules before it failed" "ip monitor rule saw no rule with proto $RULE_PROTO added"
		fi
		if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ ! -s "$TMP/ready.busy" ]; then
			ok "C: start with stats.listen on a busy port fails" "exit $rc: $(tail -n 1 "$TMP/c-busy.out")"
		else
			not_ok "C: start with stats.listen on a busy port fails" "exit $rc: $(tail -n 2 "$TMP/c-busy.out" | tr '\n' ' ')"
		fi
		wait_tun_gone
		check "C: after the failed start, D as before" same_as_before c-failed
	else
		not_ok "C: failed start" "could not occupy 127.0.0.1:$P_BUSY in D"
	fi
	stop_pid "$blocker" 1

	# SIGKILL leaves the rules; the next start cleans them and its SIGTERM leaves D as before.
	config "$TMP/c-kill.json" "{\"tun\": {$V6TUN, $AUTO}}"
	start_case "C: SIGKILL" "$TMP/c-kill.json" c-kill || return
	check "C: (before SIGKILL) auto_route installed its rules" installed
	kill -KILL "$TS_PID"
	wait "$TS_PID" 2>/dev/null
	TS_PID=
	wait_tun_gone
	n=$(ours | wc -l)
	note "C: after SIGKILL $n tagged rules are left behind (the next start removes them)"
	if start_case "C: start after SIGKILL" "$TMP/c-kill.json" c-kill2; then
		ok "C: a start after SIGKILL succeeds" "pid $TS_PID"
		sessions_delta "C: the new instance captures" 1 fetch "$NS_D" "http://$SRV4:$P_HTTP/small.txt"
		check "C: SIGTERM of the new instance exits 0" ts_sigterm
		check "C: after SIGKILL + start + SIGTERM, D as before" same_as_before c-kill
	fi
}

# --- D: exclusions ---------------------------------------------------------------------------

case_d() {
	config "$TMP/d.json" "{\"tun\": {$V6TUN, $AUTO, \"exclude_uid\": [$NOBODY],
		\"exclude_interface\": [\"$V_DL\"], \"route_exclude_address\": [\"$EXC4/32\", \"$EXC6/128\"]}}"
	start_case "D: exclusions" "$TMP/d.json" d || return
	sessions_delta "D: root's connection is captured" 1 fetch "$NS_D" "http://$SRV4:$P_HTTP/small.txt"
	sessions_delta "D: exclude_uid: nobody's connection is not captured, still reaches S" 0 \
		fetch "$NS_D" "http://$SRV4:$P_HTTP/small.txt" \
		setpriv --reuid="$NOBODY" --regid="$NOGROUP" --clear-groups
	sessions_delta "D: exclude_interface: L's connection (via $V_DL) is not captured, still reaches S" 0 \
		fetch "$NS_L" "http://$SRV4:$P_HTTP/small.txt"
	sessions_delta "D: route_exclude_address: $EXC4 is not captured, still reachable" 0 \
		fetch "$NS_D" "http://$EXC4:$P_HTTP/small.txt"
	sessions_delta "D: route_exclude_address: $EXC6 is not captured, still reachable" 0 \
		fetch "$NS_D" "http://[$EXC6]:$P_HTTP/small.txt"
	check "D: SIGTERM exits 0" ts_sigterm
	check "D: after SIGTERM, D as before" same_as_before d
}

# --- E: strict_route with an IPv4-only TUN ---------------------------------------------------

# v6_fails: an IPv6 connection to the server must fail (quickly) instead of using the uplink.
v6_fails() {
	local t0 rc ms
	t0=$(date +%s%N)
	inD curl -s --connect-timeout 2 --max-time 3 -o /dev/null "http://[$SRV6]:$P_HTTP/small.txt"
	rc=$?
	ms=$(elapsed_ms "$t0")
	[ "$rc" -ne 0 ] && { echo "curl exit $rc after ${ms} ms"; return 0; }
	echo "curl succeeded: IPv6 leaked past strict_route by the uplink"
	return 1
}

rpf_loose() {
	local v
	v=$(inD sysctl -n "net.ipv4.conf.$TUN.rp_filter")
	[ "$v" = 2 ] || { echo "net.ipv4.conf.$TUN.rp_filter is '$v'"; return 1; }
	grep -q "$V_DS.*rp_filter" "$TS_LOG" || { echo "rp_filter 2, but no warning naming $V_DS"; return 1; }
	echo "rp_filter 2; $(grep -m1 "$V_DS.*rp_filter" "$TS_LOG" | cut -c26-)"
}

case_e() {
	config "$TMP/e.json" "{\"tun\": {$AUTO, \"strict_route\": true}}"
	if start_case "E: strict_route, IPv4-only TUN" "$TMP/e.json" e; then
		check "E: strict_route: IPv6 to [$SRV6] does not go out by the uplink" v6_fails
		sessions_delta "E: strict_route: IPv4 still captured" 1 fetch "$NS_D" "http://$SRV4:$P_HTTP/small.txt"
		sessions_delta "E: strict_route: on-link $S4B captured too" 1 fetch "$NS_D" "http://$S4B:$P_HTTP/small.txt"
		check "E: strict_route: SIGTERM exits 0" ts_sigterm
		check "E: strict_route: after SIGTERM, D as before" same_as_before e
	fi
	# Strict reverse-path filtering in D (all.rp_filter 1): the TUN is set to loose (2) while
	# strict_route runs, and the uplink's strict setting is warned about. Run as nobody: the
	# sysctl writes at start and exit need to work with the reduced privileges too.
	inD sysctl -qw net.ipv4.conf.all.rp_filter=1 >/dev/null
	config "$TMP/e-rpf.json" "{\"user\": \"nobody\", \"tun\": {$AUTO, \"strict_route\": true}}"
	if start_case "E: strict_route with all.rp_filter 1" "$TMP/e-rpf.json" e-rpf; then
		check "E: strict_route, all.rp_filter 1: the TUN's rp_filter is 2 (loose), the uplink warned about" rpf_loose
		check "E: strict_route, all.rp_filter 1: SIGTERM exits 0" ts_sigterm
	fi
	inD sysctl -qw net.ipv4.conf.all.rp_filter=0 >/dev/null
	check "E: strict_route, all.rp_filter 1 (put back): D as before" same_as_before e-rpf
	config "$TMP/e0.json" "{\"tun\": {$AUTO}}"
	if start_case "E: control (auto_route only, IPv4-only TUN)" "$TMP/e0.json" e0; then
		sessions_delta "E: control: IPv6 reaches [$SRV6] by the uplink, not captured" 0 \
			fetch "$NS_D" "http://[$SRV6]:$P_HTTP/small.txt"
		sessions_delta "E: control: IPv4 captured" 1 fetch "$NS_D" "http://$SRV4:$P_HTTP/small.txt"
		check "E: control: SIGTERM exits 0" ts_sigterm
	fi
}

# --- F: a rule deleted by hand comes back ----------------------------------------------------

case_f() {
	local line prio n0 n t0 ms back=0 i
	config "$TMP/f.json" "{\"tun\": {$V6TUN, $AUTO}}"
	start_case "F: rule repair" "$TMP/f.json" f || return
	line=$(inD ip -4 rule | grep "proto $RULE_PROTO" | grep -v 'fwmark\|nop\|goto' | tail -n 1)
	[ -n "$line" ] || line=$(inD ip -4 rule | grep "proto $RULE_PROTO" | head -n 1)
	if [ -z "$line" ]; then
		not_ok "F: a deleted rule is re-installed within 1 s" "no rule with proto $RULE_PROTO to delete"
		ts_stop
		return
	fi
	prio=${line%%:*}
	n0=$(inD ip -4 rule list priority "$prio" | grep -c "proto $RULE_PROTO")
	inD ip -4 rule del priority "$prio"
	t0=$(date +%s%N)
	for ((i = 0; i < 10; i++)); do
		sleep 0.1
		n=$(inD ip -4 rule list priority "$prio" | grep -c "proto $RULE_PROTO")
		[ "$n" -ge "$n0" ] && { back=1; break; }
	done
	ms=$(elapsed_ms "$t0")
	if [ "$back" -eq 1 ]; then
		ok "F: a deleted rule is re-installed within 1 s" "'$line' deleted, back after ~${ms} ms"
	else
		not_ok "F: a deleted rule is re-installed within 1 s" "'$line' deleted, not back after ${ms} ms"
	fi
	if grep -qi 're-install' "$TS_LOG"; then
		ok "F: the log mentions the re-install" "$(grep -i 're-install' "$TS_LOG" | head -n 1)"
	else
		not_ok "F: the log mentions the re-install" "no 're-install' line; last: $(tail -n 1 "$TS_LOG")"
	fi
	sessions_delta "F: still captured after the repair" 1 fetch "$NS_D" "http://$SRV4:$P_HTTP/small.txt"
	check "F: SIGTERM exits 0" ts_sigterm
	check "F: after SIGTERM, D as before" same_as_before f
}

# --- G: SIGHUP reload ------------------------------------------------------------------------

# log_has PATTERN: the proxy's log has a line matching PATTERN (extended, any case).
log_has() { grep -qiE "$1" "$TS_LOG"; }

case_g() {
	local dl g0 g1 g2 rc line a
	config "$TMP/g.json" "{\"tun\": {$V6TUN, $AUTO},
		\"outbounds\": [{\"tag\": \"direct\", \"type\": \"direct\"}, {\"tag\": \"block\", \"type\": \"reject\"}],
		\"route\": {\"final\": \"direct\"}}"
	start_case "G: reload" "$TMP/g.json" g || return
	g0=$(stat_get .config.generation)
	# The download runs (rate-limited to ~3 s) across both reloads.
	inD curl -sS --fail --max-time 20 --limit-rate 35M -o - "http://$SRV4:$P_HTTP/big.bin" \
		2>"$TMP/g-curl.err" | sha256sum >"$TMP/g.sha" &
	dl=$!
	PIDS+=("$dl")
	sleep 0.5
	a=$(stat_get .sessions.active)
	if is_num "$a" && [ "$a" -ge 1 ]; then
		ok "G: the 100 MiB download runs through the proxy" "sessions.active $a"
	else
		not_ok "G: the 100 MiB download runs through the proxy" "sessions.active '$a'"
	fi
	config "$TMP/g.json" "{\"tun\": {$V6TUN, $AUTO},
		\"outbounds\": [{\"tag\": \"direct\", \"type\": \"direct\"}, {\"tag\": \"block\", \"type\": \"reject\"}],
		\"route\": {\"rules\": [{\"cidr\": [\"$SRV4/32\"], \"port\": [$P_HTTP], \"outbound\": \"block\"}],
		            \"final\": \"direct\"}}"
	# Without a handler SIGHUP kills it: the shell's "Hangup" job notice is not wanted. Each
	# reload ends with one result line ("configuration N in use" or "refused"): waited for by
	# count, not by any line naming a reload (the request's own comes before the result).
	r0=$(reload_results)
	{
		kill -HUP "$TS_PID"
		wait_until 20 0.1 eval '[ "$(reload_results)" -gt "$r0" ]'
		kill -0 "$TS_PID" || wait "$TS_PID"
	} 2>/dev/null
	rc=$?
	if ! kill -0 "$TS_PID" 2>/dev/null; then
		not_ok "G: SIGHUP reloads the config" "SIGHUP ended the proxy (exit $rc): no reload handler; log: $(tail -n 1 "$TS_LOG")"
		TS_PID=
		wait "$dl" 2>/dev/null
		wait_tun_gone
		return
	fi
	g1=$(stat_get .config.generation)
	line=$(grep -E 'reload: (configuration [0-9]+ in use|refused)' "$TS_LOG" | tail -n 1)
	if [[ "$line" == *"in use"* ]] && is_num "$g0" && is_num "$g1" && [ "$g1" -gt "$g0" ]; then
		ok "G: SIGHUP reloads the config" "config.generation $g0 -> $g1; $line"
	else
		not_ok "G: SIGHUP reloads the config" "config.generation $g0 -> $g1; log: ${line:-no reload line}"
	fi
	check "G: after the reload a new connection to :$P_HTTP is rejected within 1 s" \
		inD "${TSNET[@]}" rst --host "$SRV4" --port "$P_HTTP" --within 1
	check "G: other traffic still goes direct after the reload" \
		inD "${TSNET[@]}" echo-many --host "$SRV4" --port "$P_ECHO" -n 3 --timeout 5
	printf '{ "stack": "%s", "tun": { "auto_route": tru\n' "$STACK" >"$TMP/g.json"
	r0=$(reload_results)
	kill -HUP "$TS_PID"
	wait_until 20 0.1 eval '[ "$(reload_results)" -gt "$r0" ] || ! kill -0 "$TS_PID" 2>/dev/null'
	if ! kill -0 "$TS_PID" 2>/dev/null; then
		not_ok "G: a broken config on SIGHUP is refused" "the proxy exited"
		TS_PID=
	else
		g2=$(stat_get .config.generation)
		line=$(grep -E 'reload: (configuration [0-9]+ in use|refused)' "$TS_LOG" | tail -n 1)
		if is_num "$g1" && [ "$g2" = "$g1" ] && [[ "$line" == *"reload: refused"* ]] &&
			[ "$(stat_get .reload.last_result)" = refused ]; then
			ok "G: a broken config on SIGHUP is refused" "config.generation stays $g2; $line; reload.last_result $(stat_get .reload.last_result)"
		else
			not_ok "G: a broken config on SIGHUP is refused" "config.generation $g1 -> $g2; last reload line: ${line:-none}"
		fi
		check "G: after the refused reload the rule still rejects" \
			inD "${TSNET[@]}" rst --host "$SRV4" --port "$P_HTTP" --within 1
		check "G: after the refused reload other traffic still flows" \
			inD "${TSNET[@]}" echo-many --host "$SRV4" --port "$P_ECHO" -n 3 --timeout 5
	fi
	wait "$dl"
	rc=$?
	if [ "$rc" -eq 0 ] && [ "$(cut -d' ' -f1 "$TMP/g.sha")" = "$BIG_SHA" ]; then
		ok "G: the 100 MiB download started before the reloads completes intact" "sha256 equal"
	else
		not_ok "G: the 100 MiB download started before the reloads completes intact" \
			"curl exit $rc: $(head -c 150 "$TMP/g-curl.err"); sha256 $(cut -c1-16 "$TMP/g.sha")..."
	fi
	[ -n "$TS_PID" ] && check "G: SIGTERM exits 0" ts_sigterm
	wait_tun_gone
}

# --- H: least privilege ----------------------------------------------------------------------

# caps WANT_UID: every thread of TS_PID has CapEff 0x3000 (NET_ADMIN|NET_RAW) and uid WANT_UID.
caps() {
	local want=$1 t eff uid bad=() n=0
	for t in /proc/"$TS_PID"/task/*; do
		n=$((n + 1))
		eff=$(awk '/^CapEff:/ { print $2 }' "$t/status")
		uid=$(awk '/^Uid:/ { print $2 "/" $3 "/" $4 "/" $5 }' "$t/status")
		[ "$eff" = 0000000000003000 ] || bad+=("task ${t##*/} CapEff $eff")
		[ "$uid" = "$want/$want/$want/$want" ] || bad+=("task ${t##*/} Uid $uid")
	done
	if [ ${#bad[@]} -eq 0 ] && [ "$n" -gt 0 ]; then
		echo "$n threads: CapEff 0000000000003000, uid $want; $(grep -E '^(CapPrm|CapBnd|NoNewPrivs)' /proc/"$TS_PID"/status | tr -s '\t\n' '  ')"
		return 0
	fi
	echo "${bad[*]:0:4}"
	return 1
}

case_h() {
	config "$TMP/h-user.json" "{\"user\": \"nobody\", \"tun\": {$V6TUN, $AUTO}}"
	if start_case "H: \"user\": \"nobody\"" "$TMP/h-user.json" h-user; then
		check "H: with \"user\": \"nobody\": capabilities and uid" caps "$NOBODY"
		sessions_delta "H: with \"user\": \"nobody\": 20 MiB still flow" 1 \
			download "$NS_D" "http://$SRV4:$P_HTTP/file.bin" "$FILE_SHA"
		check "H: with \"user\": \"nobody\": SIGTERM exits 0" ts_sigterm
		check "H: with \"user\": \"nobody\": after SIGTERM, D as before" same_as_before h-user
	fi
	config "$TMP/h-root.json" "{\"tun\": {$V6TUN, $AUTO}}"
	if start_case "H: without \"user\"" "$TMP/h-root.json" h-root; then
		check "H: without \"user\": capabilities reduced, uid 0" caps 0
		sessions_delta "H: without \"user\": 20 MiB still flow" 1 \
			download "$NS_D" "http://$SRV4:$P_HTTP/file.bin" "$FILE_SHA"
		check "H: without \"user\": SIGTERM exits 0" ts_sigterm
	fi
}

# --- I: the TUN deleted under a download -----------------------------------------------------

case_i() {
	local dl t0 i ms rc a
	config "$TMP/i.json" "{\"tun\": {$V6TUN, $AUTO}}"
	start_case "I: TUN deleted" "$TMP/i.json" i || return
	inD curl -s --max-time 10 --limit-rate 20M -o /dev/null "http://$SRV4:$P_HTTP/big.bin" &
	dl=$!
	PIDS+=("$dl")
	sleep 0.5
	a=$(stat_get .sessions.active)
	if is_num "$a" && [ "$a" -ge 1 ]; then
		ok "I: the download runs through the proxy" "sessions.active $a"
	else
		not_ok "I: the download runs through the proxy" "sessions.active '$a'"
	fi
	inD ip link del "$TUN"
	t0=$(date +%s%N)
	for ((i = 0; i < 60; i++)); do
		kill -0 "$TS_PID" 2>/dev/null || break
		sleep 0.05
	done
	ms=$(elapsed_ms "$t0")
	if kill -0 "$TS_PID" 2>/dev/null; then
		not_ok "I: ip link del $TUN under a download: exit 1 within 1 s" "still running after ${ms} ms"
		ts_stop
	else
		wait "$TS_PID"
		rc=$?
		TS_PID=
		if [ "$rc" -eq 1 ] && [ "$ms" -le 1000 ]; then
			ok "I: ip link del $TUN under a download: exit 1 within 1 s" "exit 1 after ${ms} ms; $(tail -n 1 "$TS_LOG")"
		else
			not_ok "I: ip link del $TUN under a download: exit 1 within 1 s" "exit $rc after ${ms} ms; $(tail -n 1 "$TS_LOG")"
		fi
	fi
	stop_pid "$dl" 1
	check "I: after the exit, D as before" same_as_before i
}

# A and I need no auto_route: they run first.
for c in A I B C D E F G H; do
	[[ "${ONLY^^}" == *$c* ]] && "case_${c,,}"
done

note "elapsed $(($(elapsed_ms "$T_START") / 1000)) s"
if [ "$SKIPPED" -gt 0 ]; then
	echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
else
	echo "$PASSED passed, $FAILED failed"
fi
[ "$FAILED" -eq 0 ]
