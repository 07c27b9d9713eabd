#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes (diffwrite.py, randomized and differential) on preallocated
# images (qemu-img create -o preallocation=metadata, falloc and full):
# every cluster is allocated up front, writes go in place, and zeroes
# and trims must keep the image consistent.  Also v2 and extended L2
# with preallocation=metadata.  Afterwards qemu-img check finds no error
# and no leak, and qemu reads exactly what the driver's model holds.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576
seed=800
for opts in preallocation=metadata,cluster_size=64k \
            preallocation=falloc,cluster_size=4k \
            preallocation=full,cluster_size=64k \
            preallocation=metadata,cluster_size=4k,compat=0.10 \
            preallocation=metadata,cluster_size=64k,extended_l2=on \
            preallocation=falloc,cluster_size=2M; do
  img=$tmp/p-$seed.qcow2
  size=$((24 * M + 8 * K))
  case $opts in *2M*) size=$((32 * M)) ;; esac
  qemu-img create -q -f qcow2 -o "$opts" "$img" $size
  qio "$img" "write -P 0x11 0 $((3 * M))" "write -P 0x12 $((5 * M + 77)) 123456" \
             "write -z $((8 * M)) $((M))" "discard $((10 * M)) 128k" \
             "write -P 0x13 $((size - 4096)) 4096"
  ops=3000
  case $opts in *2M*) ops=1000 ;; esac
  diffwrite "$img" --seed $seed --ops $ops --inflight 8
  seed=$((seed + 1))
done
