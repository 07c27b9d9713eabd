#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The read-ahead of a backing file on remote storage fetches what a
# reader does not ask for only for a sequential run, and no more than a
# slow link delivers in a short time: one small read (the first
# sector's) fetches no more than it asked for, two adjacent reads no
# megabytes, while a long sequential run is still read in few large
# requests.  A reader with many sequential requests in flight is not
# throttled: they reach the base together (and read the right bytes).
# Block status of the base is asked in large spans and kept: queries
# in any order cost one request, and the extents are the base's.  What
# the base's server was asked is counted by nbdkit's log filter.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
source "${srcdir:-.}/remote-functions.sh"

base=$tmp/base.raw
qemu-img create -q -f raw "$base" 16M
QIO_FMT=raw qio "$base" 'write -P 0x11 0 16M'
ovl=$tmp/ovl.qcow2
qemu-img create -q -u -f qcow2 -b "nbd+unix:///?socket=$tmp/base.sock" -F raw "$ovl" 16M

# fetched PYTHON [BASE [FILTER PARAM]]: run it against us over the base
# ($base unless given) behind a link of 10 MB/s (or nbdkit's FILTER
# with PARAM); prints "REQUESTS BYTES MOST STATUS": the reads the base
# was asked for, their bytes, the most in flight at once, and the block
# status requests.
fetched ()
{
  rm -f "$tmp/base.log"
  nbd_server base -r --filter=log --filter="${3:-rate}" file "${2:-$base}" \
    "${4:-rate=80M}" logfile="$tmp/base.log"
  nbd_server q qcow2 "$ovl"
  nbdsh --base-allocation -u "nbd+unix:///?socket=$tmp/q.sock" -c "$1" ||
    fail "reading: $1"
  stop_server q
  stop_server base
  /usr/bin/python3 -c '
import re, sys
counts, now, most, status = [], 0, 0, 0
for line in open(sys.argv[1]):
    if " Read id=" in line:
        counts.append(int(re.search(r" count=(0x[0-9a-f]+|[0-9]+)",
                                    line).group(1), 0))
        now += 1
        most = max(most, now)
    elif " ...Read id=" in line:
        now -= 1
    elif " Extents id=" in line:
        status += 1
print(len(counts), sum(counts), most, status)' "$tmp/base.log"
}

read -r n bytes _ < <(fetched 'assert h.pread(512, 0) == b"\x11" * 512')
[ "$bytes" -le 65536 ] || fail "a read of 512 bytes fetched $bytes bytes"

read -r n bytes _ < <(fetched '
for o in (0, 65536):
    assert h.pread(65536, o) == b"\x11" * 65536')
[ "$bytes" -le $((512 << 10)) ] ||
  fail "two adjacent reads of 64 KiB fetched $bytes bytes"

read -r n bytes _ < <(fetched '
for o in range(0, 16 << 20, 65536):
    assert h.pread(65536, o) == b"\x11" * 65536')
[ "$n" -le 64 ] || fail "256 sequential reads of 64 KiB took $n requests"
[ "$bytes" -le $((16 << 20)) ] || fail "reading 16 MiB fetched $bytes bytes"

# Scattered reads, some in short runs (a guest's boot): the base sends
# little more than was read (without read-ahead it sends what was read).
read -r n bytes _ < <(fetched '
import random
r = random.Random(5)
asked = 0
for i in range(100):
    o = r.randrange(4000) * 4096
    for k in range(r.choice([1, 1, 2, 3])):
        c = min(r.choice([4096, 16384, 65536, 131072]), (16 << 20) - o)
        assert h.pread(c, o) == b"\x11" * c
        asked += c
        o += c
open("'"$tmp/asked"'", "w").write(str(asked))')
asked=$(cat "$tmp/asked")
echo "scattered: asked $asked fetched $bytes in $n requests" >&2
[ "$bytes" -le $((asked * 11 / 10)) ] ||
  fail "scattered reads of $asked bytes fetched $bytes bytes"

# 16 sequential requests of 64 KiB in flight at a time over 4 MiB of
# varied data, 5 ms a read: they go out together, each with its bytes,
# and nothing is fetched twice.
export deep=$tmp/deep.raw
/usr/bin/python3 -c '
import random, sys
random.seed(7)
open(sys.argv[1], "wb").write(random.randbytes(4 << 20))' "$deep"
read -r n bytes most _ < <(fetched '
import os
want = open(os.environ["deep"], "rb").read()
bufs, o = {}, 0
while o < len(want) or h.aio_in_flight() > 0:
    while o < len(want) and h.aio_in_flight() < 16:
        bufs[o] = nbd.Buffer(65536)
        h.aio_pread(bufs[o], o)
        o += 65536
    h.poll(-1)
for c, b in bufs.items():
    assert b.to_bytearray() == want[c:c + 65536], "bytes at %d" % c
' "$deep" delay delay-read=5ms)
[ "$most" -ge 4 ] ||
  fail "16 sequential requests in flight reached the base $most at a time"
[ "$bytes" -le $((4 << 20)) ] ||
  fail "reading 4 MiB 16 requests at a time fetched $bytes bytes"

# Block status over a base of 16 extents, asked from the end backwards:
# one request to the base, and the map is the base's (qemu-img map).
sparse=$tmp/sparse.raw
qemu-img create -q -f raw "$sparse" 16M
writes=()
for i in 0 2 4 6 8 10 12 14; do writes+=("write -P 0x22 ${i}M 512K"); done
QIO_FMT=raw qio "$sparse" "${writes[@]}"
read -r _ _ _ status < <(fetched '
ext = []
for o in range(15 << 20, -1, -(1 << 20)):
    h.block_status(65536, o, lambda *args: 0)
h.block_status(16 << 20, 0,
               lambda ctx, o, e, err: ext.extend(e) if ctx == "base:allocation"
               else None)
with open("'"$tmp/q.map"'", "w") as f:
    for i in range(0, len(ext), 2):
        f.write("%d %s\n" % (ext[i], "zero" if ext[i + 1] & 2 else "data"))
' "$sparse")
[ "$status" -le 1 ] ||
  fail "17 block status queries asked the base $status times"
qemu-img map -f raw --output=json "$sparse" | /usr/bin/python3 -c '
import json, sys
for e in json.load(sys.stdin):
    print(e["length"], "zero" if e["zero"] else "data")' > "$tmp/base.map"
[ "$(wc -l < "$tmp/base.map")" -eq 16 ] || fail "the base has not 16 extents"
diff -u "$tmp/base.map" "$tmp/q.map" || fail "the extents differ from the base's"
