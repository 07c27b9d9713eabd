#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Differential test against qemu-nbd (diffqemu-functions.sh): compressed
# clusters (zlib and zstd), overlays over a qcow2 and a raw backing
# file (and a version 2 one), external data files (raw and not),
# internal snapshots.
source "${srcdir:-.}/write-functions.sh"
source "${srcdir:-.}/diffqemu-functions.sh"
set -e
requires qemu-nbd

M=1048576
random_raw "$tmp/src.raw" $((24 * M)) 12

compressed ()
{
  qemu-img convert -c -f raw -O qcow2 -o "compression_type=$ct" \
    "$tmp/src.raw" "$1.qcow2"
}
for ct in zlib zstd; do
  diff_qemu "compressed-$ct" compressed
done

# Both copies over one backing file (opened read-only by both servers).
qemu-img convert -f raw -O qcow2 -o cluster_size=4k "$tmp/src.raw" "$tmp/base.qcow2"
overlay ()
{
  qemu-img create -q -f qcow2 -o "cluster_size=64k,compat=$compat" \
    -b "$base" -F "$fmt" "$1.qcow2"
  qio "$1.qcow2" 'write -P 0x51 1M 100k'
}
compat=1.1 base=$tmp/base.qcow2 fmt=qcow2 diff_qemu overlay-qcow2 overlay
compat=1.1 base=$tmp/src.raw fmt=raw diff_qemu overlay-raw overlay
# Version 2: a trim must not show the backing file's data again.
compat=0.10 base=$tmp/base.qcow2 fmt=qcow2 diffqemu_args=--trim-keeps \
  diff_qemu overlay-v2 overlay

datafile ()
{
  qemu-img create -q -f qcow2 -o "data_file=$1.data,$raw" "$1.qcow2" $((16 * M))
  qio "$1.qcow2" 'write -P 0x61 0 2M' 'write -P 0x62 5M 77k'
}
raw=data_file_raw=off diff_qemu datafile datafile
raw=data_file_raw=on diff_qemu datafile-raw datafile

snapshots ()
{
  qemu-img convert -f raw -O qcow2 -o cluster_size=16k "$tmp/src.raw" "$1.qcow2"
  qemu-img snapshot -c s1 "$1.qcow2"
  qio "$1.qcow2" 'write -P 0x71 3M 1M'
  qemu-img snapshot -c s2 "$1.qcow2"
}
diff_qemu snapshots snapshots
echo "$0: ok"
