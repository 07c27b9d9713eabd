#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A planned restart of the NBD server of a backing file (SIGTERM: it
# answers ESHUTDOWN on the connections it has, and exits once its
# clients leave) costs no request: what our idle connections are asked
# next goes to the new server, without an error, and we leave the old
# one.  A server gone for good: said once.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
source "${srcdir:-.}/remote-functions.sh"

base=$tmp/base.raw
qemu-img create -q -f raw "$base" 32M
QIO_FMT=raw qio "$base" 'write -P 0x11 0 32M'
# Slow reads: the requests overlap, and several connections are made.
nbd_server base -r --filter=delay file "$base" delay-read=100ms
ovl=$tmp/ovl.qcow2
qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$tmp/base.sock" -F raw "$ovl"
qio "$ovl" 'write -P 0x22 0 1M'
sock=$tmp/q.sock
nbdkit -f -U "$sock" qcow2 "$ovl" 2> "$tmp/q.err" &
q=$!
servers+=("$q")
wait_socket "$sock" "$q" || fail "nbdkit did not start: $(cat "$tmp/q.err")"

# reads FIRST: 8 reads of 64 KiB at once, 2 MiB apart from FIRST MiB.
reads ()
{
  nbdsh -u "nbd+unix:///?socket=$sock" -c "
bufs = [nbd.Buffer(65536) for i in range(8)]
for i, b in enumerate(bufs):
    h.aio_pread(b, ($1 + 2 * i) << 20)
while h.aio_in_flight() > 0:
    h.poll(-1)
assert all(b.to_bytearray() == bytearray([0x11]) * 65536 for b in bufs)
"
}
reads 2 || fail "reads before the restart: $(cat "$tmp/q.err")"
# Distinct sockets: a connection to the base holds two descriptors.
conns=$(ls -l "/proc/$q/fd" | grep -o 'socket:\[[0-9]*\]' | sort -u | wc -l)

old=$(cat "$tmp/base.pid")
kill -TERM "$old"
nbd_server base -r --filter=delay file "$base" delay-read=100ms
reads 3 || fail "reads after the restart failed: $(cat "$tmp/q.err")"
reads 2 || fail "reads after the restart failed: $(cat "$tmp/q.err")"
! grep -i "error" "$tmp/q.err" || fail "errors said for a planned restart"
for i in $(seq 50); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$old" 2>/dev/null || fail "the old server still waits for us"
# The base serves multi-conn and the reads overlapped: besides the
# listening socket, several connections to the base were made, so the
# restart was met by more than one idle connection.
[ "$conns" -ge 3 ] ||
  fail "$conns sockets before the restart: the overlapping reads made one connection to the base or none"

# The server gone for good: the requests fail, and the failure to
# connect is said once, not once a request.
stop_server base
cp "$tmp/q.err" "$tmp/q.err.before"
! reads 4 2>/dev/null || fail "reads succeeded with no server"
n=$(diff "$tmp/q.err.before" "$tmp/q.err" | grep -c "cannot connect") || true
[ "$n" -eq 1 ] || fail "the failure to connect said $n times: $(cat "$tmp/q.err")"
