#!/usr/bin/env python3
"""Generate the seed corpora of fuzz_sniff_stream and fuzz_sniff_quic (input formats: see
tests/fuzz/fuzz_sniff_stream.c and tests/fuzz/fuzz_sniff_quic.c).

Usage: make_corpus_sniff.py [CORPUSDIR] (default: tests/fuzz/corpus next to this script);
writes CORPUSDIR/fuzz_sniff_stream/ and CORPUSDIR/fuzz_sniff_quic/. Deterministic: the same
files every run. The raw QUIC seeds are sealed here (RFC 9001 section 5, RFC 9369 section 3)
with the `cryptography` package; the others need nothing but the standard library.
"""
import hashlib
import hmac
import os
import struct
import sys

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

V1, V2 = 0x00000001, 0x6B3343CF
SALT = {V1: bytes.fromhex('38762cf7f55934b34d179ae6a4c80cadccbb7f0a'),
        V2: bytes.fromhex('0dede3def700a6db819381be6e269dcbf9bd2ed9')}
LABEL = {V1: 'quic ', V2: 'quicv2 '}


def ext(t, body):
    return struct.pack('!HH', t, len(body)) + body


def sni(name):
    entry = b'\0' + struct.pack('!H', len(name)) + name
    return ext(0, struct.pack('!H', len(entry)) + entry)


def client_hello(name=b'seed.example', pad=0):
    """A ClientHello handshake message shaped like a browser's (no record layer)."""
    exts = b''
    if name is not None:
        exts += sni(name)
    exts += ext(10, bytes.fromhex('0006001d00170018'))           # supported_groups
    exts += ext(13, bytes.fromhex('000804030804040105010201'))   # signature_algorithms
    exts += ext(16, bytes.fromhex('000c02683208687474702f312e31'))  # ALPN h2, http/1.1
    exts += ext(43, bytes.fromhex('020304'))                     # supported_versions
    exts += ext(51, struct.pack('!HHH', 36, 0x1d, 32) + bytes(range(32)))  # key_share
    if pad:
        exts += ext(21, bytes(pad))
    body = (b'\x03\x03' + bytes(range(32)) + b'\x20' + bytes(range(32, 64)) +
            bytes.fromhex('0006130113021303') + b'\x01\x00' +
            struct.pack('!H', len(exts)) + exts)
    return b'\x01' + len(body).to_bytes(3, 'big') + body


def records(msg, frag=16384):
    return b''.join(b'\x16\x03\x01' + struct.pack('!H', len(msg[i:i + frag])) + msg[i:i + frag]
                    for i in range(0, len(msg), frag))


def stream_seeds():
    hello = client_hello()
    return {
        'tls_hello': records(hello),
        'tls_hello_two_records': records(hello, 100),
        'tls_hello_no_sni': records(client_hello(None)),
        'tls_hello_ip_sni': records(client_hello(b'192.0.2.1')),
        'tls_hello_upper': records(client_hello(b'WWW.Example.COM.')),
        'tls_hello_padded': records(client_hello(pad=3000), 1000),
        'tls_alert': bytes.fromhex('15030300020228'),
        'http_get_port': b'GET / HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\n\r\n',
        'http_v6': b'GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n',
        'http_lf_no_host': b'POST /x HTTP/1.0\nContent-Length: 0\n\n',
        'http_connect': b'CONNECT a.example:443 HTTP/1.1\r\nhost: a.example:443\r\n\r\n',
        'ssh': b'SSH-2.0-OpenSSH_9.2p1\r\n',
        # past SNIFF_STREAM_MAX, so that the fuzzer's inputs may grow that long too
        'tls_hello_huge': records(client_hello(pad=20000)),
        'http_huge_head': b'GET / HTTP/1.1\r\n' + b'X-Filler: 0123456789abcdef\r\n' * 700 +
        b'Host: late.example\r\n\r\n',
    }


def hkdf_expand_label(secret, label, length):
    full = b'tls13 ' + label.encode()
    info = struct.pack('!HB', length, len(full)) + full + b'\0'
    return hmac.new(secret, info + b'\x01', hashlib.sha256).digest()[:length]


def keys(version, dcid):
    initial = hmac.new(SALT[version], dcid, hashlib.sha256).digest()
    client = hkdf_expand_label(initial, 'client in', 32)
    p = LABEL[version]
    return (hkdf_expand_label(client, p + 'key', 16), hkdf_expand_label(client, p + 'iv', 12),
            hkdf_expand_label(client, p + 'hp', 16))


def varint(v):
    if v < 64:
        return bytes([v])
    if v < 16384:
        return struct.pack('!H', 0x4000 | v)
    return struct.pack('!I', 0x80000000 | v)


def crypto(msg, off, n):
    return b'\x06' + varint(off) + varint(n) + msg[off:off + n]


def seal(version, dcid, pn, frames, pad_to=1200):
    """One protected client Initial with a 4-byte packet number."""
    key, iv, hp = keys(version, dcid)
    hlen = 1 + 4 + 1 + len(dcid) + 1 + 1 + 2 + 4
    if hlen + len(frames) + 16 < pad_to:
        frames += bytes(pad_to - hlen - len(frames) - 16)
    first = 0xc0 | ((0 if version == V1 else 1) << 4) | 3
    hdr = (bytes([first]) + struct.pack('!I', version) + bytes([len(dcid)]) + dcid + b'\0\0' +
           struct.pack('!H', 0x4000 | (4 + len(frames) + 16)) + struct.pack('!I', pn))
    nonce = bytes(a ^ b for a, b in zip(iv, (0).to_bytes(4, 'big') + pn.to_bytes(8, 'big')))
    ct = AESGCM(key).encrypt(nonce, frames, hdr)
    enc = Cipher(algorithms.AES(hp), modes.ECB()).encryptor()
    mask = enc.update(ct[:16]) + enc.finalize()
    out = bytearray(hdr + ct)
    out[0] ^= mask[0] & 0x0f
    for i in range(4):
        out[hlen - 4 + i] ^= mask[1 + i]
    return bytes(out)


def rec(b):
    return struct.pack('!H', len(b)) + b


def quic_seeds():
    dcid = bytes.fromhex('8394c8f03e515708')
    big = client_hello(b'split.example', pad=1500)
    small = client_hello(b'one.example')
    half = 1000
    ack = bytes.fromhex('0200000000') + b'\x01'
    raw1 = seal(V1, dcid, 0, crypto(small, 0, len(small)))
    raw2a = seal(V1, dcid, 0, crypto(big, 0, half))
    raw2b = seal(V1, dcid, 1, crypto(big, half, len(big) - half))
    rawv2 = seal(V2, dcid, 0, crypto(small, 0, len(small)))
    sealhdr = lambda mode: bytes([mode, len(dcid)]) + dcid
    return {
        'raw_one_initial': b'\x00' + rec(raw1),
        'raw_split_two_datagrams': b'\x00' + rec(raw2a) + rec(raw2b),
        'raw_split_reversed': b'\x00' + rec(raw2b) + rec(raw2a),
        'raw_coalesced': b'\x00' + rec(raw2a + raw2b),
        'raw_v2': b'\x02' + rec(rawv2),
        'raw_garbage': b'\x00' + rec(bytes.fromhex('c0000000010800') + bytes(40)),
        'seal_one': sealhdr(1) + rec(crypto(small, 0, len(small))),
        'seal_split': sealhdr(1) + rec(ack + crypto(big, 0, half)) +
        rec(crypto(big, half, len(big) - half)),
        'seal_reversed_coalesced': sealhdr(5) + rec(crypto(big, half, len(big) - half)) +
        rec(crypto(big, 0, half)),
        'seal_v2_pieces': sealhdr(3) + b''.join(rec(crypto(small, i, min(40, len(small) - i)))
                                               for i in range(0, len(small), 40))[:4000],
        'seal_close': sealhdr(1) + rec(b'\x1c\x0a\x00\x00'),
        'seal_no_sni': sealhdr(1) + rec(crypto(client_hello(None), 0,
                                               len(client_hello(None)))),
    }


def write(d, seeds):
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), 'wb') as f:
            f.write(data)


def main():
    base = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(
        os.path.abspath(__file__)), 'corpus')
    write(os.path.join(base, 'fuzz_sniff_stream'), stream_seeds())
    write(os.path.join(base, 'fuzz_sniff_quic'), quic_seeds())


if __name__ == '__main__':
    main()
