#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What clients are told, as qemu-nbd tells them: block sizes (minimum 1,
# preferred 4 KiB, maximum 32 MiB) on every cluster size, and
# NBD_CMD_CACHE, which reads the range ahead: it succeeds over data,
# compressed clusters, holes and a backing file, fails past the end,
# and changes nothing that is read afterwards.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo nbdsh

for cs in 512 64k 2M; do
  img=$tmp/bs-$cs.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=$cs "$img" 16M
  nbdkit -r -U - qcow2 "$img" --run 'nbdinfo "$uri"' > "$tmp/info"
  for want in "block_size_minimum: 1" "block_size_preferred: 4096" \
              "block_size_maximum: 33554432" "can_cache: true"; do
    grep -q "$want" "$tmp/info" ||
      fail "cluster size $cs: no \"$want\" in: $(cat "$tmp/info")"
  done
done

base=$tmp/base.qcow2 img=$tmp/top.qcow2
qemu-img create -q -f qcow2 "$base" 8M
qio "$base" 'write -P 0x61 0 8M'
qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$img"
qio "$img" 'write -P 0x62 1M 1M' 'write -z 3M 64k'
qemu-img convert -c -f qcow2 -O qcow2 "$img" "$tmp/compressed.qcow2"
cat > "$tmp/cache.py" <<'EOS'
h.cache(h.get_size(), 0)
h.cache(4097, 12345)
try:
    h.cache(4096, h.get_size() - 1024)
    raise SystemExit("a cache past the end succeeded")
except nbd.Error:
    pass
EOS
for i in "$img" "$tmp/compressed.qcow2"; do
  qemu-img convert -f qcow2 -O raw "$i" "$tmp/want.raw"
  rm -f "$tmp/got.raw"
  nbdkit -U - qcow2 "$i" --run "nbdsh -u \"\$uri\" -c 'exec(open(\"$tmp/cache.py\").read())' &&
    nbdcopy \"\$uri\" $tmp/got.raw" || fail "$i: cache"
  cmp "$tmp/got.raw" "$tmp/want.raw" || fail "$i: data changed by cache"
done
echo "$0: ok"
