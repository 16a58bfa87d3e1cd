#!/usr/bin/env bash
# soak.sh — mixed traffic through the proxy for a long time: its memory, descriptors and NAT
# entries must stay flat once warmed up, and come back to idle when the traffic stops.
#
#   ns D: twinstack run (auto_route, DNS hijack       ns S: the servers
#         to its own resolver) + the clients          lo 10.207.9.2: load serve TCP echo
#   every workload -> 10.207.9.2 (or :53 anywhere)       7000-7007, UDP echo 7100;
#     | auto_route: everything -> tun                    http.server :80 (a 32 MiB blob)
#     v                                               dnsmasq 10.207.0.2:53, zone soak.test
#   tun (twinstack's), direct outbound                route 198.18.0.0/15 via D
#   vkd 10.207.0.1/24 ---------------------------------- vks 10.207.0.2/24
#
# For --seconds (45 by default) these run at once, each in a bounded loop of short chunks:
# - BULK: curl downloads of the blob at BULK_RATE, each piped to sha256sum and compared, in
#   turn with an ECHO_MIB upload echoed back at full speed (tsnet.py bulk-echo: random bytes
#   written while the echo is read, sha256 of the echo compared with what was sent).
# - CHURN: `load connrate` chunks of CHURN_CHUNK connections, CHURN_C at a time, each sending
#   4 KiB of its own byte pattern and checking the echo, a chunk every CHURN_PERIOD_MS on a
#   fixed schedule (40 connections a second), the eight server ports in turn.
# - UDP: `load udp` at UDP_RATE datagrams of 512 bytes a second, each echo matched to its
#   sequence number, in chunks of a third of the run (each a new source port, so a new UDP
#   session; the old one times out after UDP_IDLE_MS).
# - DNS: dnsflood.py (each query from its own port, the answer's A record checked) at
#   DNS_RATE queries a second for names that each go to dnsmasq (q<i>.soak.test, TTL 0: the
#   proxy's resolver never caches them) and at DNS_RATE for hot.soak.test (TTL 1 s: mostly
#   answered from the resolver's cache), plus one query over TCP (dig +tcp) per chunk; all
#   sent to 10.207.9.53, where nothing listens: only the proxy's DNS hijack (its own resolver,
#   dns.servers) answers them.
# - HELD: HELD_N connections held for the whole run (`load hold`), each echoing 256 bytes of
#   its own pattern every second, checked byte for byte.
#
# Every SAMPLE_S seconds the proxy's /stats (rss_kb, peak_rss_kb, fds, nat.* entries,
# sessions, UDP sessions, buffers, splice pipes, budget in use, DNS pending and cache entries,
# the in-kernel fast path's connections and UDP flows), its /proc/PID/status (VmRSS, RssAnon,
# VmHWM) and, with bpftool, the entries the kernel holds in the fast path's maps are sampled.
# The run is cut in six windows (10 minutes each in the 1 h run): the first is the warm-up; the
# second and the last are compared.
#
# Time-bound state must fill up within the warm-up, or a short run compares a table still
# filling: so the NAT's closing entries linger LINGER_MS (the closing handshake takes
# microseconds here), a freed NAT tuple rests nat.port_quarantine_ms = half a window in a run
# under 12 minutes (the default 60 s from there on), and a UDP session idles out after
# UDP_IDLE_MS. The clients keep the default ephemeral port range: every SYN and datagram from
# the TUN is checked against the proxy's loop guard, a port-indexed table, and the check must
# not cost memory per port the apps use.
#
# Passes when:
# - every workload ran without an error: every download's and echo's sha256 right, every
#   churned connection completed with its echo checked (no error of any cause), UDP without a
#   wrong datagram and at most UDP_LOSS_MAX_PCT lost, every DNS answer right and at most 0.1 %
#   unanswered, both resolver paths used (upstream and cache), every held connection alive and
#   echoing;
# - the proxy answered every sample and refused or failed nothing (no drops.* refusal,
#   sessions.refused, sessions.failed.*, budget.*_refused, udp.drops.*, DNS SERVFAIL, drop or
#   upstream failure, NAT refusal or quarantine reuse, lwIP memory refusal, a fast path map
#   refusal or failed add, a packet the fast path dropped);
# - flat: in the last window the largest RSS (/stats rss_kb and VmRSS), RssAnon, peak RSS,
#   fds and NAT entries (system stack) are at most the second window's largest + 1 % (rounded
#   up) + a slack (the peak RSS, a high-water mark, also what RSS swung within that window);
# - within IDLE_S of the traffic's end: NAT entries 0, and sessions, UDP sessions, splice
#   pipes, fds, budget in use, buffers in use, DNS pending and DNS-over-TCP connections at
#   their values before the traffic, and the fast path's connections and UDP flows 0;
# - where the system stack's fast path runs: it carried connections in the run, and once idle
#   the kernel's maps hold no entry (read with bpftool; a note where it is missing).
#
# The slack on top of the 1 % (its figures are computed at "flat" below): descriptors and NAT
# entries count what is in flight at the instant of the sample, and the workloads' own bounds
# (CHURN_C churned at a time, one bulk transfer, one DNS query over TCP, one churn chunk's
# entries) let that vary by up to FD_SLACK and NAT_SLACK between two samples whatever the run's
# length; memory is counted in 4 KiB pages, a short run's windows sit inside the minutes the
# allocator takes to settle, and memory may follow a new high-water of the buffers in flight
# (3 x its growth, bounded by the buffer budget). A leak grows without bound and passes any
# fixed slack in a long enough run; and the exact return to idle (buffers in use included)
# checks the counts to the unit in every run.
#
# The last line before the tally is '# figures: ...': per window (warm-up/second/last) the
# largest of each sampled figure, the workloads' totals and the time back to idle.
#
# usage: soak.sh [--stack system|lwip] [--bin PATH] [--seconds N] [--sample-s N] [--tun JSON] [--keep] [-v]
#   --seconds   how long the traffic runs (default 45; `make soak` 300, SOAK_SECONDS=3600)
#   --sample-s  seconds between samples (default 60 from 600 s on, else about seconds/15)
#   --tun       a JSON object merged into the proxy's "tun" section (e.g. '{"large_segments": true}')
#   --keep      keep the work directory (logs, the config, the last /stats as stats_end.json)
#   -v          the per-sample table
# Output: 'ok - NAME (detail)' / 'not ok - NAME: REASON' lines, '#' notes, 'N passed, N failed'.
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun, no namespaces), 1 otherwise.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SECONDS_RUN=45
SAMPLE_S=
TUN_JSON='{}'

# The workloads: moderate and paced, so that a loaded 2-core machine keeps up with them and
# the figures follow the proxy, not the machine's pace.
BULK_RATE=32M        # curl --limit-rate of a download (bytes/s)
BLOB_MIB=32          # the downloaded file
ECHO_MIB=8           # each bulk echo, up and back
CHURN_CHUNK=20       # connections per churn chunk ...
CHURN_PERIOD_MS=500  # ... one chunk this often: 40 connections a second
CHURN_C=2            # churn connections under way at once
UDP_RATE=200         # datagrams a second (512 bytes each)
UDP_LOSS_MAX_PCT=2   # UDP loss allowed over the run (see UDP_CHUNK_S)
DNS_RATE=10          # queries a second, for new names and for the hot name each
HELD_N=32            # connections held for the whole run
LINGER_MS=100        # nat.linger_ms: a closed connection's entry lingers this long (the
                     # closing handshake takes microseconds here)
UDP_IDLE_MS=5000     # timeouts.udp_idle_ms: a chunk's UDP session ends this long after it
IDLE_S=20            # the bound on the return to idle: linger + UDP idle + closing, with room

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"
suite_args soak --seconds SECONDS_RUN --sample-s SAMPLE_S --tun TUN_JSON -- "$@"
case $SECONDS_RUN in '' | *[!0-9]*) echo "soak.sh: --seconds is a number" >&2; exit 2 ;; esac
[ "$SECONDS_RUN" -ge 30 ] || { echo "soak.sh: --seconds must be at least 30" >&2; exit 2; }
jq -e 'type == "object"' <<<"$TUN_JSON" >/dev/null 2>&1 || { echo "soak.sh: --tun is a JSON object" >&2; exit 2; }
if [ -z "$SAMPLE_S" ]; then
	if [ "$SECONDS_RUN" -ge 600 ]; then SAMPLE_S=60; else SAMPLE_S=$(((SECONDS_RUN + 7) / 15)); fi
fi
case $SAMPLE_S in '' | *[!0-9]* | 0) echo "soak.sh: --sample-s is a number > 0" >&2; exit 2 ;; esac
# Six windows of WIN_MS; each of them must hold at least one sample.
WIN_MS=$((SECONDS_RUN * 1000 / 6))
if [ $((SAMPLE_S * 1000)) -gt "$WIN_MS" ]; then
	echo "soak.sh: --sample-s $SAMPLE_S leaves a window of $((WIN_MS / 1000)) s without a sample" >&2
	exit 2
fi

# A freed NAT tuple rests for nat.port_quarantine_ms (60 s by default) and the table of resting
# tuples grows for that long: it must be full by the middle of the warm-up, so in a run under
# 12 minutes (a window under 2) a tuple rests half a window.
QUARANTINE_MS=$((WIN_MS / 2 < 60000 ? WIN_MS / 2 : 60000))

suite_begin soak ip ss curl jq awk sha256sum dnsmasq dig
NS_D=tskD-$TOK NS_S=tskS-$TOK V_D=tskd$TOK V_S=tsks$TOK TUN=tskt$TOK
SRV=10.207.9.2 DNS_DST=10.207.9.53 DNS_SRV=10.207.0.2 P_STATS=9192
PORTS=7000,7001,7002,7003,7004,7005,7006,7007
inD() { ip netns exec "$NS_D" "$@"; }
T0=$(date +%s%N)
note "soak: stack=$STACK seconds=$SECONDS_RUN sample_s=$SAMPLE_S window_s=$((WIN_MS / 1000)).$((WIN_MS % 1000 / 100)) token=$TOK"

# --- testbed -------------------------------------------------------------------------------
topology() {
	netns_add "$NS_D" && netns_add "$NS_S" || return 1
	ip link add "$V_D" netns "$NS_D" type veth peer name "$V_S" netns "$NS_S" || return 1
	ip -n "$NS_D" link set "$V_D" txqueuelen 10000 up
	ip -n "$NS_S" link set "$V_S" txqueuelen 10000 up
	ip -n "$NS_D" addr add 10.207.0.1/24 dev "$V_D"
	ip -n "$NS_S" addr add "$DNS_SRV/24" dev "$V_S"
	ip -n "$NS_S" addr add "$SRV/32" dev lo
	ip -n "$NS_D" route add default via "$DNS_SRV" || return 1
	ip -n "$NS_S" route add 198.18.0.0/15 via 10.207.0.1 || return 1
}
if ! topology >"$TMP/topology.out" 2>&1; then
	if ! ip netns list >/dev/null 2>&1 || grep -q "Operation not permitted" "$TMP/topology.out"; then
		echo "# SKIP: cannot create network namespaces here: $(tr '\n' ' ' <"$TMP/topology.out")"
		exit 77
	fi
	not_ok "topology" "$(tr '\n' ' ' <"$TMP/topology.out")"
	echo "$PASSED passed, $FAILED failed"
	exit 1
fi

# The servers outlive the traffic by the time the end of the run can take.
SERVE_S=$((SECONDS_RUN + 300))
spawn "$NS_S" "$TMP/serve.log" "$BIN" load serve --bind "$SRV" --tcp-ports "$PORTS" \
	--udp-port 7100 --duration "$SERVE_S"
SERVE_PID=$SPAWNED
mkdir -p "$TMP/www"
head -c $((BLOB_MIB << 20)) /dev/urandom >"$TMP/www/blob"
BLOB_SHA=$(sha256sum <"$TMP/www/blob" | cut -d' ' -f1)
spawn "$NS_S" "$TMP/httpd.log" "$PY" -m http.server --bind "$SRV" --directory "$TMP/www" 80
HTTPD_PID=$SPAWNED
# The zone: every name under soak.test is 10.207.53.7 with TTL 0 (dnsmasq's --local-ttl
# default), so the resolver asks dnsmasq each time; hot.soak.test is 10.207.53.8 with TTL 1 s.
spawn "$NS_S" "$TMP/dnsmasq.log" dnsmasq --no-daemon --conf-file=/dev/null --no-resolv \
	--no-hosts --address=/soak.test/10.207.53.7 --host-record=hot.soak.test,10.207.53.8,1 \
	--listen-address="$DNS_SRV" --bind-interfaces -p 53 --pid-file="$TMP/dnsmasq.pid" \
	--user=root --dns-forward-max=1000
DNSMASQ_PID=$SPAWNED
if ! wait_listen "$NS_S" tcp 7007 100 || ! wait_listen "$NS_S" udp 7100 100 ||
	! wait_listen "$NS_S" tcp 80 100 || ! wait_listen "$NS_S" udp 53 100; then
	not_ok setup "servers: $(tail -q -n 2 "$TMP/serve.log" "$TMP/httpd.log" "$TMP/dnsmasq.log" | tr '\n' ' ')"
	echo "$PASSED passed, $FAILED failed"
	exit 1
fi

jq -n --arg s "$STACK" --arg t "$TUN" --arg l "127.0.0.1:$P_STATS" --arg d "udp://$DNS_SRV" \
	--argjson linger "$LINGER_MS" --argjson q "$QUARANTINE_MS" --argjson udp_idle "$UDP_IDLE_MS" \
	--argjson tun "$TUN_JSON" \
	'{stack: $s, tun: ({name: $t, auto_route: true} + $tun), stats: {listen: $l},
	  nat: {linger_ms: $linger, port_quarantine_ms: $q},
	  timeouts: {udp_idle_ms: $udp_idle},
	  dns: {hijack: true, servers: [{tag: "zone", address: $d}]},
	  log: {level: "warn"}}' >"$TMP/cfg.json"
spawn "$NS_D" "$TMP/twinstack.log" "$BIN" run --config "$TMP/cfg.json"
TS_PID=$SPAWNED
if ! wait_until 100 0.1 stats >/dev/null; then
	not_ok start "no stats: $(tail -n 3 "$TMP/twinstack.log")"
	echo "$PASSED passed, $FAILED failed"
	exit 1
fi
ok "setup: namespaces, echo/HTTP/DNS servers, the proxy" "$STACK, pid $TS_PID"

# --- figures -------------------------------------------------------------------------------
sk() { stat_key "$1" "$2"; }
# The columns of a sample, in order (t_ms is the time since the traffic started).
COLS="t_ms rss_kb peak_rss_kb vmrss_kb rssanon_kb vmhwm_kb fds nat_entries nat_quarantined sessions udp_sessions buffers_bytes buffers_peak stack_bytes pipes tcp_in_use udp_in_use fds_in_use dns_pending dns_cache fp_conns fp_udp_flows fp_kernel"
# sample T_MS: one row, or "" when /stats or /proc did not answer.
sample() {
	local doc st
	doc=$(stats) || return 1
	st=$(awk '/^(VmRSS|RssAnon|VmHWM):/ { v[$1] = $2 } END { printf "%d %d %d", v["VmRSS:"], v["RssAnon:"], v["VmHWM:"] }' \
		"/proc/$TS_PID/status" 2>/dev/null) || return 1
	[ -n "$st" ] || return 1
	jq -rn --argjson d "$doc" --arg t "$1" --arg st "$st" --arg k "$(fp_kernel_entries "$NS_D" "$TUN")" '
		($st | split(" ") | map(tonumber)) as $p
		| [($t | tonumber), $d.rss_kb, $d.peak_rss_kb, $p[0], $p[1], $p[2], $d.fds,
		   ($d.nat.half_open + $d.nat.active + $d.nat.closing), $d.nat.quarantined,
		   $d.sessions.active, $d.udp.sessions, $d.buffers.in_use_bytes, $d.buffers.peak_bytes,
		   $d.buffers.stack_bytes,
		   $d.splice.pipes, $d.budget.tcp_in_use, $d.budget.udp_in_use, $d.budget.fds_in_use,
		   $d.dns.pending, $d.dns.cache.entries, ($d.fast_path.conns // 0),
		   ($d.fast_path.udp_flows // 0), ($k | tonumber)] | map(tostring) | join(" ")'
}

IDLE=$(stats)
# idle_diff DOC: what differs from the idle document (empty when idle again).
idle_diff() {
	jq -rn --argjson i "$IDLE" --argjson n "$1" '
		[ (if ($n.nat.half_open + $n.nat.active + $n.nat.closing) != 0
		   then "nat entries \($n.nat.half_open)/\($n.nat.active)/\($n.nat.closing)" else empty end),
		  (["sessions.active", "udp.sessions", "splice.pipes", "fds", "budget.tcp_in_use",
		    "budget.udp_in_use", "budget.fds_in_use", "buffers.in_use_bytes", "dns.pending",
		    "dns.tcp.connections", "fast_path.conns", "fast_path.udp_flows"][] as $k
		   | ($k | split(".")) as $p
		   # The fast path keeps one fd per uplink its reply program went onto (a UDP
		   # flow joined it) while the proxy runs.
		   | (if $k == "fds" then ($n.fast_path.uplinks // 0) - ($i.fast_path.uplinks // 0)
		      else 0 end) as $extra
		   | if ($n | getpath($p)) != ($i | getpath($p)) + $extra
		     then "\($k) \($n | getpath($p)) (idle \($i | getpath($p)))" else empty end)
		] | join(", ")'
}
# failures BEFORE AFTER: every counter of a refusal, a failed session, a UDP or DNS drop or a
# failed DNS answer that moved, "" if none.
failures() {
	# A /stats read that failed reads as failures, not as none.
	jq -e . <<<"$1" >/dev/null 2>&1 && jq -e . <<<"$2" >/dev/null 2>&1 ||
		{ echo "no /stats document"; return; }
	jq -rn --argjson a "$1" --argjson b "$2" '
		def flat: [paths(numbers) as $p | {key: ($p | map(tostring) | join(".")), value: getpath($p)}] | from_entries;
		($a | flat) as $x | ($b | flat) | to_entries[]
		| select(.key | test("^(drops\\.(nat_exhausted|half_open|admission_refused|fd_exhausted|udp_queue_full|udp_handoff)|sessions\\.refused|sessions\\.failed\\..*|budget\\..*_refused|udp\\.drops\\..*|udp\\.queue_drops|dns\\.drops\\..*|dns\\.answered\\.(servfail|refused)|dns\\.upstream\\.(timeouts|errors|bad_answers)|dns\\.tcp\\.(refused|closed_bad_length|closed_nomem)|fast_path\\.(map_full|add_failed|dropped|udp_map_failed|udp_dropped)|stack_counters\\.(drop_nat_.*|nat_(budget_exhausted|ports_exhausted|half_open_.*|quarantine_reuse)|drop_nomem|drop_backlog_full|write_nomem|rx_payload_nomem|syn_rcvd_evicted))$"))
		| select(.value != ($x[.key] // 0)) | "\(.key) +\(.value - ($x[.key] // 0))"' | paste -sd, -
}

# --- the workloads -------------------------------------------------------------------------
# Each runs in the background until END_NS, in chunks that end by then (or within a chunk's
# own bound after it), and appends one line per chunk to its log.
now_ns() { date +%s%N; }
left_s() { echo $(((END_NS - $(now_ns)) / 1000000000)); }
# sleep_until NS: sleeps until the absolute time NS (at once when it is past).
sleep_until() {
	local d=$((($1 - $(now_ns)) / 1000000))
	[ "$d" -gt 0 ] && sleep "$((d / 1000)).$(printf %03d $((d % 1000)))"
	return 0
}

bulk_loop() {
	local sum rc out
	while [ "$(now_ns)" -lt "$END_NS" ]; do
		sum=$(inD curl -sS --max-time 120 --limit-rate "$BULK_RATE" "http://$SRV/blob" 2>>"$TMP/bulk.err" | sha256sum | cut -d' ' -f1)
		rc=$?
		if [ "$rc" -eq 0 ] && [ "$sum" = "$BLOB_SHA" ]; then echo "download ok $((BLOB_MIB << 20))"
		else
			echo "download fail rc=$rc sha256=$sum"
			stats >"$TMP/stats_fail_$(now_ns).json" 2>&1
		fi >>"$TMP/bulk.log"
		[ "$(now_ns)" -lt "$END_NS" ] || break
		out=$(inD "$PY" "$HERE/tsnet.py" bulk-echo --host "$SRV" --port 7007 --mib "$ECHO_MIB" --timeout 120 2>&1)
		rc=$?
		if [ "$rc" -eq 0 ]; then echo "echo ok $((ECHO_MIB << 20))"; else echo "echo fail $out" | tr '\n' ' '; echo; fi >>"$TMP/bulk.log"
	done
}

# A chunk starts on its slot of the schedule, but never sooner than LINGER_MS + 100 ms after the
# previous one ended (a slot that leaves less is skipped): the closing NAT entries of one chunk
# are gone before the next opens any, so at one instant the churn holds at most one chunk's.
churn_loop() {
	local k=0 earliest out rc
	while :; do
		[ $((START_NS + k * CHURN_PERIOD_MS * 1000000)) -lt "$END_NS" ] || break
		sleep_until $((START_NS + k * CHURN_PERIOD_MS * 1000000))
		out=$(inD "$BIN" load connrate --target "$SRV" --ports "$PORTS" --count "$CHURN_CHUNK" \
			--duration 30 --concurrency "$CHURN_C" --req 4096 --timeout-ms 5000 2>>"$TMP/churn.err" | tail -n 1)
		rc=$?
		echo "$rc ${out:-{\}}" >>"$TMP/churn.log"
		earliest=$(($(now_ns) + (LINGER_MS + 100) * 1000000))
		k=$((k + 1))
		while [ $((START_NS + k * CHURN_PERIOD_MS * 1000000)) -lt "$earliest" ]; do k=$((k + 1)); done
	done
}

# A UDP chunk is a third of the run (5 minutes at most): the echoes still in flight when a
# chunk's client stops waiting for them (200 ms after its last datagram) count as lost, so
# fewer chunk ends, fewer of those.
UDP_CHUNK_S=$((SECONDS_RUN / 3 > 300 ? 300 : SECONDS_RUN / 3))
DNS_CHUNK_S=$((SECONDS_RUN / 6 > 60 ? 60 : SECONDS_RUN / 6))
udp_loop() {
	local d out rc
	while :; do
		d=$(left_s)
		[ "$d" -gt "$UDP_CHUNK_S" ] && d=$UDP_CHUNK_S
		[ "$d" -ge 1 ] || break
		out=$(inD "$BIN" load udp --target "$SRV:7100" --duration "$d" --rate "$UDP_RATE" --size 512 \
			2>>"$TMP/udp.err" | tail -n 1)
		rc=$?
		echo "$rc ${out:-{\}}" >>"$TMP/udp.log"
	done
}

# Query i of a chunk leaves from port base + i: below D's ephemeral range (64512-65535), so no
# other socket holds it; the two streams use their own ranges.
dns_loop() {
	local d n out rc pu ph
	while :; do
		d=$(left_s)
		[ "$d" -gt "$DNS_CHUNK_S" ] && d=$DNS_CHUNK_S
		[ "$d" -ge 1 ] || break
		n=$((d * DNS_RATE))
		inD "$PY" "$HERE/dnsflood.py" --server "$DNS_DST" --name soak.test --unique --expect 10.207.53.7 \
			--count "$n" --seconds "$d" --timeout 5 --base-port 10000 >"$TMP/dns_u.out" 2>>"$TMP/dns.err" &
		pu=$!
		inD "$PY" "$HERE/dnsflood.py" --server "$DNS_DST" --name hot.soak.test --expect 10.207.53.8 \
			--count "$n" --seconds "$d" --timeout 5 --base-port 21000 >"$TMP/dns_h.out" 2>>"$TMP/dns.err" &
		ph=$!
		out=$(inD dig +tcp +tries=1 +time=5 +short "@$DNS_DST" hot.soak.test A 2>&1 | tr '\n' ' ')
		echo "tcp ${out% }" >>"$TMP/dns.log"
		wait "$pu"; rc=$?
		echo "unique $rc $(tail -n 1 "$TMP/dns_u.out")" >>"$TMP/dns.log"
		wait "$ph"; rc=$?
		echo "hot $rc $(tail -n 1 "$TMP/dns_h.out")" >>"$TMP/dns.log"
	done
}

# --- the run -------------------------------------------------------------------------------
BEFORE=$(stats)
spawn "$NS_D" "$TMP/hold.out" "$BIN" load hold --target "$SRV:7001" --conns "$HELD_N" \
	--duration "$SERVE_S" --interval-ms 1000 --size 256
HOLD_PID=$SPAWNED
for ((i = 0; i < 300; i++)); do
	grep -q '^HELD' "$TMP/hold.out" && break
	kill -0 "$HOLD_PID" 2>/dev/null || break
	sleep 0.1
done
n=$(awk '/^HELD/ { print $2 }' "$TMP/hold.out")
check "held: $HELD_N connections established" test "${n:-0}" -eq "$HELD_N"

START_NS=$(now_ns)
END_NS=$((START_NS + SECONDS_RUN * 1000000000))
: >"$TMP/bulk.log"; : >"$TMP/churn.log"; : >"$TMP/udp.log"; : >"$TMP/dns.log"
bulk_loop & PIDS+=("$!"); BULK_LOOP=$!
churn_loop & PIDS+=("$!"); CHURN_LOOP=$!
udp_loop & PIDS+=("$!"); UDP_LOOP=$!
dns_loop & PIDS+=("$!"); DNS_LOOP=$!

# The samples: at every SAMPLE_S until the end of the traffic (the last one before it).
echo "$COLS" >"$TMP/samples.txt"
MISSED=0
row=$(sample 0) && echo "$row" >"$TMP/start.txt"
for ((k = 1; k * SAMPLE_S < SECONDS_RUN; k++)); do
	sleep_until $((START_NS + k * SAMPLE_S * 1000000000))
	if row=$(sample $((k * SAMPLE_S * 1000))) && [ -n "$row" ]; then
		echo "$row" >>"$TMP/samples.txt"
		vnote "sample $row"
	else
		MISSED=$((MISSED + 1))
		note "sample at $((k * SAMPLE_S)) s: no answer (proxy $(kill -0 "$TS_PID" 2>/dev/null && echo alive || echo gone))"
	fi
done
sleep_until "$END_NS"
AT_END=$(stats)

# The loops start nothing after END_NS; their last chunk ends within its own bound.
for ((i = 0; i < 1500; i++)); do
	alive=0
	for p in "$BULK_LOOP" "$CHURN_LOOP" "$UDP_LOOP" "$DNS_LOOP"; do kill -0 "$p" 2>/dev/null && alive=1; done
	[ "$alive" -eq 0 ] && break
	sleep 0.1
done
[ "$alive" -eq 0 ] || note "a workload still ran 150 s after the end: stopped"
for p in "$BULK_LOOP" "$CHURN_LOOP" "$UDP_LOOP" "$DNS_LOOP"; do stop_pid "$p" 2; done
kill -TERM "$HOLD_PID" 2>/dev/null
for ((i = 0; i < 300; i++)); do kill -0 "$HOLD_PID" 2>/dev/null || break; sleep 0.1; done
stop_pid "$HOLD_PID" 2
TRAFFIC_S=$(($(elapsed_ms "$START_NS") / 1000))

# --- the workloads' results ----------------------------------------------------------------
if kill -0 "$TS_PID" 2>/dev/null && [ "$MISSED" -eq 0 ]; then
	ok "the proxy answered every sample" "$(($(wc -l <"$TMP/samples.txt") - 1)) samples"
else
	not_ok "the proxy answered every sample" "$MISSED missed; $(kill -0 "$TS_PID" 2>/dev/null && echo alive || echo "exited: $(tail -n 3 "$TMP/twinstack.log" | tr '\n' ' ')")"
fi

# (MiB counted in awk: some awks print integers of 2^31 and above with %d wrongly.)
read -r DL_OK DL_FAIL EC_OK EC_FAIL BULK_MIB < <(awk '
	$1 == "download" && $2 == "ok" { d++; b += $3 / 1048576 } $1 == "download" && $2 != "ok" { df++ }
	$1 == "echo" && $2 == "ok" { e++; b += 2 * $3 / 1048576 } $1 == "echo" && $2 != "ok" { ef++ }
	END { printf "%d %d %d %d %.0f\n", d, df, e, ef, b }' "$TMP/bulk.log")
if [ "$DL_FAIL" -eq 0 ] && [ "$EC_FAIL" -eq 0 ] && [ "$DL_OK" -gt 0 ] && [ "$EC_OK" -gt 0 ]; then
	ok "bulk: every download and echo intact (sha256)" "$DL_OK downloads of $BLOB_MIB MiB, $EC_OK echoes of $ECHO_MIB MiB, $BULK_MIB MiB"
else
	not_ok "bulk: every download and echo intact (sha256)" "$DL_OK/$DL_FAIL downloads ok/failed, $EC_OK/$EC_FAIL echoes; $(grep -v ' ok ' "$TMP/bulk.log" | head -n 2 | tr '\n' ' ')"
fi

CHURN_SUM=$(awk '{ rc = $1; $1 = ""; print "{\"rc\":" rc ",\"r\":" $0 "}" }' "$TMP/churn.log" | jq -sc --argjson c "$CHURN_CHUNK" '
	{chunks: length, bad_chunks: (map(select(.rc != 0 or .r.completed != $c or .r.errors != 0 or .r.timeouts != 0)) | length),
	 completed: (map(.r.completed // 0) | add // 0), errors: (map(.r.errors // 0) | add // 0),
	 causes: (map(.r.error_causes // {}) | reduce .[] as $e ({}; . as $s | $e | to_entries | reduce .[] as $kv ($s; .[$kv.key] += $kv.value)))}')
CHURN_DONE=$(jq .completed <<<"$CHURN_SUM")
if jq -e '.chunks > 0 and .bad_chunks == 0 and .errors == 0' <<<"$CHURN_SUM" >/dev/null; then
	ok "churn: every connection completed, 4 KiB each way checked, no error of any cause" "$CHURN_DONE in $(jq .chunks <<<"$CHURN_SUM") chunks"
else
	not_ok "churn: every connection completed, 4 KiB each way checked, no error of any cause" "$CHURN_SUM; $(grep -v '"errors":0' "$TMP/churn.log" | head -n 1)"
fi

UDP_SUM=$(awk '{ rc = $1; $1 = ""; print "{\"rc\":" rc ",\"r\":" $0 "}" }' "$TMP/udp.log" | jq -sc '
	{chunks: length, failed_chunks: (map(select(.rc != 0)) | length),
	 sent: (map(.r.sent // 0) | add // 0), received: (map(.r.received // 0) | add // 0),
	 bad: (map(.r.bad // 0) | add // 0), send_errors: (map(.r.send_errors // 0) | add // 0)}
	| .loss_pct = (if .sent > 0 then ((.sent - .received) * 100000 / .sent | floor) / 1000 else 100 end)')
UDP_SENT=$(jq .sent <<<"$UDP_SUM") UDP_LOSS=$(jq .loss_pct <<<"$UDP_SUM")
if jq -e --argjson m "$UDP_LOSS_MAX_PCT" '.chunks > 0 and .failed_chunks == 0 and .bad == 0 and .send_errors == 0 and .sent > 0 and .loss_pct <= $m' <<<"$UDP_SUM" >/dev/null; then
	ok "udp: no wrong datagram, loss within $UDP_LOSS_MAX_PCT %" "$UDP_SUM"
else
	not_ok "udp: no wrong datagram, loss within $UDP_LOSS_MAX_PCT %" "$UDP_SUM; $(tail -n 2 "$TMP/udp.err" | tr '\n' ' ')"
fi

DNS_SUM=$(awk '$1 == "unique" || $1 == "hot" { k = $1; rc = $2; $1 = ""; $2 = ""; print "{\"k\":\"" k "\",\"rc\":" rc ",\"r\":" ($0 ~ /[{]/ ? $0 : "{}") "}" }' "$TMP/dns.log" | jq -sc '
	{chunks: length, failed_chunks: (map(select(.rc != 0)) | length),
	 sent: (map(.r.sent // 0) | add // 0), answered: (map(.r.answered // 0) | add // 0),
	 correct: (map(.r.correct // 0) | add // 0), send_errors: (map(.r.send_errors // 0) | add // 0)}')
DNS_TCP_N=$(grep -c '^tcp' "$TMP/dns.log")
DNS_TCP_OK=$(grep -c '^tcp 10\.207\.53\.8$' "$TMP/dns.log")
DNS_SENT=$(jq .sent <<<"$DNS_SUM")
if jq -e '.chunks > 0 and .failed_chunks == 0 and .send_errors == 0 and .correct == .answered
	and .answered * 1000 >= .sent * 999 and .sent > 0' <<<"$DNS_SUM" >/dev/null &&
	[ "$DNS_TCP_N" -gt 0 ] && [ "$DNS_TCP_OK" -eq "$DNS_TCP_N" ]; then
	ok "dns: every answer right (UDP and TCP, through the hijack), at most 0.1 % unanswered" "$DNS_SUM, tcp $DNS_TCP_OK/$DNS_TCP_N"
else
	not_ok "dns: every answer right (UDP and TCP, through the hijack), at most 0.1 % unanswered" "$DNS_SUM, tcp $DNS_TCP_OK/$DNS_TCP_N: $(grep '^tcp' "$TMP/dns.log" | grep -v '10\.207\.53\.8$' | head -n 1)"
fi
DNS_UP=$(delta dns.answered.upstream "$BEFORE" "$AT_END") DNS_CACHE=$(delta dns.answered.cache "$BEFORE" "$AT_END")
if [ "$DNS_UP" != invalid ] && [ "$DNS_CACHE" != invalid ] && [ "$DNS_UP" -gt 0 ] && [ "$DNS_CACHE" -gt 0 ]; then
	ok "dns: the resolver answered from upstream and from its cache" "upstream +$DNS_UP, cache +$DNS_CACHE"
else
	not_ok "dns: the resolver answered from upstream and from its cache" "upstream +$DNS_UP, cache +$DNS_CACHE"
fi

HOLD_JSON=$(grep '^{' "$TMP/hold.out" | tail -n 1)
if jq -e --argjson n "$HELD_N" --argjson s "$SECONDS_RUN" '.held == $n and .failed == 0 and .alive == $n
	and .echoed == $n and .mismatch == 0 and .unanswered == 0
	and .bytes_verified >= $n * 256 * ($s / 2 | floor)' <<<"$HOLD_JSON" >/dev/null 2>&1; then
	ok "held: $HELD_N connections for the whole run, every echo right" "$(jq -c '{bytes_verified, late}' <<<"$HOLD_JSON")"
else
	not_ok "held: $HELD_N connections for the whole run, every echo right" "${HOLD_JSON:-no JSON: $(tail -n 2 "$TMP/hold.out" | tr '\n' ' ')}"
fi

# --- flat ----------------------------------------------------------------------------------
# wmax COLUMN W: the largest value of COLUMN among the samples of window W (0 = warm-up,
# 1 = the second, 5 = the last; a sample at t belongs to window floor(t / WIN_MS)).
wmax() {
	awk -v col="$1" -v w="$2" -v win="$WIN_MS" '
		NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
		{ k = int($1 / win); if (k > 5) k = 5; if (k == w && (!seen || $c > m)) { m = $c; seen = 1 } }
		END { print seen ? m : -1 }' "$TMP/samples.txt"
}
# wmin COLUMN W: the smallest value of COLUMN among the samples of window W.
wmin() {
	awk -v col="$1" -v w="$2" -v win="$WIN_MS" '
		NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
		{ k = int($1 / win); if (k > 5) k = 5; if (k == w && (!seen || $c < m)) { m = $c; seen = 1 } }
		END { print seen ? m : -1 }' "$TMP/samples.txt"
}
# The slack on top of the 1 % (see the header), from the workloads' own bounds.
# Descriptors: a TCP connection in flight holds 2 of the proxy's on the system stack (the
# accepted socket and the outbound one) and, while its bytes move, up to a pipe per direction
# (2 each); on lwip 1 (lwIP copies). In flight at once: CHURN_C churned, one bulk transfer
# (the downloads and the echoes take turns), one DNS query over TCP; and 3 datagram sockets:
# the resolver's upstream query under way (one per try, about a millisecond each at this
# pace) and a UDP chunk's session lingering UDP_IDLE_MS next to the next chunk's.
TCP_INFLIGHT=$((CHURN_C + 2))
PER_CONN=6
[ "$STACK" = lwip ] && PER_CONN=1
FD_SLACK=$((TCP_INFLIGHT * PER_CONN + 3))
# NAT entries: a churn chunk's CHURN_CHUNK connections (in flight or closed and lingering; the
# previous chunk's are gone, see churn_loop), the bulk transfer and the DNS-over-TCP query,
# each with its predecessor's entry lingering: CHURN_CHUNK + 4.
NAT_SLACK=$((CHURN_CHUNK + 4))
# Memory is counted in 4 KiB pages, and 1 % of an idle proxy's RssAnon is less than four of
# them: 16 KiB. A run whose warm-up window is under 4 minutes gets 240 KiB more: the heap
# grows a page at a time while the allocator's free lists settle into the traffic's mix of
# sizes, and that takes minutes, so a short run's second and last windows both sit inside the
# settling. lwIP's mix settles slowest. The slack is about twice the largest rise seen in short
# runs with no new buffer high-water (docs/reliability.md, "Soak", has the runs); a leak per
# connection, datagram or query shows in the 1 h run (`make soak`) and, for buffers, in the
# exact return to idle below.
MEM_SLACK_KB=16
[ "$WIN_MS" -lt 240000 ] && MEM_SLACK_KB=$((MEM_SLACK_KB + 240))

# A new high-water of the buffers in flight (buffers.peak_bytes: every userspace packet and
# stream buffer, lwIP's included; bounded by budgets.buffer_bytes) raises the heap's high-water
# too: on lwip a bulk transfer's send and receive windows (256 KiB each) and relay buffers
# reach their fullest together at some random moment of the run, not necessarily in the
# warm-up. Memory may grow by 3 x that growth: lwIP's blocks come in power-of-two size classes
# (up to 2 x what they hold) and freed ones wait in its cache; measured here, RssAnon rose by
# 1.9-2.1 x the new high-water. A buffer that leaks instead shows in the return to idle
# (buffers.in_use_bytes).
PEAK_GROWTH_KB=$(( ($(wmax buffers_peak 5) - $(wmax buffers_peak 1)) / 1024 ))
[ "$PEAK_GROWTH_KB" -gt 0 ] || PEAK_GROWTH_KB=0

FLAT_FIG=""
flat() { # flat COLUMN SLACK [ALLOWANCE WHY]
	local c=$1 slack=$2 allow=${3:-0} why=${4:-} w0 w1 w5 lim
	w0=$(wmax "$c" 0) w1=$(wmax "$c" 1) w5=$(wmax "$c" 5)
	lim=$((w1 + (w1 + 99) / 100 + slack + allow))
	FLAT_FIG="$FLAT_FIG $c=$w0/$w1/$w5"
	if [ "$w1" -ge 0 ] && [ "$w5" -ge 0 ] && [ "$w5" -le "$lim" ]; then
		ok "flat: $c, last window's max $w5 <= second's $w1 + 1 % + $slack${why:+ + $allow ($why)}" "warm-up $w0"
	else
		not_ok "flat: $c, last window's max <= second's + 1 % + $slack${why:+ + $allow ($why)}" "second $w1, last $w5 (limit $lim), warm-up $w0"
	fi
}
MEM_ALLOW=$((3 * PEAK_GROWTH_KB))
flat rss_kb "$MEM_SLACK_KB" "$MEM_ALLOW" "3 x buffer high-water growth"
flat vmrss_kb "$MEM_SLACK_KB" "$MEM_ALLOW" "3 x buffer high-water growth"
flat rssanon_kb "$MEM_SLACK_KB" "$MEM_ALLOW" "3 x buffer high-water growth"
# The peak (the kernel's high-water mark of RSS) is the largest RSS at any instant, and RSS is
# sampled once a minute: between samples it swings with the transfers under way (lwIP's
# windows are allocated and given back as they fill and drain, a few hundred KiB on lwip; the
# heap's layout decides how many pages the same bytes take). Over an hour a stationary swing
# reaches a little higher now and then, so the peak may rise past the second window's by as
# much as RSS was seen to swing within that window (its largest sample less its smallest); a
# swing that widens, or memory that grows, goes past that (and the figures above catch growth).
SWING_KB=$(($(wmax rss_kb 1) - $(wmin rss_kb 1)))
flat peak_rss_kb "$MEM_SLACK_KB" $((MEM_ALLOW + SWING_KB)) "3 x buffer high-water growth + the second window's RSS swing"
flat fds "$FD_SLACK"
# lwIP keeps no NAT table (nat.* stay 0): its connections are the sessions, and their memory
# is in the figures above.
if [ "$STACK" = system ]; then flat nat_entries "$NAT_SLACK"; else FLAT_FIG="$FLAT_FIG nat_entries=n/a"; fi
for c in sessions udp_sessions buffers_bytes buffers_peak stack_bytes pipes nat_quarantined dns_cache; do
	FLAT_FIG="$FLAT_FIG $c=$(wmax "$c" 0)/$(wmax "$c" 1)/$(wmax "$c" 5)"
done

# --- back to idle --------------------------------------------------------------------------
t_idle=$(now_ns)
IDLE_MS=-1
diff=unreached
while [ "$(elapsed_ms "$t_idle")" -lt $((IDLE_S * 1000)) ]; do
	doc=$(stats) && diff=$(idle_diff "$doc") && [ -z "$diff" ] && { IDLE_MS=$(elapsed_ms "$t_idle"); break; }
	sleep 0.2
done
if [ "$IDLE_MS" -ge 0 ]; then
	ok "back to idle (NAT entries, sessions, UDP sessions, pipes, fds, budget, buffers, DNS)" "in $IDLE_MS ms after the clients, bound $IDLE_S s"
else
	not_ok "back to idle within $IDLE_S s" "${diff:-no /stats}"
fi
AFTER=$(stats)
printf '%s\n' "$AFTER" >"$TMP/stats_end.json"
# The in-kernel fast path (the system stack's, where it runs): it carried connections and UDP
# flows in the run, and once idle the kernel's maps hold none of them: an entry whose removal
# failed unnoticed would be kernel memory, outside every figure above.
FP_FIG=""
if [ "$(stat_key fast_path.state "$AFTER")" = on ]; then
	fp_added=$(delta fast_path.conns_added "$BEFORE" "$AFTER")
	fp_udp=$(delta fast_path.udp_datagrams_out "$BEFORE" "$AFTER")
	if [ "$fp_added" != invalid ] && [ "$fp_added" -gt 0 ]; then
		ok "fast path: it carried connections" "conns_added +$fp_added, udp_datagrams_out +$fp_udp ($(stat_key fast_path.udp_state "$AFTER"))"
	else
		not_ok "fast path: it carried connections" "conns_added +$fp_added"
	fi
	fp_kmax=$(awk 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "fp_kernel") c = i; next }
		$c > m { m = $c } END { print m + 0 }' "$TMP/samples.txt")
	fp_k=$(fp_kernel_entries "$NS_D" "$TUN")
	FP_FIG=" fp_conns_added=$fp_added fp_udp_out=$fp_udp fp_kernel_max=$fp_kmax fp_kernel_idle=$fp_k"
	if [ "$fp_k" -lt 0 ]; then
		note "fast path: the kernel's maps not read (bpftool: $(command -v bpftool || echo none))"
	elif [ "$fp_k" -eq 0 ] && [ "$fp_kmax" -gt 0 ]; then
		ok "fast path: the kernel's maps empty once idle" "up to $fp_kmax entries in the samples"
	else
		not_ok "fast path: the kernel's maps empty once idle" "$fp_k entries; up to $fp_kmax in the samples"
	fi
fi
f=$(failures "$BEFORE" "$AFTER")
if [ -z "$f" ]; then ok "nothing refused, no session failed, no UDP or DNS drop or failure"
else not_ok "nothing refused, no session failed, no UDP or DNS drop or failure" "$f"; fi
if [ "$STACK" = system ]; then
	note "nat: $(jq -c '.stack_counters | {nat_created, nat_quarantined, nat_released, nat_quarantine_reuse, nat_ports_exhausted}' <<<"$AFTER")"
fi
note "sessions.total +$(delta sessions.total "$BEFORE" "$AFTER"), relay bytes up +$(delta relay.bytes_up "$BEFORE" "$AFTER") down +$(delta relay.bytes_down "$BEFORE" "$AFTER"), dns.queries +$(delta dns.queries "$BEFORE" "$AFTER")"
if kill -0 "$TS_PID" 2>/dev/null; then ok "the proxy is alive at the end"; else not_ok "the proxy is alive at the end" "exited: $(tail -n 3 "$TMP/twinstack.log")"; fi

if [ "$VERBOSE" -eq 1 ]; then
	note "per-sample table (t_s; memory KiB; buffers bytes):"
	{ echo "$COLS"; [ -s "$TMP/start.txt" ] && sed 's/^0 /start /' "$TMP/start.txt"; tail -n +2 "$TMP/samples.txt" | awk '{ $1 = $1 / 1000; print }'; } |
		sed 's/^t_ms/t_s/' | awk '{ for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } n[NR] = NF }
			END { for (r = 1; r <= NR; r++) { printf "#  "; for (i = 1; i <= n[r]; i++) printf " %*s", w[i], c[r, i]; printf "\n" } }'
	note "rss after idle: $(sk rss_kb "$AFTER") KiB, fds $(sk fds "$AFTER"), idle before the traffic: rss $(sk rss_kb "$IDLE") fds $(sk fds "$IDLE")"
fi
note "figures: stack=$STACK seconds=$SECONDS_RUN sample_s=$SAMPLE_S window_s=$((WIN_MS / 1000)) (warm-up/second/last max)$FLAT_FIG idle_rss_kb=$(sk rss_kb "$IDLE") idle_fds=$(sk fds "$IDLE") bulk_mib=$BULK_MIB downloads=$DL_OK echoes=$EC_OK churned=$CHURN_DONE udp_sent=$UDP_SENT udp_loss_pct=$UDP_LOSS dns_queries=$DNS_SENT dns_tcp=$DNS_TCP_OK held=$HELD_N idle_ms=$IDLE_MS$FP_FIG"
stop_pid "$TS_PID" 3
stop_pid "$SERVE_PID" 2
stop_pid "$HTTPD_PID" 2
stop_pid "$DNSMASQ_PID" 2
note "elapsed $(($(elapsed_ms "$T0") / 1000)) s (traffic $TRAFFIC_S s)"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
