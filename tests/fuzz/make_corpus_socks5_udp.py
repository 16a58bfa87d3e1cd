#!/usr/bin/env python3
"""Generate the seed corpus of fuzz_socks5_udp (input format: see tests/fuzz/fuzz_socks5_udp.c).

Usage: make_corpus_socks5_udp.py OUTDIR. Deterministic: the same files every run.
Header byte: bit 0 clear = a datagram from the relay to parse; set = a destination and payload
to build (selector, length, port, address, payload; the payload read the same way is the
server), also fed to the relay rules.
"""
import os
import struct
import sys


def dgram(atyp, addr, port, payload=b'', rsv=0, frag=0):
    if atyp == 3:
        addr = bytes([len(addr)]) + addr
    return struct.pack('!HBB', rsv, frag, atyp) + addr + struct.pack('!H', port) + payload


def build(sel, addr, port, payload=b''):
    """sel: 0 IPv4, 1 IPv6, 2 domain (addr is the name)."""
    length = len(addr) if sel == 2 else 0
    return bytes([1, sel, length]) + struct.pack('!H', port) + addr + payload


V6 = bytes.fromhex('20010db8000000000000000000000007')
DNS_Q = bytes.fromhex('123401000001000000000000076578616d706c6503636f6d0000010001')

SEEDS = {
    '00_v4_dns': b'\0' + dgram(1, bytes([8, 8, 8, 8]), 53, DNS_Q),
    '01_v6': b'\0' + dgram(4, V6, 443, b'quic'),
    '02_domain': b'\0' + dgram(3, b'dns.example', 853, b'x'),
    '03_domain_255': b'\0' + dgram(3, b'n' * 255, 1, b'end'),
    '04_empty_payload': b'\0' + dgram(1, bytes(4), 0),
    '05_frag': b'\0' + dgram(1, bytes([1, 2, 3, 4]), 9, b'p', frag=1),
    '06_frag_last': b'\0' + dgram(1, bytes([1, 2, 3, 4]), 9, b'p', frag=0x81),
    '07_rsv': b'\0' + dgram(1, bytes([1, 2, 3, 4]), 9, rsv=0x0100),
    '08_bad_atyp': b'\0' + dgram(2, bytes([1, 2, 3, 4]), 9),
    '09_truncated_v6': b'\0' + dgram(4, V6, 443)[:12],
    '10_name_overrun': b'\0' + bytes([0, 0, 0, 3, 255]) + b'x' * 20,
    '11_name_empty': b'\0' + dgram(3, b'', 53),
    '12_name_nul': b'\0' + dgram(3, b'a\0b', 53),
    '13_tiny': b'\0' + b'\0\0',
    '20_build_v4': build(0, bytes([192, 0, 2, 1]), 53, DNS_Q),
    '21_build_v6': build(1, V6, 443, b'payload'),
    '22_build_domain': build(2, b'relay.example', 1080, b'hello'),
    '23_build_unspec_bnd': build(0, bytes(4), 4000, b'\x01\x00\x0f\xa0' + V6),
    '24_build_loopback_bnd': build(0, bytes([127, 0, 0, 1]), 4000,
                                   b'\x00\x00\x0f\xa0' + bytes([203, 0, 113, 5])),
}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(SEEDS.items()):
        with open(os.path.join(out, name), 'wb') as f:
            f.write(data)


if __name__ == '__main__':
    main()
