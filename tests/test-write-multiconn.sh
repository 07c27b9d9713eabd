#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes (diffwrite.py, randomized and differential) over 4 connections
# at once, 16 requests in flight on each (never two on the same bytes):
# allocations, COW and refcount updates from concurrent requests,
# reads on one connection of what another wrote, flushes on any.  The
# server must advertise multi-conn (our plugin does).  Images: v3 over
# a backing file, 512-byte clusters with 64-bit refcounts (constant
# metadata allocation), extended L2 with compressed clusters, v2, and
# lazy refcounts with a snapshot.  Afterwards qemu-img check finds no
# error and no leak, and qemu reads exactly what the model holds.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576
mc="--connections 4 --inflight 16"

base=$tmp/base.qcow2 img=$tmp/m-top.qcow2
make_image "$base" $((32 * M)) cluster_size=4k 900
sum=$(md5sum < "$base")
qemu-img create -q -f qcow2 -o cluster_size=64k -b "$base" -F qcow2 "$img"
qio "$img" "write -P 0x21 $((M + 3)) 200000" "write -z $((9 * M)) 64k"
diffwrite "$img" --seed 901 --ops 6000 $mc
[ "$(md5sum < "$base")" = "$sum" ] || fail "the backing file changed"

img=$tmp/m-512.qcow2
make_image "$img" $((6 * M + 512)) cluster_size=512,refcount_bits=64 902
diffwrite "$img" --seed 903 --ops 6000 $mc

img=$tmp/m-extl2.qcow2
make_image "$img" $((24 * M)) cluster_size=64k,extended_l2=on 904
qio "$img" "discard $((12 * M)) 256k" "write -c -P 0x31 $((12 * M)) 256k"
diffwrite "$img" --seed 905 --ops 6000 $mc

img=$tmp/m-v2.qcow2
make_image "$img" $((16 * M + 4 * K)) compat=0.10,cluster_size=4k 906
diffwrite "$img" --seed 907 --ops 6000 $mc

img=$tmp/m-lazy.qcow2
make_image "$img" $((16 * M)) cluster_size=16k,lazy_refcounts=on 908
qemu-img snapshot -c s "$img"
qemu-img convert -l snapshot.name=s -f qcow2 "$img" -O raw "$tmp/s.raw"
diffwrite "$img" --seed 909 --ops 6000 $mc
qemu-img convert -l snapshot.name=s -f qcow2 "$img" -O raw "$tmp/s.now"
cmp "$tmp/s.raw" "$tmp/s.now" || fail "snapshot s changed"

# Few clusters, many requests in flight: concurrent allocating writes
# (their copy-on-write reads and data writes run with the image lock
# released) often land in the same cluster, and the later ones must
# wait for the first to map it.
base=$tmp/small-base.qcow2 img=$tmp/small-top.qcow2
make_image "$base" $((M)) cluster_size=64k 910
qemu-img create -q -f qcow2 -o cluster_size=64k -b "$base" -F qcow2 "$img"
diffwrite "$img" --seed 911 --ops 4000 --max-len 5000 $mc
for i in 1 2 3; do
  rm -f "$img"
  qemu-img create -q -f qcow2 -o cluster_size=4k "$img" $((256 * K))
  diffwrite "$img" --seed $((911 + i)) --ops 3000 --max-len 9000 $mc
done
