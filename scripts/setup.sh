#!/usr/bin/env bash
# setup.sh — install what twinstack needs to build, test and benchmark on Debian bookworm,
# and fetch lwIP 2.1.3 from Debian's source package with a private apt configuration.
#
# Idempotent: installs only what is missing (apt-get update only then), fetches lwIP only once.
# Never edits the system's apt sources: the source list, lists and cache live under build/deps/.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
deps="$top/build/deps"
export DEBIAN_FRONTEND=noninteractive

pkgs=(
	build-essential cmake pkg-config libevent-dev libcjson-dev libcriterion-dev libcap-dev libc-ares-dev libpcre2-dev libnghttp2-dev libssl-dev libbpf-dev dpkg-dev
	clang libclang-rt-14-dev
	iperf3 curl socat jq python3 python3-prometheus-client dnsmasq-base unbound bind9-dnsutils
	microsocks dante-server tinyproxy proxychains4 iputils-ping iproute2 ethtool gnuplot-nox
	ngtcp2-client ngtcp2-server nftables
	valgrind bpftool
)

die() { echo "setup: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (apt-get install)"

missing=()
for p in "${pkgs[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
if [ "${#missing[@]}" -gt 0 ]; then
	echo "setup: installing ${missing[*]}"
	# iperf3 asks whether to start a daemon; answer no.
	echo 'iperf3 iperf3/start_daemon boolean false' | debconf-set-selections
	apt-get update -qq
	# The test servers (dante-server, tinyproxy, unbound) run only inside the tests' namespaces: keep
	# their packages from starting system services at install (policy-rc.d 101: refused).
	policy=/usr/sbin/policy-rc.d
	had_policy=0
	[ -e "$policy" ] && had_policy=1
	if [ "$had_policy" -eq 0 ]; then
		# Ours: removed however the install ends (an interrupted one too), or no later apt
		# run on this host could start a service.
		trap 'rm -f "$policy"' EXIT
		trap 'rm -f "$policy"; exit 130' INT
		trap 'rm -f "$policy"; exit 143' TERM
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
	fi
	rc=0
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
	if [ "$had_policy" -eq 0 ]; then
		rm -f "$policy"
		trap - EXIT INT TERM
	fi
	[ "$rc" -eq 0 ] || die "apt-get install failed ($rc)"
fi

# --- lwIP 2.1.3 from Debian's source package -------------------------------------------------
lwip_dir="$deps/lwip"
if [ -f "$lwip_dir/src/core/tcp.c" ] && [ -f "$lwip_dir/.twinstack-fetched" ]; then
	exit 0
fi

apt_dir="$deps/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/parts" "$deps"

# Reuse the system's own Debian mirror (deb822 or one-line format) for a deb-src line of our own.
# Both formats are read (a third-party .sources file beside a one-line Debian sources.list is
# common); a URI counts only when its entry names a bookworm suite and it ends in /debian, and
# known third-party hosts that use that path (Docker's) are left out.
uris=$( {
	awk 'function flush() { if (u != "" && ok) print u; u = ""; ok = 0 }
	     FNR == 1 || /^[ \t]*$/ { flush() }
	     /^URIs:/ { for (i = 2; i <= NF; i++) u = u " " $i }
	     /^Suites:/ { for (i = 2; i <= NF; i++) if ($i ~ /^bookworm/) ok = 1 }
	     END { flush() }' /etc/apt/sources.list.d/*.sources 2>/dev/null
	[ -f /etc/apt/sources.list ] && awk '$1 == "deb" {
		u = ""; for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { u = $i; s = $(i + 1); break }
		if (u != "" && s ~ /^bookworm/) print u }' /etc/apt/sources.list
} | tr ' ' '\n' | grep -v -- '-security' | grep -E '^[a-z]+://[^ ]+/debian/?$' |
	grep -v -E '://download\.docker\.com/' | sort -u || true)
[ -n "$uris" ] || die "no Debian mirror found in the system's apt sources"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || die "missing $keyring (package debian-archive-keyring)"

: > "$apt_dir/sources.list"
for u in $uris; do
	echo "deb-src [signed-by=$keyring] $u bookworm main" >> "$apt_dir/sources.list"
done

apt_opts=(
	-o "Dir::Etc::SourceList=$apt_dir/sources.list"
	-o "Dir::Etc::SourceParts=$apt_dir/parts"
	-o "Dir::State::Lists=$apt_dir/lists"
	-o "Dir::Cache=$apt_dir/cache"
	-o "APT::Sandbox::User=root"
)
echo "setup: fetching lwIP source with a private apt configuration"
apt-get "${apt_opts[@]}" update -qq
work="$deps/lwip-fetch"
rm -rf "$work"
mkdir -p "$work"
(cd "$work" && apt-get "${apt_opts[@]}" source -qq lwip >/dev/null)
src=$(find "$work" -maxdepth 1 -mindepth 1 -type d -name "lwip-2.1.3*" | head -n 1)
[ -n "$src" ] && [ -f "$src/src/core/tcp.c" ] || die "apt-get source lwip produced no source tree"
rm -rf "$lwip_dir"
mv "$src" "$lwip_dir"
rm -rf "$work"
echo "$(basename "$src")" > "$lwip_dir/.twinstack-fetched"
echo "setup: lwIP source in $lwip_dir"
