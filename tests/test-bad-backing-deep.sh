#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A backing chain deeper than 2048 images: nbdkit refuses it at startup
# and names the file at fault; a chain of 2048 is served, and the data
# of its deepest layer comes through.  It takes a file descriptor a
# layer: the test skips where the limit cannot be raised to 4200.
source "${srcdir:-.}/bad-functions.sh"

ulimit -n 4200 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 4200 ]; then
  echo "$0: test skipped: cannot raise the open file limit to 4200 (ulimit -n $(ulimit -n))"
  exit 77
fi

# img0000 <- ... <- img2049, made by patching the backing name of one
# image (a qemu-img create for each would take minutes).
qemu-img create -q -f qcow2 "$tmp/img0000.qcow2" 1M
qemu-io -f qcow2 -c 'write -P 0x77 0 64k' "$tmp/img0000.qcow2" >/dev/null
qemu-img create -q -u -f qcow2 -b img9999.qcow2 -F qcow2 "$tmp/tmpl.qcow2" 1M
/usr/bin/python3 -c '
import sys
d = sys.argv[1]
t = open(d + "/tmpl.qcow2", "rb").read()
for i in range(1, 2050):
    open("%s/img%04d.qcow2" % (d, i), "wb").write(
        t.replace(b"img9999.qcow2", b"img%04d.qcow2" % (i - 1)))
' "$tmp"
ERR_FILE=$tmp/img0001.qcow2 expect_open_error "$tmp/img2049.qcow2" \
  "backing chain is deeper than 2048 images"
timeout 120 nbdkit -U - qcow2 "file=$tmp/img2048.qcow2" --run 'nbdsh -u "$uri" -c "
assert h.pread(65536, 0) == b\"\\x77\" * 65536
"' || fail "a chain of 2048 backing files is not served"
