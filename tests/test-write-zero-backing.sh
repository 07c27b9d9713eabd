#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A zero request covering part of a cluster that has nothing of its own
# over a backing file showing zeros there (a hole) makes a zero cluster,
# as QEMU does, not a data cluster of zeros; over backing data it writes
# zeros as data, as QEMU does.  The same requests through us and through
# qemu-io on copies of one overlay: qemu-img map and the bytes agree,
# and qemu-img check passes.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh

base=$tmp/base.raw
qemu-img create -q -f raw "$base" 4M
QIO_FMT=raw qio "$base" 'write -P 0x11 1M 1M'
qemu-img create -q -f qcow2 -o compat=1.1 -b "$base" -F raw "$tmp/ref.qcow2"
qio "$tmp/ref.qcow2" 'write -P 0x22 2M 64k'
cp "$tmp/ref.qcow2" "$tmp/ours.qcow2"

# offset length: over the hole, over base data, across two clusters over
# the hole, part of a cluster holding data of its own, the last bytes.
zeros=(8192:4096 1056768:4096 3155968:102400 2101248:512 4190208:4096)
cmds=()
py=
for z in "${zeros[@]}"; do
  cmds+=("write -z ${z%%:*} ${z##*:}")
  py+="h.zero(${z##*:}, ${z%%:*}); "
done
qio "$tmp/ref.qcow2" "${cmds[@]}"
nbdkit -U - qcow2 "$tmp/ours.qcow2" --run "nbdsh -u \"\$uri\" -c '$py h.flush()'" ||
  fail "zeroing through nbdkit"

qemu-img check -q "$tmp/ours.qcow2" || fail "qemu-img check"
for i in ref ours; do
  qemu-img map --output=json -f qcow2 "$tmp/$i.qcow2" | map_normalize > "$tmp/$i.map"
done
diff -u "$tmp/ref.map" "$tmp/ours.map" || fail "qemu-img map differs from QEMU's"
qemu-img compare -q "$tmp/ref.qcow2" "$tmp/ours.qcow2" ||
  fail "the overlays read differently"
# And as a user sees it: the clusters zeroed in part over the hole are
# zero clusters, no space of ours (the first is not: qemu-img create
# allocates a raw file's first block).
qemu-img map --output=json -f qcow2 "$tmp/ours.qcow2" > "$tmp/ours.json"
/usr/bin/python3 - "$tmp/ours.json" <<'PY' || fail "not zero clusters over the hole"
import json, sys
m = json.load(open(sys.argv[1]))
for o in (3 << 20, (3 << 20) + 65536):
    e = [x for x in m if x["start"] <= o < x["start"] + x["length"]][0]
    assert e["zero"] and e["depth"] == 0 and "offset" not in e, e
PY
