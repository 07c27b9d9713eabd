#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# control=SOCKET speaks QMP over the socket as QEMU does: the greeting
# (our version), negotiation first, ids echoed whatever their JSON,
# QEMU's errors for what a client gets wrong; input cut anywhere or
# joined, broken, binary, deep, or over 1 MiB (an error, then the
# connection closed), never a crash; several clients at once, one that
# stops reading dropped without holding the others; the socket is not
# NBD's, nor NBD's socket QMP.  (Every error class, and every argument
# check, is in test-unit-control-qmp: no built-in command answers
# DeviceNotFound.)
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdinfo
requires_python_nbd
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/control-functions.sh"

qemu-img create -q -f qcow2 "$tmp/disk.qcow2" 16M
control_serve srv qcow2 "$tmp/disk.qcow2"

/usr/bin/python3 - "$tmp/srv.qmp" "$tmp/srv.sock" <<'PY' || fail "QMP over control="
import json, os, socket, sys, threading, time
import nbd
import qmpclient

qmp, nbdsock = sys.argv[1], sys.argv[2]

# The greeting: QEMU's shape, our version.
q = qmpclient.QMP(qmp)
g = q.greeting["QMP"]
assert g["capabilities"] == [], g
v = g["version"]
assert sorted(v["qemu"]) == ["major", "micro", "minor"], v
assert all(isinstance(n, int) for n in v["qemu"].values()), v
assert v["package"].startswith("nbdkit-qcow2 "), v
assert v["package"] == "nbdkit-qcow2 %(major)d.%(minor)d.%(micro)d" % v["qemu"], v

def error(reply, cls, desc=None):
    assert "error" in reply and "return" not in reply, reply
    assert reply["error"]["class"] == cls, reply
    assert desc is None or reply["error"]["desc"] == desc, reply

# Nothing before negotiation.
error(q.command("query-version", id=1), "CommandNotFound",
      "Expecting capabilities negotiation with 'qmp_capabilities'")
error(q.command("qmp_capabilities", {"enable": ["oob"]}), "GenericError",
      "Capability oob not available")
q.negotiate()
error(q.command("qmp_capabilities"), "CommandNotFound",
      "Capabilities negotiation is already complete, command ignored")
assert q.execute("query-version") == v, "query-version is the greeting's"
names = [c["name"] for c in q.execute("query-commands")]
assert names[:3] == ["qmp_capabilities", "query-version", "query-commands"], names
error(q.command("blockdev-add", {"node-name": "x"}, id=2), "CommandNotFound",
      "The command blockdev-add has not been found")

# Ids: any JSON value, echoed.
for i in [0, -5, 2**63 - 1, 1.25, "x", "", "\u00e9\U0001f4be", None, True,
          [], {}, {"a": [1, {"b": None}], "c": "d"}, [[[[]]]]]:
    r = q.command("query-version", id=i)
    assert r["id"] == i and "return" in r, (i, r)
r = q.command("query-version")
assert "id" not in r, r

# Bad input, QEMU's errors, and the session goes on.
def raw(data, n=1):
    q.send_raw(data)
    return [q.reply() for _ in range(n)]
for data, desc in [
        (b'{"execute": }\n', "JSON parse error, unexpected character"),
        (b'[1, 2]\n', "QMP input must be a JSON object"),
        (b'{}\n', "QMP input lacks member 'execute'"),
        (b'{"execute": 1, "id": 3}\n',
         "QMP input member 'execute' must be a string"),
        (b'{"execute": "query-version", "arguments": 1}\n',
         "QMP input member 'arguments' must be an object"),
        (b'{"execute": "query-version", "foo": 1}\n',
         "QMP input member 'foo' is unexpected"),
        (b'{"execute": "query-version", "arguments": {"a": 1}}\n',
         "Parameter 'a' is unexpected"),
        (b'\xff\xfe\n', "JSON parse error, invalid utf-8 string"),
        (b'[' * 5000 + b'\n', "JSON nesting depth limit exceeded")]:
    (r,) = raw(data)
    error(r, "GenericError", desc)
# Binary garbage: errors (at most one a line or '{'), then it answers.
garbage = bytes((i * 7919 + 13) % 256 for i in range(20000)).replace(b"{", b"")
q.send_raw(garbage + b'\n{"execute": "query-version", "id": "after"}\n')
while True:
    r = q.reply()
    if r.get("id") == "after":
        break
    error(r, "GenericError")
# One message a byte at a time, then several in one write.
msg = b'{"execute": "query-version", "id": "slow"}'
for i in range(len(msg)):
    q.send_raw(msg[i:i + 1])
    time.sleep(0.002)
assert q.reply()["id"] == "slow"
rs = raw(b''.join(b'{"execute": "query-version", "id": %d}\r\n' % i
                  for i in range(50)), 50)
assert [r["id"] for r in rs] == list(range(50)), rs
# A deep id (as deep as Python reads).
deep = json.loads("[" * 400 + "]" * 400)
assert q.command("query-version", id=deep)["id"] == deep

# Over 1 MiB: an error, then the connection closed; others unharmed.
other = qmpclient.QMP(qmp)
other.negotiate()
big = qmpclient.QMP(qmp)
big.negotiate()
def flood():
    try:
        big.send_raw(b'{"execute": "query-version", "id": "' +
                     b"a" * (2 << 20) + b'"}\n')
    except OSError:
        pass                    # the server closed it: expected
t = threading.Thread(target=flood)
t.start()
r = big.recv()
error(r, "GenericError",
      "QMP input over 1048576 bytes: the connection is closed")
try:
    big.recv()
    raise AssertionError("the connection stayed open")
except (EOFError, ConnectionResetError):
    pass
t.join()
assert other.execute("query-version") == v

# Several clients at once, each answered in turn.
clients = [qmpclient.QMP(qmp) for _ in range(8)]
for c in clients:
    c.negotiate()
def hammer(c, k):
    for i in range(100):
        assert c.command("query-version", id=[k, i])["id"] == [k, i]
ts = [threading.Thread(target=hammer, args=(c, k))
      for k, c in enumerate(clients)]
for t in ts: t.start()
for t in ts: t.join()

# A client that stops reading: dropped past its bound, never waited
# for, while another is answered at once.
slow = qmpclient.QMP(qmp)
slow.negotiate()
slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
req = b'{"execute": "query-commands"}\n' * 1000
sent = 0
start = time.monotonic()
slow.sock.settimeout(1)
try:
    while time.monotonic() - start < 60:
        slow.send_raw(req)
        sent += 1
        t0 = time.monotonic()
        assert other.execute("query-version") == v
        assert time.monotonic() - t0 < 5, "the others waited"
except (BrokenPipeError, ConnectionResetError, socket.timeout):
    pass
got = b""
slow.sock.settimeout(10)
try:
    while True:
        d = slow.sock.recv(1 << 20)
        if not d:
            break
        got += d
except ConnectionResetError:
    pass
assert len(got) < 6 << 20, "%d bytes reached the slow client" % len(got)
assert other.execute("query-version") == v

# NBD never reaches the control socket, nor QMP the NBD socket.
h = nbd.NBD()
try:
    h.connect_unix(qmp)
    raise AssertionError("NBD connected to the control socket")
except nbd.Error:
    pass
s = socket.socket(socket.AF_UNIX)
s.connect(nbdsock)
s.settimeout(10)
assert s.recv(8) == b"NBDMAGIC"
h = nbd.NBD()
h.connect_unix(nbdsock)
assert h.get_size() == 16 << 20
PY
# The server is still well and serving.
nbdinfo "nbd+unix:///?socket=$tmp/srv.sock" > /dev/null || fail "NBD after the control clients"
stop_server srv
wait_gone "$tmp/srv.qmp" || fail "the control socket stayed after exit"
message_shape "$tmp/srv.log" || fail "nbdkit's messages"
