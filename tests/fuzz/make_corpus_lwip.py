#!/usr/bin/env python3
"""Generate the seed corpus of fuzz_lwip (record format: see tests/fuzz/fuzz_lwip.c).

Usage: make_corpus_lwip.py OUTDIR. Deterministic: the same files every run. Inputs that once
found a defect (past_window) are kept in the corpus beside these.
"""
import os
import struct
import sys

from pkt4 import csum, udp4, icmp4_echo

FIN, SYN, RST, PSH, ACK = 1, 2, 4, 8, 16

# mode byte 0
OFFLOAD, TRAINS, LARGE, LEND, RXTAKE, V6, SMALL, RING = 1, 2, 4, 8, 16, 32, 64, 128


def seg(slot, flags, length=0, dseq=0, dack=0, ctl=0, win=65535, seq_from_ack=False,
        meta=0, gso=False, bad=False, gso_sel=0, opts=0, opt_fields=b'', isn=None):
    """A segment record; meta 1 NEEDS_CSUM, 2 DATA_VALID."""
    sel = slot | (8 if seq_from_ack else 0) | meta << 4 | (64 if gso else 0) | (128 if bad else 0)
    if isn is not None:
        ctl |= 16
    body = struct.pack('!BBBbbBHHBB', 0, sel, flags, dseq, dack, ctl, win, length, gso_sel, opts)
    body += opt_fields
    if isn is not None:
        body += struct.pack('!I', isn)
    return body


def syn_opts(mss=1400, ws=7, sack=True):
    return 1 | 2 | (4 if sack else 0), struct.pack('!HB', mss, ws)


def syn(slot, mss=1400, ws=7, **kw):
    o, f = syn_opts(mss, ws)
    return seg(slot, SYN, opts=o, opt_fields=f, **kw)


def handshake(slot, mss=1400, ws=7):
    # SYN, then the third ACK (ack = the stack's ISN + 1), then a loop pass: accepted.
    return syn(slot, mss, ws) + seg(slot, ACK, ctl=8)


def raw(flags, pkt):
    return struct.pack('!BBH', 1, flags, len(pkt)) + pkt


def clock(step, n):
    return struct.pack('!BBB', 2, step, n - 1)


def loop(n=1):
    return struct.pack('!BB', 3, n - 1)


def batch_end():
    return b'\x04'


def write(idx, n, times4=False):
    return struct.pack('!BBHB', 5, idx, n, 1 if times4 else 0)


def read(idx, n=0, how=0):
    return struct.pack('!BBHB', 6, idx, n, how)


def shutdown(idx):
    return struct.pack('!BB', 7, idx)


def end(idx, abort=False):
    return struct.pack('!BBB', 8, idx, 1 if abort else 0)


def interest(idx, bits):
    return struct.pack('!BBB', 9, idx, bits)


def burst(n, slot):
    return struct.pack('!BBB', 10, n - 1, slot)


def tier(t):
    return struct.pack('!BB', 11, t)


def stats():
    return b'\x0c'


def stop():
    return b'\x0d'


def mode(m0, m1=0):
    return bytes([m0, m1])


def tcp4(src, dst, sport, dport, flags, seq=1, ack=0, payload=b''):
    s, d = bytes(src), bytes(dst)
    tcp = struct.pack('!HHIIBBHHH', sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0) + payload
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, s, d)
    return ip + tcp  # checksums left to the record's "fix" flag


def seeds():
    s = {}
    # A connection's life over IPv4: data both ways, FINs, TIME_WAIT on the clock.
    s['life4'] = (mode(0) + handshake(0) + interest(0, 3)
                  + seg(0, ACK | PSH, 1000) + loop() + read(0)
                  + write(0, 5000) + loop() + seg(0, ACK) + seg(0, ACK | FIN, ctl=8)
                  + read(0) + shutdown(0) + loop() + seg(0, ACK) + clock(2, 20) + end(0))
    # The same over IPv6 with a Hop-by-Hop header, and an abort.
    s['life6'] = (mode(V6) + handshake(4) + seg(4, ACK | PSH, 1200, ctl=32) + loop()
                  + read(0, how=1) + write(0, 3000) + loop() + seg(4, ACK) + end(0, abort=True)
                  + loop())
    # Offload: GSO trains, large segments, lent frames on a ring, read buffers taken; a
    # super-packet upload acknowledged at the pass end, a large download.
    s['offload'] = (mode(OFFLOAD | TRAINS | LARGE | LEND | RXTAKE | RING)
                    + handshake(0) + seg(0, ACK | PSH, 60000, meta=1, gso=True, gso_sel=0)
                    + seg(0, ACK | PSH, 40000, meta=2, gso=True) + batch_end() + read(0, 20000)
                    + loop() + write(0, 50000, times4=True) + loop()
                    + seg(0, ACK, dack=-64, ctl=4) + loop() + seg(0, ACK) + loop()
                    + read(0) + loop())
    # Offload over IPv6 without large segments: trains only.
    s['offload6'] = (mode(OFFLOAD | TRAINS | LEND | V6) + handshake(5)
                     + write(0, 40000) + loop() + seg(5, ACK) + loop()
                     + seg(5, ACK | PSH, 30000, meta=1, gso=True) + loop() + read(0))
    # A small budget: uploads until the payloads find no memory, then reads.
    s['pressure'] = (mode(OFFLOAD | TRAINS | LARGE | SMALL, 0x00) + handshake(0) + handshake(1)
                     + seg(0, ACK | PSH, 60000, meta=1, gso=True)
                     + seg(1, ACK | PSH, 60000, meta=1, gso=True)
                     + seg(0, ACK | PSH, 60000, meta=1, gso=True, dseq=-1, ctl=4)
                     + seg(0, ACK | PSH, 60000, meta=1, gso=True, dseq=1, ctl=4)
                     + loop() + read(0) + read(1) + loop() + seg(0, ACK) + tier(2)
                     + write(0, 60000) + loop() + tier(3))
    # A SYN flood on a backlog of one: bursts, eviction after the clock moves, a local
    # application's handshake.
    s['flood'] = (mode(0, 0x10) + burst(8, 0) + clock(0, 3) + burst(8, 1) + handshake(2)
                  + burst(16, 3) + clock(1, 10) + syn(2) + clock(3, 12))
    # Admission: one permit, two handshakes; the first stream ends, a third comes in.
    s['admission'] = (mode(0, 0x04) + handshake(0) + handshake(1) + end(0) + handshake(3)
                      + stats())
    # Retransmissions until lwIP gives up, with the window shut and reopened.
    s['rexmit'] = (mode(OFFLOAD | TRAINS | LARGE) + handshake(0) + write(0, 30000) + loop()
                   + seg(0, ACK, win=0) + clock(2, 8) + seg(0, ACK, win=2000, ctl=3)
                   + clock(2, 40) + clock(3, 40))
    # Out of order and duplicate data, SACK and timestamps, an MSS outside a SYN.
    ts = struct.pack('!II', 1, 2)
    s['ooseq'] = (mode(0) + handshake(0) + seg(0, ACK | PSH, 500, dseq=100)
                  + seg(0, ACK | PSH, 500, dseq=50, opts=8, opt_fields=ts)
                  + seg(0, ACK | PSH, 100, opts=1, opt_fields=struct.pack('!H', 200))
                  + seg(0, ACK | PSH, 100, seq_from_ack=True)
                  + seg(0, ACK, opts=16, opt_fields=bytes([0, 0, 10, 0, 20])) + loop()
                  + read(0, 50, how=2) + read(0) + seg(0, RST) + loop())
    # Raw packets: UDP, an echo to the gateway, a stray TCP segment with its checksums fixed.
    s['raw'] = (mode(V6)
                + raw(0, udp4([10, 0, 0, 9], [8, 8, 8, 8], 5000, 53, b'q', udp_csum=False))
                + raw(0, icmp4_echo([10, 0, 0, 9], [198, 18, 0, 1]))
                + raw(4, tcp4([10, 0, 0, 9], [5, 6, 7, 8], 5555, 443, ACK, 77, 99))
                + raw(4, tcp4([10, 0, 0, 9], [1, 1, 1, 1], 7, 80, SYN)) + loop())
    # A small MTU: a SYN repeated with another MSS while the handshake is open.
    s['mtu576'] = (mode(0, 0x02) + syn(0, mss=536) + syn(0, mss=1440) + seg(0, ACK, ctl=8)
                   + write(0, 4000) + loop() + seg(0, ACK) + stop() + syn(1))
    # Reacting owners: read everything, write on writable, end on EOF or error.
    s['react'] = (mode(OFFLOAD | TRAINS | LEND) + handshake(0) + interest(0, 0x1f)
                  + seg(0, ACK | PSH, 1000) + loop(2) + seg(0, ACK) + loop(2)
                  + seg(0, ACK | FIN) + loop(3) + seg(0, RST, seq_from_ack=True) + loop(2))
    # Everything acknowledged after a timeout moved it back to unsent with the window shut
    # (lwIP's persist timer left running on empty queues).
    s['persist'] = (mode(0) + handshake(0) + write(0, 2800) + loop()
                    + seg(0, ACK, ctl=1 | 4, dack=1, win=0) + clock(2, 40)
                    + seg(0, ACK, win=65535) + clock(2, 8) + write(0, 1000) + loop())
    # A SYN whose options end in a lone kind, and an ACK likewise.
    s['optlast'] = (mode(V6) + seg(4, SYN, opts=32, opt_fields=bytes([4, 1, 1, 1, 30]))
                    + seg(4, ACK, ctl=8, opts=32, opt_fields=bytes([4, 1, 1, 1, 8])) + loop())
    return s


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(seeds().items()):
        with open(os.path.join(out, name), 'wb') as f:
            f.write(data)


if __name__ == '__main__':
    main()
