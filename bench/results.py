"""results.py — the samples of one run of the comparison rig and what goes around them: the
live table on stdout, what could not be measured, the failures and notes; results.json's meta
(the plan, the host, the congestion control, the SOCKS5 server) handed with the samples to
bench/report.py, which writes results.json, report.md and the charts; and, for --report-from,
the same read back from an earlier run's results.json.

Python 3 standard library only.
"""

import os
import platform
import re
import subprocess

from report import UNITS, Report, fmt, log, note_once, out
from rigtb import B_VETH4, DANTED, GW4, MIRROR4, S5_PORT, TARGET4, CannotRun
from subjects import Subject


class Results:
    """Samples keyed (stack, io_mode, queues, workload, direction, streams, metric) ->
    [[round, value], ...]; cur_round is the round the next sample belongs to."""

    def __init__(self):
        self.samples = {}
        self.na = []            # (subject, workload, reason)
        self.failures = []
        self.notes = []
        self.cur_round = 0
        self.host_meta = None   # --report-from: the host of the earlier run
        self.cc_from = None     # --report-from: the earlier run's congestion control
        self.socks5_from = None  # --report-from: the earlier run's SOCKS5 server

    def add(self, subj, workload, direction, streams, metric, value):
        if value is None:
            return
        key = subj.key + (workload, direction, streams, metric)
        self.samples.setdefault(key, []).append([self.cur_round, float(value)])

    def note_na(self, subject, workload, reason):
        if (subject, workload, reason) not in self.na:
            self.na.append((subject, workload, reason))
            out("%-20s %-16s %-5s %4s  %-20s %s" % (subject, workload, "", "", "n/a", reason))

    def emit(self, subj, workload, direction, streams, metric, value, extra=""):
        """Record a sample and print its row of the live table."""
        self.add(subj, workload, direction, streams, metric, value)
        out("%-20s %-16s %-5s %4s  %-20s %10s %s%s" % (
            subj.label, workload, direction or "", "" if streams is None else streams, metric,
            fmt(value), UNITS.get(metric, ""), ("  " + extra) if extra else ""))

    def fail(self, msg):
        self.failures.append(msg)
        log("FAILED: " + msg)

    def note_once(self, msg):
        note_once(self.notes, msg)

    # -- results.json
    def meta(self, plan, started_utc, duration, host_cc=None):
        """results.json's meta: this run's plan, what it could not measure, its failures and
        notes (the report adds the targets). host_cc: the testbed's inherited default."""
        meta = {
            "schema": 2, "tool": "twinstack bench (bench/rig.py)", "binary": plan.bin,
            "started_utc": started_utc, "duration_s": round(duration, 1), "mode": plan.mode,
            "repetitions": plan.reps, "subjects": [s.to_json() for s in plan.subjects],
            "io_mode": "per-packet,offload" if plan.ablation else plan.io_mode,
            "queues": sorted({s.queues for s in plan.subjects}) if plan.ablation else 1,
            "ceiling_io_mode": plan.ceiling_ref.io_mode if plan.ceiling_ref else None,
            "bulk_cells": [[d, n] for d, n in plan.bulk_cells],
            "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                     "machine": platform.machine()},
            "iperf3": {"seconds": plan.bulk_t, "omit": plan.bulk_omit},
            "tcp_congestion": self.cc_meta(plan, host_cc),
            "idle_wakeup_window_s": plan.idle_s, "hold_conns": plan.hold_conns,
            "hold_conns_scale": plan.hold_scale,
            "load_seconds": plan.load_s,
            "not_measured": [{"subject": s, "workload": w, "reason": r} for s, w, r in self.na],
            "failures": self.failures, "notes": self.notes,
        }
        if plan.smoke:
            meta["smoke"] = True    # the test suite's sanity run: not for comparison
        if plan.ablation:
            meta.update({"time_limit_s": plan.time_limit, "estimate_s": round(plan.estimate_s())})
        if plan.via:
            meta["socks5"] = self.socks5_meta(plan)
        if self.host_meta:
            meta["host"] = self.host_meta
        return meta

    def socks5_meta(self, plan):
        if plan.report_from:
            return self.socks5_from
        ver = None
        try:
            r = subprocess.run([DANTED, "-v"], capture_output=True, text=True, timeout=5)
            m = re.search(r"Dante v(\d+(?:\.\d+)*)", r.stdout + r.stderr)
            ver = m.group(1) if m else None
        except (OSError, subprocess.TimeoutExpired):
            pass
        return {"server": "danted %s" % (ver or "?"), "address": "%s:%d" % (B_VETH4, S5_PORT),
                "tcp_client": "proxychains4 -q -f FILE iperf3",
                "udp_client": "twinstack load udp --socks5", "udp_size": 64,
                "udp_seconds": plan.load_s}

    def cc_meta(self, plan, host_cc):
        if plan.report_from:
            return self.cc_from
        return {"testbed": host_cc if plan.cc == "host" else plan.cc, "host_default": host_cc}

    def finish(self, plan, started_utc, duration, host_cc=None):
        """Write results.json, report.md and the charts into plan.out (bench/report.py)."""
        Report(plan.out, self.meta(plan, started_utc, duration, host_cc), self.samples,
               (GW4, MIRROR4, TARGET4)).write()

    # -- --report-from: the report of an earlier run, from its results.json
    def load(self, plan, data, path):
        """Take the samples, failures and notes of an earlier run's results.json (data, read
        from path) and its recorded plan into plan. Returns its meta."""
        meta = data.get("meta") or {}
        if "samples" not in data or "subjects" not in meta or "bulk_cells" not in meta:
            raise CannotRun("%s: no samples/meta.subjects/meta.bulk_cells (written by an older "
                            "rig; rerun the bench)" % path)
        plan.subjects = []
        for s in meta["subjects"]:
            plan.subjects.append(Subject.recorded(s["stack"], s["io_mode"], s.get("queues", 1),
                                                  s.get("label")))
        plan.veth = next((s for s in plan.subjects if s.stack == "veth"), None)
        plan.ceiling_ref = next((s for s in plan.subjects if s.stack == "reflector" and
                                 s.io_mode == meta.get("ceiling_io_mode", "offload")), None)
        if plan.mode in ("full", "quick", "ablation") and (plan.veth is None or
                                                           plan.ceiling_ref is None):
            raise ValueError("no veth or no ceiling reflector among meta.subjects")
        self.socks5_from = meta.get("socks5")
        plan.bulk_cells = [(d, n) for d, n in meta["bulk_cells"]]
        plan.bulk_t = meta["iperf3"]["seconds"]
        plan.bulk_omit = meta["iperf3"]["omit"]
        plan.reps = meta["repetitions"]
        plan.idle_s = meta.get("idle_wakeup_window_s", plan.idle_s)
        plan.hold_conns = meta.get("hold_conns", plan.hold_conns)
        plan.hold_scale = meta.get("hold_conns_scale", [])
        plan.smoke = bool(meta.get("smoke"))
        plan.time_limit = meta.get("time_limit_s", plan.time_limit)
        self.na = [(x["subject"], x["workload"], x["reason"]) for x in meta.get("not_measured",
                                                                                [])]
        self.failures = list(meta.get("failures", []))
        self.notes = [n for n in meta.get("notes", []) if not n.startswith("charts:")]
        self.host_meta = meta.get("host")
        tc = meta.get("tcp_congestion")
        self.cc_from = tc if isinstance(tc, dict) else {"testbed": None, "host_default": None}
        plan.bin = meta.get("binary", plan.bin)
        self.samples = {}
        for s in data["samples"]:
            self.samples[tuple(s["key"])] = [list(v) for v in s["values"]]
        return meta
