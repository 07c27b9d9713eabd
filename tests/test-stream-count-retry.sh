#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# stream=true counts what it has to copy (at the start and after each
# pass) by reading the L2 tables of the layers: over a remote qcow2
# layer that stalls (SIGSTOP) past remote-timeout= while the start's
# count reads them, the count is retried with a notice, as a step is,
# and the job ends once the server goes on (not "stopped at 0%").
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

# mid: small clusters (an L2 table maps 2 MiB: four to read), served
# slowly, so that the count is still reading when the server stalls.
qemu-img create -q -f qcow2 -o cluster_size=4k "$tmp/mid.qcow2" 8M
qio "$tmp/mid.qcow2" 'write -P 0x21 0 4k' 'write -P 0x22 2M 4k' \
  'write -P 0x23 4M 4k' 'write -P 0x24 6M 4k'
nbd_server mid -r --filter=delay file "$tmp/mid.qcow2" delay-read=300ms
top=$tmp/top.qcow2
qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$tmp/mid.sock" -F qcow2 \
  "$top"
stream_serve t qcow2 "$top" stream=true remote-timeout=1
kill -STOP "$(cat "$tmp/mid.pid")"
d=$(stream_description t)
case "$d" in
  "streaming: counting what to copy"*) ;;
  *) kill -CONT "$(cat "$tmp/mid.pid")"
     fail "description before the count: $d; $(cat "$tmp/t.log")" ;;
esac
for i in $(seq 100); do
  grep -q "counting what to copy failed .*retrying in" "$tmp/t.log" && break
  sleep 0.1
done
kill -CONT "$(cat "$tmp/mid.pid")"
grep -q "counting what to copy failed .*retrying in" "$tmp/t.log" ||
  fail "no retry of the count: $(cat "$tmp/t.log")"
d=$(wait_streamed t 60)
[ "$d" = "streamed: no longer depends on its backing chain" ] ||
  fail "after the server went on: $d; $(cat "$tmp/t.log")"
stop_server t
qemu-img check -q "$top" || fail "qemu-img check after the stream"
qemu-img compare -q -f qcow2 -F qcow2 "$top" "$tmp/mid.qcow2" ||
  fail "the image does not read as the chain did"
echo OK
