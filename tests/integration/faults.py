#!/usr/bin/python3
"""faults.py: the servers and applications of tests/integration/faults.sh (python3 standard
library only). Every client prints one JSON object on stdout and exits 0 once it has a
verdict to report (the shell script judges it); one that cannot even start (its connect
fails) prints {"end": "setup:REASON", ...} and exits 1.

Servers (namespace S); each prints "READY" once it listens:
  sink   --bind A --port P [--chunk B] [--every-ms MS] [--mark PATH]
         reads B bytes every MS ms per connection (a slow reader with a 64 KiB receive
         buffer: its receive queue fills); creates PATH once the first bytes arrived
  source --bind A --port P [--chunk B] [--every-ms MS]
         writes B bytes of its byte pattern every MS ms to every connection (64 KiB send
         buffer: little waits at the server when it dies)
  gate   --bind A --port P --conns N [--hold-ms MS] [--max-wait-ms MS]
         an echo server that reads nothing (a small receive buffer: what the clients send
         waits on the path) until N connections are open and MS ms have passed since the
         Nth, or MAX ms since the first; then echoes every byte of every connection
Applications (namespace D):
  upload   --target A:P --kill PID --mark PATH [--after-ms MS] [--bound-ms MS]
           writes without pause; once the server got bytes (PATH exists: the whole path,
           a SOCKS5 handshake included, carries data), a write found the send buffer full
           (every buffer on the path is, the receive queue of PID's socket too) and MS ms
           have passed, SIGKILLs PID (the server, or a SOCKS5 server on the path) and times
           how long the connection takes to fail -> {"end","ms","sent"}
  download --target A:P --kill PID [--after-ms MS] [--bound-ms MS]
           reads and checks the source's pattern; once it got bytes and MS ms have passed,
           SIGKILLs PID and times the end of the stream -> {"end","ms","received",
           "pattern_ok"}
  push     --target A:P [--hold-ms MS]
           writes without pause and reads nothing; keeps its send buffer full for MS ms
           once it is, then closes -> {"sent"}
  rst      --target A:P [--count N] [--bound-ms MS]
           N connections at once, none sends; each must end in a RST (refused before the
           handshake, reset after it) -> {"refused","reset","eof","data","timeout","other",
           "min_ms","max_ms"}
  udp      --target A:P [--flows N] [--extra M] [--timeout-ms MS]
           N sockets each send one datagram of its own and must get it back; then M new
           sockets one datagram each (their answers are counted, MS ms); then the first N
           send again -> {"first","extra","again","bad"} (answers per phase; bad: a wrong one)
  burst    --target A:P [--count N] [--timeout-ms MS]
           one socket sends N datagrams back to back, then counts the answers for MS ms
           -> {"sent","answered"}
"""
import argparse
import errno
import json
import os
import select
import signal
import socket
import sys
import threading
import time


def now_ms():
    return time.monotonic() * 1000.0


def parse_target(s):
    host, _, port = s.rpartition(":")
    return host.strip("[]"), int(port)


def family_of(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


# The source's stream: byte i is (i * 7 + i // 251) mod 256, which repeats every 251 * 256
# bytes (so a shifted, repeated or dropped block shows).
PATTERN_BLOCK = bytes(((i * 7 + i // 251) & 0xFF) for i in range(251 * 256))


def pattern_at(offset, n):
    """n bytes of the stream from offset."""
    out = bytearray()
    while len(out) < n:
        start = (offset + len(out)) % len(PATTERN_BLOCK)
        out += PATTERN_BLOCK[start:start + n - len(out)]
    return bytes(out)


def emit(doc):
    print(json.dumps(doc, separators=(",", ":")), flush=True)
    return 0


def end_kind(e):
    if isinstance(e, ConnectionRefusedError):
        return "refused"
    if isinstance(e, ConnectionResetError):
        return "reset"
    if isinstance(e, BrokenPipeError):
        return "epipe"
    return "error:%s" % errno.errorcode.get(getattr(e, "errno", 0) or 0, type(e).__name__)


# --- servers -------------------------------------------------------------------------------

def serve(args, handler, rcvbuf=0, sndbuf=0):
    ls = socket.socket(family_of(args.bind), socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if rcvbuf:  # inherited by accepted sockets; set before listen so the window scale fits
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if sndbuf:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    ls.bind((args.bind, args.port))
    ls.listen(64)
    print("READY", flush=True)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=handler, args=(c, args), daemon=True).start()


def sink_conn(c, args):
    try:
        if c.recv(args.chunk) and args.mark:
            open(args.mark, "w").close()
        while c.recv(args.chunk):
            time.sleep(args.every_ms / 1000.0)
    except OSError:
        pass
    c.close()


def source_conn(c, args):
    off = 0
    try:
        while True:
            off += c.send(pattern_at(off, args.chunk))
            time.sleep(args.every_ms / 1000.0)
    except OSError:
        pass
    c.close()


class Gate:
    """Opens once args.conns connections arrived and args.hold_ms passed, or args.max_wait_ms
    after the first: until then every connection's bytes wait on the path."""

    def __init__(self, args):
        self.args = args
        self.open = threading.Event()
        self.lock = threading.Lock()
        self.seen = 0

    def arrived(self):
        with self.lock:
            self.seen += 1
            n = self.seen
        if n == 1:
            threading.Timer(self.args.max_wait_ms / 1000.0, self.open.set).start()
        if n == self.args.conns:
            threading.Timer(self.args.hold_ms / 1000.0, self.open.set).start()


def gate_conn(c, args):
    args.gate.arrived()
    args.gate.open.wait()
    try:
        while True:
            b = c.recv(65536)
            if not b:
                break
            c.sendall(b)
    except OSError:
        pass
    c.close()


def cmd_gate(args):
    args.gate = Gate(args)
    serve(args, gate_conn, rcvbuf=4096)


def cmd_sink(args):
    serve(args, sink_conn, rcvbuf=65536)


def cmd_source(args):
    serve(args, source_conn, sndbuf=65536)


# --- applications --------------------------------------------------------------------------

def connect(target, timeout=3.0):
    host, port = parse_target(target)
    s = socket.socket(family_of(host), socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect((host, port))
    s.setblocking(False)
    return s


def cmd_upload(args):
    s = connect(args.target)
    block = b"u" * 65536
    t0 = now_ms()
    sent = 0
    full = False
    t_kill = None
    p = select.poll()
    p.register(s, select.POLLOUT | select.POLLIN | select.POLLERR | select.POLLHUP)
    while True:
        t = now_ms()
        if t_kill is None and t - t0 >= args.after_ms and full and os.path.exists(args.mark):
            os.kill(args.kill, signal.SIGKILL)
            t_kill = now_ms()
        if t_kill is not None and t - t_kill > args.bound_ms:
            return emit({"end": "timeout", "ms": round(t - t_kill, 1), "sent": sent})
        if t_kill is None and t - t0 > args.after_ms + args.bound_ms:
            return emit({"end": "never_full" if not full else "server_got_nothing",
                         "ms": -1, "sent": sent})
        ev = p.poll(20)
        try:
            if any(e & select.POLLIN for _, e in ev) and s.recv(4096) == b"":
                return emit({"end": "eof", "ms": round(now_ms() - (t_kill or t0), 1), "sent": sent,
                             "before_kill": t_kill is None})
            n = s.send(block)
            sent += n
        except BlockingIOError:
            full = True
        except OSError as e:
            t = now_ms()
            return emit({"end": end_kind(e), "ms": round(t - (t_kill or t0), 1), "sent": sent,
                         "before_kill": t_kill is None})


def cmd_download(args):
    s = connect(args.target)
    t0 = now_ms()
    got = 0
    ok = True
    t_kill = None
    p = select.poll()
    p.register(s, select.POLLIN | select.POLLERR | select.POLLHUP)
    while True:
        t = now_ms()
        if t_kill is None and t - t0 >= args.after_ms and got > 0:
            os.kill(args.kill, signal.SIGKILL)
            t_kill = now_ms()
        if t_kill is not None and t - t_kill > args.bound_ms:
            return emit({"end": "timeout", "ms": round(t - t_kill, 1), "received": got,
                         "pattern_ok": ok})
        if t_kill is None and t - t0 > args.after_ms + args.bound_ms:
            return emit({"end": "got_nothing", "ms": -1, "received": got, "pattern_ok": ok})
        p.poll(20)
        try:
            for _ in range(16):  # then back to the clock
                data = s.recv(262144)
                if not data:
                    return emit({"end": "eof", "ms": round(now_ms() - (t_kill or t0), 1),
                                 "received": got, "pattern_ok": ok,
                                 "before_kill": t_kill is None})
                ok = ok and data == pattern_at(got, len(data))
                got += len(data)
        except BlockingIOError:
            pass
        except OSError as e:
            return emit({"end": end_kind(e), "ms": round(now_ms() - (t_kill or t0), 1),
                         "received": got, "pattern_ok": ok, "before_kill": t_kill is None})


def cmd_push(args):
    s = connect(args.target)
    block = b"p" * 65536
    sent = 0
    full_at = None
    while full_at is None or now_ms() - full_at < args.hold_ms:
        try:
            sent += s.send(block)
        except BlockingIOError:
            if full_at is None:
                full_at = now_ms()
            select.select([], [s], [], 0.02)
    s.close()
    return emit({"sent": sent})


def cmd_rst(args):
    host, port = parse_target(args.target)
    res = {"refused": 0, "reset": 0, "eof": 0, "data": 0, "timeout": 0, "other": 0}
    times = []
    socks = {}
    t0 = now_ms()
    p = select.poll()
    for _ in range(args.count):
        s = socket.socket(family_of(host), socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((host, port))
        socks[s.fileno()] = s
        p.register(s, select.POLLIN | select.POLLERR | select.POLLHUP)

    def done(fd, kind):
        res[kind] += 1
        times.append(now_ms() - t0)
        p.unregister(fd)
        socks.pop(fd).close()

    while socks and now_ms() - t0 < args.bound_ms:
        for fd, _ in p.poll(10):
            s = socks[fd]
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                done(fd, {errno.ECONNREFUSED: "refused", errno.ECONNRESET: "reset"}.get(err, "other"))
                continue
            try:
                done(fd, "data" if s.recv(1) else "eof")
            except BlockingIOError:
                pass
            except OSError as e:
                done(fd, {"refused": "refused", "reset": "reset"}.get(end_kind(e), "other"))
    res["timeout"] = len(socks)
    for s in socks.values():
        s.close()
    res["min_ms"] = round(min(times), 1) if times else -1
    res["max_ms"] = round(max(times), 1) if times else -1
    return emit(res)


def udp_round(socks, tag, timeout_ms):
    """Each socket sends its own datagram; returns (answered, bad)."""
    want = {}
    for i, s in enumerate(socks):
        msg = b"%s %d " % (tag, i) + os.urandom(48)
        want[s.fileno()] = msg
        s.send(msg)
    answered = bad = 0
    end = now_ms() + timeout_ms
    pending = {s.fileno(): s for s in socks}
    while pending and now_ms() < end:
        r, _, _ = select.select(list(pending.values()), [], [], max(0.0, (end - now_ms()) / 1000))
        for s in r:
            try:
                got = s.recv(2048)
            except OSError:
                continue
            if got == want[s.fileno()]:
                answered += 1
            else:
                bad += 1
            pending.pop(s.fileno(), None)
    return answered, bad


def cmd_udp(args):
    host, port = parse_target(args.target)

    def opened(n):
        out = []
        for _ in range(n):
            s = socket.socket(family_of(host), socket.SOCK_DGRAM)
            s.connect((host, port))
            out.append(s)
        return out

    held = opened(args.flows)
    first, bad1 = udp_round(held, b"first", 2000)
    extra = opened(args.extra)
    got_extra, bad2 = udp_round(extra, b"extra", args.timeout_ms)
    again, bad3 = udp_round(held, b"again", 2000)
    for s in held + extra:
        s.close()
    return emit({"first": first, "extra": got_extra, "again": again, "bad": bad1 + bad2 + bad3})


def cmd_burst(args):
    host, port = parse_target(args.target)
    s = socket.socket(family_of(host), socket.SOCK_DGRAM)
    s.connect((host, port))
    for i in range(args.count):
        s.send(b"burst %d" % i)
    answered = 0
    end = now_ms() + args.timeout_ms
    while now_ms() < end:
        r, _, _ = select.select([s], [], [], max(0.0, (end - now_ms()) / 1000))
        if r:
            s.recv(2048)
            answered += 1
    s.close()
    return emit({"sent": args.count, "answered": answered})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, chunk, every in (("sink", 1024, 100), ("source", 16384, 10)):
        p = sub.add_parser(name)
        p.add_argument("--bind", required=True)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--chunk", type=int, default=chunk)
        p.add_argument("--every-ms", type=int, default=every)
        p.add_argument("--mark", default="")
    p = sub.add_parser("gate")
    p.add_argument("--bind", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--conns", type=int, required=True)
    p.add_argument("--hold-ms", type=int, default=300)
    p.add_argument("--max-wait-ms", type=int, default=3000)
    for name in ("upload", "download"):
        p = sub.add_parser(name)
        p.add_argument("--target", required=True)
        p.add_argument("--kill", type=int, required=True)
        p.add_argument("--mark", default="")
        p.add_argument("--after-ms", type=int, default=300)
        p.add_argument("--bound-ms", type=int, default=3000)
    p = sub.add_parser("push")
    p.add_argument("--target", required=True)
    p.add_argument("--hold-ms", type=int, default=1000)
    p = sub.add_parser("rst")
    p.add_argument("--target", required=True)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--bound-ms", type=int, default=3000)
    p = sub.add_parser("udp")
    p.add_argument("--target", required=True)
    p.add_argument("--flows", type=int, default=1)
    p.add_argument("--extra", type=int, default=0)
    p.add_argument("--timeout-ms", type=int, default=1000)
    p = sub.add_parser("burst")
    p.add_argument("--target", required=True)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--timeout-ms", type=int, default=1000)
    args = ap.parse_args()
    try:
        return globals()["cmd_" + args.cmd](args)
    except OSError as e:
        emit({"end": "setup:%s" % end_kind(e), "error": str(e)})
        return 1


if __name__ == "__main__":
    sys.exit(main())
