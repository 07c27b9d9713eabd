#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A header whose extensions or backing file name lie past the first
# 4 KiB of the header cluster (the engine reads only that much of a
# local file first): they are read and used, as QEMU reads them.  An
# unknown extension before qemu-img's own ones (5000 bytes, or sized so
# that the end marker ends at 4096 or starts there, or that qemu-img's
# first one starts there), the backing file's
# name moved to 8 KiB or across 4 KiB, or both; with 64 KiB clusters,
# and with 512-byte and 2 MiB ones (the name past 64 KiB); and with no
# backing file, an external data file's name past 4 KiB.  Each
# image's data equals what qemu-img convert reads of it.  The overlays
# name their qcow2 backing file's format as raw (its bytes as they are):
# an extension left unread would have the format probed, and other
# data read.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdkit nbdcopy /usr/bin/python3

# far.py IMG EXTENSION NAME_AT: rebuilds the header cluster of IMG after
# its fixed fields: an unknown extension of EXTENSION bytes first (0:
# none; "end:N": as long as puts the end marker at offset N; "own:N":
# as long as puts the image's first own extension at N), then the
# image's own extensions and end marker, and the backing file's name at
# NAME_AT (0: right after the end marker).
cat > "$tmp/far.py" <<'EOF'
import struct, sys
img, ext, name_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(img, "r+b") as f:
    head = f.read(112)
    cs = 1 << struct.unpack_from(">I", head, 20)[0]
    f.seek(0)
    head = bytearray(f.read(cs))
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
    if ext.startswith("end:"):
        ext_len = int(ext[4:]) - hlen - 8 - (len(own) - 8)
        assert ext_len > 0 and ext_len % 8 == 0
    elif ext.startswith("own:"):
        ext_len = int(ext[4:]) - hlen - 8
        assert ext_len > 0 and ext_len % 8 == 0
    else:
        ext_len = int(ext)
    exts = b""
    if ext_len:
        exts = struct.pack(">II", 0x12345678, ext_len) + \
            b"\xab" * ((ext_len + 7) // 8 * 8)
    exts += own
    at = name_at or hlen + len(exts)
    assert hlen + len(exts) <= at and at + len(name) <= cs
    head[hlen:] = bytes(cs - hlen)
    head[hlen:hlen + len(exts)] = exts
    if name:
        head[at:at + len(name)] = name
        struct.pack_into(">Q", head, 8, at)
    f.seek(0)
    f.write(head)
EOF

base=$tmp/base.qcow2
qemu-img create -q -f qcow2 "$base" 4M
qemu-io -f qcow2 -c 'write -P 0x5a 0 1M' -c 'write -P 0x3c 3M 64k' \
  "$base" >/dev/null

# same_as_qemu IMG WHAT: nbdkit serves IMG with the data qemu-img
# convert reads of it.
same_as_qemu ()
{
  rm -f "$tmp/got.raw"
  qemu-img convert -f qcow2 -O raw "$1" "$tmp/want.raw"
  nbdkit -U - qcow2 "file=$1" \
    --run 'nbdcopy "$uri" '"$(printf %q "$tmp/got.raw")" ||
    fail "$2: nbdkit could not serve the image"
  cmp "$tmp/want.raw" "$tmp/got.raw" ||
    fail "$2: data differs from qemu-img convert's"
}

# check CLUSTER EXTENSION NAME_AT
check ()
{
  local cs=$1 layout="$1 $2 $3" ovl=$tmp/ovl.qcow2 info
  rm -f "$ovl"
  qemu-img create -q -f qcow2 -o cluster_size="$cs" -b "$base" -F raw \
    "$ovl" 4M
  qemu-io -f qcow2 -c 'write -P 0x77 2M 8k' "$ovl" >/dev/null
  /usr/bin/python3 "$tmp/far.py" "$ovl" "$2" "$3"
  info=$(qemu-img info --output=json "$ovl")
  grep -qF '"backing-filename": "'"$base"'"' <<< "$info" ||
    fail "layout $layout: qemu-img does not see the backing file: $info"
  grep -qF '"backing-filename-format": "raw"' <<< "$info" ||
    fail "layout $layout: qemu-img does not see the backing format: $info"
  same_as_qemu "$ovl" "layout $layout"
}

check 64k 5000 0
check 64k 0 8192
check 64k 5000 12288
check 64k 70 4090
check 64k end:4088 0
check 64k end:4096 0
check 64k own:4096 0
check 512 0 0
check 512 0 300
check 2M 5000 0
check 2M 0 70000

# No backing file: then the extensions alone reach past 4 KiB (with a
# name, the name after them does too).  An external data file's name is
# in one: left unread, the image is refused or read from itself.
for ext in 5000 end:4096 own:4096; do
  img=$tmp/df.qcow2
  rm -f "$img" "$img.data"
  qemu-img create -q -f qcow2 -o data_file="$img.data" "$img" 4M
  qemu-io -f qcow2 -c 'write -P 0x66 0 1M' -c 'write -P 0x67 3M 64k' \
    "$img" >/dev/null
  /usr/bin/python3 "$tmp/far.py" "$img" "$ext" 0
  qemu-img info --output=json "$img" |
    grep -qF '"data-file": "'"$img.data"'"' ||
    fail "data file, $ext: qemu-img does not see the data file"
  same_as_qemu "$img" "data file, $ext"
done
