#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Cluster sizes 512, 4k, 64k and 2M (v2 and v3), with writes crossing
# cluster boundaries, at odd offsets and lengths, and at the very end.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

for cs in 512 4096 65536 2097152; do
  for compat in 0.10 1.1; do
    img=$tmp/c$cs-$compat.qcow2
    size=$((cs * 16 > 8388608 ? cs * 16 : 8388608))
    qemu-img create -q -f qcow2 -o cluster_size=$cs,compat=$compat "$img" $size
    qemu-img info "$img" | grep -q "cluster_size: $cs" ||
      fail "qemu-img did not create an image with $cs-byte clusters"
    qio "$img" \
      "write -P 0x11 0 $((cs + 1))" \
      "write -P 0x22 $((cs * 3 - 7)) 1000" \
      "write -P 0x33 $((cs * 5 + 123)) $((cs * 2 + 5))" \
      "write -P 0x44 1000001 333333" \
      "write -P 0x55 $((3 * 1024 * 1024 - 1)) 2" \
      "write -P 0x66 $((size - cs - 100)) $((cs + 100))"
    check_image "$img"
  done
done

# Many clusters in use: several L2 tables with small clusters (one 512-
# byte L2 table maps only 32 KiB), written in an interleaved order so
# that host clusters are out of guest order.
img=$tmp/many.qcow2
qemu-img create -q -f qcow2 -o cluster_size=512 "$img" 4M
cmds=()
for i in $(seq 0 63); do
  cmds+=("write -P $((i + 1)) $(( (i * 37 % 64) * 65536 + i * 7 )) $((300 + i * 13))")
done
qio "$img" "${cmds[@]}"
check_image "$img"
