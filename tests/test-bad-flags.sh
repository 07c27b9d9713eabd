#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The corrupt bit (incompatible bit 1) and the dirty bit (bit 0, lazy
# refcounts after a crash).
#  - corrupt: nbdkit refuses to start unless asked to serve read-only
#    (-r or readonly=true), saying why; with nbdkit -r the image is
#    served and reads as it did before it was marked.
#  - dirty: served and read correctly (the refcounts are not needed to
#    read).  Neither image is modified by serving it.
source "${srcdir:-.}/bad-functions.sh"
requires nbdinfo nbdcopy md5sum

img=$tmp/corrupt.qcow2
qemu-img create -q -f qcow2 "$img" 4M
qemu-io -f qcow2 -c 'write -P 0x55 0 64k' -c 'write -P 0xaa 1M 4k' \
  -c 'write -z 2M 64k' "$img" >/dev/null
qemu-img convert -f qcow2 -O raw "$img" "$tmp/before.raw"
qpatch "$img" set-bits 72 2
sum=$(md5sum < "$img")

# Without -r (and with readonly=false): refused at start, as QEMU
# refuses to open it read-write, with one message saying why and what
# to do.
expect_open_error "$img" \
  "error: $img: image is marked corrupt \(incompatible feature bit 1\): refusing write access" \
  "qemu-img check -r all" "nbdkit -r serves it read-only"
[ "$(grep -v 'error: hint:' "$tmp/open-error.log" | grep -c 'error:')" -eq 1 ] ||
  fail "more than one message for a corrupt image"
OPEN_ARGS=readonly=false expect_open_error "$img" "marked corrupt"

# readonly=true: served read-only.
timeout 30 nbdkit -U - qcow2 "file=$img" readonly=true \
  --run 'nbdinfo --size "$uri"' > "$tmp/ro.out" 2>&1 ||
  { cat "$tmp/ro.out"; fail "readonly=true does not serve a corrupt image"; }

# With -r: served, and equal to what it held before being marked
# corrupt, and to what qemu reads from it (and qemu-img map).
timeout 30 nbdkit -r -U - qcow2 "file=$img" --run 'nbdcopy "$uri" '"$tmp/out.raw" ||
  fail "nbdkit -r does not serve a corrupt image"
cmp "$tmp/before.raw" "$tmp/out.raw" ||
  fail "a corrupt image served read-only differs from before it was marked"
check_image "$img" -r
[ "$(md5sum < "$img")" = "$sum" ] || fail "serving changed the corrupt image"
[ "$(qpatch "$img" field incompatible_features)" -eq 2 ] ||
  fail "the corrupt bit was cleared"

# The dirty bit: qemu-io with lazy refcounts, killed ("abort") before it
# could clear the bit; the refcounts of the new clusters are missing.
img=$tmp/dirty.qcow2
qemu-img create -q -f qcow2 -o lazy_refcounts=on "$img" 4M
qemu-io -f qcow2 -c 'write -P 0x11 0 64k' "$img" >/dev/null
bash -c 'qemu-io -f qcow2 -c "write -P 0x5a 64k 128k" -c "write -P 0x66 3M 4k" \
           -c abort "$1"; exit 0' _ "$img" >/dev/null 2>&1
[ "$(qpatch "$img" field incompatible_features)" -eq 1 ] ||
  fail "qemu-io did not leave the dirty bit set: cannot test it"
qemu-img check "$img" >/dev/null 2>&1 && fail "qemu-img check finds no leaks?"
sum=$(md5sum < "$img")
timeout 30 nbdkit -U - qcow2 "file=$img" --run 'nbdsh -u "$uri" -c "
assert h.pread(65536, 0) == b\"\\x11\" * 65536
assert h.pread(131072, 65536) == b\"\\x5a\" * 131072
assert h.pread(4096, 3 << 20) == b\"\\x66\" * 4096
assert h.pread(65536, 1 << 20) == bytes(65536)
"' || fail "the dirty image does not read as written"
check_image "$img"
[ "$(md5sum < "$img")" = "$sum" ] || fail "serving changed the dirty image"

# Dirty and corrupt together: -r serves it.
qpatch "$img" set-bits 72 2
check_image "$img" -r
