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
through the same server; `--report-from FILE` redraws the report of an earlier run;
`--smoke` is the test suite's sanity run (a `--quick` run with every fixed wait shortened).

This file is the entry point: the arguments, the checks before a run, and the dispatch to a
run or a redraw. The rest, next to it in bench/:
    plan.py       the plan of a run: mode, cells, repetitions, the plan text, the estimate
    subjects.py   the Subject type (a kind and explicit settings) and each mode's subjects
    rigtb.py      the testbed: namespaces, veth, routes, congestion control, processes,
                  teardown, /proc and /stats readers (its topology diagram is there)
    servers.py    the binary's capabilities, iperf3 / load serve / dante in the testbed
    launch.py     starting and stopping a subject, per kind (twinstack run / reflect)
    workloads.py  TCP bulk (iperf3, perf), the `twinstack load` workloads, callgrind
    perfcopy.py   --perf: the TUN's copies and netfilter's work read from a bulk run's
                  profile, and the bound they set on a TUN proxy
    runner.py     one run: the testbed up, every subject through its mode's workloads
    ablation.py   --ablation's schedule: every subject in every cell, a fresh child per run
    ab.py         --ab: the A/B gate's plan and schedule (abstat.py its statistics,
                  abreport.py its report, abcg.py the CPU cgroup of --ab-throttle)
    results.py    the samples, failures and notes; results.json's meta; --report-from input
    across.py     --across: the targets of several runs side by side
    report.py     the report: derived figures, targets, report.md, charts, results.json

Python 3 standard library only. Every wait is bounded; namespaces and processes are torn down
on exit, on SIGINT/SIGTERM/SIGHUP and on errors. Exit: 0 done, 1 a run failed, 2 cannot run.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)

# The rig's modules sit next to this file: found whatever the working directory (and under
# python3 -I, which leaves the script's directory off sys.path); no __pycache__ in the source
# tree.
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
sys.dont_write_bytecode = True
from plan import ABLATION_LIMIT_S, Plan  # noqa: E402
from report import clear_progress, log, out  # noqa: E402
from results import Results  # noqa: E402
from rigtb import DANTED, EXIT_CANNOT, EXIT_FAIL, EXIT_OK, CannotRun  # noqa: E402
from runner import Rig  # noqa: E402
import subjects as subjects_mod  # noqa: E402
import ab  # noqa: E402


def report_from(a):
    """Redraw report.md, results.json and the charts of an earlier run (no root needed)."""
    try:
        with open(a.report_from) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise CannotRun("--report-from %s: %s" % (a.report_from, e))
    meta = data.get("meta") if isinstance(data, dict) else None
    if isinstance(meta, dict) and meta.get("mode") == "ab":
        return ab.report_from(a, data)
    if not isinstance(meta, dict) or meta.get("mode") not in ("full", "quick", "ablation",
                                                              "socks5", "sniff",
                                                              "besidecheck"):
        raise CannotRun("--report-from %s: not a results.json of this rig (meta.mode)" %
                        a.report_from)
    a.ablation = meta["mode"] == "ablation"
    a.quick = meta["mode"] == "quick"
    a.via = "socks5" if meta["mode"] == "socks5" else None
    a.sniff = meta["mode"] == "sniff"
    a.beside_check = meta["mode"] == "besidecheck"
    a.io_mode = None if a.ablation else meta.get("io_mode")
    if a.out is None:
        a.out = os.path.dirname(os.path.abspath(a.report_from))
    plan, results = Plan(a), Results()
    try:
        meta = results.load(plan, data, a.report_from)
    except (KeyError, TypeError, ValueError, StopIteration) as e:
        raise CannotRun("--report-from %s: malformed (%s: %s)" % (a.report_from,
                                                                  type(e).__name__, e))
    os.makedirs(plan.out, exist_ok=True)
    results.finish(plan, meta.get("started_utc", "?"), meta.get("duration_s", 0))
    log("report: %s" % os.path.join(plan.out, "report.md"))
    return EXIT_OK


def run_options_given(a):
    """The options of a new run that were given: none of them applies to reading an earlier
    run (--report-from, --across)."""
    return [o for o, v in (("--ablation", a.ablation), ("--quick", a.quick), ("--via", a.via),
                           ("--sniff", a.sniff), ("--io-mode", a.io_mode), ("--reps", a.reps),
                           ("--bulk-seconds", a.bulk_seconds),
                           ("--time-limit", a.time_limit), ("--dry-run", a.dry_run),
                           ("--cc", a.cc), ("--subject", a.subject), ("--link", a.link),
                           ("--smoke", a.smoke), ("--beside-check", a.beside_check)) if v]


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
    ap.add_argument("--smoke", action="store_true",
                    help="the test suite's sanity run (tests/bench/smoke.sh; implies --quick): "
                    "every workload once, as short as it still works (one bulk cell, up 1 "
                    "stream, iperf3 -t 1; 1 s windows; short holds; --link: 1 s bulk runs); "
                    "its figures only show the rig works, they are not for comparison")
    ap.add_argument("--ablation", action="store_true",
                    help="TCP bulk 1/16/64 streams up and down for veth, the reflector "
                    "(offload and per-packet), system per-packet/offload/offload+2 queues, lwip "
                    "per-packet/offload; the acceptance targets as PASS/MISS lines (~18 minutes)")
    ap.add_argument("--via", choices=("socks5",), default=None,
                    help="socks5: each stack with its outbound pointed at a SOCKS5 server "
                    "(dante in the server namespace) next to the same stack direct and a plain "
                    "SOCKS5 client without a TUN (proxychains4 + iperf3, load udp --socks5): "
                    "TCP bulk and UDP echo, the ratios to the plain client with the >= 0.8 "
                    "targets (~16 minutes; --quick ~2)")
    ap.add_argument("--sniff", action="store_true",
                    help="each stack with route.sniff off, on with no flow looked at (a name "
                    "rule for port 443 only: \"sniff idle\") and on with every connection looked "
                    "at (\"sniff look\"): connection rate and 64 B latency, the ratios to the "
                    "same stack without sniffing (~4 minutes; --quick ~1)")
    ap.add_argument("--link", action="store_true",
                    help="link conditions: the client behind a delay line with loss (RTT 10 "
                    "and 50 ms, loss 0, 0.1 and 1 %%; --quick: 10 ms and 1 %%), the proxy on "
                    "its gateway; veth vs each stack: TCP bulk each way, a 4 MiB download's "
                    "completion time, retransmits; the line calibrated per condition "
                    "(bench/linkrun.py; ~15 minutes, --quick ~2)")
    ap.add_argument("--beside-check", action="store_true",
                    help="does a stack that sits idle beside the redirect baseline change the "
                    "baseline's figures? Each round, per stack and TCP bulk cell: the stack "
                    "started for the cell with the redirect right beside it (the stack up and "
                    "idle meanwhile, as in a full run), and right before or after it the "
                    "redirect alone (no stack, no TUN); the report: per cell the redirect "
                    "beside over alone, paired by round (~4 minutes a round; --quick: up 1 "
                    "and 16 streams, ~1.5)")
    ap.add_argument("--subject", action="append", metavar="NAME=COMMAND",
                    help="also measure another TUN proxy, started in the client namespace by "
                    "COMMAND (sh -c) with the placeholders {tun} (the TUN name it must create), "
                    "{addr} (its address/prefix), {ip}, {prefix}, {mtu}, {mark} (the fwmark "
                    "routed over the veth), and with --via socks5 {socks5} (host:port), "
                    "{socks5_host}, {socks5_port}; interleaved with the stacks under the same "
                    "workloads (repeatable; full, --quick and --via socks5 runs)")
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
    ap.add_argument("--across", nargs="+", metavar="FILE",
                    help="the targets of several earlier runs' results.json (or their output "
                    "directories; of one kind: "
                    "full, --via socks5 or --ablation) side by side: per target the runs that "
                    "passed it, its lowest and highest figure and every run's; to stdout, and "
                    "to --out DIR/across.md when given; needs no root")
    ap.add_argument("--no-micro", action="store_true",
                    help="skip the callgrind instruction counts")
    ap.add_argument("--perf", metavar="DIR", default=None,
                    help="record a system-wide perf profile of every TCP bulk run into DIR "
                         "(for finding where the time goes; adds overhead, do not quote its "
                         "throughput); the report adds the TUN's copies per GB and the bound "
                         "they set on a TUN proxy's fraction of the redirect baseline")
    ap.add_argument("--cc", default=None, metavar="NAME",
                    help="TCP congestion control pinned in the testbed's namespaces (default "
                    "reno: unpaced, selectable in any namespace); \"host\" keeps the "
                    "host's default (a pacing one such as bbr caps every single flow, baselines "
                    "included, near its pacing timer's rate)")
    ab.add_args(ap)
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
    ab.check_args(a, bad)
    if a.across:
        given = [o for o, v in (("--report-from", a.report_from), ("--perf", a.perf),
                                ("--ab", a.ab)) if v] + run_options_given(a)
        if given:
            bad("--across reads earlier runs: %s make%s no sense with it" % (
                ", ".join(given), "s" if len(given) == 1 else ""))
        if len(a.across) < 2:
            bad("--across needs at least two results.json")
        return a
    if a.report_from:
        given = run_options_given(a)
        if given:
            bad("--report-from redraws an earlier run: %s make%s no sense with it" % (
                ", ".join(given), "s" if len(given) == 1 else ""))
        return a
    if a.out is None:
        a.out = "bench-results"
    if a.cc is None:
        a.cc = "reno"
    if a.smoke and (a.ablation or a.sniff or getattr(a, "ab", None)):
        bad("--smoke shortens the default comparison, --via socks5 or --link; not --ablation, "
            "--sniff or --ab")
    a.quick = a.quick or a.smoke
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
    if a.link and (a.ablation or a.via or a.sniff or a.subject or a.io_mode):
        bad("--link is a run of its own, not with --ablation, --via, --sniff, --subject or "
            "--io-mode")
    if a.beside_check and (a.ablation or a.via or a.sniff or a.link or a.subject or
                           getattr(a, "ab", None)):
        bad("--beside-check is a run of its own, not with --ablation, --via, --sniff, --link, "
            "--subject or --ab")
    if a.subject and (a.ablation or a.sniff):
        bad("--subject is measured in full, --quick and --via socks5 runs, not with %s" % (
            "--ablation" if a.ablation else "--sniff"))
    names = set()
    for x in a.subject or []:
        try:
            e = subjects_mod.parse_external(x, a.via)
        except ValueError as err:
            bad(str(err))
        if e.label in names:
            bad("--subject %s: given twice" % e.label)
        names.add(e.label)
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
        if a.across:
            import across
            return across.main(a)
        if a.link:
            if a.dry_run:
                out("twinstack bench: link conditions (bench/linkrun.py), out %s" % a.out)
                return EXIT_OK
            preflight(a)
            import linkrun
            return linkrun.main(a)
        plan = ab.ABPlan(a) if a.ab else Plan(a)
        if a.ablation and plan.estimate_s() > plan.time_limit:
            sys.stderr.write(plan.plan_text() + "\n")
            sys.stderr.write("twinstack bench: the ablation would take about %d s, over the %d s "
                             "limit: lower --reps or --bulk-seconds (or raise --time-limit)\n" %
                             (plan.estimate_s(), plan.time_limit))
            return EXIT_CANNOT
        if a.dry_run:
            out(plan.plan_text())
            return EXIT_OK
        rig = ab.ABRig(plan) if a.ab else Rig(plan)
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
