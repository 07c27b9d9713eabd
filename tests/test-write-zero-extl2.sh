#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Zeroing with unaligned ends on extended L2 images, as QEMU does it:
# the whole subclusters a request covers get their zero bits, only the
# partial subclusters at its ends are written as data.  The same zero
# requests through qemu-io and through the plugin leave images that
# qemu-img map describes alike (extents merged) and that read alike;
# also fast zero (refused where an end needs data), and over a backing
# file.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh

reqs=("1000 200000" "300000 3000" "600000 70000" "2048 63488"
      "1048575 2" "1179648 131072" "2000000 100")

for backing in no yes; do
  for cs in 64k 32k; do
    for who in qemu ours; do
      img=$tmp/$who.qcow2
      rm -f "$img"
      if [ $backing = yes ]; then
        qemu-img create -q -f qcow2 "$tmp/base.qcow2" 4M
        qio "$tmp/base.qcow2" 'write -P 0x22 0 4M'
        qemu-img create -q -f qcow2 -o cluster_size=$cs,extended_l2=on \
          -b "$tmp/base.qcow2" -F qcow2 "$img"
        qio "$img" 'write -P 0x11 0 1M'
      else
        qemu-img create -q -f qcow2 -o cluster_size=$cs,extended_l2=on "$img" 4M
        qio "$img" 'write -P 0x11 0 4M'
      fi
    done
    for r in "${reqs[@]}"; do
      set -- $r
      qio "$tmp/qemu.qcow2" "write -z $1 $2"
    done
    py="h = h"
    for r in "${reqs[@]}"; do
      set -- $r
      py+="; h.zero($2, $1)"
    done
    nbdkit -U - qcow2 "$tmp/ours.qcow2" --run "nbdsh -u \"\$uri\" -c '$py'" ||
      fail "zeroes through the plugin"
    for who in qemu ours; do
      qemu-img map --output=json -f qcow2 "$tmp/$who.qcow2" | map_normalize \
        > "$tmp/$who.map"
    done
    diff -u "$tmp/qemu.map" "$tmp/ours.map" ||
      fail "cluster size $cs, backing $backing: the map is not QEMU's"
    qemu-img compare -q "$tmp/qemu.qcow2" "$tmp/ours.qcow2" ||
      fail "cluster size $cs, backing $backing: data differ"
    qemu-img check -q "$tmp/ours.qcow2" || fail "qemu-img check"
  done
done

# A fast zero with unaligned ends over data needs data written: refused,
# nothing changed; aligned to subclusters, done with zero bits.
img=$tmp/fast.qcow2
qemu-img create -q -f qcow2 -o cluster_size=64k,extended_l2=on "$img" 4M
qio "$img" 'write -P 0x33 0 4M'
nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
try:
    h.zero(10000, 1000, nbd.CMD_FLAG_FAST_ZERO)
    raise SystemExit(\"an unaligned fast zero was done\")
except nbd.Error as e:
    assert e.errno == \"ENOTSUP\" or e.errno == 95, e
assert h.pread(10000, 1000) == b\"\\x33\" * 10000
h.zero(4096, 2048, nbd.CMD_FLAG_FAST_ZERO)
assert h.pread(4096, 2048) == bytes(4096)
"' || fail "fast zero"
echo "$0: ok"
