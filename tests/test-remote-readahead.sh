#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The read-ahead of a backing file on remote storage fetches what a
# reader does not ask for only for a sequential run, and no more than a
# slow link delivers in a short time: one small read (the first
# sector's) fetches no more than it asked for, two adjacent reads no
# megabytes, while a long sequential run is still read in few large
# requests.  What the base's server was asked is counted by nbdkit's
# log filter.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
source "${srcdir:-.}/remote-functions.sh"

base=$tmp/base.raw
qemu-img create -q -f raw "$base" 16M
QIO_FMT=raw qio "$base" 'write -P 0x11 0 16M'
ovl=$tmp/ovl.qcow2
qemu-img create -q -u -f qcow2 -b "nbd+unix:///?socket=$tmp/base.sock" -F raw "$ovl" 16M

# fetched PYTHON: run it against us over the base behind a link of
# 10 MB/s; prints "REQUESTS BYTES" the base was asked to read.
fetched ()
{
  rm -f "$tmp/base.log"
  nbd_server base -r --filter=log --filter=rate file "$base" rate=80M \
    logfile="$tmp/base.log"
  nbd_server q qcow2 "$ovl"
  nbdsh -u "nbd+unix:///?socket=$tmp/q.sock" -c "$1" ||
    fail "reading: $1"
  stop_server q
  stop_server base
  /usr/bin/python3 -c '
import re, sys
counts = [int(m.group(1), 0) for line in open(sys.argv[1])
          if " Read id=" in line
          for m in [re.search(r" count=(0x[0-9a-f]+|[0-9]+)", line)] if m]
print(len(counts), sum(counts))' "$tmp/base.log"
}

read -r n bytes < <(fetched 'assert h.pread(512, 0) == b"\x11" * 512')
[ "$bytes" -le 65536 ] || fail "a read of 512 bytes fetched $bytes bytes"

read -r n bytes < <(fetched '
for o in (0, 65536):
    assert h.pread(65536, o) == b"\x11" * 65536')
[ "$bytes" -le $((512 << 10)) ] ||
  fail "two adjacent reads of 64 KiB fetched $bytes bytes"

read -r n bytes < <(fetched '
for o in range(0, 16 << 20, 65536):
    assert h.pread(65536, o) == b"\x11" * 65536')
[ "$n" -le 64 ] || fail "256 sequential reads of 64 KiB took $n requests"
[ "$bytes" -le $((16 << 20)) ] || fail "reading 16 MiB fetched $bytes bytes"
