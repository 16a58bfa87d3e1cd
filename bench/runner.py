"""runner.py — one run of the comparison rig: the testbed built (bench/rigtb.py), the servers
started (bench/servers.py), then every subject of the plan (bench/plan.py) through the
workloads of the run's mode, interleaved per repetition round: a full or --quick run, --sniff
and --via socks5 here, --ablation in bench/ablation.py; subjects are started and stopped per
kind by bench/launch.py. At the end the report (bench/results.py). The testbed is torn down
on exit, on SIGINT/SIGTERM/SIGHUP and on errors.

Python 3 standard library only.
"""

import atexit
import datetime
import os
import shutil
import signal
import sys
import time

import ablation
from launch import SETTLE_S, Launcher
from report import clear_progress, log, out, progress
from results import Results
from rigtb import EXIT_FAIL, EXIT_OK, CannotRun, Testbed, ctxt_delta, proc_ctxt, proc_kb
from servers import Binary, Servers
from workloads import Workloads


class Rig:
    def __init__(self, plan):
        self.plan = plan
        self.results = Results()
        self.tb = None          # the testbed, once run() builds it
        self.step = 0
        self.total_steps = 1
        self.t0 = time.monotonic()

    def tick(self, what):
        """The progress line: round, step, elapsed, an estimate of what is left, and what."""
        self.step += 1
        el = time.monotonic() - self.t0
        left = ""
        if self.step > 1:
            rem = el / (self.step - 1) * max(0, self.total_steps - self.step + 1)
            left = ", ~%dm%02ds left" % (rem // 60, rem % 60)
        progress("[round %d/%d, step %d/%d, %dm%02ds elapsed%s] %s" % (
            self.results.cur_round, self.plan.reps, self.step, self.total_steps, el // 60,
            el % 60, left, what))

    # -- main
    def run(self):
        plan, res = self.plan, self.results
        self.binary = binary = Binary(plan.bin, plan.ablation)
        if not binary.has_run:
            raise CannotRun("%s has no `run` subcommand" % plan.bin)
        os.makedirs(plan.out, exist_ok=True)
        work = os.path.join(plan.out, "work")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        tok = os.urandom(3).hex()
        self.tb = tb = Testbed(tok, work, plan.cc, plan.verbose)
        atexit.register(tb.teardown)

        def on_signal(signum, frame):
            clear_progress()
            sys.stderr.write("\ninterrupted (signal %d): tearing the testbed down\n" % signum)
            tb.teardown()
            os._exit(128 + signum)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, on_signal)

        self.total_steps = plan.count_steps()
        started = datetime.datetime.now(datetime.timezone.utc)
        log(plan.plan_text())
        if not binary.has_reflect:
            log("note: `twinstack reflect` missing: reflector baseline and ceiling are n/a")
        missing = [m for m in ("serve", "connrate", "hold", "latency", "udp", "udpflows")
                   if m not in binary.load_modes]
        if missing and not plan.ablation:
            log("note: `twinstack load` modes missing (%s): those workloads are n/a" %
                ",".join(missing))
        progress("building the testbed (namespaces %s, %s)" % (tb.ns_a, tb.ns_b))
        tb.build()
        self.servers = Servers(tb, binary, work, plan.via)
        self.servers.start()
        self.launcher = Launcher(tb, binary, work, res)
        self.wl = Workloads(plan, tb, binary, self.servers, res, work)
        out("%-20s %-16s %-5s %4s  %-20s %10s %s" % ("subject", "workload", "dir", "n",
                                                       "metric", "value", "unit"))
        if plan.ablation:
            ablation.run(self)
        elif hasattr(self, "schedule"):
            self.schedule()     # a Rig with a schedule of its own (bench/ab.py)
        elif plan.mode == "besidecheck":
            for rnd in range(plan.reps):
                res.cur_round = rnd + 1
                self.beside_check_round(rnd)
        else:
            run = {"socks5": self.run_socks5_subject,
                   "sniff": self.run_sniff_subject}.get(plan.mode, self.run_subject)
            for rnd in range(plan.reps):
                res.cur_round = rnd + 1
                # rotate the order each round so no subject always runs first or last
                k = rnd % len(plan.subjects)
                for subj in plan.subjects[k:] + plan.subjects[:k]:
                    run(subj)
                self.paired_pass(rnd)
        tb.teardown()
        if plan.mode == "full" and not plan.no_micro:
            self.wl.micro_rows()
        clear_progress()
        duration = time.monotonic() - self.t0
        res.finish(plan, started.strftime("%Y-%m-%dT%H:%M:%SZ"), duration, tb.host_cc)
        log("done in %dm%02ds: %s" % (duration // 60, duration % 60, plan.out))
        return EXIT_FAIL if res.failures else EXIT_OK

    # -- shared steps
    def start(self, subj):
        """Start subj (a progress step for a subject with a child); its startup time is
        recorded for a stack."""
        if subj.has_child:
            self.tick("%s: start" % subj.label)
        running = self.launcher.start(subj)
        if subj.is_stack or subj.kind == "external":
            self.results.emit(subj, "startup", None, None, "startup_ms", running.startup_ms)
        return running

    def bulk_cells(self, running, cells=None):
        """subj through every TCP bulk cell (or those of cells) once; a cell's failure is
        recorded and the next runs, a child that exited ends the subject's round. Where the
        plan has a baseline beside subj (plan.beside), it is measured right before or after
        each of subj's cells (Beside)."""
        subj = running.subj
        base = self.plan.beside(subj)
        beside = None
        try:
            if base is not None and not self.launcher.missing(base):
                try:
                    beside = Beside(self, base, running)
                except RuntimeError as e:
                    self.results.fail("%s beside %s: %s" % (base.label, subj.label, e))
            for direction, streams in cells or self.plan.bulk_cells:
                runs = [lambda: self.bulk_cell(running, direction, streams)]
                if beside is not None:
                    runs.append(lambda: beside.cell(direction, streams))
                    if self.results.cur_round % 2 == 0:
                        runs.reverse()
                for run in runs:
                    run()
                    if running.exited() is not None:
                        raise RuntimeError("%s exited (%s) during the bulk workloads" % (
                            subj.label, running.exited()))
        finally:
            if beside is not None:
                beside.stop()

    def bulk_cell(self, running, direction, streams):
        """One TCP bulk cell of running's subject; a failure is recorded."""
        subj = running.subj
        self.tick("%s: tcp bulk %s, %d stream%s" % (subj.label, direction, streams,
                                                    "s" if streams > 1 else ""))
        try:
            self.wl.bulk(subj, running.pid, direction, streams)
        except RuntimeError as e:
            self.results.fail(str(e))

    def load_modes(self, subj, wl):
        """The `twinstack load` workloads wl, [(mode, fn)], each a progress step; n/a where
        the binary lacks the mode, a failure recorded and the next one run."""
        for mode, fn in wl:
            self.tick("%s: %s" % (subj.label, mode))
            if not self.binary.has_load(mode):
                self.results.note_na(subj.label, mode,
                                     "`twinstack load %s` not available" % mode)
                continue
            try:
                fn()
            except RuntimeError as e:
                self.results.fail("%s %s: %s" % (subj.label, mode, e))

    # -- one subject through every workload, once (full and --quick runs)
    def run_subject(self, subj):
        res = self.results
        running = None
        why = self.launcher.missing(subj)
        if why:
            res.note_na(subj.label, "all", why)
            return
        try:
            running = self.start(subj)
            pid = running.pid
            if subj.is_stack:
                time.sleep(1.0)
                res.emit(subj, "idle", None, None, "start_rss_anon_kb", proc_kb(pid, "RssAnon"))
                idle_s = self.plan.idle_s
                self.tick("%s: idle wakeups over %d s" % (subj.label, idle_s))
                c0 = proc_ctxt(pid)
                time.sleep(idle_s)
                c1 = proc_ctxt(pid)
                if c0 is not None and c1 is not None:
                    res.emit(subj, "idle", None, None, "idle_wakeups_20s", ctxt_delta(c0, c1),
                             "over %d s" % idle_s if idle_s != 20 else "")
            self.bulk_cells(running)
            if not subj.is_mirror:
                self.load_workloads(subj, pid)
            if pid:
                res.emit(subj, "run", None, None, "peak_rss_kb", self.wl.run_peak_kb(pid))
                if not subj.is_mirror:
                    self.tick("%s: RSS after %d s idle" % (subj.label, self.plan.idle_rss_s))
                    time.sleep(self.plan.idle_rss_s)
                    res.emit(subj, "run", None, None, "idle_rss_kb", proc_kb(pid, "VmRSS"))
                    res.emit(subj, "run", None, None, "idle_rss_anon_kb",
                             proc_kb(pid, "RssAnon"))
        except RuntimeError as e:
            res.fail("%s: %s" % (subj.label, e))
        finally:
            self.launcher.stop(running)
        if subj.has_child and not subj.is_mirror:
            self.scale_holds(subj)

    def scale_holds(self, subj):
        """The larger hold cells (plan.hold_scale, full runs), each in a fresh child of subj:
        what holding them leaves behind (memory the allocator keeps) must not reach the
        round's other figures, and the round's leftovers (UDP sessions and their descriptors,
        idle pipes) must not reach the cell."""
        for n in self.plan.hold_scale:
            running = None
            self.tick("%s: start for the %d-connection hold" % (subj.label, n))
            try:
                running = self.launcher.start(subj)
                time.sleep(SETTLE_S)
                self.load_modes(subj, [("hold", lambda: self.wl.hold(subj, running.pid, n))])
            except RuntimeError as e:
                self.results.fail("%s hold %d: %s" % (subj.label, n, e))
            finally:
                self.launcher.stop(running)

    def load_workloads(self, subj, pid):
        wl = self.wl
        modes = [("connrate", lambda: wl.connrate(subj))]
        if subj.has_child:
            modes.append(("hold", lambda: wl.hold(subj, pid)))
        if not self.plan.quick:
            modes.append(("latency", lambda: wl.latency(subj)))
            if subj.tcp_only:
                self.results.note_na(subj.label, "udp", "it carries TCP only")
            else:
                modes += [("udp", lambda: wl.udp(subj, 64)),
                          ("udp", lambda: wl.udp(subj, 1400)),
                          ("udpflows", lambda: wl.udpflows(subj))]
        self.load_modes(subj, modes)

    # -- the back-to-back pass (full and --quick runs; plan.paired)
    LOAD_MODE = {"connrate": "connrate", "latency_64B": "latency", "udp_echo_64B": "udp"}

    def paired_pass(self, rnd):
        """Each cell of plan.paired: every proxy measured right beside its baseline, each in
        a fresh child, the two seconds apart; which of the two goes first alternates by
        round, the proxies' order rotates. Recorded under the proxy: workload WL_paired for
        its own figures, WL_paired_BASE (e.g. connrate_paired_redirect) for the baseline's
        run beside it; bench/report.py takes the targets' ratios from these pairs."""
        for wl, base, subs in self.plan.paired():
            k = rnd % len(subs)
            for subj in subs[k:] + subs[:k]:
                pair = [(base, wl + "_paired_" + base.stack), (subj, wl + "_paired")]
                for who, name in pair[::-1] if rnd % 2 else pair:
                    self.paired_cell(who, subj, wl, name)

    def paired_cell(self, who, subj, wl, name):
        """One run of cell wl on subject who, recorded under (subj, name)."""
        mode = self.LOAD_MODE[wl]
        self.tick("%s: %s, back to back (%s)" % (who.label, wl, subj.label))
        why = self.launcher.missing(who)
        if why or not self.binary.has_load(mode):
            self.results.note_na(subj.label, name, why or "`twinstack load %s` not available"
                                 % mode)
            return
        running = None
        try:
            running = self.launcher.start(who)
            if who.has_child:
                time.sleep(SETTLE_S)
            rec = (subj, name)
            {"connrate": lambda: self.wl.connrate(who, rec),
             "latency": lambda: self.wl.latency(who, rec),
             "udp": lambda: self.wl.udp(who, 64, rec)}[mode]()
        except RuntimeError as e:
            self.results.fail("%s %s: %s" % (who.label, name, e))
        finally:
            self.launcher.stop(running)

    # -- --sniff: one subject through the connection rate and the latency, once
    def run_sniff_subject(self, subj):
        running = None
        try:
            running = self.start(subj)
            time.sleep(SETTLE_S)
            self.load_modes(subj, [("connrate", lambda: self.wl.connrate(subj)),
                                   ("latency", lambda: self.wl.latency(subj))])
            if running.exited() is None:
                self.wl.sniff_counters(subj)
        except RuntimeError as e:
            self.results.fail("%s: %s" % (subj.label, e))
        finally:
            self.launcher.stop(running)

    # -- --beside-check: the redirect beside each stack against the redirect alone
    ALONE = "tcp_bulk_alone_redirect"

    def beside_check_round(self, rnd):
        """One round of --beside-check: for each stack (the order rotated by round) and each
        TCP bulk cell, the stack started and run through the cell with the redirect right
        beside it (Beside: the stack up and idle meanwhile, as in a full run), then stopped;
        and the redirect alone through the same cell (no stack process, no TUN), right
        before or after (alternating by round, stack and cell), so the two runs of the
        redirect are seconds apart. The alone runs are recorded under the stack (workload
        tcp_bulk_alone_redirect) so that bench/report.py pairs them by round with the runs
        beside it."""
        red = next(s for s in self.plan.subjects if s.kind == "redirect")
        stacks = [s for s in self.plan.subjects if s.is_stack]
        k = rnd % len(stacks)
        for i, subj in enumerate(stacks[k:] + stacks[:k]):
            for j, cell in enumerate(self.plan.bulk_cells):
                steps = [lambda: self.stack_block(subj, [cell]),
                         lambda: self.redirect_alone(red, subj, [cell])]
                if (rnd + i + j) % 2:
                    steps.reverse()
                for step in steps:
                    step()

    def stack_block(self, subj, cells):
        """subj started, through cells with the redirect beside each (Beside), stopped."""
        running = None
        why = self.launcher.missing(subj)
        if why:
            self.results.note_na(subj.label, "all", why)
            return
        try:
            running = self.start(subj)
            time.sleep(SETTLE_S)
            self.bulk_cells(running, cells)
        except RuntimeError as e:
            self.results.fail("%s: %s" % (subj.label, e))
        finally:
            self.launcher.stop(running)

    def redirect_alone(self, red, subj, cells):
        """The redirect started as in its own block, through cells, stopped; recorded under
        subj."""
        running = None
        why = self.launcher.missing(red)
        if why:
            self.results.note_na(subj.label, self.ALONE, why)
            return
        try:
            running = self.start(red)
            time.sleep(SETTLE_S)
            for direction, streams in cells:
                self.tick("%s alone: tcp bulk %s, %d stream%s (for %s)" % (
                    red.label, direction, streams, "s" if streams > 1 else "", subj.label))
                try:
                    self.wl.bulk(red, running.pid, direction, streams, rec=(subj, self.ALONE))
                except RuntimeError as e:
                    self.results.fail("%s alone (for %s): %s" % (red.label, subj.label, e))
                if running.exited() is not None:
                    raise RuntimeError("exited (%s) during the bulk workloads" %
                                       running.exited())
        except RuntimeError as e:
            self.results.fail("%s alone (for %s): %s" % (red.label, subj.label, e))
        finally:
            self.launcher.stop(running)

    # -- --via socks5: one subject through the bulk cells and the UDP echo, once
    def run_socks5_subject(self, subj):
        running = None
        try:
            running = self.start(subj)
            if subj.has_child:
                time.sleep(SETTLE_S)
            self.bulk_cells(running)
            if subj.tcp_only:
                self.results.note_na(subj.label, "udp", "it carries TCP only")
            else:
                self.tick("%s: udp echo" % subj.label)
                self.wl.socks5_udp(subj)
            if running.pid:
                self.results.emit(subj, "run", None, None, "peak_rss_kb",
                                  self.wl.run_peak_kb(running.pid))
        except RuntimeError as e:
            self.results.fail("%s: %s" % (subj.label, e))
        finally:
            self.launcher.stop(running)


class Beside:
    """A baseline (plan.beside: the redirect, or with --via socks5 the plain SOCKS5 client)
    measured right beside each TCP bulk cell of a proxy that stays up through its block.

    In a round's blocks a proxy's run of a cell and its baseline's are minutes apart, and this
    shared machine's speed moves between levels about 30 % apart on that scale. Re-measuring
    the proxy in a fresh child beside a fresh baseline understates a stack warmed by its block
    (lwIP moved less in bulk fresh than warmed), so the proxy keeps its block and the
    baseline comes to it: started on standby once (its own stats port; no rule set, the route
    into the TUN), it takes the target's TCP for its run of the cell (beside_on: the route
    over the veth and the REDIRECT rule set) and gives it back (beside_off) right after. The
    proxy sits idle in the meantime. Recorded under the proxy: workload
    tcp_bulk_paired_BASE (e.g. tcp_bulk_paired_redirect); bench/report.py takes the bulk
    cells' fractions of the baseline from these pairs."""

    def __init__(self, rig, base, proxy):
        self.rig, self.base, self.proxy = rig, base, proxy
        self.name = "tcp_bulk_paired_" + base.stack
        self.running = rig.launcher.start_beside(base)

    def cell(self, direction, streams):
        rig, base = self.rig, self.base
        rig.tick("%s: tcp bulk %s, %d stream%s, beside %s" % (
            base.label, direction, streams, "s" if streams > 1 else "", self.proxy.subj.label))
        if self.running.exited() is not None:
            rig.results.fail("%s beside %s: exited (%s)" % (base.label, self.proxy.subj.label,
                                                           self.running.exited()))
            return
        try:
            rig.launcher.beside_on(base)
            rig.wl.bulk(base, self.running.pid, direction, streams,
                        rec=(self.proxy.subj, self.name))
        except RuntimeError as e:
            rig.results.fail("%s beside %s: %s" % (base.label, self.proxy.subj.label, e))
        finally:
            rig.launcher.beside_off(base)

    def stop(self):
        self.rig.launcher.stop_child(self.running)
