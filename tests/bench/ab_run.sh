#!/usr/bin/env bash
# ab_run.sh TWINSTACK — the A/B gate for real, as root:
#  1. the CPU cgroup of --ab-throttle (bench/abcg.py): a busy loop moved into a per-run group
#     limited to 0.2 CPUs uses 0.05-0.35 CPUs over a second, and the group is gone afterwards;
#  2. a tiny A/B run of the same code (the base a copy of the binary): `twinstack bench --ab
#     COPY --quick --ab-cells up1 --stacks system --reps 3 --bulk-seconds 1` (one cell: each
#     cell costs 6 iperf3 runs here) must exit 0 with its verdict row (3 complete pairs,
#     throughput > 0 on both sides, not a regression), the base started from the copy, the
#     proxies pinned and reniced as the plan says, and leave no namespace behind.
# Exit 77 = skipped (not root, no /dev/net/tun or no iperf3), 0 = passed, 1 = a check failed.
set -uo pipefail
bin=${1:?usage: ab_run.sh path/to/twinstack}
here=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" -eq 0 ] && [ -c /dev/net/tun ] && command -v iperf3 >/dev/null ||
	{ echo "ab_run: needs root, /dev/net/tun and iperf3: skipped"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fails=0

# ---- 1. the cgroup ----
python3 - "$here/../../bench" <<'PY' || fails=$((fails + 1))
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = True
import abcg
from rigtb import proc_cpu
try:
    cg = abcg.CpuLimit(os.urandom(3).hex())
except abcg.CgroupError as e:
    print("# no CPU cgroup here (%s): the throttle check skipped" % e)
    sys.exit(0)
p = subprocess.Popen(["sh", "-c", "while :; do :; done"])
bad = 0
try:
    cg.limit(0.2)
    cg.add(p.pid)
    time.sleep(0.2)
    c0, t0 = proc_cpu(p.pid), time.monotonic()
    time.sleep(1.0)
    c1, t1 = proc_cpu(p.pid), time.monotonic()
    cpus = (sum(c1) - sum(c0)) / (t1 - t0)
    ok = 0.05 <= cpus <= 0.35
    print(("ok - " if ok else "not ok - ") + "a busy loop in the group limited to 0.2 CPUs "
          "used %.2f (%s)" % (cpus, cg.kind))
    bad += not ok
finally:
    p.kill()
    p.wait()
    path = cg.path
    cg.remove()
ok = not os.path.exists(path)
print(("ok - " if ok else "not ok - ") + "the group is removed (%s)" % path)
bad += not ok
sys.exit(1 if bad else 0)
PY

# ---- 2. a tiny A/B run of the same code ----
base=$out/base-twinstack
cp "$bin" "$base"
t0=$(date +%s)
"$bin" bench --ab "$base" --quick --ab-cells up1 --stacks system --reps 3 --bulk-seconds 1 \
	--out "$out/ab" >"$out/stdout.txt" 2>"$out/stderr.txt"
rc=$?
echo "# the A/B run took $(($(date +%s) - t0)) s"
if [ "$rc" -ne 0 ]; then
	tail -n 20 "$out/stderr.txt" | sed 's/^/# /'
	sed 's/^/# /' "$out/stdout.txt" | tail -n 8
	echo "not ok - bench --ab COPY --quick --ab-cells up1 --stacks system --reps 3 exited $rc"
	exit 1
fi
echo "ok - bench --ab COPY --quick --ab-cells up1 --stacks system --reps 3 exits 0"
python3 - "$out/ab" "$base" <<'PY' || fails=$((fails + 1))
import json, os, sys
d, base = sys.argv[1], sys.argv[2]
j = json.load(open(os.path.join(d, "results.json")))
bad = 0
def check(name, ok, detail=""):
    global bad
    print(("ok - " if ok else "not ok - ") + name + (" (%s)" % detail if detail else ""))
    bad += not ok
v = {(r["stack"], r["cell"]): r for r in j["verdicts"]}
check("one verdict row, for the cell asked for", sorted(v) == [("system", "tcp up x1")],
      str(sorted(v)))
for k, r in sorted(v.items()):
    check("%s %s: 3 pairs, both sides > 0, not a regression" % k, r["n"] == 3 and
          r["base_median"] > 0 and r["cand_median"] > 0 and r["verdict"] in ("ok", "IMPROVED"),
          "base %.2f, cand %.2f Gbit/s, change %+.1f %%, tol %.1f %%, %s" % (
              r["base_median"], r["cand_median"], r["change_pct"], r["tol_pct"], r["verdict"]))
samples = {tuple(s["key"]): [v for _, v in s["values"]] for s in j["samples"]}
for side in ("base", "cand"):
    k = ("system", "offload-" + side, 1, "run", None, None)
    check("%s: each proxy read back at nice -10 and on its own CPUs" % side,
          samples.get(k + ("proxy_nice",)) == [-10.0] * 3 and
          (samples.get(k + ("proxy_pinned",)) == [1.0] * 3 or
           len(os.sched_getaffinity(0)) < 2),
          "nice %s, pinned %s" % (samples.get(k + ("proxy_nice",)),
                                  samples.get(k + ("proxy_pinned",))))
sides = {s["side"]: s for s in j["meta"]["subjects"]}
check("the base ran from the copy", sides["base"]["binary"] == base and
      j["meta"]["ab"]["base_binary"] == base, sides["base"]["binary"])
rep = open(os.path.join(d, "report.md")).read()
check("report.md leads with the verdict table", rep.startswith("# twinstack A/B gate\n\n| stack "))
sys.exit(1 if bad else 0)
PY
grep -q "^ab: 1 cell: 0 regression, .* 0 incomplete: pass$" "$out/stdout.txt" &&
	echo "ok - the table's summary line on stdout" ||
	{ echo "not ok - the summary line on stdout"; fails=$((fails + 1)); }
re='.*building the testbed (namespaces \(tsbA-[0-9a-f]*\), \(tsbB-[0-9a-f]*\)).*'
ns=$(sed -n "s/$re/\\1 \\2/p" "$out/stderr.txt" | head -n 1)
if [ -n "$ns" ] && ! ip netns list | grep -Eq "^(${ns// /|})( |$)"; then
	echo "ok - its namespaces ($ns) are gone"
else
	echo "not ok - the run's namespaces: '$ns' (not named, or left behind)"
	fails=$((fails + 1))
fi
[ "$fails" -eq 0 ]
