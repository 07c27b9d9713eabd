#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Images that must not be written refuse writes (EPERM to the client,
# whose export is read-only) and say why, and the file stays unchanged:
# nbdkit -r, readonly=true, a snapshot export, a file on a read-only
# filesystem.  (A corrupt image refuses writable connections: see
# test-bad-flags.sh.)
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh md5sum

img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 4M
qemu-img snapshot -c s1 "$img"

refused ()      # MESSAGE-REGEX NBDKIT-ARGS...: writes fail with EPERM
{
  local re="$1"; shift
  local sum
  sum=$(md5sum < "$img")
  nbdkit "$@" --run 'nbdsh -u "$uri" -c "
import errno
assert h.is_read_only()
try:
    h.pwrite(b\"x\" * 512, 0)
    raise AssertionError(\"write succeeded\")
except nbd.Error as e:
    assert e.errnum == errno.EPERM, e
"' 2> "$tmp/err" || { cat "$tmp/err"; fail "nbdkit $*"; }
  [ -z "$re" ] || grep -Eq "$re" "$tmp/err" || fail "nbdkit $*: no message /$re/: $(cat "$tmp/err")"
  [ "$(md5sum < "$img")" = "$sum" ] || fail "nbdkit $*: the file changed"
}

refused '' -r -U - qcow2 "$img"
refused '' -U - qcow2 "$img" readonly=true
refused '' -U - qcow2 "$img" snapshot=s1
# Asked for, a snapshot's being read-only is no notice.
! grep -q "notice" "$tmp/err" || fail "snapshot=s1: $(cat "$tmp/err")"

# A read-only filesystem: opened read-only, and said so.
ro=$tmp/ro
mkdir "$ro"
if mount --bind "$tmp" "$ro" 2>/dev/null && mount -o remount,ro,bind "$ro" 2>/dev/null; then
  trap 'umount "$ro" 2>/dev/null || true; rm -rf "$tmp"' EXIT
  img=$ro/img.qcow2
  refused 'served read-only: it cannot be opened for writing: Read-only file system' -U - qcow2 "$img"
else
  echo "$0: read-only filesystem case skipped: cannot remount read-only here"
fi
