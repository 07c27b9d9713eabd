#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A header whose extensions or backing file name lie past the first
# 4 KiB of the header cluster (the engine reads only that much of a
# local file first): they are read and used, as QEMU reads them.  An
# unknown extension of 5000 bytes before qemu-img's own ones, or the
# backing file's name moved to 8 KiB, or both; the image's data then
# equals what qemu-img convert reads of it.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdkit nbdcopy /usr/bin/python3

base=$tmp/base.qcow2
qemu-img create -q -f qcow2 "$base" 4M
qemu-io -f qcow2 -c 'write -P 0x5a 0 1M' -c 'write -P 0x3c 3M 64k' \
  "$base" >/dev/null

# far.py IMG EXTENSION NAME_AT: rebuilds the header cluster of IMG after
# its fixed fields: an unknown extension of EXTENSION bytes (0: none)
# first, then the image's own extensions and end marker, and the backing
# file's name at NAME_AT (0: right after the end marker).
cat > "$tmp/far.py" <<'EOF'
import struct, sys
img, ext_len, name_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(img, "r+b") as f:
    head = bytearray(f.read(65536))
    hlen = struct.unpack_from(">I", head, 100)[0]
    boff, bsize = struct.unpack_from(">QI", head, 8)
    name = bytes(head[boff:boff + bsize])
    off, own = hlen, b""
    while True:
        t, l = struct.unpack_from(">II", head, off)
        end = off + 8 + (l + 7) // 8 * 8
        own += bytes(head[off:end])
        off = end
        if t == 0:
            break
    exts = b""
    if ext_len:
        exts = struct.pack(">II", 0x12345678, ext_len) + \
            b"\xab" * ((ext_len + 7) // 8 * 8)
    exts += own
    at = name_at or hlen + len(exts)
    assert hlen + len(exts) <= at and at + len(name) <= 65536
    head[hlen:] = bytes(65536 - hlen)
    head[hlen:hlen + len(exts)] = exts
    head[at:at + len(name)] = name
    struct.pack_into(">Q", head, 8, at)
    f.seek(0)
    f.write(head)
EOF

for layout in "5000 0" "0 8192" "5000 12288" "70 4090"; do
  ovl=$tmp/ovl.qcow2
  rm -f "$ovl"
  qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$ovl"
  qemu-io -f qcow2 -c 'write -P 0x77 2M 8k' "$ovl" >/dev/null
  /usr/bin/python3 "$tmp/far.py" "$ovl" $layout
  info=$(qemu-img info --output=json "$ovl")
  grep -q '"backing-filename": "'"$base"'"' <<< "$info" ||
    fail "layout $layout: qemu-img does not see the backing file: $info"
  grep -q '"backing-filename-format": "qcow2"' <<< "$info" ||
    fail "layout $layout: qemu-img does not see the backing format: $info"
  qemu-img convert -f qcow2 -O raw "$ovl" "$tmp/want.raw"
  rm -f "$tmp/got.raw"
  nbdkit -U - qcow2 "file=$ovl" --run 'nbdcopy "$uri" '"$tmp/got.raw" ||
    fail "layout $layout: nbdkit could not serve the image"
  cmp "$tmp/want.raw" "$tmp/got.raw" ||
    fail "layout $layout: data differs from qemu-img convert's"
done
