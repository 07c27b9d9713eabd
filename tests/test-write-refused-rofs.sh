#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# An image on a read-only filesystem (a bind mount remounted read-only,
# which needs root): served read-only, and said so; a client's write
# fails with EPERM and the file stays unchanged.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh md5sum mount umount

qemu-img create -q -f qcow2 "$tmp/img.qcow2" 4M
ro=$tmp/ro
mkdir "$ro"
mount --bind "$tmp" "$ro" 2>/dev/null || {
  echo "$0: test skipped: cannot bind-mount here (root needed)"
  exit 77
}
trap 'umount "$ro" 2>/dev/null || true; rm -rf "$tmp"' EXIT
mount -o remount,ro,bind "$ro" 2>/dev/null || {
  echo "$0: test skipped: cannot remount read-only here"
  exit 77
}
img=$ro/img.qcow2
expect_read_only "$img" 'served read-only: it cannot be opened for writing: Read-only file system' \
  -U - qcow2 "$img"
