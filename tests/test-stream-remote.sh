#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# stream=true from remote bases, and faults: a raw base served over NBD
# with a delay on every read (once detached, the base server may go);
# the base server killed mid-stream and started again (the job retries
# with a notice each time, clients go on reading what the top holds,
# the job ends once the server is back), or stalled.  Each ends with
# qemu-img check, info and compare against the chain as it was.  A base
# on a web server: test-stream-remote-http.sh; no space left for the
# top: test-stream-nospc.sh.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo nbdsh
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

base=$tmp/base.raw
stream_raw_base "$base"

# 1. NBD, with a delay: then served with the base server gone.
nbd_server base -r --filter=delay file "$base" delay-read=20ms
top=$tmp/nbd.qcow2
qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$tmp/base.sock" -F raw "$top"
qio "$top" 'write -P 0x31 1M 64k'
cp "$base" "$tmp/nbd.expected"
QIO_FMT=raw qio "$tmp/nbd.expected" 'write -P 0x31 1M 64k'
stream_serve nbd qcow2 "$top" stream=true
wait_streamed nbd > /dev/null
grep -q "its backing file is now none" "$tmp/nbd.log" ||
  fail "no notice of the detach: $(cat "$tmp/nbd.log")"
stop_server base
nbdsh -u "nbd+unix:///?socket=$tmp/nbd.sock" \
  -c 'assert h.pread(4096, 21 << 20) == b"\x12" * 4096' ||
  fail "a read after the detach needs the base server"
stop_server nbd
qemu-img check -q "$top" || fail "qemu-img check (NBD base)"
qemu-img info "$top" | grep -q "backing file" && fail "still a backing file"
qemu-img compare -q -f qcow2 -F raw "$top" "$tmp/nbd.expected" ||
  fail "the top does not read as the chain did (NBD base)"

# 2. The base server killed mid-stream, started again.
nbd_server base -r --filter=delay file "$base" delay-read=300ms
top=$tmp/kill.qcow2
qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$tmp/base.sock" -F raw "$top"
qio "$top" 'write -P 0x31 1M 64k'
stream_serve kill qcow2 "$top" stream=true remote-timeout=2
sleep 1
kill -9 "$(cat "$tmp/base.pid")"
for i in $(seq 100); do
  grep -q "failed .*retrying in" "$tmp/kill.log" && break
  sleep 0.1
done
grep -q "failed .*retrying in" "$tmp/kill.log" ||
  fail "no notice of the retry: $(cat "$tmp/kill.log")"
case "$(stream_description kill)" in
  *"waiting for the backing chain"*|"streaming: "*) ;;
  *) fail "description with the base down: $(stream_description kill)" ;;
esac
nbdsh -u "nbd+unix:///?socket=$tmp/kill.sock" \
  -c 'assert h.pread(4096, 1 << 20) == b"\x31" * 4096' ||
  fail "a read of what the top holds, with the base down"
sleep 2
nbd_server base -r file "$base"
d=$(wait_streamed kill 120)
[ "$d" = "streamed: no longer depends on its backing chain" ] ||
  fail "after the base came back: $d; $(cat "$tmp/kill.log")"
stop_server kill
cp "$base" "$tmp/kill.expected"
QIO_FMT=raw qio "$tmp/kill.expected" 'write -P 0x31 1M 64k'
qemu-img check -q "$top" || fail "qemu-img check (base killed)"
qemu-img compare -q -f qcow2 -F raw "$top" "$tmp/kill.expected" ||
  fail "the top does not read as the chain did (base killed)"
stop_server base

# 3. The base server stalled (SIGSTOP) past remote-timeout=, then on.
nbd_server base -r --filter=delay file "$base" delay-read=300ms
top=$tmp/stall.qcow2
qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$tmp/base.sock" -F raw "$top"
stream_serve stall qcow2 "$top" stream=true remote-timeout=2
sleep 1
kill -STOP "$(cat "$tmp/base.pid")"
for i in $(seq 100); do
  grep -q "failed .*retrying in" "$tmp/stall.log" && break
  sleep 0.1
done
grep -q "failed .*retrying in" "$tmp/stall.log" ||
  fail "no notice of the retry with the base stalled: $(cat "$tmp/stall.log")"
kill -CONT "$(cat "$tmp/base.pid")"
d=$(wait_streamed stall 120)
[ "$d" = "streamed: no longer depends on its backing chain" ] ||
  fail "after the base went on: $d; $(cat "$tmp/stall.log")"
stop_server stall
qemu-img check -q "$top" || fail "qemu-img check (base stalled)"
qemu-img compare -q -f qcow2 -F raw "$top" "$base" ||
  fail "the top does not read as the chain did (base stalled)"
stop_server base

echo OK
