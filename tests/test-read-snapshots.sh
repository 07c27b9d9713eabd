#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Internal snapshots: the active state is served by default; snapshot=
# serves a snapshot chosen by name or by ID (an ID wins over a name, as
# in qemu), including one taken when the disk was smaller (the export
# has the snapshot's size); an unknown snapshot is refused.  References:
# qemu-img convert -l (qemu reading the snapshot directly; bytes only)
# and a copy of the image reverted to the snapshot with qemu-img
# snapshot -a (bytes and extents).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy nbdinfo

# check_snapshot IMG ID NAME SELECTOR: serve IMG snapshot=SELECTOR, which
# must be the snapshot with this ID and NAME.
check_snapshot ()
{
  local img="$1" id="$2" name="$3" sel="$4"
  local reverted="$tmp/reverted.qcow2"
  local want got active
  cp "$img" "$reverted"
  qemu-img snapshot -a "$name" "$reverted"
  QEMU_IMG_SRC="driver=qcow2,file.filename=$reverted" \
    check_image "$img" "snapshot=$sel"
  want=$(qemu-img info --output=json "$reverted" | grep '"virtual-size"' | tr -dc 0-9)
  got=$(timeout 60 nbdkit -U - qcow2 "file=$img" "snapshot=$sel" \
          --run 'nbdinfo --size "$uri"')
  [ "$want" = "$got" ] ||
    fail "snapshot=$sel: export size $got, the snapshot's disk is $want"
  active=$(qemu-img info --output=json "$img" | grep '"virtual-size"' | tr -dc 0-9)
  if [ "$want" = "$active" ]; then
    QEMU_IMG_OPTS="-l snapshot.id=$id,snapshot.name=$name" \
      check_image "$img" "snapshot=$sel"
  else
    # qemu-img convert -l keeps the active disk's size (the snapshot's
    # data, cut or padded with zeros): compare what both have.
    qemu-img convert -l "snapshot.id=$id,snapshot.name=$name" -f qcow2 \
      "$img" -O raw "$tmp/l.raw"
    timeout 60 nbdkit -U - qcow2 "file=$img" "snapshot=$sel" \
      --run 'nbdcopy "$uri" '"$tmp/l.out" || fail "serving snapshot=$sel"
    cmp -n $((want < active ? want : active)) "$tmp/l.raw" "$tmp/l.out" ||
      fail "snapshot=$sel differs from qemu-img convert -l"
  fi
}

for compat in 0.10 1.1; do
  img=$tmp/snap-$compat.qcow2
  qemu-img create -q -f qcow2 -o compat=$compat,cluster_size=4k "$img" 4M
  qio "$img" 'write -P 0x11 0 1M' 'write -P 0x12 3M 64k'
  qemu-img snapshot -c s1 "$img"
  qio "$img" 'write -P 0x21 512k 1M' 'write -z 3M 4k' 'discard 0 64k'
  qemu-img snapshot -c s2 "$img"
  qio "$img" 'write -P 0x31 1M 8k' 'write -P 0x32 2M 100' 'discard 3M 64k'
  qemu-img snapshot -l "$img" | grep -Eq '^1 +s1 ' || fail "s1 is not ID 1"
  qemu-img snapshot -l "$img" | grep -Eq '^2 +s2 ' || fail "s2 is not ID 2"

  # The active state, with or without snapshots around.
  check_image "$img"
  # By name and by ID.
  check_snapshot "$img" 1 s1 s1
  check_snapshot "$img" 1 s1 1
  check_snapshot "$img" 2 s2 s2
  check_snapshot "$img" 2 s2 2
  # The three states differ (so the checks above could tell them apart).
  for sel in "" snapshot=s1 snapshot=s2; do
    timeout 60 nbdkit -U - qcow2 "file=$img" $sel \
      --run 'nbdcopy "$uri" '"$tmp/state-${sel#snapshot=}.raw"
  done
  cmp -s "$tmp/state-.raw" "$tmp/state-s1.raw" && fail "active state = s1"
  cmp -s "$tmp/state-s1.raw" "$tmp/state-s2.raw" && fail "s1 = s2"
  cmp -s "$tmp/state-.raw" "$tmp/state-s2.raw" && fail "active state = s2"

  # Unknown snapshots are refused, naming what was asked for.
  expect_refused 'nosuch' qcow2 "file=$img" snapshot=nosuch
  expect_refused '"3"' qcow2 "file=$img" snapshot=3
done

# A snapshot whose name is another snapshot's ID: the ID wins (qemu's
# bdrv_snapshot_load_tmp_by_id_or_name order), the name still works
# where it is no ID.
img=$tmp/names.qcow2
qemu-img create -q -f qcow2 "$img" 1M
qio "$img" 'write -P 0x41 0 64k'
qemu-img snapshot -c first "$img"                       # ID 1
qio "$img" 'write -P 0x42 0 64k'
qemu-img snapshot -c 1 "$img"                           # ID 2, name "1"
qio "$img" 'write -P 0x43 0 64k'
qemu-img snapshot -c 7 "$img"                           # ID 3, name "7"
qio "$img" 'write -P 0x44 0 64k'
QEMU_IMG_OPTS="-l 1" check_image "$img" snapshot=1
check_snapshot "$img" 1 first 1
check_snapshot "$img" 3 7 7

# Snapshots of a smaller disk (it grew after the snapshot) and of a
# larger one (it shrank after): each serves its own size.
img=$tmp/grown.qcow2
qemu-img create -q -f qcow2 -o cluster_size=512 "$img" 1000448
qio "$img" 'write -P 0x51 0 1000448'
qemu-img snapshot -c small "$img"
qemu-img resize -q -f qcow2 "$img" 64M
qio "$img" 'write -P 0x52 999424 2048' 'write -P 0x53 40M 1M'
qemu-img snapshot -c big "$img"
qemu-img resize -q -f qcow2 --shrink "$img" 32M
qio "$img" 'write -P 0x54 0 512'
check_image "$img"
check_snapshot "$img" 1 small small
check_snapshot "$img" 2 big 2
for s in small:1000448 big:67108864 1:1000448 2:67108864; do
  size=$(timeout 60 nbdkit -U - qcow2 "file=$img" snapshot=${s%:*} \
           --run 'nbdinfo --size "$uri"')
  [ "$size" = ${s#*:} ] || fail "snapshot=${s%:*}: size $size, expected ${s#*:}"
done

# Snapshots of images with subclusters and compressed clusters.
img=$tmp/ext.qcow2
qemu-img create -q -f qcow2 -o extended_l2=on "$img" 4M
qio "$img" 'write -P 0x61 0 2k' 'write -c -P 0x62 1M 64k' 'write -z 6k 2k'
qemu-img snapshot -c s "$img"
qio "$img" 'write -P 0x63 4k 2k' 'write -P 0x64 1M 2k' 'discard 0 64k'
check_image "$img"
check_snapshot "$img" 1 s s
