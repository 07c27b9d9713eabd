#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Zero and trim as a user sees them:
#  - fast zero (NBD_CMD_FLAG_FAST_ZERO) succeeds on v3 (zero clusters,
#    metadata only) and fails at once with ENOTSUP, changing nothing,
#    where zeroing would need data written (v2 over a backing file, or a
#    partial cluster that does not read as zeros);
#  - trim frees clusters: the file's allocated space shrinks, freed
#    clusters are reused by later writes instead of growing the file;
#    on v2 over a backing file it keeps the data (no zero flag);
#    discard=ignore offers no trim;
#  - afterwards qemu-img check is clean and qemu reads what we expect.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh

base=$tmp/base.qcow2
qemu-img create -q -f qcow2 "$base" 8M
qemu-io -f qcow2 -c 'write -P 7 0 8M' "$base" >/dev/null

# v3 over a backing file: whole clusters zero fast, partial ones do not.
img=$tmp/v3.qcow2
qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$img" 8M
nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
import errno
assert h.can_fast_zero()
h.zero(1024 * 1024, 0, nbd.CMD_FLAG_FAST_ZERO)
try:
    h.zero(1000, 2 * 1024 * 1024 + 100, nbd.CMD_FLAG_FAST_ZERO)
    raise AssertionError(\"partial fast zero over backing data succeeded\")
except nbd.Error as e:
    assert e.errnum == errno.ENOTSUP, e
assert h.pread(1000, 2 * 1024 * 1024 + 100) == b\"\\x07\" * 1000
h.zero(1000, 2 * 1024 * 1024 + 100)
h.flush()
"' || fail "v3 fast zero"
qemu-img check -q "$img" || fail "qemu-img check $img"
qemu-io -f qcow2 -c 'read -P 0 0 1M' -c 'read -P 7 1M 1M' -c 'read -P 0 2097252 1000' \
  -c 'read -P 7 2098252 1000' "$img" >/dev/null || fail "v3 zero contents"

# v2 over a backing file: even whole clusters need data: ENOTSUP.
img=$tmp/v2.qcow2
qemu-img create -q -f qcow2 -o compat=0.10 -b "$base" -F qcow2 "$img" 8M
nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
import errno
try:
    h.zero(65536, 0, nbd.CMD_FLAG_FAST_ZERO)
    raise AssertionError(\"v2 fast zero over a backing file succeeded\")
except nbd.Error as e:
    assert e.errnum == errno.ENOTSUP, e
assert h.pread(65536, 0) == b\"\\x07\" * 65536
h.zero(65536, 0)
h.flush()
"' || fail "v2 fast zero"
qemu-img check -q "$img" || fail "qemu-img check $img"
qemu-io -f qcow2 -c 'read -P 0 0 64k' -c 'read -P 7 64k 1M' "$img" >/dev/null ||
  fail "v2 zero contents"

# v2 over a backing file has no zero flag: a trim that freed a cluster
# would show the backing file's stale data again, so (as QEMU since
# 5.0) it keeps the data, and nothing leaks.
qemu-io -f qcow2 -c 'write -P 0x11 1M 1M' "$img" >/dev/null
nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
h.trim(512 * 1024, 1024 * 1024)
h.flush()
assert h.pread(512 * 1024, 1024 * 1024) == b\"\\x11\" * (512 * 1024)
"' || fail "v2 trim over a backing file"
qemu-img check -q "$img" || fail "qemu-img check $img after a v2 trim"
qemu-io -f qcow2 -c 'read -P 0x11 1M 1M' "$img" >/dev/null ||
  fail "v2 trim over a backing file changed the data"

# Trim frees space, which later writes reuse.
img=$tmp/trim.qcow2
qemu-img create -q -f qcow2 "$img" 64M
nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x01\" * (16 * 1024 * 1024), 0)
h.flush()
"'
before=$(stat -c %b "$img")
size_before=$(stat -c %s "$img")
nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
assert h.can_trim()
h.trim(12 * 1024 * 1024, 2 * 1024 * 1024)
h.flush()
"'
after=$(stat -c %b "$img")
echo "trim: $before -> $after blocks allocated"
[ "$after" -lt $((before - 20000)) ] || fail "trim did not free space ($before -> $after blocks)"
qemu-img check -q "$img" || fail "qemu-img check after trim"
qemu-io -f qcow2 -c 'read -P 1 0 2M' -c 'read -P 0 2M 12M' -c 'read -P 1 14M 2M' "$img" >/dev/null ||
  fail "contents after trim"
nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x02\" * (8 * 1024 * 1024), 32 * 1024 * 1024)
h.flush()
"'
size_after=$(stat -c %s "$img")
echo "file size: $size_before before the trim, $size_after after rewriting 8 MiB"
[ "$size_after" -le "$size_before" ] || fail "freed clusters were not reused (file grew to $size_after)"
qemu-img check -q "$img" || fail "qemu-img check after reuse"
qemu-io -f qcow2 -c 'read -P 2 32M 8M' -c 'read -P 1 0 2M' "$img" >/dev/null ||
  fail "contents after reuse"

# discard=ignore: no trim offered.
nbdkit -U - qcow2 "$img" discard=ignore --run 'nbdsh -u "$uri" -c "assert not h.can_trim()"' ||
  fail "discard=ignore still offers trim"
