# SPDX-License-Identifier: BSD-3-Clause
"""A local HTTP server for tests: serves DIR on 127.0.0.1 (a free port,
written to PORTFILE) and answers Range requests, which Python's own
http.server does not; HTTPS with the certificate and key in PEMFILE.
RANGE_SERVER_DELAY=SECONDS waits that long before each answer (a slow
network, for bench/remote.sh).  RANGE_SERVER_LOG=FILE appends each
request's headers to FILE (what a client sent, for the tests).
RANGE_SERVER_REDIRECT=URL answers every request with a redirect (302)
to URL followed by the path asked (a server sending its clients
elsewhere, over another protocol maybe).
Usage: range-server.py DIR PORTFILE [PEMFILE]"""
import http.server
import os
import re
import ssl
import sys
import time

DELAY = float(os.environ.get("RANGE_SERVER_DELAY", "0"))
LOG = os.environ.get("RANGE_SERVER_LOG")
REDIRECT = os.environ.get("RANGE_SERVER_REDIRECT")


class Handler(http.server.SimpleHTTPRequestHandler):
    # A client that stops talking frees its thread.
    timeout = 60
    tls = None

    def setup(self):
        # The TLS handshake in the connection's own thread: done in
        # accept(), as a wrapped listening socket does it, one client
        # stalled or refusing the certificate held up every other one.
        if self.tls:
            self.request = self.tls.wrap_socket(self.request, server_side=True)
        super().setup()

    def send_head(self):
        if DELAY:
            time.sleep(DELAY)
        if LOG:
            with open(LOG, "a") as f:
                f.write(self.requestline + "\n" + str(self.headers))
        if REDIRECT:
            self.send_response(302)
            self.send_header("Location", REDIRECT + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        path = self.translate_path(self.path)
        m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if not m or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
        f = open(path, "rb")
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self.range_left = end - start + 1
        return f

    def end_headers(self):
        self.send_header("Accept-Ranges", "bytes")
        super().end_headers()

    def copyfile(self, source, outputfile):
        left = getattr(self, "range_left", None)
        if left is None:
            return super().copyfile(source, outputfile)
        while left > 0:
            buf = source.read(min(left, 1 << 20))
            if not buf:
                break
            outputfile.write(buf)
            left -= len(buf)

    def log_message(self, *args):
        pass


os.chdir(sys.argv[1])
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
if len(sys.argv) > 3:
    Handler.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    Handler.tls.load_cert_chain(sys.argv[3])
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
server.serve_forever()
