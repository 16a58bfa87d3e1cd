#!/usr/bin/env bash
# make_corpus_config.sh — (re)generate the seed corpus of fuzz_config from fixed snippets.
#
# usage: tests/fuzz/make_corpus_config.sh [SOURCE_DIR]
# Writes tests/fuzz/corpus/fuzz_config/*.json: the docs/config.md example, one seed per section
# (valid values near the edges of their ranges) and a few invalid shapes. Deterministic: rerun
# it after a schema change and commit the result.
set -euo pipefail

src=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
out="$src/tests/fuzz/corpus/fuzz_config"
mkdir -p "$out"
rm -f "$out"/*.json

seed() { printf '%s\n' "$2" >"$out/$1.json"; }

awk '/^```json[[:space:]]*$/ { inblock = 1; n++; next } /^```/ { inblock = 0; next }
     inblock && n == 1 { print }' "$src/docs/config.md" >"$out/00_docs_example.json"

seed 01_empty '{}'
seed 02_stack_tun '{"stack":"lwip","tun":{"name":"tun9","address":"10.0.0.250/29","address6":"fd00::1/125","mtu":1280,"txqueuelen":1,"queues":16,"offload":"on"}}'
seed 03_nat_timeouts '{"nat":{"addresses":64,"listeners":16,"linger_ms":1,"half_open_timeout_ms":3600000,"port_quarantine_ms":0,"accepted_sndbuf":0,"accepted_congestion":"host"},"timeouts":{"connect_ms":1,"relay_idle_ms":86400000,"udp_idle_ms":60000}}'
seed 04_outbounds '{"outbounds":[{"tag":"d","type":"direct","routing_mark":4294967295,"bind_interface":"eth0"},{"tag":"s","type":"socks5","server":"[fd00::2]:1080","username":"u","password":"p"},{"tag":"h","type":"socks5","server":"proxy.example:1"},{"tag":"r","type":"reject"}]}'
seed 05_route '{"outbounds":[{"tag":"a","type":"direct"},{"tag":"b","type":"reject"}],"route":{"rules":[{"cidr":["10.0.0.0/8","::/0"],"port":[1,"2-65535"],"network":"tcp","outbound":"b"},{"network":"udp","outbound":"a"}],"final":"b"}}'
seed 06_dns_stats_log '{"dns":{"hijack":true,"upstream":"[2001:db8::53]:53"},"stats":{"listen":"127.0.0.1:9090"},"log":{"level":"debug"}}'
seed 07_budgets '{"budgets":{"profile":"mobile","memory_limit_mb":50,"nat_entries":1,"tcp_sessions":64,"tcp_sessions_elevated":64,"tcp_sessions_critical":1,"udp_sessions":1,"udp_up_queue":65536,"udp_down_queue":1,"listen_backlog":65535,"buffer_bytes":16777216,"fds":1}}'
seed 08_relay '{"relay":{"mode":"copy","buffer_bytes":4096}}'
seed 09_bad_prefix '{"tun":{"address":"10.0.0.1/31","address6":"fd00::/64"}}'
seed 10_bad_types '{"stack":1,"tun":[],"nat":{"addresses":"4"},"outbounds":{},"dns":{"hijack":"yes"}}'
seed 11_bad_tags '{"outbounds":[{"tag":"a","type":"direct"},{"tag":"a","type":"socks5"}],"route":{"rules":[{}],"final":"x"}}'
seed 12_bad_numbers '{"tun":{"mtu":1e400,"queues":-0.5,"txqueuelen":18446744073709551616}}'
seed 13_malformed '{"tun": {"mtu": 1500,}'
seed 14_escapes '{"tun":{"name":"a\u0000b"},"\u00e9\n":1,"log":{"level":"\ud83d\ude00"}}'
seed 15_deep "$(printf '[%.0s' {1..30}){\"a\":{\"b\":{\"c\":[1,2,3]}}}$(printf ']%.0s' {1..30})"
seed 16_ports '{"route":{"rules":[{"port":["90-80","0-1","65535-65535","1-","-1",80.0,"80"],"outbound":"direct"}]}}'
echo "wrote $(ls "$out" | wc -l) seeds to $out"
