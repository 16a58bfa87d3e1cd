"""perfcopy.py — what a bulk run's profile (--perf) says about the TUN's cost floor.

Every byte a TUN proxy relays crosses the TUN twice: the kernel copies it out to the proxy
(`_copy_to_iter` under `tun_do_read`) and back in from the proxy (`_copy_from_iter` under
`tun_get_user`). The TUN character device has no zero-copy path for a userspace reader or
writer, so no TUN proxy can avoid these two copies. A terminating proxy without a TUN (the
redirect baseline) does not make them; it pays for nftables' REDIRECT instead (connection
tracking and NAT on every packet), which a TUN proxy does not.

From `perf script` of a system-wide cpu-clock profile (bench/workloads.py perf_start) this
module sums, in CPU seconds (each sample's period):
    copies     the samples of the subject's process whose leaf is one of the two copies,
               called (anywhere up the chain) from the TUN's read or write;
    netfilter  the samples of any process with netfilter (conntrack, NAT, the hooks,
               nftables) anywhere in the chain: the hooks' whole cost, what they call
               included.
bench/report.py turns them into a bound: throughput is CPUs busy over CPU seconds per GB, so
a TUN proxy in a cell can reach at most
    (N / B_red) x S_red / (S_red - F_red + C)
of the redirect baseline, where N is the testbed's CPU count (or the CPUs busy measured in
the proxy's own run where that reads higher: /proc/stat's busy time counts steal time and
spans iperf3's set-up as well, so a saturated testbed reads a little over N), B_red the
redirect's CPUs
busy, S_red its testbed CPU s/GB, F_red its netfilter s/GB and C the proxy's copies s/GB:
the redirect's work less its netfilter, plus the two copies, on every CPU the testbed has.

Python 3 standard library only.
"""

import re
import subprocess

COPY_CALLERS = {"_copy_to_iter": "tun_do_read", "_copy_from_iter": "tun_get_user"}
# What a copy function may call to move the bytes, by kernel and CPU (the copy is then the
# next frame up): the string-instruction and user-copy primitives, memcpy.
COPY_PRIMITIVE_RE = re.compile(r"^(rep_movs|copy_user|copy_mc|__?memcpy|memcpy|"
                               r"__memcpy|fast_string)")
# GCC's clone suffixes (tun_get_user.isra.0, ...): the function is the same.
CLONE_RE = re.compile(r"\.(isra|constprop|part|cold|lto_priv|llvm)(\.\d+)*$")
# netfilter's functions: the hooks, conntrack, NAT, nftables (nf_*, __nf_*, nft_*, ipt_*,
# ipv4_conntrack_*, ...)
NETFILTER_RE = re.compile(r"^_*(nf_|nft_|ipt_)|conntrack")
HEADER_RE = re.compile(r"^\s*(\d+)\s+(\d+)\s*$")
FRAME_RE = re.compile(r"^\t\s*[0-9a-f]+\s+(.*)$")


def samples(text):
    """The samples of `perf script -F pid,period,ip,sym` output: [(pid, period_ns,
    [symbol, ... leaf first])]. A sample is a header line (pid and period) followed by its
    call chain, one tab-indented frame (address, symbol) per line, and a blank line."""
    out, cur = [], None
    for line in text.splitlines():
        h = HEADER_RE.match(line)
        if h:
            cur = (int(h.group(1)), int(h.group(2)), [])
            out.append(cur)
            continue
        f = FRAME_RE.match(line)
        if f and cur is not None:
            cur[2].append(CLONE_RE.sub("", f.group(1).strip()) or "[unknown]")
        elif not line.strip():
            cur = None
    return out


def copy_frame(chain):
    """The index of the copy function a sample is in (the leaf, or the frame above a copy
    primitive the leaf is), or None."""
    for i, f in enumerate(chain[:3]):
        if f in COPY_CALLERS:
            return i
        if not COPY_PRIMITIVE_RE.search(f):
            return None
    return None


def account(text, pid):
    """{"copies_s", "netfilter_s", "total_s", "samples"} of perf script text (see samples);
    copies are pid's only: 0 without a pid, None when pid's samples were in the TUN's read
    or write but none of them in a copy the rules above know (a kernel whose copy functions
    have other names: no figure rather than a wrong one)."""
    copies = netfilter = total = 0
    tun_seen = False
    ss = samples(text)
    for p, period, chain in ss:
        total += period
        if not chain:
            continue
        mine = pid is not None and p == pid
        i = copy_frame(chain) if mine else None
        if mine and not tun_seen:
            tun_seen = any(f in ("tun_do_read", "tun_get_user") for f in chain)
        if i is not None and COPY_CALLERS[chain[i]] in chain[i + 1:]:
            copies += period
        elif any(NETFILTER_RE.search(f) for f in chain):
            netfilter += period
    return {"copies_s": None if tun_seen and copies == 0 else copies / 1e9,
            "netfilter_s": netfilter / 1e9, "total_s": total / 1e9, "samples": len(ss)}


def profile(path, pid, timeout=120):
    """account() of the perf.data file at path; None when perf script fails."""
    try:
        r = subprocess.run(["perf", "script", "--no-inline", "-i", path, "-F",
                            "pid,period,ip,sym"], capture_output=True, text=True,
                           errors="replace", timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return account(r.stdout, pid)


def bound(ncpu, red_busy, red_spg, red_nf_spg, copy_spg):
    """The most of the redirect baseline's throughput a TUN proxy can reach (see the module's
    text); None when an input is missing or the denominator is not positive."""
    if None in (ncpu, red_busy, red_spg, red_nf_spg, copy_spg) or red_busy <= 0:
        return None
    den = red_spg - red_nf_spg + copy_spg
    if den <= 0:
        return None
    return (ncpu / red_busy) * red_spg / den
