"""linkrun.py — `twinstack bench --link`: the two stacks and the bare path under link
conditions (delay and loss), where TCP's recovery decides the figures.

Where the link sits decides whose TCP meets it. A TUN proxy terminates the application's TCP
in its stack and opens a kernel socket toward the server, so a lossy link on the server's side
is met by the kernel's TCP for both stacks. A link on the application's side is met by the
stack's own TCP: the kernel's (system stack) or lwIP's. That is the case measured here: the
proxy runs on a gateway (B) for a client (A) behind the link, as on a router or a host that
proxies for a LAN or a VM, the delay and loss between them (bench/linkbed.sh: a delay line of
ours in the middle namespace M, nftables numgen loss per segment on the receiving veths).

    ns A: client (iperf3 -c)  ---- ns M: delay line, loss ----  ns B: gateway + server
    10.210.1.1                                                  10.210.2.1, lo 10.210.9.2
                                                                veth subject: the target is
                                                                  B's own (routed, no proxy)
                                                                stacks: packets from A to
                                                                  10.210.9.0/24 -> the TUN of
                                                                  twinstack run; its outbound
                                                                  reaches 10.210.9.2 locally

Per link condition (RTT, loss): the line is calibrated first (`linkbed.sh calibrate`: ping
RTT within 10 % of the set value, measured loss within +-20 % of the set rate); then a testbed
is held up (`linkbed.sh up`) and each subject, interleaved per round, runs TCP bulk one stream
each way (iperf3 -t; reno, or --cc NAME, or --cc host: the algorithm a new namespace inherits,
named once the testbed has read it back) and the completion time of a fixed-size download
(iperf3 -n -R, the median of three; --quick: one, 2 s bulk runs, one condition, no ceiling; --smoke, the
test suite's sanity run: as --quick with 1 s bulk runs and no warm-up second). Retransmissions:
the kernel's TcpRetransSegs in A and B over each run
(the sender's kernel; lwIP sends the download over the link for the lwip stack and keeps no
such count, so that cell says n/a). The delay line's own ceiling (calibrate --ceiling, loss
off, at 0 ms) is measured once; a cell at 80 % of it or more is marked capped.

Python 3 standard library only.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time

from report import clear_progress, log, out, progress

HERE = os.path.dirname(os.path.abspath(__file__))
LINKBED = os.path.join(HERE, "linkbed.sh")
CONDITIONS = [(10, 0.0), (10, 0.1), (10, 1.0), (50, 0.0), (50, 0.1), (50, 1.0)]
QUICK_CONDITIONS = [(10, 1.0)]
TARGET = "10.210.9.2"
TUN_CIDR = "198.18.0.1/15"
STATS_PORT = 9090
IPERF_PORT = 5201
TRANSFER_BYTES = 4 << 20
CAPPED = 0.8
SUBJECTS = ("veth", "system", "lwip")


class LinkRun:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.abspath(a.bin)
        self.delayline = os.path.join(os.path.dirname(self.bin), "twinstack-delayline")
        self.out = os.path.abspath(a.out)
        self.work = os.path.join(self.out, "work")
        self.conds = QUICK_CONDITIONS if a.quick else CONDITIONS
        self.reps = a.reps or (1 if a.quick else 2)
        self.smoke = getattr(a, "smoke", False)
        self.bulk_t = a.bulk_seconds or (1 if self.smoke else 2 if a.quick else 10)
        # --smoke (the test suite's sanity run): no warm-up second either
        self.omit = 0 if self.smoke else 1
        self.transfers = 1 if a.quick else 3
        # --cc as asked ("host": what a new namespace inherits); the testbed pins it, reads it
        # back and reports the name (host resolved), which self.cc then holds.
        self.cc_asked = a.cc or "reno"
        self.cc = None if self.cc_asked == "host" else self.cc_asked
        self.stacks = [s for s in a.stacks.split(",") if s]
        self.subjects = ["veth"] + self.stacks
        self.rows = []          # {cond, subject, round, metric, value}
        self.calib = []
        self.ceiling = None
        self.failures = []
        self.notes = []
        self.bed = None
        self.procs = []

    # -- helpers
    def sh(self, args, ns=None, timeout=60, check=True):
        if ns:
            args = ["ip", "netns", "exec", ns] + list(args)
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise RuntimeError("%s: exit %d: %s" % (" ".join(args), r.returncode,
                                                   (r.stderr or r.stdout).strip()[-300:]))
        return r

    def spawn(self, ns, args, name):
        logf = open(os.path.join(self.work, name), "ab")
        p = subprocess.Popen(["ip", "netns", "exec", ns] + list(args), stdin=subprocess.DEVNULL,
                             stdout=logf, stderr=logf)
        logf.close()
        self.procs.append(p)
        return p

    def stop(self, p, grace=3):
        if p is None:
            return
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=3)
        if p in self.procs:
            self.procs.remove(p)

    def add(self, cond, subj, metric, value, rnd):
        if value is not None:
            self.rows.append({"rtt_ms": cond[0], "loss_pct": cond[1], "subject": subj,
                              "round": rnd, "metric": metric, "value": float(value)})

    def linkbed(self, mode, cond, extra=()):
        return [LINKBED, mode, "--rtt-ms", str(cond[0]), "--loss", str(cond[1]), "--cc",
                self.cc_asked, "--bin", self.delayline] + list(extra)

    def take_cc(self, rec, what):
        """The congestion control a testbed record (rec, from linkbed.sh what) says it pinned:
        with --cc host the first one names it; every one after must agree."""
        got = rec.get("tcp_congestion")
        if not got:
            raise RuntimeError("linkbed.sh %s: no tcp_congestion in its record" % what)
        if self.cc is None:
            self.cc = got
        elif got != self.cc:
            raise RuntimeError("linkbed.sh %s: its namespaces run %s, not %s (--cc %s)" % (
                what, got, self.cc, self.cc_asked))

    def cc_text(self):
        if self.cc is None:
            return "the host's congestion control (--cc host)"
        return self.cc + (" (--cc host)" if self.cc_asked == "host" else "")

    # -- the testbed of one condition
    def calibrate(self, cond, ceiling=False):
        # 200,000 datagrams count a 0.1 % loss to about +-7 % (1 sigma); 30,000 do for 1 %.
        n = 200000 if 0 < cond[1] < 0.5 else 30000
        extra = ["--udp-count", str(n)] + (["--ceiling"] if ceiling else [])
        # A session of its own, stopped with SIGTERM (its trap removes its namespaces and
        # delay line) whatever ends the wait: subprocess.run would SIGKILL it on a signal to
        # the rig, and a killed linkbed.sh leaves its testbed behind.
        p = subprocess.Popen(self.linkbed("calibrate", cond, extra), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        try:
            stdout, stderr = p.communicate(timeout=600)
        except BaseException as e:
            self.bed_down(p, drain=True)
            if isinstance(e, subprocess.TimeoutExpired):
                raise RuntimeError("linkbed.sh calibrate %s: no record within 600 s" % (cond,))
            raise
        try:
            rec = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RuntimeError("linkbed.sh calibrate %s: no record (exit %d): %s" % (
                cond, p.returncode, stderr.strip()[-300:]))
        self.take_cc(rec, "calibrate %s" % (cond,))
        return rec

    def bed_up(self, cond):
        logf = open(os.path.join(self.work, "linkbed-up.log"), "ab")
        try:
            p = subprocess.Popen(self.linkbed("up", cond), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=logf, start_new_session=True)
        finally:
            logf.close()
        # The testbed lives in a session of its own (so a signal to the rig's group does not
        # reach it half way): from here on anything that ends this function early, a signal
        # (SystemExit) included, takes it down before it goes on.
        try:
            return self.bed_ready(p, cond)
        except BaseException:
            self.bed_down(p)
            raise

    def bed_ready(self, p, cond):
        """The testbed's record (its first line on stdout), then the target and iperf3 -s in
        B."""
        line, deadline = b"", time.monotonic() + 60
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        try:
            while b"\n" not in line and time.monotonic() < deadline and p.poll() is None:
                if sel.select(timeout=0.5):
                    chunk = os.read(p.stdout.fileno(), 4096)
                    if not chunk:
                        break
                    line += chunk
        finally:
            sel.close()
        try:
            bed = json.loads(line.decode().splitlines()[0])
        except (ValueError, IndexError):
            raise RuntimeError("linkbed.sh up %s: no testbed (see work/linkbed-up.log)" % (
                cond,))
        bed["proc"] = p
        self.take_cc(bed, "up %s" % (cond,))
        b = bed["ns_b"]
        self.sh(["ip", "addr", "add", TARGET + "/32", "dev", "lo"], ns=b)
        self.sh(["sysctl", "-qw", "net.ipv4.ip_forward=1"], ns=b)
        bed["iperf"] = self.spawn(b, ["iperf3", "-s", "-p", str(IPERF_PORT)], "iperf3-b.log")
        for _ in range(100):
            if self.sh(["ss", "-ltnH", "sport = :%d" % IPERF_PORT], ns=b,
                       check=False).stdout.strip():
                break
            time.sleep(0.1)
        else:
            self.stop(bed["iperf"])
            raise RuntimeError("iperf3 -s did not listen in B")
        return bed

    def bed_down(self, p, drain=False):
        """SIGTERM to a linkbed.sh session (its trap takes its testbed down), SIGKILL after
        20 s. drain: its output pipes are read meanwhile, so a script writing to a full pipe
        still gets to its cleanup."""
        if p is None or p.poll() is not None:
            return
        os.killpg(p.pid, signal.SIGTERM)
        try:
            if drain:
                p.communicate(timeout=20)
            else:
                p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)

    # -- subjects: the gateway B forwards to its own target (veth) or proxies it (a stack)
    def start_subject(self, bed, subj):
        if subj == "veth":
            return None
        b, tun = bed["ns_b"], "tslp" + bed["ns_b"][-6:]
        cfg = {"stack": subj,
               "tun": {"name": tun, "address": TUN_CIDR, "mtu": 1500, "offload": "on",
                       "txqueuelen": 10000},
               "outbounds": [{"tag": "direct", "type": "direct"}],
               "route": {"final": "direct"},
               "stats": {"listen": "127.0.0.1:%d" % STATS_PORT},
               "log": {"level": "warn"}}
        path = os.path.join(self.work, "%s.json" % subj)
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)
        rfd, wfd = os.pipe()
        logf = open(os.path.join(self.work, "%s.log" % subj), "ab")
        p = subprocess.Popen(["ip", "netns", "exec", b, self.bin, "run", "--config", path,
                              "--ready-fd", str(wfd)], stdin=subprocess.DEVNULL, stdout=logf,
                             stderr=logf, pass_fds=(wfd,))
        logf.close()
        os.close(wfd)
        import select
        ready, _, _ = select.select([rfd], [], [], 10)
        got = os.read(rfd, 16) if ready else b""
        os.close(rfd)
        self.procs.append(p)
        if not got:
            self.stop(p)
            raise RuntimeError("%s: no ready byte within 10 s" % subj)
        # A's packets for the target prefix into the TUN; B's own traffic stays local.
        self.sh(["ip", "route", "replace", bed["net_t"], "dev", tun, "table", "200"], ns=b)
        self.sh(["ip", "rule", "add", "iif", bed["veth_b"], "to", bed["net_t"], "lookup", "200",
                 "pref", "100"], ns=b)
        return p

    def stop_subject(self, bed, p):
        if p is None:
            return
        self.sh(["ip", "rule", "del", "pref", "100"], ns=bed["ns_b"], check=False)
        self.stop(p)

    # -- workloads
    def retrans(self, bed):
        tot = {}
        for side in ("ns_a", "ns_b"):
            r = self.sh(["nstat", "-az", "TcpRetransSegs"], ns=bed[side], check=False)
            v = None
            for line in r.stdout.splitlines():
                f = line.split()
                if f and f[0] == "TcpRetransSegs":
                    v = int(f[1])
            tot[side] = v
        return tot

    def iperf(self, bed, args, timeout):
        r = self.sh(["iperf3", "-c", TARGET, "-p", str(IPERF_PORT), "-J", "-C", self.cc,
                     "--connect-timeout", "5000"] + args, ns=bed["ns_a"], timeout=timeout,
                    check=False)
        try:
            j = json.loads(r.stdout)
        except ValueError:
            j = None
        if not j or j.get("error"):
            raise RuntimeError("iperf3 %s: %s" % (" ".join(args), (j or {}).get("error") or
                                                  r.stderr.strip()[-200:] or "no JSON"))
        return j

    def bulk(self, bed, cond, subj, direction, rnd):
        r0 = self.retrans(bed)
        j = self.iperf(bed, ["-t", str(self.bulk_t), "-O", str(self.omit)] +
                       (["-R"] if direction == "down" else []), self.bulk_t + 60)
        r1 = self.retrans(bed)
        bps = [iv["sum"]["bits_per_second"] for iv in j["intervals"]
               if not iv["sum"].get("omitted")]
        gbps = statistics.mean(bps) / 1e9 if bps else 0.0
        self.add(cond, subj, "bulk_%s_gbps" % direction, gbps, rnd)
        # the kernel that sends over the link: A's for an upload; B's for a download, except
        # through lwIP (its own TCP sends it).
        side = "ns_a" if direction == "up" else "ns_b"
        if not (direction == "down" and subj == "lwip") and r0[side] is not None and \
                r1[side] is not None:
            self.add(cond, subj, "bulk_%s_retrans" % direction, r1[side] - r0[side], rnd)
        return gbps

    def transfer(self, bed, cond, subj, rnd):
        ms = []
        for _ in range(self.transfers):
            j = self.iperf(bed, ["-n", str(TRANSFER_BYTES), "-R"], 120)
            ms.append(j["end"]["sum_received"]["seconds"] * 1000)
        self.add(cond, subj, "transfer_ms", statistics.median(ms), rnd)

    # -- the run
    def run(self):
        os.makedirs(self.work, exist_ok=True)
        if not os.access(self.delayline, os.X_OK):
            raise RuntimeError("no %s (build the project first)" % self.delayline)
        t0 = time.monotonic()
        log("twinstack bench --link%s: conditions %s, subjects %s, %d round(s), iperf3 -t %d, "
            "%s" % (" --smoke (sanity only)" if self.smoke else "",
                    ", ".join("%d ms/%g %%" % c for c in self.conds), ", ".join(self.subjects),
                    self.reps, self.bulk_t, self.cc_text()))
        for ci, cond in enumerate(self.conds):
            progress("link %d ms, %g %% loss: calibrating" % cond)
            try:
                cal = self.calibrate(cond, ceiling=(ci == 0 and not self.a.quick))
            except RuntimeError as e:
                self.failures.append(str(e))
                continue
            self.calib.append(cal)
            if ci == 0:
                for c in cal.get("ceiling") or []:
                    if c.get("path") == "delay line 0 ms one way" and c.get("cc") == self.cc:
                        self.ceiling = c.get("gbps")
            if not cal.get("ok"):
                self.notes.append("%d ms, %g %%: calibration out of bounds (ping %s ms, loss "
                                  "%s %%): its cells are marked" % (
                                      cond[0], cond[1], (cal.get("ping") or {}).get("median_ms"),
                                      (cal.get("udp") or {}).get("loss_pct")))
            bed = None
            try:
                bed = self.bed_up(cond)
                for rnd in range(1, self.reps + 1):
                    k = (rnd - 1) % len(self.subjects)
                    for subj in self.subjects[k:] + self.subjects[:k]:
                        progress("link %d ms, %g %% loss, round %d: %s" % (cond + (rnd, subj)))
                        p = None
                        try:
                            p = self.start_subject(bed, subj)
                            time.sleep(0.5)
                            for d in ("up", "down"):
                                self.bulk(bed, cond, subj, d, rnd)
                            self.transfer(bed, cond, subj, rnd)
                            if p is not None and p.poll() is not None:
                                raise RuntimeError("exited (%s)" % p.poll())
                        except (RuntimeError, subprocess.TimeoutExpired) as e:
                            self.failures.append("%d ms %g %% %s: %s" % (cond + (subj, e)))
                        finally:
                            self.stop_subject(bed, p)
            except RuntimeError as e:
                self.failures.append("%d ms %g %%: %s" % (cond + (e,)))
            finally:
                if bed is not None:
                    self.stop(bed.get("iperf"))
                    self.bed_down(bed["proc"])
        clear_progress()
        self.write(time.monotonic() - t0)
        return 1 if self.failures else 0

    # -- the report
    def med(self, cond, subj, metric):
        v = [r["value"] for r in self.rows if (r["rtt_ms"], r["loss_pct"]) == cond and
             r["subject"] == subj and r["metric"] == metric]
        return (statistics.median(v), min(v), max(v), len(v)) if v else None

    def write(self, secs):
        def f(st, fmt="%.3f"):
            if st is None:
                return "n/a"
            if st[3] == 1 or st[1] == st[2]:
                return fmt % st[0]
            return (fmt + " [" + fmt + " – " + fmt + "]") % st[:3]
        L = ["# twinstack bench --link report" + (" (--smoke: the test suite's sanity run, "
                                                   "figures not for comparison)"
                                                   if self.smoke else ""), ""]
        L.append("%d condition(s), %s, %d round(s) each, iperf3 -t %d with %s, %.0f s. The link "
                 "is between the client (A) and the gateway (B) that runs the proxy: the "
                 "stack's own TCP meets the delay and the loss (bench/linkrun.py). Figures: "
                 "median [min – max] over the rounds." % (
                     len(self.conds), ", ".join(self.subjects), self.reps, self.bulk_t,
                     self.cc_text(), secs))
        L.append("")
        L.append("The delay line's own ceiling (loss off, 0 ms, %s): %s Gbit/s; a cell at %d %% "
                 "of it or more is marked *capped*." % (
                     self.cc_text(), "%.2f" % self.ceiling if self.ceiling else "not measured",
                     CAPPED * 100) if not self.a.quick else "The delay line's own ceiling: "
                 "not measured (--quick).")
        L.append("")
        L.append("## Calibration")
        L.append("")
        L.append("| RTT set | loss set | ping RTT median | measured loss | within bounds |")
        L.append("| --- | --- | --- | --- | --- |")
        for c in self.calib:
            L.append("| %s ms | %s %% | %s ms | %s | %s |" % (
                c.get("rtt_ms_set"), c.get("loss_pct_set"),
                (c.get("ping") or {}).get("median_ms"),
                "%s %% of %s datagrams" % ((c.get("udp") or {}).get("loss_pct"),
                                          (c.get("udp") or {}).get("sent"))
                if c.get("udp") else "-", "yes" if c.get("ok") else "NO"))
        L.append("")
        metrics = [("bulk_up_gbps", "bulk up Gbit/s", "%.3f"),
                   ("bulk_down_gbps", "bulk down Gbit/s", "%.3f"),
                   ("transfer_ms", "%d MiB download ms" % (TRANSFER_BYTES >> 20), "%.0f"),
                   ("bulk_up_retrans", "retransmits up", "%.0f"),
                   ("bulk_down_retrans", "retransmits down", "%.0f")]
        L.append("## Results")
        L.append("")
        L.append("| RTT | loss | subject | " + " | ".join(m[1] for m in metrics) + " |")
        L.append("|" + " --- |" * (3 + len(metrics)))
        for cond in self.conds:
            for subj in self.subjects:
                cells = []
                for m, _, fmt in metrics:
                    st = self.med(cond, subj, m)
                    c = f(st, fmt)
                    if m.endswith("gbps") and st and self.ceiling and \
                            st[0] >= CAPPED * self.ceiling:
                        c += " *capped*"
                    cells.append(c)
                L.append("| %d ms | %g %% | %s | %s |" % (cond[0], cond[1], subj,
                                                          " | ".join(cells)))
        L.append("")
        L.append("Retransmits: TcpRetransSegs of the sending kernel over the run (A's for "
                 "uploads, B's for downloads); n/a where lwIP sends over the link (lwip "
                 "downloads: lwIP keeps no such count).")
        if self.failures:
            L += ["", "## Failures", ""] + ["- " + x for x in self.failures]
        if self.notes:
            L += ["", "## Notes", ""] + ["- " + x for x in self.notes]
        L.append("")
        with open(os.path.join(self.out, "link.md"), "w") as fo:
            fo.write("\n".join(L))
        with open(os.path.join(self.out, "link.json"), "w") as fo:
            json.dump({"conditions": self.conds, "subjects": self.subjects, "reps": self.reps,
                       "bulk_seconds": self.bulk_t, "smoke": self.smoke, "cc": self.cc,
                       "cc_asked": self.cc_asked,
                       "ceiling_gbps": self.ceiling,
                       "calibration": self.calib, "rows": self.rows,
                       "failures": self.failures, "notes": self.notes}, fo, indent=1)
        out("\n".join(L))

    def teardown(self):
        for p in list(self.procs):
            try:
                self.stop(p)
            except Exception:
                pass


def main(a):
    run = LinkRun(a)

    def on_signal(signum, frame):
        # unwinds through run()'s finally clauses: the testbed of the condition goes down too
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        return run.run()
    finally:
        run.teardown()


if __name__ == "__main__":
    sys.exit("run through bench/rig.py --link")
