#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# create=true makes a new image that qemu-img check finds clean and
# qemu-img info describes as asked, with or without a backing file and
# preallocation; refused with a clear error where it cannot be done.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh

write_some ()   # IMG ARGS...: create, then write three patterns
{
  local img="$1"; shift
  rm -f "$img"
  nbdkit -U - qcow2 "$img" create=true "$@" --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x11\" * 70000, 1000000)
h.pwrite(b\"\\x22\" * 512, 0)
h.zero(65536, 8 * 1024 * 1024)
h.flush()
"'
  qemu-img check -q "$img" || fail "qemu-img check $img ($*)"
  qemu-io -f qcow2 -c 'read -P 0x11 1000000 70000' -c 'read -P 0x22 0 512' \
    -c 'read -P 0 8388608 65536' "$img" >/dev/null || fail "data of $img ($*)"
}

info_has ()     # IMG REGEX: qemu-img info of IMG matches
{
  qemu-img info "$1" | grep -Eq "$2" || fail "$1: qemu-img info lacks /$2/: $(qemu-img info "$1")"
}

img=$tmp/new.qcow2
write_some "$img" size=64M
info_has "$img" 'virtual size: 64 MiB'
info_has "$img" 'cluster_size: 65536'
info_has "$img" 'compat: 1.1'

for cs in 512:512 4K:4096 2M:2097152; do
  write_some "$img" size=100M cluster-size=${cs%:*}
  info_has "$img" "cluster_size: ${cs#*:}\$"
done
write_some "$img" size=64M compat=0.10
info_has "$img" 'compat: 0.10'
write_some "$img" size=64M extended-l2=on cluster-size=128K
info_has "$img" 'extended l2: true'
write_some "$img" size=64M lazy-refcounts=true
info_has "$img" 'lazy refcounts: true'
write_some "$img" size=3T cluster-size=2M
info_has "$img" 'virtual size: 3 TiB'

# Preallocation: every cluster allocated; full also takes the space.
write_some "$img" size=16M preallocation=metadata
# (but the zeroed cluster, freed since NBD zeroes may punch holes)
qemu-img map --output=json "$img" | /usr/bin/python3 -c '
import json, sys
bad = [e for e in json.load(sys.stdin)
       if not e["data"] and (e["start"], e["length"]) != (8 << 20, 65536)]
sys.exit(1 if bad else 0)' || fail "preallocation=metadata left unallocated clusters"
write_some "$img" size=16M preallocation=full cluster-size=4K
[ "$(stat -c %b "$img")" -ge $((15 * 2048)) ] || fail "preallocation=full did not take the space"

# A backing file: its size and format taken, its data shown through.
qemu-img create -q -f qcow2 "$tmp/base.qcow2" 32M
qemu-io -f qcow2 -c 'write -P 5 0 32M' "$tmp/base.qcow2" >/dev/null
write_some "$img" backing=base.qcow2
info_has "$img" 'virtual size: 32 MiB'
info_has "$img" 'backing file: base.qcow2'
info_has "$img" 'backing file format: qcow2'
qemu-io -f qcow2 -c 'read -P 5 2M 1M' "$img" >/dev/null || fail "backing data not shown"
qemu-img create -q -f raw "$tmp/base.raw" 20M
write_some "$img" backing=base.raw size=40M
info_has "$img" 'backing file format: raw'
info_has "$img" 'virtual size: 40 MiB'

# Refused.
expect_refused 'already exists' qcow2 "$img" create=true size=1M
rm -f "$img"
expect_refused 'needs size=' qcow2 "$img" create=true
expect_refused 'cluster-size' qcow2 "$img" create=true size=1M cluster-size=3000
rm -f "$img"
expect_refused 'extended L2' qcow2 "$img" create=true size=1M extended-l2=on cluster-size=4K
rm -f "$img"
expect_refused 'for create=true' qcow2 "$img" size=1M
