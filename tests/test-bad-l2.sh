#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Bad L1 and L2 entries met while serving: L2 tables and data clusters
# misaligned, invalid extended L2 subcluster bitmaps.  Only the
# requests that touch them fail, with EIO and a message in nbdkit's
# log; the server keeps serving the rest.  L2 tables and data clusters
# beyond the end of the file read as zeros, as in QEMU, with no message
# and no write to the file.
source "${srcdir:-.}/bad-functions.sh"

# expect_served_zeros IMG SCRIPT LO HI: as expect_served_errors, with
# each expect_eio in SCRIPT turned into a read that succeeds and gives
# zeros in [LO, HI); nothing is said and the file is left as it was.
ZERO_PRELUDE='
def expect_zero(offset, count, blockstatus=False):
    if blockstatus:
        h.block_status(count, offset, lambda *args: 0)
        return
    buf = h.pread(count, offset)
    lo, hi = max(offset, ZLO), min(offset + count, ZHI)
    assert lo < hi and buf[lo - offset:hi - offset] == bytes(hi - lo), \
        "read at %d+%d: not zeros" % (offset, count)
'
expect_served_zeros ()
{
  cp "$1" "$tmp/before.qcow2"
  expect_served_errors "$1" "$ZERO_PRELUDE
ZLO, ZHI = $3, $4
${2//expect_eio(/expect_zero(}"
  ! grep -q "error:" "$tmp/served.log" || fail "$1: an error was said"
  cmp "$1" "$tmp/before.qcow2" || fail "$1: reads changed the file"
}

# 4 KiB clusters, so that each L2 table maps 2 MiB: L1 entry 0 maps
# 0-2M, entry 2 maps 4M-6M (entry 1 and 3 are unallocated).
img=$tmp/l1.qcow2
qemu-img create -q -f qcow2 -o cluster_size=4096 "$img" 8M
qemu-io -f qcow2 -c 'write -P 0x11 0 64k' -c 'write -P 0x22 4M 64k' \
  "$img" >/dev/null
read l1 l1off <<< "$(qpatch "$img" l1-entry 2)"
[ "$(qpatch "$img" l1-entry 1)" = "0 $((l1off - 8))" ] ||
  fail "unexpected L1 table layout"
size=$(stat -c %s "$img")

l1_script='
# The good areas, before and after the bad one is met.
expect_pattern(0, 65536, 0x11)
expect_pattern(2 << 20, 65536, 0)
expect_eio(4 << 20, 65536)
expect_eio((4 << 20) + 12345, 1)
expect_eio((6 << 20) - 512, 512)
expect_eio(0, 8 << 20)                  # spans good and bad
expect_eio(4 << 20, 4096, blockstatus=True)
expect_pattern(0, 65536, 0x11)
expect_pattern(6 << 20, 4096, 0)
expect_eio(4 << 20, 65536)              # and again: nothing was cached
h.block_status(2 << 20, 0, lambda *args: 0)
expect_pattern(0, 512, 0x11)
'

# L1 entry 2 points beyond the end of the file: its span reads as
# zeros.
for off in 0x10000000 $(( (size + 4095) & ~4095 )) 0xfffffffffff000; do
  cp "$img" "$tmp/bad.qcow2"
  qpatch "$tmp/bad.qcow2" be64 $l1off $(( (1 << 63) | off ))
  expect_served_zeros "$tmp/bad.qcow2" "$l1_script" $((4 << 20)) $((6 << 20))
done

# L1 entry 2 not cluster aligned.
cp "$img" "$tmp/bad.qcow2"
qpatch "$tmp/bad.qcow2" be64 $l1off $((l1 | 0x200))
expect_served_errors "$tmp/bad.qcow2" "$l1_script" \
  "error: $tmp/bad.qcow2: corrupt image: unaligned L2 table offset $(printf %#x $(( (l1 & 0xfffffffffffe00) | 0x200 ))) \(mapping guest offset 0x40"

# L2 entries, with 64 KiB clusters: 0x11 at 0, 0x22 at 1M, 0x33 at 2M.
img=$tmp/l2.qcow2
qemu-img create -q -f qcow2 "$img" 4M
qemu-io -f qcow2 -c 'write -P 0x11 0 64k' -c 'write -P 0x22 1M 64k' \
  -c 'write -P 0x33 2M 64k' "$img" >/dev/null
read e1 o1 <<< "$(qpatch "$img" l2-entry 1M)"
read e2 o2 <<< "$(qpatch "$img" l2-entry 2M)"
size=$(stat -c %s "$img")

l2_script='
expect_pattern(0, 65536, 0x11)
expect_eio(1 << 20, 65536)
expect_eio((1 << 20) + 4096, 512)
expect_eio(0, 4 << 20)
expect_pattern(0, 65536, 0x11)
expect_pattern((1 << 20) + 65536, 65536, 0)      # the next cluster
expect_pattern(2 << 20, 65536, 0x33)
expect_eio((1 << 20) + 65535, 1)
expect_pattern(3 << 20, 4096, 0)
'

# Data cluster beyond the end of the file (keeping the "copied" flag):
# zeros.
for off in 0x10000000 $(( (size + 0xffff) & ~0xffff )) 0xffffffffff0000; do
  cp "$img" "$tmp/bad.qcow2"
  qpatch "$tmp/bad.qcow2" be64 $o1 $(( (1 << 63) | off ))
  expect_served_zeros "$tmp/bad.qcow2" "$l2_script" $((1 << 20)) \
    $(((1 << 20) + 65536))
done

# Data cluster offset not cluster aligned.
cp "$img" "$tmp/bad.qcow2"
qpatch "$tmp/bad.qcow2" be64 $o1 $((e1 | 0x200))
expect_served_errors "$tmp/bad.qcow2" "$l2_script" \
  "error: $tmp/bad.qcow2: corrupt image: unaligned data cluster offset $(printf %#x $(( (e1 & 0xfffffffffffe00) | 0x200 ))) \(mapping guest offset 0x100000\)" \
  "unaligned data cluster offset .* \(mapping guest offset 0x101000\)"

# Extended L2 entries (32 subclusters of 2 KiB): 0x22 at 1M (a whole
# cluster), 0x33 at 2M (2 subclusters).
img=$tmp/extl2.qcow2
qemu-img create -q -f qcow2 -o extended_l2=on "$img" 4M
qemu-io -f qcow2 -c 'write -P 0x11 0 64k' -c 'write -P 0x22 1M 64k' \
  -c 'write -P 0x33 2M 4k' "$img" >/dev/null
o1=$(qpatch "$img" l2-entry-offset 1M)
o2=$(qpatch "$img" l2-entry-offset 2M)
o3=$(qpatch "$img" l2-entry-offset 3M)
[ "$(qpatch "$img" be64 $((o1 + 8)))" -eq $((0xffffffff)) ] &&
[ "$(qpatch "$img" be64 $((o2 + 8)))" -eq 3 ] &&
[ "$(qpatch "$img" be64 $((o3 + 8)))" -eq 0 ] ||
  fail "unexpected subcluster bitmaps"

extl2_script='
expect_pattern(0, 65536, 0x11)
expect_eio(BAD, 65536)
expect_eio(BAD, 512)
expect_eio(BAD + 63 * 1024, 1024)
expect_eio(BAD, 4096, blockstatus=True)
expect_eio(0, 4 << 20)
expect_pattern(0, 65536, 0x11)
expect_pattern(BAD + 65536, 4096, 0)    # the next cluster
'
# Allocated and zero bits both set: all of them, one subcluster, the
# last subcluster.
for bm in 0xffffffffffffffff 0x1ffffffff 0x80000000ffffffff; do
  cp "$img" "$tmp/bad.qcow2"
  qpatch "$tmp/bad.qcow2" be64 $((o1 + 8)) $bm
  expect_served_errors "$tmp/bad.qcow2" "${extl2_script//BAD/(1 << 20)}" \
    "error: $tmp/bad.qcow2: corrupt image: invalid subcluster bitmap $(printf %#x $bm) \(mapping guest offset 0x100000\)"
done
# A partly allocated cluster with a subcluster both allocated and zero.
cp "$img" "$tmp/bad.qcow2"
qpatch "$tmp/bad.qcow2" be64 $((o2 + 8)) 0x200000003
expect_served_errors "$tmp/bad.qcow2" "${extl2_script//BAD/(2 << 20)}" \
  "error: $tmp/bad.qcow2: corrupt image: invalid subcluster bitmap 0x200000003 \(mapping guest offset 0x200000\)"
# An unallocated cluster (no host offset) with allocated subclusters.
cp "$img" "$tmp/bad.qcow2"
qpatch "$tmp/bad.qcow2" be64 $((o3 + 8)) 0x1
expect_served_errors "$tmp/bad.qcow2" "${extl2_script//BAD/(3 << 20)}" \
  "error: $tmp/bad.qcow2: corrupt image: invalid subcluster bitmap 0x1 \(mapping guest offset 0x300000\)"
