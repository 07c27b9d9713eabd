#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# stream-base= onto a raw base, in a 64 KiB-cluster image whose first
# backing format extension is empty and whose next extension ends at
# byte 4096 (a second one, "qcow2", follows: the last one counts, so
# the image opens).  Writing "raw" in the empty one's place grows the
# list past the 4 KiB the detach rewrites: it once copied 8 bytes past
# its buffer.  The stream keeps the link instead, saying so; nbdkit
# lives on, and the image reads as the chain did and checks clean.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo /usr/bin/python3
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

d=$tmp/c
mkdir -p "$d"
qemu-img create -q -f raw "$d/base.raw" 4M
QIO_FMT=raw qio "$d/base.raw" 'write -P 0x11 0 1M'
qemu-img create -q -f qcow2 -o cluster_size=64k,compat=1.1 \
  -b base.raw -F raw "$d/mid.qcow2"
qio "$d/mid.qcow2" 'write -P 0x21 1M 1M'
qemu-img create -q -f qcow2 -o cluster_size=64k,compat=1.1 \
  -b mid.qcow2 -F qcow2 "$d/top.qcow2"
qio "$d/top.qcow2" 'write -P 0x31 2M 64k'
# The extensions: empty format, unknown (0x12345678) to byte 4096,
# format "qcow2", end mark; the backing name at 8192.
/usr/bin/python3 - "$d/top.qcow2" <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
d = bytearray(f.read(65536))
hl = struct.unpack(">I", d[100:104])[0]
n = 4096 - 4 - (hl + 16)
ext = struct.pack(">II", 0xe2792aca, 0)
ext += struct.pack(">II", 0x12345678, n) + b"\xab" * n + bytes(-n % 8)
ext += struct.pack(">II", 0xe2792aca, 5) + b"qcow2\0\0\0" + bytes(8)
assert hl + len(ext) == 4096 + 24
name = b"mid.qcow2"
d[hl:] = bytes(65536 - hl)
d[hl:hl + len(ext)] = ext
d[8:20] = struct.pack(">QI", 8192, len(name))
d[8192:8192 + len(name)] = name
f.seek(0)
f.write(d)
PY
qemu-img check -q "$d/top.qcow2" || fail "the crafted image does not check"
qemu-img convert -O qcow2 "$d/top.qcow2" "$d/orig.qcow2"

stream_serve x qcow2 "$d/top.qcow2" stream=true stream-base=base.raw
desc=$(wait_streamed x) ||
  { cat "$tmp/x.log" >&2; fail "nbdkit died in the stream"; }
[ "$desc" = "streamed: the backing chain is copied (the link kept)" ] ||
  fail "description after stream-base=: $desc"
stream_description x > /dev/null || fail "nbdkit died after the stream"
stop_server x
grep -q "extension cannot be rewritten in one step: the backing link is kept" \
  "$tmp/x.log" || { cat "$tmp/x.log" >&2; fail "no notice of the link kept"; }
check_streamed "$d/top.qcow2" "$d/orig.qcow2" mid.qcow2
echo OK
