#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Persistent dirty bitmaps (the bitmaps header extension, autoclear bit
# 0, bitmap directory and tables in the file): images carrying enabled,
# disabled, dirty and merged bitmaps of several granularities read as
# the same data, with or without a backing file.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

for cs in 4k 64k; do
  img=$tmp/bm-$cs.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=$cs "$img" 16M
  qio "$img" 'write -P 0x11 0 1M' 'write -P 0x12 5M 4k'
  qemu-img bitmap --add "$img" b0
  check_image "$img"

  # Writes with the bitmap enabled dirty it; more bitmaps, one disabled,
  # one with a small granularity, one merged from another.
  qio "$img" 'write -P 0x13 2M 1M' 'write -z 5M 64k' 'discard 0 64k'
  qemu-img bitmap --add -g 512 "$img" fine
  qemu-img bitmap --add --disable "$img" off
  qio "$img" 'write -P 0x14 8M 3000' 'write -P 0x15 16773120 4096'
  qemu-img bitmap --add "$img" merged
  qemu-img bitmap --merge b0 "$img" merged
  qemu-img bitmap --disable "$img" b0
  qemu-img info "$img" > "$tmp/info"
  for b in b0 fine off merged; do
    grep -q "name: $b\$" "$tmp/info" || fail "$img has no bitmap $b"
  done
  check_image "$img"
done

# A bitmap in an overlay.
base=$tmp/bm-64k.qcow2
img=$tmp/bm-top.qcow2
qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$img"
qemu-img bitmap --add "$img" top
qio "$img" 'write -P 0x21 3M 100k'
check_image "$img"
