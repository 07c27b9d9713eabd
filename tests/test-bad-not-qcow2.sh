#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Files that are not qcow2 images, or are cut short, or have a version
# the plugin does not know: nbdkit refuses them at startup with an error
# saying what is wrong, and, for an empty file, a raw image or another
# format's image (VMDK, VHD, VDI, VHDX, QED, qcow...), what to do
# instead.
source "${srcdir:-.}/bad-functions.sh"

# An empty file.
: > "$tmp/empty.qcow2"
expect_open_error "$tmp/empty.qcow2" "file is empty" \
  "empty.qcow2 is empty: to make a new image in it, add create=true size=SIZE"

# A raw disk image (all zeros): wrong magic.
truncate -s 1M "$tmp/raw.img"
expect_open_error "$tmp/raw.img" "not a qcow2 image" "magic 0 " \
  "if $tmp/raw.img is a raw disk image, nbdkit's file plugin serves it: nbdkit file $tmp/raw.img"

# Other formats qemu-img makes: called what they are, with the commands
# that convert and serve them (the first pasted must work), never taken
# for a raw disk.
for f in vmdk:VMDK:0 vpc:VHD:0 vdi:VDI:0x40 vhdx:VHDX:0 qed:QED:0 \
         qcow:qcow:4; do
  IFS=: read -r fmt name at <<< "$f"
  qemu-img create -q -f "$fmt" "$tmp/disk.$fmt" 4M
  if [ "$fmt" = qcow ]; then
    what="unsupported qcow2 version 1 \(header offset 0x4\): a qcow image, not qcow2"
    serve=
  else
    what="a $name[ (a-z)]* image \(its signature at offset $at\), not a qcow2 image"
    serve="; qemu-nbd -f $fmt $tmp/disk.$fmt serves it as it is"
  fi
  expect_open_error "$tmp/disk.$fmt" "$what$" \
    "^nbdkit: error: hint: qemu-img convert -f $fmt -O qcow2 $tmp/disk.$fmt NEW.qcow2 makes a qcow2 image of it$serve$"
  ! grep -q "raw disk image" "$tmp/open-error.log" ||
    fail "$fmt: called a raw disk image"
  rm -f "$tmp/NEW.qcow2"
  (cd "$tmp" && qemu-img convert -f "$fmt" -O qcow2 "disk.$fmt" NEW.qcow2) ||
    fail "$fmt: the conversion said does not work"
done
# A VMDK descriptor (its extent a raw file beside it).
qemu-img create -q -f vmdk -o subformat=monolithicFlat "$tmp/flat.vmdk" 4M
expect_open_error "$tmp/flat.vmdk" \
  "a VMDK \(descriptor file\) image \(its signature at offset 0\)" \
  "qemu-img convert -f vmdk -O qcow2 $tmp/flat.vmdk NEW.qcow2"
# LUKS: nbdkit's luks filter serves it (which test-bad-not-qcow2-luks.sh
# shows).
qemu_img_pbkdf create -q -f luks --object secret,id=s0,data=secret \
  -o key-secret=s0,iter-time=10 "$tmp/disk.luks" 4M ||
  fail "qemu-img cannot make a LUKS image"
expect_open_error "$tmp/disk.luks" \
  "a LUKS image \(its signature at offset 0\), not a qcow2 image" \
  "^nbdkit: error: hint: nbdkit's luks filter serves it: nbdkit file $tmp/disk.luks --filter=luks passphrase=\+PASSWORD-FILE$"

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
    "unsupported qcow2 version $((v)) \(header offset 0x4\)"
done
