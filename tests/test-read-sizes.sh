#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Virtual sizes that are not a multiple of the cluster size (qemu-img
# rounds sizes up to a multiple of 512), disks smaller than one cluster,
# resized disks, and huge sparse disks (4 TiB, 100 TiB + 512), for which
# only chosen windows and the extents of the whole disk are checked.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy nbdinfo

# served_size IMG: the size of the export.
served_size ()
{
  timeout 60 nbdkit -U - qcow2 "file=$1" --run 'nbdinfo --size "$uri"'
}

# check_size IMG BYTES [WINDOWS...]
check_size ()
{
  local s
  s=$(served_size "$1")
  [ "$s" = "$2" ] || fail "$1: served size $s, expected $2"
  s=$(qemu-img info --output=json "$1" | grep '"virtual-size"' | tr -dc 0-9)
  [ "$s" = "$2" ] || fail "$1: qemu says size $s, expected $2"
}

# 1000000 bytes with 64k clusters: qemu makes it 1000448, so the last
# cluster is partial.
img=$tmp/1000000.qcow2
qemu-img create -q -f qcow2 "$img" 1000000
qio "$img" 'write -P 0x11 0 4096' 'write -P 0x22 982940 17508' \
           'write -P 0x33 999936 512'
check_size "$img" 1000448
check_image "$img"

# Odd multiples of 512 for every cluster size, some smaller than one
# cluster; the last sector is written, and the one before is not.
for spec in 512:999x512 4096:385x512 65536:3x512 65536:257x512 \
            2097152:10241x512 2097152:1x512; do
  cs=${spec%%:*}
  n=${spec#*:}; n=${n%x512}
  size=$((n * 512))
  img=$tmp/odd-$cs-$size.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=$cs "$img" $size
  qio "$img" "write -P 0x44 0 100" "write -P 0x55 $((size - 512)) 512"
  if [ $n -gt 3 ]; then
    qio "$img" "write -P 0x66 $((size / 2 + 1)) $((size / 4))"
  fi
  check_size "$img" $size
  check_image "$img"
done

# Shrunk (data past the new end is gone) and grown (the new part reads
# as zeros) disks.
img=$tmp/shrunk.qcow2
qemu-img create -q -f qcow2 "$img" 2M
qio "$img" 'write -P 0x77 0 2M'
qemu-img resize -q -f qcow2 --shrink "$img" $((1000 * 512))
check_size "$img" 512000
check_image "$img"
qemu-img resize -q -f qcow2 "$img" $((3 * 1024 * 1024 + 512))
qio "$img" 'write -P 0x78 3M 512'
check_size "$img" 3146240
check_image "$img"

# 4 TiB, sparse: writes at the start, across the boundary of two L2
# tables (one maps 512 MiB with 64k clusters) near 1 TiB, and at the end.
img=$tmp/4T.qcow2
T=$((1024 * 1024 * 1024 * 1024))
qemu-img create -q -f qcow2 "$img" 4T
qio "$img" \
  'write -P 0x11 0 64k' \
  "write -P 0x22 $((T - 100000)) 200000" \
  "write -P 0x33 $((3 * T + 12345)) 4096" \
  "write -P 0x44 $((4 * T - 65536 - 512)) 512" \
  "write -P 0x55 $((4 * T - 512)) 512"
check_size "$img" $((4 * T))
check_map "$img"
check_window "$img" 0 $((1024 * 1024))
check_window "$img" $((T - 1024 * 1024)) $((2 * 1024 * 1024))
check_window "$img" $((3 * T)) $((64 * 1024))
check_window "$img" $((4 * T - 1024 * 1024)) $((1024 * 1024))
# An odd window start (qemu wants the window size a multiple of 512).
check_window "$img" $((T - 100001)) $((391 * 512))

# 100 TiB + 512 with 2M clusters: the end is not cluster aligned.
img=$tmp/100T.qcow2
size=$((100 * T + 512))
qemu-img create -q -f qcow2 -o cluster_size=2M "$img" $size
qio "$img" \
  "write -P 0x66 $((50 * T - 1000)) 3000" \
  "write -P 0x77 $((size - 1024)) 1024"
check_size "$img" $size
check_map "$img"
check_window "$img" $((50 * T - 4 * 1024 * 1024)) $((8 * 1024 * 1024))
check_window "$img" $((size - 3 * 1024 * 1024)) $((3 * 1024 * 1024))
