#!/usr/bin/env python3
"""sniffsrv.py — servers and a client for tests/integration/sniff.sh.

  tls ADDR PORT CERT KEY DIR   an HTTPS server (HTTP/1.1 over TLS) serving DIR's files
  banner ADDR PORT             a server that speaks first: "220 banner\\r\\n" at once, then
                               echoes what the client sends
  split-hello ADDR PORT NAME PATH PARTS GAP_MS
                               an HTTPS client: the ClientHello for SNI NAME goes out in PARTS
                               TCP segments GAP_MS apart (TCP_NODELAY), then GET PATH; the
                               body on stdout (certificate not checked: a test certificate)
  first-bytes ADDR PORT        a client: connect, print the milliseconds until the server's
                               first bytes arrive (at most 5 s), then close
"""
import functools
import http.server
import socket
import socketserver
import ssl
import sys
import time


def serve_tls(addr, port, cert, key, directory):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=directory)
    httpd = http.server.ThreadingHTTPServer((addr, int(port)), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    httpd.serve_forever()


class Banner(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(b"220 banner\r\n")
        while True:
            data = self.request.recv(4096)
            if not data:
                return
            self.request.sendall(data)


def serve_banner(addr, port):
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    with socketserver.ThreadingTCPServer((addr, int(port)), Banner) as srv:
        srv.serve_forever()


def pump(sock, obj, inc, out):
    """Run one handshake step's I/O: flush what TLS wrote, feed what the server sent."""
    data = out.read()
    if data:
        sock.sendall(data)


def split_hello(addr, port, name, path, parts, gap_ms):
    parts, gap = int(parts), int(gap_ms) / 1000.0
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=name)
    sock = socket.create_connection((addr, int(port)), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello = out.read()
    step = (len(hello) + parts - 1) // parts
    for i in range(0, len(hello), step):
        sock.sendall(hello[i:i + step])
        if i + step < len(hello):
            time.sleep(gap)
    while True:
        try:
            obj.do_handshake()
            pump(sock, obj, inc, out)
            break
        except ssl.SSLWantReadError:
            pump(sock, obj, inc, out)
            data = sock.recv(65536)
            if not data:
                raise SystemExit("server closed during the handshake")
            inc.write(data)
    req = "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, name)
    obj.write(req.encode())
    pump(sock, obj, inc, out)
    resp = b""
    while True:
        try:
            chunk = obj.read(65536)
            if not chunk:
                break
            resp += chunk
        except ssl.SSLWantReadError:
            data = sock.recv(65536)
            if not data:
                break
            inc.write(data)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            break
    head, _, body = resp.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.") or b" 200 " not in head.split(b"\r\n")[0]:
        raise SystemExit("bad response: %r" % head[:80])
    sys.stdout.buffer.write(body)


def first_bytes(addr, port):
    t0 = time.monotonic()
    sock = socket.create_connection((addr, int(port)), timeout=5)
    sock.settimeout(5)
    data = sock.recv(64)
    ms = (time.monotonic() - t0) * 1000
    sock.close()
    if not data:
        raise SystemExit("closed without a byte")
    print("%d" % ms)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    {"tls": serve_tls, "banner": serve_banner, "split-hello": split_hello,
     "first-bytes": first_bytes}[cmd](*args)


if __name__ == "__main__":
    main()
