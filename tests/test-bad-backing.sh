#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Backing files: the name field out of range, a missing or malformed
# backing file, chains that loop.  nbdkit refuses the image at startup
# and names the file at fault.  (A chain too deep:
# test-bad-backing-deep.sh.)
source "${srcdir:-.}/bad-functions.sh"

base=$tmp/base.qcow2
top=$tmp/top.qcow2
qemu-img create -q -f qcow2 "$base" 4M
qemu-io -f qcow2 -c 'write -P 0x55 0 64k' "$base" >/dev/null
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$top"
bo=$(qpatch "$top" field backing_file_offset)
[ "$(qpatch "$top" field backing_file_size)" -eq 10 ] || fail "name size?"
bad=$tmp/bad.qcow2

# The name must lie in the first cluster, after the header, and be at
# most 1023 bytes.
for os in "65536 14" "65530 14" "65535 2" "8 14" "111 14" "$bo 1024" \
          "$bo 0xffffffff" "0xffffffffffffffff 14" "0xfffffffffffffff0 32"; do
  set -- $os
  cp "$top" "$bad"
  qpatch "$bad" be64 8 $1
  qpatch "$bad" be32 16 $2
  expect_open_error "$bad" \
    "backing file name at offset $(printf %#x $1) \($(($2)) bytes, header offsets 0x8 and 0x10\) does not fit in the first cluster after the header"
done

# An empty name (offset set, size 0) means no backing file, as qemu
# reads it: served, and equal to what qemu reads.
cp "$top" "$bad"
qpatch "$bad" be32 16 0
check_image "$bad"

# The backing file is missing: the error names the file looked for
# (resolved against the overlay's folder).
mkdir "$tmp/sub"
qemu-img create -q -f qcow2 -u -b missing.qcow2 -F qcow2 "$tmp/sub/top.qcow2" 4M
expect_open_error "$tmp/sub/top.qcow2" \
  "cannot open backing file \"$tmp/sub/missing.qcow2\": No such file or directory"

# The backing file is a folder.
mkdir "$tmp/sub/folder.qcow2"
qemu-img create -q -f qcow2 -u -b folder.qcow2 -F qcow2 "$tmp/sub/dir.qcow2" 4M
expect_open_error "$tmp/sub/dir.qcow2" \
  "cannot open backing file \"$tmp/sub/folder.qcow2\": Is a directory"

# The backing file is itself malformed: the error names it.
cp "$base" "$tmp/badbase.qcow2"
qpatch "$tmp/badbase.qcow2" be32 20 8
qemu-img create -q -f qcow2 -u -b badbase.qcow2 -F qcow2 "$tmp/top2.qcow2" 4M
ERR_FILE=$tmp/badbase.qcow2 expect_open_error "$tmp/top2.qcow2" \
  "cluster_bits 8 \(header offset 0x14\) is out of range"

# A loop: a -> b -> a.
qemu-img create -q -f qcow2 "$tmp/a.qcow2" 4M
qemu-img create -q -f qcow2 -b a.qcow2 -F qcow2 "$tmp/b.qcow2"
qemu-img rebase -u -b b.qcow2 -F qcow2 "$tmp/a.qcow2"
ERR_FILE=$tmp/b.qcow2 expect_open_error "$tmp/a.qcow2" \
  "backing chain loops: backing file \"$tmp/a.qcow2\" is already in the chain \(layer 0\)"
ERR_FILE=$tmp/a.qcow2 expect_open_error "$tmp/b.qcow2" \
  "backing chain loops: backing file \"$tmp/b.qcow2\" is already in the chain \(layer 0\)"

# A longer loop: c -> d -> e -> d, served from c.
qemu-img create -q -f qcow2 "$tmp/e.qcow2" 4M
qemu-img create -q -f qcow2 -b e.qcow2 -F qcow2 "$tmp/d.qcow2"
qemu-img create -q -f qcow2 -b d.qcow2 -F qcow2 "$tmp/c.qcow2"
qemu-img rebase -u -b d.qcow2 -F qcow2 "$tmp/e.qcow2"
ERR_FILE=$tmp/e.qcow2 expect_open_error "$tmp/c.qcow2" \
  "backing chain loops: backing file \"$tmp/d.qcow2\" is already in the chain \(layer 1\)"

# An image that is its own backing file.
qemu-img create -q -f qcow2 "$tmp/self.qcow2" 4M
qemu-img rebase -u -b self.qcow2 -F qcow2 "$tmp/self.qcow2"
expect_open_error "$tmp/self.qcow2" \
  "backing chain loops: backing file \"$tmp/self.qcow2\" is already in the chain"
# ... named by other paths: "./self.qcow2", through a symlinked
# folder, and served through a symlink.
qemu-img rebase -u -b ./self.qcow2 -F qcow2 "$tmp/self.qcow2"
expect_open_error "$tmp/self.qcow2" "backing chain loops"
ln -s . "$tmp/same"
qemu-img rebase -u -b same/self.qcow2 -F qcow2 "$tmp/self.qcow2"
expect_open_error "$tmp/self.qcow2" "backing chain loops"
qemu-img rebase -u -b self.qcow2 -F qcow2 "$tmp/self.qcow2"
ln -s self.qcow2 "$tmp/link.qcow2"
# Found at the top (link.qcow2 is self.qcow2), before the file is opened
# a second time: the image locks would refuse that.
expect_open_error "$tmp/link.qcow2" \
  "backing chain loops: backing file \"$tmp/self.qcow2\" is already in the chain"

# The unpatched overlay is served (so the errors are the patches').
timeout 60 nbdkit -U - qcow2 "file=$top" --run 'nbdsh -u "$uri" -c "
assert h.pread(65536, 0) == b\"\\x55\" * 65536
"' || fail "the unpatched overlay is not served"
