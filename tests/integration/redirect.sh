#!/usr/bin/env bash
# redirect.sh — `twinstack redirect` end to end: nftables redirects the client namespace's
# connections to the server subnet to the proxy's listener, which relays them from sockets
# marked with --mark (exempted by the rule set) to where they were going.
#
#   ns C (client): clients, twinstack redirect          ns S (server)
#   table inet tsredir<TOK>, hook output:               socat/python servers
#     meta mark MARK return                             :8001 32 MiB download
#     10.203.0.0/24 and fd03::/64, tcp dport            :8002 sha256 of the upload, after its EOF
#       {8001-8003, 5201} -> redirect to :15001         :8003 echo, "done" after the EOF
#   listener 127.0.0.1:15001 and [::1]:15001            :5201 iperf3 -s;  :8009 nothing
#   /stats 127.0.0.1:9194
#   vCS 10.203.0.1/24 fd03::1/64 --------------------- vSC 10.203.0.2/24 fd03::2/64
#
# Checked, each by bytes (sha256 compared) and by the counters moving by exact amounts:
# a 32 MiB download and upload over IPv4, a download over IPv6 where the testbed has it,
# half-close, 200 sequential short connections, a closed port (the client gets a RST at once),
# a client connecting to the listener itself (refused: loop_refused), one connection accepted
# per client connection (the marked outbound is not redirected again), a second proxy on the
# same port (exit 1), the copy relay, SIGTERM (exit 0, the counters as JSON on stdout, an open
# connection reset), with --socks5 the same relay through microsocks (a download, and a reset
# while no server listens), the UDP forwarder (--udp-listen(6)/--udp-to: an echo run whose every
# datagram is matched, the forwarder's counters equal to the client's; 200 flows each
# answered and each its own flow, then ended by the idle time with their descriptors given
# back; its usage errors exit 2), no sanitizer report, the
# namespaces and rule set gone after cleanup.
# iperf3 -t 2 through the proxy is printed (no threshold).
#
# usage: redirect.sh [--bin PATH] [--keep] [-v]
# Output: 'ok - NAME' / 'not ok - NAME: REASON' lines, then 'N passed, N failed'.
# Exit: 0 all passed, 77 skipped (not root, no nft), 1 otherwise.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"
SUITE_NO_STACK=1 suite_args redirect -- "$@"

if [ "$(id -u)" -ne 0 ]; then echo "# SKIP: needs root"; exit 77; fi
if ! command -v nft >/dev/null 2>&1; then
	echo "# SKIP: no nft (Debian package nftables)"
	exit 77
fi
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
for t in ip ss curl jq socat iperf3 sha256sum timeout "$PY"; do
	command -v "$t" >/dev/null 2>&1 ||
		{ echo "not ok - prerequisites: no $t"; echo "0 passed, 1 failed"; exit 1; }
done

TOK=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
TMP=$(mktemp -d "${TMPDIR:-/tmp}/twinstack-redirect.XXXXXX")
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
NS_C=tsrC-$TOK NS_S=tsrS-$TOK V_CS=tsrcs$TOK V_SC=tsrsc$TOK TABLE=tsredir$TOK
SRV4=10.203.0.2 SRV6=fd03::2 PORT=15001 P_STATS=9194 MARK=0x1a3 MIB32=33554432
inC() { ip netns exec "$NS_C" "$@"; }
inD() { inC "$@"; } # lib.sh's stats() asks inside the proxy's namespace
# expect_all BEFORE AFTER KEY N [KEY N]...: every dotted KEY grew by exactly its N (one jq for
# them all; a key missing from either document fails as "invalid").
expect_all() {
	local b=$1 a=$2 keys=() wants=() got i out=""
	shift 2
	while [ $# -gt 1 ]; do keys+=("$1"); wants+=("$2"); shift 2; done
	got=$(jq -rn --argjson b "$b" --argjson a "$a" '$ARGS.positional[] | split(".") as $p |
		[($b | getpath($p)), ($a | getpath($p))] |
		if (.[0] | type) == "number" and (.[1] | type) == "number" then .[1] - .[0]
		else "invalid" end' --args "${keys[@]}" 2>/dev/null) || { echo "not JSON"; return 1; }
	mapfile -t got <<<"$got"
	for i in "${!keys[@]}"; do
		out="$out ${keys[$i]}+${got[$i]:-invalid}"
		[ "${got[$i]:-}" = "${wants[$i]}" ] ||
			{ echo "${keys[$i]} grew by ${got[$i]:-invalid}, want ${wants[$i]};$out"; return 1; }
	done
	echo "${out# }"
}

T0=$(date +%s%N)
note "redirect: token=$TOK bin=$BIN"

# --- the testbed ------------------------------------------------------------------------------
netns_add "$NS_C" && netns_add "$NS_S" || { not_ok setup "namespaces"; exit 1; }
ip link add "$V_CS" netns "$NS_C" type veth peer name "$V_SC" netns "$NS_S"
ip -n "$NS_C" addr add 10.203.0.1/24 dev "$V_CS"
ip -n "$NS_S" addr add "$SRV4/24" dev "$V_SC"
HAS6=0
if [ -e /proc/net/if_inet6 ] &&
	ip -n "$NS_C" -6 addr add fd03::1/64 dev "$V_CS" nodad 2>/dev/null &&
	ip -n "$NS_S" -6 addr add "$SRV6/64" dev "$V_SC" nodad 2>/dev/null; then
	HAS6=1
fi
ip -n "$NS_C" link set "$V_CS" up
ip -n "$NS_S" link set "$V_SC" up

inC nft -f - <<EOF || { not_ok setup "nft rule set"; exit 1; }
table inet $TABLE {
	chain out {
		type nat hook output priority -100; policy accept;
		meta mark $MARK return
		ip daddr 10.203.0.0/24 tcp dport { 8001-8003, 8009, 5201 } redirect to :$PORT
		ip6 daddr fd03::/64 tcp dport { 8001-8003, 8009, 5201 } redirect to :$PORT
		ip daddr 10.203.0.0/24 udp dport 7007 redirect to :$PORT
		ip6 daddr fd03::/64 udp dport 7007 redirect to :$PORT
	}
}
EOF

# UDP conntrack entries of 1 s in C: a client socket of a later check that happens to get the
# source port of an earlier flow's socket must not inherit that flow's entry (a marked
# forwarder socket's entry is not redirected, so its datagrams would go straight to the server).
inC sysctl -qw net.netfilter.nf_conntrack_udp_timeout=1 \
	net.netfilter.nf_conntrack_udp_timeout_stream=1 ||
	{ not_ok setup "conntrack UDP timeouts"; exit 1; }

head -c "$MIB32" /dev/urandom >"$TMP/blob"
BLOB_SHA=$(sha256sum <"$TMP/blob" | cut -d' ' -f1)

# Servers, each on both families where there are two.
srv_any() {
	if [ "$HAS6" -eq 1 ]; then echo "TCP6-LISTEN:$1,ipv6only=0"; else echo "TCP4-LISTEN:$1"; fi
}
spawn "$NS_S" "$TMP/dl.log" socat -U "$(srv_any 8001),reuseaddr,fork" "OPEN:$TMP/blob,rdonly"
spawn "$NS_S" "$TMP/up.log" socat "$(srv_any 8002),reuseaddr,fork" SYSTEM:sha256sum
cat >"$TMP/echo.py" <<'EOF'
# Echo everything until the client's EOF, then "done\n" and close: the reply that follows
# the EOF is what a half-close must let through.
import socket, socketserver, sys
class H(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            b = self.request.recv(65536)
            if not b:
                break
            self.request.sendall(b)
        self.request.sendall(b"done\n")
class S(socketserver.ThreadingMixIn, socketserver.TCPServer):
    address_family = socket.AF_INET6 if sys.argv[1] == "6" else socket.AF_INET
    allow_reuse_address = True
    daemon_threads = True
    def server_bind(self):
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()
S(("::" if sys.argv[1] == "6" else "0.0.0.0", 8003), H).serve_forever()
EOF
spawn "$NS_S" "$TMP/echo.log" "$PY" "$TMP/echo.py" "$([ "$HAS6" -eq 1 ] && echo 6 || echo 4)"
spawn "$NS_S" "$TMP/iperf3.log" iperf3 -s -p 5201
spawn "$NS_S" "$TMP/udpserve.log" "$BIN" load serve --bind "$SRV4" --tcp-ports 7008 --udp-port 7007
UDPSERVE=$SPAWNED
# listening NS PORT...: every PORT has a TCP listener in NS (one ss for them all).
listening() {
	local ns=$1 p have
	shift
	have=$(ip netns exec "$ns" ss -ltnH 2>/dev/null | awk '{ sub(/.*:/, "", $4); print $4 }')
	for p in "$@"; do grep -qx "$p" <<<"$have" || return 1; done
}
wait_until 100 0.1 listening "$NS_S" 8001 8002 8003 5201 7008 ||
	{ not_ok setup "servers not listening"; exit 1; }

# The proxy: stdout (the JSON on exit) and stderr apart.
start_proxy() { # RELAY [--stats ADDR:PORT]
	local relay=$1 six=()
	shift
	[ "$HAS6" -eq 1 ] && six=(--listen6 ":$PORT")
	ip netns exec "$NS_C" "$BIN" redirect --listen ":$PORT" "${six[@]}" --mark "$MARK" \
		--relay "$relay" "$@" </dev/null >"$TMP/proxy.out" 2>>"$TMP/proxy.err" &
	PROXY=$!
	PIDS+=("$PROXY")
	wait_until 100 0.1 listening "$NS_C" "$PORT" ${1:+"$P_STATS"}
}
# stop_proxy: SIGTERM; sets PROXY_RC (124: did not exit within 5 s).
stop_proxy() {
	local i
	kill -TERM "$PROXY" 2>/dev/null
	for ((i = 0; i < 50; i++)); do kill -0 "$PROXY" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$PROXY" 2>/dev/null; then
		kill -KILL "$PROXY"
		wait "$PROXY" 2>/dev/null
		PROXY_RC=124
	else
		wait "$PROXY"
		PROXY_RC=$?
	fi
}
check "proxy starts (splice relay)" start_proxy splice --stats "127.0.0.1:$P_STATS" ||
	{ sed 's/^/# /' "$TMP/proxy.err"; exit 1; }
port_taken() {
	local rc
	inC timeout 5 "$BIN" redirect --listen ":$PORT" --mark "$MARK" >/dev/null 2>"$TMP/taken.err"
	rc=$?
	echo "exit $rc: $(tail -n 1 "$TMP/taken.err")"
	[ "$rc" -eq 1 ] && grep -q "Address already in use" "$TMP/taken.err"
}
check "a second proxy on the same port: exit 1, the reason named" port_taken
note "testbed up in $(elapsed_ms "$T0") ms (IPv6: $([ "$HAS6" -eq 1 ] && echo yes || echo no))"

# --- transfers -------------------------------------------------------------------------------
download() { # HOST -> sha256 of 32 MiB from :8001
	local v=4 h=$1
	case $h in *:*) v=6 h="[$h]" ;; esac
	inC timeout 20 socat -u "TCP$v:$h:8001" - | sha256sum | cut -d' ' -f1
}
upload() { # HOST -> the server's sha256 of our 32 MiB; the answer comes after our EOF
	local v=4 h=$1
	case $h in *:*) v=6 h="[$h]" ;; esac
	inC timeout 20 socat -t 15 - "TCP$v:$h:8002" <"$TMP/blob" | cut -d' ' -f1
}
# transfer NAME DIR HOST: one 32 MiB transfer through the proxy, hash and counters.
transfer() {
	local dir=$1 host=$2 b a got t0 ms
	b=$(stats) || { echo "no /stats"; return 1; }
	t0=$(date +%s%N)
	if [ "$dir" = down ]; then got=$(download "$host"); else got=$(upload "$host"); fi
	ms=$(elapsed_ms "$t0")
	[ "$got" = "$BLOB_SHA" ] || { echo "sha256 ${got:0:16}, want ${BLOB_SHA:0:16}"; return 1; }
	a=$(stats) || { echo "no /stats"; return 1; }
	if [ "$dir" = down ]; then
		expect_all "$b" "$a" redirect.accepted 1 sessions.total 1 relay.bytes_down "$MIB32" \
			relay.bytes_up 0 redirect.loop_refused 0 || return 1
	else
		# sha256sum answers 64 hex digits, two spaces, "-", a newline.
		expect_all "$b" "$a" redirect.accepted 1 sessions.total 1 relay.bytes_up "$MIB32" \
			relay.bytes_down 68 redirect.loop_refused 0 || return 1
	fi
	echo "sha256 equal, $ms ms, one connection accepted, bytes exact"
}
check "32 MiB download IPv4 (sha256, accepted +1, bytes_down exact)" transfer down "$SRV4"
check "32 MiB upload IPv4 + half-close (server's sha256 after our EOF)" transfer up "$SRV4"
if [ "$HAS6" -eq 1 ]; then
	check "32 MiB download IPv6" transfer down "$SRV6"
else
	skip "IPv6 transfer" "no IPv6 in this testbed"
fi
splice_used() {
	local s
	s=$(stats) || return 1
	jq -r '.relay | "splice_bytes \(.splice_bytes), copy_bytes \(.copy_bytes)"' <<<"$s"
	# Each transfer's 32 MiB went through pipes.
	jq -e --argjson m "$MIB32" --argjson n $((2 + HAS6)) \
		'.relay.splice_bytes >= $n * $m and .relay.copy_bytes == 0' <<<"$s" >/dev/null
}
check "splice relay carried the transfers" splice_used

# --- half-close, many connections, refusals ----------------------------------------------------
cat >"$TMP/client.py" <<'EOF'
# client.py MODE HOST PORT [N]
#   echo:   N connections one after the other: send a line, shut the write side, expect the
#           line echoed and "done\n" (sent by the server only after our EOF), then EOF.
#   hold:   one line echoed, then expect a reset (the proxy stopping) within 10 s.
#   reset:  connect and read: expect a reset (or a refused connect) within 2 s; prints ms.
import socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
fam = socket.AF_INET6 if ":" in host else socket.AF_INET
def echo(i):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect((host, port))
    msg = b"ping %d\n" % i
    s.sendall(msg)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    if got != msg + b"done\n":
        sys.exit("connection %d: got %r" % (i, got))
if mode == "echo":
    n = int(sys.argv[4])
    t0 = time.monotonic()
    for i in range(n):
        echo(i)
    print("%d connections in %.0f ms" % (n, (time.monotonic() - t0) * 1000))
elif mode == "hold":
    # One line echoed, then wait for the proxy to go away: a reset is what its end sends.
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect((host, port))
    s.sendall(b"hold\n")
    if s.recv(5) != b"hold\n":
        sys.exit("no echo")
    print("held", flush=True)
    t0 = time.monotonic()
    try:
        b = s.recv(1)
        sys.exit("read %r instead of a reset" % b)
    except ConnectionResetError:
        print("reset %.0f ms after the echo" % ((time.monotonic() - t0) * 1000))
    except socket.timeout:
        sys.exit("no reset within 10 s")
elif mode == "reset":
    t0 = time.monotonic()
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((host, port))
        b = s.recv(1)
        sys.exit("read %r instead of a reset" % b)
    except (ConnectionResetError, ConnectionRefusedError) as e:
        print("%s after %.0f ms" % (type(e).__name__, (time.monotonic() - t0) * 1000))
    except socket.timeout:
        sys.exit("no reset within 2 s")
EOF
# ping_bytes N: what client.py echo sends over N connections ("ping I\n" each).
ping_bytes() { local i t=0; for ((i = 0; i < $1; i++)); do t=$((t + 6 + ${#i})); done; echo "$t"; }
# many N HOST: N sequential half-closed echo connections; each accepted exactly once, every
# byte both ways ("done\n" after each EOF).
many() {
	local n=$1 b a up
	b=$(stats) || return 1
	inC timeout 60 "$PY" "$TMP/client.py" echo "$2" 8003 "$n" || return 1
	a=$(stats) || return 1
	up=$(ping_bytes "$n")
	expect_all "$b" "$a" redirect.accepted "$n" sessions.total "$n" redirect.connect_failed 0 \
		relay.bytes_up "$up" relay.bytes_down $((up + 5 * n))
}
check "half-close: reply after the client's EOF" many 1 "$SRV4"
check "200 sequential short connections" many 200 "$SRV4"
closed_port() {
	local b a r e
	b=$(stats) || return 1
	r=$(inC timeout 10 "$PY" "$TMP/client.py" reset "$SRV4" 8009) || { echo "$r"; return 1; }
	a=$(stats) || return 1
	e=$(expect_all "$b" "$a" redirect.accepted 1 redirect.connect_failed 1 \
		sessions.failed.connect_refused 1 sessions.total 1) || { echo "$e"; return 1; }
	echo "$r; $e"
}
check "closed port: client reset at once, connect_refused +1" closed_port
loop() {
	local b a r e
	b=$(stats) || return 1
	r=$(inC timeout 10 "$PY" "$TMP/client.py" reset 127.0.0.1 "$PORT") || { echo "$r"; return 1; }
	a=$(stats) || return 1
	e=$(expect_all "$b" "$a" redirect.accepted 1 redirect.loop_refused 1 sessions.total 0) ||
		{ echo "$e"; return 1; }
	echo "$r; $e"
}
check "a client connecting to the listener itself: reset, loop_refused +1" loop

# --- throughput (informational) ----------------------------------------------------------------
iperf() {
	local b a e gbps
	b=$(stats) || return 1
	inC timeout -k 1 15 iperf3 -c "$SRV4" -p 5201 -t 2 -J --connect-timeout 3000 \
		>"$TMP/iperf.json" 2>&1
	jq -e '.error == null and .end.sum_received.bytes > 0' "$TMP/iperf.json" >/dev/null 2>&1 ||
		{ echo "iperf3: $(jq -r .error "$TMP/iperf.json" 2>/dev/null)"; return 1; }
	a=$(stats) || return 1
	gbps=$(jq '.end.sum_received.bits_per_second / 1e9' "$TMP/iperf.json")
	# iperf3: a control connection and one data connection.
	e=$(expect_all "$b" "$a" redirect.accepted 2 sessions.total 2) || { echo "$e"; return 1; }
	printf 'iperf3 -t 2 through the proxy (splice): %.2f Gbit/s\n' "$gbps"
}
check "iperf3 -t 2 (2 connections accepted)" iperf

# --- the end: counters on exit ---------------------------------------------------------------
idle() { local s; s=$(stats) && [ "$(stat_key redirect.active "$s")" = 0 ]; }
wait_until 50 0.1 idle
LAST=$(stats)
stop_proxy
exit_counters() {
	local j e
	[ "$PROXY_RC" -eq 0 ] || { echo "exit $PROXY_RC"; return 1; }
	j=$(cat "$TMP/proxy.out")
	jq -e . <<<"$j" >/dev/null 2>&1 || { echo "stdout is not JSON: $(head -c 200 <<<"$j")"; return 1; }
	# Nothing happened after the last /stats: the same numbers.
	e=$(expect_all "$LAST" "$j" redirect.accepted 0 relay.bytes_up 0 relay.bytes_down 0) ||
		{ echo "$e"; return 1; }
	# Every session ended, by a relay end or a failed connect; the only refusal the loop's.
	jq -r '"accepted \(.redirect.accepted), sessions \(.sessions.total), relay ends " +
		"\([.relay.ends[]] | add), connect_failed \(.redirect.connect_failed), " +
		"loop_refused \(.redirect.loop_refused), active \(.redirect.active)"' <<<"$j"
	jq -e '.redirect.active == 0 and .redirect.loop_refused == 1 and
		([.relay.ends[]] | add) + .redirect.connect_failed == .sessions.total and
		.sessions.total + .redirect.loop_refused == .redirect.accepted' <<<"$j" >/dev/null
}
check "SIGTERM: exit 0, counters as JSON on stdout" exit_counters

# --- the copy relay --------------------------------------------------------------------------
# A fresh proxy without the stats endpoint: its exit JSON tells what a download did, and a
# connection still open when SIGTERM comes is reset (dispatcher_free ends it).
copy_relay() {
	local got j e hold
	start_proxy copy || { echo "no start"; return 1; }
	got=$(download "$SRV4")
	inC timeout 15 "$PY" "$TMP/client.py" hold "$SRV4" 8003 >"$TMP/hold.out" 2>&1 &
	hold=$!
	wait_until 50 0.1 grep -q held "$TMP/hold.out" || { echo "hold: $(cat "$TMP/hold.out")"; return 1; }
	stop_proxy
	wait "$hold" || { echo "open connection at SIGTERM: $(tail -n 1 "$TMP/hold.out")"; return 1; }
	[ "$got" = "$BLOB_SHA" ] || { echo "sha256 differs"; return 1; }
	[ "$PROXY_RC" -eq 0 ] || { echo "exit $PROXY_RC"; return 1; }
	j=$(cat "$TMP/proxy.out")
	# The download, and "hold\n" up and back.
	e=$(expect_all '{"relay":{"copy_bytes":0,"splice_bytes":0},"redirect":{"accepted":0,"active":0}}' \
		"$j" relay.copy_bytes $((MIB32 + 10)) relay.splice_bytes 0 redirect.accepted 2 \
		redirect.active 1) || { echo "$e"; return 1; }
	echo "sha256 equal; $(tail -n 1 "$TMP/hold.out"); $e"
}
check "--relay copy: 32 MiB download; SIGTERM resets an open connection" copy_relay

# --- through a SOCKS5 server (--socks5) -------------------------------------------------------
# The same proxy with the SOCKS5 outbound: microsocks in S, started only after a first
# connection found no server there (the client is reset at once, the failure counted); then a
# download goes through it (sha256, the server's log names the original destination).
S5=1081
socks5_relay() {
	local b a r e got
	start_proxy splice --stats "127.0.0.1:$P_STATS" --socks5 "$SRV4:$S5" ||
		{ echo "no start: $(tail -n 1 "$TMP/proxy.err")"; return 1; }
	[ "$(stats | jq -r .redirect.outbound)" = socks5 ] || { echo "redirect.outbound not socks5"; return 1; }
	b=$(stats) || return 1
	r=$(inC timeout 10 "$PY" "$TMP/client.py" reset "$SRV4" 8003) || { echo "no server: $r"; return 1; }
	a=$(stats) || return 1
	e=$(expect_all "$b" "$a" redirect.accepted 1 redirect.connect_failed 1 sessions.total 1) ||
		{ echo "no server: $e"; return 1; }
	spawn "$NS_S" "$TMP/microsocks.log" microsocks -i "$SRV4" -p "$S5"
	wait_until 100 0.1 listening "$NS_S" "$S5" || { echo "microsocks not listening"; return 1; }
	b=$(stats) || return 1
	got=$(download "$SRV4")
	a=$(stats) || return 1
	[ "$got" = "$BLOB_SHA" ] || { echo "sha256 ${got:0:16}, want ${BLOB_SHA:0:16}"; return 1; }
	e=$(expect_all "$b" "$a" redirect.accepted 1 sessions.total 1 relay.bytes_down "$MIB32" \
		redirect.connect_failed 0) || { echo "$e"; return 1; }
	grep -q "connected to $SRV4:8001" "$TMP/microsocks.log" ||
		{ echo "microsocks did not connect to $SRV4:8001: $(tail -n 2 "$TMP/microsocks.log")"; return 1; }
	stop_proxy
	[ "$PROXY_RC" -eq 0 ] || { echo "exit $PROXY_RC"; return 1; }
	echo "no server: $r; through microsocks: sha256 equal, bytes_down exact, server named $SRV4:8001"
}
if command -v microsocks >/dev/null 2>&1; then
	check "--socks5: no server -> reset, counted; 32 MiB download through microsocks" socks5_relay
else
	skip "--socks5 through microsocks" "no microsocks (Debian package microsocks)"
fi

# --- the UDP forwarder (--udp-listen, --udp-to) -----------------------------------------------
# The rule set sends the client's datagrams to 10.203.0.0/24 port 7007 to the proxy's UDP socket
# (the same port number as the TCP listener), which forwards them to the echo server in S from
# a marked socket per client source; conntrack gives the replies back the server's address.
udp_usage() {
	local args rc out=""
	# Each: the arguments (| between words) and what the message must name.
	for args in "--udp-listen|:$PORT=--udp-to" \
		"--udp-listen|:$PORT|--udp-to|$SRV4:7007|--socks5|$SRV4:1081=--socks5" \
		"--udp-listen|:$PORT|--udp-to|127.0.0.1:$PORT=itself" \
		"--udp-listen|0.0.0.0:$PORT|--udp-to|$SRV4:7007=--udp-listen: want an address" \
		"--udp-listen6|[::]:$PORT|--udp-to|$SRV4:7007=--udp-listen6: want an address" \
		"--listen|:$PORT|--udp-idle-ms|5=--udp-idle-ms needs"; do
		IFS='|' read -r -a a <<<"${args%=*}"
		inC "$BIN" redirect "${a[@]}" --mark "$MARK" >/dev/null 2>"$TMP/u.err"
		rc=$?
		out="$out ${a[*]:0:2}...: $rc;"
		[ "$rc" -eq 2 ] && grep -qF -- "${args##*=}" "$TMP/u.err" ||
			{ echo "${a[*]}: exit $rc: $(head -n 1 "$TMP/u.err")"; return 1; }
	done
	echo "${out# }"
}
check "--udp-* usage errors (no --udp-to, --socks5, itself, unspecified, idle alone): exit 2, named" udp_usage
udp_forward() {
	local b a j e sent got
	local six=()
	[ "$HAS6" -eq 1 ] && six=(--udp-listen6 ":$PORT")
	start_proxy splice --stats "127.0.0.1:$P_STATS" --udp-listen ":$PORT" "${six[@]}" \
		--udp-to "$SRV4:7007" --udp-idle-ms 1500 ||
		{ echo "no start: $(tail -n 1 "$TMP/proxy.err")"; return 1; }
	b=$(stats) || return 1
	# 2.5 s, longer than the idle time (1.5 s): a flow in use must not be swept.
	j=$(inC timeout 20 "$BIN" load udp --target "$SRV4:7007" --size 1400 --duration 2.5) ||
		{ echo "load udp: $j"; return 1; }
	a=$(stats) || return 1
	sent=$(jq -r .sent <<<"$j")
	got=$(jq -r .received <<<"$j")
	# Every echo matched (sequence numbers), none lost; the forwarder moved exactly those.
	jq -e '.sent > 1000 and .received == .sent and .bad == 0 and .loss_pct == 0' <<<"$j" \
		>/dev/null || { echo "client: $j"; return 1; }
	e=$(expect_all "$b" "$a" redirect.udp.flows_total 1 redirect.udp.flows_idle 0 \
		redirect.udp.datagrams_up "$sent" redirect.udp.datagrams_down "$got" \
		redirect.udp.bytes_up $((sent * 1400)) redirect.udp.bytes_down $((got * 1400)) \
		redirect.udp.drops.full_up 0 redirect.udp.drops.full_down 0 redirect.accepted 0) ||
		{ echo "$e"; return 1; }
	echo "$sent datagrams of 1400 B echoed, none lost; $e"
}
check "UDP forwarder: every echo matched, its counters equal the client's, not swept in use" udp_forward
# IPv6 clients through --udp-listen6 to the same (IPv4) server: conntrack gives the replies back
# the address they were sent to.
udp_forward6() {
	local b a j e
	b=$(stats) || return 1
	j=$(inC timeout 20 "$BIN" load udp --target "[$SRV6]:7007" --size 1400 --duration 1) ||
		{ echo "load udp: $j"; return 1; }
	a=$(stats) || return 1
	jq -e '.sent > 1000 and .received == .sent and .bad == 0' <<<"$j" >/dev/null ||
		{ echo "client: $j"; return 1; }
	e=$(expect_all "$b" "$a" redirect.udp.flows_total 1 \
		redirect.udp.datagrams_up "$(jq .sent <<<"$j")" \
		redirect.udp.datagrams_down "$(jq .received <<<"$j")") || { echo "$e"; return 1; }
	echo "$(jq .sent <<<"$j") datagrams over IPv6, none lost; $e"
}
if [ "$HAS6" -eq 1 ]; then
	check "UDP forwarder over IPv6 (--udp-listen6) to the IPv4 server" udp_forward6
else
	skip "UDP forwarder over IPv6" "no IPv6 in this testbed"
fi
gone() { [ "$(stats | jq -r .redirect.udp.flows_active)" = 0 ]; }
udp_flows() {
	local b a j e
	# The echo run's flow goes first (idle 1.5 s, swept once a second: within 3 s).
	wait_until 60 0.1 gone || { echo "the echo run's flow still active 6 s later"; return 1; }
	b=$(stats) || return 1
	j=$(inC timeout 20 "$BIN" load udpflows --target "$SRV4:7007" --flows 200) ||
		{ echo "load udpflows: $j"; return 1; }
	a=$(stats) || return 1
	jq -e '.answered == 200' <<<"$j" >/dev/null || { echo "client: $j"; return 1; }
	e=$(expect_all "$b" "$a" redirect.udp.flows_total 200 redirect.udp.flows_active 200 \
		redirect.udp.datagrams_up 200 redirect.udp.datagrams_down 200 budget.fds_in_use 200) ||
		{ echo "$e"; return 1; }
	# Idle for 1.5 s, swept once a second: all gone within 3 s, their descriptors with them.
	wait_until 60 0.1 gone || { echo "flows still active 6 s later"; return 1; }
	a=$(stats) || return 1
	e="$e; then $(expect_all "$b" "$a" redirect.udp.flows_idle 200 budget.fds_in_use 0)" ||
		{ echo "$e"; return 1; }
	echo "200 flows answered, each its own; $e"
}
check "UDP forwarder: 200 flows, each answered and its own, ended when idle" udp_flows
# The server gone: each datagram's ICMP port unreachable comes back to the flow's socket, on a
# read or in place of the next send; counted, the flow kept, the loop not spinning.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
udp_upstream_gone() {
	local b a t0 t1 e
	stop_pid "$UDPSERVE"
	b=$(stats) || return 1
	t0=$(cpu_ticks "$PROXY")
	inC "$PY" -c 'import socket, time, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((sys.argv[1], 7007))
for i in range(20):
    try:
        s.send(b"x" * 64)
    except ConnectionRefusedError:
        pass
    time.sleep(0.02)' "$SRV4" || { echo "client failed"; return 1; }
	sleep 0.5
	t1=$(cpu_ticks "$PROXY")
	a=$(stats) || { echo "no /stats afterwards"; return 1; }
	e=$(expect_all "$b" "$a" redirect.udp.flows_total 1 redirect.udp.flows_active 1 \
		redirect.udp.datagrams_down 0 redirect.udp.drops.error_up 0) || { echo "$e"; return 1; }
	jq -en --argjson b "$b" --argjson a "$a" '($a.redirect.udp.upstream_errors -
		$b.redirect.udp.upstream_errors) as $i | ($a.redirect.udp.datagrams_up -
		$b.redirect.udp.datagrams_up) as $u | $i >= 1 and $u >= 1 and $u + $i >= 20' \
		>/dev/null || { echo "upstream_errors/datagrams_up: $(jq -c .redirect.udp <<<"$a")"; return 1; }
	# 0.9 s of wall time; a spinning loop would burn it all (100 ticks a second).
	[ $((t1 - t0)) -lt 30 ] || { echo "the proxy used $((t1 - t0)) ticks: spinning?"; return 1; }
	stop_proxy
	[ "$PROXY_RC" -eq 0 ] || { echo "exit $PROXY_RC"; return 1; }
	# The echo run's flow, the IPv6 one where there is IPv6, the 200, this one.
	jq -e --argjson n $((202 + HAS6)) '.redirect.udp.flows_total == $n' "$TMP/proxy.out" \
		>/dev/null ||
		{ echo "exit JSON: $(jq -c .redirect.udp "$TMP/proxy.out" 2>&1 | head -c 300)"; return 1; }
	echo "$(jq -r '.redirect.udp | "upstream_errors \(.upstream_errors), datagrams_up \(.datagrams_up)"' \
		<<<"$a"); $e; $((t1 - t0)) CPU ticks; exit 0 with the counters"
}
check "UDP forwarder: the server gone: ICMP errors counted, flow kept, no spin" udp_upstream_gone
# Few descriptors (RLIMIT_NOFILE 96: 32 for flows): the flows beyond the budget are refused, one datagram
# dropped and counted each, the admitted ones answered, and every descriptor comes back.
udp_refused() {
	local j a e n
	spawn "$NS_S" "$TMP/udpserve2.log" "$BIN" load serve --bind "$SRV4" --tcp-ports 7008 \
		--udp-port 7007
	wait_until 100 0.1 listening "$NS_S" 7008 || { echo "echo server not back"; return 1; }
	sleep 1.2 # the gone check's conntrack entries expire (above)
	ip netns exec "$NS_C" bash -c 'ulimit -n 96 && exec "$@"' sh "$BIN" redirect --udp-listen ":$PORT" \
		--udp-to "$SRV4:7007" --udp-idle-ms 1000 --mark "$MARK" --stats "127.0.0.1:$P_STATS" \
		</dev/null >"$TMP/proxy.out" 2>>"$TMP/proxy.err" &
	PROXY=$!
	PIDS+=("$PROXY")
	wait_until 100 0.1 listening "$NS_C" "$P_STATS" || { echo "no start"; return 1; }
	j=$(inC timeout 20 "$BIN" load udpflows --target "$SRV4:7007" --flows 200) ||
		{ echo "load udpflows: $j"; return 1; }
	a=$(stats) || return 1
	n=$(jq -r .redirect.udp.flows_total <<<"$a")
	jq -en --argjson a "$a" --argjson j "$j" '$a.redirect.udp as $u | $u.flows_total > 0 and
		$u.flows_total < 200 and $j.answered == $u.flows_total and
		$u.drops.fd + $u.drops.admission == 200 - $u.flows_total and
		$u.datagrams_up == $u.flows_total' >/dev/null ||
		{ echo "client $j; forwarder $(jq -c .redirect.udp <<<"$a")"; return 1; }
	wait_until 60 0.1 gone || { echo "flows still active 6 s later"; return 1; }
	e=$(stats | jq -r '"fds_in_use \(.budget.fds_in_use)"')
	[ "$e" = "fds_in_use 0" ] || { echo "$e after the flows ended"; return 1; }
	stop_proxy
	[ "$PROXY_RC" -eq 0 ] || { echo "exit $PROXY_RC"; return 1; }
	echo "$n flows admitted and answered, $((200 - n)) refused and counted; $e after idle"
}
check "UDP forwarder: beyond the descriptor budget, refused and counted; all given back" udp_refused

sanitizers() {
	if grep -qE "ERROR: (Leak|Address)Sanitizer|runtime error:" "$TMP/proxy.err"; then
		grep -m 3 -E "Sanitizer|runtime error" "$TMP/proxy.err"
		return 1
	fi
	echo "no report in the proxy's stderr"
}
check "no sanitizer report" sanitizers

# --- cleanup ---------------------------------------------------------------------------------
teardown() {
	local ns keep=$KEEP_TMP
	inC nft delete table inet "$TABLE" || return 1
	if inC nft list table inet "$TABLE" >/dev/null 2>&1; then echo "table still there"; return 1; fi
	KEEP_TMP=1 # check() reads its output from $TMP afterwards
	cleanup >/dev/null
	KEEP_TMP=$keep
	for ns in "$NS_C" "$NS_S"; do
		if ip netns list | grep -qw "$ns"; then echo "namespace $ns still there"; return 1; fi
	done
	if nft list tables 2>/dev/null | grep -q "$TABLE"; then
		echo "$TABLE in the host's ruleset"
		return 1
	fi
	echo "table, namespaces and processes gone"
}
check "cleanup: rule set and namespaces gone" teardown
[ "$KEEP_TMP" -eq 1 ] || rm -rf "$TMP"

note "redirect: $(elapsed_ms "$T0") ms"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
