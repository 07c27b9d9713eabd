#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Hostile images whose refcounts or L2 entries lie about data clusters,
# where dropping a reference would free a cluster that is in use:
#  - a data cluster with refcount 0: once its guest range is zeroed or
#    trimmed, the allocator may hand the cluster out again, and the
#    queued free must not then take it from its new owner; nor, if a
#    flush has counted it ahead of use for new allocations, from them;
#  - an entry of such a cluster without the copied flag: a write to it
#    allocates a new cluster, which may be the old one, whose reference
#    must not then be dropped;
#  - an L2 entry pointing at its own L2 table: trimming that guest range
#    must not free the table;
#  - an L2 entry pointing past the end of the file, where the allocator
#    counts clusters ahead of use: trimming it must not free one of
#    them.
# Each time the plugin says so, leaves the reference alone, and every
# write reads back, also after reopening; and qemu-img check finds no
# corruption left, since the bad reference is gone.
source "${srcdir:-.}/bad-functions.sh"
set -e
requires qemu-img qemu-io nbdsh cmp

base=$tmp/base.qcow2
qemu-img create -q -f qcow2 -o cluster_size=64k "$base" 4M
qemu-io -f qcow2 -c 'write -P 0x33 0 128k' "$base" >/dev/null
reftable=$(qpatch "$base" field refcount_table_offset)
block=$(qpatch "$base" be64 "$reftable")
read -r l2e2 _ < <(qpatch "$base" l2-entry 64k)
data2=$(( l2e2 & 0x00fffffffffffe00 ))
read -r _ l2e2_at < <(qpatch "$base" l2-entry 64k)
l2=$(( l2e2_at & ~0xffff ))
img=$tmp/bad.qcow2
raw=$tmp/model.raw

# run_client PYTHON: run nbdsh code against $img; the log is $tmp/log.
run_client ()
{
  local rc=0
  timeout 60 nbdkit -U - qcow2 "$img" --run "nbdsh -u \"\$uri\" -c '$1'" \
    > "$tmp/log" 2>&1 || rc=$?
  sed 's/^/    /' "$tmp/log"
  check_status "serving $img" "$rc" 0 "$tmp/log"
}

# model OFFSET:LENGTH:BYTE...: write the disk as it should read to
# $raw: zeros but for the regions given (Python expressions).
model ()
{
  /usr/bin/python3 -c '
import sys
d = bytearray(4 << 20)
for region in sys.argv[2:]:
    off, n, byte = (eval(x) for x in region.split(":"))
    d[off:off + n] = bytes([byte]) * n
open(sys.argv[1], "wb").write(d)' "$raw" "$@"
}

# check_result REGEX CHECK-STATUS: the message was given, the image
# reads as the model (also through qemu), and qemu-img check exits with
# CHECK-STATUS (0 clean, 3 leaks only).
check_result ()
{
  local rc=0
  grep -qE "$1" "$tmp/log" || fail "no message /$1/"
  run_client 'h.pread(4 << 20, 0)'
  qemu-img convert -O raw "$img" "$tmp/out.raw"
  cmp "$raw" "$tmp/out.raw" || fail "$img does not read as the model"
  qemu-img check "$img" || rc=$?
  [ "$rc" -eq "$2" ] || fail "qemu-img check: exit $rc, expected $2"
}

echo "== a data cluster with refcount 0"
cp "$base" "$img"
qpatch "$img" be16 $(( block + 2 * (data2 >> 16) )) 0
# Zeroing drops the reference; the next allocations (after a flush,
# which applies queued frees) would take the cluster, twice.
run_client '
h.zero(128 << 10, 0)
h.flush()
h.pwrite(b"\xaa" * 65536, 2 << 20)
h.flush()
h.pwrite(b"\xbb" * 65536, 3 << 20)
h.flush()
assert h.pread(65536, 2 << 20) == b"\xaa" * 65536
assert h.pread(65536, 3 << 20) == b"\xbb" * 65536
'
model "2<<20:65536:0xaa" "3<<20:65536:0xbb"
check_result "is dropped, but the cluster is free \\(refcount 0\\): left as is" 0

echo "== data clusters with refcount 0, counted ahead for allocations"
qemu-img create -q -f qcow2 -o cluster_size=64k "$img" 4M
qemu-io -f qcow2 -c 'write -P 0x44 0 2M' "$img" >/dev/null
# Guest 0 unmapped and its cluster free, then the clusters of guest
# 64k to 1088k with refcount 0: the first allocation takes the free
# one, and the flush after it counts the next 16 free clusters ahead of
# use, which are those.  Zeroing their guest ranges must not queue
# frees of them, or they would be handed out at refcount 0.
for g in $(seq 0 16); do
  read -r e _ < <(qpatch "$img" l2-entry $(( g << 16 )))
  h=$(( e & 0x00fffffffffffe00 ))
  qpatch "$img" be16 $(( block + 2 * (h >> 16) )) 0
done
read -r _ l2e1_at < <(qpatch "$img" l2-entry 0)
qpatch "$img" be64 "$l2e1_at" 0
run_client '
h.pwrite(b"\xaa" * 65536, 3 << 20)
h.flush()
h.zero(16 << 16, 65536)
h.flush()
for i in range(1, 9):
    h.pwrite(bytes([0x10 + i]) * 65536, (3 << 20) + (i << 16))
    h.flush()
assert h.pread(65536, 3 << 20) == b"\xaa" * 65536
'
model "17<<16:(2<<20)-(17<<16):0x44" "3<<20:65536:0xaa" \
  $(for i in $(seq 1 8); do echo "(3<<20)+($i<<16):65536:$((0x10 + i))"; done)
check_result "is dropped, but the cluster is free \\(refcount 1, counted ahead for new allocations\\): left as is" 0

echo "== an entry without the copied flag, on a cluster with refcount 0"
cp "$base" "$img"
qpatch "$img" be64 "$l2e2_at" "$data2"
qpatch "$img" be16 $(( block + 2 * (data2 >> 16) )) 0
# The write copies the cluster into a new one, which is the old one
# (the first free cluster); dropping the old reference would free it.
run_client '
h.pwrite(b"\xcc" * 4096, 68 << 10)
h.flush()
h.pwrite(b"\xaa" * 65536, 2 << 20)
h.flush()
h.pwrite(b"\xbb" * 65536, 3 << 20)
h.flush()
assert h.pread(4096, 68 << 10) == b"\xcc" * 4096
'
model "0:131072:0x33" "68<<10:4096:0xcc" "2<<20:65536:0xaa" "3<<20:65536:0xbb"
check_result "guest data at host offset $(printf %#x "$data2") lies in a cluster whose refcount said it was free" 0

echo "== an L2 entry pointing at its own L2 table"
cp "$base" "$img"
qpatch "$img" be64 "$l2e2_at" $(( 0x8000000000000000 | l2 ))
# The trim queues no free of the table, so after the flush the writes
# allocate elsewhere and the table keeps mapping guest 0.
run_client '
h.trim(65536, 65536)
h.flush()
h.pwrite(b"\xcc" * 65536, 2 << 20)
h.flush()
h.pwrite(b"\xdd" * 65536, 3 << 20)
h.flush()
assert h.pread(65536, 0) == b"\x33" * 65536
assert h.pread(65536, 2 << 20) == b"\xcc" * 65536
'
model "0:65536:0x33" "2<<20:65536:0xcc" "3<<20:65536:0xdd"
# The data cluster that the entry pointed at before the patch was
# leaked by the patch itself.
check_result "guest data at host offset $(printf %#x "$l2") lies on the active L2 table" 3

echo "== an L2 entry pointing past the end of the file"
cp "$base" "$img"
size=$(stat -c %s "$img")
past=$(( (size + 0xffff) / 0x10000 * 0x10000 + 0x20000 ))
qpatch "$img" be64 $(( l2e2_at + 8 )) $(( 0x8000000000000000 | past ))
# The first write and flush count clusters ahead past the end of the
# file, the bad entry's among them; trimming the entry must not free
# it, or the writes after the next flush would be given it twice.
run_client '
h.pwrite(b"\xee" * 65536, 1 << 20)
h.flush()
h.trim(65536, 128 << 10)   # the bad entry
h.flush()
for i in range(2, 4):
    h.pwrite(bytes([0x10 + i]) * 65536, i << 20)
h.flush()
for i in range(2, 4):
    h.pwrite(bytes([0x20 + i]) * 65536, (i << 20) + 65536)
h.flush()
assert h.pread(65536, 1 << 20) == b"\xee" * 65536
for i in range(2, 4):
    assert h.pread(65536, i << 20) == bytes([0x10 + i]) * 65536
    assert h.pread(65536, (i << 20) + 65536) == bytes([0x20 + i]) * 65536
'
model "0:131072:0x33" "1<<20:65536:0xee" \
  $(for i in 2 3; do
      echo "$i<<20:65536:$((0x10 + i))" "($i<<20)+65536:65536:$((0x20 + i))"
    done)
check_result "guest data at host offset $(printf %#x "$past") lies beyond the end of the file" 0
