"""workloads.py — what the comparison rig measures a started subject with: TCP bulk (iperf3,
with the subject's CPU time, the TUN's drops, the SOCKS5 server's CPU and an optional perf
profile), the `twinstack load` workloads (connection rate, latency, UDP echo, UDP flows,
connections held and the memory each costs), the look counters of --sniff, the UDP echo of
--via socks5, and the callgrind instruction counts of the micro-benchmarks. Every figure goes
through Results.emit/add (bench/results.py).

Python 3 standard library only.
"""

import json
import os
import re
import selectors
import shutil
import signal
import statistics
import subprocess
import time

import perfcopy
import report
from report import progress
from rigtb import (B_VETH4, ECHO_PORTS, GW4, MIRROR4, REFL_IPERF_PORT, S5_PORT, TARGET4,
                   UDP_PORT, host_cpu_s, last_json, proc_cpu, proc_fds, proc_kb, proc_nofile,
                   raise_nofile, reset_peak_rss)

HERE = os.path.dirname(os.path.abspath(__file__))
STALL_GBPS = 0.01       # a bulk run below 10 Mbit/s stalled: recorded, and a failure
CONN_ERRORS_MAX = 0.01  # connrate: more of its attempts failing is a failure, fewer a note


class Workloads:
    """The workloads of one run: plan (bench/plan.py), testbed tb, binary and servers
    (bench/servers.py), results (bench/results.py); work: the run's scratch directory."""

    def __init__(self, plan, tb, binary, servers, results, work):
        self.plan, self.tb, self.binary, self.servers = plan, tb, binary, servers
        self.results, self.work = results, work
        self.emit, self.add, self.fail = results.emit, results.add, results.fail
        self.peaks = {}         # pid -> the highest per-cell VmHWM read (bulk resets it)
        # The processes started from here inherit the hard fd limit (an external subject
        # holding many connections; ours raise their own as well).
        raise_nofile()

    def run_peak_kb(self, pid):
        """pid's peak RSS over its whole life: VmHWM now, or a bulk cell's peak read before
        the next cell reset it, whichever is higher."""
        now = proc_kb(pid, "VmHWM")
        if now is None:
            return None
        return max(now, self.peaks.get(pid, 0))

    # -- TCP bulk
    def bulk(self, subj, pid, direction, streams, rec=None):
        """One iperf3 run of subj (its child's pid, or None) in one cell; returns Gbit/s.
        rec: (subject, workload) the figures are recorded under (a baseline's run beside a
        proxy's cell, bench/runner.py Beside); default (subj, "tcp_bulk")."""
        tb, plan = self.tb, self.plan
        rs, wl = rec or (subj, "tcp_bulk")
        if subj.is_mirror:
            args = ["iperf3", "-c", MIRROR4, "-B", GW4, "-p", str(REFL_IPERF_PORT)]
        else:
            args = ["iperf3", "-c", TARGET4, "-p", str(self.servers.next_iperf_port())]
        if subj.kind == "socks5-client":
            # every connect() of iperf3 (control and data) goes to dante as a CONNECT
            args = ["proxychains4", "-q", "-f", self.servers.pc_conf] + args
        args += ["-P", str(streams), "-t", str(plan.bulk_t), "-O", str(plan.bulk_omit), "-J",
                 "--connect-timeout", "3000"]
        if getattr(plan, "bulk_interval", None):
            # --ab: shorter intervals, more of them for the median (bench/ab.py)
            args += ["-i", str(plan.bulk_interval)]
        if direction == "down":
            args.append("-R")
        # A fresh peak per cell (the ablation's children see one cell each anyway).
        peak = pid is not None and not plan.ablation and reset_peak_rss(pid)
        cpu0 = proc_cpu(pid) if pid else None
        via = plan.via and (subj.via_socks5 or subj.kind in ("socks5-client", "external"))
        srv0 = self.servers.dante_cpu() if via else None
        drops0 = tb.tun_drops() if subj.has_tun else None
        prof = self.perf_start(subj, direction, streams, rs if rec else None)
        host0 = host_cpu_s()
        try:
            r = tb.sh(args, ns=tb.ns_a, check=False, timeout=plan.bulk_t + plan.bulk_omit + 20)
        finally:
            # Also when iperf3 timed out: a system-wide recorder must not outlive its cell.
            host1 = host_cpu_s()
            self.perf_stop(prof)
        cpu1 = proc_cpu(pid) if pid else None
        srv1 = self.servers.dante_cpu() if via else None
        drops1 = tb.tun_drops() if subj.has_tun else None
        acct = self.perf_account(prof, pid if subj.has_tun else None)
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
        self.emit(rs, wl, direction, streams, "throughput_gbps", gbps)
        if gbps < STALL_GBPS:
            self.fail("iperf3 %s %s x%d: stalled (%.6f Gbit/s; recorded)" % (
                subj.label, direction, streams, gbps))
        retr = j.get("end", {}).get("sum_sent", {}).get("retransmits")
        if retr is not None:
            self.add(rs, wl, direction, streams, "retransmits", retr)
        if cpu0 and cpu1:
            self.add(rs, wl, direction, streams, "cpu_user_s", cpu1[0] - cpu0[0])
            self.add(rs, wl, direction, streams, "cpu_sys_s", cpu1[1] - cpu0[1])
        # CPU per byte: every byte iperf3 moved, warm-up included, against the CPU time of the
        # same span (the whole testbed's from /proc/stat, and the proxy's own).
        gb = sum(iv["sum"].get("bytes", 0) for iv in j["intervals"]) / 1e9
        secs = sum(iv["sum"].get("seconds", 0) for iv in j["intervals"])
        if gb > 0 and host0 is not None and host1 is not None:
            self.add(rs, wl, direction, streams, "testbed_cpu_s_per_gb", (host1 - host0) / gb)
            if secs > 0:
                self.add(rs, wl, direction, streams, "testbed_cpus_busy",
                         (host1 - host0) / secs)
        if gb > 0 and cpu0 and cpu1:
            self.add(rs, wl, direction, streams, "proxy_cpu_s_per_gb",
                     (cpu1[0] - cpu0[0] + cpu1[1] - cpu0[1]) / gb)
        if gb > 0 and acct is not None:
            # --perf: the TUN's two copies of every byte (the proxy's) and netfilter's work
            # (the redirect's REDIRECT), per GB moved: bench/perfcopy.py, the bound in
            # bench/report.py. No copies figure where the profile could not tell them.
            if subj.has_tun and pid and acct["copies_s"] is not None:
                self.add(rs, wl, direction, streams, "tun_copy_cpu_s_per_gb",
                         acct["copies_s"] / gb)
            self.add(rs, wl, direction, streams, "netfilter_cpu_s_per_gb",
                     acct["netfilter_s"] / gb)
        if peak:
            kb = proc_kb(pid, "VmHWM")
            self.add(rs, wl, direction, streams, "peak_rss_kb", kb)
            self.peaks[pid] = max(self.peaks.get(pid, 0), kb or 0)
        if drops0 is not None and drops1 is not None:
            self.add(rs, wl, direction, streams, "tun_drops", drops1 - drops0)
        if srv0 is not None and srv1 is not None:
            # The SOCKS5 server's share (every danted process) per second and per byte.
            self.add(rs, wl, direction, streams, "server_cpu_s", srv1 - srv0)
            if secs > 0:
                self.add(rs, wl, direction, streams, "server_cpus_busy", (srv1 - srv0) / secs)
            if gb > 0:
                self.add(rs, wl, direction, streams, "server_cpu_s_per_gb", (srv1 - srv0) / gb)
        if subj.is_stack:
            # tun.rps "auto": how often it switched so far (per cell in an ablation: a fresh
            # child per run) and how busy the loop's thread was in its last window.
            st = (tb.stats() or {}).get("tun", {})
            for key, metric in (("rps_switches", "rps_switches"),
                                ("loop_busy_pct", "loop_busy_pct")):
                if isinstance(st.get(key), (int, float)) and st.get("rps_auto"):
                    self.add(rs, wl, direction, streams, metric, st[key])
        return gbps

    def perf_start(self, subj, direction, streams, beside=None):
        """--perf DIR: a system-wide call-graph profile of this bulk run (all CPUs: the
        kernel work of a TUN proxy runs in iperf3's and softirq context as much as in the
        proxy's), DIR/<subject>-<dir>-<streams>-r<round>.data (a baseline's run beside a proxy:
        <baseline>-beside-<proxy>-...); read it with perf report.
        cpu-clock samples (their period is CPU time, whatever the host's PMU), recording
        from before iperf3 starts until perf_stop, right after it ends: the span the
        testbed's CPU per GB is measured over. (path, process), or None."""
        if not self.plan.perf:
            return None
        os.makedirs(self.plan.perf, exist_ok=True)
        path = os.path.join(self.plan.perf, "%s%s-%s-%d-r%d.data" % (
            subj.slug, "-beside-" + beside.slug if beside else "", direction, streams,
            self.results.cur_round))
        if os.path.exists(path):
            os.unlink(path)
        with open(path + ".log", "w") as lf:
            p = subprocess.Popen(["perf", "record", "-a", "-g", "-F", "499", "-e", "cpu-clock",
                                  "-o", path], stdout=lf, stderr=subprocess.STDOUT)
        self.tb.procs.append(p)  # the teardown stops it if the rig ends first
        t0 = time.monotonic()
        while not os.path.exists(path) and p.poll() is None and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        return path, p

    def perf_stop(self, prof):
        """End perf_start's recording (SIGINT: perf writes its file and exits)."""
        if prof is None:
            return
        p = prof[1]
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    @staticmethod
    def perf_account(prof, pid):
        """The account of perf_start's profile (bench/perfcopy.py: the TUN's copies in pid,
        netfilter's work), or None (no profile, perf failed, or it could not be read)."""
        if prof is None:
            return None
        path, p = prof
        if p.returncode not in (0, -signal.SIGINT):
            return None
        return perfcopy.profile(path, pid)

    # -- twinstack load
    def load(self, mode, args, timeout):
        r = self.tb.sh([self.binary.path, "load", mode] + args, ns=self.tb.ns_a, check=False,
                       timeout=timeout)
        j = last_json(r.stdout)
        if r.returncode != 0 or j is None:
            raise RuntimeError("load %s: exit %d: %s" % (mode, r.returncode,
                                                        (r.stderr or r.stdout).strip()[-200:]))
        return j

    def connrate(self, subject, rec=None):
        """rec: (subject, workload) the figures are recorded under (the back-to-back pass);
        default (subject, "connrate"). The same for latency and udp."""
        rs, wl = rec or (subject, "connrate")
        d = self.plan.load_s
        j = self.load("connrate", ["--target", TARGET4, "--ports",
                                   ",".join(map(str, ECHO_PORTS)), "--duration", str(d),
                                   "--concurrency", "16" if self.plan.quick else "32"], d + 20)
        self.emit(rs, wl, None, None, "conn_per_s", j.get("conn_per_s"))
        # A rate is sustained only while the connections succeed: every failed attempt (a
        # connect refused, reset or timed out, an echo short or wrong) is counted beside it.
        errs, tries = j.get("errors"), j.get("attempts") or 0
        causes = ", ".join("%s %d" % kv for kv in sorted((j.get("error_causes") or {}).items())
                           if kv[1])
        self.emit(rs, wl, None, None, "conn_errors", errs,
                  "of %d attempts%s" % (tries, ": " + causes if causes else ""))
        if errs and tries and errs > CONN_ERRORS_MAX * tries:
            self.fail("%s connrate: %d of %d attempts failed (%s): not a sustained rate" % (
                subject.label, errs, tries, causes))
        elif errs:
            self.results.notes.append("%s connrate: %d of %d attempts failed (%s)" % (
                subject.label, errs, tries, causes))

    def latency(self, subject, rec=None):
        rs, wl = rec or (subject, "latency_64B")
        d = self.plan.load_s
        j = self.load("latency", ["--target", "%s:%d" % (TARGET4, ECHO_PORTS[0]), "--duration",
                                  str(d), "--size", "64"], d + 20)
        for k in ("latency_p50_us", "latency_p99_us", "latency_p999_us"):
            self.emit(rs, wl, None, None, k, j.get(k))

    def udp(self, subject, size, rec=None):
        rs, wl = rec or (subject, "udp_echo_%dB" % size)
        d = self.plan.load_s
        via = ["--socks5", "%s:%d" % (B_VETH4, S5_PORT)] \
            if subject.kind == "socks5-client" else []
        u0 = ((self.tb.stats() or {}).get("udp") or {}) if subject.is_stack else {}
        host0 = host_cpu_s()
        j = self.load("udp", ["--target", "%s:%d" % (TARGET4, UDP_PORT), "--size", str(size),
                              "--duration", str(d)] + via, d + 20)
        host1 = host_cpu_s()
        self.emit(rs, wl, None, None, "pps", j.get("pps"))
        self.emit(rs, wl, None, None, "loss_pct", j.get("loss_pct"))
        # CPU per echo: the whole testbed's CPU time (/proc/stat) over the load's span, the
        # client's start and JSON included, per echo that came back.
        got = j.get("received")
        if got and host0 is not None and host1 is not None:
            self.add(rs, wl, None, None, "testbed_cpu_us_per_echo",
                     (host1 - host0) / got * 1e6)
            self.add(rs, wl, None, None, "testbed_cpus_busy", (host1 - host0) / d)
        if subject.is_stack:
            # Replies in trains (one TUN write for several): the share of the echoes that
            # went in one, and their mean length.
            u1 = (self.tb.stats() or {}).get("udp") or {}
            dt = u1.get("trains", 0) - u0.get("trains", 0)
            dd = u1.get("train_datagrams", 0) - u0.get("train_datagrams", 0)
            if got:
                self.emit(rs, wl, None, None, "in_trains_pct", 100.0 * dd / got)
            if dt > 0:
                self.emit(rs, wl, None, None, "train_len", dd / dt)
            # Datagrams out in trains (one UDP GSO send for several): the share of the
            # datagrams sent that went in one, and their mean length.
            ut = u1.get("up_trains", 0) - u0.get("up_trains", 0)
            ud = u1.get("up_train_datagrams", 0) - u0.get("up_train_datagrams", 0)
            sent = j.get("sent")
            if sent:
                self.emit(rs, wl, None, None, "up_in_trains_pct", 100.0 * ud / sent)
            if ut > 0:
                self.emit(rs, wl, None, None, "up_train_len", ud / ut)

    def udpflows(self, subject):
        j = self.load("udpflows", ["--target", "%s:%d" % (TARGET4, UDP_PORT), "--flows", "1000"],
                      60)
        self.emit(subject, "udp_flows", None, None, "udp_flows_answered",
                  j.get("answered", j.get("udp_flows_answered")))

    def hold(self, subject, pid, n=None):
        """Hold n connections (default plan.hold_conns) through the proxy, workload hold_<n>:
        once `load hold` says HELD, the proxy's userspace and kernel memory per connection
        and its RSS, then the hold is ended (SIGTERM: the echoes still owed come back first)
        and the count the proxy really carried is recorded. Fewer than n is a note naming
        the limit that stopped it; none at all is a failure."""
        n = n or self.plan.hold_conns
        wl = "hold_%d" % n
        # --duration bounds the open phase (256 connects in flight); the rig ends the hold
        # with SIGTERM once it has sampled, so this is a bound, not the time it takes.
        dur = self.plan.hold_s + n // 500
        tb = self.tb
        st0 = self.pipes_idle() if not self.plan.smoke else tb.stats()
        fds0 = proc_fds(pid)
        self.add(subject, wl, None, n, "rss_anon_before_kb", proc_kb(pid, "RssAnon"))
        logp = os.path.join(self.work, "load-hold.log")
        log0 = os.path.getsize(logp) if os.path.exists(logp) else 0
        p = tb.spawn(tb.ns_a, [self.binary.path, "load", "hold", "--target",
                               "%s:%d" % (TARGET4, ECHO_PORTS[1]), "--conns", str(n),
                               "--duration", str(dur)], "load-hold.log", stdout=subprocess.PIPE)
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        held, buf, deadline = None, b"", time.monotonic() + dur + 5
        st = kern = rss = anon = fds = None
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
                raise RuntimeError("load hold %d: no 'HELD n' line within %d s" % (n, dur + 5))
            time.sleep(0.5)
            rss, anon = proc_kb(pid, "VmRSS"), proc_kb(pid, "RssAnon")
            st = tb.stats()
            kern = tb.socket_bytes(pid)
            fds = proc_fds(pid)
        finally:
            sel.close()
            if p.poll() is None:
                p.terminate()
            try:
                rest, _ = p.communicate(timeout=20)
                buf += rest or b""
            except subprocess.TimeoutExpired:
                tb.stop(p)
            if p in tb.procs:
                tb.procs.remove(p)
        fin = last_json(buf.decode(errors="replace")) or {}
        self.hold_closed(subject, pid, wl, n, st0, fds0)
        # The count carried: connected (HELD), a session in the proxy when it was sampled
        # (/stats sessions.active, where it has one) and its echo back through the proxy
        # afterwards (the final JSON's "echoed").
        active = ((st or {}).get("sessions") or {}).get("active")
        carried = min(v for v in (held, active, fin.get("echoed")) if isinstance(v, int))
        per_n = active if isinstance(active, int) and 0 < active <= held else held
        extra = "held %d, %s in the proxy, %s echoed" % (held, "?" if active is None else active,
                                                          fin.get("echoed", "?"))
        self.emit(subject, wl, None, n, "conns_held", carried, extra)
        if carried == 0:
            raise RuntimeError("load hold %d: no connection held (%s)" % (
                n, self.hold_client_line(logp, log0) or extra))
        if carried < n:
            self.results.notes.append("%s %s: %d of %d connections held (%s); %s" % (
                subject.label, wl, carried, n, extra,
                self.hold_limit(pid, st0, st, fds, self.hold_client_line(logp, log0))))
        self.emit(subject, wl, None, n, "rss_kb", rss)
        self.emit(subject, wl, None, n, "rss_anon_kb", anon)
        if st:
            per = (st.get("buffers") or {}).get("per_session_bytes")
            if per is None and (st.get("buffers") or {}).get("in_use_bytes") is not None:
                per = st["buffers"]["in_use_bytes"] / max(1, per_n)
            self.emit(subject, wl, None, n, "user_bytes_per_conn", per)
            pipe = (st.get("splice") or {}).get("pipe_bytes") or 0
        else:
            pipe = 0
            self.results.notes.append("hold: /stats unreachable for %s; user bytes per "
                                      "connection missing" % subject.label)
        if kern is not None:
            kbytes, sockets = kern
            self.emit(subject, wl, None, n, "kernel_kb_per_conn",
                      (kbytes + pipe) / 1024.0 / max(1, per_n),
                      "%d sockets of the proxy, pipes %d B" % (sockets, pipe))

    def pipes_idle(self, bound=3.0):
        """Wait (bounded) until the proxy's splice pipe pool is empty (its idle pipes close
        about a second after the last use), so the pipes of the workload before are not
        counted as the held connections' memory. Returns its /stats then, or None."""
        t0 = time.monotonic()
        while True:
            st = self.tb.stats()
            pipes = ((st or {}).get("splice") or {}).get("pipes")
            if not pipes or time.monotonic() - t0 > bound:
                return st
            time.sleep(0.2)

    def hold_closed(self, subject, pid, wl, n, st0, fds0):
        """Wait (bounded) until the proxy has closed the hold's sessions (/stats sessions.active
        back to its count before the hold; without /stats, its descriptors), so the next
        workload does not meet the closing; close_s is how long that took after the client
        ended."""
        active0 = ((st0 or {}).get("sessions") or {}).get("active")

        def left():
            if isinstance(active0, int):
                a = ((self.tb.stats() or {}).get("sessions") or {}).get("active")
                return None if a is None else a - active0
            fds = proc_fds(pid)
            return None if fds is None or fds0 is None else fds - fds0
        t0 = time.monotonic()
        bound = 5 + n / 500.0
        while time.monotonic() - t0 < bound:
            k = left()
            if k is None or k <= 0:
                if k is not None:
                    self.add(subject, wl, None, n, "close_s", time.monotonic() - t0)
                return
            time.sleep(0.2)
        self.results.notes.append("%s %s: %s of the hold still open in the proxy %.0f s after "
                                  "it ended" % (subject.label, wl, left(), bound))

    @staticmethod
    def hold_client_line(path, offset):
        """The load client's own summary of this hold ("N held, M failed, first: ERROR",
        and its fd limit when it was short of it), from its log past offset."""
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "; ".join(x.strip() for x in text.splitlines() if x.startswith("load hold:"))

    @staticmethod
    def hold_limit(pid, st0, st, fds, client):
        """What stopped a hold short: the proxy's refusal counters that moved over it (by
        the limit they count against), its fd limit and open fds, and the load client's own
        summary."""
        def get(doc, path):
            for k in path.split("."):
                doc = doc.get(k) if isinstance(doc, dict) else None
            return doc
        limits = (("the TCP session budget", "budget.tcp_limit",
                   ("budget.tcp_refused", "redirect.admission_refused")),
                  ("the descriptor budget", "budget.fds_limit",
                   ("drops.fd_exhausted", "budget.fd_refused", "redirect.fd_refused")))
        why = []
        for what, lim_key, keys in limits:
            moved = []
            for key in keys:
                a, b = get(st0, key), get(st, key)
                if isinstance(a, int) and isinstance(b, int) and b > a:
                    moved.append("%s +%d" % (key, b - a))
            if moved:
                lim = get(st, lim_key)
                why.append("%s (%s%s)" % (what, "" if lim is None else "%s %s; " % (lim_key, lim),
                                          ", ".join(moved)))
        if not why:
            why.append("no refusal counter of the proxy moved")
        lim = proc_nofile(pid)
        why.append("the proxy's RLIMIT_NOFILE %s, %s fds open%s" % (
            "%d (hard %d)" % lim if lim else "?", "?" if fds is None else fds,
            "" if get(st, "budget.fds_in_use") is None else
            ", budget.fds_in_use %s" % get(st, "budget.fds_in_use")))
        if client:
            why.append("the client: " + client)
        return "limit: " + "; ".join(why)

    # -- --sniff and --via socks5
    def sniff_counters(self, subj):
        """The look counters after the workloads: proof that "idle" looked at nothing and
        "look" at every connection."""
        doc = self.tb.stats()
        if doc is None:
            self.fail("%s: /stats unreachable after the workloads" % subj.label)
            return
        sn = doc.get("sniff") or {}
        self.emit(subj, "sniff", None, None, "sniff_started", sn.get("started"))
        self.emit(subj, "sniff", None, None, "sniff_timeouts", sn.get("timeouts"))

    def socks5_udp(self, subj):
        """UDP echo (64 B) of one --via socks5 subject. A stack whose proxy dropped the
        datagrams says which drop counters of its /stats moved."""
        plain = subj.kind == "socks5-client"
        if not self.binary.has_load("udp") or (plain and not self.binary.load_socks5):
            self.results.note_na(subj.label, "udp", "`twinstack load udp%s` not available" % (
                " --socks5" if plain else ""))
            return
        try:
            self.udp(subj, 64)
            if subj.via_socks5:
                # the proxy's own count: the echoes must have gone through an association
                n = ((self.tb.stats() or {}).get("udp") or {}).get("assocs_total")
                if n == 0:
                    self.fail("%s udp: no UDP association was made (/stats udp.assocs_total 0)"
                              % subj.label)
        except RuntimeError as e:
            drops = ((self.tb.stats() or {}).get("udp") or {}).get("drops") or {} \
                if subj.is_stack else {}
            moved = ", ".join("%s %s" % (k, v) for k, v in sorted(drops.items()) if v)
            self.fail("%s udp: %s%s" % (subj.label, e, "; the proxy's udp drops: " + moved
                                        if moved else ""))

    # -- the micro-benchmarks (full runs)
    def micro_rows(self):
        micro = self.binary.micro
        if not micro or not shutil.which("valgrind"):
            self.results.notes.append("instructions_per_op: skipped (%s)" % (
                "no twinstack-micro next to the binary" if not micro else
                "valgrind not installed"))
            return
        jpath = os.path.join(self.work, "callgrind.json")
        progress("micro: callgrind instruction counts (bench/callgrind.sh)")
        try:
            r = subprocess.run(["bash", os.path.join(HERE, "callgrind.sh"), "--json", jpath,
                                micro], capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            self.fail("callgrind.sh timed out")
            return
        if r.returncode not in (0, 1) or not os.path.exists(jpath):
            self.fail("callgrind.sh: exit %d: %s" % (r.returncode, r.stderr.strip()[-200:]))
            return
        with open(jpath) as f:
            j = json.load(f)
        subj = report.Subject("micro", "n/a", label="micro")
        for case, v in sorted(j.get("callgrind", {}).items()):
            self.emit(subj, case, None, None, "instructions_per_op", v["instructions"])
