#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter under nbdkit's xz filter: a .qcow2.xz read in place
# reads as qemu-img reads the image.
source "${srcdir:-.}/functions.sh"
set -e
requires xz
requires_nbdkit_filter xz
source "${srcdir:-.}/filter-qcow2-image.sh"

qemu-img convert -O qcow2 "$img" "$tmp/flat.qcow2"
xz -k --block-size=1M "$tmp/flat.qcow2"
read_as xz --filter=qcow2 --filter=xz file "$tmp/flat.qcow2.xz"
cmp "$tmp/want.raw" "$tmp/xz.raw" || fail "under the xz filter"
