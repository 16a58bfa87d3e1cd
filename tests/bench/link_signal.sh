#!/usr/bin/env bash
# link_signal.sh TWINSTACK — `twinstack bench --link` stopped by SIGTERM leaves nothing behind.
# The link testbed (bench/linkbed.sh: three namespaces and a delay line) runs in a session of
# its own, so the rig must take it down itself when it is stopped. Twice, each a `--link
# --smoke` run: stopped while it calibrates the line (linkbed.sh calibrate running), and
# stopped once the measuring testbed is up (linkbed.sh up). Each time: the rig exits within
# 30 s, and the testbed's namespaces (tsl[AMB]-TOKEN) and its delay line (on tlT-TOKEN) are
# gone.
# Output: 'ok - NAME' / 'not ok - NAME: REASON' lines, then 'N passed, N failed'.
# Exit: 0 all passed, 77 skipped (not root, no /dev/net/tun, nft or the delay line), 1 otherwise.
set -uo pipefail
bin=${1:?usage: link_signal.sh path/to/twinstack}
dl="$(dirname "$bin")/twinstack-delayline"
if [ "$(id -u)" -ne 0 ] || [ ! -c /dev/net/tun ] || [ ! -x "$dl" ] ||
	! command -v nft >/dev/null 2>&1; then
	echo "# SKIP: needs root, /dev/net/tun, nft and $dl"
	exit 77
fi
# shellcheck source=tests/integration/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../integration" && pwd)/lib.sh" # ok, not_ok, stop_pid
out=$(mktemp -d)
rig=
# On the way out (a failed step, ^C): the rig gets SIGTERM too, the stop under test, and 30 s.
stop_rig() {
	[ -z "$rig" ] || stop_pid "$rig" 30
	rig=
}
trap 'stop_rig; rm -rf "$out"' EXIT

# The token of the newest link testbed that is not in $1 (the namespaces before the run; the
# calibration's testbed goes before the measuring one comes), or nothing.
new_token() {
	ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E '^tslM-[0-9a-f]+$' |
		grep -vxF -f <(printf '%s\n' $1) | head -n 1 | sed 's/^tslM-//'
}
# left TOKEN: what of that testbed still exists ("" when nothing).
left() {
	local tok=$1 ns procs
	ns=$(ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^tsl[AMB]-$tok\$" | tr '\n' ' ')
	procs=$(pgrep -f "tlT-$tok" | tr '\n' ' ')
	echo "${ns:+namespaces $ns}${procs:+processes $procs}"
}

# stop_at NAME READY: start a --link --smoke run, wait (60 s at most) until READY TOKEN DIR
# succeeds, SIGTERM the rig, then check what is left.
stop_at() {
	local name=$1 ready=$2 before tok="" i rc dir="$out/$1" what got=0
	mkdir -p "$dir"
	before=$(ip netns list 2>/dev/null | awk '{ print $1 }')
	"$bin" bench --link --smoke --out "$dir" >"$dir/stdout.txt" 2>"$dir/stderr.txt" &
	rig=$!
	# The state seen is kept, not asked again: a short phase (a calibration on an idle
	# machine) may have ended between a second look and the first.
	for ((i = 0; i < 600; i++)); do
		tok=$(new_token "$before")
		if [ -n "$tok" ] && "$ready" "$tok" "$dir"; then got=1; break; fi
		kill -0 "$rig" 2>/dev/null || break
		sleep 0.1
	done
	if [ "$got" -ne 1 ]; then
		not_ok "$name" "the testbed never got there ($(tail -c 300 "$dir/stderr.txt"))"
		stop_rig
		return
	fi
	kill -TERM "$rig"
	for ((i = 0; i < 300; i++)); do kill -0 "$rig" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$rig" 2>/dev/null; then
		not_ok "$name" "the rig still runs 30 s after SIGTERM"
		kill -KILL "$rig"
	fi
	wait "$rig"
	rc=$?
	rig=
	# The testbed's own cleanup may still be finishing: 5 s at most.
	for ((i = 0; i < 50; i++)); do [ -z "$(left "$tok")" ] && break; sleep 0.1; done
	what=$(left "$tok")
	if [ -n "$what" ]; then
		not_ok "$name" "left behind: $what"
		# this test's own mess: gone before the next step
		for p in $(pgrep -f "tlT-$tok"); do kill -KILL "$p" 2>/dev/null; done
		for n in A M B; do ip netns del "tsl$n-$tok" 2>/dev/null; done
	else
		ok "$name" "exit $rc, testbed $tok gone"
	fi
}

# Calibrating: the delay line runs and the measuring testbed's log does not exist yet.
calibrating() { [ -n "$(pgrep -f "tlT-$1")" ] && [ ! -e "$2/work/linkbed-up.log" ]; }
# Up: the measuring testbed's log exists and its delay line runs.
bed_up() { [ -e "$2/work/linkbed-up.log" ] && [ -n "$(pgrep -f "tlT-$1")" ]; }

stop_at "SIGTERM while the line is calibrated: nothing left" calibrating
stop_at "SIGTERM with the measuring testbed up: nothing left" bed_up
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
