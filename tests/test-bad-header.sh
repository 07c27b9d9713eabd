#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Header fields out of range: cluster_bits, header_length,
# refcount_order, compression type, header extension lengths.  nbdkit
# refuses the image at startup, naming the field and its offset.
source "${srcdir:-.}/bad-functions.sh"

good=$tmp/good.qcow2
qemu-img create -q -f qcow2 "$good" 4M
qemu-io -f qcow2 -c 'write -P 0x55 0 64k' "$good" >/dev/null
[ "$(qpatch "$good" field header_length)" -eq 112 ] ||
  fail "qemu-img no longer writes a 112 byte header: fix this test"
bad=$tmp/bad.qcow2

# cluster_bits: 9 (512 bytes) to 21 (2 MiB) are valid.
for bits in 0 8 22 63 0xffffffff; do
  cp "$good" "$bad"
  qpatch "$bad" be32 20 $bits
  expect_open_error "$bad" \
    "cluster_bits $((bits)) \(header offset 0x14\) is out of range"
done

# header_length below the version 3 minimum (104), or beyond the
# first cluster (64 KiB).
for len in 0 72 100 103; do
  cp "$good" "$bad"
  qpatch "$bad" be32 100 $len
  expect_open_error "$bad" \
    "header_length $len \(header offset 0x64\) is shorter than the version 3 minimum"
done
for len in 65537 0xffffffff; do
  cp "$good" "$bad"
  qpatch "$bad" be32 100 $len
  expect_open_error "$bad" \
    "header_length $((len)) \(header offset 0x64\) exceeds the cluster size 65536"
done

# refcount_order: refcounts of 1 to 64 bits (0 to 6).
for order in 7 64 0xffffffff; do
  cp "$good" "$bad"
  qpatch "$bad" be32 96 $order
  expect_open_error "$bad" \
    "refcount_order $((order)) \(header offset 0x60\) is out of range"
done

# Compression type 2 is not defined (with or without bit 3 set).
cp "$good" "$bad"
qpatch "$bad" u8 104 2
expect_open_error "$bad" "unknown compression type 2 \(header offset 0x68\)"
qpatch "$bad" set-bits 72 8
expect_open_error "$bad" "unknown compression type 2 \(header offset 0x68\)"

# Compression type 1 (zstd) without incompatible bit 3, and bit 3
# with the default (deflate).
cp "$good" "$bad"
qpatch "$bad" u8 104 1
expect_open_error "$bad" \
  "compression type 1 \(header offset 0x68\) does not agree with incompatible feature bit 3 \(clear\)"
cp "$good" "$bad"
qpatch "$bad" set-bits 72 8
expect_open_error "$bad" \
  "compression type 0 \(header offset 0x68\) does not agree with incompatible feature bit 3 \(set\)"

# A header extension (the feature name table at 112) whose length runs
# past the first cluster.
off=$(qpatch "$good" ext-offset 0x6803f857)
[ "$off" -eq 112 ] || fail "feature name table not at 112 but $off"
for len in 0xff89 0x10000 0xffffffff; do
  cp "$good" "$bad"
  qpatch "$bad" be32 $((off + 4)) $len
  expect_open_error "$bad" \
    "header extension 0x6803f857 at offset 0x70 is too large \($((len)) bytes"
done
# The same in a version 2 image, whose extensions start at 72.
qemu-img create -q -f qcow2 -o compat=0.10 "$tmp/v2.qcow2" 4M
[ "$(qpatch "$tmp/v2.qcow2" field version)" -eq 2 ] || fail "not v2"
qpatch "$tmp/v2.qcow2" be32 72 0x12345678
qpatch "$tmp/v2.qcow2" be32 76 0xfff8
expect_open_error "$tmp/v2.qcow2" \
  "header extension 0x12345678 at offset 0x48 is too large \(65528 bytes, only 65456 left before offset 0x10000\)"

# The largest length that fits is accepted.
cp "$good" "$bad"
qpatch "$bad" be32 $((off + 4)) $((65536 - off - 8))
nbdkit -U - qcow2 "file=$bad" --run 'nbdcopy "$uri" '"$tmp/out.raw" ||
  fail "an extension filling the first cluster is refused"

# The bitmaps extension: too short; the bitmap directory misaligned or
# beyond the end of the file (ignored when autoclear bit 0 says the
# bitmaps are stale).
cp "$good" "$tmp/bitmap.qcow2"
qemu-img bitmap --add "$tmp/bitmap.qcow2" b0
bo=$(qpatch "$tmp/bitmap.qcow2" ext-offset 0x23852875)
cp "$tmp/bitmap.qcow2" "$bad"
qpatch "$bad" be32 $((bo + 4)) 16
expect_open_error "$bad" \
  "bitmaps header extension at offset $(printf %#x $bo) is too short \(16 bytes\)"
cp "$tmp/bitmap.qcow2" "$bad"
qpatch "$bad" be64 $((bo + 24)) 0x10000000
expect_open_error "$bad" \
  "bitmap directory at 0x10000000 \([0-9]+ bytes.*\) lies beyond the end of the file"
# The offset the message gives must be that of the field (in the
# extension, at $((bo + 24))), not 0 (the magic).
grep -q "header offset 0)" "$tmp/open-error.log" &&
  bitmap_bad_offset=1
qpatch "$bad" clear-bits 88 1
nbdkit -U - qcow2 "file=$bad" --run 'nbdcopy "$uri" '"$tmp/out.raw" ||
  fail "stale bitmaps (autoclear bit 0 clear) are not ignored"
cp "$tmp/bitmap.qcow2" "$bad"
qpatch "$bad" be64 $((bo + 24)) $(( $(qpatch "$bad" be64 $((bo + 24))) + 8 ))
expect_open_error "$bad" "bitmap directory offset 0x[0-9a-f]*8 .*is not aligned"
grep -q "header offset 0)" "$tmp/open-error.log" &&
  bitmap_bad_offset=1
[ -z "${bitmap_bad_offset:-}" ] ||
  fail "bitmap directory errors say \"header offset 0\", not where the field is"
