#!/usr/bin/env python3
"""synflood.py — spoofed TCP SYNs written straight into a TUN device (AF_PACKET on the device:
the proxy reads exactly these bytes, as if a routed client had sent them).

Sources are drawn from --src (a CIDR the test owns and blackholes, so the proxy's SYN-ACKs go
nowhere); never random public addresses. Paced to --rate packets per second for --seconds.
Prints one JSON line: {"sent": N, "seconds": S}.
"""
import argparse
import ipaddress
import json
import random
import socket
import struct
import time

ETH_P_IP = 0x0800


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def syn(src, dst, sport, dport, seq):
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, 0x02, 64240, 0, 0)
    pseudo = struct.pack("!4s4sBBH", src, dst, 0, 6, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", csum(pseudo + tcp)) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), random.getrandbits(16), 0x4000,
                     64, 6, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    return ip + tcp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dev", required=True)
    ap.add_argument("--src", required=True, help="CIDR the spoofed sources come from")
    ap.add_argument("--dst", required=True)
    ap.add_argument("--dport", type=int, default=80)
    ap.add_argument("--rate", type=int, default=20000)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    net = ipaddress.ip_network(a.src)
    hosts = net.num_addresses
    base = int(net.network_address)
    dst = socket.inet_aton(a.dst)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))
    s.bind((a.dev, ETH_P_IP))
    # Pre-built packets, one distinct (source, port) each, sent in order: the sender, not the
    # checksum arithmetic, sets the pace, and every SYN is a new connection to the proxy.
    want = min(int(a.rate * a.seconds) + 1, 262144)
    pool = []
    for i in range(want):
        src = base + 1 + (i % (hosts - 2))
        sport = 1024 + (i // (hosts - 2)) % 64000
        pool.append(syn(struct.pack("!I", src), dst, sport, a.dport, random.getrandbits(32)))
    tried, sent, errors = 0, 0, 0
    start, batch = time.monotonic(), max(1, a.rate // 1000)
    end = start + a.seconds
    while True:
        now = time.monotonic()
        if now >= end:
            break
        due = int((now - start) * a.rate)
        while tried < due:
            for _ in range(min(batch, due - tried)):
                try:
                    s.send(pool[tried % len(pool)])
                    sent += 1
                except OSError:
                    errors += 1  # a full TUN queue: the packet is lost, as on a real link
                tried += 1
        time.sleep(0.0005)
    print(json.dumps({"sent": sent, "send_errors": errors,
                      "seconds": round(time.monotonic() - start, 2)}))


if __name__ == "__main__":
    main()
