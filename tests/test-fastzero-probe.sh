#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# fastzeromode=probe: a fast zero over a range that already reads as
# zeroes succeeds with nothing written (the log filter below fastzero
# sees no write and no zero); elsewhere it goes to a plugin that zeroes
# natively and fast (memory, qcow2: the log sees the fast zero, which
# qcow2 itself may refuse), and fails at once with ENOTSUP otherwise
# (the file plugin, whose zeroes are not fast, the split plugin, which
# writes zeroes, and zeromode=emulate, where the filter does).  Without
# MAY_TRIM (NBD's NO_HOLE) a hole is not enough; with FUA a skipped
# zero is flushed.  qcow2 images end clean, their zeroes as qemu-img
# map shows them.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh

K=1024

# probe TARGET-ARGS... -- PYTHON: run PYTHON in nbdsh against
# fastzero (probe, then TARGET-ARGS' zeromode) over the log filter;
# the plugin's requests are left in $tmp/log.
probe ()
{
  local args=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  rm -f "$tmp/log"
  PY="
import errno
def fast_zero(count, offset, flags=0):
    try:
        h.zero(count, offset, nbd.CMD_FLAG_FAST_ZERO | flags)
        return 'ok'
    except nbd.Error as e:
        return errno.errorcode[e.errnum]
$2" timeout -k 10 60 nbdkit -U - --filter=fastzero --filter=log \
    "${args[@]}" fastzeromode=probe logfile="$tmp/log" \
    --run 'nbdsh -u "$uri" -c "$PY"' || fail "probe ${args[*]}"
}
# log_has REGEX / log_lacks REGEX: requests the plugin saw.
log_has () { grep -Eq "$1" "$tmp/log" || { cat "$tmp/log"; fail "log lacks /$1/"; }; }
log_lacks () { ! grep -Eq "$1" "$tmp/log" || { cat "$tmp/log"; fail "log has /$1/"; }; }
# log_count REGEX N: N requests match.
log_count ()
{
  [ "$(grep -Ec "$1" "$tmp/log")" -eq "$2" ] ||
    { cat "$tmp/log"; fail "log: not $2 lines /$1/"; }
}

# memory, zeromode=emulate: zero ranges skip, data fails, nothing written.
probe memory 1M zeromode=emulate -- '
assert h.can_fast_zero()
assert fast_zero(65536, 0) == "ok"
h.pwrite(b"\x11" * 65536, 65536)
assert fast_zero(65536, 65536) == "ENOTSUP"
assert fast_zero(65536, 32768) == "ENOTSUP"      # half zero, half data
assert h.pread(65536, 65536) == b"\x11" * 65536
assert fast_zero(4096, 262144, nbd.CMD_FLAG_NO_HOLE) == "ENOTSUP"
assert fast_zero(4096, 524288, nbd.CMD_FLAG_FUA) == "ok"
'
log_has 'Extents'
log_lacks 'Zero id='
log_count " Write id=" 1
log_has 'Flush id='

# A normal zero under emulate is still written.
probe memory 1M zeromode=emulate -- '
h.pwrite(b"\x11" * 4096, 0)
h.zero(4096, 0)
assert h.pread(4096, 0) == bytes(4096)
'
log_count ' Write id=[0-9]+ offset=0x0 count=0x1000 ' 2

# memory, zeromode=plugin: memory zeroes natively and fast, so data
# ranges go to it with the fast flag; zero ranges still skip.
probe memory 1M zeromode=plugin -- '
assert fast_zero(65536, 0) == "ok"
h.pwrite(b"\x22" * 65536, 65536)
assert fast_zero(65536, 65536) == "ok"
assert h.pread(65536, 65536) == bytes(65536)
'
log_lacks 'Zero id=[0-9]+ offset=0x0 '
log_has 'Zero id=[0-9]+ offset=0x10000 count=0x10000 trim=1 fua=0 fast=1 '

# file: native zeroes, but not fast: data fails at once, holes skip.
truncate -s 1M "$tmp/file.img"
probe file "$tmp/file.img" zeromode=plugin -- '
h.pwrite(b"\x33" * 65536, 0)
assert fast_zero(65536, 0) == "ENOTSUP"
assert h.pread(65536, 0) == b"\x33" * 65536
assert fast_zero(65536, 524288) == "ok"
assert fast_zero(65536, 524288, nbd.CMD_FLAG_NO_HOLE) == "ENOTSUP"
'
log_lacks 'Zero id='
cmp -n 65536 "$tmp/file.img" <(head -c 65536 /dev/zero | tr '\0' '\063') ||
  fail "file: data changed"

# split: zeroes emulated with writes by the plugin (nbdkit's), so not
# fast: holes skip, data fails, and plain zeroes are written.
truncate -s 1M "$tmp/split.img"
probe split "$tmp/split.img" zeromode=plugin -- '
assert fast_zero(65536, 524288) == "ok"
h.pwrite(b"\x33" * 65536, 0)
assert fast_zero(65536, 0) == "ENOTSUP"
h.zero(4096, 0)
assert h.pread(8192, 0) == bytes(4096) + b"\x33" * 4096
'
log_lacks 'Zero id='
log_count ' Write id=[0-9]+ offset=0x0 count=0x1000 ' 1

# qcow2, zeromode=plugin: unallocated clusters skip; a data cluster
# goes to the plugin, which zeroes it fast; a part of a data cluster
# goes to it too, and it refuses (it would have to write data).
img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 1M
qio "$img" 'write -P 0x44 0 128k'
probe qcow2 "$img" zeromode=plugin -- '
assert fast_zero(65536, 524288) == "ok"
assert fast_zero(65536, 0) == "ok"
assert fast_zero(4096, 65536) == "ENOTSUP"
assert h.pread(65536, 65536) == b"\x44" * 65536
'
log_lacks 'Zero id=[0-9]+ offset=0x80000 '
log_has 'Zero id=[0-9]+ offset=0x0 count=0x10000 trim=1 fua=0 fast=1 '
log_has 'Zero id=[0-9]+ offset=0x10000 count=0x1000 trim=1 fua=0 fast=1 '
log_has '\.\.\.Zero id=[0-9]+ return=-1 error=ENOTSUP'
qemu-img check -q "$img" || fail "qemu-img check after probe over qcow2"
qemu-img map --output=json "$img" | map_normalize > "$tmp/map"
cat > "$tmp/map.expected" <<EOF
0 65536 0 1
65536 65536 1 0
131072 917504 0 1
EOF
diff -u "$tmp/map.expected" "$tmp/map" || fail "qcow2 map after probe"
qio "$img" 'read -P 0 0 64k' 'read -P 0x44 64k 64k'

# qcow2, zeromode=emulate: the data cluster fails before the plugin.
probe qcow2 "$img" zeromode=emulate -- '
assert fast_zero(65536, 65536) == "ENOTSUP"
assert fast_zero(65536, 0) == "ok"
assert fast_zero(131072, 262144) == "ok"
'
log_lacks '(Zero|Write) id='
qemu-img check -q "$img" || fail "qemu-img check after emulate probe"
qio "$img" 'read -P 0 0 64k' 'read -P 0x44 64k 64k'
