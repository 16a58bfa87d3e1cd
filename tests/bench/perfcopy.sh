#!/usr/bin/env bash
# perfcopy.sh TWINSTACK — the TUN copy bound of `twinstack bench --perf` without root or perf,
# in about a second:
#  1. bench/perfcopy.py reads `perf script -F pid,period,ip,sym` text: it counts the proxy's
#     copies only under the TUN's read and write and only in the proxy's process (not
#     iperf3's socket copies, not the proxy's own copies elsewhere), netfilter anywhere in a
#     chain of any process (what its hooks call included), every sample's period in the
#     total; a header without a chain and a frame without a symbol are taken as they come;
#     the forms other kernels and builds give (a copy primitive as the leaf, GCC clones of
#     the TUN's functions, netfilter without its hook frame, user and unresolved frames);
#     no figure rather than 0 where the TUN's I/O shows but no known copy; perf script's
#     command line and its failure (a stand-in perf on PATH);
#  2. the bound (N / B) x S / (S - F + C) and its refusals (a missing figure, no CPU busy,
#     no work left);
#  3. a synthetic full run's results.json redrawn with --report-from: the bound per round,
#     its row in results.json, report.md's section, and the bulk targets' lines naming it;
#     without the redirect's profile no bound, no section; a synthetic --via socks5 run: the
#     via subject bounded against the redirect through the same server and, through that
#     redirect's own fraction, against the plain client; the direct stack not bounded.
# Exit 0 all passed, 1 a check failed.
set -uo pipefail
bin=${1:?usage: perfcopy.sh path/to/twinstack}
here=$(cd "$(dirname "$0")" && pwd)
bench=$here/../../bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 - "$bench" "$bin" "$out" <<'PY'
import json, os, re, subprocess, sys
sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = True
import perfcopy
binary, d = sys.argv[2], sys.argv[3]
bad = 0
def check(name, ok, detail=""):
    global bad
    print(("ok - " if ok else "not ok - ") + name + (" (%s)" % detail if detail else ""))
    bad += not ok

# -- 1: the profile's text
P = 2_000_000   # one sample's period, ns
def sample(pid, chain, period=P):
    return " %d %10d \n" % (pid, period) + "".join(
        "\tffffffff8%07x %s\n" % (i, s) for i, s in enumerate(chain)) + "\n"
text = (
    # the proxy (pid 100): the TUN read's copy, twice, and the TUN write's copy, once
    sample(100, ["_copy_to_iter", "__skb_datagram_iter", "skb_copy_datagram_iter",
                 "tun_do_read", "tun_chr_read_iter", "io_read"]) * 2 +
    sample(100, ["_copy_from_iter", "copy_page_from_iter", "skb_copy_datagram_from_iter",
                 "tun_get_user", "tun_chr_write_iter"]) +
    # the proxy copying for a socket (not the TUN's), a copy leaf called by the wrong side
    sample(100, ["_copy_from_iter", "tcp_sendmsg_locked", "tcp_sendmsg"]) +
    sample(100, ["_copy_from_iter", "tun_do_read"]) +
    # iperf3 (pid 200): its socket copy; a TUN read's copy in another process is not ours
    sample(200, ["_copy_to_iter", "tcp_recvmsg"]) +
    sample(200, ["_copy_to_iter", "skb_copy_datagram_iter", "tun_do_read"]) +
    # netfilter in any process: counted whatever the pid
    sample(200, ["__nf_conntrack_find_get", "nf_conntrack_in", "nf_hook_slow"]) +
    sample(300, ["nf_nat_ipv4_local_fn", "nf_hook_slow"]) +
    sample(100, ["ipv4_conntrack_defrag", "nf_hook_slow"]) +
    # what a hook calls is the hook's cost: a leaf outside netfilter under nf_hook_slow
    sample(100, ["ip_route_me_harder", "nf_nat_ipv4_local_fn", "nf_hook_slow",
                 "__ip_local_out"]) +
    # idle, a header with no chain, a frame with no symbol
    sample(0, ["pvm_safe_halt_hc", "default_idle"]) +
    " 100    %d \n\n" % P +
    " 100    %d \n\tffffffff81000000 \n\n" % P)
acc = perfcopy.account(text, 100)
check("14 samples read", acc["samples"] == 14, str(acc["samples"]))
check("the proxy's TUN copies: its 3 under tun_do_read / tun_get_user, no other",
      abs(acc["copies_s"] - 3 * P / 1e9) < 1e-12, "%.4f s" % acc["copies_s"])
check("netfilter: 4 samples in any process, its callees' included",
      abs(acc["netfilter_s"] - 4 * P / 1e9) < 1e-12,
      "%.4f s" % acc["netfilter_s"])
check("the total: every sample's period", abs(acc["total_s"] - 14 * P / 1e9) < 1e-12)
check("no pid: no copies", perfcopy.account(text, None)["copies_s"] == 0)
check("another pid's TUN read counts for it",
      abs(perfcopy.account(text, 200)["copies_s"] - P / 1e9) < 1e-12)
odd = perfcopy.account(" 100 %d \n\tffff _copy_to_iter\n\tffff tun_do_read\n" % P, 100)
check("the last sample without a blank line after it", odd["copies_s"] == P / 1e9)

# The forms kernels and builds give the same work: a copy primitive as the leaf under the
# copy function, a GCC clone of the TUN's read, netfilter without its hook frame (nftables,
# iptables, conntrack), a copy whose chain passes through netfilter (a copy), user-space and
# unresolved frames as perf prints them.
more = (
    sample(100, ["rep_movs_alternative", "_copy_to_iter", "__skb_datagram_iter",
                 "tun_do_read.isra.0", "tun_chr_read_iter"]) +
    sample(100, ["copy_user_enhanced_fast_string", "_copy_from_iter", "tun_get_user.part.0"]) +
    sample(100, ["_copy_from_iter", "tun_get_user", "nf_hook_slow"]) +
    sample(300, ["nft_do_chain", "nft_do_chain_inet"]) +
    sample(300, ["ipt_do_table"]) +
    sample(300, ["__nf_conntrack_find_get"]) +
    sample(100, ["tcp_ack", "tcp_rcv_established"]) +
    " 100    %d \n\t           f82ad read\n\t7eeecf3ac8893712 [unknown]\n\n" % P)
acc = perfcopy.account(more, 100)
check("a primitive under the copy, a clone of the TUN's function: copies (3)",
      abs(acc["copies_s"] - 3 * P / 1e9) < 1e-12, "%.4f s" % acc["copies_s"])
check("nftables, iptables and conntrack without the hook frame: netfilter (3)",
      abs(acc["netfilter_s"] - 3 * P / 1e9) < 1e-12, "%.4f s" % acc["netfilter_s"])
check("user-space and unresolved frames read as a sample", acc["samples"] == 8 and
      perfcopy.samples(more)[-1][2] == ["read", "[unknown]"], str(perfcopy.samples(more)[-1]))
odd = perfcopy.account(sample(100, ["memcpy_orig", "tun_get_user"]) +
                       sample(100, ["tcp_ack"]), 100)
check("TUN I/O in the profile but no copy the rules know: no figure (None), not 0",
      odd["copies_s"] is None)
check("no TUN I/O in the pid's samples: 0 copies",
      perfcopy.account(sample(100, ["tcp_ack"]), 100)["copies_s"] == 0)

# perfcopy.profile: the perf command line and its failure, with a stand-in perf on PATH
fake = os.path.join(d, "fakebin")
os.makedirs(fake)
with open(os.path.join(fake, "perf"), "w") as f:
    f.write("#!/bin/sh\n"
            "[ \"$*\" = \"script --no-inline -i $PERFCOPY_WANT -F pid,period,ip,sym\" ] "
            "|| { echo \"bad args: $*\" >&2; exit 3; }\n"
            "cat \"$PERFCOPY_TEXT\"\n")
os.chmod(os.path.join(fake, "perf"), 0o755)
with open(os.path.join(d, "script.txt"), "w") as f:
    f.write(text)
os.environ.update(PATH=fake + ":" + os.environ["PATH"], PERFCOPY_WANT="/x/run.data",
                  PERFCOPY_TEXT=os.path.join(d, "script.txt"))
got = perfcopy.profile("/x/run.data", 100)
check("profile(): perf script --no-inline -F pid,period,ip,sym of the file, read",
      got is not None and got["samples"] == 14 and abs(got["copies_s"] - 3 * P / 1e9) < 1e-12,
      str(got))
check("profile(): perf failing gives None", perfcopy.profile("/y/other.data", 100) is None)

# -- 2: the bound
b = perfcopy.bound(2, 1.95, 0.5, 0.02, 0.15)
want = (2 / 1.95) * 0.5 / (0.5 - 0.02 + 0.15)
check("the bound: (N/B) x S / (S - F + C)", abs(b - want) < 1e-12, "%.4f" % b)
check("no copies, no netfilter, the testbed full: 1.0",
      abs(perfcopy.bound(2, 2.0, 0.5, 0.0, 0.0) - 1.0) < 1e-12)
check("a missing figure, nothing busy or no work left: no bound",
      perfcopy.bound(2, None, 0.5, 0.02, 0.1) is None and
      perfcopy.bound(2, 1.9, 0.5, None, 0.1) is None and
      perfcopy.bound(2, 0.0, 0.5, 0.02, 0.1) is None and
      perfcopy.bound(2, 2.0, 0.1, 0.2, 0.05) is None and
      perfcopy.bound(None, 1.9, 0.5, 0.02, 0.1) is None)

# -- 3: a redrawn run
def synth(path, with_nf=True):
    subj = [{"stack": "veth", "io_mode": "offload", "queues": 1, "label": "veth"},
            {"stack": "reflector", "io_mode": "offload", "queues": 1, "label": "reflector"},
            {"stack": "redirect", "io_mode": "offload", "queues": 1, "label": "redirect"},
            {"stack": "system", "io_mode": "offload", "queues": 2, "label": "system"}]
    meta = {"schema": 2, "tool": "twinstack bench (bench/rig.py)", "binary": binary,
            "started_utc": "2026-12-05T00:00:00Z", "duration_s": 60.0, "mode": "full",
            "repetitions": 2, "subjects": subj, "io_mode": "offload", "queues": 1,
            "ceiling_io_mode": "offload", "bulk_cells": [["up", 16]],
            "host": {"kernel": "6.18", "cpus": 2, "machine": "x86_64"},
            "iperf3": {"seconds": 5, "omit": 1},
            "tcp_congestion": {"testbed": "reno", "host_default": "bbr"},
            "idle_wakeup_window_s": 20, "hold_conns": 1000, "hold_conns_scale": [],
            "load_seconds": 5, "not_measured": [], "failures": [], "notes": []}
    S = []
    def add(stack, q, metric, v1, v2):
        S.append({"key": [stack, "offload", q, "tcp_bulk", "up", 16, metric],
                  "values": [[1, v1], [2, v2]]})
    add("redirect", 1, "throughput_gbps", 30.0, 32.0)
    add("redirect", 1, "testbed_cpus_busy", 1.95, 2.0)
    add("redirect", 1, "testbed_cpu_s_per_gb", 0.5, 0.45)
    if with_nf:
        add("redirect", 1, "netfilter_cpu_s_per_gb", 0.02, 0.025)
    add("system", 2, "throughput_gbps", 24.0, 25.0)
    add("system", 2, "tun_copy_cpu_s_per_gb", 0.15, 0.12)
    # round 1: the proxy's run read more CPUs busy than the testbed has (2.1 > 2)
    add("system", 2, "testbed_cpus_busy", 2.1, 1.9)
    add("system", 2, "netfilter_cpu_s_per_gb", 0.0, 0.0)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": [], "samples": S}, f)

def redraw(path):
    r = subprocess.run([binary, "bench", "--report-from", path], capture_output=True,
                       text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr

synth(os.path.join(d, "nf", "results.json"))
rc, so = redraw(os.path.join(d, "nf", "results.json"))
check("--report-from a run with profiles exits 0", rc == 0, so.strip()[-300:])
b1 = (2.1 / 1.95) * 0.5 / (0.5 - 0.02 + 0.15)     # N: the proxy's own 2.1 CPUs busy
b2 = (2 / 2.0) * 0.45 / (0.45 - 0.025 + 0.12)
j = json.load(open(os.path.join(d, "nf", "results.json")))
row = [r for r in j["rows"] if r["stack"] == "system" and r["metric"] == "tun_copy_bound"]
check("results.json: the bound's row, per round paired with the redirect's, N the higher "
      "of the CPU count and the proxy's own CPUs busy",
      len(row) == 1 and row[0]["n"] == 2 and abs(row[0]["min"] - min(b1, b2)) < 1e-9 and
      abs(row[0]["max"] - max(b1, b2)) < 1e-9, str(row)[:200])
rep = open(os.path.join(d, "nf", "report.md")).read()
check("report.md: the section", "## The TUN's copies: a bound from the profiles (--perf)"
      in rep)
med = (b1 + b2) / 2
line = [l for l in rep.splitlines() if l.startswith("| system | up | 16 | 0.135 ")]
check("report.md: the cell's row with the copies, the redirect's figures and the bound",
      len(line) == 1 and "%.3f" % med in line[0] and "0.475" in line[0], str(line))
check("report.md: the bulk target names the bound",
      "(the TUN's copies allow at most %.3f)" % med in rep)

synth(os.path.join(d, "nonf", "results.json"), with_nf=False)
rc, so = redraw(os.path.join(d, "nonf", "results.json"))
rep = open(os.path.join(d, "nonf", "report.md")).read()
check("without the redirect's profile: no bound, no section", rc == 0 and
      "TUN's copies" not in rep and "tun_copy_bound" not in
      open(os.path.join(d, "nonf", "results.json")).read())

# --via socks5: the via subjects against the redirect through the same server, and the plain
# client through it; the direct stack gets no bound (no direct redirect in that run).
def synth_s5(path):
    subj = [{"stack": "socks5-client", "io_mode": "offload", "queues": 1,
             "label": "plain socks5"},
            {"stack": "redirect", "io_mode": "offload-socks5", "queues": 1,
             "label": "redirect via socks5"},
            {"stack": "system", "io_mode": "offload", "queues": 2, "label": "system"},
            {"stack": "system", "io_mode": "offload-socks5", "queues": 2,
             "label": "system via socks5"}]
    meta = {"schema": 2, "tool": "twinstack bench (bench/rig.py)", "binary": binary,
            "started_utc": "2026-12-05T00:00:00Z", "duration_s": 60.0, "mode": "socks5",
            "repetitions": 2, "subjects": subj, "io_mode": "offload", "queues": 1,
            "ceiling_io_mode": None, "bulk_cells": [["up", 16]],
            "host": {"kernel": "6.18", "cpus": 2, "machine": "x86_64"},
            "iperf3": {"seconds": 5, "omit": 1},
            "tcp_congestion": {"testbed": "reno", "host_default": "bbr"},
            "idle_wakeup_window_s": 20, "hold_conns": 1000, "hold_conns_scale": [],
            "load_seconds": 5, "not_measured": [], "failures": [], "notes": [],
            "socks5": {"server": "danted 1.4.3", "address": "10.99.0.2:1080",
                       "tcp_client": "proxychains4 -q -f FILE iperf3",
                       "udp_client": "twinstack load udp --socks5", "udp_size": 64,
                       "udp_seconds": 5}}
    S = []
    def add(stack, io, q, metric, v1, v2):
        S.append({"key": [stack, io, q, "tcp_bulk", "up", 16, metric],
                  "values": [[1, v1], [2, v2]]})
    add("socks5-client", "offload", 1, "throughput_gbps", 20.0, 20.0)
    add("redirect", "offload-socks5", 1, "throughput_gbps", 16.0, 15.0)
    add("redirect", "offload-socks5", 1, "testbed_cpus_busy", 2.0, 2.0)
    add("redirect", "offload-socks5", 1, "testbed_cpu_s_per_gb", 0.8, 0.8)
    add("redirect", "offload-socks5", 1, "netfilter_cpu_s_per_gb", 0.0, 0.0)
    add("system", "offload", 2, "throughput_gbps", 25.0, 25.0)
    add("system", "offload", 2, "tun_copy_cpu_s_per_gb", 0.1, 0.1)
    add("system", "offload-socks5", 2, "throughput_gbps", 12.0, 12.0)
    add("system", "offload-socks5", 2, "tun_copy_cpu_s_per_gb", 0.2, 0.2)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": [], "samples": S}, f)

synth_s5(os.path.join(d, "s5", "results.json"))
rc, so = redraw(os.path.join(d, "s5", "results.json"))
check("--report-from a --via socks5 run with profiles exits 0", rc == 0, so.strip()[-300:])
j = json.load(open(os.path.join(d, "s5", "results.json")))
def med(stack, io, metric):
    r = [r for r in j["rows"] if (r["stack"], r["io_mode"], r["metric"]) == (stack, io, metric)]
    return r[0]["median"] if r else None
bv = 0.8 / (0.8 + 0.2)            # (2/2) x 0.8 / (0.8 - 0 + 0.2), both rounds
bp = (bv * 16 / 20 + bv * 15 / 20) / 2
check("via socks5: the bound against the redirect through the server",
      med("system", "offload-socks5", "tun_copy_bound") is not None and
      abs(med("system", "offload-socks5", "tun_copy_bound") - bv) < 1e-9)
check("via socks5: over the plain client, times the redirect's fraction of it per round",
      med("system", "offload-socks5", "tun_copy_bound_plain") is not None and
      abs(med("system", "offload-socks5", "tun_copy_bound_plain") - bp) < 1e-9)
check("via socks5: the direct stack is not bounded by the redirect through the server",
      med("system", "offload", "tun_copy_bound") is None)
rep = open(os.path.join(d, "s5", "report.md")).read()
check("via socks5: the target line names the bound over the plain client",
      "(the TUN's copies allow at most %.3f)" % bp in rep)
check("via socks5: the section, its row with both bounds", re.search(
      r"^\| system via socks5 \| up \| 16 \| 0\.200 \| 0\.800 \| 0\.000 \| %.3f \| "
      r"0\.775 .*\| %.3f .*\| 0\.600 .*\|$" % (bv, bp), rep, re.M) is not None)
sys.exit(1 if bad else 0)
PY
