#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The remedy the plugin gives for a LUKS image (test-bad-not-qcow2.sh):
# nbdkit's luks filter, run as the hint says, serves the disk.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdinfo
requires_nbdkit_filter luks

printf secret > "$tmp/password"
qemu_img_pbkdf create -q -f luks --object secret,id=s0,data=secret \
  -o key-secret=s0,iter-time=10 "$tmp/disk.luks" 4M ||
  fail "qemu-img cannot make a LUKS image"
nbdkit -U - file "$tmp/disk.luks" --filter=luks passphrase=+"$tmp/password" \
  --run 'nbdinfo --size "$uri"' | grep -qx 4194304 ||
  fail "the luks filter does not serve the LUKS image"
