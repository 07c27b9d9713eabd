#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A delayed request holds up nothing else: with latency-write=2s, over
# memory and qcow2, a read on another connection, and a read on the
# same connection behind the write, complete at once while the write
# still sleeps; the write then completes after its 2 s.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh
requires_python_nbd

img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 1M

cat > "$tmp/client.py" <<'PY'
import nbd, sys, time
uri = sys.argv[1]
a = nbd.NBD()
a.connect_uri(uri)
b = nbd.NBD()
b.connect_uri(uri)

def wait(h, cookie):
    while not h.aio_command_completed(cookie):
        h.poll(-1)

t = time.monotonic()
w = a.aio_pwrite(b"\x01" * 4096, 0)
# Another connection.
assert b.pread(4096, 65536) == bytes(4096)
other = time.monotonic() - t
# The same connection, behind the write.
r = a.aio_pread(nbd.Buffer(4096), 65536)
wait(a, r)
same = time.monotonic() - t
assert not a.aio_command_completed(w), "the write finished early"
wait(a, w)
write = time.monotonic() - t
print("read on another connection %.3f s, on the same %.3f s, "
      "write %.3f s" % (other, same, write))
assert other < 1.0 and same < 1.0, "reads waited for the write"
assert write >= 2.0, "the write was not delayed"
assert b.pread(4096, 0) == b"\x01" * 4096
PY

for target in "memory 1M" "qcow2 $img"; do
  timeout -k 10 60 nbdkit -U - --filter=latency $target latency-write=2s \
    --run '/usr/bin/python3 '"$tmp"'/client.py "$uri"' ||
    fail "$target: concurrent requests"
done
qemu-img check -q "$img" || fail "qemu-img check"
qio "$img" 'read -P 1 0 4k'
