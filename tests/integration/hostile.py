#!/usr/bin/env python3
"""hostile.py — malformed and hostile packets written straight into a TUN device.

An AF_PACKET socket (SOCK_DGRAM, protocol ETH_P_IP or ETH_P_IPV6) bound to the TUN sends on
it: the kernel queues the bytes to the TUN's reader unchanged, so the proxy reads exactly
these packets, as if an application behind the TUN had sent them. Standard library only.

Each class is a burst of --count + its index packets (every class a different number, so a
counter that moved by another class's amount names the mix-up). Every packet is well formed
except for the one defect its class is about (lengths, checksums and the other fields right),
so the defect alone decides where it is dropped. Addresses come from the command line; the
"foreign" destinations must be ones the test owns and routes into the TUN.

  --list            the class names, one a line
  --only A,B        only these classes
  --ready FILE      create FILE once every packet is built
  --go FILE         build every packet first, send once FILE exists (at most 30 s later)
  --sent FILE       create FILE once the last packet is sent (before waiting for answers)
  --answers A,B     these classes' packets (ACK segments of no connection) must each be answered
                    with a RST: count the answers the TUN carries back (waits --answer-wait
                    seconds at most after the last send for the missing ones)
Prints one JSON line: {"classes": {NAME: {"sent": N, "failed": N}}, "seconds": S}, with
"answered": N in each class of --answers.
"""
import argparse
import ctypes
import ipaddress
import json
import os
import random
import socket
import struct
import sys
import threading
import time

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
TCP_FIN, TCP_SYN, TCP_RST, TCP_PSH, TCP_ACK = 0x01, 0x02, 0x04, 0x08, 0x10

# Classic BPF on the TUN (no link-layer header: offset 0 is the IP header): TCP segments with
# RST set, IPv6 without extension headers or IPv4; everything else stays in the kernel, so a
# download through the same TUN does not crowd the answers out of the receive buffer.
RST_FILTER = [
    (0x30, 0, 0, 0),     # 0  ldb [0]
    (0x54, 0, 0, 0xF0),  # 1  and #0xf0
    (0x15, 0, 4, 0x60),  # 2  jeq #0x60 ? 3 : 7
    (0x30, 0, 0, 6),     # 3  ldb [6] (Next Header)
    (0x15, 0, 9, 6),     # 4  jeq #6 ? 5 : drop
    (0x30, 0, 0, 53),    # 5  ldb [40 + 13] (TCP flags)
    (0x45, 6, 7, 0x04),  # 6  jset #RST ? accept : drop
    (0x15, 0, 6, 0x40),  # 7  jeq #0x40 ? 8 : drop
    (0x30, 0, 0, 9),     # 8  ldb [9] (Protocol)
    (0x15, 0, 4, 6),     # 9  jeq #6 ? 10 : drop
    (0xB1, 0, 0, 0),     # 10 ldxb 4 * ([0] & 0xf)
    (0x50, 0, 0, 13),    # 11 ldb [x + 13] (TCP flags)
    (0x45, 0, 1, 0x04),  # 12 jset #RST ? accept : drop
    (0x06, 0, 0, 0xFFFF),  # 13 accept
    (0x06, 0, 0, 0),     # 14 drop
]


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


class Gen:
    """Packet builders over one random generator (seeded: a run can be repeated)."""

    def __init__(self, a, rng):
        self.a = a
        self.r = rng

    # --- layers ---------------------------------------------------------------------------

    def l4(self, proto, src, dst, sport, dport, flags=TCP_ACK, payload=b"", ulen=None):
        """A TCP (20-byte header) or UDP header, payload after it, its checksum right for
        src/dst; ulen: the UDP length field, when it is to be wrong."""
        r = self.r
        if proto == 6:
            seg = struct.pack("!HHIIBBHHH", sport, dport, r.getrandbits(32),
                              r.getrandbits(32) if flags & TCP_ACK else 0, 5 << 4, flags,
                              64240, 0, 0) + payload
            pseudo = self.pseudo(src, dst, 6, len(seg))
            return seg[:16] + struct.pack("!H", csum(pseudo + seg)) + seg[18:]
        length = 8 + len(payload)
        seg = struct.pack("!HHHH", sport, dport, length if ulen is None else ulen, 0) + payload
        pseudo = self.pseudo(src, dst, 17, len(seg))
        c = csum(pseudo + seg) or 0xFFFF
        return seg[:6] + struct.pack("!H", c) + seg[8:]

    @staticmethod
    def pseudo(src, dst, proto, n):
        if len(src) == 4:
            return struct.pack("!4s4sBBH", src, dst, 0, proto, n)
        return struct.pack("!16s16sIxxxB", src, dst, n, proto)

    def ip4(self, src, dst, proto, payload, options=b"", frag=0x4000, tot=None, ihl=None,
            good_csum=True):
        hl = 20 + len(options)
        h = struct.pack("!BBHHHBBH4s4s", 0x40 | ((hl // 4) if ihl is None else ihl), 0,
                        hl + len(payload) if tot is None else tot, self.r.getrandbits(16),
                        frag, 64, proto, 0, src, dst) + options
        c = csum(h)
        if not good_csum:
            c ^= 1 + self.r.randrange(0xFFFE)  # any other value
        return h[:10] + struct.pack("!H", c) + h[12:] + payload

    @staticmethod
    def ip6(src, dst, nh, payload, plen=None):
        return struct.pack("!IHBB16s16s", 0x60000000, len(payload) if plen is None else plen,
                           nh, 64, src, dst) + payload

    # --- addresses and ports --------------------------------------------------------------

    def port(self):
        return self.r.randrange(1024, 65536)

    def fport(self):
        """A port for a foreign destination: never 53 (DNS may be hijacked)."""
        p = self.r.randrange(1, 65536)
        return p if p != 53 else 54

    def tcp4(self, flags=TCP_ACK, payload=b"", src=None, dst=None, sport=None, dport=None,
             **kw):
        """An IPv4 TCP packet from the client to the foreign destination (or as given)."""
        a = self.a
        src, dst = src or a.client4, dst or a.dst4
        seg = self.l4(6, src, dst, sport or self.port(), dport or self.fport(), flags, payload)
        return self.ip4(src, dst, 6, seg, **kw)

    def udp4(self, payload=None, src=None, dst=None, sport=None, dport=None, **kw):
        a = self.a
        src, dst = src or a.client4, dst or a.dst4
        payload = self.r.randbytes(self.r.randrange(1, 64)) if payload is None else payload
        seg = self.l4(17, src, dst, sport or self.port(), dport or self.fport(), payload=payload)
        return self.ip4(src, dst, 17, seg, **kw)

    def tcp6_seg(self, src, dst, flags=TCP_ACK, sport=None, dport=None, payload=b""):
        return self.l4(6, src, dst, sport or self.port(), dport or self.fport(), flags, payload)

    def flags(self):
        return self.r.choice([TCP_SYN, TCP_ACK, TCP_ACK | TCP_PSH, TCP_SYN | TCP_ACK,
                              TCP_FIN | TCP_ACK])

    # --- IPv6 extension headers -----------------------------------------------------------

    def opts_hdr(self, nh, units=None):
        """A Hop-by-Hop or Destination Options header: PadN filling (units + 1) * 8 bytes."""
        units = self.r.randrange(0, 4) if units is None else units
        n = (units + 1) * 8 - 2
        return bytes([nh, units]) + bytes([1, n - 2]) + b"\0" * (n - 2)

    def routing_hdr(self, nh, segs_left, rtype=4):
        """A Routing header (Segment Routing type 4 by default) with one 16-byte address."""
        return bytes([nh, 2, rtype, segs_left, segs_left, 0, 0, 0]) + self.a.dst6

    def chain6(self, kinds, last_nh, tail):
        """Extension headers of the given kinds (0 HbH, 60 Destination, 43 Routing with
        Segments Left 0) in order, then tail (the upper-layer bytes, protocol last_nh)."""
        body = tail
        nh = last_nh
        for k in reversed(kinds):
            body = (self.routing_hdr(nh, 0) if k == 43 else self.opts_hdr(nh)) + body
            nh = k
        return nh, body

    # --- the classes ----------------------------------------------------------------------

    def c_v4_truncated(self):
        """Shorter than an IPv4 header (1-19 bytes), version 4."""
        n = self.r.randrange(1, 20)
        return bytes([0x40 | self.r.randrange(5, 16)]) + self.r.randbytes(n - 1)

    def c_v4_bad_ihl(self):
        """IHL below 5, or an IHL whose header is longer than the packet."""
        p = bytearray(self.tcp4(self.flags()))
        p[0] = 0x40 | (self.r.randrange(0, 5) if self.r.random() < 0.5 else 15)
        return bytes(p)

    def c_v4_bad_total_length(self):
        """Total length longer than the packet, or shorter than its header."""
        pkt = self.tcp4(self.flags())
        r = self.r
        tot = r.randrange(len(pkt) + 1, 65536) if r.random() < 0.5 else r.randrange(0, 20)
        return self.tcp4(self.flags(), tot=tot)

    def c_v4_bad_options(self):
        """A full 60-byte header whose option's length runs past the header's end (or is 0
        or 1)."""
        r = self.r
        k = r.randrange(3)
        if k == 0:  # Record Route claiming more than the 40 bytes of option space
            o = bytes([7, r.randrange(41, 256), 4]) + b"\0" * 37
        elif k == 1:  # Timestamp with a length of 0 or 1
            o = bytes([68, r.randrange(0, 2)]) + b"\0" * 38
        else:  # NOPs, then an option whose length passes the end by a few bytes
            o = b"\x01" * 32 + bytes([7, 8 + r.randrange(1, 9), 4]) + b"\0" * 5
        return self.tcp4(self.flags(), options=o)

    def c_v4_bad_checksum(self):
        """A well-formed SYN, segment or datagram with a wrong IPv4 header checksum."""
        if self.r.random() < 0.5:
            return self.tcp4(self.flags(), good_csum=False)
        return self.udp4(good_csum=False)

    def c_v4_fragment(self):
        """First fragments (MF, offset 0), later ones (offset > 0) and overlapping pairs."""
        r = self.r
        k = r.randrange(3)
        if k == 0:
            frag = 0x2000
        elif k == 1:
            frag = r.randrange(1, 0x2000) | (0x2000 if r.random() < 0.5 else 0)
        else:  # overlaps a first fragment: offset 1 (8 bytes) of a 20-byte TCP header
            frag = 0x2001
        if r.random() < 0.5:
            return self.tcp4(TCP_SYN, payload=r.randbytes(24), frag=frag)
        return self.udp4(payload=r.randbytes(24), frag=frag)

    def c_tcp_bad_data_offset(self):
        """TCP data offset beyond the segment (6-15 words in 20 bytes) or below 5; v4 and v6."""
        r = self.r
        doff = r.randrange(6, 16) if r.random() < 0.7 else r.randrange(0, 5)
        a = self.a
        if r.random() < 0.5:
            seg = bytearray(self.l4(6, a.client4, a.dst4, self.port(), self.fport(), self.flags()))
            seg[12] = doff << 4
            return self.ip4(a.client4, a.dst4, 6, bytes(seg))
        seg = bytearray(self.l4(6, a.client6, a.dst6, self.port(), self.fport(), self.flags()))
        seg[12] = doff << 4
        return self.ip6(a.client6, a.dst6, 6, bytes(seg))

    def c_udp_bad_length(self):
        """UDP length longer than the datagram, or under 8; v4 and v6."""
        r = self.r
        a = self.a
        body = r.randbytes(r.randrange(1, 32))
        ulen = r.randrange(8 + len(body) + 1, 65536) if r.random() < 0.5 else r.randrange(0, 8)
        if r.random() < 0.5:
            seg = self.l4(17, a.client4, a.dst4, self.port(), self.fport(), payload=body, ulen=ulen)
            return self.ip4(a.client4, a.dst4, 17, seg)
        seg = self.l4(17, a.client6, a.dst6, self.port(), self.fport(), payload=body, ulen=ulen)
        return self.ip6(a.client6, a.dst6, 17, seg)

    def c_v6_truncated(self):
        """Shorter than an IPv6 header (1-39 bytes), version 6."""
        n = self.r.randrange(1, 40)
        return bytes([0x60]) + self.r.randbytes(n - 1)

    def c_v6_bad_payload_length(self):
        """Payload length longer than what follows the header."""
        a = self.a
        seg = self.tcp6_seg(a.client6, a.dst6, self.flags())
        return self.ip6(a.client6, a.dst6, 6, seg, plen=self.r.randrange(len(seg) + 1, 65536))

    def c_v6_ext_ok(self):
        """Valid chains of Hop-by-Hop (first), Destination Options and Routing headers (Segments
        Left 0), up to 8, before a TCP segment of no connection: walked, not dropped."""
        r = self.r
        a = self.a
        kinds = [r.choice([60, 43]) for _ in range(r.randrange(0, 8))]
        if r.random() < 0.5:
            kinds = [0] + kinds[:7]
        if not kinds:
            kinds = [0]
        seg = self.tcp6_seg(a.client6, a.dst6, TCP_ACK)
        nh, body = self.chain6(kinds, 6, seg)
        return self.ip6(a.client6, a.dst6, nh, body)

    def c_v6_routing(self):
        """A Routing header with Segments Left > 0 (the destination is not final)."""
        a = self.a
        seg = self.tcp6_seg(a.client6, a.dst6, self.flags())
        body = self.routing_hdr(6, self.r.randrange(1, 256), self.r.choice([0, 2, 4]))
        if self.r.random() < 0.5:
            return self.ip6(a.client6, a.dst6, 0, self.opts_hdr(43) + body + seg)
        return self.ip6(a.client6, a.dst6, 43, body + seg)

    def c_v6_ext_too_many(self):
        """9-24 extension headers before the segment (more than the parser walks)."""
        a = self.a
        seg = self.tcp6_seg(a.client6, a.dst6, self.flags())
        nh, body = self.chain6([0] + [60] * self.r.randrange(8, 24), 6, seg)
        return self.ip6(a.client6, a.dst6, nh, body)

    def c_v6_ext_truncated(self):
        """A chain that runs past the packet's end: a header whose length passes it, or a
        Next Header that promises one more where the packet ends."""
        r = self.r
        a = self.a
        if r.random() < 0.5:  # the last header's length passes the end
            kinds = [r.choice([0, 60, 43]) for _ in range(r.randrange(0, 4))]
            nh, body = self.chain6(kinds, r.choice([0, 60]), b"")
            tail = bytes([6, r.randrange(1, 256)]) + b"\x01\x00" + b"\0" * 4
            return self.ip6(a.client6, a.dst6, nh, body + tail)
        nh, body = self.chain6([r.choice([0, 60])], r.choice([0, 60, 43, 51]), b"")
        return self.ip6(a.client6, a.dst6, nh, body)

    def c_v6_fragment(self):
        """A Fragment header: first fragments and later ones."""
        r = self.r
        a = self.a
        seg = self.tcp6_seg(a.client6, a.dst6, TCP_SYN, payload=r.randbytes(16))
        off = 0 if r.random() < 0.5 else r.randrange(1, 8192)
        frag = struct.pack("!BBHI", 6, 0, (off << 3) | 1, r.getrandbits(32))
        return self.ip6(a.client6, a.dst6, 44, frag + seg)

    def c_downlink_lookalike(self):
        """Replies "from the NAT side": from the gateway's listener port to a NAT address and a
        port no mapping has (below the NAT's range), v4 and v6."""
        r = self.r
        a = self.a
        dport = r.randrange(1, 1024)
        fl = r.choice([TCP_ACK, TCP_SYN | TCP_ACK, TCP_ACK | TCP_PSH, TCP_FIN | TCP_ACK])
        v4 = r.random() < 0.5
        sport = r.choice(a.lports if v4 else a.lports6)
        if v4:
            nat = r.choice(a.nat4)
            seg = self.l4(6, a.gw4, nat, sport, dport, fl, r.randbytes(r.randrange(0, 64)))
            return self.ip4(a.gw4, nat, 6, seg)
        nat = r.choice(a.nat6)
        seg = self.l4(6, a.gw6, nat, sport, dport, fl, r.randbytes(r.randrange(0, 64)))
        return self.ip6(a.gw6, nat, 6, seg)

    def c_from_nat_address(self):
        """TCP and UDP sourced from one of the NAT addresses, to a foreign destination."""
        r = self.r
        a = self.a
        v6 = r.random() < 0.5
        src = r.choice(a.nat6 if v6 else a.nat4)
        dst = a.dst6 if v6 else a.dst4
        return self.tcp_or_udp(src, dst, v6)

    def c_to_gateway(self):
        """TCP and UDP to the gateway address on random ports (never 53)."""
        r = self.r
        a = self.a
        v6 = r.random() < 0.5
        src, dst = (a.client6, a.gw6) if v6 else (a.client4, a.gw4)
        return self.tcp_or_udp(src, dst, v6)

    def tcp_or_udp(self, src, dst, v6):
        """A TCP segment with random flags or a 16-byte UDP datagram, half and half."""
        r = self.r
        if r.random() < 0.5:
            seg = self.l4(6, src, dst, self.port(), self.fport(), self.flags())
            proto = 6
        else:
            seg = self.l4(17, src, dst, self.port(), self.fport(), payload=r.randbytes(16))
            proto = 17
        return self.ip6(src, dst, proto, seg) if v6 else self.ip4(src, dst, proto, seg)

    def c_bad_version(self):
        """Not IP: a first nibble other than 4 and 6, random bytes after it."""
        r = self.r
        ver = r.choice([0, 1, 2, 3, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15])
        n = r.randrange(1, 120)
        return bytes([(ver << 4) | r.randrange(16)]) + r.randbytes(n - 1)

    def c_empty(self):
        """Zero bytes."""
        return b""


CLASSES = [n[2:] for n in Gen.__dict__ if n.startswith("c_")]


def tcp_tuple(pkt):
    """(src, dst, sport, dport, seq, ack, flags) of an IPv4 or IPv6 TCP packet (IPv6: after
    any Hop-by-Hop, Routing and Destination Options headers), or None."""
    if not pkt:
        return None
    if pkt[0] >> 4 == 4:
        off = (pkt[0] & 15) * 4
        if off < 20 or len(pkt) < off + 20 or pkt[9] != 6:
            return None
        src, dst = pkt[12:16], pkt[16:20]
    elif pkt[0] >> 4 == 6:
        if len(pkt) < 40:
            return None
        nh, off = pkt[6], 40
        while nh in (0, 43, 60):
            if len(pkt) < off + 8:
                return None
            nh, off = pkt[off], off + (pkt[off + 1] + 1) * 8
        if nh != 6 or len(pkt) < off + 20:
            return None
        src, dst = pkt[8:24], pkt[24:40]
    else:
        return None
    return (src, dst) + struct.unpack_from("!HHIIxB", pkt, off)


class Answers:
    """The RSTs the proxy writes back into the TUN for the packets of some classes, one per
    packet: from the packet's destination to its source, ports swapped, its sequence number
    the packet's acknowledgement number (RFC 9293 3.10.7.1 and 3.10.7.2: a closed port, or a
    listener, answers an ACK segment so). A reader thread counts them per class."""

    def __init__(self, dev):
        self.s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0)
        self.s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 4 << 20)
        self.prog = ctypes.create_string_buffer(
            b"".join(struct.pack("HBBI", *i) for i in RST_FILTER))
        self.s.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                          struct.pack("HL", len(RST_FILTER), ctypes.addressof(self.prog)))
        self.s.bind((dev, ETH_P_ALL))  # after the filter: nothing unfiltered is queued
        self.s.settimeout(0.1)
        self.want = {}  # answer key -> the classes of the packets still waiting for it
        self.got = {}
        self.waiting = 0
        self.lock = threading.Lock()
        self.all_in = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.read, daemon=True)

    def expect(self, cls, pkt):
        t = tcp_tuple(pkt)
        if t is None or not t[6] & TCP_ACK:
            raise ValueError("class %s: not an ACK segment, no RST to wait for" % cls)
        src, dst, sport, dport, _, ack, _ = t
        self.want.setdefault((dst, src, dport, sport, ack), []).append(cls)
        self.got.setdefault(cls, 0)
        self.waiting += 1

    def read(self):
        while not self.stop.is_set():
            try:
                data, sa = self.s.recvfrom(256)
            except socket.timeout:
                continue
            t = tcp_tuple(data)
            if sa[2] == PACKET_OUTGOING or t is None:
                continue
            with self.lock:
                waiting = self.want.get(t[:5])
                if waiting:
                    self.got[waiting.pop()] += 1
                    self.waiting -= 1
                    if self.waiting == 0:
                        self.all_in.set()

    def wait(self, seconds):
        if self.waiting:
            self.all_in.wait(seconds)
        self.stop.set()
        self.thread.join()
        with self.lock:
            return dict(self.got)


def addr(s):
    return ipaddress.ip_address(s).packed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dev")
    ap.add_argument("--client4", default="10.204.0.1")
    ap.add_argument("--client6", default="fd00:204::1")
    ap.add_argument("--dst4", default="10.204.9.9", help="foreign destination (routed to the TUN)")
    ap.add_argument("--dst6", default="fd00:204:9::9")
    ap.add_argument("--gw4", default="198.18.0.1")
    ap.add_argument("--gw6", default="fd00:7f::1")
    ap.add_argument("--nat-addrs", type=int, default=4, help="NAT addresses: gateway + 1 .. + N")
    ap.add_argument("--lports", default="80",
                    help="the gateway's IPv4 listener ports, comma-separated")
    ap.add_argument("--lports6", default="80", help="the same for IPv6")
    ap.add_argument("--count", type=int, default=200, help="packets of the first class")
    ap.add_argument("--only", default="", help="comma-separated class names")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--burst", type=int, default=32, help="packets between pauses")
    ap.add_argument("--pause-ms", type=float, default=1.0)
    ap.add_argument("--ready", help="create this file once every packet is built")
    ap.add_argument("--go", help="build the packets, then send once this file exists")
    ap.add_argument("--sent", help="create this file once the last packet is sent")
    ap.add_argument("--answers", default="", help="comma-separated classes answered by RSTs")
    ap.add_argument("--answer-wait", type=float, default=2.0,
                    help="seconds after the last send to wait for the missing answers")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        print("\n".join(CLASSES))
        return 0
    if not a.dev:
        ap.error("--dev is required")
    for k in ("client4", "client6", "dst4", "dst6", "gw4", "gw6"):
        setattr(a, k, addr(getattr(a, k)))
    g4 = int.from_bytes(a.gw4, "big")
    g6 = int.from_bytes(a.gw6, "big")
    a.nat4 = [(g4 + 1 + i).to_bytes(4, "big") for i in range(a.nat_addrs)]
    a.nat6 = [(g6 + 1 + i).to_bytes(16, "big") for i in range(a.nat_addrs)]
    a.lports = [int(p) for p in a.lports.split(",") if p]
    a.lports6 = [int(p) for p in a.lports6.split(",") if p]
    names = [n for n in a.only.split(",") if n] or CLASSES
    answered = [n for n in a.answers.split(",") if n]
    for n in names + answered:
        if n not in CLASSES:
            ap.error("unknown class %r (--list)" % n)
    gen = Gen(a, random.Random(a.seed))
    s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0)
    # Every packet is built before the first is sent: the sending then takes a fraction of a
    # second, so it falls inside the transfers it is meant to disturb.
    bursts = [(n, [getattr(gen, "c_" + n)() for _ in range(a.count + CLASSES.index(n))])
              for n in names]
    answers = Answers(a.dev) if answered else None
    for n, pkts in bursts:
        if n in answered:
            for pkt in pkts:
                answers.expect(n, pkt)
    if answers:
        answers.thread.start()
    if a.ready:
        open(a.ready, "w").close()
    if a.go:
        deadline = time.monotonic() + 30
        while not os.path.exists(a.go):
            if time.monotonic() > deadline:
                print("hostile.py: no %s within 30 s" % a.go, file=sys.stderr)
                return 1
            time.sleep(0.01)
    out = {}
    start = time.monotonic()
    sent_since_pause = 0
    for n, pkts in bursts:
        sent = failed = 0
        errs = {}
        for pkt in pkts:
            proto = ETH_P_IPV6 if pkt[:1] and pkt[0] >> 4 == 6 else ETH_P_IP
            for attempt in range(50):
                try:
                    s.sendto(pkt, (a.dev, proto))
                    sent += 1
                    break
                except OSError as e:
                    # ENOBUFS: the device's queue is full; wait for the reader and retry.
                    if e.errno == 105 and attempt < 49:
                        time.sleep(0.002)
                        continue
                    failed += 1
                    errs[e.strerror] = errs.get(e.strerror, 0) + 1
                    break
            sent_since_pause += 1
            if sent_since_pause >= a.burst:
                sent_since_pause = 0
                time.sleep(a.pause_ms / 1000)
        out[n] = {"sent": sent, "failed": failed}
        if errs:
            out[n]["errors"] = errs
    seconds = time.monotonic() - start
    if a.sent:
        open(a.sent, "w").close()
    if answers:
        for n, got in answers.wait(a.answer_wait).items():
            out.setdefault(n, {"sent": 0, "failed": 0})["answered"] = got
    print(json.dumps({"classes": out, "seconds": round(seconds, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
