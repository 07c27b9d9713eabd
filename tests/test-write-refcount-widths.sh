#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Every refcount width qcow2 allows, 1 to 64 bits, filled past several
# refcount blocks and a growth of the refcount table.  With 512-byte
# clusters a refcount block counts 4096/bits clusters and the first
# refcount table (one cluster) 64 blocks, so the file outgrows the
# table at 128 MiB / bits.  Each image is filled by nbdcopy from a
# random raw file a quarter larger than that, then a randomized
# differential pass (diffwrite.py) overwrites, zeroes and trims across
# it (frees at the width's limit: a 1-bit refcount is free or used
# once).  qemu-img check finds no error and no leak, and qemu reads
# what was written.
source "${srcdir:-.}/write-functions.sh"
set -e
requires nbdcopy

M=1048576
seed=300
for bits in 1 2 4 8 16 32 64; do
  size=$((128 * M / bits * 5 / 4))
  img=$tmp/w-$bits.qcow2 src=$tmp/w-$bits.raw
  head -c "$size" /dev/urandom > "$src"
  qemu-img create -q -f qcow2 -o refcount_bits=$bits,cluster_size=512 \
    "$img" "$size"
  serve_rw "$img" "nbdcopy --flush $(printf %q "$src") \"\$uri\"" ||
    fail "filling the image with $bits-bit refcounts"
  check_written "$img"
  qemu-img compare -q -f raw -F qcow2 "$src" "$img" ||
    fail "$bits-bit refcounts: the image does not read as written"
  qemu-img info --output=json "$img" | grep -q '"refcount-bits": '$bits ||
    fail "$img: not $bits-bit refcounts"
  # The refcount table outgrew its first cluster.
  rt=$(/usr/bin/python3 -c '
import struct, sys
print(struct.unpack(">I", open(sys.argv[1], "rb").read(60)[56:60])[0])
' "$img")
  [ "$rt" -gt 1 ] ||
    fail "$bits-bit refcounts: the refcount table did not grow ($rt cluster)"
  rm -f "$src"
  diffwrite "$img" --seed $seed --ops 600 --max-len 300000
  seed=$((seed + 1))
  rm -f "$img"
done
