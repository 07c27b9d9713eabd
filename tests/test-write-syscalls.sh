#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Host system calls per operation, counted with strace:
#  - a partial write to a new cluster over a backing file is one read (of
#    the backing file, head and tail together) plus one write (of the
#    whole cluster, head + data + tail);
#  - a client flush after in-place data writes is one fdatasync;
#  - a flush with nothing changed since the last one is none;
#  - allocating writes and a flush: one fdatasync, or two with
#    cache=none (the file grows by the writes, as in QEMU); with lazy
#    refcounts the same, also past what the reserve covers.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh strace

# strace -f splits a call that another thread's event (a traced call,
# a thread's exit) interrupts: "pwrite64(..., OFFSET <unfinished ...>"
# now, "<... pwrite64 resumed>) = N" later.  So a write at an offset is
# counted on the line that starts it, in either form.
at_offset='(\) | <unfinished)'

base=$tmp/base.raw
img=$tmp/top.qcow2
trace=$tmp/trace
qemu-img create -q -f raw "$base" 1M
qemu-io -f raw -c 'write -P 7 0 1M' "$base" >/dev/null
qemu-img create -q -f qcow2 -o cluster_size=64k -b "$base" -F raw "$img" 1M

# COW: 4 KiB in the middle of the first cluster.
strace -f -y -e trace=pread64,pwrite64,fdatasync -o "$trace" \
  nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "h.pwrite(b\"X\" * 4096, 8192); h.flush()"'
host=$(qemu-img map --output=json -f qcow2 "$img" |
       /usr/bin/python3 -c 'import json,sys; print([e["offset"] for e in json.load(sys.stdin) if e["start"] == 0][0])')
backing_reads=$(grep -c "pread64([0-9]*<$base>" "$trace" || true)
data_writes=$(grep -cE "pwrite64\([0-9]*<$img>, .*, $host$at_offset" "$trace" || true)
echo "COW: $backing_reads read(s) of the backing file, $data_writes write(s) at host offset $host"
[ "$backing_reads" -eq 1 ] || fail "COW read the backing file $backing_reads times"
[ "$data_writes" -eq 1 ] || fail "COW wrote the data cluster $data_writes times"
# qemu-io exits non-zero when a pattern does not match.
qemu-io -f qcow2 -c 'read -P 7 0 8192' -c 'read -P 0x58 8192 4096' \
  -c 'read -P 7 12288 53248' "$img" >/dev/null || fail "COW result reads wrong"

# In place: data only, then a flush with nothing new.
strace -f -y -e trace=fdatasync -o "$trace" \
  nbdkit -U - qcow2 "$img" --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"Y\" * 4096, 16384)
h.flush()
h.flush()
"'
syncs=$(grep -Ec "fdatasync.*= 0$" "$trace" || true)
echo "in-place write + flush + empty flush: $syncs fdatasync(s)"
[ "$syncs" -eq 1 ] || fail "expected one fdatasync, got $syncs"

qemu-img check -q "$img" || fail "qemu-img check"
qemu-io -f qcow2 -c 'read -P 0x59 16384 4096' "$img" >/dev/null ||
  fail "in-place write reads wrong"

# Allocating writes: sequential 64 KiB writes into an empty image, a
# flush after every 64.  Past the first flush, every further flush is
# one fdatasync: new clusters come from a reserve whose refcounts an
# earlier flush made durable.
syncs_for ()    # N [OPTS [LAZY [W]]]: fdatasyncs, N rounds of W (64) writes + flush
{
  local n=$1 w=${4:-64} img=$tmp/seq.qcow2
  rm -f "$img"
  qemu-img create -q -f qcow2 -o lazy_refcounts=${3:-off} "$img" 4G
  strace -f -e trace=fdatasync -o "$trace" \
    nbdkit -U - qcow2 "$img" ${2:-} --run "nbdsh -u \"\$uri\" -c \"
off = 0
for f in range($n):
    for i in range($w):
        h.pwrite(b'S' * 65536, off)
        off += 65536
    h.flush()
\""
  qemu-img check -q "$img" || fail "qemu-img check after $n rounds"
  grep -Ec "fdatasync.*= 0$" "$trace" || true
}
s2=$(syncs_for 2)
s12=$(syncs_for 12)
echo "allocating rounds: 2 flushes -> $s2 fdatasyncs, 12 flushes -> $s12"
[ $((s12 - s2)) -eq 10 ] ||
  fail "10 more flushes cost $((s12 - s2)) fdatasyncs, not 10"

# With cache=none (O_DIRECT) the file grows by the writes themselves,
# not ahead by a hole that ext4 would make each of them convert: as in
# QEMU, each flush then syncs before the L2 entries that point past
# the durable end of the file, and after them.
s2=$(syncs_for 2 cache=none)
s12=$(syncs_for 12 cache=none)
echo "allocating rounds, cache=none: 2 flushes -> $s2 fdatasyncs, 12 flushes -> $s12"
[ $((s12 - s2)) -eq 20 ] ||
  fail "cache=none: 10 more flushes cost $((s12 - s2)) fdatasyncs, not 20"

# Lazy refcounts: one fdatasync per flush however much a flush
# allocates (the dirty bit is made durable once, at the first
# allocating write), where the reserve covers at most 4 MiB: 128
# writes of 64 KiB between flushes cost two without lazy refcounts.
s2=$(syncs_for 2 "" on 128)
s12=$(syncs_for 12 "" on 128)
echo "allocating rounds of 8 MiB, lazy refcounts: 2 flushes -> $s2 fdatasyncs, 12 flushes -> $s12"
[ $((s12 - s2)) -eq 10 ] ||
  fail "lazy refcounts: 10 more flushes cost $((s12 - s2)) fdatasyncs, not 10"
# With cache=none still two, for the file's end: QEMU syncs once, and a
# crash can then leave L2 entries pointing past the durable end of the
# file (corruption to qemu-img check, and clusters that QEMU's repair
# does not count).
s2=$(syncs_for 2 cache=none on)
s12=$(syncs_for 12 cache=none on)
echo "allocating rounds, lazy refcounts, cache=none: 2 flushes -> $s2 fdatasyncs, 12 flushes -> $s12"
[ $((s12 - s2)) -eq 20 ] ||
  fail "lazy refcounts, cache=none: 10 more flushes cost $((s12 - s2)) fdatasyncs, not 20"

# Lazy refcounts: allocating writes and flushes write no refcount
# block (the dirty bit covers a crash, as in QEMU); the clean close
# writes it once.
lazy=$tmp/lazy.qcow2
qemu-img create -q -f qcow2 -o lazy_refcounts=on,cluster_size=64k "$lazy" 1G
block=$(/usr/bin/python3 -c '
import struct, sys
f = open(sys.argv[1], "rb")
f.seek(48)
table = struct.unpack(">Q", f.read(8))[0]
f.seek(table)
print(struct.unpack(">Q", f.read(8))[0])' "$lazy")
strace -f -y -e trace=pwrite64,pwritev -o "$trace" \
  nbdkit -U - qcow2 "$lazy" --run 'nbdsh -u "$uri" -c "
for f in range(4):
    for i in range(16):
        h.pwrite(b\"L\" * 4096, (f * 16 + i) * 1048576)
    h.flush()
"'
block_writes=$(grep -cE "pwrite(64|v)\([0-9]*<$lazy>, .*, $block$at_offset" "$trace" || true)
echo "lazy refcounts: 4 flushes of allocating writes, $block_writes write(s) of the refcount block at $block"
[ "$block_writes" -eq 1 ] ||
  fail "lazy refcounts: the refcount block was written $block_writes times, not once (at close)"
qemu-img check -q "$lazy" || fail "qemu-img check of the lazy image"
qemu-io -f qcow2 -c 'read -P 0x4c 62914560 4096' "$lazy" >/dev/null ||
  fail "lazy refcounts: a write reads wrong"
