#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Differential test against qemu-nbd (diffqemu-functions.sh): image
# versions, cluster sizes, refcount widths, extended L2, preallocation,
# lazy refcounts and a size that is not a multiple of the cluster size,
# each starting with data written by qemu-img convert and qemu-io.
source "${srcdir:-.}/write-functions.sh"
source "${srcdir:-.}/diffqemu-functions.sh"
set -e
requires qemu-nbd

M=1048576
random_raw "$tmp/src.raw" $((24 * M)) 11

# converted OPTS PREFIX: the random disk converted with -o OPTS.
converted ()
{
  qemu-img convert -f raw -O qcow2 -o "$opts" "$tmp/src.raw" "$1.qcow2"
}
for opts in compat=0.10,cluster_size=64k compat=1.1,cluster_size=512 \
            cluster_size=4k,refcount_bits=1 cluster_size=2M \
            cluster_size=16k,refcount_bits=64 \
            cluster_size=64k,extended_l2=on \
            cluster_size=32k,lazy_refcounts=on; do
  diff_qemu "${opts//[,=]/-}" converted
done

# created OPTS SIZE: an image made by qemu-img create, a little written.
created ()
{
  qemu-img create -q -f qcow2 -o "$opts" "$1.qcow2" "$size"
  qio "$1.qcow2" 'write -P 0x41 100k 300k' "write -P 0x42 $((size - 5000)) 5000"
}
for opts in preallocation=metadata preallocation=falloc preallocation=full \
            cluster_size=64k; do
  size=$((16 * M))
  [ "$opts" = cluster_size=64k ] && size=$((16 * M + 12345 * 512))
  diff_qemu "${opts//[,=]/-}-$size" created
done
echo "$0: ok"
