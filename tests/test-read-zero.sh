#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Zero clusters (v3 "write -z", allocated and unmapped with -u), discard,
# on their own and over a backing file whose data they must hide; v2
# zero writes and discards (no zero flag in v2) for comparison.  Bytes
# and extents (zero clusters are holes or zero-data as qemu says).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

for compat in 1.1 0.10; do
  for cs in 4k 64k; do
    # Alone.
    img=$tmp/z-$compat-$cs.qcow2
    qemu-img create -q -f qcow2 -o compat=$compat,cluster_size=$cs "$img" 4M
    qio "$img" \
      'write -P 0x11 0 1M' \
      'write -P 0x12 2M 1M' \
      'write -z 64k 64k' \
      'write -z -u 256k 128k' \
      'write -z 1000 3000' \
      'write -z 2M 4k' \
      'write -z -u 2200k 100k' \
      'discard 512k 256k' \
      'discard 2560k 64k' \
      'write -z 3584k 256k' \
      'write -z -u 3900k 64k'
    check_image "$img"

    # Over a backing file full of data: zeroed and discarded clusters of
    # the top must read as zeros (v3) or show the backing (v2 discard).
    base=$tmp/zb-$compat-$cs.qcow2
    qemu-img create -q -f qcow2 -o compat=$compat "$base" 4M
    qio "$base" 'write -P 0xbb 0 4M'
    img=$tmp/zt-$compat-$cs.qcow2
    qemu-img create -q -f qcow2 -o compat=$compat,cluster_size=$cs \
      -b "$base" -F qcow2 "$img"
    qio "$img" \
      'write -P 0x21 0 256k' \
      'write -z 64k 64k' \
      'write -z -u 128k 64k' \
      'write -z 1M 192k' \
      'write -z -u 1536k 128k' \
      'discard 192k 64k' \
      'discard 2M 1M'
    check_image "$img"
  done
done

# Zero clusters must hide data from the backing file: check the bytes
# directly as well.
img=$tmp/zt-1.1-64k.qcow2
timeout 60 nbdkit -U - qcow2 "file=$img" --run '
  nbdcopy "$uri" '"$tmp"'/zt.raw
' || fail "serving $img"
cmp -n 65536 -i 65536:0 "$tmp/zt.raw" /dev/zero ||
  fail "a v3 zero cluster over backing data does not read as zeros"
