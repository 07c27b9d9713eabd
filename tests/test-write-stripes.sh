#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Connections writing next to each other in the same clusters
# (stripes.py: byte-granular stripes, each owned by one connection, a
# model per owner), then qemu-img check and the image compared byte for
# byte with the model.
#
#  1. The lost-write race of extended L2 images: two connections, a
#     512-byte stripe at the start of each 4.5 KiB and 4 KiB right after
#     it (as a partition at sector 63 writes), sweeping the disk
#     together, so that an allocating write into a partly allocated
#     cluster meets in-place writes to its neighbours, in the same
#     cluster and across cluster ends; through the page cache, with
#     cache=none (O_DIRECT's partial-block read-modify-write) and with
#     io-threads=0.  An earlier engine lost one of the two writes in
#     about 10% of those clusters with cache=none.
#  2. Eight connections with 16 requests in flight each, odd-sized
#     stripes: extended L2 (with cache=none; the earlier engine failed
#     this one too), 512-byte clusters, an overlay over a full backing
#     file, compressed clusters, a tiny L2 cache.
source "${srcdir:-.}/write-functions.sh"
set -e
stripes_py="$(cd "${srcdir:-.}" && pwd)/stripes.py"
M=1048576

# stripes IMG "STRIPES-ARGS" [PLUGIN-ARGS...]
stripes ()
{
  local img="$1" args="$2"; shift 2
  qemu-img convert -f qcow2 -O raw "$img" "$tmp/model.raw"
  serve_rw "$img" "/usr/bin/python3 $stripes_py \"\$uri\" \
    --model $tmp/model.raw --dump $tmp/want.raw $args" "$@" ||
    fail "stripes.py on $img ($args; $*)"
  check_written "$img"
  qemu-img convert -f qcow2 -O raw "$img" "$tmp/got.raw"
  cmp -s "$tmp/got.raw" "$tmp/want.raw" ||
    fail "$img ($args; $*): the image is not what the clients wrote: " \
      "$(cmp "$tmp/got.raw" "$tmp/want.raw" | head -1)"
}

# Sizes: enough clusters for a race that hits 10% of them to show
# (256 here), the tables' boundaries that matter kept (see each image),
# no more: every request is a Python round trip.
race="--connections 2 --inflight 16 --pattern 512:4096 --passes 1"
for variant in "" cache=none io-threads=0; do
  img=$tmp/race.qcow2
  rm -f "$img"
  qemu-img create -q -f qcow2 -o cluster_size=64k,extended_l2=on "$img" 16M
  # shellcheck disable=SC2086
  stripes "$img" "$race --seed ${STRIPES_SEED:-1}" $variant
  # Again over what the first pass allocated: in-place writes and
  # zeroes among allocating ones in every cluster's other half.
  stripes "$img" "$race --pattern 4096:512 --seed $(( ${STRIPES_SEED:-1} + 1 ))" \
    $variant
done

many="--connections 8 --inflight 16 --passes 2"
img=$tmp/extl2.qcow2
qemu-img create -q -f qcow2 -o cluster_size=32k,extended_l2=on "$img" 8M
stripes "$img" "$many --pattern 700:300:1500:512 --seed 3" cache=none

# 8M: the data outgrows what one 512-byte refcount table cluster covers.
img=$tmp/c512.qcow2
qemu-img create -q -f qcow2 -o cluster_size=512 "$img" 8M
stripes "$img" "$many --pattern 200:900:513 --order random --seed 4"

base=$tmp/base.qcow2 img=$tmp/overlay.qcow2
make_image "$base" $((8 * M)) cluster_size=4k 5
qemu-img create -q -f qcow2 -o cluster_size=64k -b "$base" -F qcow2 "$img"
stripes "$img" "$many --pattern 4096:100:3000 --seed 5"

img=$tmp/compressed.qcow2
random_raw "$tmp/src.raw" $((8 * M)) 6
qemu-img convert -c -f raw -O qcow2 -o cluster_size=64k "$tmp/src.raw" "$img"
stripes "$img" "$many --pattern 1024:7000:333 --order random --seed 6"

# 16M: 8 L2 tables for a cache of 8 slices of 64 entries, and a
# second refcount block.
img=$tmp/tinycache.qcow2
qemu-img create -q -f qcow2 -o cluster_size=4k "$img" 16M
stripes "$img" "$many --pattern 1500:2600 --seed 7" \
  l2-cache-size=4k l2-slice-size=512
echo "$0: ok"
