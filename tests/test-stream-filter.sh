#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter's overlay with qcow2-overlay-stream=true: the
# plugin's disk copied into FILE while it is served (the plugin's holes
# read too, becoming zero clusters, not data), then FILE's backing name
# dropped; with
# qcow2-overlay-stream-detach=false the name kept; refused without
# qcow2-overlay= and with nbdkit -r.  Detached, FILE is served alone
# by the same command line.  FILE passes qemu-img check and
# reads as the plugin's disk with the client's write over it.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo nbdsh
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"
source "${srcdir:-.}/overlay-functions.sh"

base=$tmp/base.raw
stream_raw_base "$base"
cp "$base" "$tmp/expected"
QIO_FMT=raw qio "$tmp/expected" 'write -P 0x33 4M 4k'

for detach in true false; do
  ov=$tmp/ov-$detach.qcow2
  stream_serve "$detach" --filter=qcow2 --filter=delay file "$base" \
    delay-read=10ms qcow2-overlay="$ov" qcow2-overlay-backing=base.raw \
    qcow2-overlay-stream=true qcow2-overlay-stream-detach=$detach
  nbdsh -u "nbd+unix:///?socket=$tmp/$detach.sock" \
    -c 'h.pwrite(b"\x33" * 4096, 4 << 20); h.flush()' ||
    fail "a client's write during the stream"
  d=$(wait_streamed "$detach")
  stop_server "$detach"
  qemu-img check -q "$ov" || fail "qemu-img check (detach=$detach)"
  if [ $detach = true ]; then
    [ "$d" = "streamed: no longer depends on its backing chain" ] ||
      fail "description: $d"
    qemu-img info "$ov" | grep -q "backing file" && fail "still a backing file"
    # FILE stands alone now: the same command line serves it alone (a
    # notice says so), the plugin below unused; without
    # qcow2-overlay-stream=true the filter refuses it, and the hint's
    # command serves it.
    nbdkit -U - --filter=qcow2 --filter=delay file "$base" \
      delay-read=10ms qcow2-overlay="$ov" qcow2-overlay-backing=base.raw \
      qcow2-overlay-stream=true qcow2-overlay-stream-detach=$detach \
      --run "nbdcopy \"\$uri\" $tmp/again.raw" 2> "$tmp/again.err" ||
      fail "the same command line after the stream: $(cat "$tmp/again.err")"
    grep -q "notice: $ov: .*served alone, the plugin below unused" \
      "$tmp/again.err" || fail "no notice: $(cat "$tmp/again.err")"
    cmp "$tmp/again.raw" "$tmp/expected" ||
      fail "the streamed FILE served again differs from the disk"
    expect_refused "records no backing file \(a standalone image" \
      --filter=qcow2 file "$base" qcow2-overlay="$ov" \
      qcow2-overlay-backing=base.raw
    cmd=$(sed -n 's/.*hint: "\(nbdkit qcow2 [^"]*\)" serves it.*/\1/p' \
          "$tmp/refused.err")
    [ "$cmd" = "nbdkit qcow2 $ov" ] || fail "hint: $(cat "$tmp/refused.err")"
    $cmd -U - --run "nbdcopy \"\$uri\" $tmp/served.raw" ||
      fail "the hint's $cmd after the stream"
    cmp "$tmp/served.raw" "$tmp/expected" ||
      fail "the streamed FILE served alone differs from the disk"
  else
    qemu-img info "$ov" | grep -q "backing file: base.raw" ||
      fail "the backing name went with qcow2-overlay-stream-detach=false"
  fi
  qemu-img compare -q "json:{\"driver\":\"qcow2\",\"backing\":null,\"file\":{\"driver\":\"file\",\"filename\":\"$ov\"}}" \
    "$tmp/expected" || fail "FILE alone does not hold the disk (detach=$detach)"
  qemu-img map --output=json -f qcow2 "$ov" | /usr/bin/python3 -c '
import json, sys
m = json.load(sys.stdin)
e = next(e for e in m if e["start"] <= 14 << 20 < e["start"] + e["length"])
assert not e["present"] or not e["data"], e
' || fail "the plugin's hole was copied as data"
done

expect_refused "qcow2-overlay-stream= needs qcow2-overlay=FILE" \
  --filter=qcow2 file "$base" qcow2-overlay-stream=true
expect_refused "qcow2-overlay-stream=true copies .* not with nbdkit -r" \
  -r --filter=qcow2 file "$base" qcow2-overlay="$tmp/ro.qcow2" \
  qcow2-overlay-stream=true
echo OK
