"""What the python checks of tests/bench/smoke.sh share.

Each check there is a script on standard input (`python3 - ARGS <<'PY'`) that starts with
`from smokecheck import *` (smoke.sh puts this directory on PYTHONPATH): one TAP line per
check, the failed ones counted, and the files of a run directory read by name; and the
synthetic runs they redraw written with the metadata every run shares.
"""
import json
import os
import sys

__all__ = ["check", "finish", "results", "rows_of", "text", "write_run"]

_passed = 0
_failed = 0


def check(name, ok, detail=None):
    """One TAP line, "ok - NAME" or "not ok - NAME", with " (DETAIL)" when given; returns ok."""
    global _passed, _failed
    ok = bool(ok)
    print(("ok - " if ok else "not ok - ") + name +
          ("" if detail is None else " (" + detail + ")"))
    if ok:
        _passed += 1
    else:
        _failed += 1
    return ok


def finish(summary=False):
    """Exit 1 if any check failed, else 0; with summary, print the counts first."""
    if summary:
        print(f"{_passed} passed, {_failed} failed")
    sys.exit(1 if _failed else 0)


def results(path):
    """A run's results.json, given its path or the run directory's."""
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    with open(path) as f:
        return json.load(f)


def rows_of(path):
    """The rows of a run's results.json (path: the file or the run directory)."""
    return results(path)["rows"]


def text(d, name):
    """The file NAME of the run directory d (report.md, stdout.txt), whole."""
    with open(os.path.join(d, name)) as f:
        return f.read()


def write_run(path, samples, **meta):
    """A synthetic run's results.json at path: its samples, no rows, and meta (mode,
    subjects, bulk cells ...) over what every synthetic run shares (a 2-CPU host, reno in the
    testbed, nothing failed or left unmeasured)."""
    m = {"duration_s": 1.0,
         "host": {"kernel": "synthetic", "cpus": 2, "machine": "x86_64"},
         "tcp_congestion": {"testbed": "reno", "host_default": "bbr"},
         "not_measured": [], "failures": [], "notes": []}
    m.update(meta)
    with open(path, "w") as f:
        json.dump({"meta": m, "rows": [], "samples": samples}, f)
