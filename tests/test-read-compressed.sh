#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Compressed clusters, deflate (zlib) and zstd, with 512-byte, 4k, 64k
# and 2M clusters: whole images compressed by qemu-img convert -c from
# data that compresses well, poorly (stored uncompressed) or not at all,
# then mixed with normal clusters, zero clusters, partial rewrites and
# qemu-io "write -c"; compressed clusters in a backing file; version 2.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

# compressed_clusters IMG: how many compressed clusters qemu counts.
compressed_clusters ()
{
  qemu-img check --output=json "$1" | sed -n 's/.*"compressed-clusters": \([0-9]*\).*/\1/p'
}

# 32 MiB of mixed data: repeated patterns, random lowercase text,
# random bytes, zeros, in pieces of odd sizes.  Images with small
# clusters use the first 6 MiB.
src32=$tmp/src32.raw
/usr/bin/python3 - "$src32" <<'PY'
import random, sys
r = random.Random(42)
text = bytes(b"abcdefgh "[i % 9] for i in range(256))
out = bytearray()
size = 32 * 1024 * 1024
kinds = ["pattern", "text", "random", "zero"]
while len(out) < size:
    n = r.choice([300, 5000, 70000, 200000, 1000000])
    k = kinds[len(out) // 7919 % 4]
    if k == "pattern":
        out += bytes([r.randrange(256)]) * n
    elif k == "text":
        out += r.randbytes(n).translate(text)
    elif k == "random":
        out += r.randbytes(n)
    else:
        out += bytes(n)
open(sys.argv[1], "wb").write(out[:size])
PY
head -c 6M "$src32" > "$tmp/src6.raw"

for ct in zlib zstd; do
  for cs in 512 4096 65536 2097152; do
    img=$tmp/c-$ct-$cs.qcow2
    if [ $cs = 2097152 ]; then src=$src32; else src=$tmp/src6.raw; fi
    size=$(stat -c %s "$src")
    qemu-img convert -c -f raw -O qcow2 \
      -o compression_type=$ct,cluster_size=$cs "$src" "$img"
    qemu-img info "$img" | grep -q "compression type: $ct" ||
      fail "$img: compression type is not $ct"
    n=$(compressed_clusters "$img")
    [ "${n:-0}" -gt 0 ] || fail "$img: qemu made no compressed cluster"
    check_image "$img"

    # Mixed: normal writes over compressed clusters (whole and partial),
    # zeroes, discards, and clusters compressed by qemu-io (only into
    # unallocated clusters, hence the discards first; and qemu fails to
    # compress into 512-byte clusters).
    qio "$img" \
      "write -P 0x11 $((cs * 2)) $cs" \
      "write -P 0x12 $((cs * 5 + 100)) 300" \
      "write -z $((cs * 8)) $((cs * 2))" \
      "discard $((cs * 12)) $cs"
    if [ $cs -gt 512 ]; then
      qio "$img" \
        "discard $((cs * 10)) $((cs * 2))" \
        "discard $((size - cs)) $cs" \
        "write -c -P 0x13 $((cs * 10)) $((cs * 2))" \
        "write -c -P 0x14 $((size - cs)) $cs"
    fi
    check_image "$img"
  done
done

# Compressed clusters in the backing file, a normal overlay.
base=$tmp/c-zstd-65536.qcow2
top=$tmp/ctop.qcow2
qemu-img create -q -f qcow2 -o cluster_size=4k -b "$base" -F qcow2 "$top"
qio "$top" 'write -P 0x21 1000 5000' 'write -c -P 0x22 1M 8k'
check_image "$top"

# Version 2 images (deflate only).
img=$tmp/v2.qcow2
qemu-img convert -c -f raw -O qcow2 -o compat=0.10 "$tmp/src6.raw" "$img"
n=$(compressed_clusters "$img")
[ "${n:-0}" -gt 0 ] || fail "$img: qemu made no compressed cluster"
check_image "$img"
