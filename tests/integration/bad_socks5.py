#!/usr/bin/env python3
"""bad_socks5.py — a SOCKS5 server (RFC 1928) that answers UDP ASSOCIATE the odd ways real
servers do, or sends malformed UDP replies, for tests/integration/proxies.sh.

Only UDP ASSOCIATE, no authentication. The relay socket is dual-stack [::]:port, so it
receives whatever address family the client picks. The relay itself echoes: a datagram's
payload goes back to the client with the datagram's own destination address in the reply's
header (what a real relay's answer from that destination carries). The control connection is
held until the client closes it.

--mode M[,M...] serves mode i of the list on control port --port + i, all in one process.
Modes (how BND and replies look):
  zero       BND.ADDR 0.0.0.0 (the client must use the server's address)
  loopback   BND.ADDR 127.0.0.1, from a server that is not on loopback
  family     BND.ADDR is --addr6, an IPv6 address, for an IPv4 control connection
  otherport  BND is the relay socket, but the echoes leave from another port
  truncated, rsv, frag, atyp9, v6src, name, emptyname, foreign
             BND normal; a datagram whose payload starts with BAD is answered with a
             malformed reply (a header cut short; RSV 0x0100; FRAG 1; ATYP 9; an IPv6 source
             for an IPv4 destination; a source name, ATYP 3, the client never sent to; an
             empty source name) or, for foreign, a well-formed echo sent from --foreign
             (another address of this host) to the client's relay port; every other datagram
             is echoed normally
  good       a plain, correct server
"""
import argparse
import ipaddress
import socket
import struct
import sys
import threading

MALFORMED = ("truncated", "rsv", "frag", "atyp9", "v6src", "name", "emptyname")
MODES = ("good", "zero", "loopback", "family", "otherport", "foreign") + MALFORMED


def recv_exact(c, n):
    out = b""
    while len(out) < n:
        chunk = c.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def addr_bytes(host, port):
    ip = ipaddress.ip_address(host)
    return bytes([1 if ip.version == 4 else 4]) + ip.packed + struct.pack("!H", port)


def parse_request(data):
    """(destination header bytes, payload) of a client datagram, or None."""
    if len(data) < 4 or data[:3] != b"\0\0\0":
        return None
    n = {1: 4, 4: 16}.get(data[3])
    if n is None or len(data) < 4 + n + 2:
        return None
    return data[3:4 + n + 2], data[4 + n + 2:]


def malformed(mode, dst, payload):
    if mode == "truncated":
        return (b"\0\0\0" + dst)[:7]
    if mode == "rsv":
        return b"\x01\0\0" + dst + payload
    if mode == "frag":
        return b"\0\0\x01" + dst + payload
    if mode == "atyp9":
        return b"\0\0\0\x09" + dst[1:] + payload
    if mode == "v6src":
        return b"\0\0\0" + addr_bytes("fd00::1", 7) + payload
    if mode == "name":
        return b"\0\0\0\x03" + bytes([15]) + b"example.invalid" + struct.pack("!H", 7) + payload
    if mode == "emptyname":
        return b"\0\0\0\x03\x00" + struct.pack("!H", 7) + payload
    raise ValueError(mode)


class Relay:
    def __init__(self, args, mode):
        self.args, self.mode = args, mode
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.sock.bind(("::", 0))
        self.out = self.sock
        if mode == "otherport":
            self.out = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            self.out.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            self.out.bind(("::", 0))
        self.port = self.sock.getsockname()[1]
        self.closed = False

    def bnd(self):
        host = {"zero": "0.0.0.0", "loopback": "127.0.0.1",
                "family": self.args.addr6}.get(self.mode, self.args.listen)
        return addr_bytes(host, self.port)

    def foreign_send(self, data, peer):
        host = peer[0].removeprefix("::ffff:")
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        src = self.args.foreign6 if fam == socket.AF_INET6 else self.args.foreign
        with socket.socket(fam, socket.SOCK_DGRAM) as f:
            f.bind((src, 0))
            f.sendto(data, (host, peer[1]))

    def serve(self):
        """Runs until the control connection ends; owns (and closes) the relay sockets."""
        mode = self.mode
        first = True
        self.sock.settimeout(0.2)
        while not self.closed:
            try:
                data, peer = self.sock.recvfrom(65535)
            except socket.timeout:
                continue
            except OSError:
                break
            req = parse_request(data)
            if req is None:
                continue
            dst, payload = req
            reply = b"\0\0\0" + dst + payload
            if payload.startswith(b"BAD") and mode == "foreign":
                self.foreign_send(reply, peer)
                continue
            if first:
                print(f"{mode}: relay port {self.port}: first datagram from {peer[0]} port "
                      f"{peer[1]}", flush=True)
                first = False
            if payload.startswith(b"BAD") and mode in MALFORMED:
                reply = malformed(mode, dst, payload)
            try:
                self.out.sendto(reply, peer)
            except OSError:
                pass
        self.sock.close()
        if self.out is not self.sock:
            self.out.close()


def handle(c, args, mode):
    relay = None
    try:
        n = recv_exact(c, 2)[1]
        recv_exact(c, n)
        c.sendall(b"\x05\x00")
        head = recv_exact(c, 4)
        alen = {1: 4, 4: 16}.get(head[3])
        if alen is None:
            return
        dst = recv_exact(c, alen + 2)
        if head[1] != 3:
            c.sendall(b"\x05\x07\x00" + addr_bytes("0.0.0.0", 0))  # command not supported
            return
        # The client's own address is not known before its first datagram (it may be behind a
        # NAT), so a client sends DST 0.0.0.0:0 (RFC 1928 section 7: zeros when it does not
        # know): anything else is refused here, so the test sees it.
        if any(dst):
            print(f"{mode}: ASSOCIATE with DST {dst.hex()} refused", flush=True)
            c.sendall(b"\x05\x02\x00" + addr_bytes("0.0.0.0", 0))  # not allowed by ruleset
            return
        relay = Relay(args, mode)
        threading.Thread(target=relay.serve, daemon=True).start()
        c.sendall(b"\x05\x00\x00" + relay.bnd())
        while c.recv(4096):
            pass
    except OSError:
        pass
    finally:
        if relay:
            relay.closed = True
        c.close()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, help="a mode, or a comma-separated list of modes")
    p.add_argument("--listen", required=True, help="IPv4 address of the control port")
    p.add_argument("--port", type=int, required=True, help="control port of the first mode")
    p.add_argument("--addr6", default="::1", help="the BND.ADDR of --mode family")
    p.add_argument("--foreign", default="127.0.0.2", help="source of --mode foreign (IPv4)")
    p.add_argument("--foreign6", default="::1", help="source of --mode foreign (IPv6)")
    args = p.parse_args()
    modes = args.mode.split(",")
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m} (one of {', '.join(MODES)})")
    servers = [socket.create_server((args.listen, args.port + i), backlog=128)
               for i in range(len(modes))]
    for srv, mode in zip(servers[1:], modes[1:]):
        threading.Thread(target=accept_loop, args=(srv, args, mode), daemon=True).start()
    accept_loop(servers[0], args, modes[0])


def accept_loop(srv, args, mode):
    while True:
        c, _ = srv.accept()
        threading.Thread(target=handle, args=(c, args, mode), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
