"""pkt4.py: IPv4 packets the seed-corpus generators share (checksums, a UDP datagram, an ICMP
echo request). Imported by the make_corpus_*.py scripts beside it."""
import struct


def csum(b):
    """The Internet checksum (RFC 1071) of b."""
    if len(b) % 2:
        b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff


def udp4(src, dst, sport, dport, payload, udp_csum=True):
    """An IPv4 UDP datagram; udp_csum=False leaves its UDP checksum 0 (none)."""
    s, d = bytes(src), bytes(dst)
    udp = struct.pack('!HHHH', sport, dport, 8 + len(payload), 0) + payload
    if udp_csum:
        c = csum(s + d + struct.pack('!BBH', 0, 17, len(udp)) + udp) or 0xffff
        udp = udp[:6] + struct.pack('!H', c) + udp[8:]
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, s, d)
    return ip[:10] + struct.pack('!H', csum(ip)) + ip[12:] + udp


def icmp4_echo(src, dst):
    """An IPv4 ICMP echo request with the payload "ping"."""
    icmp = struct.pack('!BBHHH', 8, 0, 0, 1, 1) + b'ping'
    icmp = icmp[:2] + struct.pack('!H', csum(icmp)) + icmp[4:]
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(icmp), 0, 0, 64, 1, 0, bytes(src),
                     bytes(dst))
    return ip[:10] + struct.pack('!H', csum(ip)) + ip[12:] + icmp
