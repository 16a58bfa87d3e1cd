#!/usr/bin/env bash
# reflect_netns.sh — `twinstack reflect` end to end: iperf3 and a hash-compared transfer through
# the address-swapping reflector in a private network namespace, IPv4 and IPv6, then the exit
# code and counters. Runs twice: TUN offload on (vnet header, GSO super-packets, partial
# checksums) and off (per-packet), each in its own namespace.
#
#   ns tsrefl-PID-MODE
#   iperf3 -c 198.18.1.1 -B 198.18.0.1          iperf3 -s (listening on 198.18.0.1:5201)
#        |  198.18.0.1:c -> 198.18.1.1:5201           ^  198.18.1.1:c -> 198.18.0.1:5201
#        v                                            |
#   tun (198.18.0.1/15, fd00:18::1/64) --read--> twinstack reflect --write (addresses swapped)-->
#
# Every payload crosses the TUN once per direction. Per-packet, the kernel drops IPv4 packets
# with a bad header checksum and TCP segments with a bad checksum, so a transfer that completes
# proves the swap keeps both valid. With offload the kernel trusts a NEEDS_CSUM packet's payload
# (it only completes the sum from the partial pseudo-header sum we hand back), so a corrupted
# payload would pass unnoticed by TCP: the sha256 of a 32 MiB transfer is compared as well.
#
# usage: reflect_netns.sh TWINSTACK_BINARY [SECONDS]   (root; exit 77 = skipped)
set -uo pipefail

bin=${1:?usage: reflect_netns.sh TWINSTACK_BINARY [SECONDS]}
secs=${2:-3}
[ "$(id -u)" = 0 ] || { echo "reflect_netns: needs root: skipped"; exit 77; }
[ -c /dev/net/tun ] || { echo "reflect_netns: no /dev/net/tun: skipped"; exit 77; }
for t in iperf3 jq socat nstat sha256sum; do
	command -v "$t" >/dev/null || { echo "reflect_netns: no $t: skipped"; exit 77; }
done

tmp=$(mktemp -d)
ns="" refl_pid="" srv_pid="" namespaces=()
cleanup() {
	[ -z "$srv_pid" ] || kill "$srv_pid" 2>/dev/null
	[ -z "$refl_pid" ] || kill "$refl_pid" 2>/dev/null
	wait 2>/dev/null
	for n in "${namespaces[@]}"; do ip netns del "$n" 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
fail() { echo "FAIL [$mode] $*"; [ -f "$tmp/refl.err" ] && sed 's/^/  reflect: /' "$tmp/refl.err"; exit 1; }
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

# iperf_through SERVER MIRROR SECONDS NAME LABEL: one iperf3 run through the reflector.
iperf_through() {
	local srv=$1 mirror=$2 t=$3 name=$4 label=$5 gbps
	ip netns exec "$ns" iperf3 -s -1 -B "$srv" >/dev/null 2>&1 &
	srv_pid=$!
	sleep 0.3
	in_ns timeout $((t + 10)) iperf3 -c "$mirror" -B "$srv" -t "$t" -J \
		--connect-timeout 3000 >"$tmp/$name.json" 2>&1
	done_iperf "$name" "$label"
	gbps=$(jq '.end.sum_received.bits_per_second / 1e9' "$tmp/$name.json")
	printf 'ok   [%s] %s %s -> %s (reflected): %.2f Gbit/s\n' "$mode" "$label" "$srv" "$mirror" "$gbps"
}

# hash_through SERVER MIRROR LABEL: 32 MiB of random bytes through the reflector, sha256 equal.
hash_through() {
	local srv=$1 mirror=$2 label=$3 want got v=4
	case $srv in *:*) v=6 srv="[$srv]" mirror="[$mirror]" ;; esac
	ip netns exec "$ns" timeout 20 socat -u "TCP$v-LISTEN:5202,bind=$srv,reuseaddr" \
		"OPEN:$tmp/recv.bin,creat,trunc" 2>"$tmp/socat-srv.err" &
	srv_pid=$!
	sleep 0.3
	in_ns timeout 15 socat -u "OPEN:$tmp/send.bin" "TCP$v:$mirror:5202,bind=$srv" \
		2>"$tmp/socat-cli.err" || fail "$label transfer: $(head -c 200 "$tmp/socat-cli.err")"
	wait "$srv_pid" 2>/dev/null
	srv_pid=""
	want=$(sha256sum <"$tmp/send.bin" | cut -d' ' -f1)
	got=$(sha256sum <"$tmp/recv.bin" | cut -d' ' -f1)
	[ "$want" = "$got" ] || fail "$label: 32 MiB sent, received $(stat -c %s "$tmp/recv.bin") bytes, sha256 differs"
	echo "ok   [$mode] $label: 32 MiB through the reflector, sha256 equal"
}

# counter NAME: a number from the reflector's exit line.
counter() { sed -n "s/^reflect: .* $1=\([^ ]*\).*/\1/p" "$tmp/refl.out"; }

# run_mode on|off: a fresh namespace, the reflector with tun.offload MODE, the transfers, the
# exit and the counters.
run_mode() {
	mode=$1
	ns=tsrefl-$$-$mode
	cat >"$tmp/cfg.json" <<JSON
{ "stack": "system",
  "tun": { "name": "tsrefl0", "address": "198.18.0.1/15", "address6": "fd00:18::1/64",
           "mtu": 1500, "txqueuelen": 10000, "offload": "$mode" } }
JSON
	ip netns add "$ns" || fail "ip netns add"
	namespaces+=("$ns")
	in_ns ip link set lo up
	rm -f "$tmp/ready"
	mkfifo "$tmp/ready"
	ip netns exec "$ns" "$bin" reflect --config "$tmp/cfg.json" --ready-fd 3 3>"$tmp/ready" \
		>"$tmp/refl.out" 2>"$tmp/refl.err" &
	refl_pid=$!
	ready=$(timeout 10 head -c1 "$tmp/ready") || true
	[ "$ready" = R ] || fail "reflector did not become ready"
	echo "ok   [$mode] reflector ready: $(grep -o 'ready on .*' "$tmp/refl.err" | head -n 1)"

	iperf_through 198.18.0.1 198.18.1.1 "$secs" v4 IPv4
	iperf_through fd00:18::1 fd00:18::2 1 v6 IPv6
	hash_through 198.18.0.1 198.18.1.1 "IPv4 sha256"
	hash_through fd00:18::1 fd00:18::2 "IPv6 sha256"

	# Explicit checksum verdicts from the kernel that received every reflected packet.
	bad=$(in_ns nstat -az IpInHdrErrors IpExtInCsumErrors TcpInCsumErrors Ip6InHdrErrors |
		awk 'NR > 1 && $2 != 0 { print $1 "=" $2 }' | tr '\n' ' ')
	[ -z "$bad" ] || fail "the kernel saw bad headers or checksums: $bad"
	echo "ok   [$mode] no IPv4 header / TCP checksum errors (nstat)"

	kill -TERM "$refl_pid"
	wait "$refl_pid"
	rc=$?
	refl_pid=""
	[ "$rc" = 0 ] || fail "reflector exit $rc after SIGTERM, want 0"
	grep -q '^reflect: packets=[1-9][0-9]* bytes=' "$tmp/refl.out" || fail "no counters on exit"
	local io gso want_io=per-packet
	[ "$mode" = on ] && want_io=offload
	io=$(counter io) gso=$(counter gso)
	[ "$io" = "$want_io" ] || fail "counters say io=$io, want $want_io: $(cat "$tmp/refl.out")"
	# TCP through a TUN with TSO on sends super-packets; per-packet I/O cannot see any.
	if [ "$mode" = on ]; then
		[[ "$gso" =~ ^[1-9][0-9]*$ ]] ||
			fail "offload on but no GSO super-packet reflected: $(cat "$tmp/refl.out")"
	else
		[ "$gso" = 0 ] || fail "per-packet but gso=$gso: $(cat "$tmp/refl.out")"
	fi
	echo "ok   [$mode] SIGTERM exit 0: $(cat "$tmp/refl.out")"
	ip netns del "$ns"
}

head -c $((32 * 1024 * 1024)) /dev/urandom >"$tmp/send.bin"
run_mode on
run_mode off
