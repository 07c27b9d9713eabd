#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes (diffwrite.py, randomized and differential) on images made
# mostly of compressed clusters (qemu-img convert -c): deflate with
# clusters of 512 B, 4 KiB, 64 KiB and 2 MiB, zstd, and v2.  A partial
# write into a compressed cluster must keep the rest of its
# decompressed data; overwriting and zeroing must free what the
# compressed cluster held.  Afterwards qemu-img check finds no error and
# no leak, and qemu reads exactly what the driver's model holds.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576

# compressible_raw FILE SIZE SEED: blocks of 4k of text-like data
# (compresses), random data (does not: stored uncompressed) or zeros.
compressible_raw ()
{
  /usr/bin/python3 -c '
import random, sys
f, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
words = [bytes(r.choice(b"abcdefghij") for _ in range(r.randint(2, 9)))
         for _ in range(50)]
out = bytearray()
while len(out) < size:
    k = r.random()
    if k < 0.7:
        b = b" ".join(r.choice(words) for _ in range(900))[:4096]
    elif k < 0.85:
        b = r.randbytes(4096)
    else:
        b = bytes(4096)
    out += b.ljust(4096, b".")
open(f, "wb").write(out[:size])
' "$1" "$2" "$3" || fail "compressible_raw"
}

seed=500
for cfg in 1.1:65536:zlib 1.1:4096:zlib 1.1:512:zlib 1.1:2097152:zlib \
           1.1:65536:zstd 1.1:4096:zstd 0.10:65536:zlib; do
  IFS=: read -r compat cs ct <<< "$cfg"
  case $cs in
    512)     size=$((4 * M + 1024))  ops=2500 ;;
    4096)    size=$((16 * M + 2048)) ops=3000 ;;
    65536)   size=$((24 * M + 4096)) ops=3000 ;;
    2097152) size=$((32 * M))        ops=1000 ;;
  esac
  opts=compat=$compat,cluster_size=$cs
  [ "$compat" = 0.10 ] || opts=$opts,compression_type=$ct
  img=$tmp/c-$compat-$cs-$ct.qcow2
  compressible_raw "$tmp/src.raw" $size $seed
  rm -f "$img"
  qemu-img convert -c -f raw -O qcow2 -o "$opts" "$tmp/src.raw" "$img"
  qemu-img check "$img" | grep -q 'compressed clusters' ||
    fail "no compressed clusters in $img"
  qio "$img" "write -P 0x5a $((size / 3 + 11)) 3333" "write -z $((size / 2)) $cs"
  diffwrite "$img" --seed $seed --ops $ops --inflight 8
  seed=$((seed + 1))
done
