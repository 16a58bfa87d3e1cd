#!/usr/bin/env python3
"""Generate the seed corpus of fuzz_process (record format: see tests/fuzz/fuzz_process.c).

Usage: make_corpus_process.py OUTDIR. Deterministic: the same files every run.
"""
import os
import struct
import sys

from pkt4 import csum, udp4, icmp4_echo


def tcp4(src, dst, sport, dport, flags, payload=b'', seq=1, ack=0):
    s, d = bytes(src), bytes(dst)
    tcp = struct.pack('!HHIIBBHHH', sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0) + payload
    ph = s + d + struct.pack('!BBH', 0, 6, len(tcp))
    c = csum(ph + tcp)
    tcp = tcp[:16] + struct.pack('!H', c) + tcp[18:]
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, s, d)
    ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
    return ip + tcp


def tcp6(src, dst, sport, dport, flags, payload=b'', ext=b'', nh_first=6):
    s, d = bytes(src), bytes(dst)
    tcp = struct.pack('!HHIIBBHHH', sport, dport, 1, 0, 5 << 4, flags, 65535, 0, 0) + payload
    ph = s + d + struct.pack('!I3xB', len(tcp), 6)
    c = csum(ph + tcp)
    tcp = tcp[:16] + struct.pack('!H', c) + tcp[18:]
    ip = struct.pack('!IHBB16s16s', 6 << 28, len(ext) + len(tcp), nh_first, 64, s, d)
    return ip + ext + tcp


def rec(op, flags, body):
    return struct.pack('!BBH', op, flags, len(body)) + body


CLI4, SRV4, GW4 = [10, 0, 0, 9], [1, 1, 1, 1], [198, 18, 0, 1]
CLI6 = [0xfd, 0, 0, 0x7f] + [0] * 11 + [9]
SRV6 = [0x20, 0x01, 0x0d, 0xb8] + [0] * 11 + [1]
SYN, ACK, RST, FIN = 2, 16, 4, 1


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {
        'syn4': rec(0, 0, tcp4(CLI4, SRV4, 5000, 443, SYN)),
        'syn6': rec(0, 2, tcp6(CLI6, SRV6, 5000, 443, SYN)),
        'syn_then_down': rec(0, 0, tcp4(CLI4, SRV4, 5000, 443, SYN)) +
                         rec(1, 0, tcp4(GW4, GW4, 40000, 1024, SYN | ACK, b'x' * 20)),
        'accept_close_resyn': rec(0, 0, tcp4(CLI4, SRV4, 5000, 443, SYN)) +
                              rec(3, 0, bytes([0, 0, 0, 0])) + rec(4, 0, bytes([0, 0, 0, 0])) +
                              rec(0, 0, tcp4(CLI4, SRV4, 5000, 443, SYN)),
        'unmapped_ack': rec(0, 0, tcp4(CLI4, SRV4, 5001, 80, ACK, b'hello', 7, 99)),
        'unmapped_rst': rec(0, 0, tcp4(CLI4, SRV4, 5001, 80, RST | ACK)),
        'partial': rec(0, 1, tcp4(CLI4, SRV4, 5002, 80, SYN, b'p' * 100)),
        'expire': rec(0, 0, tcp4(CLI4, SRV4, 5000, 443, SYN)) + rec(2, 0, b'\0' * 255) +
                  rec(2, 0, b'\0' * 255) + rec(5, 0, tcp4(CLI4, SRV4, 5000, 443, ACK)),
        'udp_dns': rec(0, 0, udp4(CLI4, GW4, 5353, 53, b'\x12\x34' + b'\0' * 10)),
        'v6_ext': rec(0, 2, tcp6(CLI6, SRV6, 7, 8, SYN, ext=bytes([6, 0, 1, 4, 0, 0, 0, 0]),
                              nh_first=0)),
        'icmp_echo': rec(0, 0, icmp4_echo(CLI4, GW4)),
        # SYNs to special destinations: answered with an ICMP(v6) port unreachable built in
        # place, longer than the SYN.
        'syn_special4': rec(0, 0, tcp4(CLI4, [127, 1, 2, 3], 5003, 80, SYN)),
        'syn_special6': rec(0, 2, tcp6(CLI6, [0] * 15 + [1], 7, 8, SYN,
                                        ext=bytes([6, 0, 1, 4, 0, 0, 0, 0]), nh_first=0)),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), 'wb') as f:
            f.write(data)


if __name__ == '__main__':
    main()
