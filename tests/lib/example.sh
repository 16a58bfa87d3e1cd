#!/usr/bin/env bash
# example.sh — the installed library as a user gets it: `cmake --install` into a staging prefix,
# examples/embed.c built against it through pkg-config twice (shared, and static with
# libtwinstack.a), each linked with tests/lib/own_symbols.c (its own tcp_new and log_init); each
# build runs a proxy on a TUN the test created and downloads a file through it.
#
#   ns A: client + proxy                                     ns B: server
#  +-----------------------------------------------+       +---------------------------+
#  | curl http://10.201.1.2:8080/file.bin          |       | lo 10.201.1.2/32          |
#  |   |  route 10.201.1.0/24 -> tun                |       | python3 -m http.server    |
#  |   v                                           |       |   :8080, 8 MiB random file|
#  | tun 198.18.0.1/15 (persistent, made by `ip`)  |       |                           |
#  |   |  ^                                        |       |                           |
#  |   v  |  embed --tun-fd-from tun (system stack |       |                           |
#  |      |  for the shared build, lwip static)    |       |                           |
#  |  outbound sockets SO_MARK 1,                  |       | route 198.18.0.0/15 via A |
#  |  fwmark 1 -> table 100: default via B         |       |                           |
#  | veth 10.201.0.1/24 ------------------------------------ veth 10.201.0.2/24         |
#  +-----------------------------------------------+       +---------------------------+
#
# usage: example.sh SOURCE_DIR BUILD_DIR CC [CMAKE]
# Environment: TS_STACK_SHARED / TS_STACK_STATIC pick each build's stack (system / lwip);
# TS_KEEP=1 keeps the work directory (outputs, logs, the staged install).
# Exit: 0 passed, 77 skipped (not root, no TUN or namespaces), 1 failed.
set -uo pipefail

SRC=${1:?usage: example.sh SOURCE_DIR BUILD_DIR CC}
BUILD=${2:?usage: example.sh SOURCE_DIR BUILD_DIR CC}
CC=${3:?usage: example.sh SOURCE_DIR BUILD_DIR CC}
CMAKE=${4:-cmake}
unset DESTDIR # the staging prefix is the whole destination

if [ "$(id -u)" -ne 0 ]; then echo "# SKIP: needs root (network namespaces, TUN)"; exit 77; fi
if [ ! -c /dev/net/tun ]; then echo "# SKIP: no /dev/net/tun"; exit 77; fi
for t in ip curl jq pkg-config python3 sha256sum ss; do
	command -v "$t" >/dev/null || { echo "not ok - prerequisites: $t missing"; exit 1; }
done

TOK=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
NS_A=tslA-$TOK NS_B=tslB-$TOK V_A=tsla$TOK V_B=tslb$TOK TUN=tslt$TOK
A4=10.201.0.1 B4=10.201.0.2 SRV4=10.201.1.2 GW4=198.18.0.1 PORT=8080
TMP=$(mktemp -d "${TMPDIR:-/tmp}/twinstack-lib.XXXXXX")
PIDS=()
FAILED=0

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local pid
	trap - EXIT
	for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
	ip netns del "$NS_A" 2>/dev/null
	ip netns del "$NS_B" 2>/dev/null
	if [ -n "${TS_KEEP:-}" ]; then echo "# kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ok() { echo "ok - $1${2:+ ($2)}"; }
not_ok() { FAILED=1; echo "not ok - $1: $2"; }
inA() { ip netns exec "$NS_A" "$@"; }

# --- install and build -----------------------------------------------------------------------
STAGE=$TMP/stage
"$CMAKE" --install "$BUILD" --prefix "$STAGE" >"$TMP/install.log" 2>&1 ||
	{ not_ok install "$(tail -n 3 "$TMP/install.log")"; exit 1; }
pc=$(find "$STAGE" -name twinstack.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || { not_ok install "no twinstack.pc under $STAGE"; exit 1; }
export PKG_CONFIG_PATH=${pc%/*}
libdir=$(pkg-config --variable=libdir twinstack)
ok install "$(cd "$STAGE" && find . -type f -o -type l | sort | tr '\n' ' ')"

CFLAGS=(-Wall -Wextra -Werror -O2)
# shared: what `pkg-config --libs` says, the staged libdir as the run path.
# shellcheck disable=SC2046
"$CC" "${CFLAGS[@]}" -o "$TMP/embed-shared" "$SRC/examples/embed.c" "$SRC/tests/lib/own_symbols.c" \
	$(pkg-config --cflags --libs twinstack) -Wl,-rpath,"$libdir" 2>"$TMP/cc.log" ||
	{ not_ok "build shared" "$(head -n 5 "$TMP/cc.log")"; exit 1; }
# static: `pkg-config --static --libs`, with libtwinstack.a in place of the .so beside it.
static_libs=$(pkg-config --static --libs twinstack)
static_libs=${static_libs/-ltwinstack/-l:libtwinstack.a}
# shellcheck disable=SC2046,SC2086
"$CC" "${CFLAGS[@]}" -o "$TMP/embed-static" "$SRC/examples/embed.c" "$SRC/tests/lib/own_symbols.c" \
	$(pkg-config --cflags twinstack) $static_libs 2>"$TMP/cc.log" ||
	{ not_ok "build static" "$(head -n 5 "$TMP/cc.log")"; exit 1; }
if readelf -d "$TMP/embed-static" | grep -q 'libtwinstack'; then
	not_ok "build static" "embed-static still needs libtwinstack.so"
	exit 1
fi
readelf -d "$TMP/embed-shared" | grep -q 'NEEDED.*\[libtwinstack\.so\.1\]' ||
	{ not_ok "build shared" "embed-shared does not need libtwinstack.so.1"; exit 1; }
ok build "shared and static, each with its own tcp_new and log_init"

# --- topology --------------------------------------------------------------------------------
topology() {
	local ns
	for ns in "$NS_A" "$NS_B"; do
		ip netns add "$ns" && ip -n "$ns" link set lo up || return 1
	done
	ip link add "$V_A" netns "$NS_A" type veth peer name "$V_B" netns "$NS_B" || return 1
	ip -n "$NS_A" addr add "$A4/24" dev "$V_A" && ip -n "$NS_A" link set "$V_A" up &&
		ip -n "$NS_B" addr add "$B4/24" dev "$V_B" && ip -n "$NS_B" link set "$V_B" up &&
		ip -n "$NS_B" addr add "$SRV4/32" dev lo &&
		ip -n "$NS_B" route add 198.18.0.0/15 via "$A4" || return 1
	# The proxy's outbound sockets (mark 1) leave over the veth, never into the TUN.
	ip -n "$NS_A" rule add fwmark 1 lookup 100 pref 100 &&
		ip -n "$NS_A" route add default via "$B4" dev "$V_A" table 100 || return 1
	# The TUN the example attaches to: made and configured here, as a VPN service would.
	ip -n "$NS_A" tuntap add dev "$TUN" mode tun && ip -n "$NS_A" addr add "$GW4/15" dev "$TUN" &&
		ip -n "$NS_A" link set "$TUN" up &&
		ip -n "$NS_A" route add 10.201.1.0/24 dev "$TUN" src "$GW4"
}
topology 2>"$TMP/topology.log" || { not_ok topology "$(tail -n 2 "$TMP/topology.log")"; exit 1; }

mkdir -p "$TMP/www"
head -c $((8 * 1024 * 1024)) /dev/urandom >"$TMP/www/file.bin"
SHA=$(sha256sum "$TMP/www/file.bin" | cut -d' ' -f1)
ip netns exec "$NS_B" python3 -m http.server --bind "$SRV4" --directory "$TMP/www" "$PORT" \
	</dev/null >"$TMP/httpd.log" 2>&1 &
PIDS+=($!)
for ((i = 0; i < 50; i++)); do
	ip netns exec "$NS_B" ss -Hltn "sport = :$PORT" | grep -q . && break
	sleep 0.1
done
ip netns exec "$NS_B" ss -Hltn "sport = :$PORT" | grep -q . || { not_ok server "no listener on :$PORT"; exit 1; }

# --- run -------------------------------------------------------------------------------------
# run NAME BINARY STACK: start the example on the TUN, download through it, SIGTERM, stats.
run() {
	local name=$1 bin=$2 stack=$3 out=$TMP/$1.out err=$TMP/$1.err pid i rc sha total json
	json=$(printf '{ "stack": "%s", "tun": { "address": "%s/15" },
		"outbounds": [ { "tag": "direct", "type": "direct", "routing_mark": 1 } ],
		"log": { "level": "info" } }' "$stack" "$GW4")
	# `ip netns exec` execs the example, so $! is the example itself.
	ip netns exec "$NS_A" "$bin" --tun-fd-from "$TUN" "$json" </dev/null >"$out" 2>"$err" &
	pid=$!
	PIDS+=("$pid")
	for ((i = 0; i < 50; i++)); do
		grep -q '^ready' "$out" && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if ! grep -q '^ready' "$out"; then
		not_ok "$name start" "no ready line within 5 s: $(tail -n 3 "$err" | tr '\n' ' ')"
		return
	fi
	grep -q '^own_symbols: tcp_new and log_init are the program' "$err" ||
		not_ok "$name own symbols" "the program's tcp_new/log_init were not its own"

	if inA curl -sS --fail --max-time 5 -o "$TMP/$name.bin" "http://$SRV4:$PORT/file.bin" 2>"$TMP/curl.err"; then
		sha=$(sha256sum "$TMP/$name.bin" | cut -d' ' -f1)
		if [ "$sha" = "$SHA" ]; then ok "$name download" "8 MiB, sha256 matches"
		else not_ok "$name download" "sha256 $sha, want $SHA"; fi
	else
		not_ok "$name download" "curl: $(head -c 200 "$TMP/curl.err")"
	fi

	kill -TERM "$pid"
	for ((i = 0; i < 30; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid"
		wait "$pid" 2>/dev/null
		not_ok "$name stop" "still running 3 s after SIGTERM"
		return
	fi
	wait "$pid"
	rc=$?
	[ "$rc" -eq 0 ] || { not_ok "$name stop" "exit $rc: $(tail -n 3 "$err" | tr '\n' ' ')"; return; }
	# The stats document follows the ready line: this stack, the download among its sessions.
	total=$(awk 'stats; /^ready/ { stats = 1 }' "$out" | jq -r --arg s "$stack" \
		'if .stack == $s then .sessions.total else "stack \(.stack)" end' 2>&1)
	if [[ "$total" =~ ^[0-9]+$ ]] && [ "$total" -ge 1 ]; then
		ok "$name stop" "exit 0 on SIGTERM, stats: stack $stack, sessions.total $total"
	else
		not_ok "$name stop" "stats after exit: ${total:0:200}"
	fi
}

t0=$(date +%s%N)
run shared "$TMP/embed-shared" "${TS_STACK_SHARED:-system}"
run static "$TMP/embed-static" "${TS_STACK_STATIC:-lwip}"
echo "# runs took $((($(date +%s%N) - t0) / 1000000)) ms"
exit "$FAILED"
