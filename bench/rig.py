#!/usr/bin/env python3
"""rig.py — the twinstack namespace comparison rig (`twinstack bench`, `make bench`).

Builds a two-namespace testbed, measures every subject (the bare veth, the TUN reflector and
each stack as a child `twinstack run`) through every workload, interleaved per repetition
round, and writes a table on stdout, results.json, report.md and SVG charts (gnuplot).

    ns A (client + proxy)                                   ns B (servers)
    iperf3 -c / load clients                                lo 10.200.1.2/32 (the target)
      main table: 10.200.1.0/24 -> tun (stacks)             iperf3 -s (several ports)
                               -> veth (veth baseline)      load serve (TCP echo ports, UDP echo)
    tun 198.18.0.1/15 (txqueuelen 10000)                    route 198.18.0.0/15 via A
      twinstack run / twinstack reflect
      iperf3 -s (reflector baseline: 198.18.1.1 mirrors back to 198.18.0.1)
    outbound sockets SO_MARK 1; ip rule fwmark 1 -> table 100 (default via B)
    veth 10.200.0.1/24 (txqueuelen 10000) <------------> veth 10.200.0.2/24

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

EXIT_OK, EXIT_FAIL, EXIT_CANNOT = 0, 1, 2

UNITS = {
    "throughput_gbps": "Gbit/s", "ceiling_fraction": "ratio", "peak_rss_kb": "KiB",
    "idle_rss_kb": "KiB", "startup_ms": "ms", "idle_wakeups_20s": "wakeups",
    "udp_flows_answered": "flows", "user_bytes_per_conn": "bytes", "kernel_kb_per_conn": "KiB",
    "cpu_user_s": "s", "cpu_sys_s": "s", "tun_drops": "packets", "retransmits": "segments",
    "conn_per_s": "conn/s", "latency_p50_us": "us", "latency_p99_us": "us",
    "latency_p999_us": "us", "pps": "packets/s", "loss_pct": "%",
    "instructions_per_op": "instructions",
}


class CannotRun(Exception):
    pass


# ---- process and namespace bookkeeping ------------------------------------------------------

class Testbed:
    def __init__(self, tok, workdir, verbose=False):
        self.tok = tok
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


# ---- small utilities ------------------------------------------------------------------------

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


# ---- the rig --------------------------------------------------------------------------------

class Rig:
    def __init__(self, args):
        self.a = args
        self.bin = os.path.abspath(args.bin)
        self.quick = args.quick
        self.reps = args.reps if args.reps else (1 if args.quick else 3)
        self.stacks = [s for s in args.stacks.split(",") if s]
        self.out = os.path.abspath(args.out)
        self.samples = {}       # key (stack, workload, direction, streams, metric) -> [values]
        self.na = []            # (subject, workload, reason)
        self.failures = []
        self.notes = []
        self.iperf_port_i = 0
        self.step = 0
        self.total_steps = 1
        self.t0 = time.monotonic()
        self.cur_round = 0
        if self.quick:
            self.bulk_cells = [("up", 1), ("up", 16)]
            self.bulk_t, self.bulk_omit = 3, 1
            self.idle_s = 5
            self.load_s = 3
        else:
            self.bulk_cells = [(d, n) for d in ("up", "down") for n in (1, 16, 64)]
            self.bulk_t, self.bulk_omit = 5, 1
            self.idle_s = 20
            self.load_s = 5
        if args.bulk_seconds:
            self.bulk_t = args.bulk_seconds
        self.hold_conns = 1000

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
        if "load" in cmds:
            r = subprocess.run([self.bin, "load", "--help"], capture_output=True, text=True,
                               timeout=10)
            txt = r.stdout + r.stderr
            for m in ("serve", "connrate", "latency", "hold", "udp", "udpflows"):
                if re.search(r"\b%s\b" % m, txt):
                    self.load_modes.add(m)
        micro = os.path.join(os.path.dirname(self.bin), "twinstack-micro")
        self.micro = micro if os.path.exists(micro) else None

    def has_load(self, mode):
        return "serve" in self.load_modes and mode in self.load_modes

    # -- sample bookkeeping
    def add(self, stack, workload, direction, streams, metric, value):
        if value is None:
            return
        key = (stack, workload, direction, streams, metric)
        self.samples.setdefault(key, []).append(float(value))

    def note_na(self, subject, workload, reason):
        if (subject, workload, reason) not in self.na:
            self.na.append((subject, workload, reason))
            out("%-10s %-16s %-5s %4s  %-20s %s" % (subject, workload, "", "", "n/a", reason))

    def emit(self, stack, workload, direction, streams, metric, value, extra=""):
        self.add(stack, workload, direction, streams, metric, value)
        out("%-10s %-16s %-5s %4s  %-20s %10s %s%s" % (
            stack, workload, direction or "", "" if streams is None else streams, metric,
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
    def write_config(self, stack, path):
        cfg = {
            "stack": stack,
            "tun": {"name": self.tb.tun, "address": TUN_CIDR, "mtu": 1500,
                    "txqueuelen": 10000, "queues": 1, "offload": self.offload},
            "outbounds": [{"tag": "direct", "type": "direct", "routing_mark": MARK}],
            "route": {"final": "direct"},
            "budgets": {"tcp_sessions": 8192, "fds": 65536, "nat_entries": 262144},
            "nat": {"linger_ms": 2000, "port_quarantine_ms": 2000},
            "timeouts": {"connect_ms": 3000, "udp_idle_ms": 10000},
            "stats": {"listen": "127.0.0.1:%d" % STATS_PORT},
            "log": {"level": "warn"},
        }
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)

    def write_reflect_config(self, path):
        cfg = {"tun": {"name": self.tb.tun, "address": TUN_CIDR, "mtu": 1500,
                       "txqueuelen": 10000, "queues": 1, "offload": self.offload},
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
    def bulk(self, subject, pid, direction, streams):
        tb = self.tb
        if subject == "reflector":
            args = ["iperf3", "-c", MIRROR4, "-B", GW4, "-p", str(REFL_IPERF_PORT)]
        else:
            args = ["iperf3", "-c", TARGET4, "-p", str(self.next_iperf_port())]
        args += ["-P", str(streams), "-t", str(self.bulk_t), "-O", str(self.bulk_omit), "-J",
                 "--connect-timeout", "3000"]
        if direction == "down":
            args.append("-R")
        cpu0 = proc_cpu(pid) if pid else None
        drops0 = self.tun_drops() if subject != "veth" else None
        r = tb.sh(args, ns=tb.ns_a, check=False, timeout=self.bulk_t + self.bulk_omit + 20)
        cpu1 = proc_cpu(pid) if pid else None
        drops1 = self.tun_drops() if subject != "veth" else None
        try:
            j = json.loads(r.stdout)
        except ValueError:
            j = None
        if not j or "error" in j or not j.get("intervals"):
            err = (j or {}).get("error") or (r.stderr or "").strip()[:200] or "no JSON"
            raise RuntimeError("iperf3 %s %s x%d: %s" % (subject, direction, streams, err))
        bps = [iv["sum"]["bits_per_second"] for iv in j["intervals"]
               if not iv["sum"].get("omitted")]
        if not bps:
            raise RuntimeError("iperf3 %s %s x%d: no intervals after warm-up" % (
                subject, direction, streams))
        gbps = statistics.median(bps) / 1e9
        wl = "tcp_bulk"
        self.emit(subject, wl, direction, streams, "throughput_gbps", gbps)
        retr = j.get("end", {}).get("sum_sent", {}).get("retransmits")
        if retr is not None:
            self.add(subject, wl, direction, streams, "retransmits", retr)
        if cpu0 and cpu1:
            self.add(subject, wl, direction, streams, "cpu_user_s", cpu1[0] - cpu0[0])
            self.add(subject, wl, direction, streams, "cpu_sys_s", cpu1[1] - cpu0[1])
        if drops0 is not None and drops1 is not None:
            self.add(subject, wl, direction, streams, "tun_drops", drops1 - drops0)
        return gbps

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
        j = self.load("udp", ["--target", "%s:%d" % (TARGET4, UDP_PORT), "--size", str(size),
                              "--duration", str(d)], d + 20)
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
                              % subject)
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

    # -- one subject through every workload, once
    def run_subject(self, subject):
        tb = self.tb
        pid = None
        child = None
        try:
            if subject == "veth":
                tb.route_target_via_veth()
            elif subject == "reflector":
                if not self.has_reflect:
                    self.note_na("reflector", "all", "`twinstack reflect` not in this binary")
                    return
                cfg = os.path.join(self.work, "reflect.json")
                self.write_reflect_config(cfg)
                self.tick("reflector: start")
                child, ms = self.start_child("reflect", cfg, "reflect")
                pid = child.pid
            else:
                cfg = os.path.join(self.work, "run-%s.json" % subject)
                self.write_config(subject, cfg)
                self.tick("%s: start" % subject)
                child, ms = self.start_child("run", cfg, "run-%s" % subject)
                pid = child.pid
                tb.route_target_via_tun()
                self.emit(subject, "startup", None, None, "startup_ms", ms)
                time.sleep(1.0)
                self.tick("%s: idle wakeups over %d s" % (subject, self.idle_s))
                c0 = proc_ctxt(pid)
                time.sleep(self.idle_s)
                c1 = proc_ctxt(pid)
                if c0 is not None and c1 is not None:
                    self.emit(subject, "idle", None, None, "idle_wakeups_20s", c1 - c0,
                              "over %d s" % self.idle_s if self.idle_s != 20 else "")

            for direction, streams in self.bulk_cells:
                self.tick("%s: tcp bulk %s, %d stream%s" % (subject, direction, streams,
                                                            "s" if streams > 1 else ""))
                try:
                    self.bulk(subject, pid, direction, streams)
                except RuntimeError as e:
                    self.fail(str(e))
                if child is not None and child.poll() is not None:
                    raise RuntimeError("%s exited (%s) during the bulk workloads" % (
                        subject, child.returncode))

            if subject != "reflector":
                self.load_workloads(subject, pid)

            if pid:
                hwm = proc_kb(pid, "VmHWM")
                self.emit(subject, "run", None, None, "peak_rss_kb", hwm)
                if subject != "reflector":
                    self.tick("%s: RSS after 5 s idle" % subject)
                    time.sleep(5)
                    self.emit(subject, "run", None, None, "idle_rss_kb", proc_kb(pid, "VmRSS"))
        except RuntimeError as e:
            self.fail("%s: %s" % (subject, e))
        finally:
            if child is not None:
                tb.stop(child)

    def load_workloads(self, subject, pid):
        wl = [("connrate", lambda: self.w_connrate(subject))]
        if subject != "veth":
            wl.append(("hold", lambda: self.w_hold(subject, pid)))
        if not self.quick:
            wl += [("latency", lambda: self.w_latency(subject)),
                   ("udp", lambda: self.w_udp(subject, 64)),
                   ("udp", lambda: self.w_udp(subject, 1400)),
                   ("udpflows", lambda: self.w_udpflows(subject))]
        for mode, fn in wl:
            self.tick("%s: %s" % (subject, mode))
            if not self.has_load(mode):
                self.note_na(subject, mode, "`twinstack load %s` not available" % mode)
                continue
            try:
                fn()
            except RuntimeError as e:
                self.fail("%s %s: %s" % (subject, mode, e))

    def fail(self, msg):
        self.failures.append(msg)
        log("FAILED: " + msg)

    def count_steps(self, subjects):
        per = 0
        for s in subjects:
            per += len(self.bulk_cells)
            if s not in ("veth",):
                per += 1  # start
            if s not in ("veth", "reflector"):
                per += 2  # idle + idle rss
            if s != "reflector":
                per += 1 + (1 if s != "veth" else 0) + (0 if self.quick else 4)
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
            self.emit("micro", case, None, None, "instructions_per_op", v["instructions"])

    # -- main
    def run(self):
        self.probe_bin()
        self.offload = {"per-packet": "off", "offload": "on"}[self.a.io_mode]
        if not self.has_run:
            raise CannotRun("%s has no `run` subcommand" % self.bin)
        os.makedirs(self.out, exist_ok=True)
        self.work = os.path.join(self.out, "work")
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        tok = os.urandom(3).hex()
        self.tb = Testbed(tok, self.work, self.a.verbose)
        tb = self.tb
        atexit.register(tb.teardown)

        def on_signal(signum, frame):
            clear_progress()
            sys.stderr.write("\ninterrupted (signal %d): tearing the testbed down\n" % signum)
            tb.teardown()
            os._exit(128 + signum)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, on_signal)

        subjects = ["veth", "reflector"] + self.stacks
        self.total_steps = self.count_steps(subjects)
        started = datetime.datetime.now(datetime.timezone.utc)
        log("twinstack bench: %s, %d repetition%s, subjects %s, io_mode %s, out %s" % (
            "quick" if self.quick else "full", self.reps, "s" if self.reps > 1 else "",
            ",".join(subjects), self.a.io_mode, self.out))
        missing = [m for m in ("serve", "connrate", "hold", "latency", "udp", "udpflows")
                   if m not in self.load_modes]
        if not self.has_reflect:
            log("note: `twinstack reflect` missing: reflector baseline and ceiling are n/a")
        if missing:
            log("note: `twinstack load` modes missing (%s): those workloads are n/a" %
                ",".join(missing))
        progress("building the testbed (namespaces %s, %s)" % (tb.ns_a, tb.ns_b))
        tb.build()
        self.start_servers()
        out("%-10s %-16s %-5s %4s  %-20s %10s %s" % ("subject", "workload", "dir", "n",
                                                       "metric", "value", "unit"))
        for rnd in range(self.reps):
            self.cur_round = rnd + 1
            # rotate the order each round so no subject always runs first or last
            k = rnd % len(subjects)
            order = subjects[k:] + subjects[:k]
            for subject in order:
                self.run_subject(subject)
        tb.teardown()
        if not self.quick and not self.a.no_micro:
            self.micro_rows()
        clear_progress()
        duration = time.monotonic() - self.t0
        self.finish(subjects, started, duration)
        log("done in %dm%02ds: %s" % (duration // 60, duration % 60, self.out))
        return EXIT_FAIL if self.failures else EXIT_OK

    # -- aggregation and output
    def rows(self, subjects):
        rows = []
        io_mode = self.a.io_mode

        def row(stack, wl, d, n, metric, vals):
            return {"stack": stack, "io_mode": io_mode if stack != "micro" else "n/a",
                    "queues": 1, "workload": wl, "direction": d, "streams": n,
                    "metric": metric, "unit": UNITS.get(metric, ""),
                    "median": statistics.median(vals), "min": min(vals), "max": max(vals),
                    "n": len(vals)}
        for (stack, wl, d, n, metric), vals in self.samples.items():
            rows.append(row(stack, wl, d, n, metric, vals))
        # the two-hop ceiling and each stack's fraction of it, per round (same cell)
        self.ceiling = {}
        for d, n in self.bulk_cells:
            refl = self.samples.get(("reflector", "tcp_bulk", d, n, "throughput_gbps"), [])
            veth = self.samples.get(("veth", "tcp_bulk", d, n, "throughput_gbps"), [])
            m = min(len(refl), len(veth))
            if m == 0:
                continue
            ceil = [1.0 / (1.0 / refl[i] + 1.0 / veth[i]) for i in range(m) if refl[i] > 0 and
                    veth[i] > 0]
            if not ceil:
                continue
            self.ceiling[(d, n)] = ceil
            rows.append(row("ceiling", "tcp_bulk", d, n, "throughput_gbps", ceil))
            for s in self.stacks:
                thr = self.samples.get((s, "tcp_bulk", d, n, "throughput_gbps"), [])
                fr = [thr[i] / ceil[i] for i in range(min(len(thr), len(ceil)))]
                if fr:
                    self.samples[(s, "tcp_bulk", d, n, "ceiling_fraction")] = fr
                    rows.append(row(s, "tcp_bulk", d, n, "ceiling_fraction", fr))
        order = {s: i for i, s in enumerate(subjects + ["ceiling", "micro"])}
        rows.sort(key=lambda r: (r["workload"] != "tcp_bulk", r["workload"],
                                 r["direction"] or "", r["streams"] or 0,
                                 order.get(r["stack"], 99), r["metric"]))
        return rows

    def finish(self, subjects, started, duration):
        rows = self.rows(subjects)
        meta = {
            "schema": 1, "tool": "twinstack bench (bench/rig.py)", "binary": self.bin,
            "started_utc": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "duration_s": round(duration, 1), "mode": "quick" if self.quick else "full",
            "repetitions": self.reps, "subjects": subjects, "io_mode": self.a.io_mode,
            "queues": 1, "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                                  "machine": platform.machine()},
            "iperf3": {"seconds": self.bulk_t, "omit": self.bulk_omit},
            "idle_wakeup_window_s": self.idle_s, "hold_conns": self.hold_conns,
            "not_measured": [{"subject": s, "workload": w, "reason": r} for s, w, r in self.na],
            "failures": self.failures, "notes": self.notes,
        }
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        self.write_report(rows, meta, subjects)
        self.charts(rows, subjects)

    def med(self, rows, stack, wl, d, n, metric):
        for r in rows:
            if (r["stack"], r["workload"], r["direction"], r["streams"], r["metric"]) == \
                    (stack, wl, d, n, metric):
                return r
        return None

    def write_report(self, rows, meta, subjects):
        L = []
        L.append("# twinstack bench report")
        L.append("")
        L.append("%s run, %s UTC, %d repetition(s), %.0f s, io_mode %s, 1 queue, kernel %s, "
                 "%d CPUs. Each figure: median [min – max] over the repetitions." % (
                     meta["mode"], meta["started_utc"], meta["repetitions"], meta["duration_s"],
                     meta["io_mode"], meta["host"]["kernel"], meta["host"]["cpus"]))
        L.append("")
        cols = subjects + ["ceiling"]

        def cell(r, digits=2):
            if r is None:
                return "n/a"
            if r["n"] == 1:
                return "%.*f" % (digits, r["median"])
            return "%.*f [%.*f – %.*f]" % (digits, r["median"], digits, r["min"], digits,
                                          r["max"])
        L.append("## TCP bulk throughput (Gbit/s, median of per-second iperf3 intervals after a "
                 "%d s warm-up)" % self.bulk_omit)
        L.append("")
        L.append("| direction | streams | " + " | ".join(cols) + " |")
        L.append("| --- | --- |" + " --- |" * len(cols))
        for d, n in self.bulk_cells:
            L.append("| %s | %d | " % (d, n) + " | ".join(
                cell(self.med(rows, s, "tcp_bulk", d, n, "throughput_gbps")) for s in cols) + " |")
        L.append("")
        L.append("The two-hop ceiling = 1 / (1/reflector + 1/veth), per round and cell: what a "
                 "proxy that terminates TCP on one side of a TUN and opens it again on the veth "
                 "could reach if it cost nothing.")
        L.append("")
        L.append("## Each stack as a fraction of the ceiling")
        L.append("")
        if self.ceiling:
            L.append("| direction | streams | " + " | ".join(self.stacks) + " |")
            L.append("| --- | --- |" + " --- |" * len(self.stacks))
            for d, n in self.bulk_cells:
                L.append("| %s | %d | " % (d, n) + " | ".join(
                    cell(self.med(rows, s, "tcp_bulk", d, n, "ceiling_fraction"), 3)
                    for s in self.stacks) + " |")
        else:
            L.append("n/a: the ceiling needs both baselines (the reflector was not measured).")
        L.append("")
        L.append("## Cost of the bulk runs (per cell, per run)")
        L.append("")
        L.append("| subject | direction | streams | cpu user s | cpu sys s | TUN drops | "
                 "retransmits |")
        L.append("| --- | --- | --- | --- | --- | --- | --- |")
        for s in subjects:
            for d, n in self.bulk_cells:
                vals = [self.med(rows, s, "tcp_bulk", d, n, m) for m in
                        ("cpu_user_s", "cpu_sys_s", "tun_drops", "retransmits")]
                if all(v is None for v in vals):
                    continue
                L.append("| %s | %s | %d | %s |" % (s, d, n, " | ".join(
                    cell(v, 2 if i < 2 else 0) for i, v in enumerate(vals))))
        L.append("")
        other = [r for r in rows if r["workload"] != "tcp_bulk" and r["stack"] != "micro"]
        if other:
            L.append("## Other workloads and figures")
            L.append("")
            L.append("| subject | workload | metric | unit | median | min | max | n |")
            L.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
            for r in sorted(other, key=lambda r: (r["workload"], r["metric"],
                                                   cols.index(r["stack"]) if r["stack"] in cols
                                                   else 99)):
                L.append("| %s | %s | %s | %s | %s | %s | %s | %d |" % (
                    r["stack"], r["workload"], r["metric"], r["unit"], fmt(r["median"]),
                    fmt(r["min"]), fmt(r["max"]), r["n"]))
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
        L.append("## Not measured")
        L.append("")
        if self.na:
            for s, w, reason in self.na:
                L.append("- %s / %s: %s" % (s, w, reason))
        else:
            L.append("- nothing")
        if self.failures:
            L.append("")
            L.append("## Failures")
            L.append("")
            for f in self.failures:
                L.append("- " + f)
        L.append("")
        L.append("## Method")
        L.append("")
        L.append("- Subjects are interleaved: each repetition round runs every subject once "
                 "through every workload, in an order rotated per round.")
        L.append("- veth: iperf3 over the bare veth from A to B (the physical path). reflector: "
                 "`twinstack reflect` swaps addresses on the TUN, iperf3 from %s to the mirror "
                 "%s (one TCP connection through the TUN, both directions). Stacks: `twinstack "
                 "run` with a generated config (offload %s), target %s on B's loopback routed "
                 "into the TUN, outbound sockets marked and routed over the veth." % (
                     GW4, MIRROR4, self.offload, TARGET4))
        L.append("- Throughput: iperf3 -J, %d s after a %d s warm-up (-O), the median of the "
                 "per-second sums (not the mean: one stall does not move it)." % (
                     self.bulk_t, self.bulk_omit))
        L.append("- CPU: utime/stime deltas of the proxy process (/proc/PID/stat) across each "
                 "bulk run; kernel TCP work done inside the proxy's TUN writes is sys time.")
        L.append("- Memory: peak_rss_kb = VmHWM at the end of a round; idle_rss_kb = VmRSS after "
                 "5 s without traffic. user_bytes_per_conn = /stats buffers.per_session_bytes "
                 "with %d connections held; kernel_kb_per_conn = (sum over the proxy's TCP "
                 "sockets of skmem r+w+f+o+bl from `ss -tmp` + /stats splice.pipe_bytes) / "
                 "connections held." % self.hold_conns)
        L.append("- Idle wakeups: voluntary + nonvoluntary context switches of the proxy over "
                 "%d s with no traffic, right after start-up%s." % (
                     self.idle_s, "" if self.idle_s == 20 else
                     " (--quick: 5 s, not 20 s; the metric keeps its name)"))
        L.append("- Quote ratios from one run; absolute numbers depend on the machine.")
        L.append("")
        L.append("Charts: throughput.svg, memory_per_conn.svg. Raw logs and configs: work/.")
        with open(os.path.join(self.out, "report.md"), "w") as f:
            f.write("\n".join(L) + "\n")

    def charts(self, rows, subjects):
        if not shutil.which("gnuplot"):
            self.notes.append("charts: gnuplot not installed")
            log("note: gnuplot not installed, no charts")
            return
        cols = [s for s in subjects + ["ceiling"] if any(
            self.med(rows, s, "tcp_bulk", d, n, "throughput_gbps") for d, n in self.bulk_cells)]
        if not cols:
            self.notes.append("charts: no throughput figures, throughput.svg not drawn")
            return
        dat = os.path.join(self.out, "throughput.dat")
        with open(dat, "w") as f:
            f.write("cell " + " ".join(cols) + "\n")
            for d, n in self.bulk_cells:
                vals = []
                for s in cols:
                    r = self.med(rows, s, "tcp_bulk", d, n, "throughput_gbps")
                    vals.append("%.4f" % r["median"] if r else "NaN")
                f.write("\"%s %d\" %s\n" % (d, n, " ".join(vals)))
        gp = os.path.join(self.out, "throughput.gp")
        with open(gp, "w") as f:
            f.write(
                "set terminal svg size 900,480 dynamic enhanced font 'sans,11' background "
                "'white'\n"
                "set output '%s'\n"
                "set title 'TCP bulk throughput (median of runs): stacks vs baselines and the "
                "two-hop ceiling'\n"
                "set ylabel 'Gbit/s'\nset xlabel 'direction, streams'\n"
                "set style data histograms\nset style histogram clustered gap 1\n"
                "set style fill solid 0.85 border -1\nset boxwidth 0.9\nset key outside right top\n"
                "set grid ytics\nset yrange [0:*]\n"
                "plot for [i=2:%d] '%s' using i:xtic(1) title columnheader(i)\n" % (
                    os.path.join(self.out, "throughput.svg"), len(cols) + 1, dat))
        datm = os.path.join(self.out, "memory_per_conn.dat")
        have_mem = False
        with open(datm, "w") as f:
            f.write("stack user_KiB kernel_KiB\n")
            for s in self.stacks:
                u = self.med(rows, s, "hold_1000", None, self.hold_conns, "user_bytes_per_conn")
                k = self.med(rows, s, "hold_1000", None, self.hold_conns, "kernel_kb_per_conn")
                if u or k:
                    have_mem = True
                f.write("%s %s %s\n" % (s, "%.3f" % (u["median"] / 1024) if u else "NaN",
                                        "%.3f" % k["median"] if k else "NaN"))
        gpm = os.path.join(self.out, "memory_per_conn.gp")
        with open(gpm, "w") as f:
            f.write(
                "set terminal svg size 700,420 dynamic enhanced font 'sans,11' background "
                "'white'\n"
                "set output '%s'\n"
                "set title 'Memory per connection (%d held)'\nset ylabel 'KiB per connection'\n"
                "set style data histograms\nset style histogram rowstacked\n"
                "set style fill solid 0.85 border -1\nset boxwidth 0.6\nset key top left inside\n"
                "set grid ytics\nset yrange [0:*]\n"
                "plot '%s' using 2:xtic(1) title 'userspace buffers (/stats)', "
                "'' using 3 title 'kernel sockets + pipes (ss -tm)'\n" % (
                    os.path.join(self.out, "memory_per_conn.svg"), self.hold_conns, datm))
        for script, name in ((gp, "throughput"), (gpm if have_mem else None, "memory_per_conn")):
            if script is None:
                self.notes.append("charts: no memory-per-connection figures, %s.svg not drawn"
                                  % name)
                continue
            r = subprocess.run(["gnuplot", script], capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                self.notes.append("charts: gnuplot %s failed: %s" % (name, r.stderr.strip()[:200]))
                log("warning: gnuplot %s: %s" % (name, r.stderr.strip()[:200]))


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="twinstack bench",
        description="Namespace comparison rig: both stacks and two baselines side by side.")
    ap.add_argument("--bin", default=os.path.join(SRC, "build", "twinstack"),
                    help="the twinstack binary under test (twinstack bench passes itself)")
    ap.add_argument("--quick", action="store_true",
                    help="1 repetition, bulk 1 and 16 streams upload, short conn-rate and "
                    "memory-per-connection probes (< 3 minutes)")
    ap.add_argument("--stacks", default="system,lwip", help="comma-separated (default %(default)s)")
    ap.add_argument("--out", default="bench-results", help="output directory (default "
                    "%(default)s)")
    ap.add_argument("--reps", type=int, default=0, help="repetitions (default 3, --quick 1)")
    ap.add_argument("--io-mode", default="per-packet", choices=("per-packet", "offload"),
                    help="TUN I/O mode of the stacks and the reflector (config tun.offload)")
    ap.add_argument("--bulk-seconds", type=int, default=0,
                    help="iperf3 -t per bulk run (default 5, --quick 3)")
    ap.add_argument("--no-micro", action="store_true",
                    help="skip the callgrind instruction counts")
    ap.add_argument("-v", "--verbose", action="store_true", help="echo every command")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        sys.exit(EXIT_OK if e.code == 0 else EXIT_CANNOT)
    for s in a.stacks.split(","):
        if s not in ("system", "lwip"):
            ap.print_usage(sys.stderr)
            sys.stderr.write("twinstack bench: --stacks: unknown stack %r (system, lwip)\n" % s)
            sys.exit(EXIT_CANNOT)
    if a.reps < 0 or a.reps > 50:
        sys.stderr.write("twinstack bench: --reps must be 1-50\n")
        sys.exit(EXIT_CANNOT)
    return a


def preflight(a):
    if os.geteuid() != 0:
        raise CannotRun("needs root (network namespaces, TUN devices); try: sudo twinstack bench")
    if not os.path.exists("/dev/net/tun"):
        raise CannotRun("no /dev/net/tun: this kernel or container has no TUN support")
    missing = [t for t in ("ip", "ss", "sysctl", "iperf3") if not shutil.which(t)]
    if missing:
        raise CannotRun("missing tools: %s (scripts/setup.sh installs them)" % " ".join(missing))
    if not os.access(a.bin, os.X_OK):
        raise CannotRun("binary %s not found or not executable (build first)" % a.bin)
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=10)
    if r.returncode != 0:
        raise CannotRun("`ip netns` does not work here: network namespaces unavailable")


def main(argv):
    a = parse_args(argv)
    try:
        preflight(a)
        return Rig(a).run()
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
