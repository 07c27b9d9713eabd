#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Images that must not be written refuse writes (EPERM to the client,
# whose export is read-only), and the file stays unchanged: nbdkit -r,
# readonly=true, a snapshot export.  (A file on a read-only
# filesystem: test-write-refused-rofs.sh; a corrupt image refuses
# writable connections: test-bad-flags.sh.)
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh md5sum

img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 4M
qemu-img snapshot -c s1 "$img"

expect_read_only "$img" '' -r -U - qcow2 "$img"
expect_read_only "$img" '' -U - qcow2 "$img" readonly=true
expect_read_only "$img" '' -U - qcow2 "$img" snapshot=s1
# Asked for, a snapshot's being read-only is no notice.
! grep -q "notice" "$tmp/read-only.err" ||
  fail "snapshot=s1: $(cat "$tmp/read-only.err")"
