#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# A small QMP client (QEMU's docs/interop/qmp-spec.rst), the standard
# library alone: the tests' for control=SOCKET, and for
# qemu-storage-daemon's monitor (the same framing).
#
#   import qmpclient
#   q = qmpclient.QMP(path)          # connects, reads the greeting
#   q.negotiate()                    # qmp_capabilities
#   q.execute("query-version")       # the return, or raises QMPError
#   q.refused("x", {...})            # the error's desc; fails if not refused
#   q.command("x", {...}, id=7)      # the whole reply (error or return)
#   q.event("BLOCK_JOB_COMPLETED", timeout=10)
#   q.send_raw(b"...")               # bytes as they are; q.recv() a reply
#
# As a command: qmpclient.py SOCKET COMMAND [ARGUMENTS-JSON] prints the
# return as JSON (exit 1 and the error on stderr if refused); with
# --events N, then prints the next N events, one a line.

import json
import socket
import sys
import time


class QMPError(Exception):
    def __init__(self, reply):
        self.reply = reply
        self.error_class = reply["error"]["class"]
        self.desc = reply["error"]["desc"]
        super().__init__("%s: %s" % (self.error_class, self.desc))


class QMP:
    def __init__(self, path, timeout=30):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.timeout = timeout
        self.buf = b""
        self.events = []
        self.next_id = 0
        self.greeting = self.recv()

    def close(self):
        self.sock.close()

    def send_raw(self, data):
        self.sock.sendall(data)

    def line(self, timeout=None):
        """The next line the server sends (bytes, its CRLF kept), or
        b"" at EOF; socket.timeout past timeout seconds."""
        end = time.monotonic() + (self.timeout if timeout is None else timeout)
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                raise socket.timeout("no line from the server")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                line, self.buf = self.buf, b""
                return line
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line + b"\n"

    def recv(self, timeout=None):
        """The next message: a dict, checked as QMP's (one JSON object
        a line, ASCII, CRLF at its end); EOFError at EOF."""
        line = self.line(timeout)
        if not line:
            raise EOFError("the server closed the connection")
        assert line.endswith(b"\r\n"), line
        line.decode("ascii")
        msg = json.loads(line)
        assert isinstance(msg, dict), line
        return msg

    def reply(self, timeout=None):
        """The next reply (events met on the way are kept)."""
        while True:
            msg = self.recv(timeout)
            if "event" in msg:
                self.events.append(msg)
            else:
                return msg

    def command(self, name, arguments=None, **kw):
        """Sends one command (id=VALUE to give it an id; no id if not
        given) and returns its reply, whole."""
        msg = {"execute": name}
        if arguments is not None:
            msg["arguments"] = arguments
        if "id" in kw:
            msg["id"] = kw["id"]
        self.send_raw(json.dumps(msg).encode() + b"\n")
        return self.reply()

    def execute(self, name, arguments=None):
        """The command's return; QMPError if it is refused.  The id is
        ours, checked."""
        self.next_id += 1
        my_id = "qmpclient-%d" % self.next_id
        reply = self.command(name, arguments, id=my_id)
        assert reply.get("id") == my_id, reply
        if "error" in reply:
            raise QMPError(reply)
        return reply["return"]

    def refused(self, name, arguments=None):
        """The desc of the error the command is refused with; an
        AssertionError if it is not refused."""
        try:
            self.execute(name, arguments)
        except QMPError as e:
            return e.desc
        raise AssertionError("%s %r was not refused" % (name, arguments))

    def negotiate(self):
        self.execute("qmp_capabilities")

    def event(self, name=None, timeout=None):
        """The next event (of that name, if given; others met on the
        way are kept); socket.timeout if none comes in time."""
        end = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            for i, e in enumerate(self.events):
                if name is None or e["event"] == name:
                    return self.events.pop(i)
            msg = self.recv(max(end - time.monotonic(), 0.001))
            assert "event" in msg, msg
            self.events.append(msg)


def main(argv):
    events = 0
    if len(argv) > 2 and argv[1] == "--events":
        events = int(argv[2])
        argv = argv[:1] + argv[3:]
    if len(argv) not in (3, 4):
        sys.stderr.write("usage: qmpclient.py [--events N] SOCKET COMMAND "
                         "[ARGUMENTS-JSON]\n")
        return 2
    q = QMP(argv[1])
    q.negotiate()
    try:
        ret = q.execute(argv[2], json.loads(argv[3]) if len(argv) == 4
                        else None)
    except QMPError as e:
        sys.stderr.write("%s\n" % e)
        return 1
    print(json.dumps(ret))
    for _ in range(events):
        print(json.dumps(q.event()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
