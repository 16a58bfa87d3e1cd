"""launch.py — how the comparison rig starts and stops each kind of subject (bench/subjects.py
KINDS) in the testbed: the bare veth routes the target over the veth; the reflector is
`twinstack reflect`; a stack is `twinstack run` with a configuration written from the
subject's fields, its TUN checked from the kernel's side and the target routed into it; the
plain SOCKS5 client needs nothing started. Launcher.start and Launcher.stop pick the code per
kind from one table: a new kind of subject adds its pair there.

Python 3 standard library only.
"""

import json
import os
import selectors
import shutil
import time

from rigtb import B_VETH4, MARK, S5_PORT, STATS_PORT, TUN_CIDR

SETTLE_S = 0.5          # after a start, before the first measurement


class Running:
    """A started subject: its child process (None for a subject without one) and how long
    the child took to be ready (ms)."""

    def __init__(self, subj, child=None, startup_ms=None):
        self.subj, self.child, self.startup_ms = subj, child, startup_ms

    @property
    def pid(self):
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
        running = self.checked(subj, *self.start_child("run", cfg, subj.slug))
        try:
            self.tb.route_target_via_tun()
        except RuntimeError:
            self.stop(running)
            raise
        return running

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
            "budgets": {"tcp_sessions": 8192, "fds": 65536, "nat_entries": 262144},
            "nat": {"linger_ms": 2000, "port_quarantine_ms": 2000},
            "timeouts": {"connect_ms": 3000, "udp_idle_ms": 10000},
            "stats": {"listen": "127.0.0.1:%d" % STATS_PORT},
            "log": {"level": "warn"},
        }
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

    def start_child(self, kind, cfg_path, tag):
        """Start `twinstack run|reflect` in A; wait (10 s at most) for the ready byte.
        Returns (Popen, startup_ms) or raises RuntimeError."""
        rfd, wfd = os.pipe()
        t0 = time.monotonic()
        p = self.tb.spawn(self.tb.ns_a, [self.binary.path, kind, "--config", cfg_path, "--ready-fd",
                                         str(wfd)], "%s.log" % tag, pass_fds=(wfd,))
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
