#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Clients' zero, trim, FUA writes and flushes while the stream runs
# behave as without it: what the guest reads right after them (a copy
# taken while the stream still runs) is what it reads once the stream
# has ended and the chain is gone; the stream copies nothing over a
# range a client zeroed or trimmed.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo nbdsh nbdcopy
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

base=$tmp/base.raw
stream_raw_base "$base"
top=$tmp/top.qcow2
qemu-img create -q -f qcow2 -b "$base" -F raw "$top"
# Slow enough that the clients' requests come before it gets there.
stream_serve s qcow2 "$top" stream=true stream-rate=2M
uri="nbd+unix:///?socket=$tmp/s.sock"
nbdsh -u "$uri" -c '
h.zero(2 << 20, 8 << 20, nbd.CMD_FLAG_NO_HOLE)      # data below, zeroed
h.zero(1 << 20, 21 << 20)                           # zeroed, may trim
h.trim(1 << 20, 10 << 20)                           # trimmed
h.pwrite(b"\x44" * 65536, 22 << 20, nbd.CMD_FLAG_FUA)
h.pwrite(b"\x45" * 4096, (23 << 20) + 512)
h.flush()
' || fail "the clients' requests during the stream"
case "$(stream_description s)" in
  "streaming: "*) ;;
  *) fail "the stream ended before the clients' requests: $(stream_description s)" ;;
esac
nbdcopy "$uri" "$tmp/expected.raw"
wait_streamed s > /dev/null
stop_server s
qemu-img check -q "$top" || fail "qemu-img check after the stream"
qemu-img info "$top" | grep -q "backing file" && fail "still a backing file"
qemu-img compare -q -f qcow2 -F raw "$top" "$tmp/expected.raw" ||
  fail "the stream changed what the clients' requests left"
cmp -n $((1 << 20)) -i $((8 << 20)):0 "$tmp/expected.raw" /dev/zero ||
  fail "the zeroed range does not read as zeros"
echo OK
