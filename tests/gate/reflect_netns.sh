#!/usr/bin/env bash
# reflect_netns.sh — `twinstack reflect` end to end: iperf3 through the address-swapping
# reflector in a private network namespace, IPv4 and IPv6, then the exit code and counters.
#
#   ns tsrefl-PID
#   iperf3 -c 198.18.1.1 -B 198.18.0.1          iperf3 -s (listening on 198.18.0.1:5201)
#        |  198.18.0.1:c -> 198.18.1.1:5201           ^  198.18.1.1:c -> 198.18.0.1:5201
#        v                                            |
#   tun (198.18.0.1/15, fd00:18::1/64) --read--> twinstack reflect --write (addresses swapped)-->
#
# Every payload crosses the TUN once per direction. The kernel drops IPv4 packets with a bad
# header checksum and TCP segments with a bad checksum, so a transfer that completes proves the
# swap keeps both valid.
#
# usage: reflect_netns.sh TWINSTACK_BINARY [SECONDS]   (root; exit 77 = skipped)
set -uo pipefail

bin=${1:?usage: reflect_netns.sh TWINSTACK_BINARY [SECONDS]}
secs=${2:-3}
[ "$(id -u)" = 0 ] || { echo "reflect_netns: needs root: skipped"; exit 77; }
[ -c /dev/net/tun ] || { echo "reflect_netns: no /dev/net/tun: skipped"; exit 77; }
command -v iperf3 >/dev/null || { echo "reflect_netns: no iperf3: skipped"; exit 77; }
command -v jq >/dev/null || { echo "reflect_netns: no jq: skipped"; exit 77; }

ns=tsrefl-$$
tmp=$(mktemp -d)
refl_pid="" srv_pid=""
cleanup() {
	[ -z "$srv_pid" ] || kill "$srv_pid" 2>/dev/null
	[ -z "$refl_pid" ] || kill "$refl_pid" 2>/dev/null
	wait 2>/dev/null
	ip netns del "$ns" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
fail() { echo "FAIL $*"; [ -f "$tmp/refl.err" ] && sed 's/^/  reflect: /' "$tmp/refl.err"; exit 1; }
in_ns() { ip netns exec "$ns" "$@"; }
# done_iperf NAME LABEL: stop the one-shot server; iperf3 -J may exit 0 after an error, so judge
# the JSON: no "error" and bytes received.
done_iperf() {
	kill "$srv_pid" 2>/dev/null
	wait "$srv_pid" 2>/dev/null
	srv_pid=""
	jq -e '.error == null and .end.sum_received.bytes > 0' "$tmp/$1.json" >/dev/null 2>&1 ||
		fail "iperf3 $2 through the reflector: $(jq -r .error "$tmp/$1.json" 2>/dev/null)"
}

cat >"$tmp/cfg.json" <<JSON
{ "stack": "system",
  "tun": { "name": "tsrefl0", "address": "198.18.0.1/15", "address6": "fd00:18::1/64",
           "mtu": 1500, "txqueuelen": 10000 } }
JSON

ip netns add "$ns" || fail "ip netns add"
in_ns ip link set lo up
mkfifo "$tmp/ready"
ip netns exec "$ns" "$bin" reflect --config "$tmp/cfg.json" --ready-fd 3 3>"$tmp/ready" \
	>"$tmp/refl.out" 2>"$tmp/refl.err" &
refl_pid=$!
ready=$(timeout 10 head -c1 "$tmp/ready") || true
[ "$ready" = R ] || fail "reflector did not become ready"
echo "ok   reflector ready"

ip netns exec "$ns" iperf3 -s -1 -B 198.18.0.1 >/dev/null 2>&1 &
srv_pid=$!
sleep 0.3
in_ns timeout $((secs + 10)) iperf3 -c 198.18.1.1 -B 198.18.0.1 -t "$secs" -J \
	--connect-timeout 3000 >"$tmp/v4.json" 2>&1
done_iperf v4 IPv4
gbps4=$(jq '.end.sum_received.bits_per_second / 1e9' "$tmp/v4.json")
printf 'ok   IPv4 198.18.0.1 -> 198.18.1.1 (reflected): %.2f Gbit/s\n' "$gbps4"

ip netns exec "$ns" iperf3 -s -1 -B fd00:18::1 >/dev/null 2>&1 &
srv_pid=$!
sleep 0.3
in_ns timeout 11 iperf3 -c fd00:18::2 -B fd00:18::1 -t 1 -J --connect-timeout 3000 \
	>"$tmp/v6.json" 2>&1
done_iperf v6 IPv6
gbps6=$(jq '.end.sum_received.bits_per_second / 1e9' "$tmp/v6.json")
printf 'ok   IPv6 fd00:18::1 -> fd00:18::2 (reflected): %.2f Gbit/s\n' "$gbps6"

# Explicit checksum verdicts from the kernel that received every reflected packet.
bad=$(in_ns nstat -az IpInHdrErrors IpExtInCsumErrors TcpInCsumErrors Ip6InHdrErrors |
	awk 'NR > 1 && $2 != 0 { print $1 "=" $2 }' | tr '\n' ' ')
[ -z "$bad" ] || fail "the kernel saw bad headers or checksums: $bad"
echo "ok   no IPv4 header / TCP checksum errors (nstat)"

kill -TERM "$refl_pid"
wait "$refl_pid"
rc=$?
refl_pid=""
[ "$rc" = 0 ] || fail "reflector exit $rc after SIGTERM, want 0"
grep -q '^reflect: packets=[1-9][0-9]* bytes=' "$tmp/refl.out" || fail "no counters on exit"
echo "ok   SIGTERM exit 0: $(cat "$tmp/refl.out")"
