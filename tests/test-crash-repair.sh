#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# repair=leaks: leaked clusters are reclaimed before serving (qemu-img
# check then exit 0, data unchanged, the reclaimed clusters reused
# safely); a dirty image gets its refcounts rebuilt; an image with
# errors a leak repair cannot fix is refused, as is a read-only one.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh /usr/bin/python3

patch=("/usr/bin/python3" "$srcdir/qcow2-patch.py")

# leak IMG N: append N clusters to IMG that nothing references, with a
# refcount of 1 each (what a crash leaves: counted, never used).
leak ()
{
  local img="$1" n="$2" cs size table block c
  cs=$(( 1 << $("${patch[@]}" "$img" field cluster_bits) ))
  size=$(stat -c %s "$img")
  size=$(( (size + cs - 1) / cs * cs ))
  table=$("${patch[@]}" "$img" field refcount_table_offset)
  block=$("${patch[@]}" "$img" be64 "$table")
  "${patch[@]}" "$img" truncate $(( size + n * cs ))
  for c in $(seq $(( size / cs )) $(( size / cs + n - 1 ))); do
    "${patch[@]}" "$img" be16 $(( block + c * 2 )) 1
  done
}

# qemu_check IMG EXPECTED-EXIT
qemu_check ()
{
  local r=0
  qemu-img check "$1" > "$tmp/check.out" 2>&1 || r=$?
  [ "$r" = "$2" ] || {
    cat "$tmp/check.out" >&2
    fail "qemu-img check $1 exited with $r, expected $2"
  }
}

for cs in 4k 64k; do
  img=$tmp/leaks-$cs.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=$cs "$img" 8M
  qio "$img" 'write -P 0x11 0 1M' 'write -P 0x22 3M 100k'
  leak "$img" 3
  qemu_check "$img" 3
  grep -q "3 leaked clusters" "$tmp/check.out" || fail "setup: $(cat "$tmp/check.out")"
  qemu-img convert -f qcow2 -O raw "$img" "$tmp/before.raw"

  # The repair says what it did, and changes no data.
  nbdkit -U - qcow2 "$img" repair=leaks --run 'nbdcopy "$uri" '"$tmp/served.raw" \
    2> "$tmp/err" || fail "repair=leaks: $(cat "$tmp/err")"
  grep -q "3 leaked clusters reclaimed" "$tmp/err" ||
    fail "$img: the repair was not reported: $(cat "$tmp/err")"
  cmp "$tmp/before.raw" "$tmp/served.raw" || fail "$img: served data changed"
  qemu_check "$img" 0
  qemu-img convert -f qcow2 -O raw "$img" "$tmp/after.raw"
  cmp "$tmp/before.raw" "$tmp/after.raw" || fail "$img: repair changed data"

  # The reclaimed clusters are allocated again, and nothing breaks.
  leak "$img" 2
  nbdkit -U - qcow2 "$img" repair=leaks --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x33\" * 300000, 5 * 1024 * 1024)
h.flush()
"' 2> "$tmp/err" || fail "write after repair: $(cat "$tmp/err")"
  qemu_check "$img" 0
  qio "$img" 'read -P 0x11 0 1M' 'read -P 0x22 3M 100k' \
    'read -P 0x33 5M 300000'

  # Nothing to repair: nothing said, nothing changed.
  sum=$(md5sum < "$img")
  nbdkit -U - qcow2 "$img" repair=leaks --run true 2> "$tmp/err"
  ! grep -q "reclaimed" "$tmp/err" || fail "$img: a repair of nothing: $(cat "$tmp/err")"
  [ "$(md5sum < "$img")" = "$sum" ] || fail "$img: changed by a repair of nothing"
done

# A dirty image (lazy refcounts, a writer killed): rebuilt, clean.
img=$tmp/dirty.qcow2
qemu-img create -q -f qcow2 -o lazy_refcounts=on,cluster_size=4k "$img" 8M
qio "$img" 'write -P 1 0 1M'
( ulimit -c 0; exec qemu-io -f qcow2 -c 'write -P 2 2M 192k' -c abort "$img" \
    >/dev/null 2>&1 ) 2>/dev/null || true
[ "$("${patch[@]}" "$img" be64 72)" = 1 ] || fail "setup: $img is not dirty"
qemu-img convert -U -f qcow2 -O raw "$img" "$tmp/before.raw"
nbdkit -U - qcow2 "$img" repair=leaks --run true 2> "$tmp/err" ||
  fail "repair of a dirty image: $(cat "$tmp/err")"
grep -q "refcounts rebuilt" "$tmp/err" || fail "rebuild not reported: $(cat "$tmp/err")"
qemu_check "$img" 0
qemu-img convert -f qcow2 -O raw "$img" "$tmp/after.raw"
cmp "$tmp/before.raw" "$tmp/after.raw" || fail "$img: rebuild changed data"

# readonly=true, or an error a leak repair cannot fix: refused.
img=$tmp/leaks-64k.qcow2
expect_refused "repair=leaks.*cannot be written" qcow2 "$img" repair=leaks \
  readonly=true
table=$("${patch[@]}" "$img" field refcount_table_offset)
block=$("${patch[@]}" "$img" be64 "$table")
data=$("${patch[@]}" "$img" l2-entry 0 | cut -d' ' -f1)
data=$(( data & 0x00fffffffffffe00 ))
"${patch[@]}" "$img" be16 $(( block + data / 65536 * 2 )) 0
expect_refused "repair=leaks.*errors remain" qcow2 "$img" repair=leaks
expect_refused "repair: expected leaks or off" qcow2 "$img" repair=all
