#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Every refcount width qemu supports (refcount_bits=1 to 64): the image
# reads the same whatever the width of its refcount entries, including
# with small clusters where the refcount table spans several blocks, and
# with shared clusters (refcount 2, after an internal snapshot) where
# the width allows it.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

for rb in 1 2 4 8 16 32 64; do
  img=$tmp/r$rb.qcow2
  qemu-img create -q -f qcow2 -o refcount_bits=$rb "$img" 8M
  qemu-img info "$img" | grep -q "refcount bits: $rb" ||
    fail "qemu-img did not create an image with refcount_bits=$rb"
  qio "$img" 'write -P 0x11 0 100k' 'write -P 0x22 3M 64k' \
             'write -P 0x33 8323072 65536'
  if [ $rb -gt 1 ]; then
    qemu-img snapshot -c snap "$img"
    qio "$img" 'write -P 0x44 32k 64k'
  fi
  check_image "$img"

  # 512-byte clusters: a refcount block holds 4096/rb entries, so with
  # wide refcounts the many clusters need several refcount blocks.
  img=$tmp/r$rb-512.qcow2
  qemu-img create -q -f qcow2 -o refcount_bits=$rb,cluster_size=512 "$img" 4M
  qio "$img" 'write -P 0x55 0 1M' 'write -P 0x66 2M 7777' \
             'write -P 0x77 4193792 512'
  check_image "$img"
done
