#!/usr/bin/env bash
# faults.sh — how the proxy fails: a peer killed mid-transfer, an outbound that never answers,
# refuses or is unreachable, descriptors and every budget used up. Each fault has one expected
# outcome (a prompt RST to the app, a counter that moves by an exact amount, the sessions that
# ran before untouched), and the proxy comes back to its idle figures afterwards.
#
#   ns D0..D7: one twinstack run (auto_route)          ns S: the servers, on lo
#   each, one case each, + its apps                     10.207.9.2: load serve TCP+UDP :7000,
#   faults.py (upload, download, push, rst, syn,                    sink :7101, source :7102,
#   udp, burst), twinstack load hold / connrate                     gated echo :7104
#                                                       10.207.9.3: sink :7103 (via SOCKS5)
#     | auto_route: everything -> tun                   10.207.9.4: microsocks :1080
#     v                                                 10.207.9.6: :7301, a SOCKS5 server
#   tun 198.18.0.1/15 (twinstack's)                                 that never answers
#   outbounds: direct; socks5 microsocks for            nftables table tsf_TOKEN, input:
#     10.207.9.3; socks5 10.207.9.6:7301 for UDP          :7201, :7301 SYN dropped
#     to 10.207.9.5                                       :7202 reject icmpx host-unreachable
#   vfdN 10.207.N.1/24 -------------------------- vfsN 10.207.N.2/24   :7203 nothing listens
#
# Every case has its own namespace and a fresh proxy (timeouts.connect_ms 1000, nat.linger_ms
# 300), and the cases run side by side. Held connections are `load hold`: each echoes 256 bytes
# of its own pattern every 200 ms and must get every round back intact, to the end.
# kill: at once, and each app timing its own connection:
#   - an app uploads without pause to a server that reads 1 KiB every 100 ms, through the
#     direct outbound, and SIGKILLs it once its own send buffer is full (every buffer on the
#     way is, the server's receive queue too) and 300 ms have passed: the server's kernel
#     answers with a RST. The app's connection must fail (ECONNRESET, EPIPE) within 1 s of
#     the kill;
#   - the same through the SOCKS5 outbound, microsocks being the one killed (blocked on the
#     slow server, with bytes unread), and for a download (the server writes 16 KiB of its
#     pattern every 10 ms: the app's stream must end, EOF or RST, within 1 s, every byte it
#     got being the pattern);
#   - three apps each connect to a port whose SYNs are dropped (a RST after connect_ms, within
#     900-1500 ms: sessions.failed.connect_timeout +3), to one with no listener (a RST before
#     connect_ms: connect_refused +3), and to one answered with ICMP host unreachable (a RST
#     before connect_ms: unreachable +3); the counters say no timeout ended those.
#   Then 12 sessions counted, no other refusal or failure counter moved, and the proxy back at
#   its idle figures (sessions, NAT entries, descriptors, pipes, budget in use, buffers)
#   within 5 s: nothing the faults touched leaked.
# nofile: the proxy under `prlimit --nofile=96:96`; budget.fds_limit is 96 less the reserve,
#   and held connections take all of it (two descriptors each on the system stack, one on
#   lwip). Three more apps get a RST; budget.fd_refused, sessions.refused and the stack's own
#   counter (drops.fd_exhausted; lwip: sessions.failed.fd_budget) +3; the accept loop never met
#   EMFILE; /stats answers; back to idle, 20 new connections succeed.
# tcp_sessions 8 (all tiers), 8 held: three more get a RST; budget.tcp_refused,
#   drops.admission_refused and sessions.refused +3; back to idle, 20 new connections succeed
#   one at a time.
# udp_sessions 4: four flows answered, three new ones dropped (budget.udp_refused and
#   udp.drops.no_session_budget +3), the four still answered.
# nat_entries 4 (system stack), 4 held: three more apps get a RST (the table refuses them),
#   drops.nat_exhausted +3; once the held ones are gone, new connections succeed.
# fds 16 (relay copy): as nofile, the budget binding instead of the limit; the new connections
#   one at a time (a closing session holds its descriptors until both ends have closed).
# buffer_bytes: relay copy with 4 KiB buffers; the idle proxy's own buffers (measured on a
#   proxy without limits) plus 8 KiB (system: an app that reads nothing pins both relay
#   buffers) or 256 KiB (lwip, which charges its segments too), 4 held: 16 echo transfers of
#   64 KiB at once to an echo server that reads nothing until all 16 are open and 300 ms have
#   passed (their bytes wait in the proxy: the budget must say no, however fast the machine)
#   all complete intact within 5 s; budget.buffer_refused moves; no session refused or failed.
# udp_up_queue 4: ten datagrams to the SOCKS5 server that never answers: six dropped at once
#   (udp.drops.queue_full +6), the four queued dropped when the association times out
#   (assoc_failed +4, assoc_failures +1); a UDP flow through the direct outbound is answered
#   meanwhile.
# Every proxy is alive at its case's end and exits 0 on SIGTERM.
# The last line before the tally is '# figures: ...' with the numbers docs/reliability.md quotes.
#
# usage: faults.sh [--stack system|lwip] [--bin PATH] [--cases LIST] [--keep] [-v]
#   --cases  comma-separated subset of kill, nofile, tcp_sessions, udp_sessions, nat_entries,
#            fds, buffer_bytes, udp_up_queue (default: all; nat_entries on the system stack)
# Output: 'ok - NAME (detail)' / 'not ok - NAME: REASON' lines, '#' notes, 'N passed, N failed'.
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun), 1 otherwise.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ALL_CASES=kill,nofile,tcp_sessions,udp_sessions,nat_entries,fds,buffer_bytes,udp_up_queue
CASES=$ALL_CASES
CONNECT_MS=1000
RESET_BOUND_MS=1000 # a killed peer's connection ends at the app within this
IDLE_S=5            # back to idle within this (the NAT's linger 300 ms, idle pipes 1 s)
CASE_S=80           # the cases not done by then are stopped and fail

# shellcheck source=tests/integration/lib.sh
. "$HERE/lib.sh"
suite_args faults --cases CASES -- "$@"
for c in ${CASES//,/ }; do
	case ",$ALL_CASES," in *",$c,"*) ;; *) echo "faults.sh: unknown case '$c'" >&2; exit 2 ;; esac
done
want() { case ",$CASES," in *",$1,"*) return 0 ;; esac; return 1; }

suite_begin faults ip ss curl jq nft nsenter prlimit microsocks
# The polls (here and in lib.sh) sleep inside the shell, in a read that times out on a FIFO
# nobody writes: eight cases polling side by side would otherwise start hundreds of `sleep`
# processes, which on a loaded machine cost more than the polls.
mkfifo "$TMP/.sleep" && exec {SLEEP_FD}<>"$TMP/.sleep"
sleep() { read -rt "$1" -u "$SLEEP_FD" _; return 0; }
NS_S=tsfS-$TOK
SRV=10.207.9.2 VIA_S5=10.207.9.3 S5=10.207.9.4 S5_UDP=10.207.9.5 S5_DEAD=10.207.9.6 P_STATS=9191
# The proxy's side of case N: its namespace and TUN (inD and stats use NS_D).
use_bed() { NS_D=tsfD$1-$TOK TUN=tsft$1$TOK; }
# The apps and /stats need only the network namespace (nsenter costs half of ip netns exec).
inD() { nsenter --net="/run/netns/$NS_D" "$@"; }
inS() { ip netns exec "$NS_S" "$@"; }
# spawn_d LOG CMD...: lib.sh's spawn, in NS_D's network namespace only.
spawn_d() {
	local log=$1
	shift
	nsenter --net="/run/netns/$NS_D" "$@" </dev/null >"$log" 2>&1 &
	SPAWNED=$!
	PIDS+=("$SPAWNED")
}
fx() { inD "$PY" "$HERE/faults.py" "$@"; }
PER=2 FD_KEY=drops.fd_exhausted # the system stack holds the accepted socket and the outbound
[ "$STACK" = lwip ] && PER=1 FD_KEY=sessions.failed.fd_budget
T0=$(date +%s%N)
note "faults: stack=$STACK cases=$CASES token=$TOK"

# --- testbed -------------------------------------------------------------------------------
# bed N: namespace D<N>'s veth into S (10.207.N.0/24) and its default route there.
bed() {
	local d=tsfD$1-$TOK vd=tsfd$1$TOK vs=tsfs$1$TOK
	ip link add "$vd" netns "$d" type veth peer name "$vs" netns "$NS_S" || return 1
	ip -n "$d" link set "$vd" up && ip -n "$NS_S" link set "$vs" up &&
		ip -n "$d" addr add "10.207.$1.1/24" dev "$vd" && ip -n "$NS_S" addr add "10.207.$1.2/24" dev "$vs" &&
		ip -n "$d" route add default via "10.207.$1.2"
}
# The case each bed N runs.
BEDS=(kill nofile tcp_sessions udp_sessions nat_entries fds buffer_bytes udp_up_queue)
[ "$STACK" = lwip ] && CASES=$(tr ',' '\n' <<<"$CASES" | grep -vx nat_entries | paste -sd, -)
topology() {
	local i a
	netns_add "$NS_S" || return 1
	for a in "$SRV" "$VIA_S5" "$S5" "$S5_UDP" "$S5_DEAD"; do ip -n "$NS_S" addr add "$a/32" dev lo || return 1; done
	# The namespaces here (cleanup deletes them), their links side by side.
	for i in "${!BEDS[@]}"; do
		want "${BEDS[$i]}" && { netns_add "tsfD$i-$TOK" || return 1; }
	done
	for i in "${!BEDS[@]}"; do
		want "${BEDS[$i]}" && { bed "$i" >"$TMP/bed.$i.out" 2>&1 || echo "bed $i: $(cat "$TMP/bed.$i.out")" >>"$TMP/bed.fail"; } &
	done
	wait
	[ ! -s "$TMP/bed.fail" ] || { cat "$TMP/bed.fail"; return 1; }
	# Only inside S, named with the token: SYNs dropped (a blackhole, and a SOCKS5 server that
	# never answers) and an ICMP host unreachable.
	inS nft -f - <<-EOF || return 1
	table inet tsf_$TOK {
		chain input {
			type filter hook input priority 0; policy accept;
			tcp dport { 7201, 7301 } tcp flags & (syn | ack) == syn counter drop
			tcp dport 7202 counter reject with icmpx type host-unreachable
		}
	}
	EOF
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

# serve_py NAME MODE ADDR PORT [ARG...]: a faults.py server in S; sets SPAWNED.
serve_py() {
	local name=$1 mode=$2 addr=$3 port=$4
	shift 4
	spawn "$NS_S" "$TMP/$name.log" "$PY" "$HERE/faults.py" "$mode" --bind "$addr" --port "$port" "$@"
}
spawn "$NS_S" "$TMP/serve.log" "$BIN" load serve --bind "$SRV" --tcp-ports 7000 --udp-port 7000 --duration 3600
SERVE_PID=$SPAWNED
if want kill; then # the servers the kill case kills, one process each
	MARK_UP=$TMP/got.upload MARK_S5=$TMP/got.socks5 # created by the sinks at their first bytes
	serve_py sink sink "$SRV" 7101 --mark "$MARK_UP"
	P_SINK=$SPAWNED
	serve_py source source "$SRV" 7102
	P_SOURCE=$SPAWNED
	serve_py sink_s5 sink "$VIA_S5" 7103 --mark "$MARK_S5"
	spawn "$NS_S" "$TMP/microsocks.log" microsocks -i "$S5" -p 1080
	P_MICROSOCKS=$SPAWNED
fi
if want buffer_bytes; then
	# Holds the transfers' bytes on the path until all 16 are open: without it a fast
	# machine can finish them one after the other and the budget never has to say no.
	serve_py gate gate "$SRV" 7104 --conns 16 --hold-ms 300 --max-wait-ms 3000
	wait_listen "$NS_S" tcp 7104 50 || { not_ok setup "the gated echo server: $(tail -n 2 "$TMP/gate.log")"; exit 1; }
fi
if ! { wait_listen "$NS_S" tcp 7000 100 && wait_listen "$NS_S" udp 7000 50; }; then
	not_ok setup "load serve: $(tail -n 2 "$TMP/serve.log")"
	exit 1
fi
if want kill; then
	for p in 7101 7102 7103 1080; do
		wait_listen "$NS_S" tcp "$p" 50 || { not_ok setup "nothing listens on :$p in S"; exit 1; }
	done
fi

# --- the proxy ------------------------------------------------------------------------------
# config OVERRIDES: the base configuration merged with OVERRIDES (a jq object) into
# $TMP/cfg.json.
config() {
	jq -n --arg s "$STACK" --arg t "$TUN" --arg l "127.0.0.1:$P_STATS" --argjson cms "$CONNECT_MS" \
		--arg s5 "$S5:1080" --arg via "$VIA_S5/32" --arg s5u "$S5_UDP/32" --arg dead "$S5_DEAD:7301" \
		'{stack: $s, tun: {name: $t, auto_route: true}, stats: {listen: $l},
		  nat: {linger_ms: 300}, timeouts: {connect_ms: $cms},
		  outbounds: [{tag: "direct", type: "direct"},
		              {tag: "s5", type: "socks5", server: $s5},
		              {tag: "s5dead", type: "socks5", server: $dead}],
		  route: {rules: [{cidr: [$via], outbound: "s5"}, {cidr: [$s5u], outbound: "s5dead"}],
		          final: "direct"},
		  log: {level: "warn"}} * '"$1" >"$TMP/cfg.json"
}
# proxy_start [WRAPPER...]: twinstack run with $TMP/cfg.json in NS_D (under WRAPPER, e.g.
# prlimit), its ready byte within 10 s, /stats; sets TS_PID and IDLE (the idle document).
# shellcheck disable=SC2120 # the wrapper is optional
proxy_start() {
	local i
	: >"$TMP/ready"
	echo "--- start: $* $(jq -c . "$TMP/cfg.json")" >>"$TMP/twinstack.log"
	ip netns exec "$NS_D" "$@" "$BIN" run --config "$TMP/cfg.json" --ready-fd 3 \
		3>"$TMP/ready" </dev/null >>"$TMP/twinstack.log" 2>&1 &
	TS_PID=$!
	PIDS+=("$TS_PID")
	for ((i = 0; i < 100; i++)); do
		[ -s "$TMP/ready" ] && break
		kill -0 "$TS_PID" 2>/dev/null || break
		sleep 0.1
	done
	[ -s "$TMP/ready" ] || { echo "no ready byte: $(tail -n 3 "$TMP/twinstack.log" | tr '\n' ' ')"; return 1; }
	wait_until 50 0.1 stats >/dev/null || { echo "no /stats"; return 1; }
	IDLE=$(stats)
	echo "pid $TS_PID, fds_limit $(stat_key budget.fds_limit "$IDLE")"
}
# proxy_fresh NAME OVERRIDES [WRAPPER...]: the case's proxy (any earlier one stopped).
proxy_fresh() {
	local name=$1 over=$2
	shift 2
	proxy_stop
	PREV_CASE=$name
	config "$over"
	check "$name: a fresh proxy, $(jq -nc "$over")" proxy_start "$@"
}
# proxy_stop: SIGTERM to the running proxy, if any; it must exit 0 within 10 s (eight cases side
# by side on a busy machine, an AddressSanitizer build checking for leaks at exit) and leak nothing.
proxy_stop() {
	[ -n "${TS_PID:-}" ] && kill -0 "$TS_PID" 2>/dev/null && check "$PREV_CASE: SIGTERM ends the proxy, exit 0" ts_sigterm 10
	TS_PID=
}
TS_PID='' PREV_CASE=''

# --- figures from /stats -------------------------------------------------------------------
sk() { stat_key "$1" "$2"; }
# idle_diff DOC: what differs from the idle document (empty when idle again).
idle_diff() {
	jq -rn --argjson i "$IDLE" --argjson n "$1" '
		[ (if ($n.nat.half_open + $n.nat.active + $n.nat.closing) != 0
		   then "nat entries \($n.nat.half_open)/\($n.nat.active)/\($n.nat.closing)" else empty end),
		  (["sessions.active", "udp.sessions", "udp.assocs", "splice.pipes", "fds",
		    "budget.tcp_in_use", "budget.udp_in_use", "budget.fds_in_use",
		    "buffers.in_use_bytes"][] as $k
		   | ($k | split(".")) as $p
		   | if ($n | getpath($p)) != ($i | getpath($p))
		     then "\($k) \($n | getpath($p)) (idle \($i | getpath($p)))" else empty end)
		] | join(", ")'
}
# wait_idle NAME: polls /stats every 0.2 s for at most IDLE_S; sets IDLE_MS (or -1).
wait_idle() {
	local t0 doc diff=unreached
	t0=$(date +%s%N)
	IDLE_MS=-1
	while [ "$(elapsed_ms "$t0")" -lt $((IDLE_S * 1000)) ]; do
		doc=$(stats) && diff=$(idle_diff "$doc") && [ -z "$diff" ] && { IDLE_MS=$(elapsed_ms "$t0"); break; }
		sleep 0.2
	done
	if [ "$IDLE_MS" -ge 0 ]; then ok "$1: back to idle (sessions, NAT, fds, pipes, budget, buffers)" "in $IDLE_MS ms"
	else not_ok "$1: back to idle within $IDLE_S s" "${diff:-no /stats}"; fi
}
# deltas NAME BEFORE AFTER KEY=N...: each KEY grew by exactly N (one line each).
deltas() {
	local name=$1 b=$2 a=$3 res k n d kv
	shift 3
	# A /stats read that failed is a failure of every check, not a check left out.
	if ! jq -e . <<<"$b" >/dev/null 2>&1 || ! jq -e . <<<"$a" >/dev/null 2>&1; then
		for kv in "$@"; do not_ok "$name: ${kv%%=*} +${kv#*=}" "no /stats document"; done
		return
	fi
	while read -r res k n d; do
		if [ "$res" = ok ]; then ok "$name: $k +$n"; else not_ok "$name: $k +$n" "moved by $d"; fi
	done < <(jq -rn --argjson b "$b" --argjson a "$a" '$ARGS.positional[] | split("=") as [$k, $n]
		| ($k | split(".")) as $p | (($a | getpath($p)) // "missing") as $x | (($b | getpath($p)) // 0) as $y
		| (if ($x | type) == "number" then $x - $y else "invalid" end) as $d
		| "\(if $d == ($n | tonumber) then "ok" else "no" end) \($k) \($n) \($d)"' --args "$@")
}
# refusals BEFORE AFTER: every refusal or failure counter that moved, "key +n", comma-separated
# (but the IPv6 router solicitations the kernel sends into a new TUN, dropped as malformed).
refusals() {
	# A /stats read that failed reads as refusals, not as none.
	jq -e . <<<"$1" >/dev/null 2>&1 && jq -e . <<<"$2" >/dev/null 2>&1 ||
		{ echo "no /stats document"; return; }
	jq -rn --argjson a "$1" --argjson b "$2" '
		def flat: [paths(numbers) as $p | {key: ($p | map(tostring) | join(".")), value: getpath($p)}] | from_entries;
		($a | flat) as $x | ($b | flat) | to_entries[]
		| select(.key | test("^(drops\\.[a-z_]+|sessions\\.refused|sessions\\.failed\\..*|budget\\..*_refused|udp\\.drops\\..*|udp\\.assoc_failures|stack_counters\\.(drop_.*|accept_(backoff|retry)|session_setup_failed|syn_rcvd_evicted|write_nomem|rx_payload_nomem|ooseq_freed))$"))
		| select(.key | test("^(drops\\.malformed|stack_counters\\.drop_family)$") | not)
		| select(.value != ($x[.key] // 0)) | "\(.key) +\(.value - ($x[.key] // 0))"' | paste -sd, -
}

# --- held connections and new ones --------------------------------------------------------
# hold_start NAME N [PROCS]: N connections to SRV:7000 in PROCS `load hold` processes (default
# 1), started one after another, each once the proxy has the previous ones as sessions; each
# connection echoes 256 bytes of its own pattern every 200 ms. Ends once sessions.active is N.
hold_start() {
	local name=$1 n=$2 procs=${3:-1} per i k have held
	per=$((n / procs))
	HOLD_PIDS=()
	for ((k = 0; k < procs; k++)); do
		: >"$TMP/hold.$k.out"
		spawn_d "$TMP/hold.$k.out" "$BIN" load hold --target "$SRV:7000" --conns "$per" \
			--duration 60 --interval-ms 200 --size 256
		HOLD_PIDS+=("$SPAWNED")
		for ((i = 0; i < 100; i++)); do
			grep -q '^HELD' "$TMP/hold.$k.out" && break
			sleep 0.05
		done
		for ((i = 0; i < 50; i++)); do
			have=$(stats | jq .sessions.active)
			[ "${have:-0}" -ge $(((k + 1) * per)) ] && break
			sleep 0.1
		done
	done
	held=$(cat "$TMP"/hold.*.out | awk '/^HELD/ { s += $2 } END { print s + 0 }')
	if [ "$held" -eq "$n" ] && [ "${have:-0}" -eq "$n" ]; then
		ok "$name: $n connections held (load hold), $n sessions"
	else
		not_ok "$name: $n connections held" "HELD $held, sessions.active ${have:-?}"
	fi
}
# hold_stop NAME N: SIGTERM to every hold process; passes when all N were held to the end and
# every round came back byte for byte (a late round is the machine's pace, not an error).
hold_stop() {
	local name=$1 n=$2 pid i all
	for pid in "${HOLD_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
	for pid in "${HOLD_PIDS[@]}"; do
		for ((i = 0; i < 150; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		stop_pid "$pid" 1
	done
	all=$(cat "$TMP"/hold.*.out | grep '^{' | jq -s '{held: (map(.held) | add), failed: (map(.failed) | add),
		alive: (map(.alive) | add), echoed: (map(.echoed) | add), mismatch: (map(.mismatch) | add),
		unanswered: (map(.unanswered) | add), late: (map(.late) | add),
		echo_errors: (map(.echo_errors) | add), bytes_verified: (map(.bytes_verified) | add)}')
	rm -f "$TMP"/hold.*.out
	if jq -e --argjson n "$n" '.held == $n and .failed == 0 and .alive == $n and .echoed == $n
		and .mismatch == 0 and .unanswered == 0 and .echo_errors == .late' <<<"$all" >/dev/null 2>&1; then
		ok "$name: the $n held connections echoed every round intact, none broke" "$(jq -c '{bytes_verified, late}' <<<"$all")"
	else
		not_ok "$name: the $n held connections echoed every round intact, none broke" "$(jq -c . <<<"${all:-null}")"
	fi
}
# new_conns NAME N [C]: N new connections, C at a time (4), each 4 KiB echoed and checked.
# On failure the detail names the proxy's refusal counters that moved meanwhile.
new_conns() {
	local json b a
	b=$(stats)
	json=$(inD "$BIN" load connrate --target "$SRV" --ports 7000 --count "$2" --duration 10 \
		--concurrency "${3:-4}" --req 4096 --timeout-ms 3000 2>>"$TMP/connrate.err" | tail -n 1)
	if jq -e --argjson n "$2" '.completed == $n and .errors == 0' <<<"$json" >/dev/null 2>&1; then
		ok "$1: $2 new connections, 4 KiB echoed each"
	else
		a=$(stats)
		not_ok "$1: $2 new connections, 4 KiB echoed each" \
			"${json:-no JSON}; the proxy's refusals meanwhile: $(refusals "${b:-null}" "${a:-null}" 2>/dev/null)"
	fi
}
# rsts NAME N: N new connections at once; each must end in a RST within 3 s (the app's view).
rsts() {
	local json
	json=$(fx rst --target "$SRV:7000" --count "$2" --bound-ms 3000)
	if jq -e --argjson n "$2" '(.refused + .reset) == $n and .timeout == 0' <<<"$json" >/dev/null 2>&1; then
		ok "$1: $2 new connections get a RST" "$(jq -r '"refused \(.refused), reset \(.reset), within \(.max_ms) ms"' <<<"$json")"
	else
		not_ok "$1: $2 new connections get a RST" "${json:-no JSON}"
	fi
}
alive() {
	if kill -0 "$TS_PID" 2>/dev/null && stats >/dev/null; then ok "$1: the proxy is up, /stats answers"
	else not_ok "$1: the proxy is up" "$(tail -n 3 "$TMP/twinstack.log" | tr '\n' ' ')"; fi
}
FIG=()
fig() { FIG+=("$1"); }

# --- kill: peers killed mid-transfer, outbounds that never answer -------------------------
# killed NAME MODE JSON: the app (faults.py MODE) that SIGKILLed its peer 300 ms into the
# transfer printed JSON; its connection must have ended within RESET_BOUND_MS, by a RST (an
# upload), or EOF or RST (a download, whose bytes must all be the pattern).
killed() {
	local name=$1 ends='["reset", "epipe"]' verdict res ms
	[ "$2" = download ] && ends='["reset", "eof"]'
	verdict=$(jq -r --argjson ends "$ends" --argjson b "$RESET_BOUND_MS" '
		if (.end as $e | $ends | index($e)) != null and .before_kill == false and .ms <= $b
		   and (.pattern_ok != false)
		then "ok \(.ms) the app'"'"'s connection ends (\(.end)) \(.ms) ms after the SIGKILL|\(.sent // .received) bytes moved, bound \($b) ms"
		else "no \(.ms // -1)" end' <<<"$3" 2>/dev/null)
	read -r res ms _ <<<"$verdict"
	if [ "$res" = ok ]; then
		verdict=${verdict#ok * } # TEXT|DETAIL
		ok "$name: ${verdict%%|*}" "${verdict#*|}"
	else
		not_ok "$name: the app's connection ends within $RESET_BOUND_MS ms of the SIGKILL ($ends)" "${3:-no JSON}"
	fi
	fig "${name}_ms=$ms"
}
# rst_within JSON LO HI: the rst client saw 3 RSTs, each between LO and HI ms.
rst_within() {
	jq -e --argjson lo "$2" --argjson hi "$3" '(.refused + .reset) == 3 and .min_ms >= $lo and .max_ms <= $hi' <<<"$1" >/dev/null 2>&1
}

case_kill() {
	local before after jh jr ju p1 p2 p3 p4 p5 p6 r hole lo=$((CONNECT_MS * 9 / 10)) hi=$((CONNECT_MS + 500))
	proxy_fresh kill '{}' || return
	before=$(stats)
	# All at once: each app measures its own connection.
	fx rst --target "$SRV:7201" --count 3 --bound-ms 4000 >"$TMP/rst.hole" &
	p1=$!
	fx rst --target "$SRV:7203" --count 3 --bound-ms 4000 >"$TMP/rst.refused" &
	p2=$!
	fx rst --target "$SRV:7202" --count 3 --bound-ms 4000 >"$TMP/rst.unreach" &
	p3=$!
	fx upload --target "$SRV:7101" --kill "$P_SINK" --mark "$MARK_UP" --after-ms 300 \
		--bound-ms 5000 >"$TMP/kill.upload" &
	p4=$!
	fx download --target "$SRV:7102" --kill "$P_SOURCE" --after-ms 300 --bound-ms 3000 >"$TMP/kill.download" &
	p5=$!
	fx upload --target "$VIA_S5:7103" --kill "$P_MICROSOCKS" --mark "$MARK_S5" \
		--after-ms 300 --bound-ms 5000 >"$TMP/kill.socks5" &
	p6=$!
	wait "$p1" "$p2" "$p3" "$p4" "$p5" "$p6"
	killed kill_upload upload "$(cat "$TMP/kill.upload")"
	killed kill_download download "$(cat "$TMP/kill.download")"
	killed kill_socks5 upload "$(cat "$TMP/kill.socks5")"
	jh=$(cat "$TMP/rst.hole") jr=$(cat "$TMP/rst.refused") ju=$(cat "$TMP/rst.unreach")
	if rst_within "$jh" "$lo" "$hi"; then ok "connect: SYNs blackholed: 3 apps get a RST after connect_ms" "$(jq -r '"\(.min_ms)-\(.max_ms) ms"' <<<"$jh"), bound $lo-$hi"
	else not_ok "connect: SYNs blackholed: 3 apps get a RST within $lo-$hi ms" "$jh"; fi
	if rst_within "$jr" 0 "$CONNECT_MS"; then ok "connect: no listener (a RST from S): 3 apps get a RST at once" "within $(jq -r .max_ms <<<"$jr") ms"
	else not_ok "connect: no listener: 3 apps get a RST within connect_ms" "$jr"; fi
	if rst_within "$ju" 0 "$CONNECT_MS"; then ok "connect: ICMP host unreachable: 3 apps get a RST at once" "within $(jq -r .max_ms <<<"$ju") ms"
	else not_ok "connect: ICMP host unreachable: 3 apps get a RST within connect_ms" "$ju"; fi
	hole=$(inS nft list table inet "tsf_$TOK" | awk '/dport \{ 7201, 7301 \}/ { for (i = 1; i < NF; i++) if ($i == "packets") print $(i + 1) }')
	check "connect: the blackhole dropped the proxy's SYNs (nft counter ${hole:-none})" test "${hole:-0}" -ge 3
	after=$(stats)
	deltas kill "$before" "$after" sessions.total=12 sessions.failed.connect_timeout=3 \
		sessions.failed.connect_refused=3 sessions.failed.unreachable=3
	r=$(refusals "$before" "$after" | tr ',' '\n' | grep -Ev '^sessions\.(refused|failed\.(connect_timeout|connect_refused|unreachable)) ' | paste -sd, -)
	check "kill: no other refusal or failure counter moved${r:+ ($r)}" test -z "$r"
	fig "connect_timeout_ms=$(jq -r '"\(.min_ms)-\(.max_ms)"' <<<"$jh") refused_ms=$(jq -r .max_ms <<<"$jr") unreachable_ms=$(jq -r .max_ms <<<"$ju")"
	wait_idle kill
	fig "idle_ms=$IDLE_MS"
	alive kill
}

# --- the rest: each resource held to its last unit ----------------------------------------
case_nofile() {
	local nofile=96 lim held before at
	proxy_fresh nofile '{}' prlimit --nofile=$nofile:$nofile -- || return
	lim=$(sk budget.fds_limit "$IDLE")
	if [ $((lim % PER)) -ne 0 ]; then
		# A spare descriptor would let a refused connection be accepted and then refused at
		# its outbound socket, or not, as its timing falls: a limit the connections fill
		# exactly makes every refusal the accept loop's.
		nofile=$((nofile + PER - lim % PER))
		proxy_fresh nofile '{}' prlimit --nofile=$nofile:$nofile -- || return
		lim=$(sk budget.fds_limit "$IDLE")
	fi
	held=$((lim / PER))
	note "nofile: RLIMIT_NOFILE $nofile -> budget.fds_limit $lim: $held connections of $PER descriptors"
	hold_start nofile "$held"
	before=$(stats)
	rsts nofile 3
	sleep 0.3 # a round of echo on the held ones after the refusals
	at=$(stats)
	deltas nofile "$before" "$at" budget.fd_refused=3 sessions.refused=3 "$FD_KEY=3"
	check "nofile: the accept loop never met EMFILE, the log has no EMFILE" \
		test "$(sk stack_counters.accept_backoff "$at" | sed 's/missing/0/'),$(grep -c 'Too many open files' "$TMP/twinstack.log")" = "0,0"
	alive nofile
	hold_stop nofile "$held"
	wait_idle nofile
	new_conns nofile 20
	fig "nofile=$nofile fds_limit=$lim held=$held pipes_reclaimed=$(sk splice.pipes_reclaimed "$(stats)")"
}

case_tcp_sessions() {
	local before at
	proxy_fresh tcp_sessions '{budgets: {tcp_sessions: 8, tcp_sessions_elevated: 8, tcp_sessions_critical: 8}}' || return
	hold_start tcp_sessions 8
	before=$(stats)
	rsts tcp_sessions 3
	sleep 0.3
	at=$(stats)
	deltas tcp_sessions "$before" "$at" budget.tcp_refused=3 drops.admission_refused=3 sessions.refused=3
	alive tcp_sessions
	hold_stop tcp_sessions 8
	wait_idle tcp_sessions
	# One at a time: a session holds its slot until both of its ends have closed, after the
	# app has its echo and has moved on, so with 8 slots four apps at a time could meet a
	# full budget (a RST, counted, as designed) while earlier sessions wind down.
	new_conns tcp_sessions 20 1
}

case_udp_sessions() {
	local before after j
	proxy_fresh udp_sessions '{budgets: {udp_sessions: 4}}' || return
	before=$(stats)
	j=$(fx udp --target "$SRV:7000" --flows 4 --extra 3 --timeout-ms 500)
	after=$(stats)
	if jq -e '.first == 4 and .extra == 0 and .again == 4 and .bad == 0' <<<"$j" >/dev/null 2>&1; then
		ok "udp_sessions: 4 flows answered, 3 new ones dropped, the 4 still answered" "$j"
	else
		not_ok "udp_sessions: 4 flows answered, 3 new ones dropped, the 4 still answered" "${j:-no JSON}"
	fi
	deltas udp_sessions "$before" "$after" budget.udp_refused=3 udp.drops.no_session_budget=3
	alive udp_sessions
}

case_nat_entries() {
	local before at
	proxy_fresh nat_entries '{budgets: {nat_entries: 4}}' || return
	# With 4 entries a source may have one handshake under way at a time (nat_entries / 256,
	# at least 1): the held connections are opened one by one.
	hold_start nat_entries 4 4
	before=$(stats)
	rsts nat_entries 3
	sleep 0.3
	at=$(stats)
	deltas nat_entries "$before" "$at" drops.nat_exhausted=3 stack_counters.nat_budget_exhausted=3
	alive nat_entries
	hold_stop nat_entries 4
	wait_idle nat_entries
	# One at a time again, and few: each closed one lingers 300 ms in the table.
	new_conns nat_entries 4 1
}

case_fds() {
	local before at held=$((16 / PER))
	proxy_fresh fds '{budgets: {fds: 16}, relay: {mode: "copy"}}' || return
	hold_start fds "$held"
	before=$(stats)
	rsts fds 3
	sleep 0.3
	at=$(stats)
	deltas fds "$before" "$at" budget.fd_refused=3 sessions.refused=3 "$FD_KEY=3"
	alive fds
	hold_stop fds "$held"
	wait_idle fds
	# One at a time, as in tcp_sessions: a session holds its descriptors until both of its ends
	# have closed, so with 16 of them (8 sessions on the system stack) several apps at a time
	# can meet a full budget (a RST, counted, as designed) while earlier sessions wind down.
	new_conns fds 20 1
}

# in_use_is N: /stats buffers.in_use_bytes is N (else prints it beside the relay's figures).
in_use_is() {
	local doc
	doc=$(stats) || { echo "no /stats"; return 1; }
	[ "$(jq .buffers.in_use_bytes <<<"$doc")" = "$1" ] && { echo "buffers.in_use_bytes $1"; return 0; }
	jq -c --argjson want "$1" '{want: $want, in_use: .buffers.in_use_bytes, up: .relay.bytes_up,
		down: .relay.bytes_down, sessions: .sessions.active, refused: .budget.buffer_refused}' <<<"$doc"
	return 1
}

case_buffer_bytes() {
	local before after j bb head=8192 r pp i
	[ "$STACK" = lwip ] && head=262144
	# The idle proxy's own buffers (the UDP path's, lwIP's) first, from a proxy without limits.
	PREV_CASE=buffer_bytes
	config '{relay: {mode: "copy"}}'
	# shellcheck disable=SC2119 # no wrapper
	proxy_start >/dev/null || { not_ok "buffer_bytes: a proxy to measure the idle buffers" "$(tail -n 2 "$TMP/twinstack.log")"; return; }
	bb=$(($(sk buffers.in_use_bytes "$IDLE") + head))
	proxy_fresh buffer_bytes "{budgets: {buffer_bytes: $bb}, relay: {mode: \"copy\", buffer_bytes: 4096}}" || return
	hold_start buffer_bytes 4
	if [ "$STACK" = system ]; then
		# An app that writes and reads nothing, to the echo server: once the kernel's buffers
		# are full both its relay directions hold their 4 KiB buffer, every byte the budget
		# has. (lwIP's segments fill its larger budget by themselves.)
		spawn_d "$TMP/push.out" "$PY" "$HERE/faults.py" push --target "$SRV:7000" --hold-ms 60000
		pp=$SPAWNED
		# Bounded at 10 s: on a loaded machine filling the kernel's buffers 4 KiB at a time
		# has taken longer than 5 s.
		for ((i = 0; i < 100; i++)); do
			[ "$(stats | jq .buffers.in_use_bytes)" = "$bb" ] && break
			sleep 0.1
		done
		check "buffer_bytes: an app that reads nothing holds both relay buffers ($head bytes)" \
			in_use_is "$bb"
	fi
	before=$(stats)
	# Within 5 s, while the app above still holds both buffers (it is stopped afterwards).
	j=$(inD "$BIN" load connrate --target "$SRV" --ports 7104 --count 16 --duration 6 \
		--concurrency 16 --req 65536 --timeout-ms 5000 2>>"$TMP/connrate.err" | tail -n 1)
	after=$(stats)
	if jq -e '.completed == 16 and .errors == 0' <<<"$j" >/dev/null 2>&1; then
		ok "buffer_bytes: 16 echo transfers of 64 KiB at once, all intact within 5 s" "$(jq -r '"\(.duration_s) s"' <<<"$j")"
	else
		not_ok "buffer_bytes: 16 echo transfers of 64 KiB at once, all intact within 5 s" "${j:-no JSON}"
	fi
	check "buffer_bytes: the budget said no (budget.buffer_refused +$(delta budget.buffer_refused "$before" "$after"))" \
		test "$(delta budget.buffer_refused "$before" "$after")" -gt 0
	r=$(refusals "$before" "$after" | tr ',' '\n' | grep -E '^(sessions\.|drops\.(admission_refused|fd_exhausted|nat_exhausted|half_open) )' | paste -sd, -)
	check "buffer_bytes: no session refused or failed${r:+ ($r)}" test -z "$r"
	alive buffer_bytes
	[ -n "${pp:-}" ] && stop_pid "$pp" 2
	hold_stop buffer_bytes 4
	wait_idle buffer_bytes
	fig "buffer_headroom=$head buffer_refused=$(delta budget.buffer_refused "$before" "$after") buffer_transfers_s=$(jq -r .duration_s <<<"$j")"
	if [ "$STACK" = lwip ]; then
		fig "rx_payload_nomem=$(delta stack_counters.rx_payload_nomem "$before" "$after") ooseq_freed=$(delta stack_counters.ooseq_freed "$before" "$after")"
	fi
}

case_udp_up_queue() {
	local before mid after j u pu t0
	proxy_fresh udp_up_queue '{budgets: {udp_up_queue: 4}}' || return
	before=$(stats)
	fx udp --target "$SRV:7000" --flows 1 --timeout-ms 500 >"$TMP/udp.direct" &
	pu=$!
	j=$(fx burst --target "$S5_UDP:7000" --count 10 --timeout-ms 300)
	mid=$(stats)
	wait "$pu"
	u=$(cat "$TMP/udp.direct")
	if jq -e '.sent == 10 and .answered == 0' <<<"$j" >/dev/null 2>&1; then ok "udp_up_queue: 10 datagrams to a SOCKS5 server that never answers, none answered"
	else not_ok "udp_up_queue: 10 datagrams to a SOCKS5 server that never answers, none answered" "${j:-no JSON}"; fi
	deltas udp_up_queue "$before" "$mid" udp.drops.queue_full=6
	check "udp_up_queue: a UDP flow through the direct outbound is answered meanwhile" jq -e '.first == 1 and .again == 1' <<<"$u"
	# The queued four go when the association times out (connect_ms after it began): polled
	# until both counters reach their figures, for five times connect_ms at most; the deltas
	# below then say whether they went past them.
	t0=$(date +%s%N)
	until after=$(stats) && [ "$(delta udp.drops.assoc_failed "$before" "$after")" -ge 4 ] 2>/dev/null &&
		[ "$(delta udp.assoc_failures "$before" "$after")" -ge 1 ] 2>/dev/null; do
		[ "$(elapsed_ms "$t0")" -lt $((CONNECT_MS * 5)) ] || break
		sleep 0.1
	done
	deltas udp_up_queue "$before" "$after" udp.drops.assoc_failed=4 udp.assoc_failures=1
	alive udp_up_queue
}

# run_case N: bed N's case in the background, its output to $TMP/case.N.out, its own work
# directory, tally, figures and time (the suite's counters live in this shell).
# shellcheck disable=SC2030,SC2031 # the subshell's TMP, counters and figures are its own
run_case() {
	local n=$1
	mkdir -p "$TMP/c$n"
	(
		use_bed "$n"
		TMP=$TMP/c$n PASSED=0 FAILED=0 FIG=() PIDS=()
		t0=$(date +%s%N)
		"case_${BEDS[$n]}"
		note "${BEDS[$n]}: $(($(elapsed_ms "$t0") / 100))00 ms"
		proxy_stop
		for p in "${PIDS[@]}"; do stop_pid "$p" 1; done
		echo "# tally $PASSED $FAILED"
		echo "# fig ${FIG[*]}"
	) >"$TMP/case.$n.out" 2>&1 &
	CASE_PIDS[n]=$!
}

# --- run -------------------------------------------------------------------------------------
# Every case side by side, each on its own proxy (the bounds leave room for the load).
CASE_PIDS=()
for n in "${!BEDS[@]}"; do
	want "${BEDS[$n]}" && run_case "$n"
done
END_S=$((SECONDS + CASE_S))
# shellcheck disable=SC2031 # these are this shell's own (the cases changed their copies)
for n in "${!CASE_PIDS[@]}"; do
	while kill -0 "${CASE_PIDS[$n]}" 2>/dev/null && [ "$SECONDS" -lt "$END_S" ]; do sleep 0.1; done
	kill -KILL "${CASE_PIDS[$n]}" 2>/dev/null # still running: its processes go with cleanup
	wait "${CASE_PIDS[$n]}" 2>/dev/null
	grep -v '^# \(tally\|fig\) ' "$TMP/case.$n.out"
	t=$(awk '/^# tally / { print $3, $4 }' "$TMP/case.$n.out")
	[ -n "$t" ] || { not_ok "${BEDS[$n]}: the case did not finish within $CASE_S s" "$(tail -n 1 "$TMP/case.$n.out")"; continue; }
	PASSED=$((PASSED + ${t% *})) FAILED=$((FAILED + ${t#* }))
	read -ra f <<<"$(sed -n 's/^# fig //p' "$TMP/case.$n.out")"
	FIG+=("${f[@]}")
done
note "figures: stack=$STACK ${FIG[*]}"
stop_pid "$SERVE_PID" 2
note "elapsed $(($(elapsed_ms "$T0") / 1000)) s"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
