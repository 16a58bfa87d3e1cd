#!/usr/bin/python3
"""tsnet.py: the small network tools of the namespace suite (python3 standard library only,
except `metrics`, which needs python3-prometheus-client).

Servers (run inside namespace B):
  tcp-echo  --port P                  echo every byte back; close after the client's EOF
Clients (run inside namespace A or C); each prints one line and exits 0 on success, 1 otherwise:
  echo-many --host H --port P -n N    N concurrent connections, each writes a distinct payload
                                      and must read exactly that payload back
  half-close --host H --port P        write, shutdown(SHUT_WR), read to EOF: the echo is complete
             [--bytes B] [--count K]  (B bytes, 256 KiB by default; K connections one after another)
  bulk-echo --host H --port P --mib M M MiB of random bytes written while the echo is read
                                      back (two threads), then SHUT_WR and EOF; sha256 equal:
                                      bulk data both ways, the uplink in large writes
  udp-echo  --host H --port P         three distinct datagrams, each answered with itself
  rst       --host H --port P --within S
                                      the connection must fail with a RST (refused or reset)
                                      within S seconds, not by EOF or timeout
  metrics                             parse Prometheus text from stdin
Every client operation has a deadline; nothing here waits unbounded.
"""
import argparse
import asyncio
import hashlib
import os
import socket
import sys
import threading
import time


def family_of(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


# --- servers -------------------------------------------------------------------------------

async def _echo_conn(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _tcp_echo(port):
    # host=None binds every address of both families (separate v4 and v6 sockets).
    server = await asyncio.start_server(_echo_conn, host=None, port=port, backlog=4096,
                                        reuse_address=True)
    async with server:
        await server.serve_forever()


def cmd_tcp_echo(args):
    asyncio.run(_tcp_echo(args.port))
    return 0


# --- clients -------------------------------------------------------------------------------

async def _echo_one(host, port, index, deadline):
    # Distinct payload: index in the header plus a per-connection pseudo-random body whose
    # length varies, so a swapped or truncated stream cannot pass.
    body = hashlib.sha256(b"twinstack-%d" % index).digest() * (64 + (index * 37) % 448)
    payload = b"conn %05d len %07d\n" % (index, len(body)) + body
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                            deadline - time.monotonic())
    try:
        writer.write(payload)
        await asyncio.wait_for(writer.drain(), deadline - time.monotonic())
        got = await asyncio.wait_for(reader.readexactly(len(payload)),
                                     deadline - time.monotonic())
    finally:
        writer.close()
    if got != payload:
        raise ValueError("connection %d: payload mismatch" % index)
    return len(payload)


async def _echo_many(host, port, n, timeout):
    deadline = time.monotonic() + timeout
    results = await asyncio.gather(*(_echo_one(host, port, i, deadline) for i in range(n)),
                                   return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    total = sum(r for r in results if not isinstance(r, BaseException))
    return errors, total


def cmd_echo_many(args):
    t0 = time.monotonic()
    errors, total = asyncio.run(_echo_many(args.host, args.port, args.n, args.timeout))
    dt = time.monotonic() - t0
    if errors:
        kinds = {}
        for e in errors:
            k = type(e).__name__ + (": " + str(e) if str(e) else "")
            kinds[k] = kinds.get(k, 0) + 1
        summary = "; ".join("%d x %s" % (c, k) for k, c in sorted(kinds.items())[:4])
        print("%d/%d connections failed (%s) in %.2fs" % (len(errors), args.n, summary, dt))
        return 1
    print("%d connections, %d bytes echoed in %.2fs" % (args.n, total, dt))
    return 0


def cmd_half_close(args):
    for i in range(args.count):
        payload = os.urandom(args.bytes)
        s = socket.socket(family_of(args.host), socket.SOCK_STREAM)
        s.settimeout(args.timeout)
        got = bytearray()
        try:
            s.connect((args.host, args.port))
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except OSError as e:
            print("connection %d: %s after %d bytes back" % (i, type(e).__name__, len(got)))
            return 1
        finally:
            s.close()
        if bytes(got) != payload:
            print("connection %d: echo after half-close: %d of %d bytes, %s" %
                  (i, len(got), len(payload),
                   "prefix ok" if payload.startswith(bytes(got)) else "mismatch"))
            return 1
    print("%d bytes echoed after shutdown(SHUT_WR), then EOF%s" %
          (args.bytes, "" if args.count == 1 else ", %d connections" % args.count))
    return 0


def cmd_bulk_echo(args):
    payload = os.urandom(args.mib * 1024 * 1024)
    deadline = time.monotonic() + args.timeout
    s = socket.socket(family_of(args.host), socket.SOCK_STREAM)
    s.settimeout(args.timeout)
    sent = {"err": None}

    def send():
        try:
            view = memoryview(payload)
            for off in range(0, len(payload), 1 << 20):
                s.sendall(view[off:off + (1 << 20)])
            s.shutdown(socket.SHUT_WR)
        except OSError as e:
            sent["err"] = e

    h = hashlib.sha256()
    n = 0
    t0 = time.monotonic()
    try:
        s.connect((args.host, args.port))
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        while True:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            chunk = s.recv(1 << 18)
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
        sender.join(max(0.1, deadline - time.monotonic()))
    except OSError as e:
        print("%s after %d of %d bytes back" % (type(e).__name__, n, len(payload)))
        return 1
    finally:
        s.close()
    dt = time.monotonic() - t0
    if sent["err"] is not None:
        print("send failed: %s: %s" % (type(sent["err"]).__name__, sent["err"]))
        return 1
    if n != len(payload) or h.digest() != hashlib.sha256(payload).digest():
        print("echo: %d of %d bytes back, sha256 %s" %
              (n, len(payload), "equal" if h.digest() == hashlib.sha256(payload).digest() else "differs"))
        return 1
    print("%d MiB up and back, sha256 equal, %.2fs" % (args.mib, dt))
    return 0


def cmd_udp_echo(args):
    s = socket.socket(family_of(args.host), socket.SOCK_DGRAM)
    s.settimeout(args.timeout)
    try:
        s.connect((args.host, args.port))
        for i in range(3):
            payload = b"udp %d " % i + os.urandom(64 + 400 * i)
            s.send(payload)
            try:
                got = s.recv(65536)
            except socket.timeout:
                print("datagram %d: no reply within %.1fs" % (i, args.timeout))
                return 1
            if got != payload:
                print("datagram %d: reply differs (%d vs %d bytes)" % (i, len(got), len(payload)))
                return 1
    except OSError as e:
        print("%s: %s" % (type(e).__name__, e))
        return 1
    finally:
        s.close()
    print("3 datagrams echoed")
    return 0


def cmd_rst(args):
    s = socket.socket(family_of(args.host), socket.SOCK_STREAM)
    limit = args.within * 3 + 1
    s.settimeout(limit)
    t0 = time.monotonic()
    try:
        s.connect((args.host, args.port))
        # A proxy accepts first and resets once its outbound fails: the RST arrives as
        # ECONNRESET on the next read.
        data = s.recv(1)
        dt = time.monotonic() - t0
        print("connected and got %s after %.3fs instead of a RST" %
              ("EOF (FIN)" if not data else "data", dt))
        return 1
    except (ConnectionRefusedError, ConnectionResetError) as e:
        dt = time.monotonic() - t0
        if dt > args.within:
            print("%s after %.3fs (> %.1fs)" % (type(e).__name__, dt, args.within))
            return 1
        print("%s after %.3fs" % (type(e).__name__, dt))
        return 0
    except socket.timeout:
        print("no answer within %.1fs" % limit)
        return 1
    except OSError as e:
        print("%s after %.3fs: %s" % (type(e).__name__, time.monotonic() - t0, e))
        return 1
    finally:
        s.close()


def cmd_metrics(args):
    from prometheus_client.parser import text_string_to_metric_families
    text = sys.stdin.read()
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and friends on bad input
        print("parse error: %s: %s" % (type(e).__name__, e))
        return 1
    samples = [s for f in families for s in f.samples]
    if len(families) < args.min_families or not samples:
        print("only %d families, %d samples" % (len(families), len(samples)))
        return 1
    print("%d families, %d samples" % (len(families), len(samples)))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("tcp-echo")
    q.add_argument("--port", type=int, required=True)
    q.set_defaults(fn=cmd_tcp_echo)
    for name, fn in (("echo-many", cmd_echo_many), ("half-close", cmd_half_close),
                     ("bulk-echo", cmd_bulk_echo), ("udp-echo", cmd_udp_echo), ("rst", cmd_rst)):
        q = sub.add_parser(name)
        q.add_argument("--host", required=True)
        q.add_argument("--port", type=int, required=True)
        q.add_argument("--timeout", type=float, default=10.0)
        q.set_defaults(fn=fn)
        if name == "echo-many":
            q.add_argument("-n", type=int, default=200)
        if name == "half-close":
            q.add_argument("--bytes", type=int, default=256 * 1024)
            q.add_argument("--count", type=int, default=1)
        if name == "bulk-echo":
            q.add_argument("--mib", type=int, default=32)
        if name == "rst":
            q.add_argument("--within", type=float, default=1.0)
    q = sub.add_parser("metrics")
    q.add_argument("--min-families", type=int, default=5)
    q.set_defaults(fn=cmd_metrics)
    args = p.parse_args()
    sys.exit(args.fn(args))


if __name__ == "__main__":
    main()
