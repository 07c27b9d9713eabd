#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Files that are not qcow2 images, or are cut short, or have a version
# the plugin does not know: nbdkit refuses them at startup with an error
# saying what is wrong, and, for an empty file or a raw image, what to
# do instead.
source "${srcdir:-.}/bad-functions.sh"

# An empty file.
: > "$tmp/empty.qcow2"
expect_open_error "$tmp/empty.qcow2" "file is empty" \
  "empty.qcow2 is empty: to make a new image in it, add create=true size=SIZE"

# A raw disk image (all zeros): wrong magic.
truncate -s 1M "$tmp/raw.img"
expect_open_error "$tmp/raw.img" "not a qcow2 image" "magic 0 " \
  "if $tmp/raw.img is a raw disk image, nbdkit's file plugin serves it: nbdkit file $tmp/raw.img"

# A text file longer than a header: wrong magic (the first 4 bytes).
for i in $(seq 20); do echo "This is a text file, not a disk image."; done \
  > "$tmp/text.qcow2"
expect_open_error "$tmp/text.qcow2" "not a qcow2 image" "magic 0x54686973"

# A short text file.
echo hello > "$tmp/short.txt"
expect_open_error "$tmp/short.txt" "too small \(6 bytes\)"

# A qcow2 image with the wrong magic in its first byte.
qemu-img create -q -f qcow2 "$tmp/good.qcow2" 4M
cp "$tmp/good.qcow2" "$tmp/magic.qcow2"
qpatch "$tmp/magic.qcow2" u8 0 0x51
qpatch "$tmp/magic.qcow2" u8 3 0xfa
expect_open_error "$tmp/magic.qcow2" "not a qcow2 image" "0x514649fa"

# Truncated: the header cut at 50 bytes (v2 needs 72).
cp "$tmp/good.qcow2" "$tmp/cut50.qcow2"
qpatch "$tmp/cut50.qcow2" truncate 50
expect_open_error "$tmp/cut50.qcow2" "too small \(50 bytes\)" "truncated"

# Truncated: a version 3 header cut at 90 bytes (v3 needs 104).
cp "$tmp/good.qcow2" "$tmp/cut90.qcow2"
qpatch "$tmp/cut90.qcow2" truncate 90
expect_open_error "$tmp/cut90.qcow2" "too small \(90 bytes\)" "version 3" \
  "truncated"

# Truncated after the header: the L1 table (at 0x30000) is gone.
cp "$tmp/good.qcow2" "$tmp/cut-l1.qcow2"
qpatch "$tmp/cut-l1.qcow2" truncate 0x30000
expect_open_error "$tmp/cut-l1.qcow2" "L1 table" "beyond the end of the file"

# Versions 1 (old qcow) and 4 (future).
for v in 0 1 4 0x7fffffff; do
  cp "$tmp/good.qcow2" "$tmp/v$v.qcow2"
  qpatch "$tmp/v$v.qcow2" be32 4 $v
  expect_open_error "$tmp/v$v.qcow2" \
    "unsupported qcow2 version $((v)) \(header offset 4\)"
done
