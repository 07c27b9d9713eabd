#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir=: several exports read and written at once, two clients of one
# export sharing its image, each export checked after against a model
# of what was written over its base, by qemu-img check and by QEMU's
# reading of every overlay (the base unchanged).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
requires_python_nbd

d="$tmp/vms"
mkdir "$d"
qemu-img create -q -f qcow2 "$d/base.qcow2" 4M
qio "$d/base.qcow2" "write -P 0x5a 0 4M"
for v in vm1 vm2 vm3; do
  qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$d/$v.qcow2"
done
sum=$(md5sum < "$d/base.qcow2")
export d tmp

nbdkit -U - qcow2 dir="$d" --run '
/usr/bin/python3 - "$unixsocket" <<"PY"
import nbd, os, random, sys, threading
sock = sys.argv[1]
size = 4 << 20
# Two clients of vm1, one of each other export, each its own stripe
# of blocks (so that the model does not depend on their order).
clients = [("vm1.qcow2", 0), ("vm1.qcow2", 1), ("vm2.qcow2", 0),
           ("vm3.qcow2", 0)]
models = {n: bytearray(b"\x5a" * size) for n, _ in clients}
errors = []
def run(name, stripe):
    try:
        h = nbd.NBD()
        h.set_export_name(name)
        h.connect_unix(sock)
        rnd = random.Random(hash((name, stripe)))
        for i in range(60):
            blk = rnd.randrange(0, size // 8192) * 2 + stripe
            off = blk * 4096
            data = bytes([rnd.randrange(256)]) * 4096
            h.pwrite(data, off)
            models[name][off:off + 4096] = data
            got = h.pread(4096, rnd.randrange(0, size // 4096) * 4096)
        h.flush()
        h.shutdown()
    except Exception as e:
        errors.append("%s/%d: %s" % (name, stripe, e))
ts = [threading.Thread(target=run, args=c) for c in clients]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors
# Each export read back whole, as the model says, by a new client.
for name, m in models.items():
    h = nbd.NBD()
    h.set_export_name(name)
    h.connect_unix(sock)
    got = b"".join(h.pread(1 << 20, o) for o in range(0, size, 1 << 20))
    assert got == bytes(m), "%s differs from its model" % name
    open("%s/%s.model" % (os.environ["tmp"], name), "wb").write(m)
PY
' || fail "writing several exports at once"

for v in vm1 vm2 vm3; do
  qemu-img check -q "$d/$v.qcow2" || fail "qemu-img check $v"
  qemu-img convert -f qcow2 -O raw "$d/$v.qcow2" "$tmp/$v.raw"
  cmp "$tmp/$v.raw" "$tmp/$v.qcow2.model" || fail "QEMU reads $v otherwise"
done
[ "$(md5sum < "$d/base.qcow2")" = "$sum" ] || fail "the base was written"
echo "$0: ok"
