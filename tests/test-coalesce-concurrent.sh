#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# flush-coalesce under 8 connections that each loop over writes, zeroes
# or trims and a flush (coalesce-clients.py): coalesce-check.py proves
# from the plugin's side (nbdkit's log filter below the coalescer) that
# every client flush and FUA write that succeeded was covered by a
# plugin flush that started after every write it had to cover and ended
# before the client's next request.  With the memory plugin, the qcow2
# plugin, and qcow2 whose flushes take 20 ms; in the last the plugin
# must see far fewer flushes than the clients sent (a plugin whose flush
# takes 0.1 s like a disk's: test-coalesce-slow-flush.sh).
#
# The checker must also fail: on a pipeline that drops flushes (nbdkit's
# fua filter, fuamode=discard), and on a true log doctored so that the
# last plugin flushes seem to start before the last write ended.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img
requires_python_nbd

source "${srcdir:-.}/coalesce-functions.sh"

# Memory plugin and qcow2 plugin, FUA writes turned into flushes.
run memory 8 40 --fua --filter=flush-coalesce --filter=log memory 16M \
  coalesce-fua=true
check_counts memory

img=$tmp/disk.qcow2
qemu-img create -q -f qcow2 "$img" 16M
run qcow2 8 40 --fua --filter=flush-coalesce --filter=log qcow2 "file=$img" \
  coalesce-fua=true
check_counts qcow2
qemu-img check -q "$img" || fail "qemu-img check $img"

# qcow2 on a disk whose flush takes 20 ms (the latency filter below the
# log): the eight clients share most plugin flushes.
qemu-img create -q -f qcow2 "$img" 16M
run qcow2-slow 8 10 "" --filter=flush-coalesce --filter=log \
  --filter=latency qcow2 "file=$img" latency-flush=20ms
check_counts qcow2-slow
received=$(summary qcow2-slow flushes) issued=$(summary qcow2-slow plugin_flushes)
[ $((issued * 2)) -lt "$received" ] ||
  fail "qcow2, slow flush: $issued plugin flushes for $received client flushes"
qemu-img check -q "$img" || fail "qemu-img check $img"

# The checker fails where flushes do not reach the plugin.
timeout -k 10 120 nbdkit -U - --filter=fua --filter=log memory 16M \
  fuamode=discard logfile="$log" \
  --run '/usr/bin/python3 "$clients" "$uri" "$client_log" 8 10' ||
  fail "fuamode=discard: the clients failed"
if /usr/bin/python3 "$checker" "$log" "$client_log" > "$tmp/discard.sum"; then
  cat "$tmp/discard.sum"
  fail "the checker passed a pipeline that drops every flush"
fi
head -n3 "$tmp/discard.sum"

# The checker fails on the memory run's log doctored so that the plugin
# flushes after the last write's return seem to start just before it.
run memory2 8 20 "" --filter=flush-coalesce --filter=log memory 16M
/usr/bin/python3 - "$log" "$tmp/doctored.log" <<'EOF'
import sys
lines = open(sys.argv[1]).read().splitlines(keepends=True)
flushes = [i for i, l in enumerate(lines) if " Flush id=" in l]
last = max(i for i, l in enumerate(lines[:flushes[-1]])
           if " ...Write id=" in l or " ...Zero id=" in l or " ...Trim id=" in l)
moved = [lines[i] for i in flushes if i > last]
rest = [l for i, l in enumerate(lines) if not (i in flushes and i > last)]
out = rest[:last] + moved + rest[last:]
open(sys.argv[2], "w").writelines(out)
print("moved %d flush starts before line %d" % (len(moved), last + 1))
EOF
if /usr/bin/python3 "$checker" "$tmp/doctored.log" "$client_log" > "$tmp/doctored.sum"; then
  cat "$tmp/doctored.sum"
  fail "the checker passed a log where a flush started before a write it covered ended"
fi
head -n3 "$tmp/doctored.sum"
