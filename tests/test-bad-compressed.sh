#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Bad compressed clusters met while serving, for deflate (zstd:
# test-bad-compressed-zstd.sh, which sources this with ct=zstd): the
# descriptor pointing beyond the end of the file, garbage instead of
# compressed data, a descriptor too short for the data.  Only the
# requests that touch them fail, with EIO and a message in nbdkit's log;
# the server keeps serving the rest.
source "${srcdir:-.}/bad-functions.sh"
ct=${ct:-zlib}
qemu-img create -q -f qcow2 -o compression_type=$ct "$tmp/probe.qcow2" 1M \
  2>/dev/null || { echo "$0: test skipped: qemu-img cannot make $ct images"; exit 77; }

# Guest data: 0x11 at 0 (64k), pseudo-random bytes at 1M (32k, so
# that the compressed cluster spans many sectors), zeros elsewhere.
raw=$tmp/src.raw
truncate -s 4M "$raw"
qpatch "$raw" fill 0 64k 0x11
qpatch "$raw" random 1M 32k 42


script='
expect_pattern(0, 65536, 0x11)
expect_eio(1 << 20, 65536)
expect_eio((1 << 20) + 40000, 1)
expect_eio(0, 4 << 20)
expect_pattern(0, 65536, 0x11)
expect_pattern((1 << 20) + 65536, 65536, 0)     # the next cluster
expect_pattern(3 << 20, 4096, 0)
expect_eio(1 << 20, 512)
expect_pattern(0, 512, 0x11)
'

# bad_compressed CT: the cases, for compression type CT.
bad_compressed ()
{
  local ct="$1"
  img=$tmp/$ct.qcow2
  name=$ct; [ $ct = zlib ] && name=deflate
  qemu-img convert -q -c -f raw -O qcow2 -o compression_type=$ct \
    "$raw" "$img" || fail "qemu-img cannot compress with $ct"
  qemu-img compare -q -f raw -F qcow2 "$raw" "$img" || fail "bad $ct image"
  read entry eoff <<< "$(qpatch "$img" l2-entry 1M)"
  read host len <<< "$(qpatch "$img" compressed 1M)"
  read host0 len0 <<< "$(qpatch "$img" compressed 0)"
  [ "$len" -gt 16384 ] || fail "the random cluster compressed too well"
  size=$(stat -c %s "$img")
  x=54                          # 62 - (cluster_bits - 8)
  # The served image, as a check of the test itself, reads as written.
  timeout 30 nbdkit -U - qcow2 "file=$img" --run 'nbdcopy "$uri" '"$tmp/out.raw" ||
    fail "$ct: the unpatched image is not served"
  cmp "$raw" "$tmp/out.raw" || fail "$ct: the unpatched image reads wrongly"

  # The descriptor points beyond the end of the file.
  for off in 0x10000000 $size $(( (1 << x) - 512 )); do
    cp "$img" "$tmp/bad.qcow2"
    qpatch "$tmp/bad.qcow2" be64 $eoff $(( (entry & ~((1 << x) - 1)) | off ))
    expect_served_errors "$tmp/bad.qcow2" "$script" \
      "error: $tmp/bad.qcow2: corrupt image: compressed cluster at host offset $(printf %#x $off) lies beyond the end of the file \(the file ends at $(printf %#x $size)\)"
  done

  # Garbage where the compressed data should be.  qemu agrees that it
  # is not a compressed cluster.
  cp "$img" "$tmp/bad.qcow2"
  qpatch "$tmp/bad.qcow2" random $host $len 7
  qemu-img convert -q -f qcow2 -O raw "$tmp/bad.qcow2" "$tmp/qemu.raw" \
    2>/dev/null && fail "$ct: qemu reads the garbage: the test is wrong"
  expect_served_errors "$tmp/bad.qcow2" "$script" \
    "error: $tmp/bad.qcow2: corrupt image: compressed cluster at host offset $(printf %#x $host) \($len bytes, $name\) does not decompress to one cluster"

  # Zeros where the compressed data should be.
  cp "$img" "$tmp/bad.qcow2"
  qpatch "$tmp/bad.qcow2" fill $host $len 0
  expect_served_errors "$tmp/bad.qcow2" "$script" \
    "compressed cluster at host offset $(printf %#x $host) \($len bytes, $name\) does not decompress to one cluster"

  # The descriptor says one sector: the compressed data is cut short.
  cp "$img" "$tmp/bad.qcow2"
  qpatch "$tmp/bad.qcow2" be64 $eoff $(( entry & ((1 << x) - 1) | (1 << 62) ))
  expect_served_errors "$tmp/bad.qcow2" "$script" \
    "compressed cluster at host offset $(printf %#x $host) \($((512 - (host & 511))) bytes, $name\) does not decompress to one cluster"

  # The descriptor points at the other compressed cluster's data, which
  # decompresses fine but to other data: undetectable, so served (as
  # qemu would): 1M reads as 0x11.
  cp "$img" "$tmp/bad.qcow2"
  qpatch "$tmp/bad.qcow2" be64 $eoff \
    $(( (1 << 62) | (((len0 + (host0 & 511) - 1) / 512) << x) | host0 ))
  timeout 30 nbdkit -U - qcow2 "file=$tmp/bad.qcow2" --run 'nbdsh -u "$uri" -c "
assert h.pread(65536, 1 << 20) == b\"\\x11\" * 65536
"' || fail "$ct: a descriptor pointing at another cluster is not read"
}
bad_compressed "$ct"
