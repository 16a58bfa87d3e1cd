#!/usr/bin/env bash
# ab_stat.sh TWINSTACK — the A/B gate (`twinstack bench --ab`) without root, in about 2 s:
#  1. the statistics (bench/abstat.py) on synthetic pairs: identical noisy pairs are ok; every
#     candidate 15 % lower with a small spread is a REGRESSION; a 15 % drop with a huge spread
#     is ok, its tolerance exactly t(0.995, n-1) x se; 8 % better is IMPROVED; fewer than 3
#     complete pairs is INCOMPLETE; a gap never shifts a pair; a lower-is-better metric flips
#     the sign; the t table and the minimum effect;
#  2. an A/B subject's own binary reaches the command its child is started with
#     (bench/launch.py), under the names results.json uses (bench/subjects.py); the round
#     order; a subject that fails to start twice stops the run;
#  3. the report (bench/abreport.py): synthetic A/B results.json files redrawn with
#     --report-from: the verdict table leads report.md and is printed, exit 0 when nothing
#     regressed, 1 on a regression or a cell with fewer than 3 pairs, --ab-min-effect judges
#     again, a redraw of the redrawn file is the same;
#  4. the arguments: --ab with --ablation, --via, --link or --sniff, a missing base binary,
#     an --ab-throttle, --ab-min-effect, --ab-nice or --ab-pin out of range, or --ab-throttle
#     without --ab exit 2; --dry-run prints the plan; --help formats every option's text;
#  5. the CPU cgroup of --ab-throttle (bench/abcg.py) on a fake cgroup v2 root (a directory):
#     the cpu controller enabled in the root's subtree_control only when it was not, and then
#     disabled again once the group is gone; left enabled when it was before, when another
#     group of the root limits or weighs CPU, when another A/B run's group is there, and when
#     the kernel refuses (EBUSY), each time saying why.
# Exit 0 all passed, 1 a check failed.
set -uo pipefail
bin=${1:?usage: ab_stat.sh path/to/twinstack}
here=$(cd "$(dirname "$0")" && pwd)
bench=$here/../../bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fails=0

# ---- 1 and 2: the statistics and the subjects ----
python3 - "$bench" <<'PY' || fails=$((fails + 1))
import math, statistics, sys
sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = True
import abstat, subjects
from launch import Launcher
bad = 0
def check(name, ok, detail=""):
    global bad
    print(("ok - " if ok else "not ok - ") + name + (" (%s)" % detail if detail else ""))
    bad += not ok
base = {r: v for r, v in enumerate([20.0, 16.5, 18.2, 21.7, 17.1, 19.4], 1)}
noise = [0.02, -0.015, 0.01, -0.02, 0.005, -0.01]          # mean 0: the same code
same = {r: base[r] * math.exp(noise[r - 1]) for r in base}
v = abstat.judge(base, same)
check("identical code, noisy pairs: ok", v["verdict"] == "ok" and v["n"] == 6,
      "%s, change %+.2f %%, tol %.2f %%" % (v["verdict"], v["change_pct"], v["tol_pct"]))
check("small spread: the tolerance is the 5 % minimum effect",
      abs(v["tol_pct"] - 5.0) < 1e-9 and abs(v["tol_ln"] - math.log(1 / 0.95)) < 1e-12)
slow = {r: base[r] * 0.85 * math.exp(noise[r - 1]) for r in base}
v = abstat.judge(base, slow)
check("every candidate 15 % lower, small spread: REGRESSION", v["verdict"] == "REGRESSION",
      "%s, change %+.2f %%" % (v["verdict"], v["change_pct"]))
check("the mean paired change is the 15 % drop", abs(v["change_pct"] + 15.0) < 1.0,
      "%+.2f %%" % v["change_pct"])
wild = [0.35, -0.30, 0.25, -0.40, 0.30, -0.20]
slow_wild = {r: base[r] * 0.85 * math.exp(wild[r - 1]) for r in base}
v = abstat.judge(base, slow_wild)
d = [math.log(slow_wild[r] / base[r]) for r in sorted(base)]
want = 4.032 * statistics.stdev(d) / math.sqrt(6)            # t(0.995, 5) x se
check("15 % drop with a huge spread: ok (the tolerance widens)", v["verdict"] == "ok",
      "%s, change %+.1f %%, tol %.1f %%" % (v["verdict"], v["change_pct"], v["tol_pct"]))
check("its tolerance is t(0.995, n-1) x sd / sqrt(n)", abs(v["tol_ln"] - want) < 1e-12 and
      abs(v["tol_pct"] - (1 - math.exp(-want)) * 100) < 1e-9 and v["t"] == 4.032,
      "%.6f vs %.6f" % (v["tol_ln"], want))
# At the edges: a drop just past the 5 % floor and one just inside it; a widened tolerance
# (t x se = 0.8 of the drop) that the drop still exceeds.
v7 = abstat.judge(base, {r: base[r] * 0.93 * math.exp(noise[r - 1] / 4) for r in base})
v4 = abstat.judge(base, {r: base[r] * 0.96 * math.exp(noise[r - 1] / 4) for r in base})
check("7 % lower: REGRESSION; 4 % lower: ok (the 5 % floor)",
      (v7["verdict"], v4["verdict"]) == ("REGRESSION", "ok"), "%s, %s" % (v7["verdict"],
                                                                         v4["verdict"]))
k = 0.8 * 0.1625 / (4.032 * statistics.stdev(wild) / math.sqrt(6))
v = abstat.judge(base, {r: base[r] * math.exp(-0.1625 + k * wild[r - 1]) for r in base})
check("a 15 % drop beyond a widened tolerance: REGRESSION", v["verdict"] == "REGRESSION" and
      v["tol_ln"] > 0.1 and abs(v["tol_ln"] - 0.8 * 0.1625) < 1e-9,
      "%s, tol %.4f" % (v["verdict"], v["tol_ln"]))
fast = {r: base[r] * 1.08 * math.exp(noise[r - 1] / 2) for r in base}
v = abstat.judge(base, fast)
check("8 % better: IMPROVED", v["verdict"] == "IMPROVED", v["verdict"])
v = abstat.judge({1: 10.0, 2: 11.0, 3: 10.5}, {1: 9.0, 2: 9.5})
check("2 complete pairs: INCOMPLETE, not judged", v["verdict"] == "INCOMPLETE" and v["n"] == 2
      and v["tol_ln"] is None, v["verdict"])
v = abstat.judge({1: 10.0, 2: 11.0, 3: 10.5, 4: 12.0}, {1: 8.5, 3: 8.9, 4: 10.2, 5: 30.0})
check("a gap leaves the pair out, never shifts it", v["pairs"] == [[1, 10.0, 8.5],
      [3, 10.5, 8.9], [4, 12.0, 10.2]] and v["verdict"] == "REGRESSION", str(v["pairs"]))
lat = {r: 50.0 * math.exp(noise[r - 1]) for r in base}
v = abstat.judge(lat, {r: lat[r] * 1.15 for r in lat}, lower_is_better=True)
check("lower is better: 15 % more is a REGRESSION", v["verdict"] == "REGRESSION", v["verdict"])
check("t table: t(0.995) at 1, 5, 30 and above 30 degrees of freedom",
      (abstat.t995(1), abstat.t995(5), abstat.t995(30), abstat.t995(45)) ==
      (63.657, 4.032, 2.750, 2.750))
v = abstat.judge(base, slow, min_effect_pct=20.0)
check("--ab-min-effect 20: a 15 % drop is within it", v["verdict"] == "ok" and
      abs(v["tol_pct"] - 20.0) < 1e-9, "%s, tol %.2f %%" % (v["verdict"], v["tol_pct"]))

# An A/B subject is started from its own binary; the run's own binary otherwise.
class Spawned(Exception):
    pass
class Tb:
    tun = "tsbtX"
    ns_a = "tsbA-x"
    def spawn(self, ns, args, log, **kw):
        raise Spawned(args)
class Bin:
    path = "/run/binary/twinstack"
def argv0(subj):
    try:
        Launcher(Tb(), Bin(), "/nonexistent-dir", None).start_child(
            "run", "cfg.json", subj.slug, subj.binary)
    except Spawned as e:
        return e.args[0][0]
b = subjects.ab_subject("lwip", True, "base", "/old/twinstack")
c = subjects.ab_subject("lwip", True, "cand", "/new/twinstack")
check("A/B subjects: names, keys, labels", (b.label, b.key, c.label, c.key) == (
      "lwip base", ("lwip", "offload-base", 1), "lwip cand", ("lwip", "offload-cand", 1)))
check("A/B subjects: results.json's subject entry names the side and binary",
      b.to_json() == {"stack": "lwip", "io_mode": "offload-base", "queues": 1,
                      "label": "lwip base", "side": "base", "binary": "/old/twinstack"})
check("the base is started from its own binary", argv0(b) == "/old/twinstack", argv0(b))
s = subjects.stack_subject("system", True, label="system")
check("a stack without its own binary runs the run's", argv0(s) == "/run/binary/twinstack" and
      s.io_mode == "offload" and "side" not in s.to_json(), argv0(s))

# The schedule: base and candidate of a stack next to each other, the base first in odd rounds,
# the candidate first in even ones, the stacks in a fixed order; a subject that fails to start
# twice stops the run after that round.
import ab
subs = [subjects.ab_subject(st, True, sd, "/x/" + sd) for st in ("system", "lwip")
        for sd in ("base", "cand")]
order = [" ".join(s.stack[0] + s.side[0] for s in ab.round_order(["system", "lwip"], subs, r))
         for r in range(3)]
check("round order: sb sc lb lc / sc sb lc lb / sb sc lb lc",
      order == ["sb sc lb lc", "sc sb lc lb", "sb sc lb lc"], str(order))
class Plan:
    reps, stacks, subjects, throttle, cpus = 6, ["system", "lwip"], subs, 0, None
class Res:
    cur_round, failures = 0, []
    def fail(self, msg):
        self.failures.append(msg)
rig = ab.ABRig.__new__(ab.ABRig)
rig.plan, rig.results, rig.cg, ran = Plan(), Res(), None, []
rig.run_subject = lambda s: ran.append((rig.results.cur_round, s.label)) or s.side != "base" \
    or s.stack != "lwip"
rig.schedule()
check("a base that cannot start: the run stops after the round of its second failure",
      max(r for r, _ in ran) == 2 and len(ran) == 8 and len(rig.results.failures) == 1 and
      "lwip base failed to start twice: the run stopped after round 2" in
      rig.results.failures[0], "%d starts, %s" % (len(ran), rig.results.failures))
sys.exit(1 if bad else 0)
PY

# ---- 3 and 4: the report and the arguments ----
# One run of each kind goes through the binary (`twinstack bench` execs the rig); the rest
# call the rig's entry point in one Python process, the same code without a start per case.
base=$out/base-twinstack
cp "$bin" "$base"
python3 - "$bench" "$out" "$bin" "$base" <<'PY' || fails=$((fails + 1))
import contextlib, io, json, math, os, re, shutil, subprocess, sys
bench, d, binary, base = sys.argv[1:5]
sys.path.insert(0, bench)
sys.dont_write_bytecode = True
import rig
bad = 0
def check(name, ok, detail=""):
    global bad
    print(("ok - " if ok else "not ok - ") + name + (" (%s)" % detail if detail else ""))
    bad += not ok

def synth(path, kind):
    """A synthetic A/B run of 6 rounds; kind: same, slow (system up 15 % lower), short (lwip
    down: 2 complete pairs)."""
    noise = [0.02, -0.015, 0.01, -0.02, 0.005, -0.01]
    base_v = {("system", "up"): 20.0, ("system", "down"): 16.0, ("lwip", "up"): 12.0,
              ("lwip", "down"): 9.0}
    samples = []
    for (st, dr), v in base_v.items():
        for side in ("base", "cand"):
            vals = []
            for r in range(1, 7):
                x = v * (1 + 0.03 * (r % 3))
                if side == "cand":
                    x *= math.exp(noise[r - 1])
                    if kind == "slow" and (st, dr) == ("system", "up"):
                        x *= 0.85
                if kind == "short" and side == "cand" and (st, dr) == ("lwip", "down") and r > 2:
                    continue
                vals.append([r, x])
            samples.append({"key": [st, "offload-" + side, 1, "tcp_bulk", dr, 1,
                                    "throughput_gbps"], "values": vals})
            samples.append({"key": [st, "offload-" + side, 1, "tcp_bulk", dr, 1, "proxy_cpus"],
                            "values": [[r, 0.9] for r in range(1, 7)]})
    subjects = [{"stack": st, "io_mode": "offload-" + sd, "queues": 1, "label": st + " " + sd,
                 "side": sd, "binary": "/x/" + sd} for st in ("system", "lwip")
                for sd in ("base", "cand")]
    meta = {"schema": 2, "mode": "ab", "started_utc": "2026-12-03T00:00:00Z",
            "duration_s": 80.0, "repetitions": 6, "io_mode": "offload", "subjects": subjects,
            "bulk_cells": [["up", 1], ["down", 1]], "iperf3": {"seconds": 2, "omit": 1},
            "host": {"kernel": "synthetic", "cpus": 2, "machine": "x86_64"},
            "tcp_congestion": {"testbed": "reno", "host_default": "bbr"},
            "not_measured": [], "failures": [], "notes": [],
            "ab": {"base_binary": "/x/base", "cand_binary": "/x/cand", "quick": True,
                   "stacks": ["system", "lwip"], "cells": [["tcp_bulk", "up", 1],
                                                           ["tcp_bulk", "down", 1]],
                   "min_effect_pct": 5.0, "min_pairs": 3, "nice": -10,
                   "cpus": {"testbed": [0], "proxy": [1]}, "throttle_pct": None}}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    json.dump({"meta": meta, "samples": samples}, open(path, "w"))

def main(args):
    """The rig's entry point in this process: (exit code, stdout, stderr)."""
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        try:
            rc = rig.main(["--bin", binary] + args)
        except SystemExit as x:
            rc = x.code
    return rc, o.getvalue(), e.getvalue()

def via_binary(args):
    r = subprocess.run([binary, "bench"] + args, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr

def expect(args, want, run=main, what=None):
    rc, so, se = run(args)
    check("bench %s exits %d%s" % (what or " ".join(args), want,
                                   " (through the binary)" if run is via_binary else ""),
          rc == want, "exit %s: %s" % (rc, (se or so).strip()[-300:]) if rc != want else "")
    return so

# -- 3: the report
for kind in ("same", "slow", "short"):
    synth(os.path.join(d, kind, "results.json"), kind)
out = {}
out["slow"] = expect(["--report-from", os.path.join(d, "slow", "results.json")], 1,
                     via_binary, "--report-from a run with a 15 % drop")
out["same"] = expect(["--report-from", os.path.join(d, "same", "results.json")], 0,
                     what="--report-from a run of identical code")
out["short"] = expect(["--report-from", os.path.join(d, "short", "results.json")], 1,
                      what="--report-from a run with 2 pairs in one cell")
rep = open(os.path.join(d, "same", "report.md")).read()
lines = rep.splitlines()
check("report.md leads with the verdict table", lines[0] == "# twinstack A/B gate" and
      lines[2].startswith("| stack | cell | base median | candidate median | mean paired "
                          "change | ± tolerance | n | verdict |"), lines[2][:60])
check("a table row per stack and cell", sum(1 for l in lines if re.match(
      r"\| (system|lwip) \| tcp (up|down) x1 \| [0-9.]+ Gbit/s \| [0-9.]+ Gbit/s \| "
      r"[-+][0-9.]+ % \| 5\.0 % \| 6 \| ok \|$", l)) == 4)
check("report.md states the priority and the CPUs",
      "The testbed ran at nice -10, the proxy on CPU 1, the rest of the testbed on CPU 0." in rep)
check("stdout: the table and the summary", re.search(
      r"^system +tcp up x1 +20\.60 +20\.\d\d +[-+]\d\.\d % +5\.0 % +6 +ok$", out["same"], re.M)
      is not None and "ab: 4 cells: 0 regression, 0 improved, 4 ok, 0 incomplete: pass"
      in out["same"])
check("the 15 % drop: a REGRESSION row, the summary fails", re.search(
      r"^system +tcp up x1 .* -1[45]\.\d % +5\.0 % +6 +REGRESSION$", out["slow"], re.M)
      is not None and "1 regression" in out["slow"] and out["slow"].rstrip().endswith("FAIL"))
check("2 pairs: an INCOMPLETE row, the summary fails",
      re.search(r"^lwip +tcp down x1 .* n/a +n/a +2 +INCOMPLETE$", out["short"], re.M)
      is not None and "1 incomplete: FAIL" in out["short"])
j = json.load(open(os.path.join(d, "slow", "results.json")))
v = [r for r in j["verdicts"] if (r["stack"], r["cell"]) == ("system", "tcp up x1")]
check("results.json: the verdict rows with their pairs and rounds", len(j["verdicts"]) == 4
      and len(v) == 1 and v[0]["verdict"] == "REGRESSION" and len(v[0]["pairs"]) == 6
      and v[0]["pairs"][0][0] == 1 and "samples" in j and j["meta"]["mode"] == "ab")
os.makedirs(os.path.join(d, "again"))
shutil.copy(os.path.join(d, "slow", "results.json"), os.path.join(d, "again"))
rc, _, _ = main(["--report-from", os.path.join(d, "again", "results.json")])
same = [open(os.path.join(d, x, f)).read() for f in ("results.json", "report.md")
        for x in ("slow", "again")]
check("a redraw of the redrawn results.json is the same (exit 1 again)",
      rc == 1 and same[0] == same[1] and same[2] == same[3])
rc, so, _ = main(["--report-from", os.path.join(d, "again", "results.json"),
                  "--ab-min-effect", "20"])
check("--ab-min-effect 20 judges the run again: the 15 % drop is within it (exit 0)",
      rc == 0 and re.search(r"^system +tcp up x1 .* 20\.0 % +6 +ok$", so, re.M) is not None)

# -- 4: the arguments
so = expect(["--ab", base, "--quick", "--dry-run"], 0, via_binary)
check("the --ab plan names its subjects, cells, base, priority and CPUs",
      "\nsubjects: system base (system/offload-base/q1), system cand (system/offload-cand/q1)"
      in so and "\ncells: tcp up x1, tcp down x1; " in so and "\nbase: %s\n" % base in so
      and "\npriority: nice -10 for the testbed" in so and
      ("\nCPUs: the proxy on " in so) == (len(os.sched_getaffinity(0)) > 1))
so = expect(["--ab", base, "--dry-run"], 0)
check("the full --ab plan's cells",
      "\ncells: tcp up x1, tcp down x1, tcp up x16, tcp down x16, connrate; " in so)
so = expect(["--ab", base, "--quick", "--dry-run", "--ab-pin", "off", "--ab-nice", "0"], 0)
check("--ab-pin off, --ab-nice 0: neither in the plan", "CPUs:" not in so and
      "priority:" not in so)
expect(["--ab", base, "--ablation", "--dry-run"], 2, via_binary)
for args in (["--via", "socks5"], ["--link"], ["--sniff"], ["--ab-throttle", "0"],
             ["--ab-throttle", "95"], ["--ab-throttle", "x"], ["--ab-min-effect", "0"],
             ["--ab-nice", "21"], ["--ab-pin", "maybe"]):
    expect(["--ab", base] + args + ["--dry-run"], 2)
expect(["--ab", os.path.join(d, "no-such-binary"), "--dry-run"], 2)
expect(["--ab", d, "--dry-run"], 2, what="--ab DIRECTORY --dry-run")
expect(["--ab-throttle", "15", "--dry-run"], 2)
expect(["--ab", base, "--ab-cells", "up1,up2", "--dry-run"], 2)
expect(["--ab", base, "--ab-cells", "up1,up1", "--dry-run"], 2)
so = expect(["--ab", base, "--ab-cells", "connrate,up16", "--dry-run"], 0)
check("--ab-cells picks the cells, in its order", "\ncells: connrate, tcp up x16; " in so)
so = expect(["--ab", base, "--ab-cells", "up1,udp64", "--dry-run"], 0)
check("--ab-cells udp64: the UDP echo cell", "\ncells: tcp up x1, udp_echo_64B; " in so)
so = expect(["--ab", base, "--ab-cells", "down64,up64", "--dry-run"], 0)
check("--ab-cells down64,up64: the 64-stream bulk cells", "\ncells: tcp down x64, tcp up x64; " in so)
expect(["--report-from", os.path.join(d, "slow", "results.json"), "--ab", base], 2)
so = expect(["--help"], 0, what="--help (rig.py: every option's help formats)")
check("--help lists the A/B options with their percent signs",
      "--ab-throttle PCT" in so and "(100 - PCT)% of the CPU" in " ".join(so.split()))
so = expect(["--ab", base, "--ab-throttle", "15", "--quick", "--dry-run"], 0)
check("the plan names the injected slowdown",
      "injected slowdown (test aid): the candidate's proxy limited to 85 %" in so)
sys.exit(1 if bad else 0)
PY

# ---- 5. the cgroup's controller, on a fake cgroup v2 root ----
# A directory stands in for /sys/fs/cgroup: the test plays the kernel's part where a plain
# directory cannot (a write of "+cpu" reads back as "cpu"; a group whose interface files are
# the kernel's is removed with them).
python3 - "$bench" "$out/cg" <<'PY' || fails=$((fails + 1))
import errno, os, shutil, sys
sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = True
import abcg
base = sys.argv[2]
bad = 0
def check(name, ok, detail=""):
    global bad
    print(("ok - " if ok else "not ok - ") + name + (" (%s)" % detail if detail else ""))
    bad += not ok

def cgroup_rmdir(path, real=os.rmdir):
    if path.startswith(base):
        for f in os.listdir(path):
            os.unlink(os.path.join(path, f))
    real(path)
abcg.os.rmdir = cgroup_rmdir

def fake_root(name, subtree, siblings=()):
    root = os.path.join(base, name)
    os.makedirs(root)
    with open(os.path.join(root, "cgroup.controllers"), "w") as f:
        f.write("cpuset cpu io memory pids\n")
    with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
        f.write(subtree + "\n")
    for sib, files in siblings:
        os.makedirs(os.path.join(root, sib))
        for k, v in files.items():
            with open(os.path.join(root, sib, k), "w") as f:
                f.write(v + "\n")
    return root

def subtree(root):
    with open(os.path.join(root, "cgroup.subtree_control")) as f:
        return f.read().strip()

def one_run(name, before, siblings=(), kernel_ok=True):
    """A group made and removed on a fake root; returns (root, what was written, log)."""
    root = fake_root(name, before, siblings)
    logged = []
    cg = abcg.CpuLimit("t" + name, root=root, log=logged.append)
    written = subtree(root)
    if written == "+cpu":
        with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
            f.write("cpu\n")          # what the kernel shows after "+cpu"
    cg.limit(0.5)
    with open(os.path.join(cg.path, "cgroup.procs"), "w") as f:
        f.write("")
    path = cg.path
    real_write = abcg._write
    if not kernel_ok:
        def busy(p, v):
            if p.endswith("cgroup.subtree_control") and str(v) == "-cpu":
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
            real_write(p, v)
        abcg._write = busy
    try:
        cg.remove()
        cg.remove()                     # a second removal (a signal after the finally) is a no-op
    finally:
        abcg._write = real_write
    check("%s: the group is gone" % name, not os.path.exists(path))
    return root, written, logged

plain = {"cpu.max": "max 100000", "cpu.weight": "100", "cgroup.subtree_control": ""}
root, written, logged = one_run("off-before", "memory pids", [("system.slice", plain)])
check("cpu off before: enabled for the group", written == "+cpu", written)
check("cpu off before: disabled again once the group is gone", subtree(root) == "-cpu",
      "%s; %s" % (subtree(root), logged))

root, written, logged = one_run("on-before", "cpu memory pids")
check("cpu on before: never written, left on", written == "cpu memory pids" and
      subtree(root) == "cpu memory pids", subtree(root))

limited = dict(plain, **{"cpu.max": "50000 100000"})
root, written, logged = one_run("limited", "", [("system.slice", limited)])
check("another group with a CPU limit: left on, saying why", subtree(root) == "cpu" and
      any("system.slice" in m for m in logged), "%s; %s" % (subtree(root), logged))

weighed = dict(plain, **{"cpu.weight": "200"})
root, written, logged = one_run("weighed", "", [("user.slice", weighed)])
check("another group with a CPU weight: left on, saying why", subtree(root) == "cpu" and
      any("user.slice" in m for m in logged), "%s; %s" % (subtree(root), logged))

root, written, logged = one_run("two-runs", "", [("tsab-0a0b0c", plain)])
check("another A/B run's group: left on, saying why", subtree(root) == "cpu" and
      any("tsab-0a0b0c" in m for m in logged), "%s; %s" % (subtree(root), logged))

root, written, logged = one_run("busy", "", [("system.slice", plain)], kernel_ok=False)
check("the kernel refuses (EBUSY): left on, saying so", subtree(root) == "cpu" and
      any("cpu" in m and os.strerror(errno.EBUSY) in m for m in logged),
      "%s; %s" % (subtree(root), logged))
sys.exit(1 if bad else 0)
PY
[ "$fails" -eq 0 ]
