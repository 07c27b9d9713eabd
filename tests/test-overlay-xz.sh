#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter's overlay over nbdkit's xz filter over a file, QEMU
# the oracle: writes, a restart, qcow2-overlay-on-read=true, then FILE
# alone after the archive is removed.  FILE passes qemu-img check; the
# archive is unchanged.
source "${srcdir:-.}/functions.sh"
set -e
requires xz
requires_nbdkit_filter xz
source "${srcdir:-.}/overlay-functions.sh"
size=$((8 << 20))

make_base "$tmp/xz.raw" "$size"
cp "$tmp/xz.raw" "$tmp/xz.model"
xz -q --block-size=1MiB "$tmp/xz.raw"
sha256sum "$tmp/xz.raw.xz" > "$tmp/xz.sum"
ov=$tmp/xz.qcow2
for seed in 4 5; do
  nbdkit -U - --filter=qcow2 --filter=xz file "$tmp/xz.raw.xz" \
    qcow2-overlay="$ov" --run '
    /usr/bin/python3 '"$overlay_ops"' "$uri" '"$tmp/xz.model"' '"$seed"' 30' ||
    fail "xz: writes (round $seed)"
done
nbdkit -U - --filter=qcow2 --filter=xz file "$tmp/xz.raw.xz" \
  qcow2-overlay="$ov" qcow2-overlay-on-read=true --run '
  nbdcopy "$uri" '"$tmp/xz.out"'' || fail "xz: on-read"
cmp "$tmp/xz.out" "$tmp/xz.model" || fail "xz: reads differ"
check_overlay "$ov" || fail "xz: qemu-img check"
sha256sum -c --quiet "$tmp/xz.sum" || fail "xz: the archive changed"
rm "$tmp/xz.raw.xz"
serves_alone "$ov" "$tmp/xz.model" xz
