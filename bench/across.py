"""across.py — the targets of several runs side by side (`twinstack bench --across FILE...`).

A figure near its line passes in one run and misses in the next on a shared 2-CPU machine, so
one run's PASS/MISS lines say little about such a target. This reads the `meta.targets` of
several results.json of one kind (full, --via socks5 or --ablation runs; --report-from
redraws any of them first if they predate a target) and writes, per target: how many runs
passed it, its lowest and highest figure as the reports show them, and every run's figure in
the order given. No root, no testbed: it only reads files.
"""
import json
import os

from rigtb import CannotRun
from report import out

MODES = ("full", "socks5", "ablation")


def load(path):
    """(started, mode, targets) of one results.json (or of DIR/results.json, for a run's output
    directory), or CannotRun naming the file."""
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise CannotRun("--across %s: %s" % (path, e))
    meta = data.get("meta") if isinstance(data, dict) else None
    if not isinstance(meta, dict) or meta.get("mode") not in MODES:
        raise CannotRun("--across %s: not the results.json of a full, --via socks5 or "
                        "--ablation run (meta.mode)" % path)
    targets = meta.get("targets")
    if not isinstance(targets, list) or not targets or not all(
            isinstance(t, dict) and isinstance(t.get("what"), str) and
            t.get("verdict") in ("PASS", "MISS", "N/A") for t in targets):
        raise CannotRun("--across %s: no targets (meta.targets): redraw it with --report-from "
                        "first" % path)
    return meta.get("started_utc", "?"), meta["mode"], targets


def table(runs):
    """The markdown lines for runs [(started, mode, targets)], targets in first-seen order."""
    order, seen = [], {}
    for i, (_, _, targets) in enumerate(runs):
        for t in targets:
            if t["what"] not in seen:
                seen[t["what"]] = {}
                order.append(t["what"])
            seen[t["what"]][i] = t
    n = len(runs)
    L = ["# Targets across %d runs" % n, "",
         "Runs, in the order given: " + ", ".join("%d. %s" % (i + 1, r[0])
                                                  for i, r in enumerate(runs)) + ".", "",
         "| target | line | passed | lowest | highest | per run |",
         "| --- | --- | --- | --- | --- | --- |"]
    for what in order:
        per = seen[what]
        have = [per[i] for i in sorted(per)]
        measured = [t for t in have if t["verdict"] != "N/A" and
                    isinstance(t.get("value"), (int, float))]
        lo = min(measured, key=lambda t: t["value"]) if measured else None
        hi = max(measured, key=lambda t: t["value"]) if measured else None
        cells = []
        for i in range(n):
            t = per.get(i)
            cells.append("—" if t is None else "%s %s" % (
                t.get("shown", "?"), {"PASS": "P", "MISS": "M"}.get(t["verdict"], "n/a")))
        passed = sum(1 for t in have if t["verdict"] == "PASS")
        L.append("| %s | %s | %d of %d | %s | %s | %s |" % (
            what, have[0].get("target", "?"), passed, len(have),
            lo.get("shown", "?") if lo else "—", hi.get("shown", "?") if hi else "—",
            " · ".join(cells)))
    L.append("")
    totals = []
    for i, (_, _, targets) in enumerate(runs):
        p = sum(1 for t in targets if t["verdict"] == "PASS")
        totals.append("%d. %d of %d" % (i + 1, p, len(targets)))
    L.append("Passed per run: " + ", ".join(totals) + ".")
    return L


def main(a):
    runs = [load(p) for p in a.across]
    modes = sorted({r[1] for r in runs})
    if len(modes) > 1:
        raise CannotRun("--across: the runs are of different kinds (%s); compare runs of one "
                        "kind" % ", ".join(modes))
    L = table(runs)
    for line in L:
        out(line)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "across.md"), "w") as f:
            f.write("\n".join(L) + "\n")
    return 0
