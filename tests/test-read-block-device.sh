#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A backing file on a block device (a loop device here): it has no
# SEEK_DATA, so block status must report it all as data, not fail.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdinfo nbdsh losetup

truncate -s 8M "$tmp/raw.img"
printf 'abc' | dd of="$tmp/raw.img" conv=notrunc bs=1 seek=4096 status=none
if [ "$(id -u)" -ne 0 ] || ! dev=$(losetup -f --show "$tmp/raw.img" 2>/dev/null)
then
  echo "$0: test skipped: cannot attach a loop device (root needed)"
  exit 77
fi
trap 'losetup -d "$dev"; rm -rf "$tmp"' EXIT

qemu-img create -q -f qcow2 -b "$dev" -F raw "$tmp/top.qcow2"
nbdkit -U - qcow2 "$tmp/top.qcow2" \
  --run 'nbdinfo --map "$uri"' > "$tmp/map" || fail "map over $dev"
cat "$tmp/map"
grep -qE '^ +0 +8388608 +0 +data$' "$tmp/map" ||
  fail "the block device is not reported as data"
nbdkit -U - qcow2 "$tmp/top.qcow2" --run 'nbdsh -u "$uri" -c "
assert h.pread(3, 4096) == b\"abc\"
"' || fail "reading over $dev"
