#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Clients' zero, trim, FUA writes and flushes while the stream runs
# behave as without it: what the guest reads right after them (a copy
# taken while the stream still runs) is what it reads once the stream
# has ended and the chain is gone; the stream copies nothing over a
# range a client zeroed or trimmed, and its total shrinks by what the
# clients took over: the description's total drops below the start's,
# and the end notice's bytes copied and taken over add up to it.
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
# The start's count first (the whole base), then the clients.
for i in $(seq 100); do
  grep -q "stream: started:" "$tmp/s.log" && break
  sleep 0.1
done
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
sleep 1.5                       # a count again, after a step
d=$(stream_description s)
case "$d" in
  "streaming: "*", "*" of "[0-9]*" MiB"*) ;;
  *) fail "description while streaming: $d" ;;
esac
started=$(sed -n 's/.*started: \([0-9]*\) bytes.*/\1/p' "$tmp/s.log")
[ "$started" = $((32 << 20)) ] || fail "started with $started bytes to copy"
total=$(echo "$d" | sed -n 's/.* of \([0-9.]*\) MiB.*/\1/p')
[ "${total%%.*}" -lt 32 ] 2>/dev/null ||
  fail "the total did not shrink with the clients' requests: $d"
wait_streamed s > /dev/null
stop_server s
copied=$(sed -n 's/.*done: \([0-9]*\) bytes copied.*/\1/p' "$tmp/s.log")
other=$(sed -n "s/.*clients' writes and trims took over the other \([0-9]*\) bytes counted at the start.*/\1/p" "$tmp/s.log")
[ -n "$copied" ] && [ -n "$other" ] && [ $((copied + other)) = "$started" ] ||
  fail "the end notice does not add up to the start's: $(cat "$tmp/s.log")"
qemu-img check -q "$top" || fail "qemu-img check after the stream"
qemu-img info "$top" | grep -q "backing file" && fail "still a backing file"
qemu-img compare -q -f qcow2 -F raw "$top" "$tmp/expected.raw" ||
  fail "the stream changed what the clients' requests left"
cmp -n $((1 << 20)) -i $((8 << 20)):0 "$tmp/expected.raw" /dev/zero ||
  fail "the zeroed range does not read as zeros"
echo OK
