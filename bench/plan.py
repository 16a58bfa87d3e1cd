"""plan.py — what one run of the comparison rig will do, before anything runs: its mode, the
subjects (bench/subjects.py), the TCP bulk cells, the repetitions and the workload lengths;
the plan text (--dry-run and the head of every run), the ablation's time estimate and the
step count the progress line counts down. Pure: no process, no file, no clock.

Python 3 standard library only.
"""

import os

import subjects as subjects_mod
from rigtb import B_VETH4, S5_PORT

# --ablation: the cells in table order (stream count, then direction), the iperf3 run length,
# the default time limit, and what the estimate adds per iperf3 run (connect, stream set-up,
# JSON) and per child start (TUN, ready byte, the offload check, settling).
ABLATION_CELLS = [(d, n) for n in (1, 16, 64) for d in ("up", "down")]
ABLATION_BULK_S = 5
ABLATION_LIMIT_S = 1800
RUN_OVERHEAD_S = 0.5    # the measured overhead (docs/benchmarks.md), with margin
START_OVERHEAD_S = 0.8  # SETTLE_S + ~0.15 s start and checks, with margin
# Full runs hold this many connections too, beside plan.hold_conns (bench/workloads.py hold).
SCALE_HOLD_CONNS = 10000


# The back-to-back pass (full and --quick runs, bench/runner.py paired_pass): the short cells
# whose targets compare a stack with a baseline in the same round, each (workload, the
# baseline's stack). In a round's subject blocks the two runs of a cell are minutes apart, and
# this shared machine's speed moves between levels about 30 % apart on that scale; here each
# stack's run of the cell sits right beside a run of its baseline, seconds apart, each in a
# fresh child. Not the TCP bulk cells: a fresh lwIP child moved less in bulk than the same
# stack warmed by the round's earlier cells (docs/benchmarks.md).
PAIRED_CELLS = (("connrate", "redirect"), ("latency_64B", "redirect"), ("udp_echo_64B", "veth"))
PAIRED_QUICK = (("connrate", "redirect"),)


class Plan:
    """A run's plan from its parsed arguments (bench/rig.py parse_args). A --report-from
    redraw replaces the recorded parts with the earlier run's (bench/results.py)."""

    def __init__(self, args):
        self.bin = os.path.abspath(args.bin)
        self.ablation = args.ablation
        self.quick = args.quick
        self.via = getattr(args, "via", None)
        self.sniff = getattr(args, "sniff", False)
        self.beside_check = getattr(args, "beside_check", False)
        self.mode = "ablation" if self.ablation else "socks5" if self.via else \
            "sniff" if self.sniff else "besidecheck" if self.beside_check else \
            "quick" if self.quick else "full"
        self.io_mode = args.io_mode or "offload"
        self.reps = args.reps if args.reps else (1 if args.quick else 3)
        self.stacks = [s for s in args.stacks.split(",") if s]
        self.out = os.path.abspath(args.out)
        self.cc = args.cc
        self.perf = args.perf
        self.no_micro = args.no_micro
        self.verbose = args.verbose
        self.report_from = args.report_from
        self.smoke = getattr(args, "smoke", False)
        self.hold_conns = 1000
        # Full runs also hold SCALE_HOLD_CONNS (workload hold_SCALE_HOLD_CONNS), in a fresh
        # child at the end of each subject's round (bench/runner.py scale_holds).
        self.hold_scale = [SCALE_HOLD_CONNS] if self.mode == "full" else []
        # load hold --duration, plus 1 s per 500 connections: a bound on its open phase (the
        # rig ends the hold once it has sampled the proxy)
        self.hold_s = 12
        self.idle_rss_s = 5     # the quiet wait before the run's idle RSS
        self.time_limit = None
        self.idle_s, self.load_s = 20, 5
        if self.ablation:
            self.bulk_cells = list(ABLATION_CELLS)
            self.bulk_t, self.bulk_omit = ABLATION_BULK_S, 1
            self.time_limit = args.time_limit or ABLATION_LIMIT_S
        elif self.quick:
            self.bulk_cells = [("up", 1), ("up", 16)]
            self.bulk_t, self.bulk_omit = 3, 1
            self.idle_s, self.load_s = 5, 3
            self.hold_s = 8
            if self.smoke:
                # The test suite's sanity run: every workload once, each wait as short as the
                # workload still works with; the figures are not for comparison.
                self.bulk_cells = [("up", 1)]
                self.bulk_t, self.bulk_omit = 1, 0
                self.idle_s, self.load_s, self.hold_s, self.idle_rss_s = 1, 2, 3, 1
        else:
            self.bulk_cells = [(d, n) for d in ("up", "down") for n in (1, 16, 64)]
            self.bulk_t, self.bulk_omit = 5, 1
        if args.bulk_seconds:
            self.bulk_t = args.bulk_seconds
        self.externals = [subjects_mod.parse_external(x, self.via)
                          for x in getattr(args, "subject", None) or []]
        self.subjects, self.veth, self.ceiling_ref = subjects_mod.plan(
            self.mode, self.stacks, self.io_mode, self.externals)

    def paired(self):
        """The back-to-back pass of one round: [(workload, baseline subject, [proxies])]: the
        stacks measured in the run's I/O mode (those the targets name) and the external
        subjects, each beside the baseline; none in other modes or without the baseline."""
        if self.mode not in ("full", "quick"):
            return []
        proxies = [s for s in self.subjects if (s.is_stack and s.io_mode == self.io_mode) or
                   s.kind == "external"]
        P = []
        for wl, base_stack in PAIRED_QUICK if self.quick else PAIRED_CELLS:
            base = next((s for s in self.subjects if s.stack == base_stack), None)
            subs = [s for s in proxies if not (wl.startswith("udp") and s.tcp_only)]
            if base is not None and subs:
                P.append((wl, base, subs))
        return P

    def beside(self, subj):
        """The baseline measured right beside each of subj's TCP bulk cells while subj stays
        up (bench/runner.py Beside), or None: in full and --quick runs the redirect beside
        each stack in the run's I/O mode and each external subject; with --via socks5 the
        plain SOCKS5 client beside each stack via the server and each external subject."""
        if self.mode in ("full", "quick"):
            ok = (subj.is_stack and subj.io_mode == self.io_mode) or subj.kind == "external"
            kind = "redirect"
        elif self.mode == "besidecheck":
            ok, kind = subj.is_stack, "redirect"
        elif self.mode == "socks5":
            ok = (subj.is_stack and subj.via_socks5) or subj.kind == "external"
            kind = "socks5-client"
        else:
            return None
        return next((s for s in self.subjects if s.kind == kind), None) if ok else None

    def estimate_s(self):
        """Seconds an ablation takes: every subject through every cell, each round."""
        per_run = self.bulk_t + self.bulk_omit + RUN_OVERHEAD_S
        tun = sum(1 for s in self.subjects if s.has_child)
        return 15 + self.reps * len(self.bulk_cells) * (len(self.subjects) * per_run +
                                                        tun * START_OVERHEAD_S)

    def plan_text(self):
        L = ["twinstack bench: %s, %d repetition%s, io_mode %s, out %s" % (
            self.mode + (" --smoke (a sanity run: figures not for comparison)"
                         if self.smoke else ""), self.reps, "s" if self.reps > 1 else "",
            "per-packet,offload" if self.ablation else self.io_mode, self.out)]
        L.append("subjects: " + ", ".join(
            "%s (%s/%s/q%d)" % (s.label, s.stack, s.io_mode, s.queues) for s in self.subjects))
        L.append("tcp bulk cells: " + ", ".join("%s x%d" % c for c in self.bulk_cells) +
                 "; iperf3 -t %d -O %d; TCP congestion control %s" % (
                     self.bulk_t, self.bulk_omit,
                     "of the host" if self.cc == "host" else self.cc))
        for e in self.externals:
            L.append("external subject %s: %s" % (e.label, e.command))
        for wl, base, subs in self.paired():
            L.append("back to back, each round: %s of %s, each beside the %s's" % (
                wl, ", ".join(s.label for s in subs), base.label))
        beside = [s for s in self.subjects if self.beside(s)]
        if self.beside_check:
            L.append("beside check, each round: per stack and cell, the stack started "
                     "for the cell with the redirect beside it, and the redirect alone, "
                     "which first alternating by round, stack and cell")
        if beside:
            L.append("tcp bulk beside, each cell: the %s right %s each cell of %s (the "
                     "proxy up meanwhile)" % (self.beside(beside[0]).label,
                                              "before or after, by round," if self.reps > 1
                                              else "after", ", ".join(s.label for s in beside)))
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

    def count_steps(self):
        """The progress line's steps: one per tick of the run (bench/runner.py,
        bench/ablation.py)."""
        if self.ablation:
            return self.reps * len(self.bulk_cells) * len(self.subjects)
        if self.via:
            return self.reps * sum(len(self.bulk_cells) * (2 if self.beside(s) else 1) +
                                   (0 if s.tcp_only else 1) + (1 if s.has_child else 0)
                                   for s in self.subjects)
        if self.sniff:
            return self.reps * 3 * len(self.subjects)
        if self.beside_check:
            # per stack and cell: its start and 2 runs; the redirect's start and 1 run
            stacks = sum(1 for s in self.subjects if s.is_stack)
            return self.reps * stacks * 5 * len(self.bulk_cells)
        per = 0
        for s in self.subjects:
            per += len(self.bulk_cells) * (2 if self.beside(s) else 1)
            if s.has_child:
                per += 1  # start
            if s.is_stack:
                per += 1  # idle wakeups
            if not s.is_mirror:
                per += 1 + (1 if s.has_child else 0)  # connrate, hold
                per += 2 * len(self.hold_scale) if s.has_child else 0  # start, larger hold
                per += 1 if s.has_child else 0        # idle rss
                per += 0 if self.quick else 1 if s.tcp_only else 4  # latency, udp x2, flows
        per += sum(2 * len(P[-1]) for P in self.paired())  # back to back: 2 runs per pair
        return per * self.reps
