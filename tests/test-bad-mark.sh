#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Every broken structure the engine finds and refuses marks an image
# opened for writing corrupt, as QEMU's qcow2_signal_corruption does
# (on reads too), so that qemu-img and the next nbdkit run say to
# repair it, the mark on disk (flushed) before it is said; served
# read-only (or as a backing file) it is only reported, the file left
# as it is:
#  - no refcount block for the header's cluster (refcount table entry
#    0 empty): a write that must allocate is refused, the image marked
#    on disk at once; qemu-img info says "corrupt: true", the next
#    read-write start is refused saying what repairs it, -r serves it,
#    and after qemu-img check -r all it is written again;
#  - an unaligned L2 table offset, met by a read; the same with -r;
#  - a data cluster written in place past the end of the file: the
#    mark is on disk when said (nbdkit killed then);
#  - a compressed cluster that does not decompress, met by a read:
#    reported, not marked (bad data, as QEMU says: no mark, and a read
#    writes nothing);
#  - the same compressed cluster in a backing file: the overlay is
#    served, the backing file neither written nor marked.
source "${srcdir:-.}/bad-functions.sh"
source "${srcdir:-.}/write-functions.sh"
set -e

# run IMG ARGS... -- PYTHON: serve IMG and run nbdsh code (with
# BAD_PRELUDE); the log in $tmp/log.
run ()
{
  local img=$1 rc=0; shift
  local args=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  timeout 60 nbdkit -U - "${args[@]}" qcow2 "$img" \
    --run "nbdsh -u \"\$uri\" -c '$BAD_PRELUDE$1'" > "$tmp/log" 2>&1 || rc=$?
  sed 's/^/    /' "$tmp/log"
  check_status "serving $img" "$rc" 0 "$tmp/log"
}
marked () { [ "$(header_flags "$1")" = "0 1" ]; }
says () { grep -qE "$1" "$tmp/log" || fail "no message /$1/"; }

echo "== refcount table entry 0 empty"
img=$tmp/rt0.qcow2
qemu-img create -q -f qcow2 -o cluster_size=4k "$img" 4M
qio "$img" "write -P 0x11 0 64k"
reftable=$(qpatch "$img" field refcount_table_offset)
qpatch "$img" be64 "$reftable" 0
run "$img" -- '
expect_pattern(0, 65536, 0x11)
try:
    h.pwrite(b"\x22" * 4096, 1 << 20)
    raise AssertionError("the allocating write succeeded")
except nbd.Error as e:
    assert e.errnum == errno.EIO, e.errno
expect_pattern(0, 65536, 0x11)
'
says "corrupt image: .*refcount table entry 0 is empty.*allocation refused; the image is marked corrupt$"
says "^nbdkit: ([^ :]+: )?error: hint: it will not be written until qemu-img check -r all repairs it$"
marked "$img" || fail "the image is not marked corrupt"
qemu-img info "$img" | grep -q "corrupt: true" ||
  fail "qemu-img info does not say the image is corrupt"
OPEN_ARGS= expect_open_error "$img" "marked corrupt.*refusing write access$" \
  "^nbdkit: error: hint: qemu-img check -r all repairs it"
run "$img" -r -- 'expect_pattern(0, 65536, 0x11)'
qemu-img check -q -r all "$img" > /dev/null 2>&1 || :
marked "$img" && fail "qemu-img check -r all left the mark"
run "$img" -- '
h.pwrite(b"\x22" * 4096, 1 << 20)
h.flush()
expect_pattern(1 << 20, 4096, 0x22)
expect_pattern(0, 65536, 0x11)
'
qemu-img check -q "$img" || fail "qemu-img check after the repair"

echo "== an unaligned L2 table offset, met by a read"
img=$tmp/l2.qcow2
qemu-img create -q -f qcow2 -o cluster_size=4k "$img" 4M
qio "$img" "write -P 0x33 0 8k"
read -r l1e l1e_at < <(qpatch "$img" l1-entry 0)
qpatch "$img" be64 "$l1e_at" $(( l1e + 512 ))
cp "$img" "$tmp/l2-ro.qcow2"
sum=$(md5sum < "$img")
run "$img" -- 'expect_eio(0, 4096)'
says "corrupt image: unaligned L2 table offset .*marked corrupt"
marked "$img" || fail "a read that met an unaligned L2 table did not mark the image"
# Read-only: reported, not marked, the file untouched.
run "$tmp/l2-ro.qcow2" -r -- 'expect_eio(0, 4096)'
says "corrupt image: unaligned L2 table offset"
! grep -q "marked corrupt" "$tmp/log" || fail "a read-only export marked the image"
[ "$(md5sum < "$tmp/l2-ro.qcow2")" = "$sum" ] ||
  fail "a read-only export changed the image"

echo "== a data cluster written in place past the end of the file"
img=$tmp/eof.qcow2
qemu-img create -q -f qcow2 -o cluster_size=4k "$img" 4M
qio "$img" "write -P 0x66 1M 4k"
read -r l2e l2e_at < <(qpatch "$img" l2-entry 1M)
size=$(stat -c %s "$img")
qpatch "$img" be64 "$l2e_at" $(( (1 << 63) | ((size + 8191) & ~4095) ))
# The server killed once the write failed: the mark said is on disk.
# (nbdkit then kills the command too: its status says nothing.)
rm -f "$tmp/pid" "$tmp/refused"
export BAD_PRELUDE pidfile=$tmp/pid refused=$tmp/refused WRITE_SCRIPT='
try:
    h.pwrite(b"\x77" * 512, 1 << 20)
    raise AssertionError("the write succeeded")
except nbd.Error as e:
    assert e.errnum == errno.EIO, e.errno
'
rc=0
timeout 60 nbdkit -U - -P "$pidfile" qcow2 "$img" --run '
  nbdsh -u "$uri" -c "$BAD_PRELUDE" -c "$WRITE_SCRIPT" && touch "$refused" &&
    kill -KILL $(cat "$pidfile")' > "$tmp/log" 2>&1 || rc=$?
sed 's/^/    /' "$tmp/log"
[ "$rc" -ne 124 ] || fail "serving $img: timed out"
[ -e "$tmp/refused" ] || fail "the write was not refused with EIO"
says "corrupt image: data at host offset .* lies beyond the end of the file .*; the image is marked corrupt$"
marked "$img" || fail "the mark said was not on disk when nbdkit was killed"

echo "== a compressed cluster that does not decompress"
img=$tmp/c.qcow2
qemu-img create -q -f qcow2 -o cluster_size=4k "$img" 4M
qio "$img" "write -c -P 0x44 0 4k" "write -P 0x45 64k 4k"
read -r chost clen < <(qpatch "$img" compressed 0)
qpatch "$img" random "$chost" "$clen" 7
cp "$img" "$tmp/base.qcow2"
run "$img" -- '
expect_eio(0, 4096)
expect_pattern(65536, 4096, 0x45)
'
says "corrupt image: compressed cluster at host offset .* does not decompress to one cluster$"
cmp "$img" "$tmp/base.qcow2" || fail "a read of a bad compressed cluster wrote"

echo "== the same cluster in a backing file"
sum=$(md5sum < "$tmp/base.qcow2")
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$tmp/top.qcow2"
run "$tmp/top.qcow2" -- '
expect_eio(0, 4096)
h.pwrite(b"\x55" * 4096, 73728)
h.flush()
expect_pattern(73728, 4096, 0x55)
expect_pattern(65536, 4096, 0x45)
'
says "base.qcow2: corrupt image: compressed cluster"
! grep -q "marked corrupt" "$tmp/log" || fail "a backing file was marked corrupt"
[ "$(md5sum < "$tmp/base.qcow2")" = "$sum" ] || fail "the backing file was written"
marked "$tmp/top.qcow2" && fail "the overlay was marked for its backing file's corruption"
echo "corruptions marked: OK"
