#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Backing files on NBD servers (nbdkit's file plugin on a Unix socket
# and on TCP), named as QEMU names them: nbd+unix:// and nbd:// URLs,
# the legacy nbd:unix: syntax, and json: names nested and with dotted
# keys.  QEMU's own nbd driver is the oracle: every overlay is read by
# qemu-img and by us (bytes, and block status as qemu-img map reports
# it); a qcow2 base on NBD over a raw base on NBD; a relative name in a
# qcow2 on NBD refused as QEMU refuses it; writes with copy-on-write
# from the remote base, then qemu-img check and qemu's reading; the
# qcow2 filter over a local overlay, its backing= a URL; create=true
# with a URL as backing file.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy nbdsh
source "${srcdir:-.}/remote-functions.sh"

# A raw base with data and holes, served on a socket and on TCP.
base=$tmp/base.raw
qemu-img create -q -f raw "$base" 8M
QIO_FMT=raw qio "$base" 'write -P 0x11 0 1M' 'write -P 0x12 3M 64k' \
  'write -P 0x13 7M 100k'
nbd_server raw -r file "$base"
port=$(free_port)
nbd_server tcp -r -p "$port" file "$base"
sock=$tmp/raw.sock

n=0
for name in "nbd+unix:///?socket=$sock" "nbd://127.0.0.1:$port" \
  "nbd:unix:$sock" \
  'json:{"driver":"raw","file":{"driver":"nbd","server":{"type":"unix","path":"'"$sock"'"}}}' \
  'json:{"driver": "raw", "file": {"server.host": "127.0.0.1", "server.port": "'"$port"'", "driver": "nbd", "server.type": "inet", "export": ""}}'
do
  n=$((n + 1))
  qemu-img create -q -f qcow2 -b "$name" -F raw "$tmp/ovl$n.qcow2"
  qio "$tmp/ovl$n.qcow2" 'write -P 0x21 64k 4k' 'write -z 3M 4k'
  check_image "$tmp/ovl$n.qcow2"
done

# A qcow2 base on NBD (with a compressed cluster) naming the raw base
# by its URL: three layers, two of them remote.
qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$sock" -F raw "$tmp/mid.qcow2"
qio "$tmp/mid.qcow2" 'write -P 0x31 2M 192k' 'write -c -P 0x32 5M 64k'
nbd_server mid -r file "$tmp/mid.qcow2"
qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$tmp/mid.sock" -F qcow2 \
  "$tmp/top.qcow2"
qio "$tmp/top.qcow2" 'write -P 0x41 2M 4k'
check_image "$tmp/top.qcow2"

# A relative name inside an image on NBD: no folder to find it in.
qemu-img create -q -f qcow2 -b base.raw -F raw "$tmp/rel.qcow2"
nbd_server rel -r file "$tmp/rel.qcow2"
qemu-img create -q -f qcow2 -u -b "nbd+unix:///?socket=$tmp/rel.sock" \
  -F qcow2 "$tmp/top-rel.qcow2" 8M
expect_refused 'backing file "base.raw": an NBD export has no folder to resolve a relative name in \(QEMU refuses it too\)' \
  qcow2 "$tmp/top-rel.qcow2"
! qemu-io -f qcow2 -c 'read 0 4k' "$tmp/top-rel.qcow2" > "$tmp/qemu.err" 2>&1 ||
  fail "qemu-io opened a relative name inside an image on NBD"
grep -q "Cannot generate a base directory for NBD nodes" "$tmp/qemu.err" ||
  fail "qemu-io says otherwise: $(cat "$tmp/qemu.err")"

# Writes that copy on write from the remote base, unaligned, then
# qemu-img check, and qemu reading what a model of the writes says.
w=$tmp/ovl1.qcow2
qemu-img convert -f qcow2 -O raw "$w" "$tmp/model.raw"
nbdkit -U - qcow2 "$w" --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x51\" * 3000, 100000)
h.pwrite(b\"\\x52\" * 70000, (7 << 20) + 5)
h.zero(8192, (3 << 20) + 4096)
h.flush()
"' || fail "writes over a remote base"
/usr/bin/python3 - "$tmp/model.raw" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    for off, data in ((100000, b"\x51" * 3000), ((7 << 20) + 5, b"\x52" * 70000),
                      ((3 << 20) + 4096, b"\0" * 8192)):
        f.seek(off)
        f.write(data)
PY
qemu-img check -q "$w" || fail "qemu-img check after writes over a remote base"
qemu-img compare -q -f qcow2 -F raw "$w" "$tmp/model.raw" ||
  fail "qemu reads other data than was written over a remote base"

# The qcow2 filter: an overlay (a local file) over the remote base, and
# backing= naming the base by URL in place of a missing file.
qemu-img convert -f qcow2 -O raw "$tmp/ovl4.qcow2" "$tmp/want.raw"
timeout 60 nbdkit -U - --filter=qcow2 file "$tmp/ovl4.qcow2" \
  --run 'nbdcopy "$uri" '"$tmp"'/got.raw' || fail "the filter over a remote base"
cmp "$tmp/want.raw" "$tmp/got.raw" || fail "the filter reads another disk"
qemu-img create -q -f qcow2 -u -b "$tmp/gone.raw" -F raw "$tmp/gone.qcow2" 8M
timeout 60 nbdkit -U - --filter=qcow2 file "$tmp/gone.qcow2" \
  "backing=nbd://127.0.0.1:$port" \
  --run 'nbdcopy "$uri" '"$tmp"'/got.raw' || fail "the filter with backing=URL"
cmp "$base" "$tmp/got.raw" || fail "backing=URL reads another disk"

# create=true with a URL as backing file: as qemu-img create -b URL.
timeout 60 nbdkit -U - qcow2 "$tmp/new.qcow2" create=true \
  "backing=nbd+unix:///?socket=$sock" backing-fmt=raw --run 'nbdinfo --size "$uri"' \
  > "$tmp/size" || fail "create=true backing=URL"
[ "$(cat "$tmp/size")" = 8388608 ] || fail "create=true backing=URL: size $(cat "$tmp/size")"
qemu-img compare -q -f qcow2 -F raw "$tmp/new.qcow2" "$base" ||
  fail "the image made over a URL reads other data"
