#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes through the qcow2 filter over nbdkit's file plugin: refused
# with ENOSPC where the image would have to grow past the plugin's
# export, done once the file has room; byte-granular writes, zeroes,
# trims (what they read as, kept) and FUA checked against a model, then qemu-img check, qemu-img
# compare and qemu-io on the file.
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/filter-qcow2-image.sh"

cp "$img" "$tmp/dir/full.qcow2"
nbdkit -U - --filter=qcow2 file "$tmp/dir/full.qcow2" \
  --run 'nbdsh -u "$uri" -c "
import errno
try:
    h.pwrite(b\"x\" * 4096, 6 << 20)
    raise AssertionError(\"a write past the file succeeded\")
except nbd.Error as e:
    assert e.errnum == errno.ENOSPC, e
"' 2> "$tmp/nospace.log" || { cat "$tmp/nospace.log"; fail "ENOSPC case"; }
grep -q "No space left on device" "$tmp/nospace.log" || fail "no message for ENOSPC"
rc=0
qemu-img check -q "$tmp/dir/full.qcow2" || rc=$?
[ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] || fail "qemu-img check after ENOSPC: $rc"

# Room for the image to grow, then writes at odd offsets against a
# model (the raw disk, written the same way).
w=$tmp/dir/w.qcow2
cp "$img" "$w"
truncate -s +16M "$w"
cp "$tmp/want.raw" "$tmp/model.raw"
nbdkit -U - --filter=qcow2 file "$w" --run 'nbdsh -u "$uri" -c "
import random
random.seed(17)
with open(\"'"$tmp"'/model.raw\", \"r+b\") as m:
    size = h.get_size()
    for i in range(300):
        off = random.randrange(size - 200000)
        n = random.randrange(1, 200000)
        op = random.choice([\"w\", \"w\", \"z\", \"t\", \"f\"])
        if op in \"wf\":
            b = random.randbytes(n)
            h.pwrite(b, off, nbd.CMD_FLAG_FUA if op == \"f\" else 0)
        elif op == \"z\":
            h.zero(n, off)
            b = bytes(n)
        else:  # a trimmed range reads as the server chooses
            h.trim(n, off)
            b = h.pread(n, off)
        m.seek(off)
        m.write(b)
    h.flush()
    m.seek(0)
    assert h.pread(size, 0) == m.read(size), \"reads back other bytes\"
"' || fail "writes through the filter"
qemu-img check -q "$w" || fail "qemu-img check after writes through the filter"
qemu-img compare -q -f qcow2 -F raw "$w" "$tmp/model.raw" ||
  fail "qemu-img reads other data than was written"

# A zero of whole clusters reaches the engine (zero flags), not written
# as zeros by nbdkit: the clusters are zero in qemu-img map, no data.
nbdkit -U - --filter=qcow2 file "$w" --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"z\" * (4 << 16), 7 << 20)
h.zero(2 << 16, 7 << 20)
"' || fail "zero through the filter"
qemu-img map --output=json -f qcow2 "$w" | /usr/bin/python3 -c '
import json, sys
for e in json.load(sys.stdin):
    if e["start"] < (7 << 20) + (2 << 16) and e["start"] + e["length"] > 7 << 20:
        assert e["zero"] and not e["data"], e
' || fail "a zero through the filter was written as data"
