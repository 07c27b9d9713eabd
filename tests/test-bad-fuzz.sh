#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Random bit flips in the metadata of valid images (header, header
# extensions, L1 and L2 tables, compressed data).  Whatever the flips
# do, nbdkit must not crash or hang: it refuses the image at startup, or
# fails requests with an error, or serves it.  Where both qemu and the
# plugin read the whole image, they must read the same bytes.
# Deterministic: the same seeds every run.
source "${srcdir:-.}/bad-functions.sh"
requires cmp

iterations=${FUZZ_ITERATIONS:-30}       # per image
bugs=0 served=0 refused=0 failed=0 compared=0

# Read the whole export sequentially, one request at a time (nbdcopy's
# many requests in flight trip an nbdkit 1.32 server assertion when a
# read fails), then block status.  Exit 0: all read, and the data is in
# $FUZZ_OUT; 3: some requests failed with EIO.  Anything else is a bug.
export FUZZ_OUT=$tmp/out.raw
fuzz_read='
import errno, sys
size = h.get_size()
if size > (64 << 20):
    sys.exit(5)
out = bytearray()
bad = 0
for off in range(0, size, 65536):
    n = min(65536, size - off)
    try:
        out += h.pread(n, off)
    except nbd.Error as e:
        assert e.errnum == errno.EIO, "read at %d: %s" % (off, e)
        bad += 1
try:
    h.block_status(size, 0, lambda *args: 0)
except nbd.Error as e:
    assert e.errnum == errno.EIO, "block status: %s" % e
    bad += 1
h.shutdown()
if bad:
    sys.exit(3)
open(os.environ["FUZZ_OUT"], "wb").write(out)
'
export fuzz_read

# fuzz_image IMG NAME REGION...: each REGION is "OFFSET:LENGTH".
fuzz_image ()
{
  local img="$1" name="$2"; shift 2
  local regions=("$@") i region off len bad log rc
  for ((i = 0; i < iterations; i++)); do
    region=${regions[i % ${#regions[@]}]}
    off=${region%:*} len=${region#*:}
    bad=$tmp/fuzz.qcow2 log=$tmp/fuzz.log
    cp "$img" "$bad"
    qpatch "$bad" flip-bits $off $len $((1 + i % 3)) $i
    rm -f "$tmp/out.raw" "$tmp/ref.raw" "$tmp/ran"
    rc=0
    # -r: a flipped corrupt bit must not stop the reading.
    timeout 30 nbdkit -r -U - qcow2 "file=$bad" --run '
      touch '"$tmp/ran"'
      nbdsh --base-allocation -u "$uri" -c "import os" -c "$fuzz_read"
    ' > "$log" 2>&1 || rc=$?
    if [ $rc = 124 ] || [ $rc -gt 128 ] || grep -q "killed by signal" "$log"
    then
      echo "$name seed $i region $region: crash or hang, exit status $rc"
      sed 's/^/    /' "$log"
      bugs=$((bugs + 1))
      cp "$bad" "$tmp/bug-$name-$i.qcow2"
      continue
    fi
    if [ ! -e "$tmp/ran" ] && [ $rc = 1 ]; then
      refused=$((refused + 1))
    elif [ -e "$tmp/ran" ] && [ $rc = 0 ]; then
      served=$((served + 1))
    elif [ -e "$tmp/ran" ] && [ $rc = 3 ]; then
      failed=$((failed + 1))
    elif [ -e "$tmp/ran" ] && [ $rc = 5 ]; then
      continue
    else
      echo "$name seed $i region $region: unexpected exit status $rc"
      sed 's/^/    /' "$log"
      bugs=$((bugs + 1))
      continue
    fi
    # Every failure must be explained by an error message from nbdkit.
    if [ $rc != 0 ] && ! grep -q "error: $bad: " "$log"; then
      echo "$name seed $i region $region: failed with no error message"
      sed 's/^/    /' "$log"
      bugs=$((bugs + 1))
    fi
    if [ $rc = 0 ] &&
       timeout 30 qemu-img convert -q -f qcow2 -O raw "$bad" "$tmp/ref.raw" \
         2>/dev/null; then
      compared=$((compared + 1))
      if ! cmp -s "$tmp/ref.raw" "$tmp/out.raw"; then
        echo "$name seed $i region $region: differs from qemu-img convert"
        bugs=$((bugs + 1))
        cp "$bad" "$tmp/differs-$name-$i.qcow2"
      fi
    fi
  done
}

# A 4 MiB image, 64 KiB clusters: data, a zero cluster, a compressed
# cluster, a partial cluster.
img=$tmp/plain.qcow2
qemu-img create -q -f qcow2 "$img" 4M
qemu-io -f qcow2 -c 'write -P 0x11 0 64k' -c 'write -z 1M 64k' \
  -c 'write -c -P 0x22 2M 64k' -c 'write -P 0x33 3M 4k' "$img" >/dev/null
read l1 l1off <<< "$(qpatch "$img" l1-entry 0)"
l2=$((l1 & 0xfffffffffffe00))
read chost clen <<< "$(qpatch "$img" compressed 2M)"
# Header (not the virtual size at 24: a huge disk would only be slow),
# header extensions, L1 table, the used L2 entries, compressed data.
fuzz_image "$img" plain 4:20 32:80 112:400 $l1off:8 $l2:512 $chost:$clen

# Extended L2 entries, 32 KiB clusters.
img=$tmp/extl2.qcow2
qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=32k "$img" 4M
qemu-io -f qcow2 -c 'write -P 0x11 0 64k' -c 'write -z 1M 64k' \
  -c 'write -P 0x33 3M 4k' -c 'write -c -P 0x22 2M 32k' "$img" >/dev/null
read l1 l1off <<< "$(qpatch "$img" l1-entry 0)"
l2=$((l1 & 0xfffffffffffe00))
fuzz_image "$img" extl2 4:20 32:80 $l1off:8 $l2:1024

# 512 byte clusters and a backing file: many small L2 tables.
qemu-img create -q -f qcow2 -o cluster_size=512 "$tmp/base.qcow2" 1M
qemu-io -f qcow2 -c 'write -P 0x44 0 1M' "$tmp/base.qcow2" >/dev/null
img=$tmp/small.qcow2
qemu-img create -q -f qcow2 -o cluster_size=512 -b base.qcow2 -F qcow2 "$img"
qemu-io -f qcow2 -c 'write -P 0x55 4k 8k' -c 'write -P 0x66 512k 1k' \
  "$img" >/dev/null
l1off=$(qpatch "$img" field l1_table_offset)
l1size=$(qpatch "$img" field l1_size)
fuzz_image "$img" small 4:20 32:80 $l1off:$((8 * l1size)) \
  $(( $(qpatch "$img" l1-entry 0 | cut -d' ' -f1) & 0xfffffffffffe00 )):512

echo "served $served (compared with qemu: $compared), refused $refused," \
  "requests failed $failed, bugs $bugs"
[ $bugs = 0 ] || fail "$bugs fuzzed images crashed, hung or misread"
[ $served -gt 0 ] && [ $refused -gt 0 ] && [ $failed -gt 0 ] ||
  fail "the fuzzing does not reach every outcome: change the seeds"
