#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes (diffwrite.py, randomized and differential, two connections)
# on images with an external data file: plain and raw (data_file_raw:
# the data file alone must read as the guest's disk), over a backing
# file (copy-on-write from it into the data file), with extended L2
# entries, through O_DIRECT, and with the data file named by the
# data-file= option.  Afterwards qemu-img check finds no error and no
# leak, qemu reads exactly what the driver's model holds, a raw data
# file is byte for byte the guest's disk, and backing files are
# unchanged.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576
mc="--connections 2 --inflight 8"

# data_image IMG SIZE OPTS: an image with data file IMG.data, with
# some of everything written by qemu-io.
data_image ()
{
  local img="$1" size="$2" opts="$3"
  qemu-img create -q -f qcow2 -o "data_file=$img.data,$opts" "$img" "$size" ||
    fail "qemu-img create $img ($opts)"
  qio "$img" "write -P 0x11 0 100k" "write -P 0x12 $((M + 5)) 70000" \
             "write -z $((2 * M)) 128k" "write -P 0x13 $((3 * M)) 64k" \
             "discard $((3 * M)) 64k" "write -P 0x14 $((size - 4096)) 4096"
}

# raw_matches IMG: a raw data file reads as the guest's disk.
raw_matches ()
{
  qemu-img convert -f qcow2 -O raw "$1" "$tmp/guest.raw"
  cmp "$tmp/guest.raw" "$1.data" ||
    fail "$1: the raw data file differs from the guest's disk"
}

img=$tmp/plain.qcow2
data_image "$img" $((8 * M)) cluster_size=64k
diffwrite "$img" --seed 601 --ops 3000 $mc

img=$tmp/raw.qcow2
data_image "$img" $((8 * M)) data_file_raw=on,cluster_size=4k
diffwrite "$img" --seed 602 --ops 3000 $mc
raw_matches "$img"

img=$tmp/raw-direct.qcow2
data_image "$img" $((4 * M)) data_file_raw=on,cluster_size=64k
diffwrite "$img" --seed 603 --ops 2000 $mc -- cache=none
raw_matches "$img"

img=$tmp/extl2.qcow2
data_image "$img" $((8 * M)) extended_l2=on,cluster_size=32k
diffwrite "$img" --seed 604 --ops 3000 $mc

base=$tmp/base.qcow2 img=$tmp/over.qcow2
make_image "$base" $((8 * M)) cluster_size=4k 605
sum=$(md5sum < "$base")
qemu-img create -q -f qcow2 -o data_file=$img.data,cluster_size=64k \
  -b "$base" -F qcow2 "$img"
qio "$img" "write -P 0x21 $((M + 3)) 5000" "write -z $((4 * M)) 64k"
diffwrite "$img" --seed 606 --ops 3000 $mc
[ "$(md5sum < "$base")" = "$sum" ] || fail "the backing file changed"

# The data file moved: data-file= names it, for writing too.
img=$tmp/moved.qcow2
data_image "$img" $((4 * M)) data_file_raw=on,cluster_size=16k
mv "$img.data" "$tmp/elsewhere.raw"
ln -s "$tmp/elsewhere.raw" "$img.data"
diffwrite "$img" --seed 607 --ops 1500 $mc -- "data-file=$tmp/elsewhere.raw"
raw_matches "$img"
