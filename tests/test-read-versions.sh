#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# qcow2 version 2 (compat=0.10) and version 3 (compat=1.1) images, with
# the same writes, read back as qemu reads them; the served size is the
# virtual size.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy nbdinfo

for compat in 0.10 1.1; do
  img=$tmp/v$compat.qcow2
  qemu-img create -q -f qcow2 -o compat=$compat "$img" 8M
  qemu-img info "$img" | grep -q "compat: $compat" ||
    fail "qemu-img did not create a compat=$compat image"
  qio "$img" \
    'write -P 0x11 0 64k' \
    'write -P 0x22 100k 300k' \
    'write -P 0x33 1048575 2' \
    'write -P 0x44 5M 1M' \
    'write -P 0x55 8388096 512' \
    'write -z 5M 64k'
  check_image "$img"
  size=$(timeout 60 nbdkit -U - qcow2 "file=$img" --run 'nbdinfo --size "$uri"')
  [ "$size" = 8388608 ] || fail "compat=$compat: size $size, expected 8388608"

  # Lazy refcounts are a version 3 feature (a compatible feature bit).
  if [ $compat = 1.1 ]; then
    img=$tmp/lazy.qcow2
    qemu-img create -q -f qcow2 -o compat=1.1,lazy_refcounts=on "$img" 4M
    qio "$img" 'write -P 0x66 12345 70000' 'write -P 0x77 3M 64k'
    check_image "$img"
  fi
done
