#!/usr/bin/env python3
"""Generate the seed corpus of fuzz_socks5 (input format: see tests/fuzz/fuzz_socks5.c).

Usage: make_corpus_socks5.py OUTDIR. Deterministic: the same files every run.
Header byte: bits 0-1 mode (0 method, 1 auth, 2 CONNECT reply, 3 whole sequence),
bit 2 credentials configured, bits 3-7 chunk size - 1 (mode 3).
"""
import os
import struct
import sys


def hdr(mode, auth=False, chunk=1):
    return bytes([mode | (4 if auth else 0) | ((chunk - 1) << 3)])


def reply(rep=0, atyp=1, addr=b'\0\0\0\0', port=0):
    if atyp == 3:
        addr = bytes([len(addr)]) + addr
    return bytes([5, rep, 0, atyp]) + addr + struct.pack('!H', port)


V6_LO = b'\0' * 15 + b'\1'

SEEDS = {
    # single stages
    '00_method_noauth': hdr(0) + b'\x05\x00',
    '01_method_userpass': hdr(0, True) + b'\x05\x02',
    '02_method_refused': hdr(0, True) + b'\x05\xff',
    '03_method_badver': hdr(0) + b'\x04\x00',
    '04_auth_ok': hdr(1) + b'\x01\x00',
    '05_auth_fail': hdr(1) + b'\x01\x01',
    '06_auth_v5_quirk': hdr(1) + b'\x05\x00',
    '07_reply_v4': hdr(2) + reply(0, 1, bytes([10, 0, 0, 1]), 1080),
    '08_reply_v6': hdr(2) + reply(0, 4, V6_LO, 8080),
    '09_reply_domain': hdr(2) + reply(0, 3, b'proxy.example', 443),
    '10_reply_domain_empty': hdr(2) + reply(0, 3, b'', 0),
    '11_reply_domain_overrun': hdr(2) + bytes([5, 0, 0, 3, 255]) + b'x' * 20,
    '12_reply_bad_atyp': hdr(2) + bytes([5, 0, 0, 2, 1, 2, 3, 4, 0, 0]),
    '13_reply_refused': hdr(2) + reply(5),
    '14_reply_ttl': hdr(2) + reply(6),
    '15_reply_odd_bnd_lo': hdr(2) + reply(0, 1, bytes([127, 0, 0, 1]), 0),
    '16_reply_early': hdr(2) + reply(0) + b'HTTP/1.1 200 OK\r\n',
    # whole sequences
    '20_seq_noauth_early': hdr(3, False, 1) + b'\x05\x00' + reply(0) + b'early',
    '21_seq_auth': hdr(3, True, 3) + b'\x05\x02' + b'\x01\x00'
                   + reply(0, 3, b'localhost', 1080) + b'\x00\x01',
    '22_seq_auth_fail': hdr(3, True, 32) + b'\x05\x02\x01\x01',
    '23_seq_refused': hdr(3, False, 7) + b'\x05\x00' + reply(2),
    '24_seq_v6_bytewise': hdr(3, False, 1) + b'\x05\x00' + reply(0, 4, V6_LO, 1),
    '25_seq_garbage': hdr(3, False, 16) + b'HTTP/1.1 400 Bad Request\r\n\r\n',
    '26_seq_auth_not_needed': hdr(3, True, 2) + b'\x05\x00' + reply(0) + b'\xde\xad',
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
