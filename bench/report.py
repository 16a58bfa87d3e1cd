"""report.py — the reporting half of the comparison rig: bench/rig.py measures, this draws.

A Report turns one run into what people read: the derived figures (the two-hop ceiling and
each subject's fraction of it, per round), the results.json rows, the ablation's acceptance
targets (--ablation), report.md, and the gnuplot charts (.dat and .gp, drawn to .svg/.png). It
reads nothing but what results.json holds (its meta and its raw samples), so the report written at
the end of a run and a later `rig.py --report-from` redraw of its results.json are the same.
Also here: the console helpers both halves print through, and the number formats.

Python 3 standard library only; imported by the rig's modules (same directory), not run on
its own.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys

import perfcopy

UNITS = {
    "throughput_gbps": "Gbit/s", "ceiling_fraction": "ratio", "peak_rss_kb": "KiB",
    "idle_rss_kb": "KiB", "startup_ms": "ms", "idle_wakeups_20s": "wakeups",
    "udp_flows_answered": "flows", "user_bytes_per_conn": "bytes", "kernel_kb_per_conn": "KiB",
    "cpu_user_s": "s", "cpu_sys_s": "s", "tun_drops": "packets", "retransmits": "segments",
    "rps_switches": "switches", "loop_busy_pct": "%",
    "conn_per_s": "conn/s", "latency_p50_us": "us", "latency_p99_us": "us",
    "latency_p999_us": "us", "pps": "packets/s", "loss_pct": "%",
    "instructions_per_op": "instructions", "plain_socks5_fraction": "ratio",
    "server_cpu_s": "s", "redirect_fraction": "ratio", "veth_fraction": "ratio",
    "testbed_cpu_s_per_gb": "s/GB", "proxy_cpu_s_per_gb": "s/GB", "testbed_cpus_busy": "CPUs",
    "start_rss_anon_kb": "KiB", "idle_rss_anon_kb": "KiB", "p50_over_redirect_us": "us",
    "own_1stream_fraction": "ratio", "conns_held": "connections", "rss_kb": "KiB",
    "rss_anon_kb": "KiB", "close_s": "s", "conn_errors": "attempts",
    "rss_anon_before_kb": "KiB", "in_trains_pct": "%", "train_len": "datagrams",
    "up_in_trains_pct": "%", "up_train_len": "datagrams",
    "testbed_cpu_us_per_echo": "us", "redirect_socks5_fraction": "ratio",
    "tun_copy_cpu_s_per_gb": "s/GB", "netfilter_cpu_s_per_gb": "s/GB",
    "tun_copy_bound": "ratio", "tun_copy_bound_plain": "ratio",
    "server_cpus_busy": "CPUs", "server_cpu_s_per_gb": "s/GB", "cpu_bound_plain": "ratio",
}

# Chart colours: one hue per stack (and the baselines), darker = faster I/O mode.
BAR_COLORS = {
    ("veth", "offload", 1): "#9e9e9e", ("reflector", "offload", 1): "#2ca02c",
    ("reflector", "per-packet", 1): "#98df8a", ("system", "per-packet", 1): "#ffbb78",
    ("system", "offload", 1): "#ff7f0e", ("system", "offload", 2): "#a04000",
    ("lwip", "per-packet", 1): "#aec7e8", ("lwip", "offload", 1): "#1f77b4",
    ("lwip", "offload-rx", 1): "#6baed6",
    ("system", "offload-norps", 1): "#bcbd22", ("system", "offload-rps", 1): "#8c564b",
    ("ceiling", "offload", 1): "#222222", ("redirect", "offload", 1): "#e377c2",
    ("redirect", "per-packet", 1): "#f7b6d2",
    ("socks5-client", "offload", 1): "#7f7f7f", ("system", "offload-socks5", 1): "#d62728",
    ("lwip", "offload-socks5", 1): "#9467bd", ("redirect", "offload-socks5", 1): "#e377c2",
    ("redirect", "per-packet-socks5", 1): "#f7b6d2",
}
RSS_SLACK_KB = 1024     # a target: system peak RSS at 64 streams at most 1 MB above 1 stream
SOCKS5_TARGET = 0.8     # --via socks5: a stack via SOCKS5 over the plain SOCKS5 client


# ---- the console: the live table on stdout, progress and notes on stderr --------------------

_progress_shown = False


def log(msg):
    clear_progress()
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def progress(msg):
    global _progress_shown
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + msg[:200])
        _progress_shown = True
    else:
        sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def clear_progress():
    global _progress_shown
    if _progress_shown:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()
        _progress_shown = False


def out(line):
    clear_progress()
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ---- number formats -------------------------------------------------------------------------

def fmt(v):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return "%.0f" % v
        if abs(v) >= 10:
            return "%.1f" % v
        if abs(v) >= 1:
            return "%.2f" % v
        return "%.3f" % v
    return str(v)


def against(v, t, digits=3, at_least=True):
    """v with `digits` decimals, or with as many more as it takes to keep it on its own side of
    the target t: a median of 0.8998 against ">= 0.9" is shown 0.8998 beside its MISS, never
    0.900; 20.4 us against "<= +20 us" is shown 20.4."""
    def ok(x):
        return x >= t if at_least else x <= t
    for d in range(digits, 10):
        if ok(float("%.*f" % (d, v))) == ok(v):
            return "%.*f" % (d, v)
    return repr(v)


def summary(vals):
    """(median, min, max, n) of a list, or None."""
    if not vals:
        return None
    return (statistics.median(vals), min(vals), max(vals), len(vals))


def fmt_stat(st, digits=2, scale=1.0, signed=False):
    """median [min – max] (just the median when n = 1), or n/a."""
    if st is None:
        return "n/a"
    f = "%+.*f" if signed else "%.*f"
    med, lo, hi = (f % (digits, v * scale) for v in st[:3])
    if st[3] == 1 or lo == hi:
        return med
    return "%s [%s – %s]" % (med, lo, hi)


def note_once(notes, msg):
    """Add msg to a run's notes (and say so on stderr) unless it is there already."""
    if msg not in notes:
        notes.append(msg)
        log("note: " + msg)


# ---- subjects -------------------------------------------------------------------------------

def tally(targets):
    """The verdicts counted, e.g. "19 PASS, 8 MISS of 27" (", 1 N/A" when a figure is
    missing), so that nobody has to count the lines."""
    n = {v: sum(1 for t in targets if t["verdict"] == v) for v in ("PASS", "MISS", "N/A")}
    return "%d PASS, %d MISS%s of %d" % (n["PASS"], n["MISS"],
                                         ", %d N/A" % n["N/A"] if n["N/A"] else "",
                                         len(targets))


def cc_text(meta):
    """The testbed's TCP congestion control, as the report states it."""
    cc = meta.get("tcp_congestion") or {}
    tb, host = cc.get("testbed"), cc.get("host_default")
    if not tb:
        return "TCP congestion control not recorded (the host's default)"
    if host and host != tb:
        return "TCP congestion control %s in the testbed (host default %s)" % (tb, host)
    return "TCP congestion control %s" % tb


class Subject:
    """A subject as results.json names it: (stack, io_mode, queues) is its identity in the
    samples and the rows, label its name in the tables. bench/subjects.py's Subject names
    itself the same way and adds how to run it."""

    def __init__(self, stack, io_mode, queues=1, label=None):
        self.stack, self.io_mode, self.queues = stack, io_mode, queues
        self.label = label or self.long_label()

    def long_label(self):
        if self.stack in ("veth", "ceiling", "micro"):
            return self.stack
        return "%s %s%s" % (self.stack, self.io_mode,
                            " %dq" % self.queues if self.queues > 1 else "")

    @property
    def key(self):
        return (self.stack, self.io_mode, self.queues)

    @property
    def is_stack(self):
        return self.stack in ("system", "lwip")

    def to_json(self):
        return {"stack": self.stack, "io_mode": self.io_mode, "queues": self.queues,
                "label": self.label}


# ---- the report -----------------------------------------------------------------------------

class Report:
    """The report of one run, from its results.json meta (all but `targets`) and its raw
    samples, {(stack, io_mode, queues, workload, direction, streams, metric): [[round, value],
    ...]}. addrs = (gateway, mirror, target): the testbed addresses the Method sections name.
    write() appends its chart notes to meta["notes"] and, for an ablation, sets
    meta["targets"]; meta is the caller's dict, changed in place."""

    def __init__(self, out_dir, meta, samples, addrs):
        self.out, self.meta, self.samples = out_dir, meta, samples
        self.gw, self.mirror, self.target = addrs
        self.dsamples = {}      # the derived ones (ceiling, fractions), same shape
        self.ablation = meta["mode"] == "ablation"
        self.socks5 = meta["mode"] == "socks5"
        self.sniff = meta["mode"] == "sniff"
        self.beside_check = meta["mode"] == "besidecheck"
        self.reps = meta["repetitions"]
        self.io_mode = meta["io_mode"]
        self.bulk_cells = [(d, n) for d, n in meta["bulk_cells"]]
        self.bulk_t, self.bulk_omit = meta["iperf3"]["seconds"], meta["iperf3"]["omit"]
        self.idle_s, self.hold_conns = meta["idle_wakeup_window_s"], meta["hold_conns"]
        self.notes = meta["notes"]
        self.subjects = [Subject(s["stack"], s["io_mode"], s["queues"], s["label"])
                         for s in meta["subjects"]]
        # --via socks5 runs neither baseline: no ceiling then.
        self.veth = next((s for s in self.subjects if s.stack == "veth"), None)
        self.ceiling_ref = next((s for s in self.subjects if s.stack == "reflector" and
                                 s.io_mode == meta["ceiling_io_mode"]), None)
        self.ceiling = Subject("ceiling", self.ceiling_ref.io_mode if self.ceiling_ref else
                               self.io_mode, label="ceiling")
        self.micro = Subject("micro", "n/a", label="micro")
        self.redirect = next((s for s in self.subjects if s.stack == "redirect"), None)

    def stack_subjects(self):
        return [s for s in self.subjects if s.is_stack]

    def queues_text(self):
        """The TUN queues each stack subject ran with, as the run measured them ("TUN queues:
        system 2, lwip 1"); one figure when they agree."""
        stacks = self.stack_subjects()
        qs = sorted({s.queues for s in stacks})
        if not stacks:
            return "no TUN"
        if len(qs) == 1:
            return "%d TUN queue%s" % (qs[0], "s" if qs[0] > 1 else "")
        return "TUN queues: " + ", ".join("%s %d" % (s.label, s.queues) for s in stacks)

    def fraction_subjects(self):
        """Everything measured against the ceiling: the stacks, and (ablation) the reflector
        in the other mode."""
        if self.ceiling_ref is None:
            return []
        return [s for s in self.subjects if s.stack not in ("veth", "redirect") and
                s.key != self.ceiling_ref.key]

    def find(self, stack, io_mode, queues=None):
        """The subject of that identity; without queues, the one with the fewest (a run's
        stack subject, or an ablation's one-queue subject beside its two-queue one)."""
        found = [s for s in self.subjects if s.stack == stack and s.io_mode == io_mode and
                 (queues is None or s.queues == queues)]
        return min(found, key=lambda s: s.queues) if found else None

    def by_round(self, subj, workload, direction, streams, metric):
        """{round: value} of one figure, raw or derived."""
        key = subj.key + (workload, direction, streams, metric)
        return dict(self.samples.get(key) or self.dsamples.get(key) or [])

    def stat(self, subj, workload, direction, streams, metric):
        if subj is None:
            return None
        return summary(list(self.by_round(subj, workload, direction, streams, metric).values()))

    # -- aggregation
    def derive(self):
        """Per round and cell: the two-hop ceiling 1/(1/reflector + 1/veth) and each subject's
        fraction of it, paired by round (a failed run leaves a gap, never a shifted pair)."""
        self.dsamples = {}
        self.derive_socks5()
        for d, n in self.bulk_cells if self.ceiling_ref and self.veth else []:
            refl = self.by_round(self.ceiling_ref, "tcp_bulk", d, n, "throughput_gbps")
            veth = self.by_round(self.veth, "tcp_bulk", d, n, "throughput_gbps")
            ceil = {r: 1.0 / (1.0 / refl[r] + 1.0 / veth[r]) for r in sorted(refl)
                    if r in veth and refl[r] > 0 and veth[r] > 0}
            if not ceil:
                continue
            self.dsamples[self.ceiling.key + ("tcp_bulk", d, n, "throughput_gbps")] = \
                [[r, v] for r, v in ceil.items()]
            for s in self.fraction_subjects():
                thr = self.by_round(s, "tcp_bulk", d, n, "throughput_gbps")
                fr = [[r, thr[r] / ceil[r]] for r in sorted(thr) if r in ceil]
                if fr:
                    self.dsamples[s.key + ("tcp_bulk", d, n, "ceiling_fraction")] = fr
        self.has_ceiling = any(k[-1] == "ceiling_fraction" for k in self.dsamples)
        self.derive_baselines()
        for s in self.stack_subjects() if self.beside_check else []:
            for d, n in self.bulk_cells:
                r = self.beside_over_alone(s, d, n)
                if r:
                    self.dsamples[s.key + ("tcp_bulk", d, n, "redirect_beside_over_alone")] = \
                        [[k, v] for k, v in r.items()]

    def paired(self, a, b, wl, d, n, metric, fn):
        """fn(a's value, b's value) per round where both were measured."""
        ra, rb = self.by_round(a, wl, d, n, metric), self.by_round(b, wl, d, n, metric)
        return [[r, fn(ra[r], rb[r])] for r in sorted(ra) if r in rb and rb[r] > 0]

    def derive_baselines(self):
        """Per round: every subject's TCP bulk as a fraction of the redirect baseline (the
        cheapest terminating proxy without a TUN) and of the bare veth; its connection rate
        as a fraction of the redirect's, its latency p50 over the redirect's, and (stacks)
        each multi-stream cell over the same stack's 1 stream."""
        # Of the proxies only (stacks, --subject): a baseline's fraction of another baseline
        # would fall when the other got faster, and the gate judges every such row.
        proxies = [s for s in self.subjects if s.is_stack or s.io_mode == "external"]
        for d, n in self.bulk_cells:
            for s in proxies:
                red = self.redirect_for(s)
                for base, metric in ((red, "redirect_fraction"), (self.veth, "veth_fraction")):
                    if base is None:
                        continue
                    fr = self.bulk_beside(s, base, d, n) if base is red else \
                        self.paired(s, base, "tcp_bulk", d, n, "throughput_gbps",
                                    lambda x, y: x / y)
                    if fr:
                        self.dsamples[s.key + ("tcp_bulk", d, n, metric)] = fr
                if not self.socks5:
                    self.derive_copy_bound(s, self.redirect, d, n)
                if s.is_stack and n > 1 and (d, 1) in self.bulk_cells:
                    ra = self.by_round(s, "tcp_bulk", d, n, "throughput_gbps")
                    rb = self.by_round(s, "tcp_bulk", d, 1, "throughput_gbps")
                    fr = [[r, ra[r] / rb[r]] for r in sorted(ra) if rb.get(r, 0) > 0]
                    if fr:
                        self.dsamples[s.key + ("tcp_bulk", d, n, "own_1stream_fraction")] = fr
        for s in proxies if self.veth is not None else []:
            fr = self.beside(s, self.veth, "udp_echo_64B", "pps", lambda x, y: x / y)
            if fr:
                self.dsamples[s.key + ("udp_echo_64B", None, None, "veth_fraction")] = fr
        for s in proxies:
            red = self.redirect_for(s)
            if red is None:
                continue
            fr = self.beside(s, red, "connrate", "conn_per_s", lambda x, y: x / y)
            if fr:
                self.dsamples[s.key + ("connrate", None, None, "redirect_fraction")] = fr
            fr = self.beside(s, red, "latency_64B", "latency_p50_us", lambda x, y: x - y)
            if fr:
                self.dsamples[s.key + ("latency_64B", None, None, "p50_over_redirect_us")] = fr
            # UDP: the redirect baseline's forwarder is the cheapest userspace UDP hop.
            fr = self.paired(s, red, "udp_echo_64B", None, None, "pps", lambda x, y: x / y)
            if fr:
                self.dsamples[s.key + ("udp_echo_64B", None, None, "redirect_fraction")] = fr

    def redirect_for(self, s):
        """The redirect baseline s is a fraction of: the run's; in a --via socks5 run, for a
        subject through the SOCKS5 server (a stack via it, an external subject) the redirect
        through the same server, and none for a direct stack (a redirect_fraction row of it
        there would be over the redirect through the server, under the same gate key as a
        full run's row over the direct redirect)."""
        if not self.socks5:
            return self.redirect
        if s.io_mode.endswith("-socks5") or s.io_mode == "external":
            return self.redirect_via()
        return next((x for x in self.subjects if x.stack == "redirect" and
                     not x.io_mode.endswith("-socks5")), None)

    def beside(self, s, base, wl, metric, fn, d=None, n=None, own=None):
        """Per round fn(s's figure, base's figure) of cell (wl, d, n), from base's run right
        beside s's, WL_paired_BASE recorded under s, where the run has it: the back-to-back
        pass (bench/runner.py paired_pass) with s's own run WL_paired, or (own="tcp_bulk")
        the TCP bulk cells (bench/runner.py Beside) with s's run in its block. Else from the
        two subjects' runs in the round's blocks (runs from before the pairing, subjects it
        does not pair)."""
        a = self.by_round(s, own or wl + "_paired", d, n, metric)
        b = self.by_round(s, wl + "_paired_" + base.stack, d, n, metric)
        if a and b:
            return [[r, fn(a[r], b[r])] for r in sorted(a) if b.get(r, 0) > 0]
        return self.paired(s, base, wl, d, n, metric, fn)

    def bulk_beside(self, s, base, d, n):
        """Per round s's TCP bulk throughput over base's in cell (d, n) (beside)."""
        return self.beside(s, base, "tcp_bulk", "throughput_gbps", lambda x, y: x / y, d, n,
                           own="tcp_bulk")

    def derive_copy_bound(self, s, red, d, n):
        """--perf: per round, the most of the throughput of red (the redirect baseline, or
        --via socks5: the redirect baseline through the same server) a TUN proxy could reach
        in this cell, given the TUN's two copies of every byte as measured in s's run and
        red's own CPU per byte, less its netfilter work (bench/perfcopy.py). Returns
        {round: bound}."""
        ncpu = (self.meta.get("host") or {}).get("cpus")
        if red is None or not ncpu:
            return {}
        c = self.by_round(s, "tcp_bulk", d, n, "tun_copy_cpu_s_per_gb")
        own = self.by_round(s, "tcp_bulk", d, n, "testbed_cpus_busy")
        busy = self.by_round(red, "tcp_bulk", d, n, "testbed_cpus_busy")
        spg = self.by_round(red, "tcp_bulk", d, n, "testbed_cpu_s_per_gb")
        nf = self.by_round(red, "tcp_bulk", d, n, "netfilter_cpu_s_per_gb")
        # The CPUs busy read a little over the CPU count when saturated (steal time, and the
        # CPU time spans iperf3's set-up too): the proxy's own reading where it is higher.
        b = [[r, perfcopy.bound(max(ncpu, own.get(r) or 0), busy.get(r), spg.get(r),
                                nf.get(r), c[r])] for r in sorted(c)]
        b = [x for x in b if x[1] is not None]
        if b:
            self.dsamples[s.key + ("tcp_bulk", d, n, "tun_copy_bound")] = b
        return dict(b)

    def copy_bound_table(self, L):
        """--perf: each TUN proxy's measured fraction of the redirect baseline beside the bound
        its TUN's copies set (bench/perfcopy.py)."""
        T = []
        red = self.redirect_via() if self.socks5 else self.redirect
        for s in self.subjects:
            for d, n in self.bulk_cells:
                b = self.stat(s, "tcp_bulk", d, n, "tun_copy_bound")
                if not b:
                    continue
                c = [s.label, d, "%d" % n,
                     fmt_stat(self.stat(s, "tcp_bulk", d, n, "tun_copy_cpu_s_per_gb"), 3),
                     fmt_stat(self.stat(red, "tcp_bulk", d, n, "testbed_cpu_s_per_gb"), 3),
                     fmt_stat(self.stat(red, "tcp_bulk", d, n, "netfilter_cpu_s_per_gb"), 3),
                     fmt_stat(b, 3)]
                if self.socks5:
                    c += [fmt_stat(self.stat(s, "tcp_bulk", d, n, "redirect_socks5_fraction"),
                                   3),
                          fmt_stat(self.stat(s, "tcp_bulk", d, n, "tun_copy_bound_plain"), 3),
                          fmt_stat(self.stat(s, "tcp_bulk", d, n, "plain_socks5_fraction"), 3)]
                else:
                    c.append(fmt_stat(self.stat(s, "tcp_bulk", d, n, "redirect_fraction"), 3))
                T.append("| " + " | ".join(c) + " |")
        if not T:
            return
        L.append("## The TUN's copies: a bound from the profiles (--perf)")
        L.append("")
        L.append("Every byte a TUN proxy relays is copied out of the TUN to the proxy and back "
                 "in (`_copy_to_iter` under `tun_do_read`, `_copy_from_iter` under "
                 "`tun_get_user`, in the proxy's process); the TUN device has no zero-copy "
                 "path for a userspace reader or writer. The redirect baseline makes neither "
                 "copy but pays for nftables' REDIRECT (netfilter: connection tracking and NAT "
                 "per packet). Throughput is CPUs busy over CPU seconds per GB, so a TUN "
                 "proxy can reach at most (N / B) x S / (S - F + C) of the redirect baseline: "
                 "N the testbed's CPUs (%s; or the proxy's own run's CPUs busy where that "
                 "reads higher), B the redirect's CPUs busy, S its testbed CPU s/GB, F its "
                 "netfilter s/GB, C the proxy's copies s/GB. Per round, from system-wide "
                 "cpu-clock profiles of the same runs (perf itself costs a little CPU in "
                 "both). An upper limit for a proxy that "
                 "ends the application's TCP in the kernel and relays by splice, as the "
                 "redirect does (the system stack); an estimate for one with a TCP of its own "
                 "(lwIP). Generous: of the TUN crossing only the copies are counted, and "
                 "netfilter with all it calls." % (
                     (self.meta.get("host") or {}).get("cpus")))
        if self.socks5:
            L.append("")
            L.append("Here the redirect baseline is the one through the same SOCKS5 server, and "
                     "the bound over the plain client is that bound times the redirect's own "
                     "fraction of the plain client in the same round.")
        L.append("")
        head = ["subject", "direction", "streams", "TUN copies s/GB", "redirect testbed s/GB",
                "redirect netfilter s/GB", "bound"]
        head += ["measured fraction of the redirect", "bound over the plain client",
                 "measured fraction of the plain client"] if self.socks5 else \
            ["measured fraction"]
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + " --- |" * len(head))
        L += T + [""]

    # -- --via socks5
    def socks5_figures(self):
        """(workload, direction, streams, metric) of every figure the plain client is
        compared on: each bulk cell's throughput, then the UDP echo rate."""
        return [("tcp_bulk", d, n, "throughput_gbps") for d, n in self.bulk_cells] + \
            [("udp_echo_64B", None, None, "pps")]

    def redirect_via(self):
        """The redirect baseline through the SOCKS5 server, or None (a run from before it)."""
        return next((s for s in self.subjects
                     if s.stack == "redirect" and s.io_mode.endswith("-socks5")), None)

    def socks5_pairs(self):
        """(None, redirect via socks5) where the run has it, then (stack direct, stack via
        socks5) for each stack of a --via socks5 run, then (None, subject) for each external
        subject (--subject: it was pointed at the same SOCKS5 server by its own command line).
        A pair with no direct subject is reported, not judged."""
        rv = self.redirect_via()
        P = [(None, rv)] if rv else []
        for s in self.subjects:
            if s.is_stack and s.io_mode.endswith("-socks5"):
                P.append((self.find(s.stack, s.io_mode[:-len("-socks5")], s.queues), s))
        return P + [(None, s) for s in self.subjects if s.io_mode == "external"]

    def derive_socks5(self):
        """Per round: each stack via SOCKS5 over the plain client (paired by round)."""
        plain = next((s for s in self.subjects if s.stack == "socks5-client"), None)
        if plain is None:
            return
        for _, via in self.socks5_pairs():
            for wl, d, n, metric in self.socks5_figures():
                fr = self.bulk_beside(via, plain, d, n) if wl == "tcp_bulk" else \
                    self.paired(via, plain, wl, d, n, metric, lambda x, y: x / y)
                if fr:
                    self.dsamples[via.key + (wl, d, n, "plain_socks5_fraction")] = fr
        for _, via in self.socks5_pairs():
            for d, n in self.bulk_cells:
                b = self.derive_cpu_bound(via, d, n)
                if b:
                    self.dsamples[via.key + ("tcp_bulk", d, n, "cpu_bound_plain")] = b
        # Each proxy through the server over the redirect baseline through it: how far from
        # the cheapest terminating proxy in front of the same server (TCP only).
        rv = self.redirect_via()
        if rv is None:
            return
        for _, via in self.socks5_pairs():
            if via is rv:
                continue
            for wl, d, n, metric in self.socks5_figures():
                if wl != "tcp_bulk":
                    continue
                fr = self.paired(via, rv, wl, d, n, metric, lambda x, y: x / y)
                if fr:
                    self.dsamples[via.key + (wl, d, n, "redirect_socks5_fraction")] = fr
                # --perf: the copy bound against the redirect through the server, and so
                # against the plain client: times the redirect's fraction of it that round.
                b = self.derive_copy_bound(via, rv, d, n)
                rp = self.by_round(rv, wl, d, n, "plain_socks5_fraction")
                bp = [[r, b[r] * rp[r]] for r in sorted(b) if r in rp]
                if bp:
                    self.dsamples[via.key + (wl, d, n, "tun_copy_bound_plain")] = bp

    def derive_cpu_bound(self, s, d, n):
        """Per round [[round, bound]]: s's fraction of the plain client in cell (d, n) as it
        would be at the same CPU per byte with every CPU of the testbed busy: the fraction
        times N / (s's testbed CPUs busy), N the CPU count (or s's CPUs busy where that reads
        higher: steal time and iperf3's set-up count in it). Equal to the fraction where the
        run kept every CPU busy: only less CPU per byte raises such a cell."""
        ncpu = (self.meta.get("host") or {}).get("cpus")
        if not ncpu:
            return []
        fr = self.by_round(s, "tcp_bulk", d, n, "plain_socks5_fraction")
        busy = self.by_round(s, "tcp_bulk", d, n, "testbed_cpus_busy")
        return [[r, fr[r] * max(ncpu, busy[r]) / busy[r]] for r in sorted(fr)
                if busy.get(r, 0) > 0]

    def cpu_bound_table(self, L, plain):
        """--via socks5: each proxy's testbed CPU per byte, CPUs busy and the SOCKS5 server's
        share, the plain client's beside it, and the bound the CPU per byte sets
        (derive_cpu_bound) beside the measured fraction."""
        if plain is None:
            return
        paired = "tcp_bulk_paired_" + plain.stack
        T = []
        for _, via in self.socks5_pairs():
            for d, n in self.bulk_cells:
                b = self.stat(via, "tcp_bulk", d, n, "cpu_bound_plain")
                if not b:
                    continue

                def st(m, via=via, d=d, n=n):
                    return self.stat(via, "tcp_bulk", d, n, m)

                def pl(m, via=via, d=d, n=n):
                    return self.stat(via, paired, d, n, m) or self.stat(plain, "tcp_bulk", d, n, m)
                T.append("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    via.label, d, n, fmt_stat(st("testbed_cpu_s_per_gb"), 3),
                    fmt_stat(st("testbed_cpus_busy"), 2), fmt_stat(st("server_cpus_busy"), 2),
                    fmt_stat(pl("testbed_cpu_s_per_gb"), 3), fmt_stat(pl("testbed_cpus_busy"), 2),
                    fmt_stat(pl("server_cpus_busy"), 2), fmt_stat(b, 3),
                    fmt_stat(st("plain_socks5_fraction"), 3)))
        if not T:
            return
        L.append("## What the CPUs allow: CPU per byte against the plain client")
        L.append("")
        L.append("Every subject here shares the testbed's %s CPUs with the clients and the SOCKS5 "
                 "server. The plain client is often held by the server alone (its CPUs busy "
                 "near one while another CPU has time to spare); a proxy in front of it takes "
                 "that time and competes with the server for the rest. Throughput is CPUs busy "
                 "over CPU seconds per GB, so at the CPU per byte a proxy's run cost the whole "
                 "testbed (/proc/stat), all N CPUs busy would give it its measured fraction "
                 "times N / CPUs busy (per round, then median [min – max]): the most that cell "
                 "reaches without a cheaper path. Where the two are equal the run kept every "
                 "CPU busy and only less CPU per byte raises it; where the bound is higher, "
                 "the CPUs stood idle part of the time (a pipeline waiting on one of its "
                 "stages)." % ((self.meta.get("host") or {}).get("cpus")))
        L.append("")
        L.append("| subject | direction | streams | testbed CPU s/GB | testbed CPUs busy | "
                 "server CPUs busy | plain: testbed CPU s/GB | plain: testbed CPUs busy | "
                 "plain: server CPUs busy | with every CPU busy | measured |")
        L.append("|" + " --- |" * 11)
        L += T + [""]

    def socks5_targets(self):
        """Each stack via SOCKS5 at least SOCKS5_TARGET of the plain SOCKS5 client, on the
        median of the per-round ratios: every bulk cell and the UDP echo rate."""
        T = []
        for direct, via in self.socks5_pairs():
            if direct is None:
                continue    # an external subject: its ratio is reported, not judged
            for wl, d, n, metric in self.socks5_figures():
                st = self.stat(via, wl, d, n, "plain_socks5_fraction")
                what = "%s: %s over the plain socks5 client" % (
                    via.label, "TCP bulk %s, %d stream%s" % (d, n, "s" if n > 1 else "")
                    if wl == "tcp_bulk" else "UDP echo 64 B packets/s")
                v = st[0] if st else None
                cb = self.stat(via, wl, d, n, "tun_copy_bound_plain")
                ub = self.stat(via, wl, d, n, "cpu_bound_plain")
                notes = ([] if not cb else ["the TUN's copies allow at most %.3f" % cb[0]]) + \
                    ([] if not ub else ["%.3f with every CPU busy" % ub[0]])
                T.append({"what": what, "value": None if v is None else round(v, 4),
                          "target": ">= %.1f" % SOCKS5_TARGET,
                          "verdict": "N/A" if v is None else
                          ("PASS" if v >= SOCKS5_TARGET else "MISS"),
                          "shown": "not measured" if v is None else
                          against(v, SOCKS5_TARGET) + (
                              " (%s)" % "; ".join(notes) if notes else "")})
        return T

    def rows(self):
        rows = []
        for (stack, io_mode, queues, wl, d, n, metric), pairs in \
                list(self.samples.items()) + list(self.dsamples.items()):
            vals = [v for _, v in pairs]
            rows.append({"stack": stack, "io_mode": io_mode, "queues": queues, "workload": wl,
                         "direction": d, "streams": n, "metric": metric,
                         "unit": UNITS.get(metric, ""), "median": statistics.median(vals),
                         "min": min(vals), "max": max(vals), "n": len(vals)})
        order = {s.key: i for i, s in enumerate(self.subjects + [self.ceiling, self.micro])}
        rows.sort(key=lambda r: (r["workload"] != "tcp_bulk", r["workload"],
                                 r["direction"] or "", r["streams"] or 0,
                                 order.get((r["stack"], r["io_mode"], r["queues"]), 99),
                                 r["metric"]))
        return rows

    def get(self, subj, wl, d, n, metric):
        return self.rowmap.get(subj.key + (wl, d, n, metric))

    def ratio(self, a, b, d, n, metric="throughput_gbps"):
        """Per round a/b (paired), summarized; None when a round has neither."""
        if a is None or b is None:
            return None
        ra = self.by_round(a, "tcp_bulk", d, n, metric)
        rb = self.by_round(b, "tcp_bulk", d, n, metric)
        return summary([ra[r] / rb[r] for r in sorted(ra) if r in rb and rb[r] > 0])

    def diff_pairs(self):
        """(label, a, b): the ablation's differences, a vs b in percent, where both exist."""
        cand = [("system: offload vs per-packet", ("system", "offload", 1),
                 ("system", "per-packet", 1)),
                ("lwip: offload vs per-packet", ("lwip", "offload", 1),
                 ("lwip", "per-packet", 1)),
                ("lwip offload: GSO output trains vs none", ("lwip", "offload", 1),
                 ("lwip", "offload-rx", 1)),
                ("system offload: steering auto (tried, kept where it pays) vs always off",
                 ("system", "offload", 1), ("system", "offload-norps", 1)),
                ("system offload: steering auto vs always on",
                 ("system", "offload", 1), ("system", "offload-rps", 1)),
                ("system vs lwip, offload", ("system", "offload", 1), ("lwip", "offload", 1)),
                ("system offload: 2 queues vs 1", ("system", "offload", 2),
                 ("system", "offload", 1))]
        return [(lab, self.find(*a), self.find(*b)) for lab, a, b in cand
                if self.find(*a) and self.find(*b)]

    def pct(self, a, b, d, n):
        st = self.ratio(a, b, d, n)
        return None if st is None else (
            (st[0] - 1) * 100, (st[1] - 1) * 100, (st[2] - 1) * 100, st[3])

    def targets(self):
        """The ablation's acceptance targets on this run's medians:
        [{what, value, target, verdict}]."""
        so, sp = self.find("system", "offload"), self.find("system", "per-packet")
        lo = self.find("lwip", "offload")
        T = []

        def add(what, st, target, ok, shown):
            T.append({"what": what, "value": None if st is None else round(st, 4),
                      "target": target, "verdict": "N/A" if st is None else
                      ("PASS" if ok(st) else "MISS"), "shown": shown(st) if st is not None
                      else "not measured"})
        for n in (1, 16, 64):
            for d in ("up", "down"):
                st = self.stat(so, "tcp_bulk", d, n, "ceiling_fraction")
                add("system offload 1q, %s, %d stream%s: fraction of the ceiling" % (
                    d, n, "s" if n > 1 else ""), st and st[0], ">= 0.85",
                    lambda v: v >= 0.85, lambda v: against(v, 0.85))
        for d in ("up", "down"):
            st = self.stat(lo, "tcp_bulk", d, 1, "ceiling_fraction")
            add("lwip offload, %s, 1 stream: fraction of the ceiling" % d, st and st[0],
                ">= 0.6", lambda v: v >= 0.6, lambda v: against(v, 0.6))
        for d in ("up", "down"):
            st = self.ratio(so, sp, d, 1)
            add("system offload vs per-packet, %s, 1 stream: throughput ratio" % d,
                st and st[0], ">= 3x", lambda v: v >= 3.0, lambda v: "%.2fx" % v)
        for d in ("up", "down"):
            a = self.stat(so, "tcp_bulk", d, 64, "peak_rss_kb")
            b = self.stat(so, "tcp_bulk", d, 1, "peak_rss_kb")
            add("system offload 1q, %s: peak RSS at 64 streams minus at 1 stream" % d,
                a and b and a[0] - b[0], "<= %d KiB" % RSS_SLACK_KB,
                lambda v: v <= RSS_SLACK_KB, lambda v: "%+.0f KiB" % v)
        return T

    def perf_targets(self):
        """A full run's performance targets, each on the median of its per-round figures:
        bulk as a fraction of the redirect baseline, lwIP's many streams over its one, the
        connection rate over the redirect's, UDP echo over the veth's, latency over the
        redirect's, memory, idle wakeups. [{what, value, target, verdict, shown}]."""
        T = []

        def add(what, v, target, ok, shown):
            T.append({"what": what, "value": None if v is None else round(v, 4),
                      "target": target, "verdict": "N/A" if v is None else
                      ("PASS" if ok(v) else "MISS"),
                      "shown": "not measured" if v is None else shown(v)})

        def med(subj, wl, d, n, metric):
            st = self.stat(subj, wl, d, n, metric)
            return st[0] if st else None

        def streams(n):
            return "%d stream%s" % (n, "s" if n > 1 else "")
        def ratio(t):
            return lambda v: against(v, t)
        for name, low, high in (("system", 0.7, 0.85), ("lwip", 0.5, 0.5)):
            s = self.find(name, self.io_mode)
            if s is None:
                continue
            for d, n in self.bulk_cells:
                t = high if n >= 16 else low
                cb = med(s, "tcp_bulk", d, n, "tun_copy_bound")
                add("%s, TCP bulk %s, %s: fraction of the redirect baseline" % (
                    name, d, streams(n)), med(s, "tcp_bulk", d, n, "redirect_fraction"),
                    ">= %.2f" % t, lambda v, t=t: v >= t,
                    lambda v, t=t, cb=cb: against(v, t) + (
                        "" if cb is None else " (the TUN's copies allow at most %.3f)" % cb))
            if name == "lwip":
                for d, n in self.bulk_cells:
                    if n > 1:
                        add("lwip, TCP bulk %s, %s over its own 1 stream" % (d, streams(n)),
                            med(s, "tcp_bulk", d, n, "own_1stream_fraction"), ">= 0.9",
                            lambda v: v >= 0.9, ratio(0.9))
                add("lwip, peak RSS in the TCP bulk down 64 streams cell",
                    med(s, "tcp_bulk", "down", 64, "peak_rss_kb"), "<= 12 MiB",
                    lambda v: v <= 12 * 1024, lambda v: "%.1f MiB" % (v / 1024))
            if name == "system":
                add("system, new connections per second over the redirect baseline's",
                    med(s, "connrate", None, None, "redirect_fraction"), ">= 0.7",
                    lambda v: v >= 0.7, ratio(0.7))
                if self.veth is not None:
                    # Beside it, the same ratio of the redirect baseline's UDP forwarder (the
                    # cheapest userspace hop, no TUN): what any proxy process in the path
                    # reaches on this machine.
                    hop = self.paired(self.redirect, self.veth, "udp_echo_64B", None, None,
                                      "pps", lambda x, y: x / y) if self.redirect else None
                    hop_v = summary([v for _, v in hop])[0] if hop else None
                    add("system, UDP echo 64 B packets/s over the veth's",
                        med(s, "udp_echo_64B", None, None, "veth_fraction"), ">= 0.75",
                        lambda v: v >= 0.75,
                        lambda v, h=hop_v: against(v, 0.75) + (
                            "" if h is None else " (the redirect's UDP hop: %.3f)" % h))
            add("%s, request/response latency p50 over the redirect baseline's" % name,
                med(s, "latency_64B", None, None, "p50_over_redirect_us"), "<= +20 us",
                lambda v: v <= 20,
                lambda v: ("+" if v >= 0 else "") + against(v, 20, 0, at_least=False) + " us")
            add("%s, RssAnon 1 s after start" % name,
                med(s, "idle", None, None, "start_rss_anon_kb"), "<= 1.2 MB",
                lambda v: v * 1024 <= 1.2e6, lambda v: "%.2f MB" % (v * 1024 / 1e6))
            add("%s, RssAnon 5 s after the workloads" % name,
                med(s, "run", None, None, "idle_rss_anon_kb"), "<= 2 MB",
                lambda v: v * 1024 <= 2e6, lambda v: "%.2f MB" % (v * 1024 / 1e6))
            if self.idle_s == 20:
                add("%s, wakeups in 20 s idle" % name,
                    med(s, "idle", None, None, "idle_wakeups_20s"), "<= 2",
                    lambda v: v <= 2, lambda v: "%.0f" % v)
        return T

    def summary_table(self, L):
        """report.md's first table: every subject's TCP bulk as a fraction of the redirect
        baseline, one column per direction and stream count."""
        if self.redirect is None:
            return
        subs = [s for s in self.subjects if any(
            self.get(s, "tcp_bulk", d, n, "redirect_fraction") for d, n in self.bulk_cells)]
        L.append("## Summary: TCP bulk as a fraction of the redirect baseline")
        L.append("")
        L.append("The redirect baseline (`twinstack redirect`) is the same dispatcher, outbound "
                 "and relay behind an nftables REDIRECT, with no TUN: the cheapest terminating "
                 "proxy this kernel allows. 1.0 = as fast as it; per-round ratios (paired), "
                 "median [min – max].")
        L.append("")
        L.append("| subject | " + " | ".join("%s %d" % (d, n) for d, n in self.bulk_cells) +
                 " |")
        L.append("| --- |" + " --- |" * len(self.bulk_cells))
        red = ["%.2f Gbit/s" % r["median"] if r else "n/a" for r in
               (self.get(self.redirect, "tcp_bulk", d, n, "throughput_gbps")
                for d, n in self.bulk_cells)]
        L.append("| redirect (Gbit/s) | " + " | ".join(red) + " |")
        for s in subs:
            L.append("| %s | " % s.label + " | ".join(
                self.cell(self.get(s, "tcp_bulk", d, n, "redirect_fraction"), 3)
                for d, n in self.bulk_cells) + " |")
        L.append("")

    def targets_section(self, L, targets):
        if not targets:
            return
        L.append("## Targets")
        L.append("")
        L.append(tally(targets) + ".")
        L.append("")
        L.append("| verdict | figure | measured | target |")
        L.append("| --- | --- | --- | --- |")
        for t in targets:
            L.append("| %s | %s | %s | %s |" % (t["verdict"], t["what"], t["shown"],
                                                 t["target"]))
        L.append("")

    def write(self):
        """The charts, report.md and results.json into the output directory; for an
        ablation also the targets and the system vs lwip lines on stdout."""
        self.derive()
        rows = self.rows()
        self.rowmap = {(r["stack"], r["io_mode"], r["queues"], r["workload"], r["direction"],
                        r["streams"], r["metric"]): r for r in rows}
        targets = self.targets() if self.ablation else \
            self.socks5_targets() if self.socks5 else \
            self.perf_targets() if self.meta["mode"] == "full" else []
        if self.ablation:
            self.ablation_charts()
        elif self.socks5:
            self.ablation_charts("socks5_throughput", "TCP bulk throughput, direct and via SOCKS5")
            self.socks5_cpu_chart()
        elif not self.sniff and not self.beside_check:
            self.charts()
            self.cpu_chart()
        meta = self.meta
        if targets:
            meta["targets"] = targets
        samples = [{"key": list(k), "values": v} for k, v in self.samples.items()]
        if self.ablation:
            self.write_ablation_report(meta, targets)
        elif self.socks5:
            self.write_socks5_report(meta, targets)
        elif self.sniff:
            self.write_sniff_report(meta)
        elif self.beside_check:
            self.write_beside_check_report(meta)
        else:
            self.write_report(rows, meta, targets)
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows, "samples": samples}, f, indent=1)
        for t in targets:
            out("%-4s  %s: %s (target %s)" % (t["verdict"], t["what"], t["shown"], t["target"]))
        if targets:
            out("targets: " + tally(targets))
        for d, n in self.bulk_cells if self.ablation else []:
            st = self.pct(self.find("system", "offload"), self.find("lwip", "offload"), d, n)
            if st is not None:
                out("info  system vs lwip (offload), %s, %d stream%s: %+.1f%% (reported; the "
                    "system netstack article: +42%% over smoltcp at 1 stream)" % (
                        d, n, "s" if n > 1 else "", st[0]))

    # -- reports
    def cell(self, r, digits=2):
        if r is None:
            return "n/a"
        return fmt_stat((r["median"], r["min"], r["max"], r["n"]), digits)

    def beside_table(self, L, base):
        """The baseline's runs right beside each proxy's bulk cells (bench/runner.py Beside)
        next to the proxy's and the baseline's own block: how far the baseline moved between
        its block and the proxy's."""
        if base is None:
            return
        name = "tcp_bulk_paired_" + base.stack
        T = []
        for s in self.subjects:
            for d, n in self.bulk_cells:
                b = self.get(s, name, d, n, "throughput_gbps")
                if not b:
                    continue
                T.append("| %s | %s %d | %s | %s | %s |" % (
                    s.label, d, n, self.cell(self.get(s, "tcp_bulk", d, n, "throughput_gbps"),
                                             2),
                    self.cell(b, 2), self.cell(self.get(base, "tcp_bulk", d, n,
                                                        "throughput_gbps"), 2)))
        if not T:
            return
        L.append("## TCP bulk: the %s beside each proxy (Gbit/s)" % base.label)
        L.append("")
        L.append("Each proxy's bulk cells are paired with a run of the %s right before or "
                 "after each one, the proxy up and idle meanwhile; the fractions of the %s "
                 "above come from these pairs. Its run in its own block, minutes away, is "
                 "beside them." % (base.label, base.label))
        L.append("")
        L.append("| proxy | cell | proxy | %s beside | %s in its block |" % (base.label,
                                                                           base.label))
        L.append("| --- | --- | --- | --- | --- |")
        L += T
        L.append("")

    def tail_sections(self, L):
        """Not measured, failures, notes: the same in every report."""
        L.append("## Not measured")
        L.append("")
        if self.meta["not_measured"]:
            for x in self.meta["not_measured"]:
                L.append("- %s / %s: %s" % (x["subject"], x["workload"], x["reason"]))
        else:
            L.append("- nothing")
        if self.meta["failures"]:
            L += ["", "## Failures", ""] + ["- " + f for f in self.meta["failures"]]
        if self.notes:
            L += ["", "## Notes", ""] + ["- " + n for n in self.notes]
        L.append("")

    def write_report(self, rows, meta, targets=()):
        L = []
        L.append("# twinstack bench report")
        L.append("")
        L.append("%s run, %s, %d repetition(s), %.0f s, io_mode %s, %s, kernel %s, "
                 "%d CPUs, %s. Each figure: median [min – max] over the repetitions." % (
                     meta["mode"] + (" --smoke (the test suite's sanity run: every wait "
                                     "shortened, figures not for comparison)"
                                     if meta.get("smoke") else ""), meta["started_utc"],
                     meta["repetitions"], meta["duration_s"],
                     meta["io_mode"], self.queues_text(), meta["host"]["kernel"],
                     meta["host"]["cpus"], cc_text(meta)))
        L.append("")
        self.summary_table(L)
        self.targets_section(L, targets)
        self.beside_table(L, self.redirect)
        cols = self.subjects + [self.ceiling]
        stacks = self.stack_subjects()
        L.append("## TCP bulk throughput (Gbit/s, median of per-second iperf3 intervals after a "
                 "%d s warm-up)" % self.bulk_omit)
        L.append("")
        L.append("| direction | streams | " + " | ".join(s.label for s in cols) + " |")
        L.append("| --- | --- |" + " --- |" * len(cols))
        for d, n in self.bulk_cells:
            L.append("| %s | %d | " % (d, n) + " | ".join(
                self.cell(self.get(s, "tcp_bulk", d, n, "throughput_gbps")) for s in cols) +
                " |")
        L.append("")
        L.append("The two-hop ceiling = 1 / (1/reflector + 1/veth), per round and cell: what a "
                 "proxy that terminates TCP on one side of a TUN and opens it again on the veth "
                 "could reach if it cost nothing.")
        L.append("")
        L.append("## Each stack as a fraction of the ceiling")
        L.append("")
        if self.has_ceiling:
            L.append("| direction | streams | " + " | ".join(s.label for s in stacks) + " |")
            L.append("| --- | --- |" + " --- |" * len(stacks))
            for d, n in self.bulk_cells:
                L.append("| %s | %d | " % (d, n) + " | ".join(
                    self.cell(self.get(s, "tcp_bulk", d, n, "ceiling_fraction"), 3)
                    for s in stacks) + " |")
        else:
            L.append("n/a: the ceiling needs both baselines (the reflector was not measured).")
        L.append("")
        self.cost_table(L)
        self.copy_bound_table(L)
        self.hold_table(L)
        other = [r for r in rows if r["workload"] != "tcp_bulk" and r["stack"] != "micro" and
                 not r["workload"].startswith("hold_")]
        if other:
            # Rows by subject (a stack may be measured more ways than one: its label tells).
            order = [s.key for s in cols]
            labels = {s.key: s.label for s in self.subjects}

            def subj_key(r):
                return (r["stack"], r["io_mode"], r["queues"])
            L.append("## Other workloads and figures")
            L.append("")
            L.append("| subject | workload | metric | unit | median | min | max | n |")
            L.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
            for r in sorted(other, key=lambda r: (r["workload"], r["direction"] or "",
                                                   r["streams"] or 0, r["metric"],
                                                   order.index(subj_key(r))
                                                   if subj_key(r) in order else 99)):
                L.append("| %s | %s | %s | %s | %s | %s | %s | %d |" % (
                    labels.get(subj_key(r), r["stack"]), r["workload"] + (
                        "" if r["direction"] is None else " %s x%d" % (r["direction"],
                                                                      r["streams"])),
                    r["metric"],
                    r["unit"], fmt(r["median"]), fmt(r["min"]), fmt(r["max"]), r["n"]))
            L.append("")
        micro = [r for r in rows if r["stack"] == "micro"]
        if micro:
            L.append("## Micro-benchmarks (callgrind instructions per op, deterministic)")
            L.append("")
            L.append("| case | instructions |")
            L.append("| --- | --- |")
            for r in micro:
                L.append("| %s | %.1f |" % (r["workload"], r["median"]))
            L.append("")
        self.tail_sections(L)
        L.append("## Method")
        L.append("")
        L.append("- Subjects are interleaved: each repetition round runs every subject once "
                 "through every workload, in an order rotated per round.")
        if any(k[3].endswith("_paired") for k in self.samples):
            L.append("- Back to back: each round then measures the short cells whose "
                     "targets compare a stack with a baseline again, each stack in a fresh "
                     "child right beside a fresh run of its baseline (connection rate and "
                     "latency: the redirect; UDP echo 64 B: the veth), which of the two first "
                     "alternating by round: rows WL_paired (the stack) and WL_paired_BASE (the "
                     "baseline beside it, recorded under the stack). In a round's blocks the "
                     "two runs of a cell are minutes apart, and a shared machine's speed can "
                     "move between them. The connection rate's redirect_fraction, the "
                     "latency's p50 over the redirect's and UDP echo over the veth come from "
                     "these pairs; every other figure from the blocks.")
        if any(k[3] == "tcp_bulk_paired_redirect" for k in self.samples):
            L.append("- TCP bulk beside: each proxy's bulk cells run in its block, and the "
                     "redirect baseline runs each cell right before or after it (alternating "
                     "by round), started once on standby beside the proxy, which stays up "
                     "and idle meanwhile; the target is routed to the redirect only for its "
                     "run (row tcp_bulk_paired_redirect, recorded under the proxy). The bulk "
                     "cells' redirect_fraction comes from these pairs. (A fresh proxy child "
                     "per pair would understate a stack warmed by its block.)")
        L.append("- veth: iperf3 over the bare veth from A to B (the physical path). reflector: "
                 "`twinstack reflect` swaps addresses on the TUN, iperf3 from %s to the mirror "
                 "%s (one TCP connection through the TUN, both directions). Stacks: `twinstack "
                 "run` with a generated config (tun.offload %s), target %s on B's loopback "
                 "routed into the TUN, outbound sockets marked and routed over the veth. Each "
                 "child's TUN is checked after start (ethtool -k: checksum and TSO offload on "
                 "exactly with offload; one TUN fd)." % (
                     self.gw, self.mirror, "on" if self.io_mode == "offload" else "off",
                     self.target))
        L.append("- Throughput: iperf3 -J, %d s after a %d s warm-up (-O), the median of the "
                 "per-second sums (not the mean: one stall does not move it)." % (
                     self.bulk_t, self.bulk_omit))
        L.append("- CPU: utime/stime deltas of the proxy process (/proc/PID/stat) across each "
                 "bulk run; kernel TCP work done inside the proxy's TUN writes is sys time.")
        L.append("- Memory: peak_rss_kb = VmHWM at the end of a round; idle_rss_kb = VmRSS after "
                 "%d s without traffic. With %s connections held (`load hold`, 0.5 s after all "
                 "are open): user_bytes_per_conn = /stats buffers.per_session_bytes; "
                 "kernel_kb_per_conn = (sum over the proxy's TCP sockets of skmem r+w+f+o+bl "
                 "from `ss -tmp` + /stats splice.pipe_bytes) / the proxy's sessions; rss_kb, "
                 "rss_anon_kb = the proxy's VmRSS, RssAnon then; conns_held = the fewest of "
                 "connected, sessions in the proxy and echoed back through it." % (
                     1 if self.meta.get("smoke") else 5,
                     " and ".join("%d" % n for n in self.hold_counts()) or
                     "%d" % self.hold_conns))
        L.append("- Idle wakeups: voluntary + nonvoluntary context switches of the proxy over "
                 "%d s with no traffic, right after start-up%s." % (
                     self.idle_s, "" if self.idle_s == 20 else
                     " (--quick: 5 s, not 20 s; the metric keeps its name)"))
        L.append("- Quote ratios from one run; absolute numbers depend on the machine.")
        L.append("")
        L.append("Charts: throughput.svg, memory_per_conn.svg. Raw logs and configs: work/.")
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(L) + "\n")

    def hold_counts(self):
        """The connection counts of the hold cells measured (hold_1000, hold_10000, ...)."""
        return sorted({int(k[3][5:]) for k in self.samples
                       if k[3].startswith("hold_") and k[3][5:].isdigit()})

    def hold_subjects(self):
        return [s for s in self.subjects if any(
            self.get(s, "hold_%d" % n, None, n, m) for n in self.hold_counts()
            for m in ("user_bytes_per_conn", "kernel_kb_per_conn", "conns_held"))]

    def hold_table(self, L):
        """Memory with connections held: per subject and hold cell, the count held, the
        memory per connection, the proxy's RSS, and RssAnon's growth over the hold per
        connection held."""
        counts, subs = self.hold_counts(), self.hold_subjects()
        if not counts or not subs:
            return
        L.append("## Memory with connections held")
        L.append("")
        L.append("`load hold` opens the connections (256 connects in flight) through the proxy "
                 "to the echo server; 0.5 s after all are open the proxy's figures are read. "
                 "Held: the fewest of connected, sessions in the proxy (/stats) and echoed back "
                 "through it; per connection: over the proxy's sessions. RssAnon growth: "
                 "RssAnon while held minus right before the hold, over the connections held. "
                 "The larger cells run in a fresh child at the end of the subject's round "
                 "(their memory would stay in the round's other figures). A cell that held "
                 "fewer than asked names its limit under Notes.")
        L.append("")
        L.append("| subject | connections | held | userspace B/conn | kernel KiB/conn | "
                 "VmRSS MiB | RssAnon MiB | RssAnon growth KiB/conn |")
        L.append("|" + " --- |" * 8)
        for s in subs:
            for n in counts:
                wl = "hold_%d" % n

                def g(m, s=s, wl=wl, n=n):
                    return self.get(s, wl, None, n, m)
                held = g("conns_held")
                # per round: (during - before) / held, paired
                during = self.by_round(s, wl, None, n, "rss_anon_kb")
                before = self.by_round(s, wl, None, n, "rss_anon_before_kb")
                nheld = self.by_round(s, wl, None, n, "conns_held")
                grow = fmt_stat(summary([(during[r] - before[r]) / nheld[r] for r in
                                         sorted(during) if r in before and nheld.get(r)]), 2)
                L.append("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
                    s.label, n, self.cell(held, 0), self.cell(g("user_bytes_per_conn"), 0),
                    self.cell(g("kernel_kb_per_conn"), 2),
                    fmt_stat(self.stat(s, wl, None, n, "rss_kb"), 1, 1 / 1024.0),
                    fmt_stat(self.stat(s, wl, None, n, "rss_anon_kb"), 1, 1 / 1024.0), grow))
        L.append("")

    def cost_table(self, L):
        metrics = ["cpu_user_s", "cpu_sys_s", "tun_drops", "retransmits", "rps_switches",
                   "loop_busy_pct", "proxy_cpu_s_per_gb", "testbed_cpu_s_per_gb",
                   "testbed_cpus_busy"]
        heads = ["cpu user s", "cpu sys s", "TUN drops", "retransmits", "steering switches",
                 "loop busy %", "proxy CPU s/GB", "testbed CPU s/GB", "testbed CPUs busy"]
        if self.socks5:
            metrics += ["server_cpu_s", "server_cpus_busy", "server_cpu_s_per_gb"]
            heads += ["SOCKS5 server cpu s", "SOCKS5 server CPUs busy", "SOCKS5 server CPU s/GB"]
        T = []
        for s in self.subjects:
            for d, n in self.bulk_cells:
                vals = [self.get(s, "tcp_bulk", d, n, m) for m in metrics]
                if all(v is None for v in vals):
                    continue
                T.append("| %s | %s | %d | %s |" % (s.label, d, n, " | ".join(
                    self.cell(v, 0 if 2 <= i <= 5 else 2) for i, v in enumerate(vals))))
        if not T:
            return
        L.append("## Cost of the bulk runs (per cell, per run)")
        L.append("")
        L.append("CPU per byte: CPU seconds per GB iperf3 moved (warm-up included), of the proxy "
                 "process (utime + stime) and of the whole testbed (every CPU's busy time from "
                 "/proc/stat: clients, servers, proxy and their kernel work); testbed CPUs busy "
                 "= that time over the run's seconds. On a machine this small the client, "
                 "server and proxy share the CPUs, so a subject that burns more CPU can look as "
                 "fast: compare Gbit/s at equal CPU (cpu_vs_throughput.svg).")
        L.append("")
        L.append("| subject | direction | streams | " + " | ".join(heads) + " |")
        L.append("|" + " --- |" * (3 + len(heads)))
        L += T + [""]

    def write_ablation_report(self, meta, targets):
        stacks = self.stack_subjects()
        order = [(d, n) for n in (1, 16, 64) for d in ("up", "down") if (d, n) in self.bulk_cells]
        pairs = self.diff_pairs()
        L = ["# twinstack bench --ablation report", ""]
        L.append("%s, %d round(s), %.0f s (estimate %d s, limit %d s), iperf3 -t %d -O %d, "
                 "kernel %s, %d CPUs. Interleaved: each round runs every subject through each "
                 "cell, the order rotated per cell; every TUN run is a fresh child. Figures: "
                 "median [min – max] over the rounds; differences are per-round ratios "
                 "(paired), then median [min – max]. %s." % (
                     meta["started_utc"], meta["repetitions"], meta["duration_s"],
                     meta["estimate_s"], meta["time_limit_s"], self.bulk_t, self.bulk_omit,
                     meta["host"]["kernel"], meta["host"]["cpus"], cc_text(meta)))
        L.append("")
        L.append("## TCP bulk by stack and I/O mode (one row per stream count and direction)")
        L.append("")
        L.append("Throughput in Gbit/s (median of per-second iperf3 intervals after the "
                 "warm-up); Δ in percent; peak RSS in MiB (VmHWM of a child that ran only this "
                 "cell).")
        L.append("")
        head = ["streams", "direction"] + [s.label for s in stacks] + \
            ["Δ " + lab for lab, _, _ in pairs] + ["RSS " + s.label for s in stacks]
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + " --- |" * len(head))
        for d, n in order:
            c = [str(n), d]
            c += [fmt_stat(self.stat(s, "tcp_bulk", d, n, "throughput_gbps")) for s in stacks]
            c += [self.fmt_pct(self.pct(a, b, d, n)) for _, a, b in pairs]
            c += [fmt_stat(self.stat(s, "tcp_bulk", d, n, "peak_rss_kb"), 1, 1 / 1024.0)
                  for s in stacks]
            L.append("| " + " | ".join(c) + " |")
        L.append("")
        L.append("## Baselines, the two-hop ceiling, and each subject's fraction of it")
        L.append("")
        L.append("Ceiling = 1 / (1/reflector + 1/veth) per round and cell, from the reflector "
                 "with offload (%s): what a proxy that terminates TCP on one side of a TUN and "
                 "opens it again on the veth could reach if it cost nothing." %
                 self.ceiling_ref.label)
        L.append("")
        base = [s for s in self.subjects if not s.is_stack] + [self.ceiling]
        fr = self.fraction_subjects()
        head = ["streams", "direction"] + [s.label + " Gbit/s" for s in base] + \
            ["fraction " + s.label for s in fr]
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + " --- |" * len(head))
        for d, n in order:
            c = [str(n), d]
            c += [fmt_stat(self.stat(s, "tcp_bulk", d, n, "throughput_gbps")) for s in base]
            c += [fmt_stat(self.stat(s, "tcp_bulk", d, n, "ceiling_fraction"), 3) for s in fr]
            L.append("| " + " | ".join(c) + " |")
        L.append("")
        L.append("## Targets (the ablation's acceptance targets, on the medians of this run)")
        L.append("")
        L.append(tally(targets) + ".")
        L.append("")
        L.append("```")
        for t in targets:
            L.append("%-4s  %s: %s (target %s)" % (t["verdict"], t["what"], t["shown"],
                                                   t["target"]))
        L.append("```")
        L.append("")
        sl = self.pct(self.find("system", "offload"), self.find("lwip", "offload"), "up", 1)
        if sl is not None or any(lab.startswith("system vs lwip") for lab, _, _ in pairs):
            L.append("System vs lwIP with offload (reported, not a target; the system netstack "
                     "article's headline was +42%% over smoltcp at one stream): see the Δ "
                     "system vs lwip column%s." % (
                         "; up, 1 stream: %+.1f %%" % sl[0] if sl else ""))
            L.append("")
        self.cost_table(L)
        self.copy_bound_table(L)
        self.tail_sections(L)
        L.append("## Method")
        L.append("")
        L.append("- Subjects: veth (iperf3 over the bare veth), the reflector (`twinstack "
                 "reflect`, iperf3 from %s to the mirror %s) with offload and per-packet I/O, "
                 "and each stack as `twinstack run` with a generated config: tun.offload "
                 "\"off\" (per-packet) or \"on\" (offload: a refusal fails the start), "
                 "tun.queues 1 or 2. After each start the rig checks the TUN from the kernel's "
                 "side (ethtool -k: checksum and TSO offload on exactly with offload; the "
                 "child holds as many TUN fds as queues) and does not measure a child that "
                 "fell back." % (self.gw, self.mirror))
        L.append("- Workload: iperf3 -J -P N -t %d -O %d (-R for down) to %s on B through the "
                 "TUN; throughput = the median of the per-second sums after the warm-up." % (
                     self.bulk_t, self.bulk_omit, self.target))
        L.append("- results.json rows carry stack / io_mode / queues / workload / direction / "
                 "streams, so `twinstack gate` compares the ceiling_fraction of two ablation "
                 "runs (or of an ablation and a default bench) row by row, when both ran the "
                 "same TCP congestion control.")
        L.append("")
        L.append("Chart: ablation_throughput.svg / .png (`gnuplot ablation_throughput.gp`). "
                 "Raw logs and configs: work/.")
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(L) + "\n")

    def socks5_bound_table(self, L, pairs):
        """The TCP cells against the redirect baseline through the same server: what the
        cheapest terminating proxy reaches of the plain client (the bound for a TUN proxy,
        which must end the application's TCP too), and each proxy as a fraction of it."""
        rv = self.redirect_via()
        if rv is None:
            return
        rest = [via for _, via in pairs if via is not rv]
        L.append("## TCP bulk against the redirect baseline through the same server")
        L.append("")
        L.append("No TUN: nftables redirects iperf3's connections to `twinstack redirect "
                 "--socks5`, which ends them and relays (splice) through a CONNECT to the "
                 "same server. Any proxy that ends the application's TCP, a TUN proxy "
                 "included, pays at least this on top of the plain client, so its column "
                 "over the plain client is the most such a proxy can reach here.")
        L.append("")
        head = ["figure", "%s / plain" % rv.label] + ["%s / %s" % (v.label, rv.label)
                                                       for v in rest]
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + " --- |" * len(head))
        for wl, d, n, metric in self.socks5_figures():
            if wl != "tcp_bulk":
                continue
            c = ["TCP %s, %d stream%s" % (d, n, "s" if n > 1 else ""),
                 fmt_stat(self.stat(rv, wl, d, n, "plain_socks5_fraction"), 3)]
            c += [fmt_stat(self.stat(v, wl, d, n, "redirect_socks5_fraction"), 3) for v in rest]
            L.append("| " + " | ".join(c) + " |")
        L.append("")

    def write_socks5_report(self, meta, targets):
        pairs = self.socks5_pairs()
        plain = next((s for s in self.subjects if s.stack == "socks5-client"), None)
        s5 = meta.get("socks5") or {}
        L = ["# twinstack bench --via socks5 report", ""]
        L.append("%s, %d round(s), %.0f s, io_mode %s, kernel %s, %d CPUs, %s. SOCKS5 server: "
                 "%s at %s in the server namespace, no authentication. Interleaved: each round "
                 "runs every subject once, the order rotated per round. Figures: median [min – "
                 "max] over the rounds; ratios are per round (paired), then median [min – "
                 "max]." % (meta["started_utc"], meta["repetitions"], meta["duration_s"],
                            meta["io_mode"], meta["host"]["kernel"], meta["host"]["cpus"],
                            cc_text(meta), s5.get("server", "?"), s5.get("address", "?")))
        L.append("")
        L.append("## TCP bulk (Gbit/s) and UDP echo (packets/s): direct, via SOCKS5, and the "
                 "plain SOCKS5 client")
        L.append("")
        head = ["figure", plain.label if plain else "plain socks5"]
        for direct, via in pairs:
            head += ([direct.label] if direct else []) + [via.label, "%s / plain" % via.label]
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + " --- |" * len(head))
        for wl, d, n, metric in self.socks5_figures():
            what = "TCP %s, %d stream%s" % (d, n, "s" if n > 1 else "") if wl == "tcp_bulk" \
                else "UDP echo 64 B, packets/s"
            digits = 2 if wl == "tcp_bulk" else 0
            c = [what, fmt_stat(self.stat(plain, wl, d, n, metric), digits)]
            for direct, via in pairs:
                if direct:
                    c.append(fmt_stat(self.stat(direct, wl, d, n, metric), digits))
                c += [fmt_stat(self.stat(via, wl, d, n, metric), digits),
                      fmt_stat(self.stat(via, wl, d, n, "plain_socks5_fraction"), 3)]
            L.append("| " + " | ".join(c) + " |")
        L.append("")
        self.beside_table(L, plain)
        self.socks5_bound_table(L, pairs)
        self.cpu_bound_table(L, plain)
        L.append("## Targets (each stack via SOCKS5 at least %.1f of the plain SOCKS5 client, "
                 "on the medians of this run)" % SOCKS5_TARGET)
        L.append("")
        L.append(tally(targets) + ".")
        L.append("")
        L.append("```")
        for t in targets:
            L.append("%-4s  %s: %s (target %s)" % (t["verdict"], t["what"], t["shown"],
                                                   t["target"]))
        L.append("```")
        L.append("")
        L.append("## Other figures")
        L.append("")
        L.append("| subject | UDP loss % | start-up ms | peak RSS KiB |")
        L.append("| --- | --- | --- | --- |")
        for sj in self.subjects:
            L.append("| %s | %s | %s | %s |" % (
                sj.label, fmt_stat(self.stat(sj, "udp_echo_64B", None, None, "loss_pct"), 3),
                fmt_stat(self.stat(sj, "startup", None, None, "startup_ms"), 1),
                fmt_stat(self.stat(sj, "run", None, None, "peak_rss_kb"), 0)))
        L.append("")
        self.cost_table(L)
        self.copy_bound_table(L)
        self.tail_sections(L)
        L.append("## Method")
        L.append("")
        L.append("- plain socks5: no TUN. TCP: `%s` to %s on B, so every connect() of iperf3 "
                 "(its control and data connections) becomes a CONNECT through the server. UDP: "
                 "`%s`: UDP ASSOCIATE on a TCP control connection, then each datagram to the "
                 "relay with the RFC 1928 header, each echo back with it." % (
                     s5.get("tcp_client", "proxychains4 iperf3"), self.target,
                     s5.get("udp_client", "twinstack load udp --socks5")))
        if any(k[3] == "tcp_bulk_paired_socks5-client" for k in self.samples):
            L.append("- TCP bulk beside: each stack via SOCKS5 (and each external subject) "
                     "runs its bulk cells in its block, and the plain client runs each cell "
                     "right before or after it (alternating by round), the stack up and idle "
                     "meanwhile (row tcp_bulk_paired_socks5-client, recorded under the "
                     "stack). The bulk cells' ratios to the plain client come from these "
                     "pairs; the UDP echo's from the blocks.")
        if self.redirect_via():
            L.append("- redirect via socks5: no TUN. nftables in A redirects the target's TCP to "
                     "`twinstack redirect --socks5 %s`: a kernel listener, the product's "
                     "dispatcher, its SOCKS5 outbound (CONNECT, marked sockets) and splice "
                     "relay. TCP only." % s5.get("address", "?"))
        L.append("- <stack>: `twinstack run`, outbound direct (the default run's subject). "
                 "<stack> via socks5: the same with one outbound `{\"type\": \"socks5\", "
                 "\"server\": \"%s\", \"udp\": true, \"routing_mark\": 1}` and "
                 "`route.final` pointing at it: TCP by CONNECT, UDP by UDP ASSOCIATE." %
                 s5.get("address", "?"))
        L.append("- TCP bulk: iperf3 -J -P N -t %d -O %d (-R for down), the median of the "
                 "per-second sums after the warm-up. UDP echo: `twinstack load udp --size 64 "
                 "--duration %s`, at most 64 datagrams outstanding." % (
                     self.bulk_t, self.bulk_omit, s5.get("udp_seconds", "?")))
        L.append("- The server runs in the same 2-core budget as everything else: the ratios "
                 "say what the TUN and the proxy cost on top of a SOCKS5 client that is already "
                 "limited by the server.")
        L.append("")
        L.append("Charts: socks5_throughput.svg / .png (`gnuplot socks5_throughput.gp`)%s. Raw "
                 "logs and configs: work/." % (
                     "; socks5_cpu_bound.svg / .png (each proxy's fraction of the plain client, "
                     "measured and with every CPU busy, and the target line)" if any(
                         k[-1] == "cpu_bound_plain" for k in self.dsamples) else ""))
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(L) + "\n")

    # -- --sniff
    SNIFF_FIGURES = (("connrate", "conn_per_s", "connections/s", 0),
                     ("latency_64B", "latency_p50_us", "latency p50 µs", 0),
                     ("latency_64B", "latency_p99_us", "latency p99 µs", 0))

    def sniff_ratio(self, base, subj, wl, metric):
        """subj's figure over base's, paired by round: median [min – max]."""
        a = self.by_round(subj, wl, None, None, metric)
        b = self.by_round(base, wl, None, None, metric)
        return summary([a[r] / b[r] for r in sorted(a) if r in b and b[r]])

    def write_sniff_report(self, meta):
        L = ["# twinstack bench --sniff report", ""]
        L.append("%s, %d round(s), %.0f s, io_mode %s, kernel %s, %d CPUs, %s. Interleaved: "
                 "each round runs every subject once, the order rotated per round. Figures: "
                 "median [min – max] over the rounds; ratios to the same stack without "
                 "sniffing are per round (paired), then median [min – max]." % (
                     meta["started_utc"], meta["repetitions"], meta["duration_s"],
                     meta["io_mode"], meta["host"]["kernel"], meta["host"]["cpus"],
                     cc_text(meta)))
        L.append("")
        head = ["subject"]
        for _, _, what, _ in self.SNIFF_FIGURES:
            head += [what, "ratio"]
        head += ["connections looked at", "look timeouts"]
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + " --- |" * len(head))
        for sj in self.subjects:
            base = self.find(sj.stack, sj.io_mode.split("-sniff")[0], sj.queues)
            c = [sj.label]
            for wl, metric, _, digits in self.SNIFF_FIGURES:
                c.append(fmt_stat(self.stat(sj, wl, None, None, metric), digits))
                c.append("1" if sj is base else
                         fmt_stat(self.sniff_ratio(base, sj, wl, metric), 3))
            c.append(fmt_stat(self.stat(sj, "sniff", None, None, "sniff_started"), 0))
            c.append(fmt_stat(self.stat(sj, "sniff", None, None, "sniff_timeouts"), 0))
            L.append("| " + " | ".join(c) + " |")
        L.append("")
        self.tail_sections(L)
        L.append("## Method")
        L.append("")
        L.append("- <stack>: `twinstack run`, outbound direct, no rules. <stack> sniff idle: "
                 "`route.sniff` on (timeout 300 ms) with one name rule (to a reject "
                 "outbound, for a name nobody sends) for port 443 only: the "
                 "workloads' ports are covered by no name rule, so no connection is looked at "
                 "(what sniffing costs a flow it does not concern). <stack> sniff look: the same "
                 "rule without a port: every connection waits for its first bytes and is "
                 "looked at (they name nothing, so the route stays the same).")
        L.append("- Connection rate: `twinstack load connrate` (connect, a short request, its "
                 "echo, close; %s connections in flight). Latency: `twinstack load latency` "
                 "(64 B request/response on one connection). %s s each." % (
                     "16" if meta["mode"] == "quick" else "16 (--quick) or 32",
                     meta.get("load_seconds", "?")))
        L.append("- \"connections looked at\" and \"look timeouts\" are the proxy's "
                 "`sniff.started` and `sniff.timeouts` after the workloads.")
        L.append("")
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(L) + "\n")

    # -- --beside-check
    def beside_over_alone(self, s, d, n):
        """Per round the redirect's throughput beside stack s (s up and idle) over its own
        alone (no stack, no TUN) in cell (d, n), both recorded under s: {round: ratio}."""
        b = self.by_round(s, "tcp_bulk_paired_redirect", d, n, "throughput_gbps")
        a = self.by_round(s, "tcp_bulk_alone_redirect", d, n, "throughput_gbps")
        return {r: b[r] / a[r] for r in sorted(b) if a.get(r, 0) > 0}

    def write_beside_check_report(self, meta):
        L = ["# twinstack bench --beside-check report", ""]
        L.append("%s, %d round(s), %.0f s, kernel %s, %d CPUs, %s. Does a stack that sits up "
                 "and idle beside the redirect baseline change the baseline's figures? Each "
                 "round, per stack and TCP bulk cell: the stack started for the cell with the "
                 "redirect right beside it (the stack up and idle meanwhile, as in a full "
                 "run), and the redirect alone (no stack process, no TUN) right before or "
                 "after it. "
                 "Figures: median [min – max] over the rounds; ratios per round (paired), "
                 "then median [min – max]." % (
                     meta["started_utc"], meta["repetitions"], meta["duration_s"],
                     meta["host"]["kernel"], meta["host"]["cpus"], cc_text(meta)))
        L.append("")
        L.append("| stack | cell | stack (Gbit/s) | redirect beside | redirect alone | "
                 "beside / alone | rounds lower beside | stack / beside | stack / alone |")
        L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        allr, lower_cells, cells = [], 0, 0
        for s in self.stack_subjects():
            for d, n in self.bulk_cells:
                r = self.beside_over_alone(s, d, n)
                own = self.by_round(s, "tcp_bulk", d, n, "throughput_gbps")
                bes = self.by_round(s, "tcp_bulk_paired_redirect", d, n, "throughput_gbps")
                alo = self.by_round(s, "tcp_bulk_alone_redirect", d, n, "throughput_gbps")
                st = summary(list(r.values()))
                if st:
                    allr += list(r.values())
                    cells += 1
                    lower_cells += st[0] < 1
                L.append("| %s | %s %d | %s | %s | %s | %s | %s | %s | %s |" % (
                    s.label, d, n, fmt_stat(summary(list(own.values()))),
                    fmt_stat(summary(list(bes.values()))),
                    fmt_stat(summary(list(alo.values()))), fmt_stat(st, 3),
                    "%d of %d" % (sum(v < 1 for v in r.values()), len(r)) if r else "n/a",
                    fmt_stat(summary([own[k] / bes[k] for k in own if bes.get(k, 0) > 0]), 3),
                    fmt_stat(summary([own[k] / alo[k] for k in own if alo.get(k, 0) > 0]), 3)))
        L.append("")
        st = summary(allr)
        L.append("Over every cell and round: beside / alone %s; %d of %d rounds and %d of %d "
                 "cell medians lower beside. Where beside / alone is under 1, a stack's "
                 "fraction of the redirect beside it reads higher than of the redirect alone "
                 "by as much." % (fmt_stat(st, 3), sum(v < 1 for v in allr), len(allr),
                                  lower_cells, cells))
        L.append("")
        self.tail_sections(L)
        L.append("## Method")
        L.append("")
        L.append("- Beside: `twinstack run` of the stack (as in a full run), iperf3 through "
                 "it and through the redirect beside it, which of the two first alternating "
                 "by round; the redirect (started on standby with the stack) gets the "
                 "target's TCP for its run (the route over the veth and the REDIRECT rule "
                 "set) and gives it back right after, the stack up and idle meanwhile (row "
                 "tcp_bulk_paired_redirect, under the stack); then the stack is stopped.")
        L.append("- Alone: no stack process and no TUN, `twinstack redirect` started as in "
                 "its own block of a full run, the same cell (row tcp_bulk_alone_redirect, "
                 "under the stack it is paired with).")
        L.append("- iperf3 -t %d -O %d per run; beside first or alone first alternates by "
                 "round, stack and cell; the stacks' order rotates by round." % (
                     self.bulk_t, self.bulk_omit))
        L.append("")
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(L) + "\n")

    @staticmethod
    def fmt_pct(st):
        med, _, rng = fmt_stat(st, 1, signed=True).partition(" ")
        return med if st is None else med + " %" + (" " + rng if rng else "")

    def gnuplot(self, script, name):
        r = subprocess.run(["gnuplot", script], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            self.notes.append("charts: gnuplot %s failed: %s" % (name, r.stderr.strip()[:200]))
            log("warning: gnuplot %s: %s" % (name, r.stderr.strip()[:200]))
            return False
        return True

    def bar_chart(self, name, title, ylabel, header, series, extra=""):
        """Grouped bars with error bars: one group per bulk cell, one bar per series (label,
        fn(d, n) -> its summary or None, gnuplot style appended to its plot item), the
        [min – max] of the rounds as error bars; extra: more gnuplot set-up lines. NAME.dat,
        NAME.gp and the SVG and PNG they draw, next to the report."""
        order = [(d, n) for n in (1, 16, 64) for d in ("up", "down") if (d, n) in self.bulk_cells]
        base = os.path.join(self.out, name)
        with open(base + ".dat", "w") as f:
            f.write("# cell, then median min max per subject: %s\n" % header)
            for d, n in order:
                v = []
                for _, fn, _ in series:
                    st = fn(d, n)
                    v += ["%.4f %.4f %.4f" % st[:3]] if st else ["NaN NaN NaN"]
                f.write("\"%d %s\" %s\n" % (n, d, " ".join(v)))
        plot = ", ".join("'%s.dat' using %d:%d:%d%s title '%s'%s" % (
            base, 2 + 3 * i, 3 + 3 * i, 4 + 3 * i, ":xtic(1)" if i == 0 else "", label, style)
            for i, (label, _, style) in enumerate(series))
        common = ("set title '%s (median, bars: "
                  "min-max of %d rounds)'\n"
                  "set ylabel '%s'\nset xlabel 'streams, direction'\n"
                  "set style data histograms\nset style histogram errorbars gap 1 lw 1\n"
                  "set style fill solid 0.85 border -1\nset boxwidth 0.9\n"
                  "set key outside right top\nset grid ytics\nset yrange [0:*]\n%s" % (
                      title, self.reps, ylabel, extra))
        with open(base + ".gp", "w") as f:
            f.write("set terminal svg size 1200,520 dynamic enhanced font 'sans,11' background "
                    "'white'\nset output '%s.svg'\n%splot %s\n" % (base, common, plot))
            f.write("set terminal pngcairo size 1200,520 enhanced font 'sans,10' background "
                    "'white'\nset output '%s.png'\nreplot\n" % base)
        self.gnuplot(base + ".gp", name)

    def ablation_charts(self, name="ablation_throughput",
                        title="TCP bulk throughput by stack and TUN I/O mode"):
        """Grouped bars: one group per cell, one bar per subject and the ceiling (bar_chart)."""
        if not shutil.which("gnuplot"):
            note_once(self.notes, "charts: gnuplot not installed, %s not drawn" % name)
            return
        cols = [s for s in self.subjects + [self.ceiling] if any(
            self.stat(s, "tcp_bulk", d, n, "throughput_gbps") for d, n in self.bulk_cells)]
        if not cols:
            note_once(self.notes, "charts: no throughput figures, %s not drawn" % name)
            return
        self.bar_chart(name, title, "Gbit/s", ", ".join(s.label for s in cols), [
            (s.label, lambda d, n, s=s: self.stat(s, "tcp_bulk", d, n, "throughput_gbps"),
             " lc rgb '%s'" % BAR_COLORS[s.key] if s.key in BAR_COLORS else "") for s in cols])

    def socks5_cpu_chart(self, name="socks5_cpu_bound"):
        """--via socks5: per bulk cell, each proxy's fraction of the plain client beside its
        fraction with every CPU busy (derive_cpu_bound), and the target line (bar_chart);
        nothing without those figures."""
        cols = [s for _, s in self.socks5_pairs() if any(
            self.stat(s, "tcp_bulk", d, n, "cpu_bound_plain") for d, n in self.bulk_cells)]
        if not cols:
            return
        if not shutil.which("gnuplot"):
            note_once(self.notes, "charts: gnuplot not installed, %s not drawn" % name)
            return
        # One colour per subject (its own where it has one), solid measured, hatched bound.
        spare = ["#17becf", "#8c564b", "#bcbd22", "#7f7f7f"]
        colour, k = {}, 0
        for s in cols:
            colour[s.key] = BAR_COLORS.get(s.key) or BAR_COLORS.get(s.key[:2] + (1,))
            if not colour[s.key]:
                colour[s.key], k = spare[k % len(spare)], k + 1
        series = [(s.label + ("" if m == "plain_socks5_fraction" else ", every CPU busy"),
                   lambda d, n, s=s, m=m: self.stat(s, "tcp_bulk", d, n, m),
                   " lc rgb '%s'%s" % (colour[s.key],
                                       " fs pattern 4" if m == "cpu_bound_plain" else ""))
                  for s in cols for m in ("plain_socks5_fraction", "cpu_bound_plain")]
        self.bar_chart(name, "TCP bulk via SOCKS5: fraction of the plain client, measured and "
                       "with every CPU busy", "fraction of the plain SOCKS5 client",
                       "measured, with every CPU busy", series,
                       "set arrow from graph 0, first %.2f to graph 1, first %.2f nohead dt 2 "
                       "lw 2\n" % (SOCKS5_TARGET, SOCKS5_TARGET))

    def cpu_chart(self):
        """cpu_vs_throughput.svg: one point per subject and bulk cell, Gbit/s against the
        testbed's busy CPUs (medians)."""
        if not shutil.which("gnuplot"):
            return
        pts = []
        for s in self.subjects:
            P = []
            for d, n in self.bulk_cells:
                g = self.get(s, "tcp_bulk", d, n, "throughput_gbps")
                c = self.get(s, "tcp_bulk", d, n, "testbed_cpus_busy")
                if g and c:
                    P.append((c["median"], g["median"], "%s%d" % (d[0], n)))
            if P:
                pts.append((s, P))
        if not pts:
            return
        dat = os.path.join(self.out, "cpu_vs_throughput.dat")
        with open(dat, "w") as f:
            for s, P in pts:
                f.write("# %s\n" % s.label)
                for c, g, lab in P:
                    f.write("%.4f %.4f %s\n" % (c, g, lab))
                f.write("\n\n")
        plots = ", ".join("'%s' index %d using 1:2 with points pt 7 ps 1.2 title '%s', "
                          "'' index %d using 1:2:3 with labels offset 0.8,0.6 notitle" % (
                              dat, i, s.label, i) for i, (s, _) in enumerate(pts))
        gp = os.path.join(self.out, "cpu_vs_throughput.gp")
        with open(gp, "w") as f:
            f.write("set terminal svg size 900,520 dynamic enhanced font 'sans,11' background "
                    "'white'\nset output '%s'\n"
                    "set title 'TCP bulk: throughput against the CPU the whole testbed used "
                    "(u/d = up/down, then streams)'\n"
                    "set xlabel 'testbed CPUs busy'\nset ylabel 'Gbit/s'\nset grid\n"
                    "set key outside right top\nset xrange [0:*]\nset yrange [0:*]\n"
                    "plot %s\n" % (os.path.join(self.out, "cpu_vs_throughput.svg"), plots))
        r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
        if r.returncode != 0:
            note_once(self.notes, "charts: gnuplot failed on cpu_vs_throughput.gp: %s" %
                      r.stderr.strip()[:200])

    def charts(self):
        if not shutil.which("gnuplot"):
            note_once(self.notes, "charts: gnuplot not installed, no charts")
            return
        cols = [s for s in self.subjects + [self.ceiling] if any(
            self.get(s, "tcp_bulk", d, n, "throughput_gbps") for d, n in self.bulk_cells)]
        if not cols:
            self.notes.append("charts: no throughput figures, throughput.svg not drawn")
            return
        dat = os.path.join(self.out, "throughput.dat")
        with open(dat, "w") as f:
            f.write("cell " + " ".join(s.label for s in cols) + "\n")
            for d, n in self.bulk_cells:
                vals = []
                for s in cols:
                    r = self.get(s, "tcp_bulk", d, n, "throughput_gbps")
                    vals.append("%.4f" % r["median"] if r else "NaN")
                f.write("\"%s %d\" %s\n" % (d, n, " ".join(vals)))
        gp = os.path.join(self.out, "throughput.gp")
        with open(gp, "w") as f:
            f.write(
                "set terminal svg size 900,480 dynamic enhanced font 'sans,11' background "
                "'white'\n"
                "set output '%s'\n"
                "set title 'TCP bulk throughput (median of runs, %s): stacks vs baselines and "
                "the two-hop ceiling'\n"
                "set ylabel 'Gbit/s'\nset xlabel 'direction, streams'\n"
                "set style data histograms\nset style histogram clustered gap 1\n"
                "set style fill solid 0.85 border -1\nset boxwidth 0.9\nset key outside right top\n"
                "set grid ytics\nset yrange [0:*]\n"
                "plot for [i=2:%d] '%s' using i:xtic(1) title columnheader(i)\n" % (
                    os.path.join(self.out, "throughput.svg"), self.io_mode, len(cols) + 1, dat))
        datm = os.path.join(self.out, "memory_per_conn.dat")
        have_mem = False
        with open(datm, "w") as f:
            f.write("subject user_KiB kernel_KiB\n")
            for s in self.hold_subjects():
                for n in self.hold_counts():
                    u = self.get(s, "hold_%d" % n, None, n, "user_bytes_per_conn")
                    k = self.get(s, "hold_%d" % n, None, n, "kernel_kb_per_conn")
                    if u or k:
                        have_mem = True
                    f.write("\"%s, %d\" %s %s\n" % (
                        s.label, n, "%.3f" % (u["median"] / 1024) if u else "NaN",
                        "%.3f" % k["median"] if k else "NaN"))
        gpm = os.path.join(self.out, "memory_per_conn.gp")
        with open(gpm, "w") as f:
            f.write(
                "set terminal svg size 700,420 dynamic enhanced font 'sans,11' background "
                "'white'\n"
                "set output '%s'\n"
                "set title 'Memory per held connection (%s held)'\n"
                "set ylabel 'KiB per connection'\n"
                "set style data histograms\nset style histogram rowstacked\n"
                "set style fill solid 0.85 border -1\nset boxwidth 0.6\nset key top right inside\n"
                "set grid ytics\nset yrange [0:*]\nset xtics rotate by -25\n"
                "plot '%s' skip 1 using 2:xtic(1) title 'userspace buffers (/stats)', "
                "'' skip 1 using 3 title 'kernel sockets + pipes (ss -tm)'\n" % (
                    os.path.join(self.out, "memory_per_conn.svg"),
                    " and ".join("%d" % n for n in self.hold_counts()) or self.hold_conns,
                    datm))
        self.gnuplot(gp, "throughput")
        if have_mem:
            self.gnuplot(gpm, "memory_per_conn")
        else:
            self.notes.append("charts: no memory-per-connection figures, memory_per_conn.svg "
                              "not drawn")
