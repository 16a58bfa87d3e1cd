#!/usr/bin/env python3
"""udpcheck.py — UDP servers and clients of the proxy suite (tests/integration/proxies.sh).

  echo --bind ADDR:PORT ...     an echo server on each address (one socket per address, so
                                every answer leaves from the address the datagram was sent to);
                                --gather N: a peer's datagrams N at a time (or what came within
                                100 ms), sent back together in one UDP GSO send
  stream --dst ADDR:PORT ...    --count datagrams of --size bytes paced --interval-ms apart from
                                one socket per --dst (the streams run at the same time); each
                                carries a sequence number and a hash of its body, every echo
                                is checked
  flows --dst ADDR:PORT         --count flows, each its own socket on its own source port
                                (--base-port + i) sending --per datagrams and waiting for
                                their echoes; at most --inflight sockets open at a time
  probe --dst ADDR:PORT ...     per --dst (at the same time): a datagram starting with BAD
                                (bad_socks5.py answers it with a malformed or foreign reply),
                                --quiet-ms of listening, then a good datagram whose echo must
                                come back: the BAD one must never reach the application
  s5 --server HOST:PORT --dst ADDR:PORT
                                SOCKS5 UDP ASSOCIATE (RFC 1928 section 7) spoken directly,
                                without the proxy: the harness's check that a SOCKS5 server
                                relays UDP, then a stream as above through it

Clients print one JSON line (per --dst); the exit status is 0 when the run met --min-pct
(stream, flows, s5) or the probe's expectation, 1 otherwise.
"""
import argparse
import hashlib
import ipaddress
import json
import os
import selectors
import socket
import struct
import sys
import threading
import time

MAGIC = b"TSUD"
HDR = struct.Struct("!4sI16s")  # magic, sequence number, blake2b-128 of the body


def big_rcvbuf(s, size=4 << 20):
    """A receive buffer that rides out a client descheduled for a while on a loaded machine:
    SO_RCVBUFFORCE (root) goes past net.core.rmem_max, SO_RCVBUF is the fallback."""
    try:
        s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), size)
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


def hostport(s):
    host, _, port = s.rpartition(":")
    return host.strip("[]"), int(port)


def family_of(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def make(seq, size, salt):
    body_len = max(size - HDR.size, 0)
    body = (salt + struct.pack("!I", seq)) * (body_len // (len(salt) + 4) + 1)
    body = body[:body_len]
    return HDR.pack(MAGIC, seq, hashlib.blake2b(body, digest_size=16).digest()) + body


def verify(data):
    """The sequence number of an intact datagram, or None."""
    if len(data) < HDR.size:
        return None
    magic, seq, digest = HDR.unpack_from(data)
    if magic != MAGIC or hashlib.blake2b(data[HDR.size:], digest_size=16).digest() != digest:
        return None
    return seq


# --- SOCKS5 UDP header (RFC 1928 section 7) --------------------------------------------------

def s5_addr(host, port):
    ip = ipaddress.ip_address(host)
    atyp = 1 if ip.version == 4 else 4
    return bytes([atyp]) + ip.packed + struct.pack("!H", port)


def s5_parse_addr(buf, off):
    """(host, port, next offset) of the address at buf[off:], or None if it is cut short."""
    if off >= len(buf):
        return None
    atyp = buf[off]
    if atyp == 1:
        n = 4
    elif atyp == 4:
        n = 16
    elif atyp == 3 and off + 1 < len(buf):
        n = 1 + buf[off + 1]
    else:
        return None
    if off + 1 + n + 2 > len(buf):
        return None
    raw = buf[off + 1:off + 1 + n]
    host = raw[1:].decode() if atyp == 3 else str(ipaddress.ip_address(raw))
    port = struct.unpack_from("!H", buf, off + 1 + n)[0]
    return host, port, off + 1 + n + 2


def recv_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("SOCKS5 server closed the connection")
        out += chunk
    return out


def s5_associate(server, user=None, password=None, timeout=3.0):
    """(control socket, relay (host, port)) after a UDP ASSOCIATE with DST 0.0.0.0:0."""
    host, port = server
    c = socket.create_connection((host, port), timeout=timeout)
    methods = b"\x02" if user else b"\x00"
    c.sendall(b"\x05\x01" + methods)
    ver, method = recv_exact(c, 2)
    if ver != 5 or method == 0xFF:
        raise ConnectionError(f"no acceptable method ({method})")
    if method == 2:
        u, p = user.encode(), password.encode()
        c.sendall(b"\x01" + bytes([len(u)]) + u + bytes([len(p)]) + p)
        if recv_exact(c, 2)[1] != 0:
            raise PermissionError("authentication refused")
    c.sendall(b"\x05\x03\x00" + s5_addr("0.0.0.0", 0))
    head = recv_exact(c, 4)
    if head[1] != 0:
        raise ConnectionError(f"UDP ASSOCIATE refused: REP {head[1]}")
    n = {1: 4, 4: 16}.get(head[3])
    if n is None:
        raise ConnectionError(f"BND ATYP {head[3]}")
    rest = recv_exact(c, n + 2)
    bnd = str(ipaddress.ip_address(rest[:n]))
    bport = struct.unpack("!H", rest[n:])[0]
    # What a client does with a BND.ADDR it cannot use: unspecified, or loopback from a server
    # that is not on loopback, means "the server's own address".
    ip = ipaddress.ip_address(bnd)
    if ip.is_unspecified or (ip.is_loopback and not ipaddress.ip_address(host).is_loopback):
        bnd = host
    return c, (bnd, bport)


# --- servers ---------------------------------------------------------------------------------

UDP_SEGMENT = 103  # linux/udp.h: send one buffer as datagrams of this size (UDP GSO)


def echo_back(sock, peer, datas):
    """datas, all from peer, back to it: several of one size in one UDP GSO send (the kernel
    cuts them into the datagrams, which then arrive at the peer's socket together), else one
    by one."""
    if len(datas) > 1 and len({len(d) for d in datas}) == 1 and datas[0]:
        try:
            sock.sendmsg([b"".join(datas)],
                         [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("=H", len(datas[0])))],
                         0, peer)
            return
        except OSError:
            pass
    for d in datas:
        try:
            sock.sendto(d, peer)
        except OSError:
            pass


def cmd_echo(args):
    sel = selectors.DefaultSelector()
    for b in args.bind:
        host, port = hostport(b)
        s = socket.socket(family_of(host), socket.SOCK_DGRAM)
        big_rcvbuf(s)
        s.bind((host, port))
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    # --gather N: a peer's datagrams wait until N have come (or GATHER_S has passed since the
    # first), then go back together (echo_back).
    pending, gather_s = {}, 0.1
    while True:
        timeout = None
        if pending:
            first = min(t0 for _, t0 in pending.values())
            timeout = max(first + gather_s - time.monotonic(), 0)
        for key, _ in sel.select(timeout):
            for _ in range(64):
                try:
                    data, peer = key.fileobj.recvfrom(65535)
                except BlockingIOError:
                    break
                if args.gather <= 1:
                    echo_back(key.fileobj, peer, [data])
                    continue
                k = (key.fileobj, peer)
                datas, _ = pending.setdefault(k, ([], time.monotonic()))
                datas.append(data)
                if len(datas) >= args.gather:
                    echo_back(key.fileobj, peer, pending.pop(k)[0])
        now = time.monotonic()
        for k in [k for k, (_, t0) in pending.items() if now - t0 >= gather_s]:
            echo_back(k[0], k[1], pending.pop(k)[0])


# --- clients ---------------------------------------------------------------------------------

class Stream:
    """One socket's paced, checked datagrams. wrap/unwrap add and strip a SOCKS5 header."""

    def __init__(self, sock, target, size, wrap=None, unwrap=None):
        self.sock, self.target, self.size = sock, target, size
        self.wrap = wrap or (lambda d: d)
        self.unwrap = unwrap or (lambda d: d)
        self.salt = os.urandom(4)
        self.got, self.corrupt, self.dup, self.sent, self.errors = set(), 0, 0, 0, 0

    def send(self, seq):
        try:
            self.sock.sendto(self.wrap(make(seq, self.size, self.salt)), self.target)
            self.sent += 1
        except OSError:
            self.errors += 1

    def drain(self):
        while True:
            try:
                data = self.sock.recv(65535)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.errors += 1
                return
            data = self.unwrap(data)
            seq = verify(data) if data is not None and len(data) == self.size else None
            if seq is None or seq >= self.sent + 1:
                self.corrupt += 1
            elif seq in self.got:
                self.dup += 1
            else:
                self.got.add(seq)

    def run(self, count, interval, wait):
        self.sock.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        t0 = time.monotonic()
        for seq in range(count):
            due = t0 + seq * interval
            while True:
                left = due - time.monotonic()
                if left <= 0:
                    break
                if sel.select(left):
                    self.drain()
            self.send(seq)
            self.drain()
        end = time.monotonic() + wait
        while len(self.got) < count and time.monotonic() < end:
            if sel.select(max(end - time.monotonic(), 0)):
                self.drain()
        return {"sent": self.sent, "delivered": len(self.got), "corrupt": self.corrupt,
                "duplicates": self.dup, "send_errors": self.errors,
                "seconds": round(time.monotonic() - t0, 3)}


def pct_ok(res, count, min_pct):
    return res["delivered"] * 100 >= count * min_pct and res["corrupt"] == 0


def each_dst(args, one):
    """Runs one(args, dst) for every --dst at the same time (a thread each); prints their
    JSON lines in the order given; 0 when every one returned a passing result."""
    out = [None] * len(args.dst)

    def run(i):
        out[i] = one(args, args.dst[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(args.dst))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for res, _ in out:
        print(json.dumps(res))
    return 0 if all(passed for _, passed in out) else 1


def stream_one(args, dst):
    host, port = hostport(dst)
    s = socket.socket(family_of(host), socket.SOCK_DGRAM)
    big_rcvbuf(s)
    res = Stream(s, (host, port), args.size).run(args.count, args.interval_ms / 1000, args.wait)
    return res, pct_ok(res, args.count, args.min_pct)


def cmd_stream(args):
    return each_dst(args, stream_one)


def cmd_flows(args):
    host, port = hostport(args.dst)
    fam = family_of(host)
    sel = selectors.DefaultSelector()
    salt = os.urandom(4)
    started = answered = corrupt = errors = 0
    outcome = [0] * (args.per + 1)  # flows by how many of their datagrams were answered
    ports = set()
    t0 = time.monotonic()
    deadline = {}
    interval = args.seconds / args.count if args.count else 0
    while started < args.count or deadline:
        while (started < args.count and len(deadline) < args.inflight
               and time.monotonic() >= t0 + started * interval):
            s = socket.socket(fam, socket.SOCK_DGRAM)
            s.setblocking(False)
            try:
                s.bind(("::" if fam == socket.AF_INET6 else "0.0.0.0", args.base_port + started))
                for k in range(args.per):
                    s.sendto(make(started * args.per + k, args.size, salt), (host, port))
            except OSError:
                errors += 1
            ports.add(s.getsockname()[1])  # 0 when the bind failed
            sel.register(s, selectors.EVENT_READ, [0])
            deadline[s] = time.monotonic() + args.timeout
            started += 1
        now = time.monotonic()
        for s in [s for s, d in deadline.items() if d <= now]:
            outcome[sel.get_key(s).data[0]] += 1
            sel.unregister(s)
            s.close()
            del deadline[s]
        for key, _ in sel.select(0.01):
            s, seen = key.fileobj, key.data
            while seen[0] < args.per:
                try:
                    data = s.recv(65535)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    errors += 1
                    seen[0] = args.per
                    break
                if verify(data) is None:
                    corrupt += 1
                else:
                    answered += 1
                    seen[0] += 1
            if seen[0] >= args.per:
                outcome[args.per] += 1
                sel.unregister(s)
                s.close()
                del deadline[s]
    res = {"flows": started, "distinct_ports": len(ports), "datagrams": started * args.per,
           "answered": answered, "by_answers": outcome, "corrupt": corrupt, "errors": errors,
           "seconds": round(time.monotonic() - t0, 3)}
    print(json.dumps(res))
    ok = answered * 100 >= started * args.per * args.min_pct and corrupt == 0
    return 0 if ok and len(ports) == started else 1


def probe_one(args, dst):
    host, port = hostport(dst)
    s = socket.socket(family_of(host), socket.SOCK_DGRAM)
    s.settimeout(args.quiet_ms / 1000)
    leaked = []
    s.sendto(b"BAD" + os.urandom(29), (host, port))
    t_end = time.monotonic() + args.quiet_ms / 1000
    while time.monotonic() < t_end:
        s.settimeout(max(t_end - time.monotonic(), 0.001))
        try:
            leaked.append(s.recv(65535))
        except socket.timeout:
            break
    good = make(7, 64, os.urandom(4))
    s.sendto(good, (host, port))
    s.settimeout(args.wait)
    got = None
    try:
        while True:
            data = s.recv(65535)
            if data == good:
                got = data
                break
            leaked.append(data)
    except socket.timeout:
        pass
    res = {"leaked": len(leaked), "good_echoed": got is not None}
    return res, not leaked and got is not None


def cmd_probe(args):
    return each_dst(args, probe_one)


def cmd_s5(args):
    server = hostport(args.server)
    dst_host, dst_port = hostport(args.dst)
    try:
        ctrl, relay = s5_associate(server, args.user, args.password)
    except (OSError, ConnectionError) as e:
        print(json.dumps({"error": str(e)}))
        return 1
    s = socket.socket(family_of(relay[0]), socket.SOCK_DGRAM)
    big_rcvbuf(s)
    head = b"\0\0\0" + s5_addr(dst_host, dst_port)

    def unwrap(d):
        if len(d) < 4 or d[:3] != b"\0\0\0":
            return None
        a = s5_parse_addr(d, 3)
        return None if a is None else d[a[2]:]

    res = Stream(s, relay, args.size, lambda d: head + d, unwrap).run(
        args.count, args.interval_ms / 1000, args.wait)
    res["relay"] = f"{relay[0]}:{relay[1]}"
    ctrl.close()
    print(json.dumps(res))
    return 0 if pct_ok(res, args.count, args.min_pct) else 1


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("echo")
    q.add_argument("--bind", action="append", required=True)
    q.add_argument("--gather", type=int, default=1,
                   help="echo a peer's datagrams N at a time, in one UDP GSO send")
    for name in ("stream", "s5"):
        q = sub.add_parser(name)
        if name == "stream":
            q.add_argument("--dst", action="append", required=True,
                           help="repeatable: a stream to each, at the same time")
        else:
            q.add_argument("--dst", required=True)
        q.add_argument("--size", type=int, default=64)
        q.add_argument("--count", type=int, default=100)
        q.add_argument("--interval-ms", type=float, default=2.0)
        q.add_argument("--wait", type=float, default=1.0, help="seconds for late echoes")
        q.add_argument("--min-pct", type=float, default=99.0)
        if name == "s5":
            q.add_argument("--server", required=True)
            q.add_argument("--user")
            q.add_argument("--password")
    q = sub.add_parser("flows")
    q.add_argument("--dst", required=True)
    q.add_argument("--count", type=int, default=1000)
    q.add_argument("--per", type=int, default=1, help="datagrams per flow")
    q.add_argument("--size", type=int, default=64)
    q.add_argument("--inflight", type=int, default=200)
    q.add_argument("--base-port", type=int, default=20000,
                   help="flow i binds source port base + i (below the ephemeral range)")
    q.add_argument("--seconds", type=float, default=2.0, help="spread the flows' starts over this")
    q.add_argument("--timeout", type=float, default=3.0, help="per flow")
    q.add_argument("--min-pct", type=float, default=99.0)
    q = sub.add_parser("probe")
    q.add_argument("--dst", action="append", required=True, help="repeatable, as for stream")
    q.add_argument("--quiet-ms", type=int, default=500)
    q.add_argument("--wait", type=float, default=2.0)
    args = p.parse_args()
    return {"echo": cmd_echo, "stream": cmd_stream, "flows": cmd_flows, "probe": cmd_probe,
            "s5": cmd_s5}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
