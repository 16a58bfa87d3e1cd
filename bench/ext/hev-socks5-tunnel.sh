#!/usr/bin/env bash
# hev-socks5-tunnel.sh HEV TUN ADDR SOCKS5_HOST SOCKS5_PORT — hev-socks5-tunnel (a TUN-to-SOCKS5
# engine on lwIP, built separately) as the rig's external subject under --via socks5:
#   twinstack bench --via socks5 --subject "hev=bash bench/ext/hev-socks5-tunnel.sh HEV {tun}
#   {addr} {socks5_host} {socks5_port}"
# Writes a YAML configuration for TUN and execs HEV with it. HEV creates the TUN itself
# (single queue), gives it the bare IPv4 address of ADDR with a /32 mask (it has no prefix
# setting, so ADDR's /N is dropped here), sets the MTU (8500, its own example configuration's:
# it reads and writes one packet at a time, with no offload, so a larger MTU is its way to
# fewer packets) and brings the link up. UDP goes by
# standard UDP ASSOCIATE (RFC 1928), which any SOCKS5 server relays, not hev's UDP-in-TCP
# extension. No IPv6 address: the rig's target is IPv4.
set -euo pipefail
bin=${1:?usage: hev-socks5-tunnel.sh HEV TUN ADDR SOCKS5_HOST SOCKS5_PORT}
tun=${2:?} addr=${3:?} host=${4:?} port=${5:?}
ip=${addr%%/*}
case "$ip" in
*[!0-9.]* | "") echo "hev-socks5-tunnel.sh: not an IPv4 address: $addr" >&2; exit 2 ;;
esac
cfg=$(mktemp "${TMPDIR:-/tmp}/ts-hev.XXXXXX.yml")
cat >"$cfg" <<YAML
tunnel:
  name: '$tun'
  mtu: 8500
  multi-queue: false
  ipv4: '$ip'
socks5:
  address: '$host'
  port: $port
  udp: 'udp'
misc:
  log-file: stderr
  log-level: warn
YAML
# The configuration is read at start; the file is not needed after that.
( sleep 5; rm -f "$cfg" ) &
exec "$bin" "$cfg"
