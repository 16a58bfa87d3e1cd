#!/usr/bin/env bash
# load.sh — `twinstack load` against its own `serve`, on loopback only (127.0.0.1 and ::1).
#
#   client modes ──TCP 127.0.0.1:P1,P2 / UDP :P3──▶ twinstack load serve
#
# Each mode must exit 0 and print one JSON object with sane figures: connrate > 100 conn/s,
# latency 0 < p50 <= p99 <= p99.9, hold of 200 prints "HELD 200" then held=200, udp loss
# small, udpflows answers all 200 flows; IPv6 is checked once. Bad usage must exit 2.
#
# The checked payloads and the error split: connrate --count stops at exactly N completed
# connections of 4 KiB each way, every echoed byte checked; hold says every connection echoed
# its pattern. Against servers that misbehave on purpose (a python3 server here: one port
# echoes every byte plus one, one resets each connection, one never answers) each failure
# lands in its own error_causes key (mismatch, reset, timeout), a closed port in refused and a
# source address this host does not have in addrnotavail (bind fails: nothing is sent), and
# hold reports the corrupted echo as mismatch with no connection echoed.
#
#   udp --socks5 ──TCP control, UDP ASSOCIATE──▶ danted 127.0.0.1:P4 ──UDP──▶ serve :P3
#
# With root and Debian's dante-server (/usr/sbin/danted), udp --socks5 goes through a dante
# started here (no authentication, foreground): the echoes must come back with the relay's
# header (received, no loss to speak of, the relay endpoint dante named), and a server that is
# not there must give {"error":...} and exit 1. Without dante that part is skipped (said so).
# The servers are killed on any exit (trap). Takes about 20-30 s (a python3 start per check).
#
# usage: load.sh TWINSTACK_BINARY
set -uo pipefail

bin=${1:?usage: load.sh TWINSTACK_BINARY}
work=$(mktemp -d)
serve_pid=
dante_pid=
bad_pid=
cleanup() {
	[ -n "$serve_pid" ] && kill -TERM "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
	[ -n "$dante_pid" ] && kill -TERM "$dante_pid" 2>/dev/null && wait "$dante_pid" 2>/dev/null
	[ -n "$bad_pid" ] && kill -TERM "$bad_pid" 2>/dev/null && wait "$bad_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }

# start_serve ADDR: serve on three random ports of ADDR; sets P1 P2 P3 and serve_pid.
start_serve() {
	for _ in 1 2 3 4 5; do
		local base=$((20000 + RANDOM % 12000)) # below ip_local_port_range: no client holds it
		P1=$base P2=$((base + 1)) P3=$((base + 2))
		"$bin" load serve --bind "$1" --tcp-ports "$P1,$P2" --udp-port "$P3" --duration 60 \
			>"$work/serve.out" 2>"$work/serve.err" &
		serve_pid=$!
		sleep 0.3
		kill -0 "$serve_pid" 2>/dev/null && return 0
		wait "$serve_pid" 2>/dev/null
		serve_pid=
	done
	echo "cannot start load serve on $1: $(cat "$work/serve.err")"
	exit 1
}

stop_serve() {
	kill -TERM "$serve_pid" && wait "$serve_pid"
	local rc=$?
	serve_pid=
	return $rc
}

# check NAME PYTHON_EXPR ARGS...: run `load ARGS`, expect exit 0 (WANT_RC, when set) and the
# last stdout line to be JSON for which PYTHON_EXPR (over the dict j) holds.
check() {
	local name=$1 expr=$2
	shift 2
	"$bin" load "$@" >"$work/out" 2>"$work/err"
	local rc=$?
	local json
	json=$(tail -n 1 "$work/out")
	if [ $rc -ne "${WANT_RC:-0}" ]; then
		bad "$name: exit $rc: $(cat "$work/err")"
	elif python3 -c "import json,sys; j=json.loads(sys.argv[1]); sys.exit(0 if ($expr) else 1)" \
		"$json"; then
		ok "$name: $json"
	else
		bad "$name: $json does not satisfy: $expr"
	fi
}

start_serve 127.0.0.1
check connrate 'j["conn_per_s"] > 100 and j["completed"] > 0 and j["p50_connect_us"] > 0' \
	connrate --target 127.0.0.1 --ports "$P1,$P2" --duration 2.5 --concurrency 16
check latency 'j["samples"] > 100 and 0 < j["latency_p50_us"] <= j["latency_p99_us"] <= j["latency_p999_us"]' \
	latency --target "127.0.0.1:$P1" --duration 1.5 --size 64
check hold 'j["held"] == 200 and j["failed"] == 0 and j["echo_errors"] == 0' \
	hold --target "127.0.0.1:$P2" --conns 200 --duration 1.5 --interval-ms 300
if [ "$(head -n 1 "$work/out")" = "HELD 200" ]; then ok "hold: HELD line first"
else bad "hold: first line '$(head -n 1 "$work/out")', want 'HELD 200'"; fi
# 3 rounds (0, 400, 800 ms) of 1000 bytes on each of 50 connections, every byte checked.
check hold_verified 'j["echoed"] == 50 and j["mismatch"] == 0 and j["echo_errors"] == 0 and j["bytes_verified"] == 50 * 1000 * 3 and j["alive"] == 50' \
	hold --target "127.0.0.1:$P1" --conns 50 --duration 1 --interval-ms 400 --size 1000
CAUSES='("addrnotavail", "reset", "refused", "timeout", "mismatch", "other")'
check connrate_count "j['completed'] == 2000 and j['attempts'] == 2000 and j['errors'] == 0 and j['timeouts'] == 0 and all(j['error_causes'][k] == 0 for k in $CAUSES)" \
	connrate --target 127.0.0.1 --ports "$P1,$P2" --duration 20 --concurrency 16 --req 4096 \
	--count 2000
# only_cause KEY: every attempt failed (but those still under way at the end: at most the
# concurrency, 4), all of them for KEY, and errors is the causes' sum.
only_cause() {
	echo "j['completed'] == 0 and j['errors'] > 0 and 0 <= j['attempts'] - j['errors'] <= 4 and j['error_causes']['$1'] == j['errors'] and sum(j['error_causes'][k] for k in $CAUSES) == j['errors']"
}
WANT_RC=1 check connrate_refused "$(only_cause refused)" \
	connrate --target 127.0.0.1 --ports "$P3" --duration 0.5 --concurrency 2
WANT_RC=1 check connrate_addrnotavail "$(only_cause addrnotavail)" \
	connrate --target 127.0.0.1 --ports "$P1" --duration 0.3 --concurrency 2 --source 192.0.2.1
check udp 'j["received"] > 1000 and j["loss_pct"] < 1 and j["pps"] > 0' \
	udp --target "127.0.0.1:$P3" --duration 1.5 --size 64
check udp_paced 'j["sent"] >= 4900 and j["loss_pct"] < 1 and 4000 < j["pps"] < 6000' \
	udp --target "127.0.0.1:$P3" --duration 1 --size 1400 --rate 5000
check udpflows 'j["flows"] == 200 and j["answered"] == 200' \
	udpflows --target "127.0.0.1:$P3" --flows 200

# start_dante: danted in the foreground on 127.0.0.1:P4 (P4 next to serve's ports); 1 if it
# cannot run here.
start_dante() {
	[ "$(id -u)" -eq 0 ] && [ -x /usr/sbin/danted ] || return 1
	P4=$((P3 + 1))
	cat >"$work/danted.conf" <<-EOF
		logoutput: stderr
		internal: 127.0.0.1 port = $P4
		external: 127.0.0.1
		clientmethod: none
		socksmethod: none
		user.privileged: root
		user.unprivileged: nobody
		client pass { from: 0.0.0.0/0 to: 0.0.0.0/0 }
		socks pass { from: 0.0.0.0/0 to: 0.0.0.0/0 command: connect udpassociate udpreply }
	EOF
	/usr/sbin/danted -f "$work/danted.conf" -p "$work/danted.pid" >"$work/danted.log" 2>&1 &
	dante_pid=$!
	for _ in $(seq 50); do
		ss -ltnH "sport = :$P4" | grep -q . && return 0
		kill -0 "$dante_pid" 2>/dev/null || break
		sleep 0.1
	done
	echo "danted did not listen on 127.0.0.1:$P4: $(cat "$work/danted.log")"
	return 2
}
start_dante
case $? in
0)
	relay_ok="j['socks5_relay'].startswith('127.0.0.1:') and j['socks5_relay'] != '127.0.0.1:$P3'"
	check udp_socks5 "j['received'] > 1000 and j['loss_pct'] < 1 and j['bad'] == 0 and $relay_ok" \
		udp --target "127.0.0.1:$P3" --duration 1.5 --size 64 --socks5 "127.0.0.1:$P4"
	check udp_socks5_1400 "j['received'] > 100 and j['loss_pct'] < 1 and j['size'] == 1400" \
		udp --target "127.0.0.1:$P3" --duration 1 --size 1400 --socks5 "127.0.0.1:$P4"
	kill -TERM "$dante_pid" && wait "$dante_pid" 2>/dev/null
	dante_pid=
	"$bin" load udp --target "127.0.0.1:$P3" --duration 1 --socks5 "127.0.0.1:$P4" \
		--timeout-ms 500 >"$work/out" 2>/dev/null
	rc=$?
	if [ $rc -eq 1 ] && grep -q '"error"' "$work/out"; then
		ok "udp_socks5 without a server: exit 1, $(cat "$work/out")"
	else
		bad "udp_socks5 without a server: exit $rc, $(cat "$work/out")"
	fi
	;;
1) echo "skip udp --socks5: needs root and /usr/sbin/danted (dante-server)" ;;
*) bad "udp --socks5: dante did not start" ;;
esac
if stop_serve && python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if j["served_conns"] > 200 and j["udp_datagrams"] > 1000 else 1)' "$work/serve.out"; then
	ok "serve: $(cat "$work/serve.out")"
else
	bad "serve: exit or JSON: $(cat "$work/serve.out")"
fi

# bad_servers: the python3 server of the misbehaving ports Q1 (echo + 1), Q2 (reset),
# Q3 (silent), next to the serve ports; sets bad_pid.
bad_servers() {
	Q1=$((P3 + 2)) Q2=$((P3 + 3)) Q3=$((P3 + 4))
	python3 - "$Q1" "$Q2" "$Q3" >"$work/bad.log" 2>&1 <<-'EOF' &
		import selectors, socket, struct, sys, time
		sel, kind, held = selectors.DefaultSelector(), {}, []
		for k, p in zip(("plus1", "reset", "silent"), sys.argv[1:4]):
		    s = socket.socket()
		    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
		    s.bind(("127.0.0.1", int(p)))
		    s.listen(512)
		    sel.register(s, selectors.EVENT_READ, ("listen", k))
		end = time.monotonic() + 30
		while time.monotonic() < end:
		    for key, _ in sel.select(0.2):
		        what, k = key.data
		        if what == "listen":
		            try:
		                c, _ = key.fileobj.accept()
		            except OSError:
		                continue
		            if k == "reset":
		                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
		                c.close()
		            elif k == "silent":
		                held.append(c)
		            else:
		                sel.register(c, selectors.EVENT_READ, ("conn", k))
		            continue
		        try:  # a client that gave up resets: that connection ends, the server goes on
		            b = key.fileobj.recv(65536)
		            if b:
		                key.fileobj.sendall(bytes((x + 1) & 255 for x in b))
		        except OSError:
		            b = b""
		        if not b:
		            sel.unregister(key.fileobj)
		            key.fileobj.close()
	EOF
	bad_pid=$!
	for _ in $(seq 50); do
		ss -ltnH "sport = :$Q3" | grep -q . && return 0
		sleep 0.1
	done
	return 1
}
if bad_servers; then
	WANT_RC=1 check connrate_mismatch "$(only_cause mismatch)" \
		connrate --target 127.0.0.1 --ports "$Q1" --duration 0.5 --concurrency 4 --req 256
	WANT_RC=1 check connrate_reset "$(only_cause reset)" \
		connrate --target 127.0.0.1 --ports "$Q2" --duration 0.5 --concurrency 4
	WANT_RC=1 check connrate_timeout "$(only_cause timeout) and j['timeouts'] == j['errors']" \
		connrate --target 127.0.0.1 --ports "$Q3" --duration 1 --concurrency 4 --timeout-ms 300
	check hold_mismatch 'j["held"] == 5 and j["mismatch"] > 0 and j["echoed"] == 0 and j["echo_errors"] >= j["mismatch"]' \
		hold --target "127.0.0.1:$Q1" --conns 5 --duration 0.6 --interval-ms 200 --size 100
else
	bad "misbehaving servers did not start: $(cat "$work/bad.log")"
fi
[ -n "$bad_pid" ] && kill "$bad_pid" 2>/dev/null && wait "$bad_pid" 2>/dev/null
bad_pid=

start_serve ::1
check latency6 '0 < j["latency_p50_us"] <= j["latency_p99_us"]' \
	latency --target "[::1]:$P1" --duration 0.5
check udpflows6 'j["answered"] == 50' udpflows --target "[::1]:$P3" --flows 50
stop_serve

for args in "" "bogus" "latency --target 127.0.0.1 --duration 1" \
	"hold --target 127.0.0.1:9 --duration 1" "udp --target 127.0.0.1:9 --duration 1 --size 4" \
	"connrate --target ::1 --ports 9 --duration 1 --source 127.0.0.1" \
	"udpflows --target 127.0.0.1:9 --flows 1 --socks5 127.0.0.1:1080" \
	"udp --target 127.0.0.1:9 --duration 1 --socks5 127.0.0.1" \
	"hold --target 127.0.0.1:9 --conns 1 --duration 1 --count 5" \
	"connrate --target 127.0.0.1 --ports 9 --duration 1 --count x"; do
	# shellcheck disable=SC2086
	"$bin" load $args >/dev/null 2>&1
	rc=$?
	if [ $rc -eq 2 ]; then ok "usage '$args' exits 2"; else bad "usage '$args' exits $rc"; fi
done

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
