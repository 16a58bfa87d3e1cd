#!/usr/bin/env bash
# smoke.sh TWINSTACK — a quick bench run (`twinstack bench --quick`): every stack and baseline
# must produce sane figures (throughput > 0, RSS > 0, connections held and answered); the ratios
# are printed, never judged (this machine is shared and noisy). Exit 77 = skipped (not root or
# no /dev/net/tun), 0 = sane, 1 = a subject produced no or absurd figures.
set -uo pipefail
bin=${1:?usage: smoke.sh path/to/twinstack}
[ "$(id -u)" -eq 0 ] && [ -c /dev/net/tun ] || { echo "smoke: needs root and /dev/net/tun: skipped"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bin" bench --quick --no-micro --out "$out" >"$out/stdout.txt" 2>"$out/stderr.txt"
rc=$?
if [ "$rc" -ne 0 ]; then
	tail -n 30 "$out/stderr.txt"
	echo "smoke: twinstack bench --quick exited $rc"
	exit 1
fi
python3 - "$out/results.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
def get(stack, metric, workload=None, streams=None):
    return [r for r in rows if r["stack"] == stack and r["metric"] == metric
            and (workload is None or r["workload"] == workload)
            and (streams is None or r["streams"] == streams)]
passed = failed = 0
def check(name, ok, detail):
    global passed, failed
    print(("ok - " if ok else "not ok - ") + name + " (" + detail + ")")
    if ok: passed += 1
    else: failed += 1
for s in ("veth", "reflector", "system", "lwip"):
    t = get(s, "throughput_gbps", streams=1)
    check(f"{s}: 1-stream throughput", bool(t) and 0 < t[0]["median"] < 1000,
          f"{t[0]['median']:.2f} Gbit/s" if t else "missing")
for s in ("system", "lwip"):
    r = get(s, "peak_rss_kb")
    check(f"{s}: peak RSS", bool(r) and 100 < r[0]["median"] < 4_000_000,
          f"{r[0]['median']:.0f} KiB" if r else "missing")
    c = get(s, "conn_per_s")
    check(f"{s}: connection rate", bool(c) and c[0]["median"] > 0,
          f"{c[0]['median']:.0f}/s" if c else "missing")
    f = get(s, "ceiling_fraction", streams=1)
    print(f"# {s}: fraction of the two-hop ceiling at 1 stream: "
          + (f"{f[0]['median']:.2f}" if f else "n/a") + " (reported, not judged)")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
