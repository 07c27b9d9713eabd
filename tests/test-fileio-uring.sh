#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# cache=none (O_DIRECT) both ways fileio writes it: writes past the
# file's end made while others are in flight through each thread's
# io_uring (built with
# liburing), and all with pwrite (NBDKIT_QCOW2_IO_URING=0, as without
# liburing or where the kernel refuses a ring).  Each way: strace sees that way's system
# calls, and randomized differential writes (diffwrite.py, two
# connections, unaligned requests through the bounce buffers) read back
# as the model holds, with qemu-img check clean.
source "${srcdir:-.}/write-functions.sh"
set -e
requires strace nbdsh

[ "${HAVE_LIBURING:-no}" = yes ] || {
  echo "$0: test skipped: built without liburing"
  exit 77
}

K=1024 M=1048576
trace=$tmp/trace

# calls ENV [PREFILL]: sets enters and writes, the io_uring_enter and
# pwrite64 calls strace counts for 32 writes in flight at once with
# cache=none (only writes past the file's end made while others are in
# flight take the ring), with ENV (NAME=VALUE or empty) set; with
# PREFILL, into clusters already written (overwrites inside the file).
calls ()
{
  local img=$tmp/calls.qcow2
  rm -f "$img"
  qemu-img create -q -f qcow2 "$img" 16M
  [ -z "${2-}" ] || qio "$img" "write -P 0x33 0 2M"
  env $1 strace -f -e trace=io_uring_setup,io_uring_enter,pwrite64 \
    -o "$trace" nbdkit -U - qcow2 "$img" cache=none --run 'nbdsh -u "$uri" -c "
cookies = [h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray([65 + i]) * 65536),
                        i * 65536) for i in range(32)]
while h.aio_in_flight() > 0:
    h.poll(-1)
assert all(h.aio_command_completed(c) for c in cookies)
h.flush()
for i in range(32):
    assert h.pread(65536, i * 65536) == bytes([65 + i]) * 65536
"' || fail "cache=none writes and reads ($1)"
  if grep -q "io_uring_setup(.*= -1" "$trace"; then
    echo "$0: test skipped: the kernel refuses io_uring:" \
         "$(grep -m1 "io_uring_setup(.*= -1" "$trace")"
    exit 77
  fi
  enters=$(grep -c "io_uring_enter(" "$trace" || true)
  writes=$(grep -c "pwrite64(" "$trace" || true)
}

calls ""
echo "io_uring: $enters io_uring_enter, $writes pwrite64"
[ "$enters" -ge 1 ] || fail "io_uring: no io_uring_enter call"

calls "" prefill
echo "overwrites: $enters io_uring_enter, $writes pwrite64"
[ "$enters" -eq 0 ] || fail "overwrites: $enters io_uring_enter calls"
[ "$writes" -ge 32 ] || fail "overwrites: only $writes pwrite64 calls"

calls NBDKIT_QCOW2_IO_URING=0
echo "NBDKIT_QCOW2_IO_URING=0: $enters io_uring_enter, $writes pwrite64"
[ "$enters" -eq 0 ] || fail "NBDKIT_QCOW2_IO_URING=0: $enters io_uring_enter calls"
[ "$writes" -ge 32 ] || fail "NBDKIT_QCOW2_IO_URING=0: only $writes pwrite64 calls"

img=$tmp/uring.qcow2
for way in "" NBDKIT_QCOW2_IO_URING=0; do
  rm -f "$img"
  qemu-img create -q -f qcow2 -o cluster_size=64k "$img" 64M
  qio "$img" "write -P 0x21 0 1M" "write -P 0x22 $((3 * M + 512)) 100k"
  # shellcheck disable=SC2086
  ( [ -z "$way" ] || export $way
    diffwrite "$img" --seed 4601 --ops 1500 --max-len $((M + 3 * K)) \
      --connections 2 --inflight 8 -- cache=none )
done
