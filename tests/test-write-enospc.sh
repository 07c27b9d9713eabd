#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A full host filesystem: writes that need space fail with ENOSPC, the
# server keeps serving (reads, in-place writes, flush), what was written
# before stays, and the image is left consistent: qemu-img check finds
# no error and no leak.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh mount umount

mnt=$tmp/small
mkdir "$mnt"
mount -t tmpfs -o size=6m tmpfs "$mnt" 2>/dev/null || {
  echo "$0: test skipped: cannot mount a small tmpfs here"
  exit 77
}
trap 'umount "$mnt" 2>/dev/null || true; rm -rf "$tmp"' EXIT

img=$mnt/full.qcow2
qemu-img create -q -f qcow2 -o cluster_size=64k "$img" 64M

nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
import errno
MiB = 1024 * 1024
written = 0
failed = None
for i in range(64):
    try:
        h.pwrite(bytes([i + 1]) * MiB, i * MiB)
        written += 1
    except nbd.Error as e:
        failed = e
        break
assert failed is not None, \"64 MiB fit in a 6 MiB filesystem?\"
assert failed.errnum == errno.ENOSPC, \"expected ENOSPC, got %s\" % failed
assert written >= 2, \"only %d MiB written\" % written
# The server keeps serving: reads, in-place writes and flushes work.
for i in range(written):
    assert h.pread(MiB, i * MiB) == bytes([i + 1]) * MiB, \"MiB %d lost\" % i
h.pwrite(b\"\\xee\" * 4096, 0)
h.flush()
open(\"'"$tmp"'/written\", \"w\").write(str(written))
"' || fail "ENOSPC behaviour"

written=$(cat "$tmp/written")
echo "wrote $written MiB before ENOSPC"
qemu-img check "$img" || fail "qemu-img check after ENOSPC"
qemu-io -f qcow2 -c 'read -P 0xee 0 4096' -c 'read -P 1 4096 1044480' "$img" >/dev/null ||
  fail "data before ENOSPC"
for i in $(seq 2 "$written"); do
  qemu-io -f qcow2 -c "read -P $i $(( (i - 1) * 1048576 )) 1048576" "$img" >/dev/null ||
    fail "MiB $((i - 1)) after ENOSPC"
done
