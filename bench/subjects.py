"""subjects.py — what the comparison rig measures: the Subject type and the subjects of each
kind of run.

A Subject is data. Its kind says how it is started (bench/launch.py picks the start per kind)
and which workloads apply; its fields say how it is configured: the TUN I/O mode (offload or
per-packet), the queue count, receive packet steering, the lwip stack's GSO output trains,
the outbound (direct or the testbed's SOCKS5 server) and route.sniff. Its identity in
results.json, (stack, io_mode, queues) and its label, is named from those fields here, once,
in the form results.json has always used (bench/report.py, `twinstack gate` and the committed
baselines read it): io_mode is the TUN I/O mode with a suffix for the one setting that
differs from the default ("offload-rx", "offload-norps", "offload-rps", "offload-socks5",
"offload-sniffidle", "offload-snifflook", "offload-userspace"; an A/B run's "offload-base"
and "offload-cand").

Python 3 standard library only.
"""

import dataclasses
import os
from typing import Optional

import report


@dataclasses.dataclass(frozen=True)
class Kind:
    """What a kind of subject is. tun: its traffic goes through the testbed's TUN; child:
    the rig starts a process for it (measured: CPU, RSS) and stops it after; stack: a
    twinstack proxy stack (`twinstack run`: /stats, startup time, idle wakeups, memory per
    connection); mirror: it answers the traffic itself (the reflector: no servers behind it,
    so only TCP bulk applies); tcp_only: it carries TCP only (the UDP workloads are n/a)."""
    tun: bool
    child: bool
    stack: bool = False
    mirror: bool = False
    tcp_only: bool = False


# A new kind of subject is a row here, its start and stop in bench/launch.py (Launcher.kinds)
# and the plan of the runs that measure it (below).
KINDS = {
    "veth": Kind(tun=False, child=False),           # the bare veth: the target routed over it
    "reflector": Kind(tun=True, child=True, mirror=True),   # `twinstack reflect`
    "stack": Kind(tun=True, child=True, stack=True),        # `twinstack run`, one stack
    # `twinstack redirect`: nftables REDIRECT to a kernel listener and the product's
    # dispatcher, direct outbound and relay; no TUN. The cheapest terminating proxy this
    # kernel allows: the bound a TUN proxy is measured against. Direct, it also carries the
    # UDP echo port through its forwarder (the cheapest userspace UDP hop); via SOCKS5 it
    # carries TCP only (Subject.tcp_only).
    "redirect": Kind(tun=False, child=True),
    "socks5-client": Kind(tun=False, child=False),  # --via socks5: a plain client, no TUN
    # --subject NAME=COMMAND: another TUN proxy, started by its command line (placeholders
    # for the TUN, its address and the SOCKS5 server: EXTERNAL_FIELDS)
    "external": Kind(tun=True, child=True),
    # --report-from: a subject of an earlier run of a kind this rig does not know (its rows
    # are redrawn; it is never started)
    "recorded": Kind(tun=False, child=False),
}

STACKS = ("system", "lwip")


def io_mode_name(offload, rps="auto", gso_output=True, via_socks5=False, sniff=None,
                 fast_path=True):
    """The io_mode results.json names a subject by (see the file comment)."""
    name = "offload" if offload else "per-packet"
    if not fast_path:
        return name + "-userspace"
    if not gso_output:
        return name + "-rx"
    if rps != "auto":
        return name + ("-rps" if rps == "on" else "-norps")
    if via_socks5:
        return name + "-socks5"
    if sniff:
        return name + "-sniff" + sniff
    return name


@dataclasses.dataclass(eq=False)
class Subject:
    """One measured thing. kind: a key of KINDS. stack: its name in results.json (the kind's
    name, or "system" / "lwip" for a stack). offload: tun.offload "on" (never "auto", so a
    refusal fails the start instead of silently measuring per-packet I/O) or "off"; for a
    subject without a TUN, the run's I/O mode, recorded so every row of a run carries it.
    queues: tun.queues. rps: tun.rps, "auto" (tries steering under load, keeps it where it
    pays) or fixed "off" / "on" (--ablation: what steering buys, and what trying it buys over
    either fixed setting). gso_output: the lwip stack's GSO output trains (tun.gso_output;
    --ablation turns them off once: what they buy). via_socks5: the outbound is the testbed's
    SOCKS5 server (TCP by CONNECT, UDP by UDP ASSOCIATE) instead of direct. sniff: route.sniff
    on, None (off), "idle" (a name rule that covers no port the workloads use: what sniffing
    costs when it looks at nothing) or "look" (one that covers every port: every connection
    waits for its first bytes and is looked at). fast_path: the system stack's in-kernel fast
    path (nat.fast_path: True leaves the default, "auto"; False writes "off", every segment
    through the userspace NAT, the stack as it is without the kernel's help).
    binary: the twinstack binary a stack is
    started from, None for the run's own; side: "base" or "cand" in an A/B run (bench/ab.py),
    where the same stack runs from two binaries: its io_mode then ends in "-base" / "-cand".
    io_mode and label default to the names derived from these fields; given, they are kept as
    they are (a recorded run)."""
    kind: str
    stack: str
    offload: bool = True
    queues: int = 1
    rps: str = "auto"
    gso_output: bool = True
    via_socks5: bool = False
    sniff: Optional[str] = None
    fast_path: bool = True
    label: Optional[str] = None
    io_mode: Optional[str] = None
    command: Optional[str] = None
    binary: Optional[str] = None
    side: Optional[str] = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError("unknown subject kind %r" % self.kind)
        if self.kind == "external" and self.io_mode is None:
            self.io_mode = "external"
        if self.io_mode is None:
            self.io_mode = io_mode_name(self.offload, self.rps, self.gso_output,
                                        self.via_socks5, self.sniff, self.fast_path)
            if self.side:
                self.io_mode += "-" + self.side
        if self.label is None:
            self.label = report.Subject(self.stack, self.io_mode, self.queues).label

    @classmethod
    def recorded(cls, stack, io_mode, queues=1, label=None):
        """A subject of an earlier run, from its results.json identity (--report-from: its
        rows are redrawn, it is never started, so only its kind and names matter)."""
        kind = "stack" if stack in STACKS else stack if stack in KINDS else "recorded"
        return cls(kind, stack, queues=queues, label=label, io_mode=io_mode)

    @property
    def key(self):
        return (self.stack, self.io_mode, self.queues)

    @property
    def slug(self):
        return self.label.replace(" ", "-")

    @property
    def has_tun(self):
        return KINDS[self.kind].tun

    @property
    def has_child(self):
        return KINDS[self.kind].child

    @property
    def is_stack(self):
        return KINDS[self.kind].stack

    @property
    def is_mirror(self):
        return KINDS[self.kind].mirror

    @property
    def tcp_only(self):
        return KINDS[self.kind].tcp_only or (self.kind == "redirect" and self.via_socks5)

    @property
    def tun_offload(self):
        """tun.offload for the config."""
        return "on" if self.offload else "off"

    def to_json(self):
        j = {"stack": self.stack, "io_mode": self.io_mode, "queues": self.queues,
             "label": self.label}
        if self.side:
            j.update({"side": self.side, "binary": self.binary})
        return j


# ---- the subjects of each kind of run -------------------------------------------------------

def veth_subject(offload, label=None):
    return Subject("veth", "veth", offload, label=label)


def reflector_subject(offload, label=None):
    return Subject("reflector", "reflector", offload, label=label)


def redirect_subject(offload, label="redirect", via_socks5=False):
    """The redirect baseline. It has no TUN, so offload only records the run's I/O mode.
    via_socks5: its outbound is the testbed's SOCKS5 server (`twinstack redirect --socks5`)."""
    return Subject("redirect", "redirect", offload, label=label, via_socks5=via_socks5)


def default_queues(stack, offload, cpus=None):
    """The queue count tun.queues "auto" (the default) picks for a stack started with these
    CPUs allowed (config_auto_queues in core/config.c): the system stack with offload a queue
    per CPU, at most two; lwIP and per-packet I/O one. The rig writes it into the config, so
    the launch check (one TUN fd per queue) holds the child to it and results.json keys the
    rows by it."""
    if stack != "system" or not offload:
        return 1
    n = len(cpus if cpus is not None else os.sched_getaffinity(0))
    return max(1, min(n, 2))


def ab_subject(name, offload, side, binary, cpus=None):
    """--ab: a stack started from binary, side "base" or "cand" (named "system base", ...),
    with the default queue count for the CPUs it will run on (cpus: a pinned proxy's)."""
    return Subject("stack", name, offload, label="%s %s" % (name, side), binary=binary,
                   side=side, queues=default_queues(name, offload, cpus))


def stack_subject(name, offload, label=None, **settings):
    """A stack ("system" or "lwip"); settings: the Subject fields that differ from the
    defaults (queues, rps, gso_output, via_socks5, sniff, fast_path). Without queues it runs
    the queue count the product's default picks here."""
    settings.setdefault("queues", default_queues(name, offload))
    return Subject("stack", name, offload, label=label, **settings)


# --subject NAME=COMMAND: the placeholders COMMAND may use, filled in per testbed by
# bench/launch.py (literal braces are written {{ and }}).
EXTERNAL_FIELDS = ("tun", "addr", "ip", "prefix", "mtu", "mark", "socks5", "socks5_host",
                   "socks5_port")
RESERVED_NAMES = set(KINDS) | set(STACKS) | {"ceiling", "micro"}
NAME_RE = r"[a-z][a-z0-9_-]{0,23}"


def parse_external(spec, via):
    """NAME=COMMAND of --subject as an external Subject; ValueError says what is wrong.
    via: the run's --via (the SOCKS5 placeholders need the testbed's SOCKS5 server)."""
    import re
    import string
    name, eq, cmd = spec.partition("=")
    if not eq or not cmd.strip():
        raise ValueError("--subject %r: expected NAME=COMMAND" % spec)
    if not re.fullmatch(NAME_RE, name) or name in RESERVED_NAMES:
        raise ValueError("--subject %r: NAME must match %s and not be one of %s" % (
            spec, NAME_RE, ", ".join(sorted(RESERVED_NAMES))))
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(cmd) if f is not None]
    except ValueError as e:
        raise ValueError("--subject %s: bad placeholder syntax (%s; write literal braces as "
                         "{{ and }})" % (name, e))
    for f in fields:
        if f not in EXTERNAL_FIELDS:
            raise ValueError("--subject %s: unknown placeholder {%s} (known: %s)" % (
                name, f, ", ".join("{%s}" % x for x in EXTERNAL_FIELDS)))
        if f.startswith("socks5") and via != "socks5":
            raise ValueError("--subject %s: {%s} needs --via socks5 (the testbed's SOCKS5 "
                             "server)" % (name, f))
    return Subject("external", name, True, label=name, command=cmd)


def plan_ablation(stacks):
    """--ablation: the baselines (veth, redirect), the reflector in both I/O modes, and every
    TUN I/O mode of each stack. Returns (subjects, veth, ceiling reflector)."""
    v, ceiling = veth_subject(True), reflector_subject(True)
    subjects = [v, redirect_subject(True), ceiling, reflector_subject(False)]
    if "system" in stacks:
        subjects += [stack_subject("system", False, queues=1),
                     stack_subject("system", True, queues=1),
                     stack_subject("system", True, rps="off", queues=1),
                     stack_subject("system", True, rps="on", queues=1),
                     stack_subject("system", True, queues=2)]
    if "lwip" in stacks:
        subjects += [stack_subject("lwip", False), stack_subject("lwip", True),
                     stack_subject("lwip", True, gso_output=False)]
    return subjects, v, ceiling


def plan_socks5(stacks, offload):
    """--via socks5: no veth or reflector: the baseline here is the plain SOCKS5 client
    through the same server; beside it the redirect baseline through the same server (the
    cheapest terminating proxy in front of it: the bound for any TUN proxy that ends the
    application's TCP); each stack runs direct (its usual figures) and via the server."""
    subjects = [Subject("socks5-client", "socks5-client", offload, label="plain socks5"),
                redirect_subject(offload, label="redirect via socks5", via_socks5=True)]
    for s in stacks:
        subjects += [stack_subject(s, offload, label=s),
                     stack_subject(s, offload, label=s + " via socks5", via_socks5=True)]
    return subjects, None, None


def plan_sniff(stacks, offload):
    """--sniff: each stack three ways, no baselines: the figures are ratios to the same stack
    with sniffing off."""
    subjects = []
    for s in stacks:
        subjects += [stack_subject(s, offload, label=s),
                     stack_subject(s, offload, label=s + " sniff idle", sniff="idle"),
                     stack_subject(s, offload, label=s + " sniff look", sniff="look")]
    return subjects, None, None


def plan_compare(stacks, offload, full=False):
    """A full or --quick run: the baselines (veth, redirect, reflector) and each stack, all in
    one I/O mode; a full run also the system stack without its in-kernel fast path ("system
    userspace": the userspace NAT alone)."""
    v = veth_subject(offload, label="veth")
    ceiling = reflector_subject(offload, label="reflector")
    subs = [v, redirect_subject(offload), ceiling]
    for s in stacks:
        subs.append(stack_subject(s, offload, label=s))
        if s == "system" and full:
            subs.append(stack_subject(s, offload, label="system userspace", fast_path=False))
    return subs, v, ceiling


def plan_beside_check(stacks, offload):
    """--beside-check: the redirect baseline and each stack, nothing else."""
    return [redirect_subject(offload)] + [stack_subject(s, offload, label=s)
                                          for s in stacks], None, None


def plan(mode, stacks, io_mode, externals=()):
    """The subjects of a run of this mode, in table order: (subjects, veth, the reflector
    the two-hop ceiling is computed from); the last two None where the run has no
    baselines. externals: --subject's Subjects, after ours (full, --quick, --via socks5)."""
    offload = io_mode == "offload"
    if mode == "ablation":
        return plan_ablation(stacks)
    if mode == "socks5":
        subs, v, c = plan_socks5(stacks, offload)
    elif mode == "sniff":
        return plan_sniff(stacks, offload)
    elif mode == "besidecheck":
        return plan_beside_check(stacks, offload)
    else:
        subs, v, c = plan_compare(stacks, offload, full=mode == "full")
    for e in externals:
        e.offload = offload
    return subs + list(externals), v, c
