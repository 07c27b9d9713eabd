#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter's overlay with qcow2-overlay-on-read=true: two
# connections write (8 requests in flight each) while a third reads and
# sends cache requests, so that copy-on-read fills race writes of the
# same clusters (overlay-race.py).  Reads see only the disk's bytes or
# a writer's; afterwards FILE (4 KiB clusters, a create option) passes
# qemu-img check, holds exactly what was written over the disk after a
# restart, and, filled whole by a last on-read pass, alone too.
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/overlay-functions.sh"
race="$(cd "${srcdir:-.}" && pwd)/overlay-race.py"

base=$tmp/base.raw ov=$tmp/ov.qcow2
make_base "$base" $((8 << 20))
sha256sum "$base" > "$tmp/base.sum"

# 1 ms on every read of the plugin, so that the other clients' requests
# come while a fill waits for the plugin.
nbdkit -U - --filter=qcow2 --filter=latency file "$base" latency-read=1ms \
  qcow2-overlay="$ov" cluster-size=4k qcow2-overlay-on-read=true --run '
  /usr/bin/python3 '"$race"' "$uri" '"$base"' 1 600 '"$tmp/expected"' 4096' ||
  fail "two writers and a reader with copy-on-read"
check_overlay "$ov" || fail "qemu-img check"
qemu-img info "$ov" | grep -q "cluster_size: 4096" || fail "cluster-size=4k"
nbdkit -U - --filter=qcow2 file "$base" qcow2-overlay="$ov" \
  qcow2-overlay-on-read=true --run 'nbdcopy "$uri" '"$tmp/out.raw" ||
  fail "restart"
cmp "$tmp/out.raw" "$tmp/expected" || fail "what was written, over the disk"
check_overlay "$ov" || fail "qemu-img check after the on-read pass"
sha256sum -c --quiet "$tmp/base.sum" || fail "the plugin's file was written"
serves_alone "$ov" "$tmp/expected" concurrent
