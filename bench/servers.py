"""servers.py — the comparison rig's side of the binary under test and the servers every
subject is measured against: which subcommands and load modes the binary has (probe), the
iperf3 servers (several in B, one in A for the reflector), `twinstack load serve` (TCP and UDP
echo in B) and, for --via socks5, dante in B with the proxychains4 configuration of the
plain client.

Python 3 standard library only.
"""

import os
import re
import subprocess

from report import log
from rigtb import (B_VETH4, CLK_TCK, DANTED, ECHO_PORTS, IPERF_PORTS, REFL_IPERF_PORT,
                   S5_PORT, TARGET4, UDP_PORT)

LOAD_MODES = ("serve", "connrate", "latency", "hold", "udp", "udpflows")


class Binary:
    """What the twinstack binary under test offers, read from its --help texts."""

    def __init__(self, path, ablation):
        self.path = path
        r = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10)
        cmds = set()
        for line in (r.stdout + r.stderr).splitlines():
            m = re.match(r"^\s{2}(\w+)\s", line)
            if m:
                cmds.add(m.group(1))
        self.has_run = "run" in cmds
        self.has_reflect = "reflect" in cmds
        self.has_redirect = "redirect" in cmds
        self.redirect_socks5 = False    # `twinstack redirect --socks5` exists
        if self.has_redirect:
            r = subprocess.run([path, "redirect", "--help"], capture_output=True, text=True,
                               timeout=10)
            self.redirect_socks5 = "--socks5" in r.stdout + r.stderr
        self.load_modes = set()
        self.load_socks5 = False    # `twinstack load udp --socks5` exists
        if "load" in cmds and not ablation:
            r = subprocess.run([path, "load", "--help"], capture_output=True, text=True,
                               timeout=10)
            txt = r.stdout + r.stderr
            for m in LOAD_MODES:
                if re.search(r"\b%s\b" % m, txt):
                    self.load_modes.add(m)
            self.load_socks5 = "--socks5" in txt
        micro = os.path.join(os.path.dirname(path), "twinstack-micro")
        self.micro = micro if os.path.exists(micro) else None

    def has_load(self, mode):
        return "serve" in self.load_modes and mode in self.load_modes


class Servers:
    """The servers in the testbed tb for binary (a Binary); via: --via socks5. start()
    drops the load modes when `load serve` does not come up (those workloads are n/a)."""

    def __init__(self, tb, binary, work, via):
        self.tb, self.binary, self.work, self.via = tb, binary, work, via
        self.iperf_port_i = 0
        self.serve = None
        self.dante = None           # --via socks5: the danted process in B
        self.pc_conf = None         # --via socks5: the plain client's proxychains4 config

    def start(self):
        tb = self.tb
        self.iperf_b = []
        for p in IPERF_PORTS:
            self.iperf_b.append(tb.spawn(tb.ns_b, ["iperf3", "-s", "-p", str(p)],
                                         "iperf3-b-%d.log" % p))
        self.iperf_a = tb.spawn(tb.ns_a, ["iperf3", "-s", "-p", str(REFL_IPERF_PORT)],
                                "iperf3-a.log")
        self.serve = None
        if "serve" in self.binary.load_modes:
            self.serve = tb.spawn(tb.ns_b, [self.binary.path, "load", "serve", "--bind",
                                            TARGET4, "--tcp-ports",
                                            ",".join(map(str, ECHO_PORTS)),
                                            "--udp-port", str(UDP_PORT)], "load-serve.log")
        if self.via:
            self.start_dante()
        for p in IPERF_PORTS:
            tb.wait_listen(tb.ns_b, "tcp", p)
        tb.wait_listen(tb.ns_a, "tcp", REFL_IPERF_PORT)
        if self.serve is not None:
            ok = all(tb.wait_listen(tb.ns_b, "tcp", p, fatal=False) for p in ECHO_PORTS)
            ok = ok and tb.wait_listen(tb.ns_b, "udp", UDP_PORT, fatal=False)
            if not ok:
                log("warning: `load serve` did not listen on every port; load workloads are n/a "
                    "(see %s)" % os.path.join(self.work, "load-serve.log"))
                tb.stop(self.serve)
                self.serve = None
                self.binary.load_modes = set()

    def start_dante(self):
        """--via socks5: Debian's dante-server in B on its veth address, in the foreground (no
        -D), config and pid file in work/, no authentication, CONNECT and UDP ASSOCIATE; and
        the proxychains4 config that points the plain client's iperf3 at it."""
        conf = os.path.join(self.work, "danted.conf")
        with open(conf, "w") as f:
            f.write("logoutput: stderr\n"
                    "internal: %s port = %d\n"
                    "external: %s\n"
                    "clientmethod: none\n"
                    "socksmethod: none\n"
                    "user.privileged: root\n"
                    "user.unprivileged: nobody\n"
                    "client pass { from: 0.0.0.0/0 to: 0.0.0.0/0 }\n"
                    "socks pass { from: 0.0.0.0/0 to: 0.0.0.0/0 "
                    "command: connect udpassociate udpreply }\n" % (B_VETH4, S5_PORT, B_VETH4))
        self.dante = self.tb.spawn(self.tb.ns_b, [DANTED, "-f", conf, "-p",
                                                  os.path.join(self.work, "danted.pid")],
                                   "danted.log")
        if not self.tb.wait_listen(self.tb.ns_b, "tcp", S5_PORT, fatal=False):
            raise RuntimeError("danted did not listen on %s:%d (see %s)" % (
                B_VETH4, S5_PORT, os.path.join(self.work, "danted.log")))
        self.pc_conf = os.path.join(self.work, "proxychains.conf")
        with open(self.pc_conf, "w") as f:
            f.write("strict_chain\ntcp_read_time_out 15000\ntcp_connect_time_out 8000\n"
                    "[ProxyList]\nsocks5 %s %d\n" % (B_VETH4, S5_PORT))

    def dante_cpu(self):
        """--via socks5: CPU seconds of the SOCKS5 server so far: the sum over every danted
        process in B of its own user + system time and that of its children it has reaped
        (the server forks negotiator, request and I/O children, which come and go: a child's
        time moves into its parent's when it is reaped, so the sum only grows)."""
        r = self.tb.sh(["ip", "netns", "pids", self.tb.ns_b], check=False, timeout=5)
        tot = 0.0
        for p in r.stdout.split():
            try:
                with open("/proc/%s/comm" % p) as f:
                    if f.read().strip() != "danted":
                        continue
                with open("/proc/%s/stat" % p) as f:
                    st = f.read()
            except OSError:
                continue
            fields = st[st.rindex(")") + 2:].split()
            # fields[0] is field 3: utime, stime, cutime, cstime are fields 14-17
            tot += sum(int(x) for x in fields[11:15]) / CLK_TCK
        return tot

    def next_iperf_port(self):
        p = IPERF_PORTS[self.iperf_port_i % len(IPERF_PORTS)]
        self.iperf_port_i += 1
        return p
