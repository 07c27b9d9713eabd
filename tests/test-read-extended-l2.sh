#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Extended L2 entries (subclusters: 32 per cluster) with 32k, 64k and
# 2M clusters: subcluster-sized and unaligned writes, subcluster zeroes
# (allocated and unmapped), discards; over a backing file so that the
# unallocated subclusters of an allocated cluster show the backing data,
# and alone.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

for cs in 32768 65536 2097152; do
  sc=$((cs / 32))                       # subcluster size
  size=$((cs * 8))
  [ $size -ge 4194304 ] || size=4194304

  base=$tmp/base-$cs.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=64k "$base" $size
  qio "$base" "write -P 0xbb 0 $size"

  for backing in yes no; do
    img=$tmp/ext-$cs-$backing.qcow2
    if [ $backing = yes ]; then
      qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=$cs \
        -b "$base" -F qcow2 "$img"
    else
      qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=$cs \
        "$img" $size
    fi
    qemu-img info "$img" | grep -q 'extended l2: true' ||
      fail "qemu-img did not create an image with extended L2 entries"
    qio "$img" \
      "write -P 0x01 0 $sc" \
      "write -P 0x02 $((sc * 3)) $((sc * 2))" \
      "write -P 0x03 $((sc * 31)) $((sc * 2))" \
      "write -P 0x04 $((cs * 2 + sc * 5 + 7)) 1000" \
      "write -P 0x05 $((cs * 3)) $cs" \
      "write -z $((cs * 3 + sc * 4)) $((sc * 3))" \
      "write -z -u $((cs * 3 + sc * 10)) $sc" \
      "discard $((cs * 3 + sc * 20)) $((sc * 2))" \
      "write -z $((cs * 4 + sc)) $sc" \
      "write -z -u $((cs * 5 + sc * 2)) $((sc * 2))" \
      "write -P 0x06 $((cs * 6 - 100)) 200" \
      "write -z $((cs * 6 + sc * 8)) $((sc * 24))"
    check_image "$img"
  done
done
