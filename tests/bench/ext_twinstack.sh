#!/usr/bin/env bash
# ext_twinstack.sh BIN STACK TUN ADDR MARK [SOCKS5] — a second twinstack process as the rig's
# external subject (`twinstack bench --subject NAME='bash ext_twinstack.sh BIN lwip {tun} {addr}
# {mark}'`, or with {socks5} under --via socks5): writes a configuration for TUN and execs
# `twinstack run`, as any other TUN proxy's wrapper would. Its stats endpoint is off (the
# rig's /stats port belongs to its own subjects).
set -euo pipefail
bin=${1:?} stack=${2:?} tun=${3:?} addr=${4:?} mark=${5:?} socks5=${6:-}
cfg=$(mktemp "${TMPDIR:-/tmp}/ts-ext.XXXXXX.json")
if [ -n "$socks5" ]; then
	out="{\"tag\": \"s5\", \"type\": \"socks5\", \"server\": \"$socks5\", \"udp\": true, \"routing_mark\": $mark}"
	final=s5
else
	out="{\"tag\": \"direct\", \"type\": \"direct\", \"routing_mark\": $mark}"
	final=direct
fi
cat >"$cfg" <<JSON
{"stack": "$stack",
 "tun": {"name": "$tun", "address": "$addr", "mtu": 1500, "offload": "on"},
 "outbounds": [$out],
 "route": {"final": "$final"},
 "log": {"level": "warn"}}
JSON
# The configuration is read at start; the file is not needed after that.
( sleep 5; rm -f "$cfg" ) &
exec "$bin" run --config "$cfg"
