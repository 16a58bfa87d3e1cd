#!/usr/bin/env python3
"""rig.py — the twinstack namespace comparison rig (`twinstack bench`, `make bench`).

Builds a two-namespace testbed, measures every subject (the bare veth, the TUN reflector and
each stack as a child `twinstack run`) through every workload, interleaved per repetition
round, writes a table on stdout, and hands the samples to bench/report.py, which writes
results.json, report.md and the charts (gnuplot). `--ablation` instead measures TCP bulk only,
for every TUN I/O mode (per-packet, offload, offload + 2 queues) of each stack and of the
reflector, one fresh child per cell, and checks the ablation's acceptance targets
(docs/benchmarks.md); `--via socks5` measures each stack with its outbound pointed at a SOCKS5
server (dante, in B) next to the same stack direct and a plain SOCKS5 client without a TUN
through the same server; `--report-from FILE` redraws the report of an earlier run.

    ns A (client + proxy)                                   ns B (servers)
    iperf3 -c / load clients                                lo 10.200.1.2/32 (the target)
      main table: 10.200.1.0/24 -> tun (stacks)             iperf3 -s (several ports)
                               -> veth (veth baseline)      load serve (TCP echo ports, UDP echo)
    tun 198.18.0.1/15 (txqueuelen 10000)                    route 198.18.0.0/15 via A
      twinstack run / twinstack reflect
      iperf3 -s (reflector baseline: 198.18.1.1 mirrors back to 198.18.0.1)
    outbound sockets SO_MARK 1; ip rule fwmark 1 -> table 100 (default via B)
    veth 10.200.0.1/24 (txqueuelen 10000) <------------> veth 10.200.0.2/24
                                                            --via socks5: danted 10.200.0.2:1080

Python 3 standard library only. Every wait is bounded; namespaces and processes are torn down
on exit, on SIGINT/SIGTERM/SIGHUP and on errors. Exit: 0 done, 1 a run failed, 2 cannot run.
"""

import argparse
import atexit
import datetime
import json
import os
import platform
import re
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)

# report.py sits next to this file: found whatever the working directory (and under python3
# -I, which leaves the script's directory off sys.path); no __pycache__ in the source tree.
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
sys.dont_write_bytecode = True
import report
from report import UNITS, Report, clear_progress, fmt, log, note_once, out, progress

A_VETH4, B_VETH4 = "10.200.0.1", "10.200.0.2"
TARGET4 = "10.200.1.2"
GW4, MIRROR4 = "198.18.0.1", "198.18.1.1"
TUN_CIDR = "198.18.0.1/15"
STATS_PORT = 9090
IPERF_PORTS = [5201, 5202, 5203, 5204]
REFL_IPERF_PORT = 5301
ECHO_PORTS = [7001, 7002, 7003, 7004]
UDP_PORT = 7007
MARK = 1
S5_PORT = 1080          # --via socks5: dante's port on B's veth address
DANTED = "/usr/sbin/danted"

EXIT_OK, EXIT_FAIL, EXIT_CANNOT = 0, 1, 2

# --ablation: the cells in table order (stream count, then direction), the iperf3 run length,
# the default time limit, and what the estimate adds per iperf3 run (connect, stream set-up,
# JSON) and per child start (TUN, ready byte, the offload check, settling).
ABLATION_CELLS = [(d, n) for n in (1, 16, 64) for d in ("up", "down")]
ABLATION_BULK_S = 5
ABLATION_LIMIT_S = 1800
RUN_OVERHEAD_S = 0.5    # the measured overhead (docs/benchmarks.md), with margin
START_OVERHEAD_S = 0.8  # SETTLE_S + ~0.15 s start and checks, with margin
SETTLE_S = 0.5
STALL_GBPS = 0.01       # a bulk run below 10 Mbit/s stalled: recorded, and a failure


class CannotRun(Exception):
    pass


# ---- process and namespace bookkeeping ------------------------------------------------------

class Testbed:
    def __init__(self, tok, workdir, cc, verbose=False):
        self.tok = tok
        self.cc = cc            # congestion control to pin in both namespaces, or "host"
        self.host_cc = None     # the default a new namespace inherits (read in build)
        self.work = workdir
        self.verbose = verbose
        self.ns_a = "tsbA-" + tok
        self.ns_b = "tsbB-" + tok
        self.veth_a = "tsba" + tok
        self.veth_b = "tsbb" + tok
        self.tun = "tsbt" + tok
        self.namespaces = []
        self.procs = []
        self.torn_down = False

    # -- helpers
    def sh(self, args, timeout=20, check=True, ns=None, capture=True):
        if ns:
            args = ["ip", "netns", "exec", ns] + list(args)
        if self.verbose:
            log("$ " + " ".join(args))
        try:
            r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=capture, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError("timed out after %ss: %s" % (timeout, " ".join(args)))
        if check and r.returncode != 0:
            raise RuntimeError("%s: exit %d: %s" % (" ".join(args), r.returncode,
                                                   (r.stderr or "").strip()[:300]))
        return r

    def spawn(self, ns, args, log_name, stdout=None, pass_fds=(), **kw):
        logf = open(os.path.join(self.work, log_name), "ab")
        full = ["ip", "netns", "exec", ns] + list(args)
        if self.verbose:
            log("& " + " ".join(full))
        p = subprocess.Popen(full, stdin=subprocess.DEVNULL,
                             stdout=stdout if stdout is not None else logf, stderr=logf,
                             pass_fds=pass_fds, **kw)
        logf.close()
        self.procs.append(p)
        return p

    def stop(self, p, grace=3.0):
        if p is None:
            return
        if p.poll() is None:
            try:
                p.terminate()
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    pass
            except ProcessLookupError:
                pass
        if p in self.procs:
            self.procs.remove(p)

    # -- topology
    def build(self):
        for ns in (self.ns_a, self.ns_b):
            self.sh(["ip", "netns", "add", ns])
            self.namespaces.append(ns)
            self.sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            self.sh(["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0",
                     "net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.lo.rp_filter=0",
                     "net.ipv4.ip_local_port_range=1024 65000", "net.ipv4.tcp_tw_reuse=1"],
                    ns=ns)
            self.pin_cc(ns)
        self.sh(["ip", "link", "add", self.veth_a, "netns", self.ns_a, "type", "veth", "peer",
                 "name", self.veth_b, "netns", self.ns_b])
        for ns, dev in ((self.ns_a, self.veth_a), (self.ns_b, self.veth_b)):
            self.sh(["ip", "-n", ns, "link", "set", dev, "txqueuelen", "10000", "up"])
        self.sh(["ip", "-n", self.ns_a, "addr", "add", A_VETH4 + "/24", "dev", self.veth_a])
        self.sh(["ip", "-n", self.ns_b, "addr", "add", B_VETH4 + "/24", "dev", self.veth_b])
        self.sh(["ip", "-n", self.ns_b, "addr", "add", TARGET4 + "/32", "dev", "lo"])
        # A: the proxy's marked outbound sockets leave over the veth (table 100).
        self.sh(["ip", "-n", self.ns_a, "rule", "add", "fwmark", str(MARK), "lookup", "100",
                 "pref", "100"])
        self.sh(["ip", "-n", self.ns_a, "route", "add", "default", "via", B_VETH4, "dev",
                 self.veth_a, "table", "100"])
        # B: the TUN prefix back via A (harmless; the proxy's sockets use A's veth address).
        self.sh(["ip", "-n", self.ns_b, "route", "add", "198.18.0.0/15", "via", A_VETH4])

    def pin_cc(self, ns):
        """Every TCP socket in the testbed (iperf3's, the load tools', the proxy's accepted and
        outbound sockets) takes its namespace's default congestion control. A new namespace
        inherits the host's; a pacing one (bbr) paces each flow with a kernel timer, which can cap
        one flow through the TUN well below the path's capacity while the CPUs idle, and so
        hides the cost of the TUN path the rig is there to measure (docs/benchmarks.md). The
        rig pins an unpaced, loss-based algorithm instead (reno: every namespace may select
        it) unless --cc host."""
        key = "net.ipv4.tcp_congestion_control"
        cur = self.sh(["sysctl", "-n", key], ns=ns).stdout.strip()
        if self.host_cc is None:
            self.host_cc = cur
        if self.cc == "host" or cur == self.cc:
            return
        r = self.sh(["sysctl", "-qw", "%s=%s" % (key, self.cc)], ns=ns, check=False)
        now = self.sh(["sysctl", "-n", key], ns=ns).stdout.strip()
        if r.returncode != 0 or now != self.cc:
            def listed(what):
                return self.sh(["sysctl", "-n", "net.ipv4.tcp_%s_congestion_control" % what],
                               ns=ns, check=False).stdout.strip() or "?"
            raise CannotRun("--cc %s: the testbed's namespaces cannot select it (available: "
                            "%s; a namespace may select: %s; --cc host keeps %s): %s" % (
                                self.cc, listed("available"), listed("allowed"), cur,
                                (r.stderr or "").strip()[:200]))

    def route_target_via_veth(self):
        self.sh(["ip", "-n", self.ns_a, "route", "replace", "10.200.1.0/24", "via", B_VETH4,
                 "dev", self.veth_a])

    def route_target_via_tun(self):
        self.sh(["ip", "-n", self.ns_a, "route", "replace", "10.200.1.0/24", "dev", self.tun,
                 "src", GW4])

    def teardown(self):
        if self.torn_down:
            return
        self.torn_down = True
        for p in list(self.procs):
            try:
                if p.poll() is None:
                    p.terminate()
            except Exception:
                pass
        deadline = time.monotonic() + 2
        for p in list(self.procs):
            try:
                p.wait(timeout=max(0.05, deadline - time.monotonic()))
            except Exception:
                try:
                    p.kill()
                    p.wait(timeout=2)
                except Exception:
                    pass
        # Anything still inside our namespaces was started by this rig.
        for ns in self.namespaces:
            try:
                r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                   timeout=5)
                for pid in r.stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
            except Exception:
                pass
        for ns in self.namespaces:
            try:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
            except Exception:
                pass
        self.namespaces = []


# ---- /proc and tool output ------------------------------------------------------------------

def proc_status(pid):
    d = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                d[k] = v.strip()
    except OSError:
        return None
    return d


def proc_kb(pid, key):
    st = proc_status(pid)
    if not st or key not in st:
        return None
    return int(st[key].split()[0])


def proc_ctxt(pid):
    st = proc_status(pid)
    if not st:
        return None
    return int(st.get("voluntary_ctxt_switches", 0)) + int(st.get("nonvoluntary_ctxt_switches", 0))


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return None
    fields = s[s.rindex(")") + 2:].split()
    # fields[0] is field 3 (state): utime = field 14, stime = field 15
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def last_json(text):
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    # maybe pretty-printed
    i = (text or "").find("{")
    if i >= 0:
        try:
            return json.loads(text[i:])
        except ValueError:
            pass
    return None


# ---- subjects -------------------------------------------------------------------------------

class Subject(report.Subject):
    """One measured thing: a baseline, or a stack in one TUN I/O mode with a queue count (its
    identity and label: report.Subject); here what it takes to start it, and its failures."""

    def __init__(self, stack, io_mode, queues=1, label=None):
        super().__init__(stack, io_mode, queues, label)
        self.start_failures = 0
        self.disabled = False

    @property
    def has_tun(self):
        return self.stack in ("reflector", "system", "lwip")

    @property
    def via_socks5(self):
        """--via socks5: io_mode "<mode>-socks5" is the stack in that TUN I/O mode with its
        outbound pointed at the testbed's SOCKS5 server."""
        return self.io_mode.endswith("-socks5")

    @property
    def sniff(self):
        """--sniff: io_mode "<mode>-sniffidle" is the stack with route.sniff on and a name rule
        that covers no port the workloads use (no flow is looked at: what sniffing costs when
        it does nothing); "<mode>-snifflook" with a name rule that covers every port (every
        connection waits for its first bytes and is looked at)."""
        for m in ("idle", "look"):
            if self.io_mode.endswith("-sniff" + m):
                return m
        return None

    @property
    def tun_mode(self):
        if self.via_socks5:
            return self.io_mode[:-len("-socks5")]
        if self.sniff:
            return self.io_mode[:-len("-sniff" + self.sniff)]
        return self.io_mode

    @property
    def offload(self):
        """tun.offload for the config: "on", never "auto", so a refusal fails the start
        instead of silently measuring per-packet I/O. io_mode "offload-rx" is offload with
        the lwip stack's GSO output trains off (tun.gso_output false): what the trains buy;
        "offload-norps" / "offload-rps" are offload with receive packet steering always off /
        always on (tun.rps "off" / "on"; every other subject runs the default "auto", which
        tries steering under load and keeps it where it pays): what steering buys, and what
        trying it buys over either fixed setting."""
        return "on" if self.tun_mode in ("offload", "offload-rx", "offload-norps",
                                         "offload-rps") else "off"

    @property
    def gso_output(self):
        return self.io_mode != "offload-rx"

    @property
    def rps(self):
        return {"offload-norps": "off", "offload-rps": "on"}.get(self.io_mode, "auto")

    @property
    def slug(self):
        return self.label.replace(" ", "-")


# ---- the rig --------------------------------------------------------------------------------

class Rig:
    def __init__(self, args):
        self.a = args
        self.bin = os.path.abspath(args.bin)
        self.ablation = args.ablation
        self.quick = args.quick
        self.via = getattr(args, "via", None)
        self.sniff = getattr(args, "sniff", False)
        self.mode = "ablation" if self.ablation else "socks5" if self.via else \
            "sniff" if self.sniff else "quick" if self.quick else "full"
        self.io_mode = args.io_mode or "offload"
        self.reps = args.reps if args.reps else (1 if args.quick else 3)
        self.stacks = [s for s in args.stacks.split(",") if s]
        self.out = os.path.abspath(args.out)
        # (stack, io_mode, queues, workload, direction, streams, metric) -> [[round, value]]
        self.samples = {}
        self.na = []            # (subject, workload, reason)
        self.failures = []
        self.notes = []
        self.iperf_port_i = 0
        self.step = 0
        self.total_steps = 1
        self.t0 = time.monotonic()
        self.cur_round = 0
        self.hold_conns = 1000
        self.load_modes = set()
        self.load_socks5 = False    # `twinstack load udp --socks5` exists
        self.dante = None           # --via socks5: the danted process in B
        self.has_reflect = True
        self.time_limit = None
        self.host_meta = None   # --report-from: the host of the earlier run
        self.cc_from = None     # --report-from: the earlier run's congestion control
        self.tb = None          # the testbed, once run() builds it
        self.idle_s, self.load_s = 20, 5
        if self.ablation:
            self.bulk_cells = list(ABLATION_CELLS)
            self.bulk_t, self.bulk_omit = ABLATION_BULK_S, 1
            self.time_limit = args.time_limit or ABLATION_LIMIT_S
        elif self.quick:
            self.bulk_cells = [("up", 1), ("up", 16)]
            self.bulk_t, self.bulk_omit = 3, 1
            self.idle_s, self.load_s = 5, 3
        else:
            self.bulk_cells = [(d, n) for d in ("up", "down") for n in (1, 16, 64)]
            self.bulk_t, self.bulk_omit = 5, 1
        if args.bulk_seconds:
            self.bulk_t = args.bulk_seconds
        self.plan_subjects()

    def plan_subjects(self):
        if self.ablation:
            self.veth = Subject("veth", "offload")
            self.ceiling_ref = Subject("reflector", "offload")
            self.subjects = [self.veth, self.ceiling_ref, Subject("reflector", "per-packet")]
            if "system" in self.stacks:
                self.subjects += [Subject("system", "per-packet"), Subject("system", "offload"),
                                  Subject("system", "offload-norps"),
                                  Subject("system", "offload-rps"),
                                  Subject("system", "offload", 2)]
            if "lwip" in self.stacks:
                self.subjects += [Subject("lwip", "per-packet"), Subject("lwip", "offload"),
                                  Subject("lwip", "offload-rx")]
        elif self.via:
            # No veth or reflector: the baseline here is the plain SOCKS5 client through the
            # same server; each stack runs direct (its usual figures) and via the server.
            m = self.io_mode
            self.veth = self.ceiling_ref = None
            self.subjects = [Subject("socks5-client", m, label="plain socks5")]
            for s in self.stacks:
                self.subjects += [Subject(s, m, label=s),
                                  Subject(s, m + "-socks5", label=s + " via socks5")]
        elif self.sniff:
            # Each stack three ways, no baselines: the figures are ratios to the same stack
            # with sniffing off.
            m = self.io_mode
            self.veth = self.ceiling_ref = None
            self.subjects = []
            for s in self.stacks:
                self.subjects += [Subject(s, m, label=s),
                                  Subject(s, m + "-sniffidle", label=s + " sniff idle"),
                                  Subject(s, m + "-snifflook", label=s + " sniff look")]
        else:
            m = self.io_mode
            self.veth = Subject("veth", m, label="veth")
            self.ceiling_ref = Subject("reflector", m, label="reflector")
            self.subjects = [self.veth, self.ceiling_ref] + [Subject(s, m, label=s)
                                                             for s in self.stacks]
        self.micro_subj = Subject("micro", "n/a", label="micro")

    # -- the plan, before anything runs
    def estimate_s(self):
        """Seconds an ablation takes: every subject through every cell, each round."""
        per_run = self.bulk_t + self.bulk_omit + RUN_OVERHEAD_S
        tun = sum(1 for s in self.subjects if s.has_tun)
        return 15 + self.reps * len(self.bulk_cells) * (len(self.subjects) * per_run +
                                                        tun * START_OVERHEAD_S)

    def plan_text(self):
        L = ["twinstack bench: %s, %d repetition%s, io_mode %s, out %s" % (
            self.mode, self.reps, "s" if self.reps > 1 else "",
            "per-packet,offload" if self.ablation else self.io_mode, self.out)]
        L.append("subjects: " + ", ".join(
            "%s (%s/%s/q%d)" % (s.label, s.stack, s.io_mode, s.queues) for s in self.subjects))
        L.append("tcp bulk cells: " + ", ".join("%s x%d" % c for c in self.bulk_cells) +
                 "; iperf3 -t %d -O %d; TCP congestion control %s" % (
                     self.bulk_t, self.bulk_omit,
                     "of the host" if self.a.cc == "host" else self.a.cc))
        if self.via:
            L.append("socks5: danted (dante-server) at %s:%d in B, no authentication; plain "
                     "client: proxychains4 + iperf3 (TCP), twinstack load udp --socks5 (UDP); "
                     "UDP echo %d B for %d s" % (B_VETH4, S5_PORT, 64, self.load_s))
        if self.ablation:
            est = self.estimate_s()
            L.append("estimate: %dm%02ds for %d runs (%d round%s x %d cells x %d subjects, "
                     "a fresh child per TUN run); time limit %dm%02ds" % (
                         est // 60, est % 60, self.reps * len(self.bulk_cells) *
                         len(self.subjects), self.reps, "s" if self.reps > 1 else "",
                         len(self.bulk_cells),
                         len(self.subjects), self.time_limit // 60, self.time_limit % 60))
        return "\n".join(L)

    # -- capabilities of the binary under test
    def probe_bin(self):
        r = subprocess.run([self.bin, "--help"], capture_output=True, text=True, timeout=10)
        cmds = set()
        for line in (r.stdout + r.stderr).splitlines():
            m = re.match(r"^\s{2}(\w+)\s", line)
            if m:
                cmds.add(m.group(1))
        self.has_run = "run" in cmds
        self.has_reflect = "reflect" in cmds
        self.load_modes = set()
        if "load" in cmds and not self.ablation:
            r = subprocess.run([self.bin, "load", "--help"], capture_output=True, text=True,
                               timeout=10)
            txt = r.stdout + r.stderr
            for m in ("serve", "connrate", "latency", "hold", "udp", "udpflows"):
                if re.search(r"\b%s\b" % m, txt):
                    self.load_modes.add(m)
            self.load_socks5 = "--socks5" in txt
        micro = os.path.join(os.path.dirname(self.bin), "twinstack-micro")
        self.micro = micro if os.path.exists(micro) else None

    def has_load(self, mode):
        return "serve" in self.load_modes and mode in self.load_modes

    # -- sample bookkeeping
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
        self.add(subj, workload, direction, streams, metric, value)
        out("%-20s %-16s %-5s %4s  %-20s %10s %s%s" % (
            subj.label, workload, direction or "", "" if streams is None else streams, metric,
            fmt(value), UNITS.get(metric, ""), ("  " + extra) if extra else ""))

    def tick(self, what):
        self.step += 1
        el = time.monotonic() - self.t0
        left = ""
        if self.step > 1:
            rem = el / (self.step - 1) * max(0, self.total_steps - self.step + 1)
            left = ", ~%dm%02ds left" % (rem // 60, rem % 60)
        progress("[round %d/%d, step %d/%d, %dm%02ds elapsed%s] %s" % (
            self.cur_round, self.reps, self.step, self.total_steps, el // 60, el % 60, left,
            what))

    # -- servers
    def start_servers(self):
        tb = self.tb
        self.iperf_b = []
        for p in IPERF_PORTS:
            self.iperf_b.append(tb.spawn(tb.ns_b, ["iperf3", "-s", "-p", str(p)],
                                         "iperf3-b-%d.log" % p))
        self.iperf_a = tb.spawn(tb.ns_a, ["iperf3", "-s", "-p", str(REFL_IPERF_PORT)],
                                "iperf3-a.log")
        self.serve = None
        if "serve" in self.load_modes:
            self.serve = tb.spawn(tb.ns_b, [self.bin, "load", "serve", "--bind", TARGET4,
                                            "--tcp-ports", ",".join(map(str, ECHO_PORTS)),
                                            "--udp-port", str(UDP_PORT)], "load-serve.log")
        if self.via:
            self.start_dante()
        for p in IPERF_PORTS:
            self.wait_listen(tb.ns_b, "tcp", p)
        self.wait_listen(tb.ns_a, "tcp", REFL_IPERF_PORT)
        if self.serve is not None:
            ok = all(self.wait_listen(tb.ns_b, "tcp", p, fatal=False) for p in ECHO_PORTS)
            ok = ok and self.wait_listen(tb.ns_b, "udp", UDP_PORT, fatal=False)
            if not ok:
                log("warning: `load serve` did not listen on every port; load workloads are n/a "
                    "(see %s)" % os.path.join(self.work, "load-serve.log"))
                self.tb.stop(self.serve)
                self.serve = None
                self.load_modes = set()

    def start_dante(self):
        """--via socks5: Debian's dante-server in B on its veth address, in the foreground (no
        -D), config and pid file in work/, no authentication, CONNECT and UDP ASSOCIATE; and
        the proxychains4 config that points the plain client's iperf3 at it."""
        conf = os.path.join(self.work, "danted.conf")
        with open(conf, "w") as f:
            f.write("logoutput: stderr\n"
                    "internal: %s port = %d\n"
                    "external: %s\n"
                    "clientmethod: none\n"
                    "socksmethod: none\n"
                    "user.privileged: root\n"
                    "user.unprivileged: nobody\n"
                    "client pass { from: 0.0.0.0/0 to: 0.0.0.0/0 }\n"
                    "socks pass { from: 0.0.0.0/0 to: 0.0.0.0/0 "
                    "command: connect udpassociate udpreply }\n" % (B_VETH4, S5_PORT, B_VETH4))
        self.dante = self.tb.spawn(self.tb.ns_b, [DANTED, "-f", conf, "-p",
                                                  os.path.join(self.work, "danted.pid")],
                                   "danted.log")
        if not self.wait_listen(self.tb.ns_b, "tcp", S5_PORT, fatal=False):
            raise RuntimeError("danted did not listen on %s:%d (see %s)" % (
                B_VETH4, S5_PORT, os.path.join(self.work, "danted.log")))
        self.pc_conf = os.path.join(self.work, "proxychains.conf")
        with open(self.pc_conf, "w") as f:
            f.write("strict_chain\ntcp_read_time_out 15000\ntcp_connect_time_out 8000\n"
                    "[ProxyList]\nsocks5 %s %d\n" % (B_VETH4, S5_PORT))

    def dante_cpu(self):
        """--via socks5: CPU seconds of the SOCKS5 server so far: the sum over every danted
        process in B of its own user + system time and that of its children it has reaped
        (the server forks negotiator, request and I/O children, which come and go: a child's
        time moves into its parent's when it is reaped, so the sum only grows)."""
        r = self.tb.sh(["ip", "netns", "pids", self.tb.ns_b], check=False, timeout=5)
        tot = 0.0
        for p in r.stdout.split():
            try:
                with open("/proc/%s/comm" % p) as f:
                    if f.read().strip() != "danted":
                        continue
                with open("/proc/%s/stat" % p) as f:
                    st = f.read()
            except OSError:
                continue
            fields = st[st.rindex(")") + 2:].split()
            # fields[0] is field 3: utime, stime, cutime, cstime are fields 14-17
            tot += sum(int(x) for x in fields[11:15]) / CLK_TCK
        return tot

    def wait_listen(self, ns, proto, port, tries=100, fatal=True):
        flag = "-ltnH" if proto == "tcp" else "-lunH"
        for _ in range(tries):
            r = self.tb.sh(["ss", flag, "sport = :%d" % port], ns=ns, check=False)
            if r.stdout.strip():
                return True
            time.sleep(0.1)
        if fatal:
            raise RuntimeError("nothing listens on %s/%d in %s" % (proto, port, ns))
        return False

    def next_iperf_port(self):
        p = IPERF_PORTS[self.iperf_port_i % len(IPERF_PORTS)]
        self.iperf_port_i += 1
        return p

    # -- subjects
    def write_config(self, subj, path):
        cfg = {
            "stack": subj.stack,
            "tun": {"name": self.tb.tun, "address": TUN_CIDR, "mtu": 1500,
                    "txqueuelen": 10000, "queues": subj.queues, "offload": subj.offload,
                    "gso_output": subj.gso_output, "rps": subj.rps},
            "outbounds": [{"tag": "direct", "type": "direct", "routing_mark": MARK}],
            "route": {"final": "direct"},
            "budgets": {"tcp_sessions": 8192, "fds": 65536, "nat_entries": 262144},
            "nat": {"linger_ms": 2000, "port_quarantine_ms": 2000},
            "timeouts": {"connect_ms": 3000, "udp_idle_ms": 10000},
            "stats": {"listen": "127.0.0.1:%d" % STATS_PORT},
            "log": {"level": "warn"},
        }
        if subj.via_socks5:
            # Everything to the SOCKS5 server: TCP by CONNECT, UDP by UDP ASSOCIATE.
            cfg["outbounds"] = [{"tag": "s5", "type": "socks5",
                                 "server": "%s:%d" % (B_VETH4, S5_PORT), "udp": True,
                                 "routing_mark": MARK}]
            cfg["route"] = {"final": "s5"}
        if subj.sniff:
            # A name rule to another outbound, for a name nobody sends: a connection it covers
            # is looked at (its name could change the route), and then goes direct as before.
            rule = {"domain_suffix": ["sniff.invalid"], "outbound": "block"}
            if subj.sniff == "idle":
                rule["port"] = [443]
            cfg["outbounds"].append({"tag": "block", "type": "reject"})
            cfg["route"] = {"final": "direct", "sniff": {"timeout_ms": 300}, "rules": [rule]}
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)

    def write_reflect_config(self, subj, path):
        cfg = {"tun": {"name": self.tb.tun, "address": TUN_CIDR, "mtu": 1500,
                       "txqueuelen": 10000, "queues": 1, "offload": subj.offload},
               "log": {"level": "warn"}}
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)

    def start_child(self, kind, cfg_path, tag):
        """Start `twinstack run|reflect` in A; wait (10 s at most) for the ready byte.
        Returns (Popen, startup_ms) or raises RuntimeError."""
        rfd, wfd = os.pipe()
        t0 = time.monotonic()
        p = self.tb.spawn(self.tb.ns_a, [self.bin, kind, "--config", cfg_path, "--ready-fd",
                                         str(wfd)], "%s.log" % tag, pass_fds=(wfd,))
        os.close(wfd)
        sel = selectors.DefaultSelector()
        sel.register(rfd, selectors.EVENT_READ)
        got = b""
        deadline = t0 + 10
        try:
            while time.monotonic() < deadline:
                if sel.select(timeout=max(0.01, deadline - time.monotonic())):
                    got = os.read(rfd, 16)
                    break
        finally:
            sel.close()
            os.close(rfd)
        ms = (time.monotonic() - t0) * 1000
        if not got:
            rc = p.poll()
            self.tb.stop(p)
            tail = ""
            try:
                with open(os.path.join(self.work, "%s.log" % tag), errors="replace") as f:
                    tail = " | ".join(f.read().strip().splitlines()[-3:])
            except OSError:
                pass
            raise RuntimeError("%s %s: %s; log: %s" % (
                kind, tag, "exited %s before ready" % rc if rc is not None else
                "no ready byte within 10 s", tail))
        # the TUN exists now; make sure its queue length is what we asked for
        self.tb.sh(["ip", "link", "set", self.tb.tun, "txqueuelen", "10000"], ns=self.tb.ns_a,
                   check=False)
        return p, ms

    def start_subject(self, subj):
        """Start a TUN subject's child, check from the kernel's side that its TUN is what the
        subject asked for, route the target into the TUN (stacks). Returns (Popen, startup_ms)
        or raises RuntimeError with the child stopped."""
        cfg = os.path.join(self.work, "%s.json" % subj.slug)
        if subj.stack == "reflector":
            self.write_reflect_config(subj, cfg)
            child, ms = self.start_child("reflect", cfg, subj.slug)
        else:
            self.write_config(subj, cfg)
            child, ms = self.start_child("run", cfg, subj.slug)
        try:
            self.verify_tun(subj, child.pid)
            if subj.is_stack:
                self.tb.route_target_via_tun()
        except RuntimeError:
            self.tb.stop(child)
            raise
        return child, ms

    def verify_tun(self, subj, pid):
        """A child that silently fell back must not be measured under the wrong name: the TUN
        must have TSO and checksum offload exactly when offload was asked for (ethtool -k; a
        TUNSETOFFLOAD with CSUM|TSO4|TSO6 turns both on), and the child must hold subj.queues
        TUN fds (fdinfo `iff:` lines name the device)."""
        if not shutil.which("ethtool"):
            self.note_once("offload mode not verified: ethtool not installed")
        else:
            r = self.tb.sh(["ethtool", "-k", self.tb.tun], ns=self.tb.ns_a, check=False)
            feat = dict(re.findall(r"^(tx-checksumming|tcp-segmentation-offload):\s*(on|off)",
                                   r.stdout, re.M))
            if len(feat) != 2:
                self.note_once("offload mode not verified: `ethtool -k` gave no TSO/checksum "
                               "lines")
            else:
                want = subj.offload
                if set(feat.values()) != {want}:
                    raise RuntimeError(
                        "asked for %s I/O but the TUN has tx-checksumming %s, "
                        "tcp-segmentation-offload %s (both should be %s): not measured" % (
                            subj.io_mode, feat["tx-checksumming"],
                            feat["tcp-segmentation-offload"], want))
        n = self.tun_fds(pid)
        if n is None:
            self.note_once("queue count not verified: /proc/PID/fdinfo unreadable")
        elif n != subj.queues:
            raise RuntimeError("asked for %d queue%s but the child holds %d TUN fd%s: not "
                               "measured" % (subj.queues, "s" if subj.queues > 1 else "", n,
                                             "s" if n != 1 else ""))

    def tun_fds(self, pid):
        d = "/proc/%d/fdinfo" % pid
        try:
            names = os.listdir(d)
        except OSError:
            return None
        n = 0
        for fd in names:
            try:
                with open(os.path.join(d, fd)) as f:
                    if re.search(r"^iff:\s*%s$" % re.escape(self.tb.tun), f.read(), re.M):
                        n += 1
            except OSError:
                continue
        return n

    def note_once(self, msg):
        note_once(self.notes, msg)

    def tun_drops(self):
        tot = 0
        for k in ("rx_dropped", "tx_dropped"):
            r = self.tb.sh(["cat", "/sys/class/net/%s/statistics/%s" % (self.tb.tun, k)],
                           ns=self.tb.ns_a, check=False)
            try:
                tot += int(r.stdout.strip())
            except ValueError:
                return None
        return tot

    def stats(self):
        if shutil.which("curl"):
            args = ["curl", "-sS", "--fail", "--max-time", "3",
                    "http://127.0.0.1:%d/stats" % STATS_PORT]
        else:
            args = [sys.executable, "-c",
                    "import urllib.request,sys;sys.stdout.write(urllib.request.urlopen("
                    "'http://127.0.0.1:%d/stats',timeout=3).read().decode())" % STATS_PORT]
        r = self.tb.sh(args, ns=self.tb.ns_a, check=False, timeout=6)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    # -- workloads
    def bulk(self, subj, pid, direction, streams):
        tb = self.tb
        if subj.stack == "reflector":
            args = ["iperf3", "-c", MIRROR4, "-B", GW4, "-p", str(REFL_IPERF_PORT)]
        else:
            args = ["iperf3", "-c", TARGET4, "-p", str(self.next_iperf_port())]
        if subj.stack == "socks5-client":
            # every connect() of iperf3 (control and data) goes to dante as a CONNECT
            args = ["proxychains4", "-q", "-f", self.pc_conf] + args
        args += ["-P", str(streams), "-t", str(self.bulk_t), "-O", str(self.bulk_omit), "-J",
                 "--connect-timeout", "3000"]
        if direction == "down":
            args.append("-R")
        cpu0 = proc_cpu(pid) if pid else None
        via = self.via and (subj.via_socks5 or subj.stack == "socks5-client")
        srv0 = self.dante_cpu() if via else None
        drops0 = self.tun_drops() if subj.has_tun else None
        prof = self.perf_start(subj, direction, streams)
        r = tb.sh(args, ns=tb.ns_a, check=False, timeout=self.bulk_t + self.bulk_omit + 20)
        self.perf_stop(prof)
        cpu1 = proc_cpu(pid) if pid else None
        srv1 = self.dante_cpu() if via else None
        drops1 = self.tun_drops() if subj.has_tun else None
        try:
            j = json.loads(r.stdout)
        except ValueError:
            j = None
        if not j or "error" in j or not j.get("intervals"):
            err = (j or {}).get("error") or (r.stderr or "").strip()[:200] or "no JSON"
            raise RuntimeError("iperf3 %s %s x%d: %s" % (subj.label, direction, streams, err))
        bps = [iv["sum"]["bits_per_second"] for iv in j["intervals"]
               if not iv["sum"].get("omitted")]
        if not bps:
            raise RuntimeError("iperf3 %s %s x%d: no intervals after warm-up" % (
                subj.label, direction, streams))
        gbps = statistics.median(bps) / 1e9
        wl = "tcp_bulk"
        self.emit(subj, wl, direction, streams, "throughput_gbps", gbps)
        if gbps < STALL_GBPS:
            self.fail("iperf3 %s %s x%d: stalled (%.6f Gbit/s; recorded)" % (
                subj.label, direction, streams, gbps))
        retr = j.get("end", {}).get("sum_sent", {}).get("retransmits")
        if retr is not None:
            self.add(subj, wl, direction, streams, "retransmits", retr)
        if cpu0 and cpu1:
            self.add(subj, wl, direction, streams, "cpu_user_s", cpu1[0] - cpu0[0])
            self.add(subj, wl, direction, streams, "cpu_sys_s", cpu1[1] - cpu0[1])
        if drops0 is not None and drops1 is not None:
            self.add(subj, wl, direction, streams, "tun_drops", drops1 - drops0)
        if srv0 is not None and srv1 is not None:
            self.add(subj, wl, direction, streams, "server_cpu_s", srv1 - srv0)
        if subj.is_stack:
            # tun.rps "auto": how often it switched so far (per cell in an ablation: a fresh
            # child per run) and how busy the loop's thread was in its last window.
            st = (self.stats() or {}).get("tun", {})
            for key, metric in (("rps_switches", "rps_switches"),
                                ("loop_busy_pct", "loop_busy_pct")):
                if isinstance(st.get(key), (int, float)) and st.get("rps_auto"):
                    self.add(subj, wl, direction, streams, metric, st[key])
        return gbps

    def perf_start(self, subj, direction, streams):
        """--perf DIR: a system-wide call-graph profile of this bulk run (all CPUs: the
        kernel work of a TUN proxy runs in iperf3's and softirq context as much as in the
        proxy's), DIR/<subject>-<dir>-<streams>-r<round>.data; read it with perf report."""
        if not self.a.perf:
            return None
        os.makedirs(self.a.perf, exist_ok=True)
        path = os.path.join(self.a.perf, "%s-%s-%d-r%d.data" % (
            subj.slug, direction, streams, getattr(self, "cur_round", 1)))
        with open(path + ".log", "w") as lf:
            return subprocess.Popen(["perf", "record", "-a", "-g", "-F", "499", "-o", path,
                                     "--", "sleep", str(self.bulk_t + self.bulk_omit)],
                                    stdout=lf, stderr=subprocess.STDOUT)

    def perf_stop(self, prof):
        if prof is not None:
            try:
                prof.wait(timeout=self.bulk_t + self.bulk_omit + 20)
            except subprocess.TimeoutExpired:
                prof.kill()
                prof.wait()

    def load(self, mode, args, timeout):
        r = self.tb.sh([self.bin, "load", mode] + args, ns=self.tb.ns_a, check=False,
                       timeout=timeout)
        j = last_json(r.stdout)
        if r.returncode != 0 or j is None:
            raise RuntimeError("load %s: exit %d: %s" % (mode, r.returncode,
                                                        (r.stderr or r.stdout).strip()[-200:]))
        return j

    def w_connrate(self, subject):
        d = self.load_s
        j = self.load("connrate", ["--target", TARGET4, "--ports",
                                   ",".join(map(str, ECHO_PORTS)), "--duration", str(d),
                                   "--concurrency", "16" if self.quick else "32"], d + 20)
        self.emit(subject, "connrate", None, None, "conn_per_s", j.get("conn_per_s"))

    def w_latency(self, subject):
        d = self.load_s
        j = self.load("latency", ["--target", "%s:%d" % (TARGET4, ECHO_PORTS[0]), "--duration",
                                  str(d), "--size", "64"], d + 20)
        for k in ("latency_p50_us", "latency_p99_us", "latency_p999_us"):
            self.emit(subject, "latency_64B", None, None, k, j.get(k))

    def w_udp(self, subject, size):
        d = self.load_s
        via = ["--socks5", "%s:%d" % (B_VETH4, S5_PORT)] if subject.stack == "socks5-client" \
            else []
        j = self.load("udp", ["--target", "%s:%d" % (TARGET4, UDP_PORT), "--size", str(size),
                              "--duration", str(d)] + via, d + 20)
        wl = "udp_echo_%dB" % size
        self.emit(subject, wl, None, None, "pps", j.get("pps"))
        self.emit(subject, wl, None, None, "loss_pct", j.get("loss_pct"))

    def w_udpflows(self, subject):
        j = self.load("udpflows", ["--target", "%s:%d" % (TARGET4, UDP_PORT), "--flows", "1000"],
                      60)
        self.emit(subject, "udp_flows", None, None, "udp_flows_answered",
                  j.get("answered", j.get("udp_flows_answered")))

    def w_hold(self, subject, pid):
        """Hold N connections through the proxy; measure userspace and kernel memory per conn."""
        n = self.hold_conns
        dur = 8 if self.quick else 12
        tb = self.tb
        p = tb.spawn(tb.ns_a, [self.bin, "load", "hold", "--target",
                               "%s:%d" % (TARGET4, ECHO_PORTS[1]), "--conns", str(n),
                               "--duration", str(dur)], "load-hold.log", stdout=subprocess.PIPE)
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        held, buf, deadline = None, b"", time.monotonic() + dur + 5
        try:
            while held is None and time.monotonic() < deadline:
                if not sel.select(timeout=0.5):
                    if p.poll() is not None:
                        break
                    continue
                chunk = os.read(p.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                m = re.search(rb"HELD\s+(\d+)", buf)
                if m:
                    held = int(m.group(1))
            if held is None:
                raise RuntimeError("load hold: no 'HELD n' line within %d s" % (dur + 5))
            time.sleep(0.5)
            st = self.stats()
            kern = self.kernel_socket_bytes(pid)
            rss = proc_kb(pid, "VmRSS")
        finally:
            sel.close()
            try:
                rest, _ = p.communicate(timeout=dur + 10)
                buf += rest or b""
            except subprocess.TimeoutExpired:
                tb.stop(p)
            if p in tb.procs:
                tb.procs.remove(p)
        extra = "held %d" % held
        if st:
            per = (st.get("buffers") or {}).get("per_session_bytes")
            if per is None and (st.get("buffers") or {}).get("in_use_bytes") is not None:
                per = st["buffers"]["in_use_bytes"] / max(1, held)
            self.emit(subject, "hold_1000", None, n, "user_bytes_per_conn", per, extra)
            pipe = (st.get("splice") or {}).get("pipe_bytes") or 0
        else:
            pipe = 0
            self.notes.append("hold: /stats unreachable for %s; user bytes per connection missing"
                              % subject.label)
        if kern is not None:
            self.emit(subject, "hold_1000", None, n, "kernel_kb_per_conn",
                      (kern + pipe) / 1024.0 / max(1, held),
                      "%s, %d sockets of the proxy, pipes %d B" % (extra, self.kern_sockets, pipe))
        if rss is not None:
            self.hold_rss = rss

    def kernel_socket_bytes(self, pid):
        """Sum of skmem (rmem_alloc + wmem_queued + fwd_alloc + opt + backlog) over the TCP
        sockets of pid in A (ss -tmpn)."""
        r = self.tb.sh(["ss", "-tmpnH"], ns=self.tb.ns_a, check=False, timeout=30)
        if r.returncode != 0:
            return None
        total, lines, mine = 0, r.stdout.splitlines(), 0
        text = "\n".join(lines)
        # ss prints skmem on the same line or a continuation line; split into socket records
        records = re.split(r"\n(?=\S)", text)
        needle = "pid=%d," % pid
        for rec in records:
            if needle not in rec:
                continue
            m = re.search(r"skmem:\(([^)]*)\)", rec)
            if not m:
                continue
            kv = {}
            for part in m.group(1).split(","):
                mm = re.match(r"([a-z]+)(\d+)", part)
                if mm:
                    kv[mm.group(1)] = int(mm.group(2))
            total += kv.get("r", 0) + kv.get("w", 0) + kv.get("f", 0) + kv.get("o", 0) + \
                kv.get("bl", 0)
            mine += 1
        self.kern_sockets = mine
        return total


    # -- one subject through every workload, once (full and --quick runs)
    def run_subject(self, subj):
        tb = self.tb
        pid = None
        child = None
        try:
            if subj.stack == "veth":
                tb.route_target_via_veth()
            elif subj.stack == "reflector":
                if not self.has_reflect:
                    self.note_na(subj.label, "all", "`twinstack reflect` not in this binary")
                    return
                self.tick("%s: start" % subj.label)
                child, ms = self.start_subject(subj)
                pid = child.pid
            else:
                self.tick("%s: start" % subj.label)
                child, ms = self.start_subject(subj)
                pid = child.pid
                self.emit(subj, "startup", None, None, "startup_ms", ms)
                time.sleep(1.0)
                self.tick("%s: idle wakeups over %d s" % (subj.label, self.idle_s))
                c0 = proc_ctxt(pid)
                time.sleep(self.idle_s)
                c1 = proc_ctxt(pid)
                if c0 is not None and c1 is not None:
                    self.emit(subj, "idle", None, None, "idle_wakeups_20s", c1 - c0,
                              "over %d s" % self.idle_s if self.idle_s != 20 else "")

            for direction, streams in self.bulk_cells:
                self.tick("%s: tcp bulk %s, %d stream%s" % (subj.label, direction, streams,
                                                            "s" if streams > 1 else ""))
                try:
                    self.bulk(subj, pid, direction, streams)
                except RuntimeError as e:
                    self.fail(str(e))
                if child is not None and child.poll() is not None:
                    raise RuntimeError("%s exited (%s) during the bulk workloads" % (
                        subj.label, child.returncode))

            if subj.stack != "reflector":
                self.load_workloads(subj, pid)

            if pid:
                hwm = proc_kb(pid, "VmHWM")
                self.emit(subj, "run", None, None, "peak_rss_kb", hwm)
                if subj.stack != "reflector":
                    self.tick("%s: RSS after 5 s idle" % subj.label)
                    time.sleep(5)
                    self.emit(subj, "run", None, None, "idle_rss_kb", proc_kb(pid, "VmRSS"))
        except RuntimeError as e:
            self.fail("%s: %s" % (subj.label, e))
        finally:
            if child is not None:
                tb.stop(child)

    def load_workloads(self, subj, pid):
        wl = [("connrate", lambda: self.w_connrate(subj))]
        if subj.stack != "veth":
            wl.append(("hold", lambda: self.w_hold(subj, pid)))
        if not self.quick:
            wl += [("latency", lambda: self.w_latency(subj)),
                   ("udp", lambda: self.w_udp(subj, 64)),
                   ("udp", lambda: self.w_udp(subj, 1400)),
                   ("udpflows", lambda: self.w_udpflows(subj))]
        for mode, fn in wl:
            self.tick("%s: %s" % (subj.label, mode))
            if not self.has_load(mode):
                self.note_na(subj.label, mode, "`twinstack load %s` not available" % mode)
                continue
            try:
                fn()
            except RuntimeError as e:
                self.fail("%s %s: %s" % (subj.label, mode, e))

    # -- --sniff: one subject through the connection rate and the latency, once
    def run_sniff_subject(self, subj):
        child = None
        try:
            self.tick("%s: start" % subj.label)
            child, ms = self.start_subject(subj)
            self.emit(subj, "startup", None, None, "startup_ms", ms)
            time.sleep(SETTLE_S)
            for mode, fn in (("connrate", lambda: self.w_connrate(subj)),
                             ("latency", lambda: self.w_latency(subj))):
                self.tick("%s: %s" % (subj.label, mode))
                if not self.has_load(mode):
                    self.note_na(subj.label, mode, "`twinstack load %s` not available" % mode)
                    continue
                try:
                    fn()
                except RuntimeError as e:
                    self.fail("%s %s: %s" % (subj.label, mode, e))
            if child.poll() is None:
                self.sniff_counters(subj)
        except RuntimeError as e:
            self.fail("%s: %s" % (subj.label, e))
        finally:
            if child is not None:
                self.tb.stop(child)

    def sniff_counters(self, subj):
        """The look counters after the workloads: proof that "idle" looked at nothing and
        "look" at every connection."""
        doc = self.stats()
        if doc is None:
            self.fail("%s: /stats unreachable after the workloads" % subj.label)
            return
        sn = doc.get("sniff") or {}
        self.emit(subj, "sniff", None, None, "sniff_started", sn.get("started"))
        self.emit(subj, "sniff", None, None, "sniff_timeouts", sn.get("timeouts"))

    # -- --via socks5: one subject through the bulk cells and the UDP echo, once
    def run_socks5_subject(self, subj):
        tb = self.tb
        child = pid = None
        try:
            if subj.stack == "socks5-client":
                tb.route_target_via_veth()  # unused by its traffic, which goes to dante
            else:
                self.tick("%s: start" % subj.label)
                child, ms = self.start_subject(subj)
                pid = child.pid
                self.emit(subj, "startup", None, None, "startup_ms", ms)
                time.sleep(SETTLE_S)
            for direction, streams in self.bulk_cells:
                self.tick("%s: tcp bulk %s, %d stream%s" % (subj.label, direction, streams,
                                                            "s" if streams > 1 else ""))
                try:
                    self.bulk(subj, pid, direction, streams)
                except RuntimeError as e:
                    self.fail(str(e))
                if child is not None and child.poll() is not None:
                    raise RuntimeError("%s exited (%s) during the bulk workloads" % (
                        subj.label, child.returncode))
            self.tick("%s: udp echo" % subj.label)
            self.socks5_udp(subj)
            if pid:
                self.emit(subj, "run", None, None, "peak_rss_kb", proc_kb(pid, "VmHWM"))
        except RuntimeError as e:
            self.fail("%s: %s" % (subj.label, e))
        finally:
            if child is not None:
                tb.stop(child)

    def socks5_udp(self, subj):
        """UDP echo (64 B) of one --via socks5 subject. A stack whose proxy dropped the
        datagrams says which drop counters of its /stats moved."""
        if not self.has_load("udp") or (subj.stack == "socks5-client" and not self.load_socks5):
            self.note_na(subj.label, "udp", "`twinstack load udp%s` not available" % (
                " --socks5" if subj.stack == "socks5-client" else ""))
            return
        try:
            self.w_udp(subj, 64)
            if subj.via_socks5:
                # the proxy's own count: the echoes must have gone through an association
                n = ((self.stats() or {}).get("udp") or {}).get("assocs_total")
                if n == 0:
                    self.fail("%s udp: no UDP association was made (/stats udp.assocs_total 0)"
                              % subj.label)
        except RuntimeError as e:
            drops = ((self.stats() or {}).get("udp") or {}).get("drops") or {} \
                if subj.is_stack else {}
            moved = ", ".join("%s %s" % (k, v) for k, v in sorted(drops.items()) if v)
            self.fail("%s udp: %s%s" % (subj.label, e, "; the proxy's udp drops: " + moved
                                        if moved else ""))

    def fail(self, msg):
        self.failures.append(msg)
        log("FAILED: " + msg)

    def count_steps(self):
        if self.ablation:
            return self.reps * len(self.bulk_cells) * len(self.subjects)
        if self.via:
            return self.reps * sum(len(self.bulk_cells) + 1 + (1 if s.has_tun else 0)
                                   for s in self.subjects)
        if self.sniff:
            return self.reps * 3 * len(self.subjects)
        per = 0
        for s in self.subjects:
            per += len(self.bulk_cells)
            if s.has_tun:
                per += 1  # start
            if s.is_stack:
                per += 2  # idle + idle rss
            if s.stack != "reflector":
                per += 1 + (1 if s.stack != "veth" else 0) + (0 if self.quick else 4)
        return per * self.reps

    def micro_rows(self):
        if not self.micro or not shutil.which("valgrind"):
            self.notes.append("instructions_per_op: skipped (%s)" % (
                "no twinstack-micro next to the binary" if not self.micro else
                "valgrind not installed"))
            return
        jpath = os.path.join(self.work, "callgrind.json")
        progress("micro: callgrind instruction counts (bench/callgrind.sh)")
        try:
            r = subprocess.run(["bash", os.path.join(HERE, "callgrind.sh"), "--json", jpath,
                                self.micro], capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            self.fail("callgrind.sh timed out")
            return
        if r.returncode not in (0, 1) or not os.path.exists(jpath):
            self.fail("callgrind.sh: exit %d: %s" % (r.returncode, r.stderr.strip()[-200:]))
            return
        with open(jpath) as f:
            j = json.load(f)
        for case, v in sorted(j.get("callgrind", {}).items()):
            self.emit(self.micro_subj, case, None, None, "instructions_per_op",
                      v["instructions"])

    # -- --ablation: TCP bulk only, every subject in every cell, a fresh child per run
    def run_ablation(self):
        cells_done, t_cells = 0, 0.0
        ncells = len(self.bulk_cells)
        for rnd in range(self.reps):
            self.cur_round = rnd + 1
            for ci, (d, n) in enumerate(self.bulk_cells):
                el = time.monotonic() - self.t0
                avg = t_cells / cells_done if cells_done else 0.0
                if el + avg > self.time_limit:
                    self.note_once("time limit %d s: stopped before round %d, %s x%d (%d of %d "
                                   "cells measured)" % (self.time_limit, rnd + 1, d, n,
                                                        cells_done, self.reps * ncells))
                    return
                c0 = time.monotonic()
                live = [s for s in self.subjects if not s.disabled]
                # rotate per round and cell so no subject always runs first or last
                k = (rnd * ncells + ci) % max(1, len(live))
                for subj in live[k:] + live[:k]:
                    self.ablation_run(subj, d, n)
                t_cells += time.monotonic() - c0
                cells_done += 1

    def ablation_run(self, subj, d, n):
        """One subject through one cell: start its child (TUN subjects), one iperf3 run, its
        peak RSS (VmHWM: this child only ever saw this cell), stop. Two failed starts disable
        the subject for the rest of the run."""
        child, pid, started = None, None, False
        self.tick("%s: tcp bulk %s, %d stream%s" % (subj.label, d, n, "s" if n > 1 else ""))
        try:
            if subj.stack == "veth":
                self.tb.route_target_via_veth()
            else:
                if subj.stack == "reflector" and not self.has_reflect:
                    self.note_na(subj.label, "tcp_bulk", "`twinstack reflect` not in this binary")
                    subj.disabled = True
                    return
                child, _ = self.start_subject(subj)
                pid = child.pid
                time.sleep(SETTLE_S)
            started = True
            self.bulk(subj, pid, d, n)
            if child is not None and child.poll() is not None:
                raise RuntimeError("exited (%s) during the run" % child.returncode)
            if pid:
                self.emit(subj, "tcp_bulk", d, n, "peak_rss_kb", proc_kb(pid, "VmHWM"))
        except RuntimeError as e:
            self.fail("%s %s x%d: %s" % (subj.label, d, n, e))
            if not started:
                subj.start_failures += 1
                if subj.start_failures >= 2:
                    subj.disabled = True
                    self.note_once("%s: failed to start twice, not measured any further" %
                                   subj.label)
        finally:
            if child is not None:
                self.tb.stop(child)

    # -- main
    def run(self):
        self.probe_bin()
        if not self.has_run:
            raise CannotRun("%s has no `run` subcommand" % self.bin)
        os.makedirs(self.out, exist_ok=True)
        self.work = os.path.join(self.out, "work")
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        tok = os.urandom(3).hex()
        self.tb = Testbed(tok, self.work, self.a.cc, self.a.verbose)
        tb = self.tb
        atexit.register(tb.teardown)

        def on_signal(signum, frame):
            clear_progress()
            sys.stderr.write("\ninterrupted (signal %d): tearing the testbed down\n" % signum)
            tb.teardown()
            os._exit(128 + signum)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, on_signal)

        self.total_steps = self.count_steps()
        started = datetime.datetime.now(datetime.timezone.utc)
        log(self.plan_text())
        if not self.has_reflect:
            log("note: `twinstack reflect` missing: reflector baseline and ceiling are n/a")
        missing = [m for m in ("serve", "connrate", "hold", "latency", "udp", "udpflows")
                   if m not in self.load_modes]
        if missing and not self.ablation:
            log("note: `twinstack load` modes missing (%s): those workloads are n/a" %
                ",".join(missing))
        progress("building the testbed (namespaces %s, %s)" % (tb.ns_a, tb.ns_b))
        tb.build()
        self.start_servers()
        out("%-20s %-16s %-5s %4s  %-20s %10s %s" % ("subject", "workload", "dir", "n",
                                                       "metric", "value", "unit"))
        if self.ablation:
            self.run_ablation()
        else:
            run = self.run_socks5_subject if self.via else \
                self.run_sniff_subject if self.sniff else self.run_subject
            for rnd in range(self.reps):
                self.cur_round = rnd + 1
                # rotate the order each round so no subject always runs first or last
                k = rnd % len(self.subjects)
                for subj in self.subjects[k:] + self.subjects[:k]:
                    run(subj)
        tb.teardown()
        if self.mode == "full" and not self.a.no_micro:
            self.micro_rows()
        clear_progress()
        duration = time.monotonic() - self.t0
        self.finish(started.strftime("%Y-%m-%dT%H:%M:%SZ"), duration)
        log("done in %dm%02ds: %s" % (duration // 60, duration % 60, self.out))
        return EXIT_FAIL if self.failures else EXIT_OK

    # -- the report
    def results_meta(self, started_utc, duration):
        """results.json's meta: this run's plan, what it could not measure, its failures and
        notes (the report adds the targets)."""
        meta = {
            "schema": 2, "tool": "twinstack bench (bench/rig.py)", "binary": self.bin,
            "started_utc": started_utc, "duration_s": round(duration, 1), "mode": self.mode,
            "repetitions": self.reps, "subjects": [s.to_json() for s in self.subjects],
            "io_mode": "per-packet,offload" if self.ablation else self.io_mode,
            "queues": sorted({s.queues for s in self.subjects}) if self.ablation else 1,
            "ceiling_io_mode": self.ceiling_ref.io_mode if self.ceiling_ref else None,
            "bulk_cells": [[d, n] for d, n in self.bulk_cells],
            "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                     "machine": platform.machine()},
            "iperf3": {"seconds": self.bulk_t, "omit": self.bulk_omit},
            "tcp_congestion": self.cc_meta(),
            "idle_wakeup_window_s": self.idle_s, "hold_conns": self.hold_conns,
            "load_seconds": self.load_s,
            "not_measured": [{"subject": s, "workload": w, "reason": r} for s, w, r in self.na],
            "failures": self.failures, "notes": self.notes,
        }
        if self.ablation:
            meta.update({"time_limit_s": self.time_limit, "estimate_s": round(self.estimate_s())})
        if self.via:
            meta["socks5"] = self.socks5_meta()
        if self.host_meta:
            meta["host"] = self.host_meta
        return meta

    def socks5_meta(self):
        if self.a.report_from:
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
                "udp_seconds": self.load_s}

    def cc_meta(self):
        if self.a.report_from:
            return self.cc_from
        host = self.tb.host_cc if self.tb else None
        return {"testbed": host if self.a.cc == "host" else self.a.cc, "host_default": host}

    def finish(self, started_utc, duration):
        Report(self.out, self.results_meta(started_utc, duration), self.samples,
               (GW4, MIRROR4, TARGET4)).write()

    # -- --report-from: the report of an earlier run, from its results.json
    def load_results(self, data, path):
        meta = data.get("meta") or {}
        if "samples" not in data or "subjects" not in meta or "bulk_cells" not in meta:
            raise CannotRun("%s: no samples/meta.subjects/meta.bulk_cells (written by an older "
                            "rig; rerun the bench)" % path)
        self.subjects = []
        for s in meta["subjects"]:
            self.subjects.append(Subject(s["stack"], s["io_mode"], s.get("queues", 1),
                                         s.get("label")))
        self.veth = next((s for s in self.subjects if s.stack == "veth"), None)
        self.ceiling_ref = next((s for s in self.subjects if s.stack == "reflector" and
                                 s.io_mode == meta.get("ceiling_io_mode", "offload")), None)
        if not self.via and not self.sniff and (self.veth is None or self.ceiling_ref is None):
            raise ValueError("no veth or no ceiling reflector among meta.subjects")
        self.socks5_from = meta.get("socks5")
        self.bulk_cells = [(d, n) for d, n in meta["bulk_cells"]]
        self.bulk_t = meta["iperf3"]["seconds"]
        self.bulk_omit = meta["iperf3"]["omit"]
        self.reps = meta["repetitions"]
        self.idle_s = meta.get("idle_wakeup_window_s", self.idle_s)
        self.hold_conns = meta.get("hold_conns", self.hold_conns)
        self.time_limit = meta.get("time_limit_s", self.time_limit)
        self.na = [(x["subject"], x["workload"], x["reason"]) for x in meta.get("not_measured",
                                                                                [])]
        self.failures = list(meta.get("failures", []))
        self.notes = [n for n in meta.get("notes", []) if not n.startswith("charts:")]
        self.host_meta = meta.get("host")
        tc = meta.get("tcp_congestion")
        self.cc_from = tc if isinstance(tc, dict) else {"testbed": None, "host_default": None}
        self.bin = meta.get("binary", self.bin)
        self.samples = {}
        for s in data["samples"]:
            self.samples[tuple(s["key"])] = [list(v) for v in s["values"]]
        return meta


def report_from(a):
    """Redraw report.md, results.json and the charts of an earlier run (no root needed)."""
    try:
        with open(a.report_from) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise CannotRun("--report-from %s: %s" % (a.report_from, e))
    meta = data.get("meta") if isinstance(data, dict) else None
    if not isinstance(meta, dict) or meta.get("mode") not in ("full", "quick", "ablation",
                                                              "socks5", "sniff"):
        raise CannotRun("--report-from %s: not a results.json of this rig (meta.mode)" %
                        a.report_from)
    a.ablation = meta["mode"] == "ablation"
    a.quick = meta["mode"] == "quick"
    a.via = "socks5" if meta["mode"] == "socks5" else None
    a.sniff = meta["mode"] == "sniff"
    a.io_mode = None if a.ablation else meta.get("io_mode")
    if a.out is None:
        a.out = os.path.dirname(os.path.abspath(a.report_from))
    rig = Rig(a)
    try:
        meta = rig.load_results(data, a.report_from)
    except (KeyError, TypeError, ValueError, StopIteration) as e:
        raise CannotRun("--report-from %s: malformed (%s: %s)" % (a.report_from,
                                                                  type(e).__name__, e))
    os.makedirs(rig.out, exist_ok=True)
    rig.finish(meta.get("started_utc", "?"), meta.get("duration_s", 0))
    log("report: %s" % os.path.join(rig.out, "report.md"))
    return EXIT_OK


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="twinstack bench",
        description="Namespace comparison rig: both stacks and two baselines side by side "
        "(default), or --ablation: every TUN I/O mode of each stack, TCP bulk only.")
    ap.add_argument("--bin", default=os.path.join(SRC, "build", "twinstack"),
                    help="the twinstack binary under test (twinstack bench passes itself)")
    ap.add_argument("--quick", action="store_true",
                    help="1 repetition, bulk 1 and 16 streams upload, short conn-rate and "
                    "memory-per-connection probes (< 3 minutes)")
    ap.add_argument("--ablation", action="store_true",
                    help="TCP bulk 1/16/64 streams up and down for veth, the reflector "
                    "(offload and per-packet), system per-packet/offload/offload+2 queues, lwip "
                    "per-packet/offload; the acceptance targets as PASS/MISS lines (~18 minutes)")
    ap.add_argument("--via", choices=("socks5",), default=None,
                    help="socks5: each stack with its outbound pointed at a SOCKS5 server "
                    "(dante in the server namespace) next to the same stack direct and a plain "
                    "SOCKS5 client without a TUN (proxychains4 + iperf3, load udp --socks5): "
                    "TCP bulk and UDP echo, the ratios to the plain client with the >= 0.8 "
                    "targets (~12 minutes; --quick ~2)")
    ap.add_argument("--sniff", action="store_true",
                    help="each stack with route.sniff off, on with no flow looked at (a name "
                    "rule for port 443 only: \"sniff idle\") and on with every connection looked "
                    "at (\"sniff look\"): connection rate and 64 B latency, the ratios to the "
                    "same stack without sniffing (~4 minutes; --quick ~1)")
    ap.add_argument("--stacks", default="system,lwip", help="comma-separated (default %(default)s)")
    ap.add_argument("--out", default=None, help="output directory (default bench-results; "
                    "with --report-from the directory of FILE)")
    ap.add_argument("--reps", type=int, default=0, help="repetitions (default 3, --quick 1)")
    ap.add_argument("--io-mode", default=None, choices=("per-packet", "offload"),
                    help="TUN I/O mode of the stacks and the reflector (config tun.offload "
                    "\"off\" or \"on\"; default offload); not with --ablation, which measures both")
    ap.add_argument("--bulk-seconds", type=int, default=0,
                    help="iperf3 -t per bulk run, 1-60 (default 5, --quick 3)")
    ap.add_argument("--time-limit", type=int, default=0, metavar="S",
                    help="--ablation only: refuse to start when the estimate exceeds S seconds "
                    "and stop starting cells once S would be exceeded (default %d)" %
                    ABLATION_LIMIT_S)
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan (subjects, cells, estimate) and exit; needs no root")
    ap.add_argument("--report-from", metavar="FILE",
                    help="redraw report.md, results.json and charts from an earlier run's "
                    "results.json (into --out, default FILE's directory); needs no root")
    ap.add_argument("--no-micro", action="store_true",
                    help="skip the callgrind instruction counts")
    ap.add_argument("--perf", metavar="DIR", default=None,
                    help="record a system-wide perf profile of every TCP bulk run into DIR "
                         "(for finding where the time goes; adds overhead, do not quote its "
                         "figures)")
    ap.add_argument("--cc", default=None, metavar="NAME",
                    help="TCP congestion control pinned in the testbed's namespaces (default "
                    "reno: unpaced, selectable in any namespace); \"host\" keeps the "
                    "host's default (a pacing one such as bbr caps every single flow, baselines "
                    "included, near its pacing timer's rate)")
    ap.add_argument("-v", "--verbose", action="store_true", help="echo every command")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        sys.exit(EXIT_OK if e.code == 0 else EXIT_CANNOT)

    def bad(msg):
        ap.print_usage(sys.stderr)
        sys.stderr.write("twinstack bench: %s\n" % msg)
        sys.exit(EXIT_CANNOT)
    for s in a.stacks.split(","):
        if s not in ("system", "lwip"):
            bad("--stacks: unknown stack %r (system, lwip)" % s)
    if a.reps < 0 or a.reps > 50:
        bad("--reps must be 1-50")
    if a.bulk_seconds < 0 or a.bulk_seconds > 60:
        bad("--bulk-seconds must be 1-60")
    if a.time_limit < 0:
        bad("--time-limit must be positive")
    if a.cc is not None and not re.fullmatch(r"[a-z][a-z0-9_]{0,14}", a.cc):
        bad("--cc: %r is not a congestion control name (reno, cubic, bbr, ... or host)" % a.cc)
    if a.report_from:
        given = [o for o, v in (("--ablation", a.ablation), ("--quick", a.quick),
                                ("--via", a.via), ("--sniff", a.sniff),
                                ("--io-mode", a.io_mode), ("--reps", a.reps),
                                ("--bulk-seconds", a.bulk_seconds),
                                ("--time-limit", a.time_limit), ("--dry-run", a.dry_run),
                                ("--cc", a.cc)) if v]
        if given:
            bad("--report-from redraws an earlier run: %s make%s no sense with it" % (
                ", ".join(given), "s" if len(given) == 1 else ""))
        return a
    if a.out is None:
        a.out = "bench-results"
    if a.cc is None:
        a.cc = "reno"
    if a.ablation and a.quick:
        bad("--ablation has its own schedule; shorten it with --reps and --bulk-seconds, not "
            "--quick")
    if a.via and a.ablation:
        bad("--via socks5 and --ablation are two different runs")
    if a.sniff and (a.via or a.ablation):
        bad("--sniff is a run of its own, not with --via or --ablation")
    if a.ablation and a.io_mode:
        bad("--ablation measures both I/O modes; --io-mode does not apply")
    if a.time_limit and not a.ablation:
        bad("--time-limit applies to --ablation only")
    return a


def preflight(a):
    if os.geteuid() != 0:
        raise CannotRun("needs root (network namespaces, TUN devices); try: sudo twinstack bench")
    if not os.path.exists("/dev/net/tun"):
        raise CannotRun("no /dev/net/tun: this kernel or container has no TUN support")
    missing = [t for t in ("ip", "ss", "sysctl", "iperf3") if not shutil.which(t)]
    if missing:
        raise CannotRun("missing tools: %s (scripts/setup.sh installs them)" % " ".join(missing))
    if a.via == "socks5":
        miss = [t for t in (DANTED, "proxychains4") if not shutil.which(t)]
        if miss:
            raise CannotRun("--via socks5 needs %s (Debian: dante-server, proxychains4; "
                            "scripts/setup.sh installs them)" % " and ".join(miss))
    if not os.access(a.bin, os.X_OK):
        raise CannotRun("binary %s not found or not executable (build first)" % a.bin)
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=10)
    if r.returncode != 0:
        raise CannotRun("`ip netns` does not work here: network namespaces unavailable")


def main(argv):
    a = parse_args(argv)
    try:
        if a.report_from:
            return report_from(a)
        rig = Rig(a)
        if a.ablation and rig.estimate_s() > rig.time_limit:
            sys.stderr.write(rig.plan_text() + "\n")
            sys.stderr.write("twinstack bench: the ablation would take about %d s, over the %d s "
                             "limit: lower --reps or --bulk-seconds (or raise --time-limit)\n" %
                             (rig.estimate_s(), rig.time_limit))
            return EXIT_CANNOT
        if a.dry_run:
            out(rig.plan_text())
            return EXIT_OK
        preflight(a)
        return rig.run()
    except CannotRun as e:
        clear_progress()
        sys.stderr.write("twinstack bench: cannot run: %s\n" % e)
        return EXIT_CANNOT
    except RuntimeError as e:
        clear_progress()
        sys.stderr.write("twinstack bench: failed: %s\n" % e)
        return EXIT_FAIL
    except BrokenPipeError:
        return EXIT_FAIL  # stdout closed (| head): the testbed is torn down at exit
    except (OSError, ValueError, KeyError) as e:
        clear_progress()
        sys.stderr.write("twinstack bench: failed: %s: %s\n" % (type(e).__name__, e))
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
