#!/usr/bin/env bash
# netns.sh — twinstack end to end, in three network namespaces created (and destroyed) per run.
#
#   ns C: gateway-mode client    ns A: clients + proxy                     ns B: servers
#  +------------------------+   +--------------------------------------+   +-------------------------+
#  | curl, python clients   |   | curl, iperf3, dig, ping, python      |   | lo 10.200.1.2/32        |
#  |                        |   |   |  main table: 10.200.1.0/24,      |   |    fd00:200:1::2/128    |
#  | default via A          |   |   |  10.200.3.0/24 (+v6) -> tun      |   |  http.server :80 100MiB |
#  |                        |   |   v                                  |   |  iperf3 -s :5201        |
#  |                        |   | tun 198.18.0.1/15, fd00:7f::1/64     |   |  tcp echo :7 (python)   |
#  |                        |   |   |  ^   (created by twinstack)      |   |  udp echo :7 (socat),   |
#  |                        |   |   |  |                               |   |   :5007 (16 at a time)  |
#  |                        |   |   v  |                               |   |  microsocks :1080 auth, |
#  |                        |   | twinstack run (stack $STACK)         |   |   [fd00:200:1::2]:1081  |
#  |                        |   |   outbound sockets SO_MARK 1,        |   |                         |
#  |                        |   |   fwmark 1 -> table 100:             |   | dnsmasq 10.200.0.2:53   |
#  |                        |   |   default via 10.200.0.2             |   |  test.twinstack A       |
#  |                        |   |                                      |   |  -> 10.9.8.7            |
#  | vca 10.200.2.2/24      |   | vac 10.200.2.1/24  vab 10.200.0.1/24 |   | vba 10.200.0.2/24       |
#  |     fd00:200:2::2/64 ----------- fd00:200:2::1/64  fd00:200::1/64 ---------- fd00:200::2/64   |
#  +------------------------+   | vac: tx checksum offload off, so the |   | routes 10.200.2.0/24,   |
#                               | kernel completes C's checksums;      |   | 198.18.0.0/15 (+v6)     |
#                               | ip_forward on, rp_filter off         |   | back via A              |
#                               +--------------------------------------+   +-------------------------+
#
# Routed addresses with no server behind them: 10.200.1.53 / fd00:200:1::53 (DNS, hijacked to
# dnsmasq), 10.200.1.99 / fd00:200:1::99 (ping), 10.200.3.0/24 / fd00:200:3::/64 (a `reject`
# rule). 10.200.0.2 (B's veth address) is reached straight over the veth: the iperf3 baseline.
#
# usage: netns.sh [--stack system|lwip] [--bin PATH] [--relay splice|copy] [--offload on|off]
#                 [--io-uring on|off] [--queues N] [--fast-path auto|on|off] [--subset]
#                 [--oldkernel LIB] [--bypass] [--keep] [-v]
#   --stack   the config's "stack" (the only thing that differs between the stacks' runs)
#   --relay   the config's "relay.mode" (default: the program's default)
#   --offload the config's "tun.offload" (default on: written explicitly, so a kernel that
#             refuses offload fails the start instead of silently testing per-packet I/O)
#   --io-uring the config's "tun.io_uring" (default on: written explicitly, so a kernel that
#             refuses the ring fails the start instead of silently testing system calls)
#   --queues  the config's "tun.queues" (default 1; > 1 is for the system stack)
#   --fast-path the config's "nat.fast_path" (default: not written, the program's default
#             "auto"). With the system stack, anything but "off" must find the in-kernel fast
#             path on (we are root): the bulk transfers then bypass the TUN's userspace path, so
#             the checks of what crosses the TUN (tun.tx_bytes, tun.rx_gso, io_uring rounds,
#             per-queue trims) run on a second instance without it (CAP_BPF and CAP_SYS_ADMIN
#             taken from its bounding set: "auto" finds the fast path unavailable)
#   --subset  only the short subset for the extra modes: 100 MiB v4/v6 downloads from A and
#             from C, the bulk echo, UDP echo, 200 concurrent connections, the mode's /stats,
#             teardown and SIGTERM
#   --oldkernel the test library tests/integration/oldkernel.c builds (libts_oldkernel.so):
#             with it, the system stack's whole suite also starts two instances on a kernel
#             that refuses what older ones lack (tcx: Linux 6.6; bpf_check_mtu: 5.12), whose
#             fast path must keep TCP and leave UDP to userspace, saying so
#   --bin     the twinstack binary (default: build/twinstack of this checkout)
#   --bypass  same topology and servers, but A's clients are routed straight over the veth and
#             no twinstack carries the traffic: proves the harness and measures the bare veth
#   --keep    keep the work directory (configs, logs) after the run
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun, no namespaces), 1 otherwise.
# Output: 'ok - NAME' / 'not ok - NAME: REASON' lines, '#' notes, then 'N passed, N failed'.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RELAY=
OFFLOAD=on
IO_URING=on
QUEUES=1
FAST_PATH=
SUBSET=0
BYPASS=0
OLDKERNEL=

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"
suite_args netns --relay RELAY --offload OFFLOAD --io-uring IO_URING --queues QUEUES \
	--fast-path FAST_PATH --subset SUBSET=1 --oldkernel OLDKERNEL --bypass BYPASS=1 -- "$@"
case $RELAY in "" | splice | copy) ;; *) echo "netns.sh: --relay must be splice or copy" >&2; exit 2 ;; esac
case $OFFLOAD in on | off) ;; *) echo "netns.sh: --offload must be on or off" >&2; exit 2 ;; esac
[[ "$QUEUES" =~ ^[1-9][0-9]*$ ]] || { echo "netns.sh: --queues must be a positive integer" >&2; exit 2; }
case $FAST_PATH in "" | auto | on | off) ;; *) echo "netns.sh: --fast-path must be auto, on or off" >&2; exit 2 ;; esac
[ -z "$OLDKERNEL" ] || [ -f "$OLDKERNEL" ] || { echo "netns.sh: --oldkernel: no file $OLDKERNEL" >&2; exit 2; }
case $OLDKERNEL in "" | /*) ;; *) OLDKERNEL=$PWD/$OLDKERNEL ;; esac
RELAY_JSON=
[ -n "$RELAY" ] && RELAY_JSON="\"relay\": { \"mode\": \"$RELAY\" },"
FAST_PATH_JSON=
[ -n "$FAST_PATH" ] && FAST_PATH_JSON=", \"fast_path\": \"$FAST_PATH\""
# FP_STATE: the fast_path.state /stats must show (lwIP has none; as root the system stack's
# loads unless it is off). FAST=1: the main instance's TCP payload bypasses the TUN's userspace
# path, which a second instance without the fast path then carries for the TUN checks.
FP_STATE=on FAST=1
[ "$STACK" = lwip ] && FP_STATE=none FAST=0
[ "$STACK" = system ] && [ "$FAST_PATH" = off ] && FP_STATE=off FAST=0

# --- preconditions: 77 = cannot run here, not a failure --------------------------------------
if [ "$(id -u)" -ne 0 ]; then echo "# SKIP: needs root (network namespaces, TUN)"; exit 77; fi
if [ ! -c /dev/net/tun ]; then echo "# SKIP: no /dev/net/tun"; exit 77; fi
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
missing=()
for t in ip ss sysctl ethtool curl jq iperf3 socat dnsmasq microsocks dig ping unshare setpriv \
	timeout sha256sum "$PY"; do
	command -v "$t" >/dev/null 2>&1 || missing+=("$t")
done
"$PY" -c 'import prometheus_client.parser' 2>/dev/null || missing+=(python3-prometheus-client)
if [ ${#missing[@]} -gt 0 ]; then
	echo "not ok - prerequisites: missing ${missing[*]} (scripts/setup.sh installs them)"
	echo "0 passed, 1 failed"
	exit 1
fi
HAVE_RUN=0
"$BIN" run --help >/dev/null 2>&1 && HAVE_RUN=1
if [ "$BYPASS" -eq 0 ] && [ "$HAVE_RUN" -eq 0 ]; then
	echo "not ok - binary: '$BIN run --help' fails (build it, or use --bypass)"
	echo "0 passed, 1 failed"
	exit 1
fi

TOK=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
TMP=$(mktemp -d "${TMPDIR:-/tmp}/twinstack-netns.XXXXXX")
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
T_START=$(date +%s%N)

# --- names and addresses ---------------------------------------------------------------------
NS_A=tsA-$TOK NS_B=tsB-$TOK NS_C=tsC-$TOK
V_AB=tsab$TOK V_BA=tsba$TOK V_AC=tsac$TOK V_CA=tsca$TOK
TUN=tst$TOK TUN2=tss$TOK TUN3=tsx$TOK TUN4=tso$TOK
A_B4=10.200.0.1 B_A4=10.200.0.2 A_B6=fd00:200::1 B_A6=fd00:200::2
A_C4=10.200.2.1 C4=10.200.2.2 A_C6=fd00:200:2::1 C6=fd00:200:2::2
SRV4=10.200.1.2 SRV6=fd00:200:1::2
DNS4=10.200.1.53 DNS6=fd00:200:1::53 NOSRV4=10.200.1.99 NOSRV6=fd00:200:1::99
REJ4=10.200.3.2 REJ6=fd00:200:3::2
GW4=198.18.0.1 GW6=fd00:7f::1 NAT4=198.18.0.2 NAT6=fd00:7f::2
P_HTTP=80 P_ECHO=7 P_CLOSED=9 P_IPERF=5201 P_SOCKS=1080 P_SOCKS6=1081 P_STATS=9090 P_BURST=5007
SOCKS_USER=tsuser SOCKS_PASS=ts-secret
FILE_BYTES=$((100 * 1024 * 1024))
TSNET=("$PY" "$HERE/tsnet.py")

inA() { ip netns exec "$NS_A" "$@"; }
inB() { ip netns exec "$NS_B" "$@"; }
inC() { ip netns exec "$NS_C" "$@"; }

note "twinstack netns suite: stack=$STACK relay=${RELAY:-default} offload=$OFFLOAD queues=$QUEUES" \
	"fast_path=${FAST_PATH:-default}" \
	"mode=$([ "$BYPASS" -eq 1 ] && echo bypass || echo proxy)$([ "$SUBSET" -eq 1 ] && echo ' (subset)')" \
	"bin=$BIN token=$TOK"

# --- topology --------------------------------------------------------------------------------
topology() {
	netns_add "$NS_A" && netns_add "$NS_B" && netns_add "$NS_C" || return 1
	ip link add "$V_AB" netns "$NS_A" type veth peer name "$V_BA" netns "$NS_B" || return 1
	ip link add "$V_AC" netns "$NS_A" type veth peer name "$V_CA" netns "$NS_C" || return 1
	local ns dev
	for ns in "$NS_A:$V_AB" "$NS_A:$V_AC" "$NS_B:$V_BA" "$NS_C:$V_CA"; do
		dev=${ns#*:} ns=${ns%%:*}
		ip -n "$ns" link set "$dev" txqueuelen 10000 up || return 1
	done
	inA sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 >/dev/null || return 1
	# A forwards C's downlink: checksums completed in software on A's end of the A–C veth,
	# so a wrong partial checksum from the downlink rewrite reaches C as a bad packet.
	inA ethtool -K "$V_AC" tx off >/dev/null 2>&1 || return 1

	ip -n "$NS_A" addr add "$A_B4/24" dev "$V_AB"
	ip -n "$NS_A" addr add "$A_B6/64" dev "$V_AB" nodad
	ip -n "$NS_A" addr add "$A_C4/24" dev "$V_AC"
	ip -n "$NS_A" addr add "$A_C6/64" dev "$V_AC" nodad
	ip -n "$NS_B" addr add "$B_A4/24" dev "$V_BA"
	ip -n "$NS_B" addr add "$B_A6/64" dev "$V_BA" nodad
	ip -n "$NS_B" addr add "$SRV4/32" dev lo
	ip -n "$NS_B" addr add "$SRV6/128" dev lo nodad
	ip -n "$NS_C" addr add "$C4/24" dev "$V_CA"
	ip -n "$NS_C" addr add "$C6/64" dev "$V_CA" nodad

	# A: marked sockets (twinstack's outbounds) leave over the veth to B.
	ip -n "$NS_A" rule add fwmark 1 lookup 100 pref 100 || return 1
	ip -n "$NS_A" -6 rule add fwmark 1 lookup 100 pref 100 || return 1
	ip -n "$NS_A" route add default via "$B_A4" dev "$V_AB" table 100 || return 1
	ip -n "$NS_A" -6 route add default via "$B_A6" dev "$V_AB" table 100 || return 1
	# B: the client ranges back via A (used in bypass mode; harmless otherwise).
	ip -n "$NS_B" route add 10.200.2.0/24 via "$A_B4" || return 1
	ip -n "$NS_B" route add 198.18.0.0/15 via "$A_B4" || return 1
	ip -n "$NS_B" -6 route add fd00:200:2::/64 via "$A_B6" || return 1
	ip -n "$NS_B" -6 route add fd00:7f::/64 via "$A_B6" || return 1
	# C: everything via A (gateway mode).
	ip -n "$NS_C" route add default via "$A_C4" || return 1
	ip -n "$NS_C" -6 route add default via "$A_C6" || return 1
	return 0
}

# routes_bypass: A's server routes straight over the veth (no TUN anywhere).
routes_bypass() {
	ip -n "$NS_A" route replace 10.200.1.0/24 via "$B_A4" dev "$V_AB" &&
		ip -n "$NS_A" -6 route replace fd00:200:1::/64 via "$B_A6" dev "$V_AB"
}

# routes_tun DEV: A's server ranges (and the reject range) into the TUN. The TUN and its
# routes vanish with the process, so every start calls this again.
routes_tun() {
	local dev=$1
	ip -n "$NS_A" route replace 10.200.1.0/24 dev "$dev" src "$GW4" &&
		ip -n "$NS_A" route replace 10.200.3.0/24 dev "$dev" src "$GW4" &&
		ip -n "$NS_A" -6 route replace fd00:200:1::/64 dev "$dev" src "$GW6" &&
		ip -n "$NS_A" -6 route replace fd00:200:3::/64 dev "$dev" src "$GW6"
}

# --- servers in B ----------------------------------------------------------------------------
servers() {
	mkdir -p "$TMP/www" || return 1
	head -c "$FILE_BYTES" /dev/urandom >"$TMP/www/file.bin" || return 1
	FILE_SHA=$(sha256sum "$TMP/www/file.bin" | cut -d' ' -f1)

	spawn "$NS_B" "$TMP/httpd.log" "$PY" -m http.server --bind :: --directory "$TMP/www" "$P_HTTP"
	spawn "$NS_B" "$TMP/iperf3-server.log" iperf3 -s -p "$P_IPERF"
	spawn "$NS_B" "$TMP/tcp-echo.log" "${TSNET[@]}" tcp-echo --port "$P_ECHO"
	spawn "$NS_B" "$TMP/udp-echo4.log" socat -T 5 "UDP4-RECVFROM:$P_ECHO,bind=$SRV4,fork" EXEC:cat
	spawn "$NS_B" "$TMP/udp-echo6.log" socat -T 5 "UDP6-RECVFROM:$P_ECHO,bind=[$SRV6],fork" EXEC:cat
	spawn "$NS_B" "$TMP/udp-burst.log" "$PY" "$HERE/udpcheck.py" echo --gather 16 \
		--bind "$SRV4:$P_BURST" --bind "[$SRV6]:$P_BURST"
	spawn "$NS_B" "$TMP/dnsmasq.log" dnsmasq --no-daemon --conf-file=/dev/null --no-resolv \
		--no-hosts --address=/test.twinstack/10.9.8.7 --listen-address="$B_A4" \
		--bind-interfaces -p 53 --pid-file="$TMP/dnsmasq.pid" --user=root --log-queries
	spawn "$NS_B" "$TMP/microsocks.log" microsocks -i "$SRV4" -p "$P_SOCKS" \
		-u "$SOCKS_USER" -P "$SOCKS_PASS"
	spawn "$NS_B" "$TMP/microsocks6.log" microsocks -i "$SRV6" -p "$P_SOCKS6"

	local p
	for p in "tcp:$P_HTTP" "tcp:$P_IPERF" "tcp:$P_ECHO" "udp:$P_ECHO" "udp:53" "tcp:$P_SOCKS" \
		"tcp:$P_SOCKS6" "udp:$P_BURST"; do
		wait_listen "$NS_B" "${p%%:*}" "${p#*:}" 100 || { echo "no listener on $p in B"; return 1; }
	done
	echo "http, iperf3, tcp/udp echo, dnsmasq, microsocks x2 listening; file sha256 ${FILE_SHA:0:16}..."
}

# --- twinstack -------------------------------------------------------------------------------

# config_main FILE TUN: the suite's main config (direct + reject, DNS hijack, short linger).
config_main() {
	cat >"$1" <<EOF
{
  "stack": "$STACK",
  "tun": { "name": "$2", "address": "$GW4/15", "address6": "$GW6/64", "mtu": 1500,
           "txqueuelen": 10000, "offload": "$OFFLOAD", "io_uring": "$IO_URING",
           "large_segments": true, "queues": $QUEUES },
  "nat": { "linger_ms": 300, "half_open_timeout_ms": 3000, "port_quarantine_ms": 500$FAST_PATH_JSON },
  "timeouts": { "connect_ms": 3000, "udp_idle_ms": 1000 },
  "outbounds": [
    { "tag": "direct", "type": "direct", "routing_mark": 1 },
    { "tag": "block", "type": "reject" }
  ],
  "route": {
    "rules": [ { "cidr": ["10.200.3.0/24", "fd00:200:3::/64"], "outbound": "block" } ],
    "final": "direct"
  },
  $RELAY_JSON
  "dns": { "hijack": true, "upstream": "$B_A4:53" },
  "stats": { "listen": "127.0.0.1:$P_STATS" },
  "log": { "level": "info" }
}
EOF
}

# config_socks FILE TUN: final outbound socks5 with user/password to B's v4 microsocks; the
# v6 server range goes to the no-auth microsocks on B's v6 address. Both marked.
config_socks() {
	cat >"$1" <<EOF
{
  "stack": "$STACK",
  "tun": { "name": "$2", "address": "$GW4/15", "address6": "$GW6/64",
           "offload": "$OFFLOAD", "io_uring": "$IO_URING", "queues": $QUEUES },
  "nat": { "linger_ms": 300, "port_quarantine_ms": 500$FAST_PATH_JSON },
  "timeouts": { "connect_ms": 3000 },
  $RELAY_JSON
  "outbounds": [
    { "tag": "socks", "type": "socks5", "server": "$SRV4:$P_SOCKS",
      "username": "$SOCKS_USER", "password": "$SOCKS_PASS", "routing_mark": 1 },
    { "tag": "socks6", "type": "socks5", "server": "[$SRV6]:$P_SOCKS6", "routing_mark": 1 }
  ],
  "route": { "rules": [ { "cidr": ["fd00:200:1::/64"], "outbound": "socks6" } ],
             "final": "socks" },
  "log": { "level": "info" }
}
EOF
}

# ts_start CONFIG TAG [WRAPPER...]: starts `twinstack run` in A (through WRAPPER, a command
# that execs the rest, when given); waits (10 s at most) for the ready byte on --ready-fd.
# Sets TS_PID; returns 1 (reason in TS_ERR) if it died or timed out.
ts_start() {
	local cfg=$1 tag=$2 i
	shift 2
	: >"$TMP/ready.$tag"
	ip netns exec "$NS_A" "$@" "$BIN" run --config "$cfg" --ready-fd 3 \
		3>"$TMP/ready.$tag" </dev/null >"$TMP/twinstack.$tag.log" 2>&1 &
	TS_PID=$!
	PIDS+=("$TS_PID")
	for ((i = 0; i < 100; i++)); do
		[ -s "$TMP/ready.$tag" ] && return 0
		kill -0 "$TS_PID" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$TS_PID" 2>/dev/null; then
		TS_ERR="no ready byte within 10 s; log: $(tail -n 3 "$TMP/twinstack.$tag.log" | tr '\n' ' ')"
	else
		wait "$TS_PID"
		TS_ERR="exited $? before ready; log: $(tail -n 3 "$TMP/twinstack.$tag.log" | tr '\n' ' ')"
	fi
	return 1
}

# ts_sigterm: SIGTERM to TS_PID; ok if it exits 0 within 2 s (waits 5 s at most, then KILL).
ts_sigterm() {
	local t0 i rc ms
	t0=$(date +%s%N)
	kill -TERM "$TS_PID" 2>/dev/null || { echo "process already gone"; return 1; }
	for ((i = 0; i < 100; i++)); do
		kill -0 "$TS_PID" 2>/dev/null || break
		sleep 0.05
	done
	ms=$(elapsed_ms "$t0")
	if kill -0 "$TS_PID" 2>/dev/null; then
		kill -KILL "$TS_PID" 2>/dev/null
		wait "$TS_PID" 2>/dev/null
		echo "still running ${ms} ms after SIGTERM (killed)"
		return 1
	fi
	wait "$TS_PID"
	rc=$?
	[ "$rc" -eq 0 ] && [ "$ms" -le 2000 ] && { echo "exit 0 after ${ms} ms"; return 0; }
	echo "exit $rc after ${ms} ms; log: $(tail -n 2 "$TMP/twinstack.$1.log" | tr '\n' ' ')"
	return 1
}

# start_fails NAME WANT_RC STDERR_PATTERN CMD...: runs CMD in A, a start that must fail
# (10 s bound), with fd 3 open on a file that must stay empty (no ready byte).
start_fails() {
	local name=$1 want=$2 pat=$3 rc err
	shift 3
	: >"$TMP/ready.fail"
	timeout -k 1 10 ip netns exec "$NS_A" "$@" 3>"$TMP/ready.fail" </dev/null >"$TMP/fail.out" 2>"$TMP/fail.err"
	rc=$?
	err=$(head -c 300 "$TMP/fail.err" | tr '\n' ' ')
	if [ "$rc" -ne "$want" ]; then
		not_ok "$name" "exit $rc, want $want; stderr: $err"
	elif ! grep -qiE -- "$pat" "$TMP/fail.err"; then
		not_ok "$name" "exit $rc but stderr lacks /$pat/: $err"
	elif [ -s "$TMP/ready.fail" ]; then
		not_ok "$name" "exit $rc but it wrote the ready byte"
	else
		ok "$name" "exit $rc: $err"
	fi
}

stats_json() { inA curl -sS --fail --max-time 3 "http://127.0.0.1:$P_STATS/stats"; }
stat_get() { stats_json | jq -r "$1"; }

STATS_KEYS='stack uptime_s rss_kb peak_rss_kb fds tun.rx_packets tun.rx_bytes tun.tx_packets
tun.tx_bytes tun.rewrites tun.queues tun.io_uring tun.rx_gso tun.rps tun.rps_auto tun.rps_switches
tun.rps_trials_failed tun.rps_last_trial_pct tun.loop_busy_pct tun_device.rx_dropped tun_device.tx_dropped drops.malformed
drops.fragment drops.esp drops.icmp drops.unmapped_downlink drops.unmapped_uplink_rst
drops.own_address drops.nat_exhausted drops.admission_refused drops.fd_exhausted
drops.udp_queue_full drops.protocol drops.unmapped_rst drops.no_memory
nat.half_open nat.active nat.closing nat.quarantined sessions.active
sessions.total sessions.refused udp.sessions udp.queue_drops udp.trains udp.train_datagrams
udp.train_errors udp.gro_datagrams udp.up_trains udp.up_train_datagrams udp.up_train_errors
buffers.in_use_bytes
buffers.peak_bytes buffers.per_session_bytes buffers.heap_trims buffers.quiet_trims splice.pipes splice.pipe_bytes
splice.pipes_reclaimed splice.pipes_refused relay.pipe_fallbacks
throughput.window_ms throughput.tun_rx_bps throughput.tun_tx_bps throughput.tcp_up_bps
throughput.tcp_down_bps throughput.udp_up_bps throughput.udp_down_bps
udp.datagrams_up udp.bytes_up udp.datagrams_down udp.bytes_down
driver.uring_enters driver.uring_flushes driver.uring_flush_writes driver.tx_lent driver.rx_taken
driver.uring_lost_bytes driver.uring_lost_lent
driver.uring_reads_empty driver.uring_read_refused
driver.uring_write_refused driver.uring_enter_failed
fast_path.conns fast_path.conns_added fast_path.map_full fast_path.add_failed fast_path.packets
fast_path.segments fast_path.bytes fast_path.dropped throughput.fast_path_bps
fast_path.udp_flows fast_path.uplinks fast_path.udp_no_uplink fast_path.udp_map_failed fast_path.udp_datagrams_out
fast_path.udp_bytes_out fast_path.udp_datagrams_in fast_path.udp_bytes_in fast_path.udp_dropped
udp.fast_flows udp.fast_added udp.fast_refused udp.fast_kept'

# stats_keys: every documented key is present (numbers, `stack` the configured one).
stats_keys() {
	local j k missing=()
	j=$(stats_json) || { echo "GET /stats failed"; return 1; }
	for k in $STATS_KEYS; do
		if [ "$k" = stack ]; then
			[ "$(jq -r .stack <<<"$j")" = "$STACK" ] || missing+=("stack=$(jq -r .stack <<<"$j")")
		else
			jq -e ".$k | type == \"number\"" <<<"$j" >/dev/null || missing+=("$k")
		fi
	done
	[ ${#missing[@]} -eq 0 ] && { echo "$(wc -w <<<"$STATS_KEYS") keys"; return 0; }
	echo "missing or not numbers: ${missing[*]}"
	return 1
}

# stats_mode: the I/O mode the config asked for is the one running: tun.io_mode, tun.queues,
# tun.io_uring (queues reading and writing through an io_uring), and with several queues each
# queue's counters.
stats_mode() {
	local j want=per-packet q bad=() rings=0
	[ "$OFFLOAD" = on ] && want=offload
	j=$(stats_json) || { echo "GET /stats failed"; return 1; }
	[ "$(jq -r '.tun.io_mode' <<<"$j")" = "$want" ] || bad+=("tun.io_mode=$(jq -c '.tun.io_mode' <<<"$j") (want \"$want\")")
	[ "$(jq -r '.tun.queues' <<<"$j")" = "$QUEUES" ] || bad+=("tun.queues=$(jq -c '.tun.queues' <<<"$j") (want $QUEUES)")
	[ "$IO_URING" = on ] && rings=$QUEUES
	[ "$(jq -r '.tun.io_uring' <<<"$j")" = "$rings" ] || bad+=("tun.io_uring=$(jq -c '.tun.io_uring' <<<"$j") (want $rings)")
	if [ "$QUEUES" -gt 1 ]; then
		for ((q = 0; q < QUEUES; q++)); do
			jq -e ".tun.q$q.rx_packets | type == \"number\"" <<<"$j" >/dev/null ||
				bad+=("tun.q$q.rx_packets missing")
		done
	fi
	[ ${#bad[@]} -eq 0 ] && { echo "tun.io_mode $want, tun.queues $QUEUES, tun.io_uring $rings"; return 0; }
	echo "${bad[*]}"
	return 1
}

# fast_path_state WANT [UDP_WANT]: /stats says fast_path.state WANT ("none", "off",
# "unavailable", "on"), and fast_path.udp_state UDP_WANT (default: the same).
fast_path_state() {
	local got udp want_udp=${2:-$1}
	got=$(stat_get .fast_path.state) && udp=$(stat_get .fast_path.udp_state) ||
		{ echo "GET /stats failed"; return 1; }
	echo "fast_path.state \"$got\"$([ "$got" = "$1" ] || echo ", want \"$1\"")," \
		"fast_path.udp_state \"$udp\"$([ "$udp" = "$want_udp" ] || echo ", want \"$want_udp\"")"
	[ "$got" = "$1" ] && [ "$udp" = "$want_udp" ]
}

# fast_downloads TX_BEFORE REWRITES_BEFORE FAST_PATH_BEFORE: the fast path (on) carried the
# four downloads: fast_path.bytes and tun.tx_bytes (what the proxy wrote to the TUN) grew by at
# least their 4 x 100 MiB together, the fast path's share more than half (a
# connection joins the fast path 10 ms after its accept; the userspace path carries what came
# before, the handshake, and what follows its session's end), and tun.rewrites by at least the
# fast path's packets (it counts them with its own). FAST_PATH_BEFORE: the fast_path object of
# /stats before the downloads.
fast_downloads() {
	local tx0=$1 rw0=$2 b=$3 j tx rw p bytes
	j=$(stats_json) || { echo "GET /stats failed"; return 1; }
	tx=$(jq -r '.tun.tx_bytes' <<<"$j") rw=$(jq -r '.tun.rewrites' <<<"$j")
	p=$(jq -r --argjson b "$b" '.fast_path.packets - $b.packets' <<<"$j")
	bytes=$(jq -r --argjson b "$b" '.fast_path.bytes - $b.bytes' <<<"$j")
	[[ "$tx0" =~ ^[0-9]+$ && "$rw0" =~ ^[0-9]+$ && "$tx" =~ ^[0-9]+$ && "$rw" =~ ^[0-9]+$ &&
		"$p" =~ ^[0-9]+$ && "$bytes" =~ ^[0-9]+$ ]] ||
		{ echo "tun.tx_bytes '$tx0' -> '$tx', tun.rewrites '$rw0' -> '$rw'," \
			"fast_path.packets +'$p', fast_path.bytes +'$bytes'"; return 1; }
	echo "fast_path.bytes +$((bytes >> 20)) MiB in +$p packets, tun.rewrites +$((rw - rw0))," \
		"tun.tx_bytes +$(((tx - tx0) >> 10)) KiB"
	[ $((bytes + tx - tx0)) -ge $((4 * FILE_BYTES)) ] ||
		{ echo "fast_path.bytes +$bytes and tun.tx_bytes +$((tx - tx0)), want" \
			"+$((4 * FILE_BYTES)) or more together"; return 1; }
	if [ "$bytes" -le $((2 * FILE_BYTES)) ]; then
		echo "fast_path.bytes +$bytes: half of the downloads or less took the fast path"
		return 1
	fi
	if [ $((rw - rw0)) -lt "$p" ]; then
		echo "tun.rewrites +$((rw - rw0)), fewer than the fast path's +$p packets"
		return 1
	fi
}

# fast_whole FAST_PATH_BEFORE: the fast path took the downloads' and the bulk echo's
# super-packets whole (fast_path.segments grew by more than fast_path.packets: a GSO packet
# counts once among the packets and by its segments among the segments). With offload off too:
# the kernel's TCP builds super-packets for any device and cuts them in software only after
# the egress hook the fast path sits on.
fast_whole() {
	local b=$1 j p seg
	j=$(stats_json) || { echo "GET /stats failed"; return 1; }
	p=$(jq -r --argjson b "$b" '.fast_path.packets - $b.packets' <<<"$j")
	seg=$(jq -r --argjson b "$b" '.fast_path.segments - $b.segments' <<<"$j")
	[[ "$p" =~ ^[0-9]+$ && "$seg" =~ ^[0-9]+$ ]] ||
		{ echo "fast_path.packets +'$p', fast_path.segments +'$seg'"; return 1; }
	echo "fast_path.packets +$p, fast_path.segments +$seg"
	[ "$p" -gt 0 ] && [ "$seg" -gt "$p" ]
}

# fast_udp HOST: 1,500 datagrams of 1,000 bytes, 1 ms apart, from one socket to the echo server
# (sequence number and hash checked, 99 % back). The flow joins the fast path 10 ms in: the
# kernel carried most of both directions (fast_path.udp_datagrams_out and _in at least +750),
# the proxy offered it once (udp.fast_added +1), and the session, idle for the proxy itself
# longer than udp_idle_ms (1 s), was kept by the kernel's activity (udp.fast_kept moved), never
# ended and made again (that would offer the flow a second time).
fast_udp() {
	local b a out
	b=$(stats_json) || return 1
	out=$(inA "$PY" "$HERE/udpcheck.py" stream --dst "$1:$P_BURST" --size 1000 --count 1500 \
		--interval-ms 1 --wait 3 --min-pct 99) || { echo "$out"; return 1; }
	a=$(stats_json) || return 1
	echo "$out; $(jq -rn --argjson b "$b" --argjson a "$a" '"fast_path.udp_datagrams_out +\($a.fast_path.udp_datagrams_out - $b.fast_path.udp_datagrams_out), _in +\($a.fast_path.udp_datagrams_in - $b.fast_path.udp_datagrams_in), udp.fast_added +\($a.udp.fast_added - $b.udp.fast_added), udp.fast_kept +\($a.udp.fast_kept - $b.udp.fast_kept), udp.datagrams_up +\($a.udp.datagrams_up - $b.udp.datagrams_up)"')"
	jq -en --argjson b "$b" --argjson a "$a" '
		($a.fast_path.udp_datagrams_out - $b.fast_path.udp_datagrams_out) >= 750 and
		($a.fast_path.udp_datagrams_in - $b.fast_path.udp_datagrams_in) >= 750 and
		($a.udp.fast_added - $b.udp.fast_added) == 1 and
		($a.udp.fast_kept - $b.udp.fast_kept) >= 1 and
		$a.fast_path.udp_dropped == $b.fast_path.udp_dropped' >/dev/null ||
		{ echo "want _out and _in +750 or more, fast_added +1, fast_kept +1 or more, no drops"; return 1; }
}
# fast_udp_reroute: a 2 s stream (as fast_udp's, v4) while a route is added in A 0.8 s in (to a
# prefix nothing sends to; removed after): the proxy's route watcher takes the flow out of the
# kernel, the socket carries it, and it joins again 10 ms later (udp.fast_added +2); every
# datagram comes back intact, most of them through the kernel.
fast_udp_reroute() {
	local b a out rc pid
	b=$(stats_json) || return 1
	inA "$PY" "$HERE/udpcheck.py" stream --dst "$SRV4:$P_BURST" --size 1000 --count 2000 \
		--interval-ms 1 --wait 3 --min-pct 99 >"$TMP/reroute.out" 2>&1 &
	pid=$!
	sleep 0.8
	inA ip route add 10.200.9.0/24 via "$B_A4"
	wait "$pid"
	rc=$?
	inA ip route del 10.200.9.0/24 via "$B_A4"
	out=$(cat "$TMP/reroute.out")
	a=$(stats_json) || return 1
	echo "$out; $(jq -rn --argjson b "$b" --argjson a "$a" '"udp.fast_added +\($a.udp.fast_added - $b.udp.fast_added), fast_path.udp_datagrams_out +\($a.fast_path.udp_datagrams_out - $b.fast_path.udp_datagrams_out), _in +\($a.fast_path.udp_datagrams_in - $b.fast_path.udp_datagrams_in)"')"
	[ "$rc" -eq 0 ] || return 1
	jq -en --argjson b "$b" --argjson a "$a" '
		($a.udp.fast_added - $b.udp.fast_added) >= 2 and
		($a.fast_path.udp_datagrams_out - $b.fast_path.udp_datagrams_out) >= 1000 and
		($a.fast_path.udp_datagrams_in - $b.fast_path.udp_datagrams_in) >= 1000' >/dev/null ||
		{ echo "want udp.fast_added +2 or more, _out and _in +1000 or more"; return 1; }
}
# fast_udp_gone: once the streams' sessions have expired (udp_idle_ms 1 s after their last
# datagram), no flow is left in the fast path's maps nor counted in the UDP path.
udp_fast_empty() { [ "$(stat_get '.fast_path.udp_flows + .udp.fast_flows')" -eq 0 ]; }
fast_udp_gone() {
	wait_until 50 0.1 udp_fast_empty ||
		{ echo "fast_path.udp_flows $(stat_get .fast_path.udp_flows), udp.fast_flows $(stat_get .udp.fast_flows) after 5 s"; return 1; }
	echo "fast_path.udp_flows 0, udp.fast_flows 0"
}

# fast_short: SHORT_CONNS connections one after the other, each a half-close echo of 16 bytes
# (over in well under a millisecond); a connection joins the fast path only once it has lived
# 10 ms, so fewer than half of them may have joined (fast_path.conns_added), and none stays in
# its map (fast_path.conns back where it was once the proxy has ended their sessions). A loaded
# machine may stretch a few past 10 ms; a fast path that took every connection at its accept
# fails.
SHORT_CONNS=40
conns_at_most() { [ "$(stat_get .fast_path.conns)" -le "$1" ]; }
fast_short() {
	local a0 a1 c0 c1
	a0=$(stat_get .fast_path.conns_added) && c0=$(stat_get .fast_path.conns) ||
		{ echo "GET /stats failed"; return 1; }
	inA "${TSNET[@]}" half-close --host "$SRV4" --port "$P_ECHO" --bytes 16 \
		--count "$SHORT_CONNS" --timeout 5 || return 1
	wait_until 50 0.1 conns_at_most "$c0"
	a1=$(stat_get .fast_path.conns_added) && c1=$(stat_get .fast_path.conns) ||
		{ echo "GET /stats failed"; return 1; }
	echo "fast_path.conns_added +$((a1 - a0)) of $SHORT_CONNS, fast_path.conns $c0 -> $c1"
	[ $((a1 - a0)) -lt $((SHORT_CONNS / 2)) ] && [ "$c1" -le "$c0" ]
}

# gso_moved BEFORE: tun.rx_gso (super-packets read) after the bulk transfers: it moved with
# offload on (TCP through a TUN with TSO sends super-packets), it stayed 0 per-packet.
gso_moved() {
	local before=$1 now
	now=$(stat_get .tun.rx_gso)
	[[ "$before" =~ ^[0-9]+$ && "$now" =~ ^[0-9]+$ ]] || { echo "tun.rx_gso '$before' -> '$now': not numbers"; return 1; }
	if [ "$OFFLOAD" = on ]; then
		[ "$now" -gt "$before" ] && { echo "tun.rx_gso $before -> $now"; return 0; }
		echo "tun.rx_gso $before -> $now: no super-packet read with offload on"
	else
		[ "$now" -eq 0 ] && { echo "tun.rx_gso 0"; return 0; }
		echo "tun.rx_gso $now with offload off (want 0)"
	fi
	return 1
}

# uring_rounds: with tun.io_uring on, the transfers' TUN reads and writes went in rounds of
# several (driver.uring_enters well under the packets read plus written), and no queue gave
# the ring up; with it off, no round at all.
uring_rounds() {
	local j enters pk refused flushes fw
	j=$(stats_json) || { echo "GET /stats failed"; return 1; }
	enters=$(jq -r '.driver.uring_enters' <<<"$j")
	pk=$(jq -r '.driver.rx_packets + .driver.tx_packets' <<<"$j")
	refused=$(jq -r '.driver.uring_read_refused + .driver.uring_write_refused + .driver.uring_enter_failed' <<<"$j")
	flushes=$(jq -r '.driver.uring_flushes' <<<"$j")
	fw=$(jq -r '.driver.uring_flush_writes' <<<"$j")
	[[ "$enters" =~ ^[0-9]+$ && "$pk" =~ ^[0-9]+$ && "$refused" =~ ^[0-9]+$ &&
		"$flushes" =~ ^[0-9]+$ && "$fw" =~ ^[0-9]+$ ]] ||
		{ echo "driver.uring_enters '$enters', packets '$pk', given up '$refused'," \
			"flushes '$flushes' with '$fw' writes"; return 1; }
	echo "driver.uring_enters $enters for $pk packets read and written, given up $refused;" \
		"of them $flushes write-only rounds (a stack's own packet, a pass's end) with $fw writes," \
		"lent frames $(jq -r '.driver.tx_lent' <<<"$j")"
	if [ "$IO_URING" = on ]; then
		# Fewer io_uring_enter calls than packets: with read() and writev() there would be
		# one call per packet. The system stack writes back what it reads in the next round,
		# so its rounds carry more than two packets each on average; lwIP's writes are its
		# own segments, lent in the pass that made them. Write-only rounds carry at least one
		# write each.
		local per=1
		[ "$STACK" = system ] && per=2
		[ "$enters" -gt 0 ] && [ $((enters * per)) -lt "$pk" ] && [ "$fw" -ge "$flushes" ] &&
			[ "$refused" -eq 0 ]
	else
		[ "$enters" -eq 0 ]
	fi
}

# lwip_big BEFORE LENT_BEFORE BIGLENT_BEFORE: the lwIP downloads (4 x 100 MiB, hash-checked, two
# of them forwarded to the gateway namespace) went out in large segments the kernel cut: with
# offload, stack_counters.gso_big_packets moved by at least one per MiB and connections were
# marked, and with the ring at least four in five of them were lent from lwIP's own memory
# (stack_counters.big_lent: one pbuf each, a segment that short reads from the server filled
# while it waited included) and the driver took every one (driver.tx_lent, which counts small
# frames too, moved by at least as many); per-packet, no connection builds them and none is
# lent.
lwip_big() {
	local before=$1 lent0=$2 big_lent0=$3 j now conns lent big_lent
	j=$(stats_json) || { echo "GET /stats failed"; return 1; }
	now=$(jq -r '.stack_counters.gso_big_packets // 0' <<<"$j")
	conns=$(jq -r '.stack_counters.big_conns' <<<"$j")
	lent=$(jq -r '.driver.tx_lent' <<<"$j")
	big_lent=$(jq -r '.stack_counters.big_lent // 0' <<<"$j")
	[[ "$before" =~ ^[0-9]+$ && "$now" =~ ^[0-9]+$ && "$conns" =~ ^[0-9]+$ &&
		"$lent0" =~ ^[0-9]+$ && "$lent" =~ ^[0-9]+$ && "$big_lent0" =~ ^[0-9]+$ &&
		"$big_lent" =~ ^[0-9]+$ ]] ||
		{ echo "gso_big_packets '$before' -> '$now', big_conns '$conns'," \
			"tx_lent '$lent0' -> '$lent', big_lent '$big_lent0' -> '$big_lent'"; return 1; }
	echo "stack_counters.gso_big_packets $before -> $now, big_conns $conns," \
		"big_to_wire $(jq -r '.stack_counters.big_to_wire' <<<"$j")," \
		"big_lent $big_lent0 -> $big_lent, driver.tx_lent $lent0 -> $lent"
	if [ "$OFFLOAD" = on ]; then
		[ $((now - before)) -ge $((4 * FILE_BYTES / 1048576)) ] && [ "$conns" -gt 0 ] || return 1
		if [ "$IO_URING" = on ]; then
			[ $((5 * (big_lent - big_lent0))) -ge $((4 * (now - before))) ] &&
				[ $((lent - lent0)) -ge $((big_lent - big_lent0)) ]
		else
			[ "$lent" -eq 0 ]
		fi
	else
		[ "$now" -eq 0 ] && [ "$conns" -eq 0 ] && [ "$lent" -eq 0 ]
	fi
}

# lwip_gathered: the bulk transfers moved relay.gather_bytes (uploads: sendmsg of lwIP's
# received pbufs) by at least the 32 MiB echo's upload; with offload, super-packets of 32 KiB
# and more went to lwIP in the driver's read buffers, uncopied (stack_counters.rx_taken, the
# same number as driver.rx_taken, at least one per 256 KiB of the upload), per-packet none.
lwip_gathered() {
	local j v taken dtaken
	j=$(stats_json) || { echo "GET /stats failed"; return 1; }
	v=$(jq -r '.relay.gather_bytes' <<<"$j")
	taken=$(jq -r '.stack_counters.rx_taken' <<<"$j")
	dtaken=$(jq -r '.driver.rx_taken' <<<"$j")
	[[ "$v" =~ ^[0-9]+$ && "$taken" =~ ^[0-9]+$ && "$dtaken" =~ ^[0-9]+$ ]] ||
		{ echo "relay.gather_bytes '$v', rx_taken '$taken' / '$dtaken'"; return 1; }
	echo "relay.gather_bytes $v, stack_counters.rx_taken $taken, driver.rx_taken $dtaken"
	[ "$v" -ge $((32 << 20)) ] && [ "$taken" -eq "$dtaken" ] || return 1
	if [ "$OFFLOAD" = on ]; then
		[ "$taken" -ge $(((32 << 20) / (256 << 10))) ]
	else
		[ "$taken" -eq 0 ]
	fi
}

# queues_sum RX_BEFORE: per-queue rx_packets add up to tun.rx_packets (read at idle, one
# snapshot), and the total moved since RX_BEFORE; prints each queue's share.
queues_sum() {
	local before=$1 j sum total shares
	j=$(stats_json) || { echo "GET /stats failed"; return 1; }
	sum=$(jq --argjson n "$QUEUES" '[range(0; $n) as $q | .tun["q\($q)"].rx_packets] |
		if all(type == "number") then add else "missing" end' <<<"$j")
	total=$(jq '.tun.rx_packets' <<<"$j")
	shares=$(jq -r --argjson n "$QUEUES" '[range(0; $n) as $q | "q\($q)=\(.tun["q\($q)"].rx_packets)"] | join(" ")' <<<"$j")
	if ! [[ "$sum" =~ ^[0-9]+$ && "$total" =~ ^[0-9]+$ && "$before" =~ ^[0-9]+$ ]]; then
		echo "per-queue rx_packets sum $sum, tun.rx_packets $total: not numbers ($shares)"
		return 1
	fi
	if [ "$sum" -ne "$total" ]; then
		echo "per-queue rx_packets add up to $sum, tun.rx_packets is $total ($shares)"
		return 1
	fi
	if [ "$total" -le "$before" ]; then
		echo "tun.rx_packets did not move: $before -> $total"
		return 1
	fi
	echo "sum $sum == tun.rx_packets (+$((total - before))): $shares"
}

# sndbuf_applied: nat.accepted_sndbuf (absent from the config, with offload: 384 KiB with one
# queue, 1 MiB with more; the kernel reports it doubled) on every listener of the system stack
# and on a socket they accepted, held open by a slow download (the accepted socket's peer is a
# NAT address in 198.18.0.0/24; the client's own socket goes to the server).
sndbuf_applied() {
	local want lis acc pid i rc=1
	want=$((2 * ($QUEUES > 1 ? 1048576 : 393216)))
	lis=$(inA ss -tlnmH "( src $GW4 or src [$GW6] )" | grep -o 'tb[0-9]*' | sort | uniq -c | xargs)
	if [ "$lis" != "$((2 * 2)) tb$want" ]; then
		echo "listeners on the gateways: '$lis', want 4 x tb$want (2 listeners per family)"
		return 1
	fi
	inA curl -sS --limit-rate 1M --max-time 20 -o /dev/null "http://$SRV4:$P_HTTP/file.bin" \
		2>/dev/null &
	pid=$!
	for i in $(seq 1 50); do
		acc=$(inA ss -tnmH state established dst 198.18.0.0/24 | grep -o 'tb[0-9]*' | sort -u | xargs)
		[ -n "$acc" ] && break
		sleep 0.1
	done
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	if [ "$acc" = "tb$want" ]; then
		echo "listeners: $lis; accepted socket: $acc"
		rc=0
	else
		echo "accepted socket: '${acc:-none within 5 s}', want tb$want (listeners: $lis)"
	fi
	return $rc
}

# congestion_applied: nat.accepted_congestion (absent from the config: reno) on a socket the
# system stack accepted, held open by a slow download, while the client's own socket in the
# same namespace keeps the namespace's default.
congestion_applied() {
	local def acc cli pid i
	def=$(inA sysctl -n net.ipv4.tcp_congestion_control)
	inA curl -sS --limit-rate 1M --max-time 20 -o /dev/null "http://$SRV4:$P_HTTP/file.bin" \
		2>/dev/null &
	pid=$!
	for i in $(seq 1 50); do
		acc=$(inA ss -tniH state established dst 198.18.0.0/24 | grep -ow 'reno\|cubic\|bbr[0-9]*' | sort -u | xargs)
		cli=$(inA ss -tniH state established dst "$SRV4" | grep -ow 'reno\|cubic\|bbr[0-9]*' | sort -u | xargs)
		[ -n "$acc" ] && [ -n "$cli" ] && break
		sleep 0.1
	done
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	if [ "$acc" != reno ]; then
		echo "accepted socket: '${acc:-none within 5 s}', want reno (namespace default $def)"
		return 1
	fi
	if [ "$cli" != "$def" ]; then
		echo "the client's socket: '${cli:-none}', want the namespace default $def"
		return 1
	fi
	echo "accepted socket: $acc; the client's socket: $cli (namespace default$([ "$def" = reno ] && echo ' reno too: this run cannot tell them apart' || echo " $def"))"
}

# --- traffic checks --------------------------------------------------------------------------

# download NS URL [CURL_ARGS...]: the 100 MiB file, sha256 compared with the served one.
download() {
	local ns=$1 url=$2 t0 rc hash ms
	shift 2
	t0=$(date +%s%N)
	ip netns exec "$ns" curl -sS --fail --connect-timeout 5 --max-time 60 "$@" -o - "$url" \
		2>"$TMP/curl.err" | sha256sum >"$TMP/dl.sha"
	rc=${PIPESTATUS[0]}
	ms=$(elapsed_ms "$t0")
	hash=$(cut -d' ' -f1 "$TMP/dl.sha")
	if [ "$rc" -ne 0 ]; then
		echo "curl exit $rc after ${ms} ms: $(head -c 200 "$TMP/curl.err")"
		return 1
	fi
	if [ "$hash" != "$FILE_SHA" ]; then
		echo "sha256 ${hash:0:16}... differs from the file's ${FILE_SHA:0:16}..."
		return 1
	fi
	awk -v ms="$ms" -v b="$FILE_BYTES" 'BEGIN { printf "sha256 equal, %.0f ms, %.2f Gbit/s\n", ms, b * 8 / (ms / 1000) / 1e9 }'
}

# iperf NS HOST STREAMS: iperf3 for IPERF_S seconds (environment, default 2: the suite checks that
# bytes flow, the rig measures); sets IPERF_GBPS; prints Gbit/s and retransmits.
IPERF_S=${IPERF_S:-2}
IPERF_GBPS=0
iperf() {
	local ns=$1 host=$2 n=$3 out=$TMP/iperf.json bps err
	IPERF_GBPS=0
	ip netns exec "$ns" timeout -k 1 $((IPERF_S + 15)) iperf3 -c "$host" -p "$P_IPERF" -t "$IPERF_S" -P "$n" -J \
		--connect-timeout 3000 >"$out" 2>"$TMP/iperf.err"
	err=$(jq -r '.error // empty' "$out" 2>/dev/null)
	bps=$(jq -r '.end.sum_received.bits_per_second // 0' "$out" 2>/dev/null)
	if [ -n "$err" ] || [ -z "$bps" ] || awk -v b="$bps" 'BEGIN { exit !(b <= 0) }'; then
		echo "no throughput: ${err:-$(head -c 200 "$TMP/iperf.err")}"
		return 1
	fi
	IPERF_GBPS=$(awk -v b="$bps" 'BEGIN { printf "%.2f", b / 1e9 }')
	echo "$IPERF_GBPS Gbit/s, $(jq -r '.end.sum_sent.retransmits // 0' "$out") retransmits"
}

# dig_hijack NS SERVER: the A record of test.twinstack must be dnsmasq's 10.9.8.7.
dig_a() {
	local ns=$1 server=$2 ans
	ans=$(ip netns exec "$ns" dig +time=2 +tries=2 +short "@$server" test.twinstack A 2>&1)
	[ "$ans" = 10.9.8.7 ] && { echo "answer $ans"; return 0; }
	echo "answer '$(tr '\n' ' ' <<<"$ans")'"
	return 1
}

# no_reply NS ADDR: two pings, no reply expected (ping exits 1 on "0 received").
no_reply() {
	local ns=$1 addr=$2 out rc
	out=$(ip netns exec "$ns" timeout 6 ping -n -c 2 -i 0.2 -W 1 "$addr" 2>&1)
	rc=$?
	if [ "$rc" -eq 0 ]; then echo "got a reply"; return 1; fi
	grep -q ' 0 received' <<<"$out" && { echo "2 sent, 0 received"; return 0; }
	echo "ping exit $rc: $(tail -n 2 <<<"$out" | tr '\n' ' ')"
	return 1
}

# metrics_parse: /metrics parses; the stack's levels are typed gauge (lwIP's memory).
metrics_parse() {
	local text
	text=$(inA curl -sS --fail --max-time 3 "http://127.0.0.1:$P_STATS/metrics") || return 1
	"${TSNET[@]}" metrics <<<"$text" || return 1
	if [ "$STACK" = lwip ] && ! grep -qx '# TYPE twinstack_stack_counters_lwip_mem_bytes gauge' <<<"$text"; then
		echo "lwip_mem_bytes is not typed gauge: $(grep lwip_mem_bytes <<<"$text" | head -n 1)"
		return 1
	fi
}

# idle_state: zero NAT entries (quarantined aside), sessions, pipes and connections in the fast
# path's map, fds at the idle count (and one more per uplink the fast path's reply program is
# attached to: it stays while the proxy runs).
idle_state() {
	local j
	j=$(stats_json) || { echo "GET /stats failed"; return 1; }
	jq -r --argjson fds "$FDS_IDLE" '"nat half_open=\(.nat.half_open) active=\(.nat.active) closing=\(.nat.closing) quarantined=\(.nat.quarantined), sessions.active=\(.sessions.active), udp.sessions=\(.udp.sessions), splice.pipes=\(.splice.pipes), fast_path.conns=\(.fast_path.conns), fast_path.udp_flows=\(.fast_path.udp_flows), fds=\(.fds) (idle \($fds) + \(.fast_path.uplinks) uplink(s))"' <<<"$j"
	jq -e --argjson fds "$FDS_IDLE" '(.nat.half_open + .nat.active + .nat.closing) == 0
		and .sessions.active == 0 and .splice.pipes == 0 and .fast_path.conns == 0
		and .fast_path.udp_flows == 0 and .fds == $fds + .fast_path.uplinks' <<<"$j" >/dev/null
}

# =============================================================================================
topology >"$TMP/topology.out" 2>&1
topo_rc=$?
out=$(tr '\n' ' ' <"$TMP/topology.out")
if [ "$topo_rc" -eq 0 ]; then
	ok "topology: namespaces A, B, C, veths, rules" "$NS_A $NS_B $NS_C"
else
	if ! ip netns list >/dev/null 2>&1 || [[ "$out" == *"Operation not permitted"* ]]; then
		echo "# SKIP: cannot create network namespaces here: $out"
		exit 77
	fi
	not_ok "topology" "$out"
	echo "$PASSED passed, $FAILED failed"
	exit 1
fi
if ! check "servers in B" servers; then
	for f in "$TMP"/*.log; do vnote "$f: $(tail -n 2 "$f" | tr '\n' ' ')"; done
	echo "$PASSED passed, $FAILED failed"
	exit 1
fi

# --- starts that must fail (before the real instance, so they cannot disturb it) --------------
if [ "$SUBSET" -eq 1 ]; then
	note "subset: the failing starts, DNS, half-close, RST, reject, ICMP, iperf3, /metrics and" \
		"socks5 run in the full suite only"
elif [ "$HAVE_RUN" -eq 1 ]; then
	config_main "$TMP/good.json" "$TUN3"
	printf '{ "stack": "%s", "tun": { "name": "%s",\n' "$STACK" "$TUN3" >"$TMP/broken.json"
	start_fails "start: broken config exits 2 with its message" 2 'config: ' \
		"$BIN" run --config "$TMP/broken.json" --ready-fd 3
	jq --arg a "$GW4/31" '.tun.address = $a' "$TMP/good.json" >"$TMP/slash31.json"
	start_fails "start: impossible TUN address (/31) exits 2" 2 'tun\.address' \
		"$BIN" run --config "$TMP/slash31.json" --ready-fd 3
	if [ "$STACK" = system ]; then
		# The kernel, not the config check, knows its congestion controls: a start error.
		jq '.nat.accepted_congestion = "nosuchcc"' "$TMP/good.json" >"$TMP/nocc.json"
		start_fails "start: unknown nat.accepted_congestion exits 1 naming it" 1 \
			'nat\.accepted_congestion "nosuchcc".*available' \
			"$BIN" run --config "$TMP/nocc.json" --ready-fd 3
	fi
	# A private mount namespace with an empty tmpfs over /dev/net: open("/dev/net/tun") fails.
	start_fails "start: no /dev/net/tun access exits 1" 1 'tun' \
		unshare --mount --propagation private sh -c \
		'mount -t tmpfs notun /dev/net && exec "$@"' sh "$BIN" run --config "$TMP/good.json" --ready-fd 3
else
	for n in "broken config exits 2" "impossible TUN address exits 2" "no /dev/net/tun exits 1"; do
		skip "start: $n" "no 'twinstack run' in $BIN"
	done
fi

# queues_trimmed: every queue that read 2 MiB or more has trimmed on its own loop once the
# load stopped (runtime/memback.h: one per queue's loop), and a queue other than 0 did read
# that much (else the check would look at queue 0 alone).
queues_trimmed() {
	local q b t s out="" worker=0
	s=$(stats_json) || return 1
	for ((q = 0; q < QUEUES; q++)); do
		b=$(jq -r ".tun.q$q.rx_bytes" <<<"$s") && t=$(jq -r ".tun.q$q.quiet_trims" <<<"$s")
		out+="q$q: rx_bytes $b, quiet_trims $t; "
		[[ "$b" =~ ^[0-9]+$ && "$t" =~ ^[0-9]+$ ]] || { echo "$out"; return 1; }
		[ "$b" -lt $((2 << 20)) ] && continue
		[ "$q" -gt 0 ] && worker=1
		[ "$t" -ge 1 ] || { echo "$out"; return 1; }
	done
	[ "$worker" -eq 1 ] || { echo "${out}no queue but 0 read 2 MiB"; return 1; }
	echo "$out"
}
queues_trimmed_soon() { wait_until 40 0.1 queues_trimmed >/dev/null; queues_trimmed; }
# worker_loaded: a queue other than 0 has read 2 MiB or more.
worker_loaded() {
	local s q
	s=$(stats_json) || return 1
	for ((q = 1; q < QUEUES; q++)); do
		[ "$(jq -r ".tun.q$q.rx_bytes" <<<"$s")" -ge $((2 << 20)) ] 2>/dev/null && return 0
	done
	return 1
}
# queue_checks PREFIX: with more than one queue, a worker queue loaded and every queue's memory
# back afterwards. A connection's packets go to the queue its number picks (a hash of its ports
# and addresses), so the few large transfers before may all have landed on queue 0: 8 MiB more
# echoed on fresh connections until a worker queue has carried one (each has an even chance;
# at most 10).
queue_checks() {
	local extra
	[ "$QUEUES" -gt 1 ] || return 0
	for ((extra = 0; extra < 10; extra++)); do
		worker_loaded && break
		inA "${TSNET[@]}" bulk-echo --host "$SRV4" --port "$P_ECHO" --mib 8 --timeout 30 >/dev/null
	done
	check "${1}stats: every queue's loop gives its memory back after the load (quiet trim per queue)" \
		queues_trimmed_soon
}

# downloads_crossed TX_BEFORE N: the proxy wrote at least N files' bytes to the TUN
# (tun.tx_bytes: both stacks emit the downlink through it), and the fast path rewrote nothing
# (fast_path.packets 0): proof that the traffic took the TUN's userspace path.
downloads_crossed() {
	local tx0=$1 n=$2 tx1 fpp
	if ! tx1=$(stat_get .tun.tx_bytes) || ! fpp=$(stat_get .fast_path.packets); then
		echo "GET /stats failed"
		return 1
	fi
	[[ "$tx0" =~ ^[0-9]+$ && "$tx1" =~ ^[0-9]+$ && "$fpp" =~ ^[0-9]+$ ]] ||
		{ echo "tun.tx_bytes '$tx0' -> '$tx1', fast_path.packets '$fpp'"; return 1; }
	[ $((tx1 - tx0)) -ge $((n * FILE_BYTES)) ] ||
		{ echo "tun.tx_bytes $tx0 -> $tx1, want +$((n * FILE_BYTES))"; return 1; }
	[ "$fpp" -eq 0 ] || { echo "fast_path.packets $fpp, want 0"; return 1; }
	echo "tun.tx_bytes +$(((tx1 - tx0) / 1048576)) MiB, fast_path.packets 0"
}

# --- the system stack without its fast path ----------------------------------------------------
# NOBPF: runs the rest with CAP_BPF and CAP_SYS_ADMIN out of the bounding set, so the exec'd
# root process has neither and cannot load a tc BPF program (it keeps CAP_NET_ADMIN for the
# TUN). nat.fast_path "on" must then fail the start; "auto" must start without it and carry the
# traffic through userspace. With FAST that instance is also where the TUN's own checks run
# (what the proxy writes, super-packets read, io_uring rounds, per-queue trims): the main
# instance's bulk transfers bypass the TUN's userspace path.
NOBPF=(setpriv --bounding-set "-bpf,-sys_admin" --)
nofp_instance() {
	local tx0 gso0
	jq '.nat.fast_path = "auto"' "$TMP/nofp-base.json" >"$TMP/nofp.json" || return 1
	local name="no fast path: nat.fast_path \"auto\" without CAP_BPF and CAP_SYS_ADMIN starts"
	local log=$TMP/twinstack.nofp.log
	if ! ts_start "$TMP/nofp.json" nofp "${NOBPF[@]}"; then
		not_ok "$name" "$TS_ERR"
		stop_pid "$TS_PID"
		return 1
	fi
	ok "$name" "pid $TS_PID"
	if grep -q 'fast path unavailable' "$log"; then
		ok "no fast path: the log says why" "$(grep -m1 'fast path unavailable' "$log" | cut -c1-160)"
	else
		not_ok "no fast path: the log says why" \
			"no 'fast path unavailable' line: $(tail -n 2 "$log" | tr '\n' ' ')"
	fi
	check "no fast path: routes into the TUN ($TUN3)" routes_tun "$TUN3" ||
		{ stop_pid "$TS_PID"; return 1; }
	check "no fast path: stats: fast_path.state \"unavailable\"" fast_path_state unavailable
	tx0=$(stat_get .tun.tx_bytes) gso0=$(stat_get .tun.rx_gso)
	check "no fast path: http v4 from A: 100 MiB" download "$NS_A" "http://$SRV4:$P_HTTP/file.bin"
	check "no fast path: stats: the download crossed the TUN" downloads_crossed "$tx0" 1
	check "no fast path: tcp: 32 MiB bulk echo v4, both directions at once, sha256" \
		inA "${TSNET[@]}" bulk-echo --host "$SRV4" --port "$P_ECHO" --mib 32 --timeout 30
	check "no fast path: stats: tun.rx_gso after the bulk transfers (offload $OFFLOAD)" gso_moved "$gso0"
	check "no fast path: stats: TUN reads and writes in rounds (tun.io_uring $IO_URING)" uring_rounds
	[ "$FAST" -eq 1 ] && queue_checks "no fast path: "
	check "no fast path: SIGTERM exits 0 within 2 s" ts_sigterm nofp
}
if [ "$STACK" = system ] && [ "$BYPASS" -eq 0 ] && [ "$HAVE_RUN" -eq 1 ] &&
	{ [ "$SUBSET" -eq 0 ] || [ "$FAST" -eq 1 ]; }; then
	config_main "$TMP/nofp-base.json" "$TUN3"
	if [ "$SUBSET" -eq 0 ]; then
		jq '.nat.fast_path = "on"' "$TMP/nofp-base.json" >"$TMP/nofp-on.json"
		start_fails "start: nat.fast_path \"on\" without CAP_BPF and CAP_SYS_ADMIN exits 1 naming it" \
			1 'nat\.fast_path' "${NOBPF[@]}" "$BIN" run --config "$TMP/nofp-on.json" --ready-fd 3
	fi
	nofp_instance
fi

# oldkernel_instance WHAT: an instance (before the main one, on its own TUN) to which this
# kernel refuses WHAT (--oldkernel's library): "tcx", as Linux 6.1 to 6.5 (Debian bookworm's
# 6.1 among them), which cannot attach the UDP flows' reply program to an uplink; or
# "check_mtu", as a kernel before 5.12, which refuses the UDP flows' egress program. Either
# way the fast path stays on for TCP (a 100 MiB download takes it) and UDP flows stay in
# userspace, saying so: a stream arrives whole through the proxy's sockets, none of it through
# the kernel. With "tcx" the flow is offered and counted where it failed
# (fast_path.udp_no_uplink); with "check_mtu" it is never offered (fast_path.udp_state
# "unavailable").
oldkernel_instance() {
	local what=$1 b a out fp0
	local tag=old-$what log=$TMP/twinstack.old-$what.log
	local name="older kernel ($what refused): starts with the fast path"
	config_main "$TMP/$tag.json" "$TUN4"
	if ! ts_start "$TMP/$tag.json" "$tag" env LD_PRELOAD="$OLDKERNEL" TS_OLDKERNEL="$what"; then
		not_ok "$name" "$TS_ERR"
		stop_pid "$TS_PID"
		return 1
	fi
	ok "$name" "pid $TS_PID"
	check "older kernel ($what refused): routes into the TUN ($TUN4)" routes_tun "$TUN4" ||
		{ stop_pid "$TS_PID"; return 1; }
	if [ "$what" = check_mtu ]; then
		check "older kernel ($what refused): stats: fast path on, its UDP flows unavailable" \
			fast_path_state on unavailable
		if grep -q 'UDP flows stay in userspace: load' "$log"; then
			ok "older kernel ($what refused): the log says why UDP stays in userspace" \
				"$(grep -m1 -o 'UDP flows stay in userspace.*' "$log" | cut -c1-140)"
		else
			not_ok "older kernel ($what refused): the log says why UDP stays in userspace" \
				"$(grep -m1 'fast path' "$log" | cut -c1-200)"
		fi
	else
		check "older kernel ($what refused): stats: fast path on, UDP flows too" fast_path_state on
	fi
	fp0=$(stats_json | jq -c .fast_path)
	check "older kernel ($what refused): http v4 from A: 100 MiB" \
		download "$NS_A" "http://$SRV4:$P_HTTP/file.bin"
	check "older kernel ($what refused): stats: the download took the fast path" \
		old_fast_download "$fp0"
	b=$(stats_json) ||
		{ not_ok "older kernel ($what refused): udp stream" "GET /stats failed"; stop_pid "$TS_PID"; return 1; }
	if out=$(inA "$PY" "$HERE/udpcheck.py" stream --dst "$SRV4:$P_BURST" --size 1000 \
		--count 300 --interval-ms 1 --wait 3 --min-pct 99 2>&1) && a=$(stats_json) &&
		jq -en --argjson b "$b" --argjson a "$a" --arg what "$what" '
			$a.fast_path.udp_datagrams_out == $b.fast_path.udp_datagrams_out and
			$a.fast_path.udp_datagrams_in == $b.fast_path.udp_datagrams_in and
			$a.fast_path.udp_flows == 0 and $a.fast_path.uplinks == 0 and
			($a.udp.datagrams_up - $b.udp.datagrams_up) >= 297 and
			($a.udp.datagrams_down - $b.udp.datagrams_down) >= 297 and
			(if $what == "tcx"
			 then ($a.fast_path.udp_no_uplink - $b.fast_path.udp_no_uplink) >= 1
			 else ($a.udp.fast_added - $b.udp.fast_added) == 0 and
			      ($a.fast_path.udp_no_uplink - $b.fast_path.udp_no_uplink) == 0 end)' \
			>/dev/null; then
		ok "older kernel ($what refused): udp: a stream arrives whole through the sockets" \
			"$out; $(jq -rn --argjson b "$b" --argjson a "$a" '"udp.datagrams_up +\($a.udp.datagrams_up - $b.udp.datagrams_up), fast_path.udp_no_uplink +\($a.fast_path.udp_no_uplink - $b.fast_path.udp_no_uplink), fast_path.uplinks \($a.fast_path.uplinks)"')"
	else
		not_ok "older kernel ($what refused): udp: a stream arrives whole through the sockets" \
			"$out; before $(jq -c '.fast_path' <<<"$b"), after $(stats_json | jq -c '[.fast_path, .udp.datagrams_up, .udp.fast_added]')"
	fi
	if [ "$what" = tcx ]; then
		if grep -qE "UDP flows out of $V_AB \(interface [0-9]+\) stay in userspace: uplink: the kernel has no tcx" "$log"; then
			ok "older kernel ($what refused): the log names the uplink and why UDP stays in userspace" \
				"$(grep -m1 -o 'UDP flows out of .*' "$log" | cut -c1-140)"
		else
			not_ok "older kernel ($what refused): the log names the uplink and why UDP stays in userspace" \
				"$(grep -m1 'stay in userspace' "$log" | cut -c1-200)"
		fi
	fi
	check "older kernel ($what refused): SIGTERM exits 0 within 2 s" ts_sigterm "$tag"
}
# old_fast_download FAST_PATH_BEFORE: one 100 MiB download, more than half of it through the
# fast path (as fast_downloads checks four).
old_fast_download() {
	local bytes
	bytes=$(stats_json | jq -r --argjson b "$1" '.fast_path.bytes - $b.bytes') ||
		{ echo "GET /stats failed"; return 1; }
	echo "fast_path.bytes +$((bytes >> 20)) MiB"
	[ "$bytes" -gt $((FILE_BYTES / 2)) ]
}
if [ "$STACK" = system ] && [ "$BYPASS" -eq 0 ] && [ "$HAVE_RUN" -eq 1 ] && [ "$SUBSET" -eq 0 ] &&
	[ "$FAST" -eq 1 ] && [ -n "$OLDKERNEL" ]; then
	oldkernel_instance tcx
	oldkernel_instance check_mtu
fi

# --- the proxy (or the bypass routes) ------------------------------------------------------
FDS_IDLE=
if [ "$BYPASS" -eq 1 ]; then
	check "bypass routes: A's server ranges over the veth" routes_bypass
else
	config_main "$TMP/main.json" "$TUN"
	check "config: twinstack check accepts the suite's config" "$BIN" check --config "$TMP/main.json"
	if ts_start "$TMP/main.json" main; then
		if grep -q ready "$TMP/twinstack.main.log"; then
			ok "start: ready byte on --ready-fd and a 'ready' log line" "pid $TS_PID"
		else
			not_ok "start: ready log line" "ready byte but no line containing 'ready' in the log"
		fi
	else
		not_ok "start: twinstack run --stack $STACK" "$TS_ERR"
		echo "$PASSED passed, $FAILED failed"
		exit 1
	fi
	# The proxy runs without glibc's per-thread cache (its blocks pin pages after a load):
	# `run` starts itself again with the setting, keeping its pid and the ready descriptor.
	if tr '\0' '\n' < "/proc/$TS_PID/environ" | grep -qx 'GLIBC_TUNABLES=glibc.malloc.tcache_count=0'; then
		ok "start: running without glibc's per-thread cache" "GLIBC_TUNABLES in its environment"
	else
		not_ok "start: running without glibc's per-thread cache" \
			"$(tr '\0' '\n' < "/proc/$TS_PID/environ" | grep GLIBC || echo 'no GLIBC_TUNABLES')"
	fi
	# ...and under the name it was started by, not "exe" (ps, top and pkill go by it).
	if [ "$(cat "/proc/$TS_PID/comm")" = "$(basename "$BIN" | cut -c1-15)" ]; then
		ok "start: named $(cat "/proc/$TS_PID/comm") after starting itself again" "/proc/PID/comm"
	else
		not_ok "start: named after its binary" "/proc/$TS_PID/comm is $(cat "/proc/$TS_PID/comm")"
	fi
	# OpenSSL and nghttp2 are opened only for DNS over TLS or HTTPS and QUIC sniffing, which
	# this config has none of: mapped, libcrypto alone would cost ~400 KiB of private memory.
	if grep -q 'libc\.so' "/proc/$TS_PID/maps" &&
		! grep -qE 'lib(crypto|ssl|nghttp2)\.so' "/proc/$TS_PID/maps"; then
		ok "start: no TLS library mapped (none configured)" "/proc/PID/maps"
	else
		not_ok "start: no TLS library mapped" "$(grep -oE '[^/]*lib(crypto|ssl|nghttp2)\.so[^ ]*' "/proc/$TS_PID/maps" | sort -u | tr '\n' ' ')"
	fi
	check "routes into the TUN ($TUN)" routes_tun "$TUN"
	check "stats: /stats has every documented key" stats_keys
	check "stats: the I/O mode asked for (offload $OFFLOAD, $QUEUES queue(s)) is in effect" stats_mode
	check "stats: fast_path.state \"$FP_STATE\" (stack $STACK, nat.fast_path ${FAST_PATH:-default})" \
		fast_path_state "$FP_STATE"
	FDS_IDLE=$(stat_get .fds)
	RX_START=$(stat_get .tun.rx_packets)
	note "idle: fds=$FDS_IDLE rss_kb=$(stat_get .rss_kb)"
fi

# --- assertions ------------------------------------------------------------------------------
[ "$BYPASS" -eq 0 ] && tx0=$(stat_get .tun.tx_bytes) && gso0=$(stat_get .tun.rx_gso) &&
	rw0=$(stat_get .tun.rewrites) && fp0=$(stats_json | jq -c .fast_path)
[ "$BYPASS" -eq 0 ] && [ "$STACK" = lwip ] && big0=$(stats_json | jq -r '.stack_counters.gso_big_packets // 0') &&
	lent0=$(stat_get .driver.tx_lent) &&
	big_lent0=$(stats_json | jq -r '.stack_counters.big_lent // 0')
check "http v4 from A: 100 MiB" download "$NS_A" "http://$SRV4:$P_HTTP/file.bin"
check "http v6 from A: 100 MiB" download "$NS_A" "http://[$SRV6]:$P_HTTP/file.bin"
check "http v4 from C (gateway mode): 100 MiB" download "$NS_C" "http://$SRV4:$P_HTTP/file.bin"
check "http v6 from C (gateway mode): 100 MiB" download "$NS_C" "http://[$SRV6]:$P_HTTP/file.bin"
# The downloads took the path under test: the in-kernel fast path, or the TUN's userspace path.
if [ "$BYPASS" -eq 0 ] && [ "$FAST" -eq 1 ]; then
	check "stats: the downloads took the in-kernel fast path, not the TUN's userspace path" \
		fast_downloads "$tx0" "$rw0" "$fp0"
elif [ "$BYPASS" -eq 0 ]; then
	check "stats: the downloads crossed the TUN" downloads_crossed "$tx0" 4
fi
if [ "$BYPASS" -eq 0 ] && [ "$STACK" = lwip ]; then
	check "stats: lwIP's downloads in large segments (offload $OFFLOAD)" lwip_big "$big0" "$lent0" "$big_lent0"
fi
# The downloads' data is read from the TUN only by the system stack (its listener's segments
# loop through it); the bulk echo sends large uplink writes through both stacks.
check "tcp: 32 MiB bulk echo v4, both directions at once, sha256" \
	inA "${TSNET[@]}" bulk-echo --host "$SRV4" --port "$P_ECHO" --mib 32 --timeout 30
# With the fast path, the bulk transfers' super-packets never reach the proxy (the instance
# without it checked tun.rx_gso): the fast path must have taken them whole.
if [ "$BYPASS" -eq 0 ] && [ "$FAST" -eq 1 ]; then
	check "stats: the fast path took the bulk transfers' super-packets whole (offload $OFFLOAD)" \
		fast_whole "$fp0"
	check "stats: short connections mostly stay off the fast path ($SHORT_CONNS half-closes)" \
		fast_short
	check "udp: a 1.5 s stream (v4) through the in-kernel fast path, one session past the idle timeout" \
		fast_udp "$SRV4"
	check "udp: a 1.5 s stream (v6) through the in-kernel fast path, one session past the idle timeout" \
		fast_udp "[$SRV6]"
	check "udp: a change of routes takes the flow back to its socket, and it joins again" \
		fast_udp_reroute
	check "udp: the stream's flows leave the fast path with their sessions" fast_udp_gone
elif [ "$BYPASS" -eq 0 ] && [ "$FAST" -eq 0 ]; then
	check "stats: tun.rx_gso after the bulk transfers (offload $OFFLOAD)" gso_moved "$gso0"
fi
if [ "$BYPASS" -eq 0 ] && [ "$STACK" = lwip ]; then
	check "stats: lwIP uploads taken from the read buffers uncopied (offload $OFFLOAD) and handed on from lwIP's" lwip_gathered
fi
if [ "$BYPASS" -eq 0 ] && [ "$FAST" -eq 0 ]; then
	check "stats: TUN reads and writes in rounds (tun.io_uring $IO_URING)" uring_rounds
fi
if [ "$BYPASS" -eq 0 ] && [ "$FAST" -eq 0 ]; then
	queue_checks ""
fi

# udp_echo_counted: the v4 echo (3 datagrams of 70, 470 and 870 payload bytes each way) moves
# udp.datagrams_* and udp.bytes_* by exactly that. A flow the in-kernel fast path took (it
# joins once it has gone on for 10 ms: a slow machine may stretch the three echoes that long)
# is counted there instead: its datagrams, and their bytes less 28 of headers each, are added.
udp_echo_counted() {
	local b a
	b=$(stats_json) || return 1
	inA "${TSNET[@]}" udp-echo --host "$SRV4" --port "$P_ECHO" --timeout 3 || return 1
	a=$(stats_json) || return 1
	jq -rn --argjson b "$b" --argjson a "$a" '
		def d(p): ($a | getpath(p) // 0) - ($b | getpath(p) // 0);
		def fp(dir): d(["fast_path", "udp_datagrams_" + dir]);
		def fpb(dir): d(["fast_path", "udp_bytes_" + dir]) - 28 * fp(dir);
		"udp.datagrams_up +\(d(["udp", "datagrams_up"]) + fp("out"))",
		"udp.bytes_up +\(d(["udp", "bytes_up"]) + fpb("out"))",
		"udp.datagrams_down +\(d(["udp", "datagrams_down"]) + fp("in"))",
		"udp.bytes_down +\(d(["udp", "bytes_down"]) + fpb("in"))"' | paste -sd' ' |
		grep -qx 'udp.datagrams_up +3 udp.bytes_up +1410 udp.datagrams_down +3 udp.bytes_down +1410' || {
		echo "counters moved: $(jq -rn --argjson b "$b" --argjson a "$a" '"\($a.udp.datagrams_up - $b.udp.datagrams_up) / \($a.udp.bytes_up - $b.udp.bytes_up) up, \($a.udp.datagrams_down - $b.udp.datagrams_down) / \($a.udp.bytes_down - $b.udp.bytes_down) down"')"
		return 1
	}
	echo "3 datagrams, 1410 bytes each way counted"
}
if [ "$BYPASS" -eq 0 ]; then
	check "udp echo v4, counted in udp.datagrams_* and udp.bytes_*" udp_echo_counted
else
	check "udp echo v4" inA "${TSNET[@]}" udp-echo --host "$SRV4" --port "$P_ECHO" --timeout 3
fi
check "udp echo v6" inA "${TSNET[@]}" udp-echo --host "$SRV6" --port "$P_ECHO" --timeout 3
check "udp echo v4 from C" inC "${TSNET[@]}" udp-echo --host "$SRV4" --port "$P_ECHO" --timeout 3

# udp_burst NS HOST: 320 datagrams of 1,000 bytes (sequence number and hash each, 0.2 ms
# apart) to the server that echoes 16 at a time in one UDP GSO send, so 16 replies reach the
# proxy's socket together: at least 99 % echoed and none corrupt, and with offload the proxy
# read them in runs (UDP GRO, at least half of them) and wrote them to the TUN in trains (UDP
# GSO; at least one train per two bursts), per-packet neither.
#
# With the in-kernel fast path the flow joins it 10 ms in, and the replies after that never
# reach the proxy: the fast path must have handed at least half of them to the TUN itself
# (fast_path.udp_datagrams_in counts a GSO packet's datagrams), intact as above.
udp_burst() {
	local ns=$1 host=$2 t0 t1 g0 g1 f0 f1 out
	t0=$(stat_get .udp.trains) && g0=$(stat_get .udp.gro_datagrams) &&
		f0=$(stat_get .fast_path.udp_datagrams_in) || return 1
	out=$(ip netns exec "$ns" "$PY" "$HERE/udpcheck.py" stream --dst "$host:$P_BURST" \
		--size 1000 --count 320 --interval-ms 0.2 --wait 3 --min-pct 99) || { echo "$out"; return 1; }
	t1=$(stat_get .udp.trains) && g1=$(stat_get .udp.gro_datagrams) &&
		f1=$(stat_get .fast_path.udp_datagrams_in) || return 1
	echo "$out; udp.trains +$((t1 - t0)), udp.gro_datagrams +$((g1 - g0))," \
		"fast_path.udp_datagrams_in +$((f1 - f0))"
	if [ "$FAST" -eq 1 ]; then
		[ $((f1 - f0)) -ge 160 ] ||
			{ echo "want fast_path.udp_datagrams_in +160 or more"; return 1; }
	elif [ "$OFFLOAD" = on ]; then
		[ $((t1 - t0)) -ge 10 ] || { echo "want udp.trains +10 or more"; return 1; }
		# The server's GSO sends cross the veth whole, and the proxy's socket (UDP_GRO)
		# reads each in one piece.
		[ $((g1 - g0)) -ge 160 ] || { echo "want udp.gro_datagrams +160 or more"; return 1; }
	else
		[ $((t1 - t0)) -eq 0 ] && [ $((g1 - g0)) -eq 0 ] ||
			{ echo "per-packet I/O wrote trains or read runs"; return 1; }
	fi
}
if [ "$BYPASS" -eq 0 ]; then
	Q_BEFORE_BURSTS=$(stat_get .buffers.quiet_trims)
	check "udp: bursts of replies intact, in trains with offload (v4)" udp_burst "$NS_A" "$SRV4"
	check "udp: bursts of replies intact, in trains with offload (v6)" udp_burst "$NS_A" "[$SRV6]"
	check "udp: bursts of replies intact, in trains with offload (v4 from C, forwarded)" \
		udp_burst "$NS_C" "$SRV4"
	# quiet_trimmed N: buffers.quiet_trims is above N.
	quiet_trimmed() { [ "$(stat_get .buffers.quiet_trims)" -gt "$1" ]; }
	# memory_back: the bursts moved over 1 MiB through queue 0 and nothing follows them, so
	# the heap is trimmed about a second after the last one (runtime/memback.c).
	memory_back() {
		local q0=$1
		wait_until 40 0.1 quiet_trimmed "$q0" ||
			{ echo "buffers.quiet_trims still $(stat_get .buffers.quiet_trims)"; return 1; }
		echo "buffers.quiet_trims $q0 -> $(stat_get .buffers.quiet_trims)"
	}
	# With the fast path the bursts' replies after the first 10 ms never reach the proxy.
	if [ "$QUEUES" -eq 1 ] && [ "$FAST" -eq 0 ]; then
		check "memory back a second after the UDP bursts (quiet trim)" \
			memory_back "$Q_BEFORE_BURSTS"
	fi
fi

check "tcp: 200 concurrent connections echo distinct payloads" \
	inA "${TSNET[@]}" echo-many --host "$SRV4" --port "$P_ECHO" -n 200 --timeout 30

# full_suite: everything between the 200 connections and the teardown (the subset skips it).
full_suite() {
	if [ "$BYPASS" -eq 1 ]; then
		check "dns: dnsmasq answers directly (bypass)" dig_a "$NS_A" "$B_A4"
		skip "dns hijack v4" "bypass"
		skip "dns hijack v6" "bypass"
	else
		check "dns hijack: query to routed $DNS4 answered by the upstream" dig_a "$NS_A" "$DNS4"
		check "dns hijack: query to routed $DNS6 answered by the upstream" dig_a "$NS_A" "$DNS6"
	fi

	check "tcp: half-close, the reply completes after shutdown(SHUT_WR)" \
		inA "${TSNET[@]}" half-close --host "$SRV4" --port "$P_ECHO" --timeout 10
	if [ "$BYPASS" -eq 0 ] && [ "$STACK" = system ] && [ "$OFFLOAD" = on ]; then
		check "tcp: accepted sockets carry nat.accepted_sndbuf (no autotuning)" sndbuf_applied
	fi
	if [ "$BYPASS" -eq 0 ] && [ "$STACK" = system ]; then
		check "tcp: accepted sockets carry nat.accepted_congestion (reno)" congestion_applied
	fi

	check "tcp: closed port in B fails with RST within 1 s (v4)" \
		inA "${TSNET[@]}" rst --host "$SRV4" --port "$P_CLOSED" --within 1
	check "tcp: closed port in B fails with RST within 1 s (v6)" \
		inA "${TSNET[@]}" rst --host "$SRV6" --port "$P_CLOSED" --within 1
	if [ "$BYPASS" -eq 1 ]; then
		skip "reject rule" "bypass (no proxy)"
	else
		check "reject rule: $REJ4 refused within 1 s" inA "${TSNET[@]}" rst --host "$REJ4" --port "$P_HTTP"
		check "reject rule: $REJ6 refused within 1 s" inA "${TSNET[@]}" rst --host "$REJ6" --port "$P_HTTP"
	fi

	# ICMP: nothing but echo to the gateway is answered; the rest is dropped and counted.
	if [ "$BYPASS" -eq 1 ]; then
		check "icmp: ping to a routed remote address, no reply" no_reply "$NS_A" "$NOSRV4"
		skip "icmp: NAT address / drops.icmp" "bypass (no proxy)"
	else
		icmp0=$(stat_get .drops.icmp)
		check "icmp: ping to the NAT address $NAT4, no reply" no_reply "$NS_A" "$NAT4"
		check "icmp: ping to routed $NOSRV4, no reply" no_reply "$NS_A" "$NOSRV4"
		icmp1=$(stat_get .drops.icmp)
		if [[ "$icmp0" =~ ^[0-9]+$ && "$icmp1" =~ ^[0-9]+$ ]] && [ $((icmp1 - icmp0)) -ge 4 ]; then
			ok "icmp: drops.icmp moved by the 4 pings" "$icmp0 -> $icmp1"
		else
			not_ok "icmp: drops.icmp moved by the 4 pings" "$icmp0 -> $icmp1"
		fi
		check "icmp: ping to the NAT address $NAT6, no reply" no_reply "$NS_A" "$NAT6"
		check "icmp: ping to routed $NOSRV6, no reply" no_reply "$NS_A" "$NOSRV6"
	fi

	# iperf3: the bare veth (B's veth address, never through the TUN) next to the path under test.
	for n in 1 8; do
		check "iperf3 bare veth, $n stream(s), ${IPERF_S} s" iperf "$NS_A" "$B_A4" "$n"
		GBPS[veth$n]=$IPERF_GBPS
		if [ "$BYPASS" -eq 0 ]; then
			check "iperf3 through twinstack ($STACK), $n stream(s), ${IPERF_S} s" iperf "$NS_A" "$SRV4" "$n"
			GBPS[stack$n]=$IPERF_GBPS
		fi
	done

	if [ "$BYPASS" -eq 1 ]; then
		skip "metrics: /metrics parses as Prometheus text" "bypass"
	else
		check "metrics: /metrics parses as Prometheus text" metrics_parse
	fi
}
declare -A GBPS
[ "$SUBSET" -eq 1 ] || full_suite

if [ "$BYPASS" -eq 1 ]; then
	skip "teardown: zero NAT entries, sessions, pipes, fast-path connections; fds at idle" "bypass"
	skip "SIGTERM exits 0 within 2 s" "bypass"
else
	# linger 300 ms + quarantine 500 ms + udp idle 1 s: idle well within 10 s.
	if wait_until 40 0.25 idle_state >/dev/null; then
		ok "teardown: zero NAT entries, sessions, pipes, fast-path connections; fds at idle" "$(idle_state)"
	else
		not_ok "teardown: zero NAT entries, sessions, pipes, fast-path connections; fds at idle" "after 10 s: $(idle_state)"
	fi
	if [ "$QUEUES" -gt 1 ]; then
		check "stats: per-queue tun.qN.rx_packets add up to tun.rx_packets ($QUEUES queues)" \
			queues_sum "$RX_START"
	fi
	note "stats: $(stats_json | jq -c '{rss_kb, peak_rss_kb, fds, sessions, drops: (.drops | with_entries(select(.value != 0))), buffers, tun, tun_device, fast_path}')"
	check "SIGTERM exits 0 within 2 s" ts_sigterm main
fi

# --- the socks5 outbound ---------------------------------------------------------------------
if [ "$SUBSET" -eq 1 ]; then
	: # full suite only
elif [ "$BYPASS" -eq 1 ]; then
	check "socks5 (bypass, curl straight to microsocks with auth): 100 MiB v4" download "$NS_A" \
		"http://$SRV4:$P_HTTP/file.bin" -x "socks5://$SOCKS_USER:$SOCKS_PASS@$SRV4:$P_SOCKS"
	check "socks5 (bypass, curl straight to microsocks on v6): 100 MiB v6" download "$NS_A" \
		"http://[$SRV6]:$P_HTTP/file.bin" -x "socks5://[$SRV6]:$P_SOCKS6"
else
	config_socks "$TMP/socks.json" "$TUN2"
	if ts_start "$TMP/socks.json" socks; then
		ok "socks5: second instance (final outbound socks5) ready" "pid $TS_PID"
		check "socks5: routes into the TUN ($TUN2)" routes_tun "$TUN2"
		check "socks5 outbound (user/password, v4 server): 100 MiB v4" download "$NS_A" \
			"http://$SRV4:$P_HTTP/file.bin"
		check "socks5 outbound (no auth, v6 server): 100 MiB v6" download "$NS_A" \
			"http://[$SRV6]:$P_HTTP/file.bin"
		check "socks5: SIGTERM exits 0 within 2 s" ts_sigterm socks
	else
		not_ok "socks5: second instance ready" "$TS_ERR"
	fi
fi

# --- summary ---------------------------------------------------------------------------------
[ "$SUBSET" -eq 0 ] &&
	note "iperf3, ${IPERF_S} s, A -> B, Gbit/s (one run)   1 stream   8 streams    (relay ${RELAY:-default}, offload $OFFLOAD, $QUEUES queue(s))" &&
	note "$(printf '  %-36s %8s %10s' 'bare veth' "${GBPS[veth1]:-n/a}" "${GBPS[veth8]:-n/a}")"
if [ "$BYPASS" -eq 0 ] && [ "$SUBSET" -eq 0 ]; then
	note "$(printf '  %-36s %8s %10s' "through twinstack ($STACK)" "${GBPS[stack1]:-n/a}" "${GBPS[stack8]:-n/a}")"
	note "$(awk -v a="${GBPS[stack1]:-0}" -v b="${GBPS[veth1]:-0}" -v c="${GBPS[stack8]:-0}" -v d="${GBPS[veth8]:-0}" \
		'BEGIN { printf "  %-36s %8s %10s", "ratio stack/veth", (b > 0 ? sprintf("%.2f", a / b) : "n/a"), (d > 0 ? sprintf("%.2f", c / d) : "n/a") }')"
fi
note "elapsed $(($(elapsed_ms "$T_START") / 1000)) s"
if [ "$SKIPPED" -gt 0 ]; then
	echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
else
	echo "$PASSED passed, $FAILED failed"
fi
[ "$FAILED" -eq 0 ]
