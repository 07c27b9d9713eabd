#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes (diffwrite.py, randomized and differential) on images with
# internal snapshots, v2 and v3: clusters shared with a snapshot must be
# copied, never written in place.  Afterwards qemu-img check finds no
# error and no leak, qemu reads exactly what the driver's model holds,
# every snapshot reads (qemu-img convert -l) as before and is still
# listed as before, reverting to one gives its data back, and deleting
# the snapshots leaves a consistent image (refcounts right).  Then a
# snapshot taken after our writes, more of our writes, and the same.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576

# save_snapshots IMG NAMES...: their contents, and the snapshot list.
save_snapshots ()
{
  local img="$1" s; shift
  for s in "$@"; do
    qemu-img convert -l "snapshot.name=$s" -f qcow2 "$img" -O raw \
      "$tmp/snap-$s.raw" || fail "qemu-img convert -l snapshot.name=$s"
  done
  qemu-img snapshot -l "$img" > "$tmp/snap-list"
}

# check_snapshots IMG NAMES...: unchanged since save_snapshots.
check_snapshots ()
{
  local img="$1" s; shift
  qemu-img snapshot -l "$img" > "$tmp/snap-list.now"
  diff -u "$tmp/snap-list" "$tmp/snap-list.now" ||
    fail "the snapshot list of $img changed"
  for s in "$@"; do
    qemu-img convert -l "snapshot.name=$s" -f qcow2 "$img" -O raw \
      "$tmp/snap-now.raw" || fail "qemu-img convert -l snapshot.name=$s"
    cmp "$tmp/snap-$s.raw" "$tmp/snap-now.raw" ||
      fail "snapshot $s of $img changed"
  done
}

seed=600
for cfg in 0.10:65536:6 1.1:4096:6 1.1:65536:2 1.1:512:6; do
  IFS=: read -r compat cs ops_k <<< "$cfg"
  size=$((24 * M + 3 * K))
  [ "$cs" = 512 ] && size=$((5 * M + 512))
  img=$tmp/s-$compat-$cs.qcow2
  make_image "$img" $size compat=$compat,cluster_size=$cs $seed
  qemu-img snapshot -c s1 "$img"
  qio "$img" "write -P 0x21 $((size / 5)) $((size / 7))" \
             "write -z $((size / 2 + 100)) 70000" "discard 0 $((2 * cs))"
  qemu-img snapshot -c s2 "$img"
  qio "$img" "write -P 0x31 $((size / 3)) 8000"
  save_snapshots "$img" s1 s2
  # The states differ, so that the checks below can tell them apart.
  cmp -s "$tmp/snap-s1.raw" "$tmp/snap-s2.raw" && fail "s1 = s2"

  diffwrite "$img" --seed $seed --ops $((ops_k * 500)) --inflight 8
  check_snapshots "$img" s1 s2
  cp "$tmp/dw-final.raw" "$tmp/active.raw"

  # A snapshot of what we wrote, and more writes over it.
  qemu-img snapshot -c s3 "$img"
  save_snapshots "$img" s1 s2 s3
  cmp "$tmp/active.raw" "$tmp/snap-s3.raw" || fail "s3 is not what we wrote"
  diffwrite "$img" --seed $((seed + 50)) --ops $((ops_k * 250)) --inflight 8
  check_snapshots "$img" s1 s2 s3

  # Reverting to a snapshot gives its data back.
  cp "$img" "$tmp/reverted.qcow2"
  qemu-img snapshot -a s2 "$tmp/reverted.qcow2"
  check_written "$tmp/reverted.qcow2"
  qemu-img convert -f qcow2 -O raw "$tmp/reverted.qcow2" "$tmp/reverted.raw"
  cmp "$tmp/snap-s2.raw" "$tmp/reverted.raw" || fail "reverting to s2"

  # Deleting the snapshots: qemu drops their references; any refcount
  # we got wrong shows up now.
  cp "$tmp/dw-final.raw" "$tmp/active.raw"
  for s in s2 s1 s3; do
    qemu-img snapshot -d $s "$img"
    check_written "$img"
  done
  qemu-img convert -f qcow2 -O raw "$img" "$tmp/after-delete.raw"
  cmp "$tmp/active.raw" "$tmp/after-delete.raw" ||
    fail "deleting the snapshots changed the active disk"
  seed=$((seed + 1))
done
