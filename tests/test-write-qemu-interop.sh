#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Interoperation with qemu, both ways, on v2 and v3 images:
#  1. our random writes (diffwrite.py): qemu-img convert reads exactly
#     what the driver's model holds, qemu-img check finds no error;
#  2. our writes of known patterns (unaligned, across clusters, whole
#     clusters, zeroes, the last bytes of the disk): qemu-io reads each
#     pattern back with read -P;
#  3. qemu-io writes after us (patterns, zeroes, discards, a compressed
#     cluster): we read all of the disk as qemu-img convert does;
#  4. our random writes again, over what qemu wrote.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576
seed=1000
for cfg in 1.1:65536 0.10:4096 1.1:2097152; do
  compat=${cfg%:*} cs=${cfg#*:}
  size=$((24 * M + 3 * K))
  [ "$cs" = 2097152 ] && size=$((32 * M))
  img=$tmp/i-$compat-$cs.qcow2
  make_image "$img" $size compat=$compat,cluster_size=$cs $seed

  # 1.
  ops=3000
  [ "$cs" = 2097152 ] && ops=1000
  diffwrite "$img" --seed $((seed + 1)) --ops $ops --inflight 8

  # 2. Six disjoint ranges, in the eighths of the disk.
  e=$((size / 8 / cs * cs))          # an eighth, rounded to clusters
  a=$((e + 12345))                   # unaligned, 5000 bytes
  b=$((2 * e + cs - 1))              # 1 byte before a cluster boundary
  c=$((3 * e - 300))                 # across a boundary, cs + 600 bytes
  d=$((4 * e))                       # two whole clusters
  z=$((5 * e + 100))                 # zeroes, 2 clusters unaligned
  t=$((size - 700))                  # the end of the disk
  serve_rw "$img" "nbdsh -u \"\$uri\" -c '
h.pwrite(b\"\\xa1\" * 5000, $a)
h.pwrite(b\"\\xa2\", $b)
h.pwrite(b\"\\xa3\" * ($cs + 600), $c)
h.pwrite(b\"\\xa4\" * (2 * $cs), $d)
h.zero(2 * $cs, $z)
h.pwrite(b\"\\xa5\" * 700, $t)
h.flush()
'" || fail "writing patterns through the server"
  check_written "$img"
  qio "$img" "read -P 0xa1 $a 5000" "read -P 0xa2 $b 1" \
             "read -P 0xa3 $c $((cs + 600))" "read -P 0xa4 $d $((2 * cs))" \
             "read -P 0 $z $((2 * cs))" "read -P 0xa5 $t 700"

  # 3.
  qio "$img" "write -P 0xb1 $((a + 1)) 3000" "write -P 0xb2 $((6 * e + 17)) $((cs + 5))" \
             "write -z $((d + cs / 2)) $cs" "discard $((7 * e)) $((2 * cs))" \
             "write -c -P 0xb3 $((7 * e)) $cs" "write -P 0xb4 $((size - 1)) 1"
  qemu-img check -q -f qcow2 "$img" || fail "qemu-io left $img inconsistent"
  qemu-img convert -f qcow2 -O raw "$img" "$tmp/qemu.raw"
  rm -f "$tmp/ours.raw"
  serve_rw "$img" "nbdcopy \"\$uri\" $tmp/ours.raw" ||
    fail "reading $img through the server"
  cmp "$tmp/qemu.raw" "$tmp/ours.raw" ||
    fail "we read $img differently from qemu after qemu-io wrote to it"

  # 4.
  diffwrite "$img" --seed $((seed + 2)) --ops $ops --inflight 8
  seed=$((seed + 10))
done
