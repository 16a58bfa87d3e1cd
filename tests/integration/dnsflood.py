#!/usr/bin/env python3
"""dnsflood.py — DNS queries the way a stub resolver sends them: every query from its own socket
on a distinct source port, paced to --count queries over --seconds, each waiting up to
--timeout for its answer.

Every answer is checked: same ID, QR set, RCODE 0, and the A record equals --expect. Prints one
JSON line: {"sent", "answered", "correct", "timeouts", "send_errors", "max_open", "seconds"}.
"""
import argparse
import json
import random
import selectors
import socket
import struct
import time


def query(qid, name):
    q = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\0" + struct.pack("!HH", 1, 1)


def skip_name(msg, off):
    while True:
        n = msg[off]
        if n == 0:
            return off + 1
        if n & 0xC0 == 0xC0:
            return off + 2
        off += 1 + n


def first_a(msg, qid):
    """The first A record of an answer to query qid, or None."""
    if len(msg) < 12:
        return None
    rid, flags, qd, an = struct.unpack("!HHHH", msg[:8])
    if rid != qid or not flags & 0x8000 or flags & 0x000F or an == 0:
        return None
    off = 12
    for _ in range(qd):
        off = skip_name(msg, off) + 4
    for _ in range(an):
        off = skip_name(msg, off)
        rtype, _cls, _ttl, rdlen = struct.unpack("!HHIH", msg[off:off + 10])
        off += 10
        if rtype == 1 and rdlen == 4:
            return socket.inet_ntoa(msg[off:off + 4])
        off += rdlen
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="resolver address the queries are sent to")
    ap.add_argument("--port", type=int, default=53)
    ap.add_argument("--name", default="test.twinstack")
    ap.add_argument("--unique", action="store_true",
                    help="query i asks q<i>.<name>: every question is new (no cache hit)")
    ap.add_argument("--expect", required=True, help="the A record every answer must carry")
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--base-port", type=int, default=20000,
                    help="query i is sent from port base + i: every source port is distinct")
    a = ap.parse_args()
    sel = selectors.DefaultSelector()
    sent = answered = correct = timeouts = send_errors = max_open = 0
    start = time.monotonic()
    deadline = {}  # socket -> (qid, time it gives up)

    def reap(now):
        nonlocal timeouts
        for s, (_qid, t) in list(deadline.items()):
            if now >= t:
                timeouts += 1
                sel.unregister(s)
                s.close()
                del deadline[s]

    while sent < a.count or deadline:
        now = time.monotonic()
        due = a.count if a.seconds <= 0 else min(a.count, int((now - start) * a.count / a.seconds) + 1)
        while sent < due:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                s.bind(("0.0.0.0", a.base_port + sent))
                qid = random.getrandbits(16)
                name = f"q{sent}.{a.name}" if a.unique else a.name
                s.sendto(query(qid, name), (a.server, a.port))
            except OSError:
                send_errors += 1
                s.close()
                sent += 1
                continue
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
            deadline[s] = (qid, now + a.timeout)
            sent += 1
        max_open = max(max_open, len(deadline))
        for key, _ev in sel.select(timeout=0.002):
            s = key.fileobj
            try:
                msg = s.recv(2048)
            except OSError:
                continue
            answered += 1
            if first_a(msg, deadline[s][0]) == a.expect:
                correct += 1
            sel.unregister(s)
            s.close()
            del deadline[s]
        reap(time.monotonic())
    print(json.dumps({"sent": sent, "answered": answered, "correct": correct,
                      "timeouts": timeouts, "send_errors": send_errors, "max_open": max_open,
                      "seconds": round(time.monotonic() - start, 2)}))


if __name__ == "__main__":
    main()
