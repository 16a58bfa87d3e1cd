"""ab.py — `twinstack bench --ab BASE_BINARY`: the A/B regression gate. The base binary (an
older build) and the candidate (the binary the rig runs as) are measured on the same testbed
in one run, interleaved, and judged on their paired differences per cell, with the tolerance
taken from this run's own spread (bench/abstat.py), so the machine's speed and load cancel
instead of being compared with figures recorded elsewhere.

Subjects: for each stack in --stacks a base and a candidate (bench/subjects.py ab_subject:
"system base" / "system cand", io_mode "offload-base" / "offload-cand"), started from their
own binaries by bench/launch.py. Cells: TCP bulk up and down at 1 and 16 streams and the
connection rate; --quick: TCP bulk up and down at 1 stream. Schedule: --reps rounds; in each
round each subject is started fresh, runs every cell and is stopped; base and candidate of a
stack run next to each other and alternate which goes first (round 1 base first, round 2
candidate first, ...), so slow drift of the machine cancels in the pairs (round_order says
why the stacks keep their order).

The testbed of an A/B run is made steadier than the comparison's (--ab-nice, --ab-pin): it
runs above the normal scheduling priority, so other jobs on a shared machine take less CPU
from it, and the proxy under test runs on CPUs of its own with the rest of the testbed on the
others, so the throughput no longer depends on where the scheduler puts three busy processes
(iperf3's client and server, the proxy) on few CPUs. Both sides get the same.

--ab-throttle PCT (a test aid for the gate's own test): the candidate's proxy runs in a CPU
cgroup (bench/abcg.py) whose quota in each cell is (1 - PCT/100) of the CPU the base's proxy
used in that cell (its CPU seconds per wall second; the same round's when the base ran first,
else the previous round's). Nothing in the product knows about it.

Python 3 standard library only.
"""

import atexit
import os
import signal
import time

import abreport
import abstat
from launch import SETTLE_S
from plan import Plan
from report import log
from results import Results
from rigtb import EXIT_FAIL, EXIT_OK, CannotRun, proc_cpu
from runner import Rig
from servers import Binary
import subjects as subjects_mod

CELLS_FULL = [("tcp_bulk", "up", 1), ("tcp_bulk", "down", 1), ("tcp_bulk", "up", 16),
              ("tcp_bulk", "down", 16), ("connrate", None, None)]
CELLS_QUICK = [("tcp_bulk", "up", 1), ("tcp_bulk", "down", 1)]
# --ab-cells names
CELL_NAMES = {"up1": ("tcp_bulk", "up", 1), "down1": ("tcp_bulk", "down", 1),
              "up16": ("tcp_bulk", "up", 16), "down16": ("tcp_bulk", "down", 16),
              "up64": ("tcp_bulk", "up", 64), "down64": ("tcp_bulk", "down", 64),
              "connrate": ("connrate", None, None), "udp64": ("udp_echo_64B", None, None)}
REPS_FULL, REPS_QUICK = 6, 5
THROTTLE_RANGE = (1.0, 90.0)
NICE_DEFAULT = 10
BULK_INTERVAL_S = 0.5
MIN_EFFECT_RANGE = (0.1, 50.0)
START_S = 1.0           # a child's start, its checks and stop, with margin (the estimate)


# ---- arguments (bench/rig.py parse_args calls these) ----------------------------------------

def add_args(ap):
    ap.add_argument("--ab", metavar="BASE_BINARY", default=None,
                    help="A/B gate: measure BASE_BINARY (e.g. a build of the previous "
                    "revision) against this binary, interleaved in one run, and judge each "
                    "stack and cell on the paired differences (TCP bulk up/down x1 and x16, "
                    "connection rate; --quick: bulk up/down x1); exit 1 on a regression "
                    "(docs/benchmarks.md, make ab BASE=REV)")
    ap.add_argument("--ab-min-effect", type=float, default=None, metavar="PCT",
                    help="--ab: the smallest change judged, in percent (default %g); also "
                    "with --report-from of an A/B run, to judge it again" %
                    abstat.DEFAULT_MIN_EFFECT_PCT)
    ap.add_argument("--ab-cells", default=None, metavar="LIST",
                    help="--ab: the cells to measure and judge, comma-separated from %s "
                    "(default up1,down1,up16,down16,connrate; --quick up1,down1)" %
                    ",".join(CELL_NAMES))
    ap.add_argument("--ab-nice", type=int, default=None, metavar="N",
                    help="--ab: run the testbed (servers, clients, both proxies) N steps above "
                    "the normal scheduling priority (nice -N, 0-20, default %d): on a shared "
                    "machine other jobs then take less CPU from the measurements; 0 keeps the "
                    "normal priority" % NICE_DEFAULT)
    ap.add_argument("--ab-pin", choices=("on", "off"), default=None,
                    help="--ab: on (default): the proxy under test on CPUs of its own (the "
                    "upper half), the rest of the testbed (iperf3, servers, load tools) on the "
                    "others, so where the scheduler happens to put three busy processes on "
                    "few CPUs stops deciding the throughput; off: all share every CPU")
    ap.add_argument("--ab-throttle", type=float, default=None, metavar="PCT",
                    help="--ab test aid: run the candidate's proxy in a CPU cgroup limited to "
                    "(100 - PCT)%%%% of the CPU the base used in the same cell, an injected "
                    "slowdown outside the product (%g-%g)" % THROTTLE_RANGE)


def check_args(a, bad):
    """The --ab options' checks; bad(msg) exits 2."""
    if a.ab_min_effect is not None and not \
            MIN_EFFECT_RANGE[0] <= a.ab_min_effect <= MIN_EFFECT_RANGE[1]:
        bad("--ab-min-effect must be %g-%g (percent)" % MIN_EFFECT_RANGE)
    if a.report_from:
        if a.ab or a.ab_throttle is not None or a.ab_nice is not None or \
                a.ab_pin is not None or a.ab_cells is not None:
            bad("--report-from redraws an earlier run: --ab, --ab-throttle, --ab-nice, "
                "--ab-pin and --ab-cells make no sense with it")
        return
    if not a.ab:
        if a.ab_throttle is not None or a.ab_min_effect is not None or \
                a.ab_nice is not None or a.ab_pin is not None or a.ab_cells is not None:
            bad("--ab-throttle, --ab-min-effect, --ab-nice, --ab-pin and --ab-cells need --ab")
        return
    if a.ab_nice is not None and not 0 <= a.ab_nice <= 20:
        bad("--ab-nice must be 0-20")
    if a.ab_cells is not None:
        names = a.ab_cells.split(",")
        unknown = [c for c in names if c not in CELL_NAMES]
        if unknown or len(set(names)) != len(names) or not names:
            bad("--ab-cells %r: a comma-separated list of distinct cells from %s" % (
                a.ab_cells, ",".join(CELL_NAMES)))
    other = [o for o, v in (("--ablation", a.ablation), ("--via", a.via),
                            ("--sniff", a.sniff), ("--link", a.link),
                            ("--subject", a.subject), ("--time-limit", a.time_limit),
                            ("--perf", a.perf)) if v]
    if other:
        bad("--ab is a run of its own, not with %s" % ", ".join(other))
    if not os.path.isfile(a.ab) or not os.access(a.ab, os.X_OK):
        bad("--ab %s: not an executable file (the base twinstack binary)" % a.ab)
    if a.ab_throttle is not None and not \
            THROTTLE_RANGE[0] <= a.ab_throttle <= THROTTLE_RANGE[1]:
        bad("--ab-throttle must be %g-%g (percent)" % THROTTLE_RANGE)


# ---- the plan -------------------------------------------------------------------------------

class ABPlan(Plan):
    """A run's plan with the A/B subjects and cells in place of the comparison's."""

    def __init__(self, args):
        super().__init__(args)
        self.mode = "ab"
        self.no_micro = True
        self.base_bin = os.path.abspath(args.ab)
        self.throttle = args.ab_throttle or 0.0
        self.nice = NICE_DEFAULT if args.ab_nice is None else args.ab_nice
        self.cpus = cpu_split() if args.ab_pin != "off" else None
        self.min_effect = args.ab_min_effect if args.ab_min_effect is not None \
            else abstat.DEFAULT_MIN_EFFECT_PCT
        self.reps = args.reps or (REPS_QUICK if self.quick else REPS_FULL)
        if args.ab_cells:
            self.cells = [CELL_NAMES[c] for c in args.ab_cells.split(",")]
        else:
            self.cells = list(CELLS_QUICK if self.quick else CELLS_FULL)
        self.bulk_cells = [(d, n) for wl, d, n in self.cells if wl == "tcp_bulk"]
        # iperf3 reports every half second, so a cell's median is taken over twice as many
        # samples: a second in which another job took the CPUs moves it less.
        self.bulk_interval = BULK_INTERVAL_S
        offload = self.io_mode == "offload"
        self.subjects = [subjects_mod.ab_subject(s, offload, side, b,
                                                 self.cpus[1] if self.cpus else None)
                         for s in self.stacks
                         for side, b in (("base", self.base_bin), ("cand", self.bin))]
        self.veth = self.ceiling_ref = None
        self.externals = []
        self.hold_scale = []

    def cell_s(self, wl):
        return (self.bulk_t + self.bulk_omit if wl == "tcp_bulk" else self.load_s) + 0.5

    def estimate_s(self):
        per = START_S + SETTLE_S + sum(self.cell_s(wl) for wl, _, _ in self.cells)
        return 10 + self.reps * len(self.subjects) * per

    def count_steps(self):
        return self.reps * len(self.subjects) * (1 + len(self.cells))

    def plan_text(self):
        est = self.estimate_s()
        L = ["twinstack bench: A/B gate%s, %d rounds, io_mode %s, out %s" % (
            " (quick)" if self.quick else "", self.reps, self.io_mode, self.out),
             "base: %s" % self.base_bin, "candidate: %s" % self.bin,
             "subjects: " + ", ".join("%s (%s/%s/q%d)" % (s.label, s.stack, s.io_mode,
                                                          s.queues) for s in self.subjects),
             "cells: " + ", ".join(abreport.cell_name(*c) for c in self.cells) +
             "; iperf3 -t %d -O %d -i %g; TCP congestion control %s" % (
                 self.bulk_t, self.bulk_omit, self.bulk_interval,
                 "of the host" if self.cc == "host" else self.cc),
             "order: a fresh child per subject and round; base and candidate alternate "
             "(round 1 base first); min effect %g %%" % self.min_effect]
        if self.nice:
            L.append("priority: nice -%d for the testbed" % self.nice)
        if self.cpus:
            L.append("CPUs: the proxy on %s, the rest of the testbed on %s" % (
                cpu_list(self.cpus[1]), cpu_list(self.cpus[0])))
        if self.throttle:
            L.append("injected slowdown (test aid): the candidate's proxy limited to %g %% of "
                     "the base's CPU per cell (CPU cgroup)" % (100 - self.throttle))
        L.append("estimate: %dm%02ds" % (est // 60, est % 60))
        return "\n".join(L)

    def ab_meta(self):
        return {"base_binary": self.base_bin, "cand_binary": self.bin, "quick": self.quick,
                "stacks": self.stacks, "cells": [list(c) for c in self.cells],
                "min_effect_pct": self.min_effect, "min_pairs": abstat.MIN_PAIRS,
                "nice": -self.nice, "throttle_pct": self.throttle or None,
                "iperf3_interval_s": self.bulk_interval,
                "cpus": {"testbed": sorted(self.cpus[0]), "proxy": sorted(self.cpus[1])}
                if self.cpus else None}


# ---- the results ----------------------------------------------------------------------------

class ABResults(Results):
    """The run's samples; finish() judges them (bench/abreport.py) instead of the
    comparison's report."""

    def __init__(self):
        super().__init__()
        self.cg_meta = {}
        self.verdict_rows = []

    def finish(self, plan, started_utc, duration, host_cc=None):
        meta = self.meta(plan, started_utc, duration, host_cc)
        meta["ab"] = dict(plan.ab_meta(), **self.cg_meta)
        for r in abreport.verdicts(meta, self.samples):
            if r["verdict"] == "INCOMPLETE":
                self.fail("%s %s: %d complete pair%s, fewer than %d: not judged" % (
                    r["stack"], r["cell"], r["n"], "" if r["n"] == 1 else "s",
                    abstat.MIN_PAIRS))
        self.verdict_rows = abreport.write(plan.out, meta, self.samples)


# ---- the run --------------------------------------------------------------------------------

class ABRig(Rig):
    """A Rig whose rounds are the A/B schedule (bench/runner.py calls schedule())."""

    def __init__(self, plan):
        super().__init__(plan)
        self.results = ABResults()
        self.base_cpus = {}     # (stack, cell) -> the base proxy's CPUs in its latest run
        self.cg = None

    def run(self):
        base = Binary(self.plan.base_bin, True)
        if not base.has_run:
            raise CannotRun("--ab %s: no `run` subcommand in the base binary" %
                            self.plan.base_bin)
        if self.plan.nice:
            # Inherited by everything the run starts: servers, clients and both proxies.
            try:
                os.setpriority(os.PRIO_PROCESS, 0, -self.plan.nice)
            except OSError as e:
                raise CannotRun("--ab-nice %d: %s" % (self.plan.nice, e))
        rc = super().run()
        if abreport.exit_code(self.results.verdict_rows):
            return EXIT_FAIL
        return rc

    def schedule(self):
        plan, res = self.plan, self.results
        if plan.throttle:
            import abcg
            try:
                self.cg = abcg.CpuLimit(self.tb.tok, log=log)
            except abcg.CgroupError as e:
                raise CannotRun("--ab-throttle: %s" % e)
            res.cg_meta = {"cgroup": self.cg.path, "cgroup_kind": self.cg.kind,
                           "period_us": abcg.PERIOD_US}
            atexit.register(self.remove_cgroup)
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(s, self.on_signal_wrap(signal.getsignal(s)))
        if plan.cpus:
            # Everything started from now on inherits the testbed's CPUs; the servers already
            # running are moved there too. Each proxy is moved to its own CPUs once started.
            os.sched_setaffinity(0, plan.cpus[0])
            for p in list(self.tb.procs):
                pin(p.pid, plan.cpus[0])
        failed = {}     # label -> failed starts
        try:
            for rnd in range(plan.reps):
                res.cur_round = rnd + 1
                for subj in round_order(plan.stacks, plan.subjects, rnd):
                    if not self.run_subject(subj):
                        failed[subj.label] = failed.get(subj.label, 0) + 1
                given_up = [k for k, v in failed.items() if v >= 2]
                if given_up:
                    # A binary that cannot start (a base that refuses the rig's configuration)
                    # would fail every round: stop, and report what was measured.
                    res.fail("%s failed to start twice: the run stopped after round %d" % (
                        " and ".join(given_up), rnd + 1))
                    break
        finally:
            self.remove_cgroup()

    def on_signal_wrap(self, prev):
        def handler(signum, frame):
            self.tb.teardown()
            self.remove_cgroup()
            if callable(prev):
                prev(signum, frame)
            os._exit(128 + signum)
        return handler

    def remove_cgroup(self):
        if self.cg is not None:
            try:
                self.cg.remove()
            except OSError as e:
                log("ab: could not remove the cgroup %s: %s" % (self.cg.path, e))

    def run_subject(self, subj):
        """subj started fresh, through every cell, stopped. False when it did not start."""
        res, running = self.results, None
        cand_cg = self.cg if subj.side == "cand" else None
        try:
            running = self.start(subj)
        except RuntimeError as e:
            res.fail("%s round %d: %s" % (subj.label, res.cur_round, e))
            return False
        try:
            if self.plan.cpus:
                pin(running.pid, self.plan.cpus[1])
            if cand_cg:
                cand_cg.unlimit()
                cand_cg.add(running.pid)
            time.sleep(SETTLE_S)
            if self.plan.cpus:
                pin(running.pid, self.plan.cpus[1])    # threads started meanwhile
            self.check_placement(running)
            for wl, d, n in self.plan.cells:
                self.cell(running, wl, d, n, cand_cg)
                if running.exited() is not None:
                    raise RuntimeError("exited (%s) during the cells" % running.exited())
        except RuntimeError as e:
            res.fail("%s round %d: %s" % (subj.label, res.cur_round, e))
        finally:
            self.launcher.stop(running)
        return True

    def check_placement(self, running):
        """Read back the proxy's priority and CPUs (recorded as run/proxy_nice and
        run/proxy_pinned); a proxy that is not where the plan put it is not measured."""
        subj, pid = running.subj, running.pid
        try:
            nice, want = os.getpriority(os.PRIO_PROCESS, pid), os.getpriority(os.PRIO_PROCESS, 0)
            tids = os.listdir("/proc/%d/task" % pid)
        except OSError as e:
            raise RuntimeError("the proxy's priority and CPUs: %s" % e)
        self.results.add(subj, "run", None, None, "proxy_nice", nice)
        if nice != want:
            raise RuntimeError("the proxy runs at nice %d, not %d" % (nice, want))
        if self.plan.cpus:
            masks = set()
            for t in tids:
                try:
                    masks.add(frozenset(os.sched_getaffinity(int(t))))
                except OSError:
                    pass
            ok = masks == {frozenset(self.plan.cpus[1])}
            self.results.add(subj, "run", None, None, "proxy_pinned", 1 if ok else 0)
            if not ok:
                raise RuntimeError("the proxy's threads are on CPUs %s, not %s" % (
                    " / ".join(cpu_list(m) for m in masks), cpu_list(self.plan.cpus[1])))

    def cell(self, running, wl, d, n, cg):
        subj, res = running.subj, self.results
        name = abreport.cell_name(wl, d, n)
        self.tick("%s: %s" % (subj.label, name))
        if cg:
            rate = self.base_cpus.get((subj.stack, name))
            if rate:
                res.add(subj, wl, d, n, "throttle_cpus",
                        cg.limit(rate * (1 - self.plan.throttle / 100.0)))
            else:
                cg.unlimit()
                res.note_once("%s %s: no base CPU figure to calibrate the throttle from: "
                              "round %d unthrottled" % (subj.stack, name, res.cur_round))
        c0, t0 = proc_cpu(running.pid), time.monotonic()
        try:
            if wl == "tcp_bulk":
                self.wl.bulk(subj, running.pid, d, n)
            elif wl == "udp_echo_64B":
                self.wl.udp(subj, 64)
            else:
                self.wl.connrate(subj)
        except RuntimeError as e:
            res.fail("%s %s round %d: %s" % (subj.label, name, res.cur_round, e))
            return
        c1, t1 = proc_cpu(running.pid), time.monotonic()
        if c0 and c1 and t1 > t0:
            cpus = (c1[0] + c1[1] - c0[0] - c0[1]) / (t1 - t0)
            res.add(subj, wl, d, n, "proxy_cpus", cpus)
            if subj.side == "base":
                self.base_cpus[(subj.stack, name)] = cpus


def cpu_split():
    """(testbed CPUs, proxy CPUs): the proxy gets the upper half of the CPUs this process may
    use (on two CPUs: the second), the testbed the rest; None with a single CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def cpu_list(cpus):
    return ",".join(str(c) for c in sorted(cpus))


def pin(pid, cpus):
    """Every thread of process pid onto cpus (threads it starts later inherit them)."""
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return
    for t in tids:
        try:
            os.sched_setaffinity(int(t), cpus)
        except (OSError, ValueError):
            pass    # exited meanwhile


def round_order(stacks, subjects, rnd):
    """The subjects of round rnd (0-based) in the order they run: base and candidate of each
    stack next to each other, the base first in rounds 1, 3, ..., the candidate first in
    rounds 2, 4, ... The stacks keep their order: over two rounds each side of a stack then
    runs once right after the other side of its stack and once right after the other stack
    (Sb Sc Lb Lc, Sc Sb Lc Lb). Rotating the stacks each round as well would make one side of
    each stack always the one that follows the other stack (Sb Sc Lb Lc, Lc Lb Sc Sb: the
    system candidate after lwip, its base never), a bias that does not cancel."""
    order = []
    for stack in stacks:
        pair = [s for s in subjects if s.stack == stack]
        if rnd % 2:
            pair.reverse()
        order += pair
    return order


# ---- --report-from of an A/B run ------------------------------------------------------------

def report_from(a, data):
    """Judge an earlier A/B run's samples again (with --ab-min-effect, at another minimum)
    and rewrite its report; exit 1 on a regression or a cell that could not be judged."""
    try:
        meta, samples = abreport.load(a.report_from, data)
    except (KeyError, TypeError, ValueError) as e:
        raise CannotRun("--report-from %s: malformed A/B results (%s: %s)" % (
            a.report_from, type(e).__name__, e))
    if a.ab_min_effect is not None:
        meta["ab"]["min_effect_pct"] = a.ab_min_effect
    outdir = a.out or os.path.dirname(os.path.abspath(a.report_from))
    os.makedirs(outdir, exist_ok=True)
    rows = abreport.write(outdir, meta, samples)
    log("report: %s" % os.path.join(outdir, "report.md"))
    return EXIT_FAIL if abreport.exit_code(rows) else EXIT_OK

