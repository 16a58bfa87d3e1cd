#!/usr/bin/python3
"""special.py: the clients of special.sh (python3 standard library only). Each prints one line
and exits 0 when the connection attempt was answered in time, 1 otherwise.

  connect --host H --port P --within S
        connect() to H:P; it must fail with ECONNREFUSED, EHOSTUNREACH or ENETUNREACH within
        S seconds (the line: the error and the time it took). The socket gives up at S + 1 s,
        so an unanswered SYN ends as "no answer" after its first retransmissions.
  syn6 --ifname IF --mac M --src A --dst B --port P --within S
        an IPv6 SYN from A to B:P written onto IF (AF_PACKET, to the link address M), for the
        destinations no application can connect to (Linux turns :: into ::1 and a mapped
        address into IPv4): the answer that comes back within S seconds, a RST for the SYN or
        an ICMPv6 error quoting it, and from which address.
"""
import argparse
import errno
import ipaddress
import select
import socket
import struct
import sys
import time

ETH_P_IPV6 = 0x86DD
FAST_ERRNOS = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)


def cmd_connect(args):
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(args.within + 1)
    t0 = time.monotonic()
    try:
        s.connect((args.host, args.port))
        print("connected after %d ms" % ((time.monotonic() - t0) * 1000))
        return 1
    except socket.timeout:
        print("no answer: connect still waiting after %d ms" % ((time.monotonic() - t0) * 1000))
        return 1
    except OSError as e:
        ms = (time.monotonic() - t0) * 1000
        name = errno.errorcode.get(e.errno, str(e.errno))
        print("%s after %d ms" % (name, ms))
        return 0 if e.errno in FAST_ERRNOS and ms <= args.within * 1000 else 1
    finally:
        s.close()


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def syn6(src, dst, sport, dport, seq):
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, 0x02, 64240, 0, 0)
    pseudo = src + dst + struct.pack("!I3xB", len(tcp), socket.IPPROTO_TCP)
    tcp = tcp[:16] + struct.pack("!H", csum(pseudo + tcp)) + tcp[18:]
    return struct.pack("!IHBB", 0x60000000, len(tcp), socket.IPPROTO_TCP, 64) + src + dst + tcp


def answer(pkt, src, dst, sport, dport, seq):
    """What pkt (an IPv6 packet) says about our SYN, or None when it is about something else."""
    if len(pkt) < 60:
        return None
    nh, frm = pkt[6], ipaddress.IPv6Address(pkt[8:24])
    if nh == socket.IPPROTO_TCP and pkt[24:40] == src and pkt[8:24] == dst and \
            struct.unpack("!HH", pkt[40:44]) == (dport, sport) and pkt[53] & 0x04:
        return "RST from %s" % frm
    if nh == 58 and pkt[40] < 128 and len(pkt) >= 48 + 48:
        inner = pkt[48:]
        if inner[8:24] == src and inner[24:40] == dst and inner[6] == socket.IPPROTO_TCP and \
                struct.unpack("!HHI", inner[40:48]) == (sport, dport, seq):
            return "ICMPv6 type %d code %d from %s" % (pkt[40], pkt[41], frm)
    return None


def cmd_syn6(args):
    src = ipaddress.IPv6Address(args.src).packed
    dst = ipaddress.IPv6Address(args.dst).packed
    sport, seq = 40000 + int(time.monotonic() * 1000) % 20000, 0x10203040
    mac = bytes.fromhex(args.mac.replace(":", ""))
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IPV6))
    rx.bind((args.ifname, ETH_P_IPV6))
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IPV6))
    t0 = time.monotonic()
    tx.sendto(syn6(src, dst, sport, args.port, seq), (args.ifname, ETH_P_IPV6, 0, 0, mac))
    end = t0 + args.within
    while True:
        left = end - time.monotonic()
        if left <= 0 or not select.select([rx], [], [], left)[0]:
            print("no answer within %d ms" % (args.within * 1000))
            return 1
        pkt, addr = rx.recvfrom(4096)
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        what = answer(pkt, src, dst, sport, args.port, seq)
        if what:
            print("%s after %d ms" % (what, (time.monotonic() - t0) * 1000))
            return 0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("connect")
    q.add_argument("--host", required=True)
    q.add_argument("--port", type=int, required=True)
    q.add_argument("--within", type=float, default=2.0)
    q.set_defaults(fn=cmd_connect)
    q = sub.add_parser("syn6")
    for a in ("--ifname", "--mac", "--src", "--dst"):
        q.add_argument(a, required=True)
    q.add_argument("--port", type=int, required=True)
    q.add_argument("--within", type=float, default=2.0)
    q.set_defaults(fn=cmd_syn6)
    args = p.parse_args()
    sys.exit(args.fn(args))


if __name__ == "__main__":
    main()
