#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# stream=true over a local chain base <- mid <- top: everything copied
# into top (the notices and the export description say how far), the
# backing link dropped, qemu-img compare against the chain as it was;
# stream-base= in the middle (top then backs onto it); stream-detach=
# false (all local, the chain kept); extended L2 with subclusters of
# top's own; ranges no layer holds stay unallocated; a read-only start
# refused; SIGKILL mid-stream, then a second start going on from there.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo nbdsh
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

# make_chain DIR [CREATE-OPTS]: base (data, zeros, a hole), mid, top.
make_chain ()
{
  mkdir -p "$1"
  qemu-img create -q -f qcow2 ${2:+-o "$2"} "$1/base.qcow2" 64M
  qio "$1/base.qcow2" 'write -P 0x11 0 8M' 'write -P 0x12 20M 3M' \
    'write -z 40M 4M' 'write -P 0x13 60M 4M'
  qemu-img create -q -f qcow2 ${2:+-o "$2"} -b base.qcow2 -F qcow2 "$1/mid.qcow2"
  qio "$1/mid.qcow2" 'write -P 0x21 4M 2M' 'write -P 0x22 30M 1M' \
    'write -z 61M 1M'
  qemu-img create -q -f qcow2 ${2:+-o "$2"} -b mid.qcow2 -F qcow2 "$1/top.qcow2"
  qio "$1/top.qcow2" 'write -P 0x31 1M 64k' 'write -P 0x32 30M 4k'
  rm -rf "$1.orig"
  cp -a "$1" "$1.orig"
}

# 1. The whole chain, then cut loose.
make_chain "$tmp/a"
stream_serve a qcow2 "$tmp/a/top.qcow2" stream=true
d=$(wait_streamed a)
[ "$d" = "streamed: no longer depends on its backing chain" ] ||
  fail "description at the end: $d"
total0=$(sed -n 's/.*started: \([0-9]*\) bytes.*/\1/p' "$tmp/a.log")
[ -n "$total0" ] || fail "no notice at the start: $(cat "$tmp/a.log")"
grep -q "stream: [1-9][0-9]% copied ([0-9.]* [KM]iB of [0-9.]* MiB)" \
  "$tmp/a.log" || fail "no notice of a tenth: $(cat "$tmp/a.log")"
grep -q "stream: done: [0-9]* bytes copied (.*) in .* s (" "$tmp/a.log" ||
  fail "no end notice: $(cat "$tmp/a.log")"
grep -q 'no longer depends on "mid.qcow2": its backing file is now none' \
  "$tmp/a.log" || fail "no notice of the detach: $(cat "$tmp/a.log")"
# Served from top alone now: the chain may go.
mv "$tmp/a/mid.qcow2" "$tmp/a/mid.gone"
nbdsh -u "nbd+unix:///?socket=$tmp/a.sock" \
  -c 'assert h.pread(4096, 5 << 20) == b"\x21" * 4096' ||
  fail "reading after the detach"
stop_server a
check_streamed "$tmp/a/top.qcow2" "$tmp/a.orig/top.qcow2" ""
# Held by no layer (10M..20M): unallocated still; mid's and base's
# zeros: zero clusters, no data.
qemu-img map --output=json -f qcow2 "$tmp/a/top.qcow2" |
  /usr/bin/python3 -c '
import json, sys
m = json.load(sys.stdin)
def at(o):
    return next(e for e in m if e["start"] <= o < e["start"] + e["length"])
assert not at(12 << 20)["present"], at(12 << 20)
for o in (41 << 20, 61 << 20):
    assert at(o)["present"] and at(o)["zero"] and not at(o)["data"], at(o)
' || fail "top's map after the stream"
total=$(sed -n 's/.*started: \([0-9]*\) bytes.*/\1/p' "$tmp/a.log")

# 2. Started again with the same command line: served, and a notice.
stream_serve a2 qcow2 "$tmp/a/top.qcow2" stream=true
grep -q "stream: the image has no backing file: nothing to stream" \
  "$tmp/a2.log" || fail "no notice on a streamed image: $(cat "$tmp/a2.log")"
nbdsh -u "nbd+unix:///?socket=$tmp/a2.sock" \
  -c 'assert h.pread(4096, 5 << 20) == b"\x21" * 4096' ||
  fail "serving the streamed image again"
stop_server a2

# 3. stream-base=base.qcow2: mid merged into top, which backs onto base.
make_chain "$tmp/b"
stream_serve b qcow2 "$tmp/b/top.qcow2" stream=true stream-base=base.qcow2
wait_streamed b > /dev/null
stop_server b
check_streamed "$tmp/b/top.qcow2" "$tmp/b.orig/top.qcow2" base.qcow2
qemu-img map --output=json -f qcow2 "$tmp/b/top.qcow2" |
  /usr/bin/python3 -c '
import json, sys
m = json.load(sys.stdin)
def at(o):
    return next(e for e in m if e["start"] <= o < e["start"] + e["length"])
assert at(5 << 20)["depth"] == 0, at(5 << 20)
assert at(0)["depth"] == 1, at(0)
' || fail "top's map after the stream down to base"
expect_refused "stream-base=nothere.qcow2 is no layer" \
  qcow2 "$tmp/b.orig/top.qcow2" stream=true stream-base=nothere.qcow2

# 4. stream-detach=false: all in top, the chain kept.
make_chain "$tmp/c"
stream_serve c qcow2 "$tmp/c/top.qcow2" stream=true stream-detach=false
d=$(wait_streamed c)
[ "$d" = "streamed: the backing chain is copied (the link kept)" ] ||
  fail "description with stream-detach=false: $d"
stop_server c
check_streamed "$tmp/c/top.qcow2" "$tmp/c.orig/top.qcow2" mid.qcow2
qemu-img compare -q "json:{\"driver\":\"qcow2\",\"backing\":null,\"file\":{\"driver\":\"file\",\"filename\":\"$tmp/c/top.qcow2\"}}" \
  "$tmp/c.orig/top.qcow2" || fail "top alone does not hold the chain's data"

# 5. Extended L2: top's own subclusters stay, the rest of their
# clusters is filled.
make_chain "$tmp/x" extended_l2=on,cluster_size=128k
qio "$tmp/x/top.qcow2" 'write -P 0x33 4100k 4k' 'write -z 20M 8k'
rm -rf "$tmp/x.orig"; cp -a "$tmp/x" "$tmp/x.orig"
stream_serve x qcow2 "$tmp/x/top.qcow2" stream=true
wait_streamed x > /dev/null
stop_server x
check_streamed "$tmp/x/top.qcow2" "$tmp/x.orig/top.qcow2" ""

# 5b. A disk that ends inside a cluster of extended L2 entries: the
# subclusters past its end are not waited for.
mkdir -p "$tmp/e"
qemu-img create -q -f qcow2 "$tmp/e/base.qcow2" 1000k
qio "$tmp/e/base.qcow2" 'write -P 0x11 0 1000k'
qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=128k \
  -b base.qcow2 -F qcow2 "$tmp/e/top.qcow2"
qio "$tmp/e/top.qcow2" 'write -P 0x22 900k 4k' 'write -P 0x23 10k 4k'
cp -a "$tmp/e" "$tmp/e.orig"
stream_serve e qcow2 "$tmp/e/top.qcow2" stream=true
d=$(wait_streamed e)
[ "$d" = "streamed: no longer depends on its backing chain" ] ||
  fail "a disk ending inside a cluster: $d"
stop_server e
check_streamed "$tmp/e/top.qcow2" "$tmp/e.orig/top.qcow2" ""

# 6. Read-only: refused.
make_chain "$tmp/r"
expect_refused "stream=true copies the backing chain into .*read-only" \
  -r qcow2 "$tmp/r/top.qcow2" stream=true
expect_refused "stream=true copies the backing chain into .*read-only" \
  qcow2 "$tmp/r/top.qcow2" stream=true readonly=true

# 7. SIGKILL mid-stream (slowed down by stream-rate=), then again.
make_chain "$tmp/k"
stream_serve k qcow2 "$tmp/k/top.qcow2" stream=true stream-rate=4M
sleep 3
d=$(stream_description k)
case "$d" in "streaming: "*%*) ;; *) fail "description while streaming: $d" ;; esac
kill -9 "$(cat "$tmp/k.pid")"
sleep 0.5
check_killed "$tmp/k/top.qcow2"
qemu-img compare -q "$tmp/k/top.qcow2" "$tmp/k.orig/top.qcow2" ||
  fail "the image killed mid-stream reads otherwise"
: > "$tmp/k.log"
# repair=leaks: the reserve the kill leaked, reclaimed first.
stream_serve k qcow2 "$tmp/k/top.qcow2" stream=true repair=leaks
wait_streamed k > /dev/null
left=$(sed -n 's/.*started: \([0-9]*\) bytes.*/\1/p' "$tmp/k.log")
[ "$left" -gt 0 ] && [ "$left" -lt "$total" ] ||
  fail "the second start copies $left bytes (of $total): not from where it was"
stop_server k
check_streamed "$tmp/k/top.qcow2" "$tmp/k.orig/top.qcow2" ""
echo OK
