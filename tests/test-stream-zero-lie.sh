#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# stream=true over a base whose server claims zeros over data
# (bad-nbd-server.py's zero mode: block status says the whole export
# is a hole that reads as zeros, reads return the data): the stream
# copies what the chain reads, not what block status claims, so that
# once detached the image reads as the chain did (compared byte for
# byte with the server's content, with qemu-img compare).  The same
# through the qcow2 filter's overlay over nbdkit's nbd plugin.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo nbdsh /usr/bin/python3
requires_nbdkit_plugin nbd
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

/usr/bin/python3 "${srcdir:-.}/bad-nbd-server.py" "$tmp/port" &
servers+=("$!")
for i in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(cat "$tmp/port") || fail "bad-nbd-server.py did not start"

# The model: the server's 4 MiB, with what top holds written over it.
/usr/bin/python3 -c '
import sys
pattern = bytes((i * 7 + 1) & 255 for i in range(256))
sys.stdout.buffer.write(pattern * (16384))' > "$tmp/server.raw"
cp "$tmp/server.raw" "$tmp/expected.raw"
QIO_FMT=raw qio "$tmp/expected.raw" 'write -P 0x31 1M 64k'

top=$tmp/top.qcow2
qemu-img create -q -f qcow2 -u -b "nbd://127.0.0.1:$port/zero" -F raw "$top" 4M
qio "$top" 'write -P 0x31 1M 64k'
# The lie is told: the chain's block status says zeros at 0.
nbdkit -U - qcow2 "$top" --run 'nbdinfo --map "$uri"' > "$tmp/map" ||
  fail "nbdinfo --map"
grep -Eq "^ +0 +[0-9]+ +3 +hole,zero" "$tmp/map" ||
  fail "the server does not claim zeros: $(cat "$tmp/map")"

stream_serve s qcow2 "$top" stream=true
d=$(wait_streamed s)
[ "$d" = "streamed: no longer depends on its backing chain" ] ||
  fail "the stream ended otherwise: $d; $(cat "$tmp/s.log")"
stop_server s
qemu-img info "$top" | grep -q "backing file" && fail "still a backing file"
qemu-img check -q "$top" || fail "qemu-img check after the stream"
qemu-img compare -q -f qcow2 -F raw "$top" "$tmp/expected.raw" ||
  fail "the image does not read as the chain did: the ZERO claim was trusted"

# The filter: its plugin below (nbdkit's nbd plugin) passes the lie on.
ov=$tmp/ov.qcow2
stream_serve f --filter=qcow2 nbd uri="nbd://127.0.0.1:$port/zero" \
  qcow2-overlay="$ov" qcow2-overlay-stream=true
d=$(wait_streamed f)
[ "$d" = "streamed: no longer depends on its backing chain" ] ||
  fail "the filter's stream ended otherwise: $d; $(cat "$tmp/f.log")"
stop_server f
qemu-img check -q "$ov" || fail "qemu-img check of the filter's FILE"
qemu-img compare -q -f qcow2 -F raw "$ov" "$tmp/server.raw" ||
  fail "the filter's FILE does not read as the plugin's disk"
echo OK
