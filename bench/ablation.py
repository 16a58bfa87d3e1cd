"""ablation.py — `twinstack bench --ablation`: TCP bulk only, every subject (every TUN I/O mode
of each stack and of the reflector, bench/subjects.py plan_ablation) in every cell, a fresh
child per run, rotated per round and cell, within a time limit (the estimate and the limit:
bench/plan.py). The acceptance targets are checked by bench/report.py.

Python 3 standard library only.
"""

import time

from launch import SETTLE_S
from rigtb import proc_kb


def run(rig):
    """Every round, every cell, every subject still measured, of rig (bench/runner.py Rig,
    its testbed and servers up); stops starting cells once the limit would be exceeded."""
    plan, res = rig.plan, rig.results
    failed_starts = {}      # subject key -> starts that failed
    disabled = set()        # keys of subjects not measured any further
    cells_done, t_cells = 0, 0.0
    ncells = len(plan.bulk_cells)
    for rnd in range(plan.reps):
        res.cur_round = rnd + 1
        for ci, (d, n) in enumerate(plan.bulk_cells):
            el = time.monotonic() - rig.t0
            avg = t_cells / cells_done if cells_done else 0.0
            if el + avg > plan.time_limit:
                res.note_once("time limit %d s: stopped before round %d, %s x%d (%d of %d "
                              "cells measured)" % (plan.time_limit, rnd + 1, d, n,
                                                   cells_done, plan.reps * ncells))
                return
            c0 = time.monotonic()
            live = [s for s in plan.subjects if s.key not in disabled]
            # rotate per round and cell so no subject always runs first or last
            k = (rnd * ncells + ci) % max(1, len(live))
            for subj in live[k:] + live[:k]:
                if not run_cell(rig, subj, d, n, failed_starts):
                    disabled.add(subj.key)
            t_cells += time.monotonic() - c0
            cells_done += 1


def run_cell(rig, subj, d, n, failed_starts):
    """One subject through one cell: start it (a child for a TUN subject), one iperf3 run, its
    peak RSS (VmHWM: this child only ever saw this cell), stop. Two failed starts disable the
    subject for the rest of the run. Returns False once the subject is disabled."""
    res = rig.results
    running, started = None, False
    rig.tick("%s: tcp bulk %s, %d stream%s" % (subj.label, d, n, "s" if n > 1 else ""))
    why = rig.launcher.missing(subj)
    if why:
        res.note_na(subj.label, "tcp_bulk", why)
        return False
    try:
        running = rig.launcher.start(subj)
        if running.child is not None:
            time.sleep(SETTLE_S)
        started = True
        rig.wl.bulk(subj, running.pid, d, n)
        if running.exited() is not None:
            raise RuntimeError("exited (%s) during the run" % running.exited())
        if running.pid:
            res.emit(subj, "tcp_bulk", d, n, "peak_rss_kb", proc_kb(running.pid, "VmHWM"))
    except RuntimeError as e:
        res.fail("%s %s x%d: %s" % (subj.label, d, n, e))
        if not started:
            failed_starts[subj.key] = failed_starts.get(subj.key, 0) + 1
            if failed_starts[subj.key] >= 2:
                res.note_once("%s: failed to start twice, not measured any further" %
                              subj.label)
                return False
    finally:
        rig.launcher.stop(running)
    return True
