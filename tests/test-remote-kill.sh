#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A remote base that fails while served: killed in the middle of a copy
# (the copy fails with EIO at once, nbdkit stays up, what the overlay
# holds is still served and written, a later read succeeds once the
# server is back), stopped (SIGSTOP: reads and block status fail with
# EIO after remote-timeout=, and succeed again once it goes on), and
# shut down while a read waits (it does not wait for us to leave).  The
# overlay passes qemu-img check, and reads as QEMU reads it.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy nbdsh
source "${srcdir:-.}/remote-functions.sh"

base=$tmp/base.raw
qemu-img create -q -f raw "$base" 32M
QIO_FMT=raw qio "$base" 'write -P 0x11 0 32M'
# Slow reads (a second each: the copy, read ahead in windows of 4 MiB,
# takes several), so that the copy is still going when the server dies.
nbd_server base -r --filter=delay file "$base" delay-read=1
ovl=$tmp/ovl.qcow2
qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$tmp/base.sock" -F raw "$ovl"
qio "$ovl" 'write -P 0x22 0 1M'
nbd_server q qcow2 "$ovl" remote-timeout=2
uri="nbd+unix:///?socket=$tmp/q.sock"

# read_ok OFFSET BYTE / read_fails OFFSET: a 4 KiB read through us.
read_ok ()
{
  nbdsh -u "$uri" -c "assert h.pread(4096, $1) == bytes([$2]) * 4096" ||
    fail "the read at $1 failed or read other data"
}
read_fails ()
{
  ! nbdsh -u "$uri" -c "h.pread(4096, $1)" 2> "$tmp/read.err" ||
    fail "the read at $1 succeeded with the base gone"
  grep -q "Input/output error" "$tmp/read.err" ||
    fail "the read at $1: not EIO: $(cat "$tmp/read.err")"
}

# Killed in the middle of a copy.
nbdcopy --requests=4 "$uri" "$tmp/copy.raw" 2> "$tmp/copy.err" &
copy=$!
sleep 1
kill -9 "$(cat "$tmp/base.pid")"
start=$(date +%s)
! wait "$copy" || fail "the copy succeeded with the base killed"
[ $(( $(date +%s) - start )) -lt 10 ] || fail "the copy waited for the dead base"
grep -q "Input/output error" "$tmp/copy.err" ||
  fail "the copy failed otherwise: $(cat "$tmp/copy.err")"
kill -0 "$(cat "$tmp/q.pid")" || fail "nbdkit died with the base"
read_ok 4096 0x22
nbdsh -u "$uri" -c 'h.pwrite(b"\x33" * 65536, 2 << 20); h.flush()' ||
  fail "a whole cluster could not be written with the base gone"
read_fails $((8 << 20))
nbd_server base -r --filter=delay file "$base" delay-read=100ms
read_ok $((8 << 20)) 0x11

# Stopped: no answer, then the timeout, for block status (of a server
# started again, connected by a read, which has asked the base for no
# block status yet) as for reads; going on again, served again.
stop_server q
nbd_server q qcow2 "$ovl" remote-timeout=2
read_ok $((11 << 20)) 0x11
kill -STOP "$(cat "$tmp/base.pid")"
start=$(date +%s)
! nbdsh --base-allocation -u "$uri" \
  -c "h.block_status(65536, 12 << 20, lambda *args: 0)" 2> "$tmp/status.err" ||
  fail "block status succeeded with the base stopped"
grep -q "Input/output error" "$tmp/status.err" ||
  fail "block status: not EIO: $(cat "$tmp/status.err")"
read_fails $((9 << 20))
[ $(( $(date +%s) - start )) -lt 10 ] || fail "remote-timeout=2 took too long"
read_ok 4096 0x22
kill -CONT "$(cat "$tmp/base.pid")"
read_ok $((9 << 20)) 0x11

# Shut down while a read waits: the server answers ESHUTDOWN and waits
# for its clients to leave, which we do.
stop_server base
nbd_server base -r --filter=delay file "$base" delay-read=3
nbdsh -u "$uri" -c "h.pread(4096, 10 << 20)" 2>/dev/null &
sleep 1.5
pid=$(cat "$tmp/base.pid")
kill "$pid"
for i in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$pid" 2>/dev/null || fail "the base server waits for us to leave"
wait || true
nbd_server base -r file "$base"
read_ok $((10 << 20)) 0x11

stop_server q
qemu-img check -q "$ovl" || fail "qemu-img check after the base failed"
qemu-io -f qcow2 -c 'read -P 0x22 0 1M' -c 'read -P 0x33 2M 64k' \
  -c 'read -P 0x11 3M 1M' "$ovl" > "$tmp/qio.out" ||
  { cat "$tmp/qio.out"; fail "qemu-io reads other data"; }
