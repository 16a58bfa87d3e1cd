"""launch.py — how the comparison rig starts and stops each kind of subject (bench/subjects.py
KINDS) in the testbed: the bare veth routes the target over the veth; the reflector is
`twinstack reflect`; the redirect baseline is `twinstack redirect` behind an nftables
REDIRECT rule set; an external subject (--subject) is its own command line, its TUN found
and addressed by the rig; a stack is `twinstack run` with a configuration written from the
subject's fields, its TUN checked from the kernel's side and the target routed into it; the
plain SOCKS5 client needs nothing started. Launcher.start and Launcher.stop pick the code per
kind from one table: a new kind of subject adds its pair there.

Python 3 standard library only.
"""

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import time

from rigtb import (B_VETH4, BESIDE_STATS_PORT, GW4, MARK, REDIR_PORT, S5_PORT, STATS_PORT,
                   TARGET4, TUN_CIDR, UDP_PORT)

SETTLE_S = 0.5          # after a start, before the first measurement


class Running:
    """A started subject: its child process (None for a subject without one) and how long
    the child took to be ready (ms)."""

    def __init__(self, subj, child=None, startup_ms=None, pid=None):
        self.subj, self.child, self.startup_ms = subj, child, startup_ms
        self.engine_pid = pid

    @property
    def pid(self):
        """The measured process: the child, or (external) the process that holds the TUN."""
        if self.engine_pid is not None:
            return self.engine_pid
        return self.child.pid if self.child is not None else None

    def exited(self):
        """The child's exit status if it has exited, else None."""
        if self.child is None:
            return None
        return self.child.poll()


class Launcher:
    """Starts subjects in testbed tb (namespace A) with binary (bench/servers.py Binary);
    configurations and child logs go to work; notes about what could not be verified go to
    results."""

    def __init__(self, tb, binary, work, results):
        self.tb, self.binary, self.work, self.results = tb, binary, work, results
        self.kinds = {
            "veth": (self.start_veth, self.stop_child),
            "reflector": (self.start_reflector, self.stop_child),
            "stack": (self.start_stack, self.stop_child),
            "redirect": (self.start_redirect, self.stop_redirect),
            "external": (self.start_external, self.stop_external),
            "socks5-client": (self.start_socks5_client, self.stop_child),
        }

    def start(self, subj):
        """Start subj and point the target's route where its traffic goes. Returns a Running,
        or raises RuntimeError with anything it started stopped again."""
        return self.kinds[subj.kind][0](subj)

    def stop(self, running):
        if running is not None:
            self.kinds[running.subj.kind][1](running)

    def missing(self, subj):
        """Why subj cannot be started with this binary, or None."""
        if subj.kind == "reflector" and not self.binary.has_reflect:
            return "`twinstack reflect` not in this binary"
        if subj.kind == "redirect":
            if not self.binary.has_redirect:
                return "`twinstack redirect` not in this binary"
            if subj.via_socks5 and not self.binary.redirect_socks5:
                return "`twinstack redirect --socks5` not in this binary"
            if not shutil.which("nft"):
                return "nft not installed (Debian package nftables)"
        return None

    # -- per kind
    def start_veth(self, subj):
        self.tb.route_target_via_veth()
        return Running(subj)

    def start_socks5_client(self, subj):
        self.tb.route_target_via_veth()  # unused by its traffic, which goes to dante
        return Running(subj)

    def start_reflector(self, subj):
        cfg = os.path.join(self.work, "%s.json" % subj.slug)
        self.write_reflect_config(subj, cfg)
        return self.checked(subj, *self.start_child("reflect", cfg, subj.slug))

    def start_stack(self, subj):
        cfg = os.path.join(self.work, "%s.json" % subj.slug)
        self.write_config(subj, cfg)
        running = self.checked(subj, *self.start_child("run", cfg, subj.slug, subj.binary))
        try:
            self.tb.route_target_via_tun()
        except RuntimeError:
            self.stop(running)
            raise
        return running

    def start_redirect(self, subj, standby=False):
        """`twinstack redirect` on A's loopback, then the rule set that sends the target's TCP
        to it (the target stays routed over the veth: the rule needs a route to match). It has
        no ready byte: ready is its listener in the kernel (10 s at most). Via SOCKS5 its
        outbound is the testbed's SOCKS5 server (CONNECT), from the same marked sockets.
        Direct, it also forwards the UDP echo port's datagrams to the target's echo server
        (--udp-listen, --udp-to): the cheapest userspace UDP hop. standby: beside a running
        proxy (beside_on/beside_off), with stats on a port of its own, the route and the
        rule set left alone until beside_on."""
        stats = BESIDE_STATS_PORT if standby else STATS_PORT
        if not standby:
            self.tb.route_target_via_veth()
        t0 = time.monotonic()
        p = self.tb.spawn(self.tb.ns_a, [self.binary.path, "redirect", "--listen",
                                         "127.0.0.1:%d" % REDIR_PORT, "--mark", str(MARK),
                                         "--stats", "127.0.0.1:%d" % stats] +
                          (["--socks5", "%s:%d" % (B_VETH4, S5_PORT)] if subj.via_socks5
                           else ["--udp-listen", "127.0.0.1:%d" % REDIR_PORT,
                                 "--udp-to", "%s:%d" % (TARGET4, UDP_PORT)]),
                          "%s%s.log" % (subj.slug, "-beside" if standby else ""))
        try:
            if not self.tb.wait_listen(self.tb.ns_a, "tcp", REDIR_PORT, fatal=False) or \
                    not self.tb.wait_listen(self.tb.ns_a, "tcp", stats, fatal=False):
                raise RuntimeError("redirect: not listening within 10 s (exit %s)" % p.poll())
            if not standby:
                self.tb.redirect_on(udp=not subj.via_socks5)
        except RuntimeError:
            self.tb.stop(p)
            if not standby:
                self.tb.redirect_off()
            raise
        return Running(subj, p, (time.monotonic() - t0) * 1000)

    # -- a baseline beside a running proxy (bench/runner.py Beside)
    def start_beside(self, base):
        """Start baseline base for runs beside a proxy that stays up: the redirect on
        standby; the plain SOCKS5 client needs nothing (its traffic goes to the server's
        address, never routed into a TUN). A Running."""
        if base.kind == "redirect":
            return self.start_redirect(base, standby=True)
        return Running(base)

    def beside_on(self, base):
        """The target's TCP to baseline base from now on (the proxy stays up, idle)."""
        if base.kind == "redirect":
            self.tb.route_target_via_veth()
            self.tb.redirect_on(udp=False)

    def beside_off(self, base):
        """The target back into the TUN, to the proxy."""
        if base.kind == "redirect":
            self.tb.redirect_off()
            self.tb.route_target_via_tun()

    def stop_redirect(self, running):
        self.tb.redirect_off()
        self.stop_child(running)

    def external_fields(self):
        """The values of --subject's placeholders in this testbed."""
        ip, _, prefix = TUN_CIDR.partition("/")
        return {"tun": self.tb.tun, "addr": TUN_CIDR, "ip": ip, "prefix": prefix, "mtu": 1500,
                "mark": MARK, "socks5": "%s:%d" % (B_VETH4, S5_PORT), "socks5_host": B_VETH4,
                "socks5_port": S5_PORT}

    def start_external(self, subj):
        """COMMAND under sh -c in A, in a session of its own (stopped as a group). Ready: a
        process in A holds the TUN (10 s at most); that process is the one measured. The rig
        then gives the TUN its address if the command did not, sets it up with the queue
        length every subject gets, and routes the target into it."""
        cmd = subj.command.format(**self.external_fields())
        t0 = time.monotonic()
        p = self.tb.spawn(self.tb.ns_a, ["sh", "-c", cmd], "%s.log" % subj.slug,
                          start_new_session=True)
        pid = None
        try:
            deadline = t0 + 10
            while time.monotonic() < deadline and p.poll() is None:
                pid = self.tun_holder()
                if pid is not None:
                    break
                time.sleep(0.05)
            if pid is None:
                raise RuntimeError("%s: no process holds TUN %s within 10 s (%s); log: %s" % (
                    subj.label, self.tb.tun, "exited %s" % p.poll() if p.poll() is not None
                    else "still running", self.log_tail(subj.slug)))
            ms = (time.monotonic() - t0) * 1000
            addrs = self.tb.sh(["ip", "-4", "-o", "addr", "show", "dev", self.tb.tun],
                               ns=self.tb.ns_a, check=False).stdout
            if not re.search(r"inet %s/" % re.escape(GW4), addrs):
                self.tb.sh(["ip", "addr", "replace", TUN_CIDR, "dev", self.tb.tun],
                           ns=self.tb.ns_a)
            # Its own MTU is kept: an engine is measured in the configuration it recommends.
            self.tb.sh(["ip", "link", "set", self.tb.tun, "txqueuelen", "10000", "up"],
                       ns=self.tb.ns_a)
            self.tb.route_target_via_tun()
            feat = self.tb.tun_offload()
            if feat:
                self.results.note_once("%s: its TUN has %s" % (subj.label, ", ".join(
                    "%s %s" % kv for kv in sorted(feat.items()))))
        except RuntimeError:
            self.stop_external(Running(subj, p))
            raise
        return Running(subj, p, ms, pid=pid)

    def tun_holder(self):
        """The pid of a process in A with this testbed's TUN open, or None."""
        r = self.tb.sh(["ip", "netns", "pids", self.tb.ns_a], check=False)
        for pid in r.stdout.split():
            try:
                if self.tb.tun_fds(int(pid)):
                    return int(pid)
            except ValueError:
                continue
        return None

    def log_tail(self, slug):
        try:
            with open(os.path.join(self.work, "%s.log" % slug), errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-3:]) or "(empty)"
        except OSError:
            return "(none)"

    def stop_external(self, running):
        """SIGTERM to the command's process group, SIGKILL after 3 s."""
        p = running.child if running else None
        if p is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 3), (signal.SIGKILL, 3)):
            if p.poll() is not None:
                break
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # anything of the group left behind
        except ProcessLookupError:
            pass
        self.tb.stop(p)

    def stop_child(self, running):
        if running.child is not None:
            self.tb.stop(running.child)

    # -- twinstack run / reflect
    def write_config(self, subj, path):
        cfg = {
            "stack": subj.stack,
            "tun": {"name": self.tb.tun, "address": TUN_CIDR, "mtu": 1500,
                    "txqueuelen": 10000, "queues": subj.queues, "offload": subj.tun_offload,
                    "gso_output": subj.gso_output, "rps": subj.rps},
            "outbounds": [{"tag": "direct", "type": "direct", "routing_mark": MARK}],
            "route": {"final": "direct"},
            # Sessions for the 10,000-connection hold; fds are fitted under RLIMIT_NOFILE.
            "budgets": {"tcp_sessions": 16384, "fds": 65536, "nat_entries": 262144},
            "nat": {"linger_ms": 2000, "port_quarantine_ms": 2000},
            "timeouts": {"connect_ms": 3000, "udp_idle_ms": 10000},
            "stats": {"listen": "127.0.0.1:%d" % STATS_PORT},
            "log": {"level": "warn"},
        }
        if not subj.fast_path:
            cfg["nat"]["fast_path"] = "off"
        if subj.via_socks5:
            # Everything to the SOCKS5 server: TCP by CONNECT, UDP by UDP ASSOCIATE.
            cfg["outbounds"] = [{"tag": "s5", "type": "socks5",
                                 "server": "%s:%d" % (B_VETH4, S5_PORT), "udp": True,
                                 "routing_mark": MARK}]
            cfg["route"] = {"final": "s5"}
        if subj.sniff:
            # A name rule to another outbound, for a name nobody sends: a connection it covers
            # is looked at (its name could change the route), and then goes direct as before.
            rule = {"domain_suffix": ["sniff.invalid"], "outbound": "block"}
            if subj.sniff == "idle":
                rule["port"] = [443]
            cfg["outbounds"].append({"tag": "block", "type": "reject"})
            cfg["route"] = {"final": "direct", "sniff": {"timeout_ms": 300}, "rules": [rule]}
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)

    def write_reflect_config(self, subj, path):
        cfg = {"tun": {"name": self.tb.tun, "address": TUN_CIDR, "mtu": 1500,
                       "txqueuelen": 10000, "queues": 1, "offload": subj.tun_offload},
               "log": {"level": "warn"}}
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)

    def start_child(self, kind, cfg_path, tag, exe=None):
        """Start `twinstack run|reflect` in A (exe: another twinstack binary than the run's,
        an A/B run's base); wait (10 s at most) for the ready byte. Returns (Popen,
        startup_ms) or raises RuntimeError."""
        rfd, wfd = os.pipe()
        t0 = time.monotonic()
        p = self.tb.spawn(self.tb.ns_a, [exe or self.binary.path, kind, "--config", cfg_path,
                                         "--ready-fd", str(wfd)], "%s.log" % tag,
                          pass_fds=(wfd,))
        os.close(wfd)
        sel = selectors.DefaultSelector()
        sel.register(rfd, selectors.EVENT_READ)
        got = b""
        deadline = t0 + 10
        try:
            while time.monotonic() < deadline:
                if sel.select(timeout=max(0.01, deadline - time.monotonic())):
                    got = os.read(rfd, 16)
                    break
        finally:
            sel.close()
            os.close(rfd)
        ms = (time.monotonic() - t0) * 1000
        if not got:
            rc = p.poll()
            self.tb.stop(p)
            tail = ""
            try:
                with open(os.path.join(self.work, "%s.log" % tag), errors="replace") as f:
                    tail = " | ".join(f.read().strip().splitlines()[-3:])
            except OSError:
                pass
            raise RuntimeError("%s %s: %s; log: %s" % (
                kind, tag, "exited %s before ready" % rc if rc is not None else
                "no ready byte within 10 s", tail))
        # the TUN exists now; make sure its queue length is what we asked for
        self.tb.sh(["ip", "link", "set", self.tb.tun, "txqueuelen", "10000"], ns=self.tb.ns_a,
                   check=False)
        return p, ms

    def checked(self, subj, child, ms):
        """The started child as a Running once its TUN is what subj asked for; else the child
        stopped and RuntimeError."""
        try:
            self.verify_tun(subj, child.pid)
        except RuntimeError:
            self.tb.stop(child)
            raise
        return Running(subj, child, ms)

    def verify_tun(self, subj, pid):
        """A child that silently fell back must not be measured under the wrong name: the TUN
        must have TSO and checksum offload exactly when offload was asked for (ethtool -k; a
        TUNSETOFFLOAD with CSUM|TSO4|TSO6 turns both on), and the child must hold subj.queues
        TUN fds (fdinfo `iff:` lines name the device)."""
        if not shutil.which("ethtool"):
            self.results.note_once("offload mode not verified: ethtool not installed")
        else:
            feat = self.tb.tun_offload()
            if len(feat) != 2:
                self.results.note_once("offload mode not verified: `ethtool -k` gave no "
                                       "TSO/checksum lines")
            else:
                want = subj.tun_offload
                if set(feat.values()) != {want}:
                    raise RuntimeError(
                        "asked for %s I/O but the TUN has tx-checksumming %s, "
                        "tcp-segmentation-offload %s (both should be %s): not measured" % (
                            subj.io_mode, feat["tx-checksumming"],
                            feat["tcp-segmentation-offload"], want))
        n = self.tb.tun_fds(pid)
        if n is None:
            self.results.note_once("queue count not verified: /proc/PID/fdinfo unreadable")
        elif n != subj.queues:
            raise RuntimeError("asked for %d queue%s but the child holds %d TUN fd%s: not "
                               "measured" % (subj.queues, "s" if subj.queues > 1 else "", n,
                                             "s" if n != 1 else ""))
