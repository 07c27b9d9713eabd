#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter over nbdkit's memory plugin: create=true makes an
# image in the empty export, served and written (checked against a
# model); an export with data is not formatted.  The image's bytes,
# read from a memory plugin behind the nbd plugin, pass qemu-img check
# and compare equal to the model.  The data plugin: an image qemu-img
# made, in memory.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdcopy nbdsh cmp

# Random writes at odd offsets through $uri, the same bytes into the
# file $MODEL; then everything read back and compared.
writes='
import os, random
random.seed(5)
with open(os.environ["MODEL"], "r+b") as m:
    size = h.get_size()
    for i in range(200):
        off = random.randrange(size - 300000)
        n = random.randrange(1, 300000)
        if random.random() < 0.8:
            b = random.randbytes(n)
            h.pwrite(b, off)
        else:
            h.zero(n, off)
            b = bytes(n)
        m.seek(off)
        m.write(b)
    h.flush()
    m.seek(0)
    assert h.pread(size, 0) == m.read(size), "reads back other bytes"
'
echo "$writes" > "$tmp/writes.py"

truncate -s 64M "$tmp/model.raw"
nbdkit -U - --filter=qcow2 memory 48M create=true virtual-size=64M \
  cluster-size=4k \
  --run "MODEL=$tmp/model.raw nbdsh -u \"\$uri\" -c 'exec(open(\"$tmp/writes.py\").read())'" ||
  fail "the memory plugin, created and written"

# The same through the nbd plugin to a memory plugin in another nbdkit,
# whose bytes are then the image.
sock=$tmp/mem.sock
nbdkit -U "$sock" -P "$tmp/mem.pid" memory 48M
wait_socket "$sock" "$(cat "$tmp/mem.pid")" || fail "memory server"
truncate -s 64M "$tmp/model2.raw"
nbdkit -U - --filter=qcow2 nbd socket="$sock" create=true virtual-size=64M \
  --run "MODEL=$tmp/model2.raw nbdsh -u \"\$uri\" -c 'exec(open(\"$tmp/writes.py\").read())'" ||
  fail "a remote memory plugin, created and written"
nbdcopy "nbd+unix:///?socket=$sock" "$tmp/mem.qcow2"
# Once formatted, not again.
nbdkit -U - --filter=qcow2 nbd socket="$sock" create=true virtual-size=64M \
  --run true 2> "$tmp/again.log" || true
grep -q "create=true: nbd socket=$sock is not empty (data at offset 0)" "$tmp/again.log" ||
  fail "create=true over an image: $(cat "$tmp/again.log")"
kill "$(cat "$tmp/mem.pid")"
qemu-img check -q "$tmp/mem.qcow2" || fail "qemu-img check of the image made in memory"
qemu-img compare -q -f qcow2 -F raw "$tmp/mem.qcow2" "$tmp/model2.raw" ||
  fail "the image made in memory holds other data"

# Options for a new image without create=true: said.
nbdkit -U - --filter=qcow2 memory 1M virtual-size=1M --run true \
  2> "$tmp/nocreate.log" && fail "virtual-size= without create=true accepted"
grep -q "virtual-size= describes an image to make: it needs create=true" \
  "$tmp/nocreate.log" || fail "$(cat "$tmp/nocreate.log")"

# The data plugin: an image qemu-img made, in memory, written there.
qemu-img create -q -f qcow2 "$tmp/small.qcow2" 4M
truncate -s 2M "$tmp/small.qcow2"
nbdkit -U - --filter=qcow2 data "<$tmp/small.qcow2" \
  --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x77\" * 8192, 1 << 20)
h.flush()
assert h.pread(8192, 1 << 20) == b\"\\x77\" * 8192
assert h.pread(4096, 0) == bytes(4096)
"' || fail "the data plugin"
