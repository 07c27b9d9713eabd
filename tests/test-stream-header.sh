#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What a stream leaves in the header, as QEMU's block-stream leaves it:
# after a full stream no backing format extension (a header dump of
# the extensions; v3 and v2 images); after stream-base= onto a raw base
# below a qcow2 layer, the extension says raw, and the export
# description says "now backed by" the base.  stream-base=,
# stream-rate= and stream-detach= (and the filter's
# qcow2-overlay-stream-*) without stream=true are refused, naming it.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo /usr/bin/python3
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

# exts IMG: the header extensions' types (hex) and, for the backing
# format, its text: one a line.
exts ()
{
  /usr/bin/python3 - "$1" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read(65536)
version = struct.unpack(">I", d[4:8])[0]
off = struct.unpack(">I", d[100:104])[0] if version >= 3 else 72
while True:
    t, n = struct.unpack(">II", d[off:off + 8])
    if t == 0:
        break
    print("%#x" % t, d[off + 8:off + 8 + n].decode() if t == 0xe2792aca else "")
    off += 8 + ((n + 7) & ~7)
PY
}

# 1. A full stream (v3, then v2): the extension is gone.
for compat in 1.1 0.10; do
  d=$tmp/$compat
  mkdir -p "$d"
  qemu-img create -q -f qcow2 -o compat=$compat "$d/base.qcow2" 4M
  qio "$d/base.qcow2" 'write -P 0x11 0 1M'
  qemu-img create -q -f qcow2 -o compat=$compat -b base.qcow2 -F qcow2 \
    "$d/top.qcow2"
  qio "$d/top.qcow2" 'write -P 0x31 2M 64k'
  cp "$d/top.qcow2" "$d/orig.qcow2"
  exts "$d/top.qcow2" > "$tmp/exts"
  grep -q "^0xe2792aca qcow2$" "$tmp/exts" ||
    fail "$compat: no backing format extension to start with"
  stream_serve s$compat qcow2 "$d/top.qcow2" stream=true
  wait_streamed s$compat > /dev/null
  stop_server s$compat
  check_streamed "$d/top.qcow2" "$d/orig.qcow2" ""
  exts "$d/top.qcow2" > "$tmp/exts"
  grep -q "^0xe2792aca" "$tmp/exts" &&
    fail "$compat: the backing format extension is left: $(cat "$tmp/exts")"
  [ $compat = 0.10 ] || grep -q "^0x6803f857" "$tmp/exts" ||
    fail "$compat: the feature name table went: $(cat "$tmp/exts")"
done

# 2. stream-base= onto a raw base: top backs onto it, as raw.
d=$tmp/b
mkdir -p "$d"
qemu-img create -q -f raw "$d/base.raw" 4M
QIO_FMT=raw qio "$d/base.raw" 'write -P 0x11 0 1M'
qemu-img create -q -f qcow2 -b base.raw -F raw "$d/mid.qcow2"
qio "$d/mid.qcow2" 'write -P 0x21 1M 1M'
qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 "$d/top.qcow2"
cp "$d/top.qcow2" "$d/orig.qcow2"
stream_serve b qcow2 "$d/top.qcow2" stream=true stream-base=base.raw
desc=$(wait_streamed b)
[ "$desc" = "streamed: now backed by base.raw" ] ||
  fail "description after stream-base=: $desc"
stop_server b
qemu-img check -q "$d/top.qcow2" || fail "qemu-img check after stream-base="
qemu-img info --output=json "$d/top.qcow2" > "$tmp/info"
grep -q '"backing-filename": "base.raw"' "$tmp/info" ||
  fail "backing file after stream-base=: $(cat "$tmp/info")"
grep -q '"backing-filename-format": "raw"' "$tmp/info" ||
  fail "backing format after stream-base=: $(cat "$tmp/info")"
exts "$d/top.qcow2" > "$tmp/exts"
[ "$(grep -c "^0xe2792aca" "$tmp/exts")" = 1 ] &&
  grep -q "^0xe2792aca raw$" "$tmp/exts" ||
  fail "the extensions after stream-base=: $(cat "$tmp/exts")"
qemu-img compare -q -f qcow2 -F qcow2 "$d/top.qcow2" "$d/orig.qcow2" ||
  fail "the image does not read as the chain did after stream-base="

# 3. The companions alone: refused, naming stream=true.
for kv in stream-base=base.raw stream-rate=1M stream-detach=false; do
  expect_refused "^nbdkit: error: ${kv%%=*}= needs stream=true\$" \
    qcow2 "$d/orig.qcow2" "$kv"
done
expect_refused "stream-rate= needs stream=true" \
  qcow2 "$d/orig.qcow2" stream=false stream-rate=1M
expect_refused "qcow2-overlay-stream-detach= needs qcow2-overlay-stream=true" \
  --filter=qcow2 memory 4M qcow2-overlay="$tmp/ovl.qcow2" \
  qcow2-overlay-stream-detach=false
expect_refused "qcow2-overlay-stream-rate= needs qcow2-overlay-stream=true" \
  --filter=qcow2 memory 4M qcow2-overlay="$tmp/ovl.qcow2" \
  qcow2-overlay-stream-rate=1M
echo OK
