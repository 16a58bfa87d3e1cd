"""rigtb.py — the comparison rig's testbed: two namespaces, a veth pair, the routes, the
processes started in them and their teardown; the testbed's addresses and ports; what the rig
reads of a process (/proc) and of the TUN (ethtool, fdinfo, sysfs, the proxy's /stats).

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

Every wait is bounded; teardown() is idempotent and kills whatever is left in the namespaces.
Python 3 standard library only.
"""

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

from report import log

A_VETH4, B_VETH4 = "10.200.0.1", "10.200.0.2"
TARGET4 = "10.200.1.2"
GW4, MIRROR4 = "198.18.0.1", "198.18.1.1"
TUN_CIDR = "198.18.0.1/15"
STATS_PORT = 9090
BESIDE_STATS_PORT = 9091  # the redirect baseline's stats while a proxy's block runs beside it
IPERF_PORTS = [5201, 5202, 5203, 5204]
REFL_IPERF_PORT = 5301
ECHO_PORTS = [7001, 7002, 7003, 7004]
UDP_PORT = 7007
MARK = 1
S5_PORT = 1080          # --via socks5: dante's port on B's veth address
REDIR_PORT = 7400       # the redirect baseline's listener on A's 127.0.0.1
DANTED = "/usr/sbin/danted"

EXIT_OK, EXIT_FAIL, EXIT_CANNOT = 0, 1, 2


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
        self.nft_table = "tsbredir" + tok
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

    def redirect_on(self, udp=False):
        """The redirect baseline's rule set in A (nftables, a table named for this testbed):
        every TCP connection A opens to the target goes to the listener on REDIR_PORT, except
        the baseline's own outbound connections (marked MARK); with udp, every datagram to the
        target's UDP echo port goes to its UDP forwarder on the same port number."""
        udp_rule = ("  ip daddr %s udp dport %d redirect to :%d\n" % (TARGET4, UDP_PORT,
                                                                     REDIR_PORT)
                    if udp else "")
        rules = ("table inet %s {\n chain out {\n  type nat hook output priority -100; "
                 "policy accept;\n  meta mark %d return\n  ip daddr %s meta l4proto tcp "
                 "redirect to :%d\n%s }\n}\n" % (self.nft_table, MARK, TARGET4, REDIR_PORT,
                                                   udp_rule))
        path = os.path.join(self.work, "redirect.nft")
        with open(path, "w") as f:
            f.write(rules)
        self.sh(["nft", "-f", path], ns=self.ns_a)

    def redirect_off(self):
        self.sh(["nft", "delete", "table", "inet", self.nft_table], ns=self.ns_a, check=False)

    def route_target_via_tun(self):
        self.sh(["ip", "-n", self.ns_a, "route", "replace", "10.200.1.0/24", "dev", self.tun,
                 "src", GW4])

    def teardown(self):
        """Idempotent. Signals that come meanwhile wait until it is done, then are delivered:
        a handler that tears down and exits (the runner's) would otherwise find it marked done
        and exit with the namespaces and their processes still there."""
        if self.torn_down:
            return
        self.torn_down = True
        held, prev = [], {}
        try:
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                prev[s] = signal.signal(s, lambda signum, frame: held.append(signum))
        except ValueError:
            prev = {}  # not the main thread: signals are the main thread's anyway
        try:
            self._teardown()
        finally:
            for s, h in prev.items():
                signal.signal(s, h)
            if held:
                os.kill(os.getpid(), held[0])

    def _teardown(self):
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

    # -- what the rig reads of the testbed
    def wait_listen(self, ns, proto, port, tries=100, fatal=True):
        flag = "-ltnH" if proto == "tcp" else "-lunH"
        for _ in range(tries):
            r = self.sh(["ss", flag, "sport = :%d" % port], ns=ns, check=False)
            if r.stdout.strip():
                return True
            time.sleep(0.1)
        if fatal:
            raise RuntimeError("nothing listens on %s/%d in %s" % (proto, port, ns))
        return False

    def tun_offload(self):
        """The TUN's {"tx-checksumming": on|off, "tcp-segmentation-offload": on|off} as
        `ethtool -k` states them (fewer keys when it does not)."""
        r = self.sh(["ethtool", "-k", self.tun], ns=self.ns_a, check=False)
        return dict(re.findall(r"^(tx-checksumming|tcp-segmentation-offload):\s*(on|off)",
                               r.stdout, re.M))

    def tun_fds(self, pid):
        """How many fds of pid are queues of this testbed's TUN (fdinfo `iff:` lines name the
        device), or None when fdinfo is unreadable."""
        d = "/proc/%d/fdinfo" % pid
        try:
            names = os.listdir(d)
        except OSError:
            return None
        n = 0
        for fd in names:
            try:
                with open(os.path.join(d, fd)) as f:
                    if re.search(r"^iff:\s*%s$" % re.escape(self.tun), f.read(), re.M):
                        n += 1
            except OSError:
                continue
        return n

    def tun_drops(self):
        tot = 0
        for k in ("rx_dropped", "tx_dropped"):
            r = self.sh(["cat", "/sys/class/net/%s/statistics/%s" % (self.tun, k)],
                        ns=self.ns_a, check=False)
            try:
                tot += int(r.stdout.strip())
            except ValueError:
                return None
        return tot

    def stats(self):
        """The proxy's /stats document (twinstack run in A), or None."""
        if shutil.which("curl"):
            args = ["curl", "-sS", "--fail", "--max-time", "3",
                    "http://127.0.0.1:%d/stats" % STATS_PORT]
        else:
            args = [sys.executable, "-c",
                    "import urllib.request,sys;sys.stdout.write(urllib.request.urlopen("
                    "'http://127.0.0.1:%d/stats',timeout=3).read().decode())" % STATS_PORT]
        r = self.sh(args, ns=self.ns_a, check=False, timeout=6)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def socket_bytes(self, pid):
        """(bytes, sockets): the sum of skmem (rmem_alloc + wmem_queued + fwd_alloc + opt +
        backlog) over the TCP sockets of pid in A (ss -tmpn) and how many there are; None
        when ss fails."""
        r = self.sh(["ss", "-tmpnH"], ns=self.ns_a, check=False, timeout=30)
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
        return total, mine


# ---- /proc and tool output ------------------------------------------------------------------

def proc_status(pid, tid=None):
    """/proc/PID/status (or one thread's, /proc/PID/task/TID/status) as a dict, or None."""
    d = {}
    path = "/proc/%d/status" % pid if tid is None else "/proc/%d/task/%s/status" % (pid, tid)
    try:
        with open(path) as f:
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


def proc_fds(pid):
    """How many fds pid has open, or None."""
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return None


def proc_nofile(pid):
    """pid's RLIMIT_NOFILE (soft, hard) from /proc/PID/limits, or None."""
    try:
        with open("/proc/%d/limits" % pid) as f:
            for line in f:
                if line.startswith("Max open files"):
                    v = line.split()[3:5]
                    return tuple(int(x) if x.isdigit() else -1 for x in v)
    except (OSError, ValueError):
        pass
    return None


def raise_nofile():
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (what `twinstack run`,
    `redirect` and `load` do for themselves), so the processes it starts inherit it.
    Returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass
    return soft, hard


def proc_ctxt(pid):
    """{thread id: its context switches so far} over every thread of pid (the event loop and
    the queue workers are threads of their own; /proc/PID/status counts the main thread
    only, which in `twinstack run` just waits), or None when pid is gone."""
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return None
    for tid in tids:
        st = proc_status(pid, tid)
        if st is None:
            continue  # the thread ended meanwhile
        out[int(tid)] = int(st.get("voluntary_ctxt_switches", 0)) + \
            int(st.get("nonvoluntary_ctxt_switches", 0))
    return out


def ctxt_delta(before, after):
    """The context switches between two proc_ctxt() readings: each thread's growth (all of
    it for one that started between them)."""
    return sum(n - before.get(tid, 0) for tid, n in after.items())


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


def host_cpu_s():
    """CPU seconds the whole machine spent busy so far (/proc/stat's first line, all CPUs):
    the testbed's client, servers, proxy and the kernel work of each, which namespaces do not
    separate. Not counted: idle, iowait, and niced time when the rig does not run niced."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is already in user). Niced
    # time is someone else's background work unless the rig itself runs niced.
    busy = v[0] + v[2] + v[5] + v[6] + v[7]
    if os.nice(0) > 0:
        busy += v[1]
    return busy / CLK_TCK


def reset_peak_rss(pid):
    """Resets pid's VmHWM to its current RSS (clear_refs 5), so the next VmHWM read is the
    peak of what came between. False where the kernel refuses."""
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


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
