#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes, randomized and differential (diffwrite.py: unaligned writes,
# zeroes, trims, flushes, FUA, with read-back, against an independent
# model), on v2 and v3 images with clusters of 512 B, 4 KiB, 64 KiB and
# 2 MiB, each disk a size that is not a multiple of its cluster size
# and starting with data, zero clusters and holes.  Afterwards
# qemu-img check finds no error and no leak, and qemu reads exactly
# what the driver's model holds.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576
seed=100
for compat in 0.10 1.1; do
  for cs in 512 4096 65536 2097152; do
    case $cs in
      512)     size=$((6 * M + 1536))  ops=2500 ;;
      4096)    size=$((24 * M + 3584)) ops=3000 ;;
      65536)   size=$((40 * M + 12 * K)) ops=3000 ;;
      2097152) size=$((64 * M + 512))  ops=1500 ;;
    esac
    img=$tmp/f-$compat-$cs.qcow2
    make_image "$img" $size compat=$compat,cluster_size=$cs $seed
    diffwrite "$img" --seed $seed --ops $ops --inflight 8
    seed=$((seed + 1))
  done
done
