#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Smoke test: a small image written by qemu-io reads back byte for byte.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

img=$tmp/basic.qcow2
qemu-img create -q -f qcow2 "$img" 4M
qemu-io -f qcow2 -c 'write -P 0x55 0 64k' -c 'write -P 0xaa 1M 4k' "$img" >/dev/null
check_image "$img"
