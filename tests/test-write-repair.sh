#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Images that need care before the first write:
#  - a dirty image (lazy refcounts, crashed writer) is served read-only
#    as is with nbdkit -r (no repair, file unchanged), and repaired on
#    the first write: refcounts rebuilt, the user told, qemu-img check
#    clean, no data changed (snapshots included);
#  - an image with persistent bitmaps: after a write they are kept,
#    not in use, and qemu-img check finds no error and no leak.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh md5sum

dirty_bit ()
{
  local v
  v=$(/usr/bin/python3 "$srcdir/qcow2-patch.py" "$1" be64 72)
  echo $(( v & 1 ))
}

crash_writes ()   # IMG CMDS...: run qemu-io commands, then abort it
{
  local img="$1"; shift
  local args=() c
  for c in "$@" abort; do args+=(-c "$c"); done
  ( ulimit -c 0; exec qemu-io -f qcow2 "${args[@]}" "$img" >/dev/null 2>&1 ) 2>/dev/null || true
}

for cs in 512 4k 64k; do
  img=$tmp/dirty-$cs.qcow2
  qemu-img create -q -f qcow2 -o lazy_refcounts=on,cluster_size=$cs "$img" 8M
  qemu-io -f qcow2 -c 'write -P 1 0 1M' "$img" >/dev/null
  qemu-img snapshot -c s1 "$img"
  crash_writes "$img" 'write -P 2 0 64k' 'write -P 4 2M 192k'
  [ "$(dirty_bit "$img")" = 1 ] || fail "$img: setup did not leave it dirty"
  qemu-img convert -U -f qcow2 -O raw "$img" "$tmp/before.raw"
  sum=$(md5sum < "$img")

  # Read-only: served as is, no repair.
  nbdkit -r -U - qcow2 "$img" --run "nbdcopy \"\$uri\" $tmp/ro.raw"
  cmp "$tmp/before.raw" "$tmp/ro.raw" || fail "$img: -r read differs"
  [ "$(md5sum < "$img")" = "$sum" ] || fail "$img: -r changed the file"

  # First write repairs, and says so.
  nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"Z\" * 5000, 3 * 1024 * 1024 + 100)
h.flush()
"' 2> "$tmp/err"
  grep -q "refcounts rebuilt" "$tmp/err" || fail "$img: repair not reported: $(cat "$tmp/err")"
  qemu-img check -q "$img" || fail "$img: qemu-img check after repair"
  [ "$(dirty_bit "$img")" = 0 ] || fail "$img: still dirty after a clean close"
  qemu-io -f raw -c 'write -P 0x5a 3145828 5000' "$tmp/before.raw" >/dev/null
  qemu-img convert -f qcow2 -O raw "$img" "$tmp/after.raw"
  cmp "$tmp/before.raw" "$tmp/after.raw" || fail "$img: data changed by the repair"
  qemu-img convert -l snapshot.name=s1 -f qcow2 -O raw "$img" "$tmp/s1.raw"
  qemu-io -f raw -c 'read -P 1 0 1M' -c 'read -P 0 1M 7M' "$tmp/s1.raw" >/dev/null ||
    fail "$img: snapshot s1 changed"
done

# Bitmaps: a write keeps them, consistent, and leaves no leak behind.
img=$tmp/bitmaps.qcow2
qemu-img create -q -f qcow2 "$img" 16M
qemu-img bitmap --add "$img" b0
qemu-io -f qcow2 -c 'write -P 3 0 1M' "$img" >/dev/null
qemu-img bitmap --add "$img" b1 --granularity 512
nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "h.pwrite(b\"Z\" * 5000, 2 * 1024 * 1024); h.flush()"'
qemu-img info "$img" > "$tmp/info" 2>&1
grep -q "name: b1" "$tmp/info" || fail "bitmaps dropped: $(cat "$tmp/info")"
! grep -Eq "in-use|lacking bitmap support" "$tmp/info" ||
  fail "bitmaps left in use or stale: $(cat "$tmp/info")"
qemu-img check -q "$img" 2>/dev/null || fail "qemu-img check after a write to an image with bitmaps"
qemu-io -f qcow2 -c 'read -P 3 0 1M' -c 'read -P 0x5a 2M 5000' "$img" >/dev/null 2>&1 ||
  fail "bitmaps image data"
