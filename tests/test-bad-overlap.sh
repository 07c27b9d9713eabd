#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Hostile images whose metadata structures overlap each other:
#  - the header, L1 table, refcount table and snapshot table sharing a
#    cluster: a clear error at open;
#  - an L2 table or refcount block placed on another structure: found
#    as the overlap guard's map is made, at the first write (not at
#    open: an image only read never makes it), which is refused saying
#    why (a write to either would destroy the other), as every write
#    after it; reads never crash.
source "${srcdir:-.}/bad-functions.sh"
set -e
requires qemu-img qemu-io nbdsh

base=$tmp/base.qcow2
qemu-img create -q -f qcow2 -o cluster_size=64k "$base" 4M
qemu-io -f qcow2 -c 'write -P 0x33 0 64k' "$base" >/dev/null
qemu-img snapshot -c s1 "$base"
qpatch () { /usr/bin/python3 "$srcdir/qcow2-patch.py" "$@"; }
reftable=$(qpatch "$base" be64 48)
l1=$(qpatch "$base" be64 40)
snaps=$(qpatch "$base" be64 64)
img=$tmp/bad.qcow2

open_error ()   # FIELD-OFFSET VALUE REGEX
{
  cp "$base" "$img"
  qpatch "$img" be64 "$1" "$2"
  expect_open_error "$img" "$3"
}
open_error 40 "$reftable" "the L1 table \(at $(printf %#x "$reftable")\) and the refcount table .* overlap"
open_error 40 0 "the header .* and the L1 table .* overlap"
open_error 48 0 "the header .* and the refcount table .* overlap"
open_error 48 "$l1" "the L1 table .* and the refcount table .* overlap"
open_error 64 "$l1" "the L1 table .* and the snapshot table .* overlap"
open_error 64 "$reftable" "the refcount table .* and the snapshot table .* overlap"

refused_at_write ()   # REGEX: the patched $img is refused at its first write
{
  cp "$img" "$tmp/before"
  # Reads never crash; the first write is refused, saying why, and
  # nothing is written; a client after it is served read-only.
  nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
try:
    h.pread(65536, 0)
except nbd.Error:
    pass
try:
    h.pwrite(b\"x\" * 512, 0)
    raise AssertionError(\"a write was accepted\")
except nbd.Error:
    pass
" && nbdsh -u "$uri" -c "assert h.is_read_only()"' 2> "$tmp/err" ||
    { cat "$tmp/err"; fail "serving $img"; }
  grep -Eq "metadata structures overlap at .*: $1: refusing write access" \
    "$tmp/err" || fail "no overlap message /$1/: $(cat "$tmp/err")"
  cmp -s "$img" "$tmp/before" || fail "$img was written"
}

# The active L2 table moved onto the refcount block (L1 entry 0).
block=$(qpatch "$base" be64 "$reftable")
cp "$base" "$img"
qpatch "$img" be64 "$l1" $(( 0x8000000000000000 | block ))
refused_at_write "active L2 table and refcount block"

# A refcount block placed on the L1 table: the fixed structure wins.
cp "$base" "$img"
qpatch "$img" be64 "$reftable" "$l1"
refused_at_write "refcount block and active L1 table"

# The snapshot's L1 table on the active L2 table.
l2=$(( $(qpatch "$base" be64 "$l1") & 0x00fffffffffffe00 ))
cp "$base" "$img"
qpatch "$img" be64 "$snaps" "$l2"
refused_at_write "(inactive L1 table and active L2 table|active L2 table and inactive L1 table)"
