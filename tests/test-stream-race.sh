#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Clients writing while the stream copies the same clusters: two
# connections write (8 requests in flight each) and a third reads and
# sends cache requests (overlay-race.py) into a top image whose base is
# served over NBD with a delay on every read, so that the stream's
# steps wait on the base while the writes come.  Reads see only the
# base's bytes or a writer's; once the stream has ended the top holds
# exactly what was written over the base (the stream never wrote older
# data over a client's), passes qemu-img check and has no backing
# file.  The base's holes are read too (compared, not trusted): all
# 64 MiB at 2 MiB/s.  With 64 KiB clusters, and with extended L2
# entries (writes of subclusters, the rest of their clusters copied by
# the stream).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdinfo /usr/bin/python3
requires_python_nbd
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/overlay-functions.sh"
source "${srcdir:-.}/stream-functions.sh"
race="$(cd "${srcdir:-.}" && pwd)/overlay-race.py"

base=$tmp/base.raw
make_base "$base" $((64 << 20))
nbd_server base -r --filter=delay file "$base" delay-read=50ms

# race NAME CLUSTER CREATE-OPTS SEED
race ()
{
  local top=$tmp/$1.qcow2
  qemu-img create -q -f qcow2 -o "$3" \
    -b "nbd+unix:///?socket=$tmp/base.sock" -F raw "$top"
  stream_serve "$1" qcow2 "$top" stream=true stream-rate=2M
  d=$(stream_description "$1")
  /usr/bin/python3 "$race" "nbd+unix:///?socket=$tmp/$1.sock" "$base" "$4" \
    300 "$tmp/$1.expected" "$2" || fail "$1: the clients during the stream"
  wait_streamed "$1" > /dev/null
  stop_server "$1"
  grep -q "no longer depends on" "$tmp/$1.log" ||
    fail "$1: not detached: $(cat "$tmp/$1.log")"
  # A race only if the clients wrote while the stream ran: it started
  # first, and found part of what it was to copy written by them.
  case "$d" in
    "streaming: "*) ;;
    *) fail "$1: the stream was not running when the clients started: $d" ;;
  esac
  total=$(sed -n 's/.*started: \([0-9]*\) bytes.*/\1/p' "$tmp/$1.log")
  copied=$(sed -n 's/.*done: \([0-9]*\) bytes copied.*/\1/p' "$tmp/$1.log")
  [ "$copied" -lt "$total" ] ||
    fail "$1: the stream copied all ($copied of $total): the clients came late"
  qemu-img check -q "$top" || fail "$1: qemu-img check"
  qemu-img info "$top" | grep -q "backing file" && fail "$1: still a backing file"
  qemu-img compare -q -f qcow2 -F raw "$top" "$tmp/$1.expected" ||
    fail "$1: the top does not hold what was written over the base"
}

race std 65536 cluster_size=64k 1
race extl2 131072 cluster_size=128k,extended_l2=on 2
echo OK
