#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# How backing files are found and chosen: relative backing names are
# resolved against the folder of the image naming them (not nbdkit's
# working directory), at every level of a chain; images without the
# backing format extension (qemu probes the format: qcow2 or raw);
# backing=none serves the top image alone.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy

# Relative names: top in a/, mid in a/b/, base in c/ (named as ../c from
# a/b), served from an unrelated working directory, with file= given as
# an absolute and as a relative path.
mkdir -p "$tmp/a/b" "$tmp/c" "$tmp/elsewhere"
qemu-img create -q -f qcow2 "$tmp/c/base.qcow2" 4M
qio "$tmp/c/base.qcow2" 'write -P 0x11 0 4M'
( cd "$tmp/a/b" &&
  qemu-img create -q -f qcow2 -b ../../c/base.qcow2 -F qcow2 mid.qcow2 &&
  qemu-io -f qcow2 -c 'write -P 0x22 1M 64k' mid.qcow2 >/dev/null ) ||
  fail "making mid.qcow2"
( cd "$tmp/a" &&
  qemu-img create -q -f qcow2 -b b/mid.qcow2 -F qcow2 top.qcow2 &&
  qemu-io -f qcow2 -c 'write -P 0x33 2M 64k' top.qcow2 >/dev/null ) ||
  fail "making top.qcow2"
qemu-img info "$tmp/a/top.qcow2" | grep -q '^backing file: b/mid.qcow2' ||
  fail "top.qcow2 does not name its backing file by a relative name"
# Decoys where a name resolved against the working directory would land.
mkdir -p "$tmp/elsewhere/b" "$tmp/c2"
qemu-img create -q -f qcow2 "$tmp/elsewhere/b/mid.qcow2" 4M
qio "$tmp/elsewhere/b/mid.qcow2" 'write -P 0xee 0 4M'
( cd "$tmp/elsewhere" && check_image "$tmp/a/top.qcow2" )
( cd "$tmp" && check_image a/top.qcow2 )
( cd "$tmp/a/b" && check_image ../top.qcow2 )

# No backing format extension: qemu probes the backing file's format.
# qemu-img 7.2 refuses to create such images, so remove the extension
# (type 0xe2792aca) from the header of one made with -F.
drop_backing_format ()
{
  /usr/bin/python3 - "$1" <<'PY'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(4096)
version = struct.unpack(">I", h[4:8])[0]
hlen = struct.unpack(">I", h[100:104])[0] if version >= 3 else 72
exts, off, dropped = [], hlen, False
while True:
    t, n = struct.unpack(">II", h[off:off + 8])
    if t == 0:
        break
    data = h[off + 8:off + 8 + n]
    if t == 0xe2792aca:
        dropped = True
    else:
        exts.append(struct.pack(">II", t, n) + data + b"\0" * (-n % 8))
    off += 8 + n + (-n % 8)
if not dropped:
    sys.exit("no backing format extension")
new = b"".join(exts) + b"\0" * 8
new += b"\0" * (off + 8 - hlen - len(new))
f.seek(hlen)
f.write(new)
PY
}
for compat in 0.10 1.1; do
  for fmt in qcow2 raw; do
    base=$tmp/nf-base-$compat.$fmt top=$tmp/nf-top-$compat-$fmt.qcow2
    qemu-img create -q -f $fmt "$base" 2M
    QIO_FMT=$fmt qio "$base" 'write -P 0x44 0 1M' 'write -P 0x45 1536k 4k'
    qemu-img create -q -f qcow2 -o compat=$compat -b "$base" -F $fmt "$top"
    qio "$top" 'write -P 0x55 64k 64k'
    drop_backing_format "$top" || fail "cannot patch $top"
    qemu-img info "$top" | grep -q 'backing file format' &&
      fail "$top still has a backing file format"
    qemu-img check -q "$top" || fail "$top is not consistent after patching"
    check_image "$top"
  done
done

# backing=none: the top image alone; qemu's reference is the image
# opened with "backing": null.  Unallocated clusters read as zeros and
# map as holes; zero clusters and data as usual.
img=$tmp/a/top.qcow2
qio "$img" 'write -z 3M 64k'
QEMU_IMG_SRC='json:{"driver":"qcow2","file":{"driver":"file","filename":"'"$img"'"},"backing":null}' \
  check_image "$img" backing=none
img=$tmp/nf-top-1.1-raw.qcow2
QEMU_IMG_SRC='json:{"driver":"qcow2","file":{"driver":"file","filename":"'"$img"'"},"backing":null}' \
  check_image "$img" backing=none
# An image without a backing file is served the same with backing=none.
check_image "$tmp/c/base.qcow2" backing=none
# backing=none reads zeros where the backing file has data.
timeout 60 nbdkit -U - qcow2 "file=$tmp/a/top.qcow2" backing=none \
  --run 'nbdcopy "$uri" '"$tmp"'/alone.raw' || fail "backing=none"
cmp -n 65536 "$tmp/alone.raw" /dev/zero ||
  fail "backing=none: the backing file's data shows through"
# Other values of backing= are refused.
expect_refused 'backing' qcow2 "file=$tmp/a/top.qcow2" backing=foo
