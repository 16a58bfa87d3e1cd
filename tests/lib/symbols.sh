#!/usr/bin/env bash
# symbols.sh — the packaged library exports the public API and nothing else.
#
# usage: symbols.sh include/twinstack.h libtwinstack.so libtwinstack.a
# The API is every function declared on a TS_API line of the header. It must equal, exactly:
#   - the defined dynamic symbols of the .so (`nm -D --defined-only`), each a function (T);
#   - the global defined symbols of the .a (`nm -g --defined-only`), which must be a single
#     prelinked object (lwIP's tcp_new, our log_init, ts_now_ns: all local).
# A missing or extra symbol fails and prints the diff (- header only, + library only).
set -uo pipefail

header=${1:?usage: symbols.sh HEADER SHARED_LIB STATIC_LIB}
so=${2:?usage: symbols.sh HEADER SHARED_LIB STATIC_LIB}
ar=${3:?usage: symbols.sh HEADER SHARED_LIB STATIC_LIB}
for f in "$header" "$so" "$ar"; do
	[ -f "$f" ] || { echo "not ok - $f: no such file"; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# `TS_API <return type> name(` -> name; the name is the identifier just before the first '('.
sed -nE 's/^TS_API[^(]*[^A-Za-z0-9_]([A-Za-z_][A-Za-z0-9_]*)\(.*/\1/p' "$header" | sort -u >"$tmp/api"
n_api=$(wc -l <"$tmp/api")
if [ "$n_api" -eq 0 ]; then
	echo "not ok - no TS_API function found in $header"
	exit 1
fi

# same LABEL FILE: FILE (sorted names) equals the API, or print the diff.
same() {
	if diff -u "$tmp/api" "$2" >"$tmp/diff"; then
		echo "ok - $1: the $n_api API functions, nothing else"
	else
		echo "not ok - $1 differs from the TS_API functions of $(basename "$header"):"
		tail -n +3 "$tmp/diff" | grep '^[-+]'
		fail=1
	fi
}

nm -D --defined-only "$so" | awk 'NF == 3 { print $3 }' | sort -u >"$tmp/so"
same "$(basename "$so") dynamic symbols" "$tmp/so"
nm -D --defined-only "$so" | awk 'NF == 3 && $2 != "T" { print "  " $3 " is type " $2 }' >"$tmp/so_types"
if [ -s "$tmp/so_types" ]; then
	echo "not ok - $(basename "$so") exports something other than functions:"
	cat "$tmp/so_types"
	fail=1
fi

members=$(ar t "$ar" | wc -l)
if [ "$members" -ne 1 ]; then
	echo "not ok - $(basename "$ar") has $members members, want 1 prelinked object: $(ar t "$ar" | head -n 5 | tr '\n' ' ')"
	fail=1
fi
nm -g --defined-only "$ar" | awk 'NF == 3 { print $3 }' | sort -u >"$tmp/ar"
same "$(basename "$ar") global symbols" "$tmp/ar"

exit "$fail"
