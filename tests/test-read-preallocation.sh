#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Images made with preallocation=metadata, falloc and full: bytes and
# extents as qemu reads them.  With metadata preallocation every cluster
# has an L2 entry pointing at a hole in the file: qemu reports those
# clusters as data that reads as zeros (data=true, zero=true), and the
# written ones as plain data.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

for prealloc in metadata falloc full; do
  for cs in 4k 64k 2M; do
    for ext in off on; do
      [ $ext = on ] && [ $cs = 4k ] && continue   # subclusters >= 16k clusters
      img=$tmp/p-$prealloc-$cs-$ext.qcow2
      qemu-img create -q -f qcow2 \
        -o preallocation=$prealloc,cluster_size=$cs,extended_l2=$ext "$img" 8M
      check_image "$img"
      qio "$img" 'write -P 0x11 0 64k' 'write -P 0x12 1M 5000' \
                 'write -P 0x13 7M 1M' 'write -z 2M 1M' 'discard 4M 2M'
      check_image "$img"
    done
  done
done

# A user's check: with metadata preallocation, an untouched part of the
# disk is reported as zero by the plugin, as by qemu.
img=$tmp/p-metadata-64k-off.qcow2
qemu-img map --output=json "$img" | map_normalize > "$tmp/m"
grep -q '^3145728 1048576 1 1$' "$tmp/m" ||
  { cat "$tmp/m"; fail "qemu does not report [3M, 4M) as data+zero"; }
timeout 60 nbdkit -U - qcow2 "file=$img" --run '
  qemu-img map --output=json -f raw "nbd+unix:///?socket=$unixsocket"
' | map_normalize > "$tmp/n"
grep -q '^3145728 1048576 1 1$' "$tmp/n" ||
  { cat "$tmp/n"; fail "the plugin does not report [3M, 4M) as data+zero"; }
