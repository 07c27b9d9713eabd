#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# stream=true from remote bases, and faults: a raw base served over NBD
# with a delay on every read (once detached, the base server may go);
# a base on a web server (range-server.py, read through nbdkit's curl
# plugin); the base server killed mid-stream and started again (the job
# retries with a notice each time, clients go on reading what the top
# holds, the job ends once the server is back); no space left on the
# top's file system (a small tmpfs: the job stops with a notice, the
# image stays consistent, a client's write fails with ENOSPC while its
# reads go on).  Each ends with qemu-img check, info and compare
# against the chain as it was.
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

# 2. HTTP.
if nbdkit curl --version >/dev/null 2>&1; then
  mkdir -p "$tmp/web"
  cp "$base" "$tmp/web/base.raw"
  http_server "$tmp/web"
  top=$tmp/http.qcow2
  qemu-img create -q -f qcow2 -u -b "http://127.0.0.1:$http_port/base.raw" \
    -F raw "$top" 32M
  stream_serve http qcow2 "$top" stream=true
  wait_streamed http > /dev/null
  # The base's helper process (nbdkit's curl plugin, started by libnbd)
  # ended with the detach.
  for i in $(seq 50); do
    pgrep -f "curl.*127.0.0.1:$http_port" > /dev/null || break
    sleep 0.1
  done
  ! pgrep -f "curl.*127.0.0.1:$http_port" > /dev/null ||
    fail "the curl helper still runs after the detach"
  stop_server http
  qemu-img check -q "$top" || fail "qemu-img check (HTTP base)"
  qemu-img info "$top" | grep -q "backing file" && fail "still a backing file"
  qemu-img compare -q -f qcow2 -F raw "$top" "$base" ||
    fail "the top does not read as the chain did (HTTP base)"
else
  echo "$0: no curl plugin: the HTTP base skipped"
fi

# 3. The base server killed mid-stream, started again.
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

# 3b. The base server stalled (SIGSTOP) past remote-timeout=, then on.
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

# 4. No space left: a 2 MiB tmpfs for the top (root only).
if [ "$(id -u)" = 0 ] && mkdir -p "$tmp/small" &&
   mount -t tmpfs -o size=2m tmpfs "$tmp/small" 2>/dev/null; then
  # Servers stopped first (one has the top open), then the mount.
  trap 'for p in "${servers[@]}"; do kill "$p" 2>/dev/null || true; done
        sleep 0.5; umount "$tmp/small" 2>/dev/null || true; rm -rf "$tmp"' EXIT
  top=$tmp/small/top.qcow2
  qemu-img create -q -f qcow2 -b "$base" -F raw "$top"
  stream_serve nospc qcow2 "$top" stream=true
  d=$(wait_streamed nospc)
  case "$d" in *stopped*) ;; *) fail "with no space: $d" ;; esac
  grep -q "no space left for the copy .* the job stops" "$tmp/nospc.log" ||
    fail "no notice of the full disk: $(cat "$tmp/nospc.log")"
  nbdsh -u "nbd+unix:///?socket=$tmp/nospc.sock" \
    -c 'assert h.pread(4096, 21 << 20) == b"\x12" * 4096' ||
    fail "a read with the disk full"
  ! nbdsh -u "nbd+unix:///?socket=$tmp/nospc.sock" \
    -c 'h.pwrite(b"\x44" * (4 << 20), 26 << 20); h.flush()' \
    2> "$tmp/nospc.err" || fail "a write with the disk full succeeded"
  grep -q "No space left on device" "$tmp/nospc.err" ||
    fail "the client's write failed otherwise: $(cat "$tmp/nospc.err")"
  stop_server nospc
  qemu-img check -q "$top" || fail "qemu-img check (no space)"
  qemu-img info "$top" | grep -q "backing file: $base" ||
    fail "the backing link went with the job stopped"
  qemu-img compare -q -f qcow2 -F raw "$top" "$base" ||
    fail "the top does not read as the chain did (no space)"
  kill "${servers[@]}" 2>/dev/null || true
  sleep 0.5
  umount "$tmp/small"
else
  echo "$0: cannot mount a tmpfs: no space case skipped"
fi
echo OK
