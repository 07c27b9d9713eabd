#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Concurrency: one image (data, compressed and zero clusters, a backing
# file) served with a small L2 cache (16K of 512-byte slices, so
# constant evictions), read by nbdcopy over 4 connections with 16
# requests in flight each, and by 4 clients at once issuing 32
# concurrent scattered reads each; every byte must match qemu's reading.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy nbdsh
requires_python_nbd

M=1048576
# A backing file with 64k clusters and an image with 4k clusters, made
# of random data (so that it does not compress) except where written
# with patterns or compressed; host clusters out of guest order.
src=$tmp/src.raw
head -c $((24 * M)) /dev/urandom > "$src"
truncate -s $((32 * M)) "$src"
base=$tmp/base.qcow2
qemu-img convert -f raw -O qcow2 "$src" "$base"
img=$tmp/img.qcow2
qemu-img create -q -f qcow2 -o cluster_size=4k -b "$base" -F qcow2 "$img"
cmds=()
for i in $(seq 0 199); do
  off=$(( (i * 7919 % 2000) * 16384 ))
  case $((i % 4)) in
    0) cmds+=("write -P $((i % 250 + 1)) $((off + i)) 6000") ;;
    1) cmds+=("write -c -P $((i % 250 + 1)) $off 4096") ;;
    2) cmds+=("write -z $off 8192") ;;
    3) cmds+=("write -P $((i % 250 + 1)) $off 12288") ;;
  esac
done
qio "$img" "${cmds[@]}"

opts="l2-cache-size=16K l2-slice-size=512"
check_image "$img" $opts

ref=$tmp/ref.raw                        # left by check_image
cat > "$tmp/reader.py" <<'PY'
import nbd, random, sys
uri, ref, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(ref, "rb").read()
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
assert size == len(data), (size, len(data))
r = random.Random(seed)
pending, done, bad = [], 0, []
todo = 2000
while todo > 0 or pending:
    while todo > 0 and len(pending) < 32:
        n = r.choice([1, 512, 4096, 5000, 65536, 300000])
        off = r.randrange(size - n)
        buf = nbd.Buffer(n)
        pending.append((h.aio_pread(buf, off), buf, off, n))
        todo -= 1
    h.poll(-1)
    still = []
    for cookie, buf, off, n in pending:
        if h.aio_command_completed(cookie):
            if buf.to_bytearray() != data[off:off + n]:
                bad.append((off, n))
            done += 1
        else:
            still.append((cookie, buf, off, n))
    pending = still
h.shutdown()
if bad:
    sys.exit("client %d: %d reads differ, e.g. offset %d length %d" %
             (seed, len(bad), bad[0][0], bad[0][1]))
PY
timeout 120 nbdkit -U - qcow2 "file=$img" $opts --run '
  set -e
  nbdcopy --connections=4 --requests=16 "$uri" '"$tmp"'/mc.raw
  pids=
  for seed in 1 2 3 4; do
    /usr/bin/python3 '"$tmp"'/reader.py "$uri" '"$ref"' $seed &
    pids="$pids $!"
  done
  for p in $pids; do wait $p; done
' || fail "concurrent reads"
cmp "$ref" "$tmp/mc.raw" ||
  fail "nbdcopy --connections=4 --requests=16 differs from qemu-img convert"
