#!/usr/bin/env bash
# linkbed.sh — link conditions without netem: a three-namespace testbed whose middle namespace
# delays every packet (twinstack-delayline, bench/delayline.c) and drops a set share of them
# (nftables numgen), its calibration, and the test that ctest runs (delayline_netns).
#
#   ns A (tslA-TOK)             ns M (tslM-TOK)                              ns B (tslB-TOK)
#   tlA-TOK 10.210.1.1/24 ---- tlMa-TOK 10.210.1.2/24   tlMb-TOK 10.210.2.2/24 ---- tlB-TOK
#   default via 10.210.1.2      (noprefixroute)                              10.210.2.1/24
#                               main: 10.210.1.0/24, 10.210.2.0/24 dev tlT-TOK   default via
#                               rule "iif tlT-TOK lookup 100": the veth routes   10.210.2.2
#                               tlT-TOK: twinstack-delayline --delay-ms RTT/2
#   table netdev tslink         table inet tslink (forward, output): counters  table netdev
#   (ingress of tlA-TOK): loss  [--loss-unit packet: the loss rule]            tslink: loss
#
# Each packet from A to B (and back) is routed into the TUN, held RTT/2 by the delay line,
# written back into the TUN and, arriving from it, routed by table 100 out of the other veth.
#
# Loss: `numgen random mod 1000000 < PPM drop` with PPM = loss % x 10000 (parts per million),
# independently in each direction ("both", the default), or only A to B ("ab") or B to A
# ("ba"). TCP hands the veths 64 KiB super-packets (TSO/GSO), and the delay line keeps them
# whole; where the loss rule sits decides what one drop takes:
#   --loss-unit segment (default): TSO off on M's two veths, so the kernel cuts each
#     super-packet into wire-size segments as it leaves M, and the rule sits in the ingress
#     hook of the receiving end's veth (table netdev tslink in B for A to B, in A for B to A;
#     GRO off there): one drop is one segment, as on a lossy link. The cutting costs the delay
#     line's thread (it runs in its writes), nothing else changes.
#   --loss-unit packet: the rule in M's forward hook (table inet tslink), on the way into the
#     TUN (a packet meets the forward hook twice, in and out of the TUN): one drop takes a
#     whole super-packet, up to 45 segments at once.
# --veth-offload off turns TSO, GSO and GRO off on all four veths: TCP itself sends wire-size
# segments, and the delay line moves ~45x more packets (its ceiling drops to match).
# Only IPv4/IPv6 packets are dropped (ARP is not).
#
# A and B: TCP congestion control pinned (--cc NAME, default reno; --cc host: the one a new
# namespace inherits from the host, read in A; read back either way), tcp_rmem and
# tcp_wmem maxima raised to 128 MiB (a 50 ms bandwidth-delay product at 10 Gbit/s is 62.5 MB),
# rp_filter off. M: forwarding on, IPv6 off (so nothing of M's own reaches the TUN).
#
# usage: linkbed.sh calibrate [--rtt-ms R] [--loss PCT] [OPTIONS] [--ceiling] [--iperf S]
#        linkbed.sh up [--rtt-ms R] [--loss PCT] [OPTIONS]
#        linkbed.sh check
# Options: --bin PATH (twinstack-delayline; default build/twinstack-delayline),
#   --loss-dir both|ab|ba, --loss-unit segment|packet, --veth-offload on|off, --cc NAME|host,
#   --udp-count N (the loss probe's datagrams; default 200000), --no-rt (the delay line under
#   the default scheduling policy instead of SCHED_FIFO 10), --keep, -v.
#  calibrate: build the testbed, then measure and print one JSON record: ping RTT (20 pings,
#    median: within 10 % of R passes), the loss a receiver counts of N UDP datagrams from A to
#    B (within +-20 % of PCT passes) with their one-way delay, the rule's own counters and
#    the delay line's; --ceiling adds iperf3 -t 3 (-O 1) A to B with reno and bbr at 0 ms and
#    at R, loss off, and through M without the delay line (plain forwarding) for reference;
#    --iperf S adds iperf3 -t S at the set conditions, reno and bbr (throughput,
#    retransmits, the rule's drops, the line's late sends).
#  up: build the testbed, print {"ns_a", "ns_b", "ns_m", "addr_a", "addr_b", "net_t",
#    "tcp_congestion" (the name pinned, host resolved), ...} as one
#    JSON line, hold it until SIGTERM/SIGINT, tear it down (for running other tools through).
#  check: the short test (RTT 10 ms, 1 % loss both ways, about 10 s): ping median within
#    10 %, 30,000 datagrams' loss within +-20 % and their one-way delay within 10 % of 5 ms,
#    every packet the forward path sent into the TUN read by the delay line and every packet
#    it wrote back forwarded (nftables counters = the line's counters), then a 16 MiB
#    transfer B to A with loss off: sha256 equal, GSO super-packets carried, no queue drop.
# Output: calibrate/up: JSON on stdout, notes on stderr; check: 'ok - NAME' / 'not ok - NAME:
# REASON' lines, then 'N passed, N failed'.
# Exit: 0 done and within bounds, 1 out of bounds or a step failed, 2 bad arguments, 77 cannot
# run here (not root; no nft, iperf3, ip netns or /dev/net/tun).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$HERE/.." && pwd)
BIN=$SRC/build/twinstack-delayline
MODE=${1:-}
RTT_MS=0 LOSS=0 LOSS_DIR=both LOSS_UNIT=segment VOFF=on CC=reno UDP_COUNT="" CEILING=0
IPERF_S=0 KEEP_TMP=0 RT=10 VERBOSE=0

usage() { sed -n '/^# usage:/,/^# Exit:/p' "$0" | sed 's/^# \{0,1\}//'; }
case $MODE in
calibrate | up | check) shift ;;
-h | --help) usage; exit 0 ;;
*) echo "linkbed.sh: first argument: calibrate, up or check" >&2; usage >&2; exit 2 ;;
esac
while [ $# -gt 0 ]; do
	case $1 in
	--bin) BIN=${2:?}; shift 2 ;;
	--rtt-ms) RTT_MS=${2:?}; shift 2 ;;
	--loss) LOSS=${2:?}; shift 2 ;;
	--loss-dir) LOSS_DIR=${2:?}; shift 2 ;;
	--loss-unit) LOSS_UNIT=${2:?}; shift 2 ;;
	--veth-offload) VOFF=${2:?}; shift 2 ;;
	--cc) CC=${2:?}; shift 2 ;;
	--udp-count) UDP_COUNT=${2:?}; shift 2 ;;
	--ceiling) CEILING=1; shift ;;
	--iperf) IPERF_S=${2:?}; shift 2 ;;
	--no-rt) RT=0; shift ;;
	--keep) KEEP_TMP=1; shift ;;
	-v | --verbose) VERBOSE=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "linkbed.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
	esac
done
case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
num() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }
if ! { num "$RTT_MS" && num "$LOSS" && [[ $IPERF_S =~ ^[0-9]+$ ]] &&
	awk -v r="$RTT_MS" -v l="$LOSS" 'BEGIN { exit !(r <= 10000 && l <= 100) }'; }; then
	echo "linkbed.sh: --rtt-ms 0..10000, --loss 0..100 (percent), --iperf whole seconds" >&2
	exit 2
fi
case $LOSS_DIR in both | ab | ba) ;; *) echo "linkbed.sh: --loss-dir both|ab|ba" >&2; exit 2 ;; esac
case $LOSS_UNIT in segment | packet) ;; *) echo "linkbed.sh: --loss-unit segment|packet" >&2; exit 2 ;; esac
case $VOFF in on | off) ;; *) echo "linkbed.sh: --veth-offload on|off" >&2; exit 2 ;; esac
[ -z "$UDP_COUNT" ] || [[ $UDP_COUNT =~ ^[0-9]+$ ]] || { echo "linkbed.sh: --udp-count N" >&2; exit 2; }
if [ "$MODE" = check ]; then
	RTT_MS=10 LOSS=1 LOSS_DIR=both LOSS_UNIT=segment VOFF=on CC=reno UDP_COUNT=30000
fi
[ -n "$UDP_COUNT" ] || UDP_COUNT=200000

skip77() { echo "# SKIP: $*"; [ "$MODE" = check ] && echo "0 passed, 0 failed"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip77 "needs root"
for t in nft iperf3; do
	command -v "$t" >/dev/null 2>&1 || skip77 "no $t (Debian packages nftables, iperf3)"
done
[ -c /dev/net/tun ] || skip77 "no /dev/net/tun"
ip netns list >/dev/null 2>&1 || skip77 "no ip netns"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
for t in ip ss jq socat ping sha256sum timeout awk "$PY"; do
	command -v "$t" >/dev/null 2>&1 || { echo "linkbed.sh: missing $t" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "linkbed.sh: no delay line at $BIN (--bin)" >&2; exit 1; }
command -v ethtool >/dev/null 2>&1 || { echo "linkbed.sh: missing ethtool" >&2; exit 1; }

TOK=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
TMP=$(mktemp -d "${TMPDIR:-/tmp}/twinstack-linkbed.XXXXXX")
NS_A=tslA-$TOK NS_M=tslM-$TOK NS_B=tslB-$TOK
V_A=tlA-$TOK V_MA=tlMa-$TOK V_MB=tlMb-$TOK V_B=tlB-$TOK TUN=tlT-$TOK
NET_A=10.210.1.0/24 NET_B=10.210.2.0/24 ADDR_A=10.210.1.1 ADDR_B=10.210.2.1 TABLE=100
# A prefix behind B (routed to it through the line, like NET_B): for a target that B serves
# on its loopback, or proxies for A through a TUN of its own (the rig's link cells).
NET_T=10.210.9.0/24
PIDS=() NETNS=() DL_PID="" PASSED=0 FAILED=0

note() { echo "# $*" >&2; }
vnote() { [ "$VERBOSE" -eq 1 ] && echo "# $*" >&2; return 0; }
inA() { ip netns exec "$NS_A" "$@"; }
inM() { ip netns exec "$NS_M" "$@"; }
inB() { ip netns exec "$NS_B" "$@"; }

cleanup() {
	local pid ns
	trap - EXIT INT TERM
	for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
	sleep 0.2
	for pid in "${PIDS[@]}"; do
		kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	# Whatever still runs inside our namespaces was started here.
	for ns in "${NETNS[@]}"; do
		for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
	done
	for ns in "${NETNS[@]}"; do ip netns del "$ns" 2>/dev/null; done
	if [ "$KEEP_TMP" -eq 1 ]; then echo "# work directory kept: $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_until TRIES INTERVAL CMD...: CMD until it succeeds, at most TRIES times.
wait_until() {
	local tries=$1 interval=$2 i
	shift 2
	for ((i = 0; i < tries; i++)); do
		"$@" && return 0
		sleep "$interval"
	done
	return 1
}
# spawn NS LOG CMD...: CMD in NS in the background (SPAWNED = its pid, killed by cleanup).
spawn() {
	local ns=$1 log=$2
	shift 2
	ip netns exec "$ns" "$@" </dev/null >"$log" 2>&1 &
	SPAWNED=$!
	PIDS+=("$SPAWNED")
}
listening() { ip netns exec "$1" ss "-l${2}nH" "sport = :$3" 2>/dev/null | grep -q .; }

# --- the testbed ------------------------------------------------------------------------------
ns_add() {
	ip netns add "$1" || return 1
	NETNS+=("$1")
	ip -n "$1" link set lo up &&
		ip netns exec "$1" sysctl -qw net.ipv4.conf.all.rp_filter=0 \
			net.ipv4.conf.default.rp_filter=0 >/dev/null
}

# The end namespaces' TCP: the congestion control pinned and read back, 128 MiB buffers.
tcp_setup() {
	local ns=$1 got
	ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$CC" \
		net.ipv4.tcp_rmem="4096 131072 134217728" \
		net.ipv4.tcp_wmem="4096 16384 134217728" >/dev/null || return 1
	got=$(ip netns exec "$ns" sysctl -n net.ipv4.tcp_congestion_control)
	[ "$got" = "$CC" ] || { note "$ns: congestion control $got, not $CC"; return 1; }
}
set_cc() { # NAME|host: both end namespaces; host: the one A inherited, so CC names it after
	CC=$1
	if [ "$CC" = host ]; then
		CC=$(ip netns exec "$NS_A" sysctl -n net.ipv4.tcp_congestion_control) && [ -n "$CC" ] ||
			{ note "$NS_A: cannot read its congestion control"; return 1; }
	fi
	tcp_setup "$NS_A" && tcp_setup "$NS_B"
}

bed_up() {
	ns_add "$NS_A" && ns_add "$NS_M" && ns_add "$NS_B" || return 1
	ip link add "$V_A" netns "$NS_A" type veth peer name "$V_MA" netns "$NS_M" &&
		ip link add "$V_B" netns "$NS_B" type veth peer name "$V_MB" netns "$NS_M" || return 1
	inM sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.disable_ipv6=1 \
		net.ipv6.conf.default.disable_ipv6=1 >/dev/null || return 1
	ip -n "$NS_A" addr add "$ADDR_A/24" dev "$V_A" &&
		ip -n "$NS_B" addr add "$ADDR_B/24" dev "$V_B" &&
		ip -n "$NS_M" addr add 10.210.1.2/24 dev "$V_MA" noprefixroute &&
		ip -n "$NS_M" addr add 10.210.2.2/24 dev "$V_MB" noprefixroute || return 1
	local dev
	for dev in "$NS_A:$V_A" "$NS_M:$V_MA" "$NS_M:$V_MB" "$NS_B:$V_B"; do
		ip -n "${dev%%:*}" link set "${dev#*:}" txqueuelen 10000 up || return 1
		if [ "$VOFF" = off ]; then
			ip netns exec "${dev%%:*}" ethtool -K "${dev#*:}" tso off gso off gro off \
				>/dev/null 2>&1 || return 1
		fi
	done
	if [ "$LOSS_UNIT" = segment ]; then
		inM ethtool -K "$V_MA" tso off >/dev/null 2>&1 &&
			inM ethtool -K "$V_MB" tso off >/dev/null 2>&1 &&
			inA ethtool -K "$V_A" gro off >/dev/null 2>&1 &&
			inB ethtool -K "$V_B" gro off >/dev/null 2>&1 || return 1
	fi
	ip -n "$NS_A" route add default via 10.210.1.2 &&
		ip -n "$NS_B" route add default via 10.210.2.2 || return 1
	ip -n "$NS_M" route add "$NET_A" dev "$V_MA" table "$TABLE" &&
		ip -n "$NS_M" route add "$NET_B" dev "$V_MB" table "$TABLE" &&
		ip -n "$NS_M" route add "$NET_T" via "$ADDR_B" dev "$V_MB" table "$TABLE" &&
		ip -n "$NS_M" rule add iif "$TUN" lookup "$TABLE" pref 100 || return 1
	set_cc "$CC" || return 1
	loss_set 0
}

# loss_set PCT: PCT % loss in LOSS_DIR (0: none) where LOSS_UNIT puts it, all counters zero.
# M's table counts: c_into (packets forwarded into the TUN, after any loss), c_back (packets
# out of the TUN forwarded on), c_mine (M's own packets routed into the TUN); with
# --loss-unit packet it also holds the loss rule. The loss rule's counters: c_seen, c_dropped.
loss_set() {
	local ppm match="" rule="" ns dev want
	ppm=$(awk -v l="$1" 'BEGIN { printf "%d", l * 10000 + 0.5 }')
	if [ "$LOSS_UNIT" = packet ]; then
		case $LOSS_DIR in
		ab) match="iifname \"$V_MA\"" ;;
		ba) match="iifname \"$V_MB\"" ;;
		esac
		rule="oifname \"$TUN\" $match meta protocol { ip, ip6 } counter name c_seen
		oifname \"$TUN\" $match meta protocol { ip, ip6 } numgen random mod 1000000 < $ppm counter name c_dropped drop"
	fi
	inM nft delete table inet tslink 2>/dev/null
	inM nft -f - <<EOF || return 1
table inet tslink {
	counter c_seen { }
	counter c_dropped { }
	counter c_into { }
	counter c_back { }
	counter c_mine { }
	chain forward {
		type filter hook forward priority 0; policy accept;
		iifname "$TUN" counter name c_back accept
		$rule
		oifname "$TUN" counter name c_into
	}
	chain output {
		type filter hook output priority 0; policy accept;
		oifname "$TUN" counter name c_mine
	}
}
EOF
	# The receiving ends: B takes the A to B direction, A the other.
	for ns in "$NS_A:$V_A:ba" "$NS_B:$V_B:ab"; do
		dev=${ns#*:} dev=${dev%%:*} want=${ns##*:} ns=${ns%%:*}
		ip netns exec "$ns" nft delete table netdev tslink 2>/dev/null
		[ "$LOSS_UNIT" = segment ] || continue
		[ "$LOSS_DIR" = both ] || [ "$LOSS_DIR" = "$want" ] || continue
		ip netns exec "$ns" nft -f - <<EOF || return 1
table netdev tslink {
	counter c_seen { }
	counter c_dropped { }
	chain lossy {
		type filter hook ingress device "$dev" priority 0; policy accept;
		meta protocol { ip, ip6 } counter name c_seen
		meta protocol { ip, ip6 } numgen random mod 1000000 < $ppm counter name c_dropped drop
	}
}
EOF
	done
}
# nft_counter NAME: packets of M's counter c_NAME.
nft_counter() { inM nft -j list counter inet tslink "c_$1" | jq '.nftables[1].counter.packets'; }
# loss_counter seen|dropped: the loss rule's packets, both directions summed.
loss_counter() {
	local n=0 ns v
	if [ "$LOSS_UNIT" = packet ]; then nft_counter "$1"; return; fi
	for ns in "$NS_A" "$NS_B"; do
		v=$(ip netns exec "$ns" nft -j list counter netdev tslink "c_$1" 2>/dev/null |
			jq '.nftables[1].counter.packets') || v=0
		n=$((n + ${v:-0}))
	done
	echo "$n"
}

# Routing in M: "tun" through the delay line, "direct" straight between the veths.
route_mode() {
	local net dev
	for net in "$NET_A:$V_MA" "$NET_B:$V_MB"; do
		dev=$TUN
		[ "$1" = direct ] && dev=${net#*:}
		ip -n "$NS_M" route replace "${net%%:*}" dev "$dev" || return 1
	done
	if [ "$1" = direct ]; then
		ip -n "$NS_M" route replace "$NET_T" via "$ADDR_B" dev "$V_MB" || return 1
	else
		ip -n "$NS_M" route replace "$NET_T" dev "$TUN" || return 1
	fi
}

# dl_start ONE_WAY_MS: the delay line on a new TUN, the routes through it. dl_stop prints
# its counters (the JSON line it writes on SIGTERM) into $TMP/dl.json.
dl_start() {
	[ -z "$DL_PID" ] || dl_stop
	local rt=()
	[ "$RT" -eq 0 ] || rt=(--rt-priority "$RT")
	ip netns exec "$NS_M" "$BIN" --dev "$TUN" --delay-ms "$1" "${rt[@]}" </dev/null \
		>"$TMP/dl.out" 2>"$TMP/dl.err" &
	DL_PID=$!
	PIDS+=("$DL_PID")
	dl_up() { ip -n "$NS_M" link show dev "$TUN" up 2>/dev/null | grep -q UP; }
	wait_until 100 0.05 dl_up || { note "delay line did not start: $(cat "$TMP/dl.err")"; return 1; }
	route_mode tun
}
dl_stop() {
	local i
	[ -n "$DL_PID" ] || return 0
	kill -TERM "$DL_PID" 2>/dev/null
	for ((i = 0; i < 50; i++)); do kill -0 "$DL_PID" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$DL_PID" 2>/dev/null
	wait "$DL_PID" 2>/dev/null
	DL_PID=""
	grep '"event":"exit"' "$TMP/dl.out" | tail -n 1 >"$TMP/dl.json"
	[ -s "$TMP/dl.json" ] || echo '{}' >"$TMP/dl.json"
}
# dl_stats: the running line's counters now (SIGUSR1).
dl_stats() {
	local n i
	n=$(grep -c . "$TMP/dl.out")
	kill -USR1 "$DL_PID" 2>/dev/null || return 1
	for ((i = 0; i < 50; i++)); do
		[ "$(grep -c . "$TMP/dl.out")" -gt "$n" ] && break
		sleep 0.02
	done
	tail -n 1 "$TMP/dl.out"
}

ONE_WAY=$(awk -v r="$RTT_MS" 'BEGIN { printf "%.3f", r / 2 }')

# --- measurements -----------------------------------------------------------------------------
cat >"$TMP/probe.py" <<'EOF'
# probe.py send DST PORT COUNT PPS | recv PORT COUNT IDLE_S DEADLINE_S
# send: COUNT datagrams of 32 bytes (sequence number, CLOCK_REALTIME send time) at PPS.
# recv: counts distinct sequence numbers until IDLE_S without a datagram after the first (or
#   DEADLINE_S in all); one-way delay = the kernel's receive stamp (SO_TIMESTAMPNS, the same
#   clock) - the send stamp: how late this process reads a datagram does not count.
# Prints one JSON line.
import json, math, socket, struct, sys, time
mode = sys.argv[1]
if mode == "send":
    dst, port, count, pps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_SNDBUFFORCE", 32), 8 << 20)
    s.connect((dst, port))
    buf = bytearray(32)
    sent = retries = 0
    t0 = time.monotonic_ns()
    while sent < count:
        allowed = min(count, (time.monotonic_ns() - t0) * pps // 1000000000 + 1)
        if sent >= allowed:
            time.sleep(0.0002)
            continue
        while sent < allowed:
            struct.pack_into("!Iq", buf, 0, sent, time.time_ns())
            try:
                s.send(buf)
                sent += 1
            except (BlockingIOError, OSError):
                retries += 1
                time.sleep(0.0001)
    el = (time.monotonic_ns() - t0) / 1e9
    print(json.dumps({"sent": sent, "seconds": round(el, 3), "retries": retries}))
else:
    port, count, idle, deadline = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 64 << 20)
    s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMPNS", 35), 1)
    s.bind(("0.0.0.0", port))
    seen = bytearray(count)
    delays = []
    got = dup = bad = 0
    end = time.monotonic() + deadline
    s.settimeout(deadline)
    while True:
        try:
            buf, anc, _, _ = s.recvmsg(64, 64)
        except socket.timeout:
            break
        n = len(buf)
        now = None
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and len(data) >= 16:
                sec, nsec = struct.unpack_from("qq", data)
                now = sec * 1000000000 + nsec
        if now is None:
            now = time.time_ns()
        if got == 0:
            s.settimeout(idle)
        seq, t = struct.unpack_from("!Iq", buf, 0) if n >= 12 else (count, 0)
        if n != 32 or seq >= count:
            bad += 1
        elif seen[seq]:
            dup += 1
        else:
            seen[seq] = 1
            got += 1
            delays.append(now - t)
        if time.monotonic() > end:
            break
    delays.sort()
    def q(f):
        """Nearest rank (the ceil(f * n)-th smallest); the median of an even count is the
        mean of the two middle ones."""
        n = len(delays)
        if not n:
            return None
        if f == 0.5 and n % 2 == 0:
            v = (delays[n // 2 - 1] + delays[n // 2]) / 2
        else:
            v = delays[max(0, min(n, math.ceil(f * n)) - 1)]
        return round(v / 1e6, 3)
    print(json.dumps({"received": got, "duplicates": dup, "bad": bad, "one_way_median_ms": q(0.5),
                      "one_way_p99_ms": q(0.99), "one_way_max_ms": q(1.0)}))
EOF

# ping_rtt: 20 pings A -> B after one warm-up; {"sent","received","median_ms",...}.
ping_rtt() {
	inA ping -c 1 -W 3 "$ADDR_B" >/dev/null 2>&1
	inA ping -c 20 -i 0.05 -W 3 "$ADDR_B" 2>/dev/null |
		awk -v set="$RTT_MS" -F'time=' '/time=/ { split($2, a, " "); v[n++] = a[1] + 0 }
		END {
			if (n == 0) { print "{\"sent\":20,\"received\":0}"; exit }
			for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
			med = n % 2 ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2
			err = set > 0 ? (med - set) / set * 100 : 0
			printf "{\"sent\":20,\"received\":%d,\"median_ms\":%.3f,", n, med
			printf "\"min_ms\":%.3f,\"max_ms\":%.3f,\"err_pct\":%.1f,\"ok\":%s}\n", v[0],
				v[n - 1], err, (set == 0 || (err <= 10 && err >= -10)) ? "true" : "false"
		}'
}

# udp_loss COUNT PPS: COUNT datagrams A -> B; the receiver's count against the set loss,
# with the rule's own counters and the line's.
udp_loss() {
	local count=$1 pps=$2 idle s0 d0 s1 d1 sent recv
	idle=$(awk -v d="$ONE_WAY" 'BEGIN { printf "%.2f", 1 + d / 1000 * 4 }')
	spawn "$NS_B" "$TMP/recv.json" "$PY" "$TMP/probe.py" recv 7007 "$count" "$idle" 60
	local rpid=$SPAWNED
	wait_until 100 0.05 listening "$NS_B" u 7007 || { echo '{"error":"receiver"}'; return 1; }
	s0=$(loss_counter seen) d0=$(loss_counter dropped)
	sent=$(inA timeout 60 "$PY" "$TMP/probe.py" send "$ADDR_B" 7007 "$count" "$pps")
	wait "$rpid"
	s1=$(loss_counter seen) d1=$(loss_counter dropped)
	recv=$(cat "$TMP/recv.json")
	jq -cn --argjson s "${sent:-{\}}" --argjson r "${recv:-{\}}" --argjson set "$LOSS" \
		--argjson seen $((s1 - s0)) --argjson dropped $((d1 - d0)) '
		($s.sent // 0) as $n | ($r.received // 0) as $got |
		(if $n > 0 then ($n - $got) / $n * 100 else null end) as $loss |
		{sent: $n, received: $got, seconds: $s.seconds,
		 loss_pct: (if $loss != null then ($loss * 1000 | round) / 1000 else null end),
		 err_pct: (if $set > 0 and $loss != null then (($loss - $set) / $set * 100 * 10 | round) / 10 else null end),
		 rule_seen: $seen, rule_dropped: $dropped,
		 rule_pct: (if $seen > 0 then $dropped / $seen * 100 else null end),
		 one_way_median_ms: $r.one_way_median_ms, one_way_p99_ms: $r.one_way_p99_ms,
		 duplicates: $r.duplicates,
		 ok: ($loss != null and ($set == 0 and $loss == 0 or
		      $set > 0 and ($loss - $set) / $set <= 0.2 and ($loss - $set) / $set >= -0.2))}'
}

# iperf_run SECONDS OMIT: iperf3 A -> B with the pinned congestion control.
iperf_run() {
	local out
	out=$(inA timeout $(($1 + $2 + 30)) iperf3 -c "$ADDR_B" -p 5201 -t "$1" -O "$2" -J -C "$CC" 2>&1)
	jq -c --arg cc "$CC" '{cc: $cc, gbps: ((.end.sum_received.bits_per_second // 0) / 1e7 | round / 100),
		mbps: ((.end.sum_received.bits_per_second // 0) / 1e5 | round / 10),
		retransmits: .end.sum_sent.retransmits, error: .error}' <<<"$out" 2>/dev/null ||
		echo '{"error":"iperf3 output not JSON"}'
}

# cond_run SECONDS CC: iperf3 -t SECONDS at the set conditions, with what the loss rule
# dropped and the delay line's late sends and queue drops during the run.
cond_run() {
	local b a d0 r
	set_cc "$2" || return 1
	b=$(dl_stats) d0=$(loss_counter dropped)
	r=$(iperf_run "$1" 0)
	a=$(dl_stats)
	jq -c --argjson b "$b" --argjson a "$a" --argjson d $(($(loss_counter dropped) - d0)) \
		'. + {rule_drops: $d, packets: ($a.packets - $b.packets),
		gso_packets: ($a.gso_packets - $b.gso_packets),
		late_sends: ($a.late_sends - $b.late_sends),
		queue_drops: ($a.queue_drops - $b.queue_drops)}' <<<"$r"
}

# ceiling_run LABEL ONE_WAY_MS|direct CC: one iperf3 -t 3 -O 1, loss off; with the line's
# counters for the run (late sends, queue drops, peak queue).
ceiling_run() {
	local r
	set_cc "$3" || return 1
	if [ "$2" = direct ]; then dl_stop; route_mode direct; else dl_start "$2" || return 1; fi
	r=$(iperf_run 3 1)
	[ "$2" = direct ] || dl_stop
	[ "$2" = direct ] && echo '{}' >"$TMP/dl.json"
	jq -c --arg l "$1" --slurpfile d "$TMP/dl.json" '. + {path: $l,
		late_sends: $d[0].late_sends, max_late_us: $d[0].max_late_us,
		queue_drops: $d[0].queue_drops, max_queue_bytes: $d[0].max_queue_bytes,
		gso_packets: $d[0].gso_packets, packets: $d[0].packets}' <<<"$r"
}

servers_up() {
	spawn "$NS_B" "$TMP/iperf3.log" iperf3 -s -p 5201
	wait_until 100 0.1 listening "$NS_B" t 5201
}

# --- modes ------------------------------------------------------------------------------------
calibrate() {
	local t0 ping udp='null' ceil='[]' ip='[]' dl rec cc0 r load0
	t0=$(date +%s)
	load0=$(cut -d' ' -f1-3 /proc/loadavg)
	bed_up || { note "testbed setup failed"; return 1; }
	cc0=$CC # the name pinned (--cc host resolved)
	servers_up || { note "iperf3 server did not start"; return 1; }
	dl_start "$ONE_WAY" || return 1
	loss_set "$LOSS"
	ping=$(ping_rtt)
	vnote "ping: $ping"
	if awk -v l="$LOSS" 'BEGIN { exit !(l > 0) }'; then
		udp=$(udp_loss "$UDP_COUNT" 50000)
		vnote "udp: $udp"
	fi
	if [ "$IPERF_S" -gt 0 ]; then
		ip='[]'
		for cc in reno bbr; do
			r=$(cond_run "$IPERF_S" "$cc") && ip=$(jq -c ". + [$r]" <<<"$ip")
			vnote "iperf: $r"
		done
		set_cc "$cc0" || return 1
	fi
	dl=$(dl_stats)
	if [ "$CEILING" -eq 1 ]; then
		loss_set 0
		# reno and bbr for comparison, and the run's own algorithm (--cc host: the host's),
		# whose ceiling marks the cells it caps.
		for cc in $(printf '%s\n' reno bbr "$cc0" | awk '!seen[$0]++'); do
			r=$(ceiling_run direct direct "$cc") && ceil=$(jq -c ". + [$r]" <<<"$ceil")
			for d in 0 $([ "$ONE_WAY" = 0.000 ] || echo "$ONE_WAY"); do
				r=$(ceiling_run "delay line $d ms one way" "$d" "$cc") &&
					ceil=$(jq -c ". + [$r]" <<<"$ceil")
				vnote "ceiling: $r"
			done
		done
		CC=$cc0
	fi
	dl_stop
	rec=$(jq -cn --argjson rtt "$RTT_MS" --argjson loss "$LOSS" --arg dir "$LOSS_DIR" \
		--arg unit "$LOSS_UNIT" \
		--arg voff "$VOFF" --arg cc "$cc0" --argjson ping "$ping" --argjson udp "$udp" \
		--argjson iperf "$ip" --argjson ceil "$ceil" --argjson dl "${dl:-null}" \
		--argjson secs $(($(date +%s) - t0)) --arg load0 "$load0" \
		--arg load1 "$(cut -d' ' -f1-3 /proc/loadavg)" --arg kernel "$(uname -r)" \
		--argjson cpus "$(nproc)" '{
		rtt_ms_set: $rtt, one_way_ms: ($rtt / 2), loss_pct_set: $loss, loss_dir: $dir,
		loss_unit: $unit,
		veth_offload: $voff, tcp_congestion: $cc,
		tcp_rmem: "4096 131072 134217728", tcp_wmem: "4096 16384 134217728",
		ping: $ping, udp: $udp, iperf: $iperf, ceiling: $ceil, delayline_counters: $dl,
		seconds: $secs, kernel: $kernel, cpus: $cpus, loadavg_start: $load0,
		loadavg_end: $load1,
		ok: ($ping.ok and ($udp == null or $udp.ok))}')
	echo "$rec"
	jq -e .ok <<<"$rec" >/dev/null
}

up() {
	bed_up || { note "testbed setup failed"; return 1; }
	dl_start "$ONE_WAY" || return 1
	loss_set "$LOSS"
	jq -cn --arg a "$NS_A" --arg m "$NS_M" --arg b "$NS_B" --arg tun "$TUN" --arg pid "$DL_PID" \
		--argjson rtt "$RTT_MS" --argjson loss "$LOSS" --arg dir "$LOSS_DIR" \
		--arg va "$V_A" --arg vb "$V_B" --arg nt "$NET_T" --arg cc "$CC" '{ns_a: $a,
		ns_m: $m, ns_b: $b, addr_a: "10.210.1.1", addr_b: "10.210.2.1", tun: $tun,
		veth_a: $va, veth_b: $vb, net_t: $nt, tcp_congestion: $cc,
		delayline_pid: ($pid | tonumber), rtt_ms: $rtt, loss_pct: $loss, loss_dir: $dir}'
	# Held until a signal; `wait` returns on one (the traps then tear everything down).
	sleep infinity &
	PIDS+=("$!")
	wait "$!"
}

# --- check (ctest delayline_netns) ------------------------------------------------------------
ok() { PASSED=$((PASSED + 1)); echo "ok - $1${2:+ ($2)}"; }
not_ok() { FAILED=$((FAILED + 1)); echo "not ok - $1: $2"; }
# check NAME CMD...: ok when CMD exits 0; the last line of its output is the detail, then the
# time CMD took.
check() {
	local name=$1 out rc t0
	shift
	t0=$(date +%s%N)
	"$@" >"$TMP/check.out" 2>&1
	rc=$?
	out=$(tail -n 1 "$TMP/check.out")
	out="${out:+$out; }$((($(date +%s%N) - t0) / 1000000)) ms"
	if [ "$rc" -eq 0 ]; then ok "$name" "$out"; else not_ok "$name" "$out, exit $rc"; fi
	return "$rc"
}

c_ping() {
	local p
	p=$(ping_rtt)
	jq -r '"median \(.median_ms) ms of \(.received) replies (set 10 ms, \(.err_pct) %)"' <<<"$p"
	jq -e .ok <<<"$p" >/dev/null
}
c_loss() {
	UDP=$(udp_loss 30000 20000)
	jq -r '"\(.received)/\(.sent) received: \(.loss_pct) % lost (set 1 %, rule " +
		"\(.rule_dropped)/\(.rule_seen)), one way \(.one_way_median_ms) ms median"' <<<"$UDP"
	jq -e '.ok and .one_way_median_ms >= 4.5 and .one_way_median_ms <= 5.5' <<<"$UDP" >/dev/null
}
# Every packet sent into the TUN was read, and every packet written back was forwarded:
# into + mine = the line's packets (+ the device's drops); back = its packets out.
c_counters() {
	local s into mine back
	s=$(dl_stats) || { echo "no counters from the delay line"; return 1; }
	into=$(nft_counter into) mine=$(nft_counter mine) back=$(nft_counter back)
	jq -r --argjson i "$into" --argjson m "$mine" --argjson b "$back" \
		'"line read \(.packets) (forwarded in \($i), M own \($m), tun drops " +
		"\(.tun_tx_dropped)), wrote \(.packets_out) (forwarded on \($b)), queued " +
		"\(.queued_packets), late \(.late_sends), max late \(.max_late_us) us"' <<<"$s"
	jq -e --argjson i "$into" --argjson m "$mine" --argjson b "$back" \
		'.packets + .tun_tx_dropped == $i + $m and .packets_out - .write_errors == $b and
		 .queue_drops == 0 and .read_errors == 0' <<<"$s" >/dev/null
}
c_transfer() {
	local got ms t0 s0 s1
	loss_set 0
	s0=$(dl_stats) || return 1
	spawn "$NS_B" "$TMP/srv.log" socat -u "OPEN:$TMP/blob,rdonly" TCP4-LISTEN:7100,reuseaddr
	wait_until 100 0.05 listening "$NS_B" t 7100 || { echo "server did not listen"; return 1; }
	t0=$(date +%s%N)
	got=$(inA timeout 20 socat -u "TCP4:$ADDR_B:7100" - | sha256sum | cut -d' ' -f1)
	ms=$((($(date +%s%N) - t0) / 1000000))
	s1=$(dl_stats) || return 1
	[ "$got" = "$BLOB_SHA" ] || { echo "sha256 ${got:0:16}, want ${BLOB_SHA:0:16}"; return 1; }
	jq -rn --argjson a "$s0" --argjson b "$s1" --argjson ms "$ms" \
		'"sha256 equal, \($ms) ms; \($b.packets - $a.packets) packets of which " +
		"\($b.gso_packets - $a.gso_packets) GSO, largest \($b.max_packet_bytes) B, queue " +
		"peak \($b.max_queue_bytes) B, drops \($b.queue_drops - $a.queue_drops)"'
	jq -en --argjson a "$s0" --argjson b "$s1" \
		'$b.gso_packets - $a.gso_packets > 0 and $b.max_packet_bytes > 1500 and
		 $b.queue_drops == $a.queue_drops' >/dev/null
}

check_mode() {
	local t0=$SECONDS
	echo "# linkbed check: token=$TOK bin=$BIN"
	check "testbed A - M - B, RTT 10 ms, 1 % loss both ways" bed_up ||
		{ echo "$PASSED passed, $FAILED failed"; return 1; }
	head -c 16777216 /dev/urandom >"$TMP/blob"
	BLOB_SHA=$(sha256sum <"$TMP/blob" | cut -d' ' -f1)
	check "delay line starts (5 ms one way)" dl_start 5 ||
		{ sed 's/^/# /' "$TMP/dl.err"; echo "$PASSED passed, $FAILED failed"; return 1; }
	loss_set 1
	check "ping RTT within 10 % of 10 ms" c_ping
	check "1 % loss within +-20 % at the receiver, one-way delay within 10 % of 5 ms" c_loss
	check "nftables counters match the delay line's" c_counters
	check "16 MiB B -> A through the delay line (sha256, GSO, no drops)" c_transfer
	dl_stop
	if jq -e '.event == "exit"' "$TMP/dl.json" >/dev/null; then
		ok "delay line stops on SIGTERM with its counters"
	else
		not_ok "delay line stops on SIGTERM with its counters" "$(tail -n 1 "$TMP/dl.err")"
	fi
	echo "# $((SECONDS - t0)) s"
	echo "$PASSED passed, $FAILED failed"
	[ "$FAILED" -eq 0 ]
}

case $MODE in
calibrate) calibrate ;;
up) up ;;
check) check_mode ;;
esac
