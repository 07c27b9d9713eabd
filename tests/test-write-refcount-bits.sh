#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes (diffwrite.py, randomized and differential) on v3 images with
# refcount widths of 1, 16 and 64 bits.  With 1-bit refcounts every
# cluster is either free or used once; with 64-bit refcounts and
# 512-byte clusters a refcount block covers only 64 clusters, so
# writing keeps allocating refcount blocks and growing the refcount
# table.  Afterwards qemu-img check finds no error and no leak, and
# qemu reads exactly what the driver's model holds.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576
seed=200
for cfg in 1:512 1:4096 1:65536 1:2097152 16:512 64:512 64:65536 64:2097152; do
  bits=${cfg%:*} cs=${cfg#*:}
  case $cs in
    512)     size=$((6 * M + 512))   ops=2500 ;;
    4096)    size=$((20 * M + 1024)) ops=3000 ;;
    65536)   size=$((32 * M + 60 * K)) ops=3000 ;;
    2097152) size=$((48 * M))        ops=1000 ;;
  esac
  img=$tmp/r-$bits-$cs.qcow2
  make_image "$img" $size compat=1.1,refcount_bits=$bits,cluster_size=$cs $seed
  inflight=8
  # qemu-nbd 7.2 itself corrupts refcounts of 1-bit images under
  # concurrent discards (qemu-img check: "refcount=0 reference=1"), so
  # when validating the test with it, one request at a time there.
  [ "$write_server" = qemu-nbd ] && [ $bits = 1 ] && inflight=1
  diffwrite "$img" --seed $seed --ops $ops --inflight $inflight
  seed=$((seed + 1))
done
