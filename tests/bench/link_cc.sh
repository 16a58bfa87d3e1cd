#!/usr/bin/env bash
# link_cc.sh TWINSTACK — the congestion control of `twinstack bench --link` (bench/linkrun.py)
# without root, in about a second, against a stand-in bench/linkbed.sh that prints the record a
# calibration would (its tcp_congestion: the name it was given, or for "host" the one the new
# namespaces inherit, here "hostcc"):
#  - --cc host reaches the testbed as host, not as reno; the run then uses the name the
#    testbed read back, and link.json records it (cc) beside what was asked (cc_asked);
#    link.md names both;
#  - --cc NAME and the default reno reach the testbed as given and are recorded as such;
#  - a testbed that reports another algorithm than the one pinned stops the condition.
# Exit 0 all passed, 1 a check failed.
set -uo pipefail
bin=${1:?usage: link_cc.sh path/to/twinstack}
here=$(cd "$(dirname "$0")" && pwd)
bench=$here/../../bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cat >"$out/linkbed.sh" <<'SH'
#!/usr/bin/env bash
# stand-in: records its arguments, prints a calibration record
printf '%s\n' "$*" >>"${0%/*}/args.txt"
cc=reno
while [ $# -gt 0 ]; do
	case $1 in --cc) cc=$2; shift 2 ;; *) shift ;; esac
done
[ "$cc" = host ] && cc=hostcc
[ -n "${LINKBED_SAYS:-}" ] && cc=$LINKBED_SAYS
printf '{"rtt_ms_set": 10, "loss_pct_set": 1, "tcp_congestion": "%s", "ok": true}\n' "$cc"
SH
chmod +x "$out/linkbed.sh"

python3 - "$bench" "$bin" "$out" <<'PY'
import argparse, io, json, os, sys, contextlib
sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = True
import linkrun
binary, d = sys.argv[2], sys.argv[3]
linkrun.LINKBED = os.path.join(d, "linkbed.sh")
bad = 0
def check(name, ok, detail=""):
    global bad
    print(("ok - " if ok else "not ok - ") + name + (" (%s)" % detail if detail else ""))
    bad += not ok

def run_with(cc, says=None):
    """A LinkRun asked for cc, one calibration through the stand-in, link.json written."""
    o = os.path.join(d, "out-" + cc + ("-" + says if says else ""))
    os.makedirs(o, exist_ok=True)
    try:
        os.unlink(os.path.join(d, "args.txt"))
    except FileNotFoundError:
        pass
    a = argparse.Namespace(bin=binary, out=o, quick=True, smoke=True, reps=1, bulk_seconds=1,
                           cc=cc, stacks="system,lwip")
    r = linkrun.LinkRun(a)
    os.makedirs(r.work, exist_ok=True)
    if says:
        os.environ["LINKBED_SAYS"] = says
    err = None
    try:
        r.calibrate((10, 1.0))
    except RuntimeError as e:
        err = str(e)
    finally:
        os.environ.pop("LINKBED_SAYS", None)
    with contextlib.redirect_stdout(io.StringIO()):
        r.write(1.0)
    args = open(os.path.join(d, "args.txt")).read()
    return r, args, json.load(open(os.path.join(o, "link.json"))), \
        open(os.path.join(o, "link.md")).read(), err

r, args, j, md, err = run_with("host")
check("--cc host: the testbed is asked for host", "--cc host " in args, args.strip())
check("--cc host: the run uses what the testbed read back", r.cc == "hostcc", r.cc)
check("--cc host: link.json records the algorithm used and what was asked",
      j.get("cc") == "hostcc" and j.get("cc_asked") == "host",
      "cc %s, cc_asked %s" % (j.get("cc"), j.get("cc_asked")))
check("--cc host: link.md names both", "hostcc (--cc host)" in md,
      [l for l in md.splitlines() if "iperf3 -t" in l][:1])

r, args, j, md, err = run_with("bbr")
check("--cc bbr: the testbed is asked for bbr and it is recorded",
      "--cc bbr " in args and j.get("cc") == "bbr" and j.get("cc_asked") == "bbr",
      "%s; cc %s, cc_asked %s" % (args.strip(), j.get("cc"), j.get("cc_asked")))
r, args, j, md, err = run_with("reno")
check("--cc reno (the default): asked and recorded as reno",
      "--cc reno " in args and j.get("cc") == "reno" and "with reno," in md,
      "cc %s" % j.get("cc"))

r, args, j, md, err = run_with("bbr", says="cubic")
check("a testbed that pinned another algorithm stops the condition",
      err is not None and "cubic" in err and "bbr" in err, err)
sys.exit(1 if bad else 0)
PY
