#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The L1 and refcount tables described by the header: misaligned,
# beyond the end of the file, too small for the disk, absurdly large.
# nbdkit refuses the image at startup, naming the field and its offset.
source "${srcdir:-.}/bad-functions.sh"

# 1 GiB with 64 KiB clusters: each L2 table maps 512 MiB, so the L1
# table needs 2 entries.  qemu-img puts the refcount table at 0x10000
# and the L1 table at 0x30000.
good=$tmp/good.qcow2
qemu-img create -q -f qcow2 "$good" 1G
qemu-io -f qcow2 -c 'write -P 0x55 0 64k' -c 'write -P 0x66 512M 64k' \
  "$good" >/dev/null
[ "$(qpatch "$good" field l1_table_offset)" -eq $((0x30000)) ] &&
[ "$(qpatch "$good" field refcount_table_offset)" -eq $((0x10000)) ] &&
[ "$(qpatch "$good" field l1_size)" -eq 2 ] ||
  fail "qemu-img lays out images differently: fix this test"
size=$(stat -c %s "$good")
bad=$tmp/bad.qcow2

# L1 table offset not cluster aligned.
for off in 0x30200 0x30008 0x30001; do
  cp "$good" "$bad"
  qpatch "$bad" be64 40 $off
  expect_open_error "$bad" \
    "L1 table offset $off \(header offset 0x28\) is not aligned to the cluster size 65536"
done

# L1 table beyond the end of the file, wholly or partly, or where the
# offset plus the size overflows.
for off in 0x10000000 $(( (size + 0xffff) & ~0xffff )) 0xffffffffffff0000; do
  cp "$good" "$bad"
  qpatch "$bad" be64 40 $off
  expect_open_error "$bad" \
    "L1 table at $(printf %#x $off) \(16 bytes, header offset 0x28\) lies beyond the end of the file \(the file ends at $(printf %#x $size)\)"
done
cp "$good" "$bad"
qpatch "$bad" be64 40 $(( size - 0x10000 ))   # last cluster: 8192 entries fit
qpatch "$bad" be32 36 8193
expect_open_error "$bad" "L1 table at .*\(65544 bytes, header offset 0x28\) lies beyond the end of the file"

# l1_size too small for the virtual size.
for n in 0 1; do
  cp "$good" "$bad"
  qpatch "$bad" be32 36 $n
  expect_open_error "$bad" \
    "L1 table is too small: l1_size $n \(header offset 0x24\) but the virtual size 1073741824 needs 2 entries"
done
# The same, from a virtual size made larger.
cp "$good" "$bad"
qpatch "$bad" be64 24 $((1 << 62))
expect_open_error "$bad" \
  "L1 table is too small: l1_size 2 \(header offset 0x24\) but the virtual size $((1 << 62)) needs $((1 << 33)) entries"

# l1_size absurdly large (the limit is 32 MiB of L1, 4194304 entries);
# at the limit it is merely beyond the end of this file.
for n in 0xffffffff 0x400001; do
  cp "$good" "$bad"
  qpatch "$bad" be32 36 $n
  expect_open_error "$bad" \
    "l1_size $((n)) \(header offset 0x24\) is too large \(at most 4194304 entries\)"
done
cp "$good" "$bad"
qpatch "$bad" be32 36 0x400000
expect_open_error "$bad" "L1 table at 0x30000 \(33554432 bytes, header offset 0x28\) lies beyond the end of the file"

# Refcount table offset not cluster aligned.
cp "$good" "$bad"
qpatch "$bad" be64 48 0x10008
expect_open_error "$bad" \
  "refcount table offset 0x10008 \(header offset 0x30\) is not aligned to the cluster size 65536"

# Refcount table beyond the end of the file.
for off in 0x10000000 0xffffffffffff0000; do
  cp "$good" "$bad"
  qpatch "$bad" be64 48 $off
  expect_open_error "$bad" \
    "refcount table at $(printf %#x $off) \(65536 bytes, header offset 0x30\) lies beyond the end of the file"
done
cp "$good" "$bad"
qpatch "$bad" be32 56 $(( size / 65536 ))
expect_open_error "$bad" "refcount table at 0x10000 .* lies beyond the end of the file"

# refcount_table_clusters 0, and absurdly large.
cp "$good" "$bad"
qpatch "$bad" be32 56 0
expect_open_error "$bad" "refcount_table_clusters \(header offset 0x38\) is 0"
for n in 0xffffffff 0x10000; do
  cp "$good" "$bad"
  qpatch "$bad" be32 56 $n
  expect_open_error "$bad" \
    "refcount_table_clusters $((n)) \(header offset 0x38\) is too large"
done

# The good image itself is served (so the errors above are the patches').
nbdkit -U - qcow2 "file=$good" --run 'nbdcopy "$uri" '"$tmp/out.raw" ||
  fail "the unpatched image is refused"
