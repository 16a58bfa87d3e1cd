#!/usr/bin/env bash
# check.sh — the `twinstack` CLI contract: exit codes, messages naming the JSON path, and the
# complete example of docs/config.md.
#
# usage: check.sh TWINSTACK_BINARY SOURCE_DIR
#
# - every ```json block of docs/config.md (the complete and the desktop example) must pass
#   `twinstack check` (exit 0);
# - every tests/cli/bad/*.json must exit 2 with "config: <path>: " on stderr, where the file
#   name encodes the path: "<path without the leading $.>__<what>.json", "root" meaning "$"
#   (outbounds[1].server__missing_port.json expects "config: $.outbounds[1].server: ");
# - --help/--version exit 0 (cleanup --help too); bad usage (no args, unknown command, missing
#   --config, unreadable file, an argument to cleanup) exits 2; so does `twinstack redirect`
#   with a missing or bad option, naming it;
# - `run` with an https:// DNS server where nghttp2 cannot be loaded exits 1 at once, naming it.
set -uo pipefail

bin=${1:?usage: check.sh TWINSTACK_BINARY SOURCE_DIR}
src=${2:?usage: check.sh TWINSTACK_BINARY SOURCE_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }

# run NAME ARGS...: runs the binary, sets $rc, $out (stdout), $err (stderr).
run() {
	"$bin" "$@" >"$work/out" 2>"$work/err"
	rc=$?
	out=$(cat "$work/out")
	err=$(cat "$work/err")
}

# expect_rc WANT DESCRIPTION
expect_rc() {
	if [ "$rc" -eq "$1" ]; then
		ok "$2 (exit $rc)"
	else
		bad "$2: exit $rc, want $1; stdout: $out; stderr: $err"
	fi
}

# --- the docs example ---------------------------------------------------------------------
blocks=$(grep -c '^```json[[:space:]]*$' "$src/docs/config.md")
[ "$blocks" -ge 2 ] || bad "docs/config.md: expected the complete and the desktop example (found $blocks json blocks)"
for b in $(seq 1 "$blocks"); do
	awk -v want="$b" '/^```json[[:space:]]*$/ { inblock = 1; n++; next }
	     /^```/ { inblock = 0; next }
	     inblock && n == want { print }' "$src/docs/config.md" >"$work/example$b.json"
	if [ ! -s "$work/example$b.json" ]; then
		bad "docs/config.md json block $b is empty"
		continue
	fi
	run check --config "$work/example$b.json"
	expect_rc 0 "docs/config.md example $b accepted"
	case "$out" in
	"config ok: stack="*) ok "example $b summary: $out" ;;
	*) bad "example $b summary line: '$out'" ;;
	esac
done

# --- the defaults' summary line -----------------------------------------------------------
echo '{}' >"$work/empty.json"
run check --config "$work/empty.json"
want="config ok: stack=system tun=tun0 198.18.0.1/15 nat=198.18.0.2-198.18.0.5 outbounds=1 rules=0"
if [ "$rc" -eq 0 ] && [ "$out" = "$want" ]; then
	ok "defaults summary"
else
	bad "defaults summary: exit $rc, '$out'"
fi
run check -c "$work/empty.json"
expect_rc 0 "check -c FILE"
run check "--config=$work/empty.json"
expect_rc 0 "check --config=FILE"

# --- bad configs ----------------------------------------------------------------------------
nbad=0
for f in "$src"/tests/cli/bad/*.json; do
	[ -e "$f" ] || continue
	nbad=$((nbad + 1))
	name=$(basename "$f" .json)
	p=${name%%__*}
	if [ "$p" = "$name" ]; then
		bad "$name: file name lacks '__' (see the header of this script)"
		continue
	fi
	if [ "$p" = root ]; then p='$'; else p="\$.$p"; fi
	run check --config "$f"
	if [ "$rc" -ne 2 ]; then
		bad "$name: exit $rc, want 2; stderr: $err"
	elif [[ "$err" != *"config: $p: "* ]]; then
		bad "$name: stderr does not name $p: $err"
	elif [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ]; then
		bad "$name: message is not one line: $err"
	else
		ok "$name -> $err"
	fi
done
[ "$nbad" -ge 10 ] && ok "$nbad bad configs" || bad "only $nbad bad configs found"

# --- usage ------------------------------------------------------------------------------------
run --help
expect_rc 0 "--help"
[[ "$out" == *"check"* ]] && ok "--help lists check" || bad "--help does not list check: $out"
run -h
expect_rc 0 "-h"
run help check
expect_rc 0 "help check"
run check --help
expect_rc 0 "check --help"
[[ "$out" == *"--config"* ]] && ok "check --help names --config" || bad "check --help: $out"
run --version
expect_rc 0 "--version"
[[ "$out" =~ ^twinstack\ [0-9]+\.[0-9]+\.[0-9]+ ]] && ok "version line: $out" ||
	bad "version line: $out"

run
expect_rc 2 "no arguments"
run frobnicate
expect_rc 2 "unknown command"
[[ "$err" == *"unknown command 'frobnicate'"* ]] && ok "unknown command named" || bad "$err"
run --frobnicate
expect_rc 2 "unknown global option"
run check
expect_rc 2 "check without --config"
run check --config
expect_rc 2 "check --config without FILE"
run check --config "$work/empty.json" extra
expect_rc 2 "check with a stray argument"
run check --config "$work/does-not-exist.json"
expect_rc 2 "missing config file"
[[ "$err" == *"No such file or directory"* ]] && ok "missing file named: $err" || bad "$err"
run check --config "$work"
expect_rc 2 "config path is a directory"

run cleanup --help
expect_rc 0 "cleanup --help"
[[ "$out" == *"protocol 116"* ]] && ok "cleanup --help names the tag" || bad "cleanup --help: $out"
run cleanup extra
expect_rc 2 "cleanup with a stray argument"

# --- redirect: bad usage exits 2 naming the flag, before anything is opened ------------------
run redirect --help
expect_rc 0 "redirect --help"
[[ "$out" == *"meta mark N return"* ]] && ok "redirect --help shows the rule set" || bad "redirect --help: $out"
# redirect_bad FLAG ARGS...: exit 2 and FLAG named in the message (stderr's first line: the
# usage text after it names every flag).
redirect_bad() {
	local flag=$1 first
	shift
	run redirect "$@"
	expect_rc 2 "redirect $*"
	first=$(head -n 1 <<<"$err")
	[[ "$first" == *"$flag"* ]] && ok "redirect $*: $first" || bad "redirect $*: $first"
}
redirect_bad --listen
redirect_bad --mark --listen :15001
redirect_bad --mark --listen6 :15001
redirect_bad --listen --listen :0 --mark 1
redirect_bad --listen --listen "[::1]:15001" --mark 1
redirect_bad --listen6 --listen6 127.0.0.1:15001 --mark 1
redirect_bad --mark --listen :15001 --mark 0
redirect_bad --mark --listen :15001 --mark -1
redirect_bad --mark --listen :15001 --mark 4294967296
redirect_bad --relay --listen :15001 --mark 1 --relay zero-copy
redirect_bad --relay --listen :15001 --mark 1 --relay
redirect_bad --socks5 --listen :15001 --mark 1 --socks5 proxy.example:1080
redirect_bad --socks5 --listen :15001 --mark 1 --socks5 0.0.0.0:1080
redirect_bad --socks5 --listen :15001 --mark 1 --socks5
redirect_bad --stats --listen :15001 --mark 1 --stats 10.0.0.1:9194
redirect_bad "'extra'" --listen :15001 --mark 1 extra

# Every subcommand takes --help, load's modes too; the bench's usage names its run modes.
for m in serve connrate latency hold udp udpflows; do
	run load "$m" --help
	expect_rc 0 "load $m --help"
done
run bench --help
expect_rc 0 "bench --help"
for o in --link --subject --across --report-from --smoke --via --ablation --sniff --ab; do
	[[ "$out" == *"$o"* ]] && ok "bench --help names $o" || bad "bench --help does not name $o"
done
# run --ready-fd takes digits only ("" is not fd 0, nor "+1" fd 1); checked before the config.
for v in "" " 1" "+1" "1x"; do
	run run --config "$work/none.json" "--ready-fd=$v"
	expect_rc 2 "run --ready-fd='$v'"
	[[ "$err" == *"--ready-fd '$v' is not an open fd"* ]] && ok "run --ready-fd='$v' named" ||
		bad "run --ready-fd='$v': $err"
done

# OpenSSL and nghttp2 are opened only when a config needs them (DNS over TLS or HTTPS, QUIC
# sniffing), so the program runs without them until then. A system without them: a library
# directory searched first that holds an unloadable nghttp2 under its soname. A config with an
# https:// server must then stop the start at once, exit 1, with the loader's message. (Run in
# a network namespace of its own where possible: should the start go on, its TUN is made there.)
h2_soname=$(grep -aoE 'libnghttp2\.so\.[0-9]+' "$bin" | head -n 1)
if [ -z "$h2_soname" ]; then
	bad "the binary names the nghttp2 it opens (no libnghttp2.so.N string in it)"
else
	mkdir -p "$work/nolib"
	: >"$work/nolib/$h2_soname"
	printf '%s\n' '{"tun": {"name": "tscheck0"},' \
		'"dns": {"hijack": true, "servers": [{"tag": "h", "address": "https://127.0.0.1/dns-query"}]}}' \
		>"$work/doh.json"
	ns=()
	[ "$(id -u)" = 0 ] && unshare -n true 2>/dev/null && ns=(unshare -n)
	LD_LIBRARY_PATH="$work/nolib" timeout 10 "${ns[@]}" "$bin" run --config "$work/doh.json" \
		>"$work/out" 2>"$work/err"
	rc=$?
	out=$(cat "$work/out")
	err=$(cat "$work/err")
	expect_rc 1 "run: an https:// DNS server without a loadable nghttp2 stops the start"
	if grep -q "DNS over TLS or HTTPS needs OpenSSL and nghttp2: .*$h2_soname" "$work/err"; then
		ok "run: the message names what is missing ($h2_soname)"
	else
		bad "run: the message names what is missing: stderr: $err"
	fi
fi

# --- many rule sets: the summary line names every one, never cut ----------------------------
echo "example.com" >"$work/set.txt"
{
	printf '{"rule_sets": ['
	for i in $(seq 1 40); do
		[ "$i" -gt 1 ] && printf ','
		printf '{"tag": "a-rather-long-rule-set-tag-number-%02d", "format": "plain", "path": "%s"}' \
			"$i" "$work/set.txt"
	done
	printf ']}\n'
} >"$work/sets.json"
run check --config "$work/sets.json"
expect_rc 0 "40 rule sets accepted"
case "$out" in
*"rule_sets=40 ["*"a-rather-long-rule-set-tag-number-40: 1 entries, 0 bad lines, "*" ms]")
	ok "the summary names all 40 rule sets" ;;
*) bad "the summary is cut: '${out: -120}'" ;;
esac

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
