#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter among others: stacked with nbdkit's cow filter above
# (writes kept in memory), our iostats above and our latency below it.
# (Under nbdkit's xz filter: test-filter-qcow2-xz.sh.)
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/filter-qcow2-image.sh"

nbdkit -U - --filter=cow --filter=iostats --filter=qcow2 --filter=latency \
  file "$img" latency-read=1ms iostats-file="$tmp/st" \
  --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x99\" * 512, 0)
assert h.pread(512, 0) == b\"\\x99\" * 512
assert h.pread(64 * 1024, 1 << 20) == b\"\\x22\" * 65536
"' || fail "stacked among other filters"
grep -q "read" "$tmp/st" || fail "iostats above the filter counted nothing"
qemu-img convert -f qcow2 -O raw "$img" "$tmp/after.raw"
cmp "$tmp/want.raw" "$tmp/after.raw" ||
  fail "the cow filter above let a write reach the image"
