#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A password always means encryption: a new overlay FILE (missing, or
# an empty file) with qcow2-password= but no encrypt-format=luks is
# refused, as create=true is (test-filter-qcow2-options.sh,
# test-write-create.sh) and as qemu-img refuses a secret without a
# format; nothing is made.  With encrypt-format=luks, FILE is made
# encrypted: QEMU reads what was written with the password.
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/overlay-functions.sh"

base=$tmp/base.raw ov=$tmp/ov.qcow2
make_base "$base" $((8 << 20))

expect_unserved "qcow2-password= with qcow2-overlay=$ov \\(made now\\) needs encrypt-format=luks: without it the image made is not encrypted" \
  --filter=qcow2 file "$base" qcow2-overlay="$ov" qcow2-password=secret
[ ! -e "$ov" ] || fail "a new FILE was made"
: > "$ov"
expect_unserved "qcow2-password= with qcow2-overlay=$ov \\(made now\\) needs encrypt-format=luks" \
  --filter=qcow2 file "$base" qcow2-overlay="$ov" qcow2-password=secret
[ ! -s "$ov" ] || fail "an empty FILE was written"

rm "$ov"
nbdkit -U - --filter=qcow2 file "$base" qcow2-overlay="$ov" \
  qcow2-password=secret encrypt-format=luks encrypt-iter-time=10 \
  --run 'nbdsh -u "$uri" -c "h.pwrite(b\"\\x5a\" * 4096, 65536 + 512)"' ||
  fail "an encrypted FILE"
qemu-img info "$ov" | grep -q "^encrypted: yes" || fail "FILE is not encrypted"
cp "$base" "$tmp/model.raw"
/usr/bin/python3 -c '
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(65536 + 512)
    f.write(b"\x5a" * 4096)' "$tmp/model.raw"
src="driver=qcow2,file.filename=$ov,encrypt.key-secret=sec0,backing.driver=raw,backing.file.filename=$base"
qemu-img check -q --object secret,id=sec0,data=secret --image-opts "$src" ||
  fail "qemu-img check of FILE"
qemu-img convert --object secret,id=sec0,data=secret --image-opts "$src" \
  -O raw "$tmp/out.raw"
cmp "$tmp/model.raw" "$tmp/out.raw" || fail "QEMU reads FILE otherwise"
