#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# zerodetect=on|unmap: writes whose data is all zeroes reach the plugin
# as zero requests (with MAY_TRIM for unmap, never with zeromode=notrim),
# FUA kept; other writes, and every write with zerodetect=off, stay
# writes.  Over qcow2, zeroed clusters keep their space with on and
# lose it with unmap, as qemu-img map and check show.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh

# A write of zeroes, of zeroes with FUA, a 1-byte zero, and writes that
# are not zeroes (non-zero at their first byte, at byte 16, and at
# their last): the requests the plugin saw, without timestamps or ids.
cat > "$tmp/client.py" <<'PY'
h.pwrite(bytes(65536), 0)
h.pwrite(bytes(4096), 65536, nbd.CMD_FLAG_FUA)
h.pwrite(bytes(1), 70000)
for at in (0, 16, 8191):
    buf = bytearray(8192)
    buf[at] = 1
    h.pwrite(buf, 131072)
    assert h.pread(8192, 131072) == buf
assert h.pread(70001, 0) == bytes(70001)
PY
run ()
{
  rm -f "$tmp/log"
  timeout -k 10 60 nbdkit -U - --filter=fastzero --filter=log \
    memory 1M logfile="$tmp/log" "$@" \
    --run 'nbdsh -u "$uri" -c "exec(open(\"'"$tmp"'/client.py\").read())"' ||
    fail "nbdkit $*"
  grep -E ' (Write|Zero) id=' "$tmp/log" |
    sed -E 's/^.* (Write|Zero) id=[0-9]+ /\1 /; s/ \.\.\.$//' > "$tmp/requests"
}
expect ()
{
  diff -u - "$tmp/requests" || fail "zerodetect $*: requests differ"
}

nonzero='Write offset=0x20000 count=0x2000 fua=0
Write offset=0x20000 count=0x2000 fua=0
Write offset=0x20000 count=0x2000 fua=0'

run zerodetect=on
expect on <<EOF
Zero offset=0x0 count=0x10000 trim=0 fua=0 fast=0
Zero offset=0x10000 count=0x1000 trim=0 fua=1 fast=0
Zero offset=0x11170 count=0x1 trim=0 fua=0 fast=0
$nonzero
EOF

run zerodetect=unmap zeromode=plugin
expect unmap <<EOF
Zero offset=0x0 count=0x10000 trim=1 fua=0 fast=0
Zero offset=0x10000 count=0x1000 trim=1 fua=1 fast=0
Zero offset=0x11170 count=0x1 trim=1 fua=0 fast=0
$nonzero
EOF

run zerodetect=unmap zeromode=notrim
expect "unmap zeromode=notrim" <<EOF
Zero offset=0x0 count=0x10000 trim=0 fua=0 fast=0
Zero offset=0x10000 count=0x1000 trim=0 fua=1 fast=0
Zero offset=0x11170 count=0x1 trim=0 fua=0 fast=0
$nonzero
EOF

for args in "" "zerodetect=off"; do
  run $args
  expect "${args:-(default)}" <<EOF
Write offset=0x0 count=0x10000 fua=0
Write offset=0x10000 count=0x1000 fua=1
Write offset=0x11170 count=0x1 fua=0
$nonzero
EOF
done

# qcow2: 256K of data; zeroes written over the first cluster with on,
# over the next two with unmap.
img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 1M
qio "$img" 'write -P 0x55 0 256k'
for args in "zerodetect=on 0" "zerodetect=unmap 65536"; do
  set -- $args
  timeout -k 10 60 nbdkit -U - --filter=fastzero qcow2 "$img" "$1" \
    --run 'nbdsh -u "$uri" -c "h.pwrite(bytes(65536 if '"$2"' == 0 else 131072), '"$2"')"' ||
    fail "qcow2 $1"
  qemu-img check -q "$img" || fail "qemu-img check after $1"
done
# start length zero data allocated, per extent.
qemu-img map --output=json "$img" | /usr/bin/python3 -c '
import json, sys
for e in json.load(sys.stdin):
    print(e["start"], e["length"], int(e["zero"]), int(e["data"]), int("offset" in e))
' > "$tmp/map"
diff -u - "$tmp/map" <<EOF || fail "qcow2 map after zerodetect"
0 65536 1 0 1
65536 131072 1 0 0
196608 65536 0 1 1
262144 786432 1 0 0
EOF
qio "$img" 'read -P 0 0 192k' 'read -P 0x55 192k 64k'
