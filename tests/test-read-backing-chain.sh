#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Backing chains: depth 3 with a different cluster size at each level
# (qcow2 or raw base), backing files shorter and longer than the
# overlay, and sparse raw backing files (holes map as qemu maps them),
# including one whose size is not a multiple of 512.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

M=1048576

# Depth 3: base (4k clusters) <- mid (64k) <- top (2M), each layer
# writing some ranges over the one below, unaligned, with zeroes and
# discards in the upper layers.
base=$tmp/base.qcow2 mid=$tmp/mid.qcow2 top=$tmp/top.qcow2
qemu-img create -q -f qcow2 -o cluster_size=4k "$base" 16M
qio "$base" 'write -P 0x11 0 6M' 'write -P 0x12 10M 1M' 'write -P 0x13 16773120 4096'
qemu-img create -q -f qcow2 -o cluster_size=64k -b "$base" -F qcow2 "$mid"
qio "$mid" 'write -P 0x21 1000 70000' 'write -P 0x22 3M 1M' \
           'write -z 5M 128k' 'discard 10M 64k' 'write -P 0x23 12M 8k'
qemu-img create -q -f qcow2 -o cluster_size=2M -b "$mid" -F qcow2 "$top"
qio "$top" 'write -P 0x31 2M 4096' 'write -P 0x32 3500k 100' \
           'write -z 8M 2M' 'write -P 0x33 16776704 512'
check_image "$base"
check_image "$mid"
check_image "$top"
# The backing data shows through where top has not written.
timeout 60 nbdkit -U - qcow2 "file=$top" --run 'nbdcopy "$uri" '"$tmp"'/top.raw'
printf '\x11%.0s' $(seq 512) > "$tmp/p11"
cmp -n 512 -i $((5 * M + 200 * 1024)):0 "$tmp/top.raw" "$tmp/p11" ||
  fail "top does not show the base's data where nothing above wrote"

# The same with a raw base and extended L2 / 512-byte clusters above.
rbase=$tmp/base.raw rmid=$tmp/rmid.qcow2 rtop=$tmp/rtop.qcow2
qemu-img create -q -f raw "$rbase" 8M
QIO_FMT=raw qio "$rbase" 'write -P 0x41 0 1M' 'write -P 0x42 5M 12345'
qemu-img create -q -f qcow2 -o cluster_size=512 -b "$rbase" -F raw "$rmid"
qio "$rmid" 'write -P 0x51 100 1000' 'write -z 5M 4k' 'write -P 0x52 7M 3000'
qemu-img create -q -f qcow2 -o cluster_size=64k,extended_l2=on \
  -b "$rmid" -F qcow2 "$rtop"
qio "$rtop" 'write -P 0x61 4k 2k' 'write -z 1M 8k' 'write -P 0x62 5M 2k'
check_image "$rmid"
check_image "$rtop"

# A backing file shorter than the overlay: past its end the overlay
# reads zeros (and maps as qemu says), with overlay writes straddling
# the end of the backing file.
short=$tmp/short.qcow2 long=$tmp/long.qcow2
qemu-img create -q -f qcow2 "$short" 1M
qio "$short" 'write -P 0x71 0 1M'
qemu-img create -q -f qcow2 -b "$short" -F qcow2 "$long" 4M
qio "$long" 'write -P 0x72 1000k 48k' 'write -P 0x73 3M 4k'
check_image "$long"
# With 4k clusters and a backing file ending inside an overlay cluster.
qemu-img create -q -f qcow2 -o cluster_size=64k "$short" 1000448
qio "$short" 'write -P 0x74 0 1000448'
qemu-img create -q -f qcow2 -o cluster_size=2M -b "$short" -F qcow2 "$long" 3M
check_image "$long"
qio "$long" 'write -P 0x75 2M 512'
check_image "$long"
# Raw backing file shorter than the overlay, size not a multiple of 512.
rshort=$tmp/short.raw
head -c 100001 /dev/urandom > "$rshort"
qemu-img create -q -f qcow2 -o cluster_size=4k -b "$rshort" -F raw "$long" 1M
qio "$long" 'write -P 0x76 64k 4k'
check_image "$long"

# A backing file longer than the overlay: only the overlay's size is
# served.
qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$long" 3M
qio "$long" 'write -P 0x77 1M 4k'
check_image "$long"

# A sparse raw backing file: holes in it map as holes (zero, not data),
# data as data, as qemu sees them.
sparse=$tmp/sparse.raw
truncate -s 8M "$sparse"
printf 'hello' | dd of="$sparse" bs=1 seek=$((3 * M + 17)) conv=notrunc status=none
head -c 200000 /dev/urandom | dd of="$sparse" bs=4096 seek=1280 conv=notrunc status=none
qemu-img create -q -f qcow2 -b "$sparse" -F raw "$top" 8M
qio "$top" 'write -P 0x81 6M 64k'
check_image "$top"
qemu-img create -q -f qcow2 -o cluster_size=512 -b "$sparse" -F raw "$top" 8M
qio "$top" 'write -P 0x82 3145216 1536'
check_image "$top"
