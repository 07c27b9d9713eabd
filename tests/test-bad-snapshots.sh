#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The internal snapshot table: beyond the end of the file, misaligned,
# too many entries, entries running past the end of the file; and a
# snapshot's own L1 table when that snapshot is served.
source "${srcdir:-.}/bad-functions.sh"

# A 4 MiB image with one snapshot "s1" (ID "1") whose data differs from
# the active layer.
good=$tmp/good.qcow2
qemu-img create -q -f qcow2 "$good" 4M
qemu-io -f qcow2 -c 'write -P 0x11 0 64k' "$good" >/dev/null
qemu-img snapshot -c s1 "$good"
qemu-io -f qcow2 -c 'write -P 0x22 0 64k' "$good" >/dev/null
[ "$(qpatch "$good" field nb_snapshots)" -eq 1 ] || fail "no snapshot"
so=$(qpatch "$good" field snapshots_offset)
size=$(stat -c %s "$good")
bad=$tmp/bad.qcow2

# Snapshot table beyond the end of the file.
for off in 0x10000000 $size 0xffffffffffff0000; do
  cp "$good" "$bad"
  qpatch "$bad" be64 64 $off
  expect_open_error "$bad" \
    "snapshot table at $(printf %#x $off) \(1 bytes, header offset 0x40\) lies beyond the end of the file \(the file ends at $(printf %#x $size)\)"
done

# Snapshot table offset not cluster aligned.
cp "$good" "$bad"
qpatch "$bad" be64 64 $((so + 8))
expect_open_error "$bad" \
  "snapshot table offset $(printf %#x $((so + 8))) \(header offset 0x40\) is not aligned to the cluster size"

# nb_snapshots absurdly large (the limit is 65536).
for n in 0xffffffff 65537; do
  cp "$good" "$bad"
  qpatch "$bad" be32 60 $n
  expect_open_error "$bad" \
    "nb_snapshots $((n)) \(header offset 0x3c\) is too large \(at most 65536\)"
done
# At the limit: the "entries" after the real one are whatever follows
# the table (zeros, then the active layer's data) until one is bad.
cp "$good" "$bad"
qpatch "$bad" be32 60 65536
expect_open_error "$bad" \
  "snapshot table entry [0-9]+ at 0x[0-9a-f]+ (runs beyond the end of the file|has [0-9]+ bytes of extra data)"

# Entry 0 claims more extra data than any snapshot has.
cp "$good" "$bad"
qpatch "$bad" be32 $((so + 36)) 0xffffffff
expect_open_error "$bad" \
  "snapshot table entry 0 at $(printf %#x $so) has 4294967295 bytes of extra data"

# A snapshot table in the last cluster whose entry's ID runs past the
# end of the file.
cp "$good" "$bad"
qpatch "$bad" truncate $((size + 65536))
qpatch "$bad" bytes $size "$(od -An -tx1 -v -j $so -N 72 "$good" | tr -d ' \n')"
qpatch "$bad" be16 $((size + 12)) 0xffff
qpatch "$bad" be64 64 $size
expect_open_error "$bad" \
  "snapshot table entry 0 at $(printf %#x $((size + 40 + 24))) runs beyond the end of the file"

# A snapshot whose L1 table is bad: served only when that snapshot is
# asked for.  The active layer is still served.
l1=$(qpatch "$good" be64 $so)
for off in 0x10000000 $((l1 + 512)); do
  cp "$good" "$bad"
  qpatch "$bad" be64 $so $off
  OPEN_ARGS=snapshot=s1 expect_open_error "$bad" \
    "L1 table of snapshot 1 at $(printf %#x $off) \(1 entries\) is misaligned or beyond the end of the file"
  nbdkit -U - qcow2 "file=$bad" --run 'nbdsh -u "$uri" -c "
assert h.pread(65536, 0) == b\"\\x22\" * 65536
"' || fail "the active layer of an image with a bad snapshot is not served"
done

# A snapshot whose l1_size does not fit its disk size.
for n in 0 0xffffffff; do
  cp "$good" "$bad"
  qpatch "$bad" be32 $((so + 8)) $n
  OPEN_ARGS=snapshot=1 expect_open_error "$bad" \
    "snapshot \"1\": L1 size $((n)) does not fit its disk size 4194304"
done

# The unpatched snapshot is served (so the errors are the patches').
nbdkit -U - qcow2 "file=$good" snapshot=s1 --run 'nbdsh -u "$uri" -c "
assert h.pread(65536, 0) == b\"\\x11\" * 65536
"' || fail "the unpatched snapshot is not served"
