#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The overlap guard.  A corrupt refcount block that calls the active L2
# table free makes the next allocation pick that very cluster for guest
# data: the guard must refuse the write (EIO), name the structure and
# the offset, mark the image corrupt (qemu sees it too), refuse later
# writes and keep serving reads.  With the guard off for that structure
# (overlap-check=none, =constant, or overlap-check.active-l2=off) the
# write goes through and qemu-img check finds the damage: the guard is
# what stood in the way.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh

patch=/usr/bin/python3
make_bad ()     # IMG: a refcount block calls the L2 table free
{
  rm -f "$1"
  qemu-img create -q -f qcow2 -o cluster_size=64k "$1" 64M
  qemu-io -f qcow2 -c 'write -P 0x33 0 64k' "$1" >/dev/null
  l2=$($patch "$srcdir/qcow2-patch.py" "$1" be64 $((0x30000)) )
  l2=$(( l2 & 0x00fffffffffffe00 ))
  reftable=$($patch "$srcdir/qcow2-patch.py" "$1" be64 48)
  block=$($patch "$srcdir/qcow2-patch.py" "$1" be64 "$reftable")
  $patch "$srcdir/qcow2-patch.py" "$1" be16 $(( block + (l2 >> 16) * 2 )) 0
  echo "$l2"
}

img=$tmp/bad.qcow2
l2=$(make_bad "$img")
[ "$(( $(/usr/bin/python3 "$srcdir/qcow2-patch.py" "$img" be64 40) ))" = $((0x30000)) ] ||
  fail "unexpected layout: L1 not at 0x30000"

nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
import errno
try:
    h.pwrite(b\"\\x44\" * 65536, 1024 * 1024)
    raise AssertionError(\"the write over the L2 table succeeded\")
except nbd.Error as e:
    assert e.errnum == errno.EIO, e
try:
    h.pwrite(b\"\\x55\" * 512, 0)
    raise AssertionError(\"a write after the guard fired succeeded\")
except nbd.Error as e:
    assert e.errnum in (errno.EPERM, errno.EROFS), e
assert h.pread(65536, 0) == b\"\\x33\" * 65536
"' 2> "$tmp/err" || { cat "$tmp/err"; fail "guard"; }
grep -q "overlap guard: .* would overwrite the active L2 table at $(printf '%#x' "$l2")" "$tmp/err" ||
  fail "the guard's message: $(cat "$tmp/err")"
qemu-img info "$img" | grep -q 'corrupt: true' || fail "not marked corrupt"
qemu-io -f qcow2 -r -c 'read -P 0x33 0 64k' "$img" >/dev/null || fail "data behind the guard"

# Without the guard for active L2 tables, the same write destroys the
# table.
for opt in overlap-check=none overlap-check=constant overlap-check.active-l2=off; do
  l2=$(make_bad "$img")
  nbdkit -U - qcow2 "$img" $opt --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x44\" * 65536, 1024 * 1024)
h.flush()
"' 2>/dev/null || true
  r=0
  qemu-img check "$img" >/dev/null 2>&1 || r=$?
  [ "$r" -eq 2 ] || fail "$opt: qemu-img check exited $r, expected corruption (2)"
done

# overlap-check=all and a structure switch named wrongly.
l2=$(make_bad "$img")
nbdkit -U - qcow2 "$img" overlap-check=all --run 'nbdsh -u "$uri" -c "
try:
    h.pwrite(b\"\\x44\" * 65536, 1024 * 1024)
    raise AssertionError(\"overlap-check=all let it through\")
except nbd.Error:
    pass
"' 2>/dev/null || fail "overlap-check=all"
expect_refused 'unknown structure' qcow2 "$img" overlap-check.nosuch=on
expect_refused 'overlap-check: expected' qcow2 "$img" overlap-check=some
