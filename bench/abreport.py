"""abreport.py — the report of an A/B run (`twinstack bench --ab`, bench/ab.py): the verdict
of every stack and cell (bench/abstat.py) from the run's samples, the table on stdout,
report.md (the table first) and results.json (meta, the verdict rows, the usual per-subject
rows and every sample with its round, so the pairs can be recomputed). It reads nothing but
what results.json holds: the report written at the end of a run and a `--report-from` redraw
of its results.json are the same.

Python 3 standard library only.
"""

import json
import math
import os
import statistics

import abstat
from report import UNITS, cc_text, fmt, out, summary

# What each cell's verdict is judged on, and whether lower is better.
CELL_METRIC = {"tcp_bulk": ("throughput_gbps", False), "connrate": ("conn_per_s", False),
               "udp_echo_64B": ("pps", False)}


def cell_name(wl, d, n):
    if wl == "tcp_bulk":
        return "tcp %s x%d" % (d, n)
    return wl


def side_keys(meta):
    """{stack: {"base": (stack, io_mode, queues), "cand": ...}} from meta.subjects."""
    keys = {}
    for s in meta["subjects"]:
        if s.get("side") in ("base", "cand"):
            keys.setdefault(s["stack"], {})[s["side"]] = (s["stack"], s["io_mode"],
                                                         s.get("queues", 1))
    return keys


def by_round(samples, key):
    return {int(r): v for r, v in samples.get(key, [])}


def paired_change_pct(base, cand):
    """The mean paired change in percent (e^mean ln(cand/base) - 1), or None."""
    pr = abstat.pairs(base, cand)
    if not pr:
        return None
    return (math.exp(statistics.fmean(math.log(c / b) for _, b, c in pr)) - 1.0) * 100.0


def verdicts(meta, samples):
    """One row per stack and cell: the judged figures, plus the CPU the proxy used on each side
    and (throttled runs) the CPU the candidate was allowed."""
    ab = meta["ab"]
    rows = []
    for stack, k in sorted(side_keys(meta).items(), key=lambda x: ab["stacks"].index(x[0])):
        for wl, d, n in ab["cells"]:
            metric, lower = CELL_METRIC[wl]
            tail = (wl, d, n)
            base = by_round(samples, k["base"] + tail + (metric,))
            cand = by_round(samples, k["cand"] + tail + (metric,))
            v = abstat.judge(base, cand, ab["min_effect_pct"], lower)
            cb = by_round(samples, k["base"] + tail + ("proxy_cpus",))
            cc = by_round(samples, k["cand"] + tail + ("proxy_cpus",))
            quota = by_round(samples, k["cand"] + tail + ("throttle_cpus",))
            row = {"stack": stack, "workload": wl, "direction": d, "streams": n,
                   "metric": metric, "unit": UNITS.get(metric, ""), "cell": cell_name(wl, d, n)}
            row.update(v)
            row.update({"base_cpus": statistics.median(cb.values()) if cb else None,
                        "cand_cpus": statistics.median(cc.values()) if cc else None,
                        "cpu_change_pct": paired_change_pct(cb, cc),
                        "quota_cpus": statistics.median(quota.values()) if quota else None})
            rows.append(row)
    return rows


def exit_code(rows):
    """1 when any cell regressed or could not be judged, else 0."""
    return 1 if any(r["verdict"] in ("REGRESSION", "INCOMPLETE") for r in rows) else 0


def summary_line(rows):
    c = {v: sum(1 for r in rows if r["verdict"] == v)
         for v in ("REGRESSION", "IMPROVED", "ok", "INCOMPLETE")}
    return "ab: %d cell%s: %d regression, %d improved, %d ok, %d incomplete: %s" % (
        len(rows), "" if len(rows) == 1 else "s", c["REGRESSION"], c["IMPROVED"], c["ok"], c["INCOMPLETE"],
        "FAIL" if exit_code(rows) else "pass")


def fv(v, metric):
    if v is None:
        return "n/a"
    return "%.0f" % v if metric == "conn_per_s" else "%.2f" % v


def fpct(v, signed=True):
    if v is None:
        return "n/a"
    return ("%+.1f %%" if signed else "%.1f %%") % v


def table(rows):
    """The verdict table as text lines (stdout)."""
    L = ["%-7s %-13s %12s %12s %9s %8s %3s  %s" % ("stack", "cell", "base", "cand", "change",
                                                   "±tol", "n", "verdict")]
    for r in rows:
        L.append("%-7s %-13s %12s %12s %9s %8s %3d  %s" % (
            r["stack"], r["cell"], fv(r["base_median"], r["metric"]),
            fv(r["cand_median"], r["metric"]), fpct(r["change_pct"]),
            fpct(r["tol_pct"], False), r["n"], r["verdict"]))
    return L


def markdown(meta, rows):
    ab = meta["ab"]
    L = ["# twinstack A/B gate", ""]
    L.append("| stack | cell | base median | candidate median | mean paired change | "
             "± tolerance | n | verdict |")
    L.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        u = " " + r["unit"] if r["unit"] else ""
        L.append("| %s | %s | %s%s | %s%s | %s | %s | %d | %s |" % (
            r["stack"], r["cell"], fv(r["base_median"], r["metric"]), u,
            fv(r["cand_median"], r["metric"]), u, fpct(r["change_pct"]),
            fpct(r["tol_pct"], False), r["n"], r["verdict"]))
    L += ["", summary_line(rows), ""]
    L.append("Base `%s`, candidate `%s`; %s, %s, %d rounds, %.0f s, io_mode %s, kernel %s, "
             "%d CPUs, %s." % (ab["base_binary"], ab["cand_binary"], meta["started_utc"],
                               "quick" if ab["quick"] else "full", meta["repetitions"],
                               meta["duration_s"], meta["io_mode"], meta["host"]["kernel"],
                               meta["host"]["cpus"], cc_text(meta)))
    L.append("")
    cpus = ab.get("cpus")
    where = "the proxy on CPU %s, the rest of the testbed on CPU %s" % (
        ",".join(map(str, cpus["proxy"])), ",".join(map(str, cpus["testbed"]))) \
        if cpus else "every process on every CPU"
    L.append("Method: in each round each subject is started fresh, runs every cell and is "
             "stopped; base and candidate of a stack run next to each other and alternate "
             "which runs first (round 1 base first). The testbed ran at nice %s, %s. Per cell "
             "and round d = ln(candidate / base); n complete pairs, mean m, sample sd s, se = "
             "s / sqrt(n); tolerance = max(min effect %.1f %%, t(0.995, n-1) x se); "
             "REGRESSION if m < -tolerance, IMPROVED if m > tolerance; fewer than %d pairs: "
             "INCOMPLETE (the run fails). Change: e^m - 1 (+ is better); tolerance shown as "
             "the drop it stands for, 1 - e^-tol. TCP bulk: iperf3 -t %d -O %d -i %g, the "
             "median of the interval sums after the warm-up." % (
                 ab.get("nice", 0), where, ab["min_effect_pct"], abstat.MIN_PAIRS,
                 meta["iperf3"]["seconds"], meta["iperf3"]["omit"],
                 ab.get("iperf3_interval_s") or 1))
    if ab.get("throttle_pct"):
        L += ["", "**Injected slowdown (a test aid)**: the candidate's proxy process ran in %s "
              "(%s, period %d µs) with a quota of %.0f %% of the CPU the base used in the same "
              "cell (CPU seconds per wall second; the same round when the base ran first, else "
              "the previous round). The achieved slowdown is each cell's mean paired change." % (
                  ab.get("cgroup") or "a CPU cgroup", ab.get("cgroup_kind") or "?",
                  ab.get("period_us") or 0, 100 - ab["throttle_pct"])]
    L += ["", "## Proxy CPU per cell", "",
          "CPUs busy = the proxy's CPU seconds (utime + stime) per wall second of the cell, "
          "median over the rounds; change = mean paired change of the candidate's.", "",
          "| stack | cell | base CPUs | candidate CPUs | change | quota (CPUs) |",
          "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        L.append("| %s | %s | %s | %s | %s | %s |" % (
            r["stack"], r["cell"], fmt(r["base_cpus"]), fmt(r["cand_cpus"]),
            fpct(r["cpu_change_pct"]), fmt(r["quota_cpus"]) if r["quota_cpus"] else "-"))
    L += ["", "## Pairs", "", "| stack | cell | round | base | candidate | ln(c/b) |",
          "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        for rnd, b, c in r["pairs"]:
            L.append("| %s | %s | %d | %s | %s | %+.4f |" % (
                r["stack"], r["cell"], rnd, fv(b, r["metric"]), fv(c, r["metric"]),
                math.log(c / b)))
    if meta["failures"]:
        L += ["", "## Failures", ""] + ["- " + f for f in meta["failures"]]
    if meta["notes"]:
        L += ["", "## Notes", ""] + ["- " + n for n in meta["notes"]]
    L.append("")
    return "\n".join(L)


def plain_rows(samples):
    """results.json's usual rows (median, min, max, n per key) of the raw samples."""
    rows = []
    for k in sorted(samples, key=lambda k: tuple("" if x is None else str(x) for x in k)):
        st = summary([v for _, v in samples[k]])
        stack, io, q, wl, d, n, metric = k
        rows.append({"stack": stack, "io_mode": io, "queues": q, "workload": wl,
                     "direction": d, "streams": n, "metric": metric,
                     "unit": UNITS.get(metric, ""), "median": st[0], "min": st[1],
                     "max": st[2], "n": st[3]})
    return rows


def write(out_dir, meta, samples):
    """Judge every cell, print the table, write report.md and results.json into out_dir.
    Returns the verdict rows."""
    rows = verdicts(meta, samples)
    for line in table(rows) + [summary_line(rows)]:
        out(line)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(markdown(meta, rows))
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "verdicts": rows, "rows": plain_rows(samples),
                   "samples": [{"key": list(k), "values": v} for k, v in samples.items()]},
                  f, indent=1)
    return rows


def load(path, data):
    """(meta, samples) of an earlier A/B run's results.json; KeyError/TypeError/ValueError
    when it is not one."""
    meta = data["meta"]
    if meta.get("mode") != "ab" or not isinstance(meta.get("ab"), dict):
        raise ValueError("%s: not an A/B run (meta.mode, meta.ab)" % path)
    meta["ab"]["cells"] = [tuple(c) for c in meta["ab"]["cells"]]
    for c in meta["ab"]["cells"]:
        if c[0] not in CELL_METRIC:
            raise ValueError("%s: unknown A/B cell workload %r" % (path, c[0]))
    samples = {}
    for s in data["samples"]:
        samples[tuple(s["key"])] = [[int(r), float(v)] for r, v in s["values"]]
    if len(side_keys(meta)) == 0:
        raise ValueError("%s: no base/cand subjects in meta.subjects" % path)
    return meta, samples
