#!/usr/bin/env python3
"""Generate the seed corpus of fuzz_udp: one packet "read from the TUN" per file.

Usage: make_corpus_udp.py [OUTDIR] (default: tests/fuzz/corpus/fuzz_udp next to this script).
Deterministic: the same files every run. Valid IPv4/IPv6 datagrams (DNS-like, empty, odd,
MTU-sized, with IPv4 options and IPv6 extension headers) and the shapes the codec refuses
(fragments, bad UDP lengths, zero ports, other protocols, truncations).
"""
import os
import struct
import sys

from pkt4 import csum


def udp_hdr(sport, dport, payload, ulen=None):
    return struct.pack('!HHHH', sport, dport, 8 + len(payload) if ulen is None else ulen, 0) + payload


def with_csum(udp, pseudo):
    c = csum(pseudo + udp) or 0xffff
    return udp[:6] + struct.pack('!H', c) + udp[8:]


def udp4(src, dst, sport, dport, payload, opts=b'', frag=0, ulen=None, proto=17):
    s, d = bytes(src), bytes(dst)
    udp = udp_hdr(sport, dport, payload, ulen)
    udp = with_csum(udp, s + d + struct.pack('!BBH', 0, 17, len(udp)))
    ihl = 5 + len(opts) // 4
    ip = struct.pack('!BBHHHBBH4s4s', 0x40 | ihl, 0, ihl * 4 + len(udp), 0x1234, frag, 64, proto,
                     0, s, d) + opts
    return ip[:10] + struct.pack('!H', csum(ip)) + ip[12:] + udp


def udp6(src, dst, sport, dport, payload, ext=b'', nh_first=17, ulen=None):
    s, d = bytes(src), bytes(dst)
    udp = udp_hdr(sport, dport, payload, ulen)
    udp = with_csum(udp, s + d + struct.pack('!I3xB', len(udp), 17))
    ip = struct.pack('!IHBB16s16s', 6 << 28, len(ext) + len(udp), nh_first, 64, s, d)
    return ip + ext + udp


def v6(text):
    import ipaddress
    return ipaddress.IPv6Address(text).packed


C4, G4, R4 = [10, 0, 0, 9], [198, 18, 0, 1], [1, 1, 1, 1]
C6, R6 = v6('fd00::9'), v6('2001:db8::53')
DNS_Q = bytes.fromhex('beef01000001000000000000') + b'\x07example\x03com\x00\x00\x01\x00\x01'


def seeds():
    yield 'v4_dns_to_gateway', udp4(C4, G4, 5353, 53, DNS_Q)
    yield 'v4_empty', udp4(C4, R4, 40000, 9, b'')
    yield 'v4_odd', udp4(C4, R4, 40000, 7, b'abc')
    yield 'v4_mtu', udp4(C4, R4, 40000, 7, bytes(range(256)) * 5 + bytes(1472 - 1280))
    yield 'v4_options', udp4(C4, R4, 1, 2, b'opts', opts=b'\x01\x01\x01\x00')
    yield 'v4_trailing_pad', udp4(C4, R4, 1, 2, b'data', ulen=10)
    yield 'v6_dns', udp6(C6, R6, 4444, 53, DNS_Q)
    yield 'v6_hbh_dstopts', udp6(C6, R6, 1, 2, b'ext',
                                 ext=bytes([60, 0]) + bytes(6) + bytes([17, 0]) + bytes(6),
                                 nh_first=0)
    yield 'v6_empty', udp6(C6, R6, 9, 9, b'')
    # Refused shapes.
    yield 'bad_v4_fragment', udp4(C4, R4, 1, 2, b'frag', frag=0x2000)
    yield 'bad_v4_udp_len_short', udp4(C4, R4, 1, 2, b'abcd', ulen=7)
    yield 'bad_v4_udp_len_long', udp4(C4, R4, 1, 2, b'abcd', ulen=200)
    yield 'bad_v4_zero_sport', udp4(C4, R4, 0, 53, b'x')
    yield 'bad_v6_zero_dport', udp6(C6, R6, 53, 0, b'x')
    yield 'bad_v6_fragment', udp6(C6, R6, 1, 2, b'f', ext=bytes([17, 0, 0, 1]) + bytes(4),
                                  nh_first=44)
    yield 'bad_v4_tcp_proto', udp4(C4, R4, 1, 2, b'not udp', proto=6)
    yield 'bad_v4_truncated', udp4(C4, R4, 1, 2, b'cut here')[:30]
    yield 'bad_v6_truncated', udp6(C6, R6, 1, 2, b'cut')[:44]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), 'corpus', 'fuzz_udp')
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    for i, (name, pkt) in enumerate(seeds()):
        with open(os.path.join(out, '%02d_%s.bin' % (i, name)), 'wb') as fh:
            fh.write(pkt)


if __name__ == '__main__':
    main()
