# shellcheck shell=bash
# lib.sh — helpers of the namespace suites (sourced by each suite first, not run on its own):
# the options every suite shares, TAP-like reporting, namespaces and processes created by the
# suite and destroyed by cleanup(), bounded waits. Every name a suite creates carries $TOK,
# unique per run.
#
# Globals it sets: STACK, BIN, KEEP_TMP, VERBOSE (suite_args); TOK, TMP, PY (suite_begin).
# A suite that makes TOK and TMP itself sets them before anything here uses them.

PASSED=0
FAILED=0
SKIPPED=0
PIDS=()        # every background process the suite started (killed by cleanup)
NETNS=()       # every namespace the suite created (deleted by cleanup)

# --- the command line ---------------------------------------------------------------------

# suite_usage: the script's usage lines, its header from "# usage:" to "# Output:".
suite_usage() { sed -n '/^# usage:/,/^# Output:/p' "$0" | sed 's/^# \{0,1\}//'; }

# suite_args NAME [OPTION VAR | OPTION VAR=VALUE]... -- ARGS...: parses a suite's command line.
# Every suite has --bin PATH (BIN, default build/twinstack of this checkout, made absolute),
# --keep (KEEP_TMP=1: cleanup keeps the work directory), -v/--verbose (VERBOSE=1), -h/--help
# (the usage lines, exit 0) and, unless SUITE_NO_STACK=1, --stack system|lwip (STACK, default
# system). Each OPTION VAR pair adds one of the suite's own: "OPTION VAR" takes a value into
# VAR, "OPTION VAR=VALUE" is a flag that sets VAR to VALUE; the suite sets their defaults
# first. A value may also follow as OPTION=VALUE. An unknown argument, a missing value or
# another stack exits 2 with a line that names NAME.sh.
suite_args() {
	local name=$1.sh opt val n
	local -A takes=() flags=() # keyed by "x" and the option, so that '' is a key too
	shift
	while [ $# -gt 0 ] && [ "$1" != -- ]; do
		case $2 in *=*) flags[x$1]=$2 ;; *) takes[x$1]=$2 ;; esac
		shift 2
	done
	shift
	# shellcheck disable=SC2034 # STACK is read by the suites
	[ "${SUITE_NO_STACK:-0}" -eq 1 ] || { STACK=system; takes[x--stack]=STACK; }
	BIN=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/twinstack
	KEEP_TMP=0
	VERBOSE=0
	takes[x--bin]=BIN flags[x--keep]=KEEP_TMP=1 flags[x-v]=VERBOSE=1 flags[x--verbose]=VERBOSE=1
	while [ $# -gt 0 ]; do
		case $1 in
		-h | --help) suite_usage; exit 0 ;;
		--*=*) opt=${1%%=*} val=${1#*=} n=1 ;;
		*) opt=$1 val=${2-} n=2 ;;
		esac
		if [ -n "${flags[x$1]:-}" ]; then
			printf -v "${flags[x$1]%%=*}" %s "${flags[x$1]#*=}"
			shift
			continue
		fi
		if [ -z "${takes[x$opt]:-}" ]; then
			echo "$name: unknown argument '$1'" >&2
			suite_usage >&2
			exit 2
		fi
		if [ "$n" -eq 2 ] && [ -z "$val" ]; then echo "$name: $opt needs a value" >&2; exit 2; fi
		printf -v "${takes[x$opt]}" %s "$val"
		shift "$n"
	done
	if [ -n "${takes[x--stack]:-}" ]; then
		case $STACK in system | lwip) ;; *) echo "$name: --stack is system or lwip" >&2; exit 2 ;; esac
	fi
	case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
}

# --- reporting ---------------------------------------------------------------------------

ok() { PASSED=$((PASSED + 1)); echo "ok - $1${2:+ ($2)}"; }
not_ok() { FAILED=$((FAILED + 1)); echo "not ok - $1: $2"; }
skip() { SKIPPED=$((SKIPPED + 1)); echo "ok - $1 # SKIP $2"; }
note() { echo "# $*"; }
vnote() { [ "$VERBOSE" -eq 1 ] && echo "# $*"; return 0; }

# check NAME CMD...: ok when CMD exits 0; the last line of its output is the detail/reason.
# CMD runs in this shell (not a subshell), so it may set globals and start processes.
check() {
	local name=$1 out rc
	shift
	"$@" >"$TMP/check.out" 2>&1
	rc=$?
	out=$(tail -n 1 "$TMP/check.out")
	if [ "$rc" -eq 0 ]; then ok "$name" "$out"; else not_ok "$name" "${out:-exit $rc}"; fi
	return "$rc"
}

# --- namespaces and processes ------------------------------------------------------------

# netns_add NAME: creates a namespace with loopback up and rp_filter off.
netns_add() {
	ip netns add "$1" || return 1
	NETNS+=("$1")
	ip -n "$1" link set lo up
	ip netns exec "$1" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
		net.ipv4.conf.lo.rp_filter=0 >/dev/null
}

# spawn NS LOG CMD...: runs CMD in namespace NS in the background, stdout+stderr to LOG.
# `ip netns exec` execs CMD, so $! (kept in SPAWNED and PIDS) is CMD's own pid.
spawn() {
	local ns=$1 log=$2
	shift 2
	ip netns exec "$ns" "$@" </dev/null >"$log" 2>&1 &
	SPAWNED=$!
	PIDS+=("$SPAWNED")
}

# stop_pid PID [SECONDS]: TERM, then KILL after SECONDS (default 2); reaps it.
stop_pid() {
	local pid=$1 limit=${2:-2} i
	kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
	kill -TERM "$pid" 2>/dev/null
	for ((i = 0; i < limit * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	return 0
}

cleanup() {
	local pid ns
	trap - EXIT INT TERM
	for pid in "${PIDS[@]}"; do
		kill -TERM "$pid" 2>/dev/null
	done
	sleep 0.2
	for pid in "${PIDS[@]}"; do
		kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	# Anything still inside our namespaces was started by this suite (children of the above).
	for ns in "${NETNS[@]}"; do
		for pid in $(ip netns pids "$ns" 2>/dev/null); do
			kill -KILL "$pid" 2>/dev/null
		done
	done
	for ns in "${NETNS[@]}"; do
		ip netns del "$ns" 2>/dev/null
	done
	if [ -n "${TMP:-}" ] && [ -d "$TMP" ]; then
		if [ "${KEEP_TMP:-0}" -eq 1 ]; then echo "# work directory kept: $TMP"; else rm -rf "$TMP"; fi
	fi
}

# --- the proxy's /stats (a suite that uses these defines inD and P_STATS) ------------------

# stats: the document, asked up to three times (a busy machine may miss one 2 s window).
stats() {
	local out i
	for i in 1 2 3; do
		out=$(inD curl -s --max-time 2 "http://127.0.0.1:$P_STATS/stats") && [ -n "$out" ] &&
			{ echo "$out"; return 0; }
		sleep 0.2
	done
	return 1
}
# stat_key KEY DOC: a dotted key's value, "missing" when the document has none.
stat_key() { jq -r ".$1 // \"missing\"" <<<"$2" 2>/dev/null || echo missing; }
# fp_kernel_entries NS TUN: how many entries the kernel holds in the hash maps of the system
# stack's in-kernel fast path on TUN (in namespace NS): the maps of the program on TUN's tc
# egress and of every program that shares a map with it (the uplinks' reply program, attached
# with tcx, which tc does not list); an accepted connection has two, a UDP flow one per
# direction. -1 when they cannot be read (no bpftool, no program on TUN: the lwIP stack, or a
# fast path that is off).
fp_kernel_entries() {
	local ids own maps m c n=0
	command -v bpftool >/dev/null 2>&1 || { echo -1; return; }
	ids=$(ip netns exec "$1" tc -j filter show dev "$2" egress 2>/dev/null |
		jq -r '.[]? | .options.prog.id // empty' 2>/dev/null | sort -u)
	[ -n "$ids" ] || { echo -1; return; }
	own=$(for m in $ids; do bpftool prog show id "$m" -j 2>/dev/null | jq -c '.map_ids // []'; done |
		jq -sc 'add // []')
	maps=$(bpftool prog show -j 2>/dev/null | jq -r --argjson own "$own" '
		[.[] | select(((.map_ids // []) - ((.map_ids // []) - $own)) | length > 0) | .map_ids[]]
		| unique | .[]')
	for m in $maps; do
		[ "$(bpftool map show id "$m" -j 2>/dev/null | jq -r '.type')" = hash ] || continue
		c=$(bpftool map dump id "$m" -j 2>/dev/null | jq 'length' 2>/dev/null)
		case $c in '' | *[!0-9]*) echo -1; return ;; esac
		n=$((n + c))
	done
	echo "$n"
}
# delta KEY BEFORE AFTER: how much KEY grew, or "invalid" (so that a check fails, never skips).
delta() {
	local a b
	a=$(stat_key "$1" "$2") b=$(stat_key "$1" "$3")
	case "$a$b" in '' | *[!0-9]*) echo invalid ;; *) echo $((b - a)) ;; esac
}

# --- bounded waits ------------------------------------------------------------------------

# wait_listen NS tcp|udp PORT [TRIES]: until something in NS listens on PORT (0.1 s a try).
wait_listen() {
	local ns=$1 proto=$2 port=$3 tries=${4:-50} i flag=-ltnH
	[ "$proto" = udp ] && flag=-lunH
	for ((i = 0; i < tries; i++)); do
		if ip netns exec "$ns" ss "$flag" "sport = :$port" 2>/dev/null | grep -q .; then
			return 0
		fi
		sleep 0.1
	done
	return 1
}

# wait_until TRIES INTERVAL CMD...: runs CMD until it succeeds, at most TRIES times.
wait_until() {
	local tries=$1 interval=$2 i
	shift 2
	for ((i = 0; i < tries; i++)); do
		"$@" && return 0
		sleep "$interval"
	done
	return 1
}

# suite_begin NAME TOOL...: the start every suite shares: skip (exit 77) without root or
# /dev/net/tun, fail without one of the tools or python3 (PY), then TOK (the run's token),
# TMP (twinstack-NAME.XXXXXX) and the traps (cleanup on every exit).
suite_begin() {
	local name=$1 t
	shift
	if [ "$(id -u)" -ne 0 ]; then echo "# SKIP: needs root"; exit 77; fi
	if [ ! -c /dev/net/tun ]; then echo "# SKIP: no /dev/net/tun"; exit 77; fi
	# Debian's interpreter, not a version manager's shim (a shell script per start, slow).
	PY=/usr/bin/python3
	[ -x "$PY" ] || PY=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null || command -v python3)
	for t in "$@" "$PY"; do
		command -v "$t" >/dev/null 2>&1 || { echo "not ok - prerequisites: no $t"; echo "0 passed, 1 failed"; exit 1; }
	done
	# shellcheck disable=SC2034 # TOK is read by the suites
	TOK=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
	TMP=$(mktemp -d "${TMPDIR:-/tmp}/twinstack-$name.XXXXXX")
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

# elapsed_ms START_NS: milliseconds since START_NS (from `date +%s%N`).
elapsed_ms() { echo $((($(date +%s%N) - $1) / 1000000)); }

# --- the proxy under test (a suite that uses these defines NS_D, BIN, TMP, routes_tun) -------

# ts_start: twinstack run with $TMP/cfg.json in NS_D; waits for its ready byte (10 s at most),
# then routes into the TUN and its /stats. Sets TS_PID.
ts_start() {
	local i
	: >"$TMP/ready"
	ip netns exec "$NS_D" "$BIN" run --config "$TMP/cfg.json" --ready-fd 3 \
		3>"$TMP/ready" </dev/null >"$TMP/twinstack.log" 2>&1 &
	TS_PID=$!
	PIDS+=("$TS_PID")
	for ((i = 0; i < 100; i++)); do
		[ -s "$TMP/ready" ] && break
		kill -0 "$TS_PID" 2>/dev/null || break
		sleep 0.1
	done
	if [ ! -s "$TMP/ready" ]; then
		echo "no ready byte: $(tail -n 3 "$TMP/twinstack.log" | tr '\n' ' ')"
		return 1
	fi
	routes_tun || { echo "routes into $TUN failed"; return 1; }
	wait_until 50 0.1 stats >/dev/null || { echo "no /stats"; return 1; }
	echo "pid $TS_PID"
}

# ts_sigterm [SECONDS]: SIGTERM to TS_PID; ok if it exits 0 within SECONDS (default 2.5; more
# where many cases run side by side under a sanitizer that checks for leaks at exit).
ts_sigterm() {
	local limit=${1:-2.5} i n
	n=$(awk -v s="$limit" 'BEGIN { printf "%d", s * 20 }')
	kill -TERM "$TS_PID" 2>/dev/null || { echo "already gone"; return 1; }
	for ((i = 0; i < n; i++)); do
		kill -0 "$TS_PID" 2>/dev/null || break
		sleep 0.05
	done
	if kill -0 "$TS_PID" 2>/dev/null; then echo "still running after $limit s"; return 1; fi
	wait "$TS_PID"
	i=$?
	echo "exit $i"
	[ "$i" -eq 0 ]
}
