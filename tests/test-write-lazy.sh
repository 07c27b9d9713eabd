#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes (diffwrite.py, randomized and differential) on images with
# lazy_refcounts=on: plain, with 512-byte clusters (many allocations),
# with an internal snapshot (shared clusters), and over a backing file.
# After the server exits, the image must not be left dirty, qemu-img
# check finds no error and no leak (it does not repair a dirty image,
# so refcounts left stale would show), and qemu reads exactly what the
# driver's model holds.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576

img=$tmp/lazy-64k.qcow2
make_image "$img" $((32 * M + 12 * K)) lazy_refcounts=on,cluster_size=64k 700
diffwrite "$img" --seed 701 --ops 3000 --inflight 8

img=$tmp/lazy-512.qcow2
make_image "$img" $((5 * M + 512)) lazy_refcounts=on,cluster_size=512 702
diffwrite "$img" --seed 703 --ops 3000 --inflight 8

img=$tmp/lazy-snap.qcow2
make_image "$img" $((16 * M)) lazy_refcounts=on,cluster_size=4k 704
qemu-img snapshot -c s "$img"
qemu-img convert -l snapshot.name=s -f qcow2 "$img" -O raw "$tmp/s.raw"
diffwrite "$img" --seed 705 --ops 3000 --inflight 8
qemu-img convert -l snapshot.name=s -f qcow2 "$img" -O raw "$tmp/s.now"
cmp "$tmp/s.raw" "$tmp/s.now" || fail "snapshot s changed"
qemu-img snapshot -d s "$img"
check_written "$img"

base=$tmp/base.qcow2 img=$tmp/lazy-top.qcow2
make_image "$base" $((16 * M)) cluster_size=64k 706
sum=$(md5sum < "$base")
qemu-img create -q -f qcow2 -o lazy_refcounts=on,cluster_size=64k \
  -b "$base" -F qcow2 "$img"
qio "$img" "write -P 0x71 $((3 * M + 5)) 100000"
diffwrite "$img" --seed 707 --ops 3000 --inflight 8
[ "$(md5sum < "$base")" = "$sum" ] || fail "the backing file changed"
