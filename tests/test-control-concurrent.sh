#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The control thread beside NBD clients (CI runs this under
# ThreadSanitizer): dir= with three exports written by NBD clients at
# once, each against a model, while control clients come and go,
# negotiate, run every built-in command, send garbage and leave in the
# middle of a message.  No client waits for another; every image ends
# as its model says, and qemu-img check finds nothing.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img
requires_python_nbd
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/control-functions.sh"

mkdir "$tmp/vms"
for n in a b c; do qemu-img create -q -f qcow2 "$tmp/vms/$n" 4M; done
control_serve srv qcow2 dir="$tmp/vms"

/usr/bin/python3 - "$tmp/srv.sock" "$tmp/srv.qmp" "$tmp" <<'PY' || fail "NBD and control clients at once"
import os, random, sys, threading, time
import nbd
import qmpclient

sock, qmp, tmp = sys.argv[1:]
size = 4 << 20
failures = []
stop = threading.Event()

def writer(name, seed):
    try:
        rnd = random.Random(seed)
        model = bytearray(size)
        h = nbd.NBD()
        h.set_export_name(name)
        h.connect_unix(sock)
        for i in range(150):
            off = rnd.randrange(0, size - 65536)
            n = rnd.randrange(1, 65536)
            data = bytes([rnd.randrange(256)]) * n
            h.pwrite(data, off)
            model[off:off + n] = data
            if i % 20 == 0:
                h.flush()
        h.flush()
        assert h.pread(size, 0) == model, name + ": read back"
        h.shutdown()
        with open(os.path.join(tmp, name + ".model"), "wb") as f:
            f.write(model)
    except Exception as e:
        failures.append("%s: %r" % (name, e))

def controller(k):
    rnd = random.Random(k)
    try:
        while not stop.is_set():
            q = qmpclient.QMP(qmp)
            q.negotiate()
            for _ in range(rnd.randrange(1, 20)):
                c = rnd.choice(["query-version", "query-commands", "nothing"])
                r = q.command(c, id=[k, c])
                assert r["id"] == [k, c] and ("return" in r) == (c != "nothing"), r
            if rnd.random() < 0.3:
                q.send_raw(bytes(rnd.randrange(256) for _ in range(200)) + b"\n")
            if rnd.random() < 0.3:
                q.send_raw(b'{"execute": "query-ver')   # left cut
            q.close()
    except Exception as e:
        failures.append("control %d: %r" % (k, e))

ws = [threading.Thread(target=writer, args=(n, i)) for i, n in enumerate("abc")]
cs = [threading.Thread(target=controller, args=(k,)) for k in range(4)]
for t in ws + cs: t.start()
for t in ws: t.join()
stop.set()
for t in cs: t.join()
assert not failures, failures
PY
stop_server srv
message_shape "$tmp/srv.log" || fail "nbdkit's messages"
for n in a b c; do
  qemu-img check -q "$tmp/vms/$n" || fail "qemu-img check $n"
  qemu-img convert -f qcow2 -O raw "$tmp/vms/$n" "$tmp/$n.raw"
  cmp "$tmp/$n.raw" "$tmp/$n.model" || fail "$n differs from its model"
done
