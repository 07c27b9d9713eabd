#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# compress=: whole-cluster writes to unallocated clusters stored
# compressed, as QEMU's compress driver stores them.
#  - nbdcopy --connections=4 into create=true compress=zstd (and zlib)
#    of data that is part text, part random, part zeros: qemu-img
#    compare finds the image identical to the source, qemu-img check
#    clean and counts compressed clusters; random clusters are stored
#    plain; the image is at most 5% larger than qemu-img convert -c
#    makes it; so is it with every k-th cluster random (k = 2..8),
#    each cluster decided alone, as by qemu-img convert -c;
#  - random writes (diffwrite.py: partial and whole clusters, zeroes,
#    trims, 2 connections) with compress=on, on 64 KiB clusters, 512-byte
#    clusters, extended L2 entries and 1-bit refcounts (which cannot
#    share a cluster between two compressed ones): the model holds,
#    qemu-img check is clean;
#  - the refusals: a type the image does not use, an encrypted image,
#    an external data file, compress= against compression-type=.
source "${srcdir:-.}/write-functions.sh"
set -e

M=1048576
src=$tmp/src.raw
/usr/bin/python3 - "$src" <<'EOF'
import os, random, sys
r = random.Random(7)
words = [w.encode() for w in "qcow2 cluster zstd zlib table refcount a of the".split()]
text = b" ".join(r.choice(words) for _ in range(400000))
M = 1 << 20
with open(sys.argv[1], "wb") as f:
    for i in range(12):
        k = i % 3
        if k == 0:
            f.write(text[i * 65536:i * 65536 + M])
        elif k == 1:
            f.write(os.urandom(M))
        else:
            f.seek(M, 1)
    # a text piece that ends inside a cluster
    f.write(text[:M // 2 + 1000])
    f.truncate(13 * M)
EOF

# compressed_pct IMG: qemu-img check's percentage of compressed clusters.
compressed_pct ()
{
  qemu-img check "$1" | sed -n 's/.*fragmented, \([0-9.]*\)% compressed.*/\1/p'
}

for type in zstd zlib; do
  img=$tmp/$type.qcow2
  nbdkit -U - qcow2 "file=$img" create=true size=13M "compress=$type" \
    --run 'nbdcopy --connections=4 '"$src"' "$uri"' ||
    fail "nbdcopy into create=true compress=$type"
  qemu-img compare -f raw -F qcow2 "$src" "$img" ||
    fail "compress=$type: the image differs from its source"
  check_written "$img"
  qemu-img info "$img" | grep -q "compression type: $type" ||
    fail "compress=$type made an image of another compression type"
  pct=$(compressed_pct "$img")
  # text clusters: 4 MiB + the last partial MiB; random stored plain
  awk -v p="$pct" 'BEGIN { exit !(p > 40 && p < 80) }' ||
    fail "compress=$type: $pct% compressed clusters (expected the text ones)"
  qemu-img convert -c -f raw -O qcow2 -o "compression_type=$type" "$src" "$tmp/q.qcow2"
  ours=$(stat -c %s "$img") theirs=$(stat -c %s "$tmp/q.qcow2")
  [ $((ours * 100)) -le $((theirs * 105)) ] ||
    fail "compress=$type: $ours bytes, qemu-img convert -c $theirs (over 5% more)"
  echo "compress=$type: $pct% compressed, $ours bytes (qemu-img convert -c: $theirs)"
done

# Mixed data, every k-th cluster random (k = 2..8): each cluster is
# decided alone, as by qemu-img convert -c, so that a request whose
# first cluster does not compress still stores the others compressed.
for k in 2 3 4 5 6 7 8; do
  /usr/bin/python3 - "$tmp/mixed.raw" "$k" <<'EOF'
import os, random, sys
k = int(sys.argv[2])
r = random.Random(k)
words = [w.encode() for w in "nbd qcow2 kernel a the disk of".split()]
with open(sys.argv[1], "wb") as f:
    for c in range(64):
        if c % k == 0:
            f.write(os.urandom(65536))
        else:
            f.write(b" ".join(r.choice(words) for _ in range(20000))[:65536])
EOF
  img=$tmp/mixed.qcow2
  rm -f "$img"
  nbdkit -U - qcow2 "file=$img" create=true size=4M compress=zstd \
    --run 'nbdcopy '"$tmp/mixed.raw"' "$uri"' ||
    fail "nbdcopy of mixed data into compress=zstd"
  qemu-img compare -q -f raw -F qcow2 "$tmp/mixed.raw" "$img" ||
    fail "mixed data, k=$k: the image differs from its source"
  qemu-img check -q "$img" || fail "mixed data, k=$k: qemu-img check"
  qemu-img convert -c -f raw -O qcow2 -o compression_type=zstd \
    "$tmp/mixed.raw" "$tmp/q.qcow2"
  ours=$(stat -c %s "$img") theirs=$(stat -c %s "$tmp/q.qcow2")
  [ $((ours * 100)) -le $((theirs * 105)) ] ||
    fail "mixed data, every k-th cluster random (k=$k): $ours bytes, qemu-img convert -c $theirs (over 5% more)"
done

# Random writes over compressed and plain clusters, compress=on.
for opts in "cluster_size=64k" "cluster_size=512" \
            "extended_l2=on,cluster_size=32k,compression_type=zstd" \
            "refcount_bits=1,cluster_size=4k"; do
  img=$tmp/dw.qcow2
  rm -f "$img"
  qemu-img convert -c -f raw -O qcow2 -o "$opts" "$src" "$img"
  diffwrite "$img" --seed 811 --ops 1500 --connections 2 --inflight 8 \
    -- compress=on
done

# Whole clusters only: a partial write, and a random cluster, stay plain.
img=$tmp/plain.qcow2
qemu-img create -q -f qcow2 "$img" 4M
nbdkit -U - qcow2 "file=$img" compress=on --run '
  nbdsh -u "$uri" -c "
import os
h.pwrite(b\"a\" * 65535, 0)
h.pwrite(os.urandom(65536), 65536)
h.pwrite(b\"b\" * 65536, 131072)
h.flush()"' || fail "writing with compress=on"
check_written "$img"
qemu-img map --output=json "$img" | /usr/bin/python3 -c '
import json, sys
m = json.load(sys.stdin)
def at(o):
    return next(e for e in m if e["start"] <= o < e["start"] + e["length"])
# qemu-img map gives no offset for compressed clusters
assert "offset" in at(0) and "offset" in at(65536), m
assert at(131072)["data"] and "offset" not in at(131072), m
' || fail "which clusters were compressed"

# Refusals.
qemu-img create -q -f qcow2 "$tmp/z.qcow2" 1M
expect_refused "compress=zstd, but the image's compressed clusters are zlib" \
  qcow2 "file=$tmp/z.qcow2" compress=zstd
expect_refused "compress=zstd and compression-type=zlib disagree" \
  qcow2 "file=$tmp/n.qcow2" create=true size=1M compress=zstd compression-type=zlib
qemu-img create -q -f qcow2 -o data_file="$tmp/d.raw" "$tmp/d.qcow2" 1M
expect_refused "compress= cannot be used on an image with an external data file" \
  qcow2 "file=$tmp/d.qcow2" compress=on
nbdkit -U - qcow2 "file=$tmp/e.qcow2" create=true size=1M encrypt-format=luks \
  password=x encrypt-iter-time=10 --run true || fail "create=true encrypted"
expect_refused "compress= cannot be used on an encrypted image" \
  qcow2 "file=$tmp/e.qcow2" password=x compress=on
# Read-only, compress= changes nothing.
nbdkit -U - -r qcow2 "file=$tmp/z.qcow2" compress=zstd --run true ||
  fail "compress= on a read-only export"
echo "compressed writes: OK"
