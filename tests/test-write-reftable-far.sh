#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A refcount table whose entries in use reach past its first 4 KiB
# (the engine reads it in pieces of 512 entries and keeps only those
# that are not zero): 64-bit refcounts and 512-byte clusters, so that a
# refcount block counts 32 KiB of the file, and 20 MiB written by QEMU
# first.  Then a randomized differential pass (diffwrite.py) allocates
# and frees across it: an entry past the first piece read as zero would
# make its clusters look free and be allocated over, which qemu-img
# check and the comparison with the model find.
source "${srcdir:-.}/write-functions.sh"
set -e

img=$tmp/far.qcow2
qemu-img create -q -f qcow2 -o refcount_bits=64,cluster_size=512 "$img" 24M
qemu-io -f qcow2 -c 'write -P 0x5c 0 20M' "$img" >/dev/null
# The entries in use: one a 32 KiB of the file, past entry 511.
used=$(/usr/bin/python3 -c '
import struct, sys
f = open(sys.argv[1], "rb")
h = f.read(64)
off, clusters = struct.unpack(">QI", h[48:60])
f.seek(off)
t = f.read(clusters * 512)
print(max(i for i in range(len(t) // 8) if t[i * 8:i * 8 + 8] != bytes(8)))
' "$img")
[ "$used" -gt 511 ] ||
  fail "the refcount table's last entry in use is $used: not past 511"
diffwrite "$img" --seed 7 --ops 300 --max-len 200000
