#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes (diffwrite.py, randomized and differential) on images with
# extended L2 entries (subclusters): clusters of 16 KiB (512-byte
# subclusters), 64 KiB and 2 MiB, alone, with compressed clusters, and
# over a backing file (so that unallocated subclusters of an allocated
# cluster read from the backing file).  Afterwards qemu-img check finds
# no error and no leak, qemu reads exactly what the driver's model
# holds, and the backing file is unchanged.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576
seed=300
for cs in 16384 65536 2097152; do
  case $cs in
    16384)   size=$((12 * M + 3 * K)) ops=3000 ;;
    65536)   size=$((32 * M + 36 * K)) ops=3000 ;;
    2097152) size=$((48 * M + 512))  ops=1000 ;;
  esac
  img=$tmp/x-$cs.qcow2
  make_image "$img" $size extended_l2=on,cluster_size=$cs $seed
  # Some compressed clusters, and subclusters zeroed and discarded.
  qio "$img" "discard $(( (size / 2 / cs + 2) * cs )) $cs" \
             "write -c -P 0x71 $(( (size / 2 / cs + 2) * cs )) $cs" \
             "write -z $((3 * cs + cs / 4)) $((cs / 8))" \
             "discard $((5 * cs)) $((cs / 2))"
  diffwrite "$img" --seed $seed --ops $ops --inflight 8
  seed=$((seed + 1))
done

# Over a backing file of 4 KiB clusters, writes into 64 KiB clusters of
# 2 KiB subclusters.
base=$tmp/base.qcow2
make_image "$base" $((24 * M)) cluster_size=4096 $seed
sum=$(md5sum < "$base")
img=$tmp/x-over.qcow2
qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=64k \
  -b "$base" -F qcow2 "$img"
qio "$img" "write -P 0x72 $((M + 1000)) 5000" "write -z $((3 * M)) 6144" \
           "write -P 0x73 $((5 * M)) 64k"
diffwrite "$img" --seed $((seed + 1)) --ops 3000 --inflight 8
[ "$(md5sum < "$base")" = "$sum" ] || fail "the backing file changed"
