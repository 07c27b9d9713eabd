#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Incompatible features the plugin does not implement, and encryption
# it cannot read:
# nbdkit refuses the image at startup and says which feature (by name
# where the image's feature name table has one).
source "${srcdir:-.}/bad-functions.sh"

good=$tmp/good.qcow2
qemu-img create -q -f qcow2 "$good" 4M
bad=$tmp/bad.qcow2

# An unknown incompatible bit, not in the feature name table.
cp "$good" "$bad"
qpatch "$bad" set-bits 72 $((1 << 20))
expect_open_error "$bad" \
  "unsupported incompatible feature\(s\): bit 20 \(incompatible_features 0x100000 at header offset 0x48\)"

# Several unknown bits, all reported.
cp "$good" "$bad"
qpatch "$bad" set-bits 72 $(( (1 << 5) | (1 << 63) ))
expect_open_error "$bad" "unsupported incompatible feature" "bit 5, bit 63 " \
  "0x8000000000000020"

# An unknown bit named in the feature name table: the name is reported.
# A compatible feature of the same bit number must not lend its name.
cp "$good" "$bad"
qpatch "$bad" add-feature 1 20 "a compatible feature"
qpatch "$bad" add-feature 0 20 "frobnicated clusters"
qpatch "$bad" add-feature 1 21 "not this name"
qpatch "$bad" set-bits 72 $(( (1 << 20) | (1 << 21) ))
{ qemu-img info "$bad" 2>&1 || :; } | grep -q "frobnicated clusters" ||
  fail "qemu-img does not see the added feature name: the table is wrong"
expect_open_error "$bad" \
  "unsupported incompatible feature\(s\): bit 20 \(frobnicated clusters\), bit 21 \(incompatible_features 0x300000 at header offset 0x48\)"
grep -qE "a compatible feature|not this name" "$tmp/open-error.log" &&
  fail "the name of a compatible feature was used"

# A name of the full 46 bytes (not NUL terminated in the table).
name=abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST
[ ${#name} -eq 46 ] || fail "test bug"
cp "$good" "$bad"
qpatch "$bad" add-feature 0 40 "$name"
qpatch "$bad" set-bits 72 $((1 << 40))
expect_open_error "$bad" "bit 40 \($name\)"

# Reusing the existing table: qemu's entry for incompatible bit 4
# ("extended L2 entries") renumbered to bit 30.
cp "$good" "$bad"
ft=$(qpatch "$bad" ext-offset 0x6803f857)
found=
for ((e = ft + 8; e < ft + 8 + $(qpatch "$bad" be32 $((ft + 4))); e += 48)); do
  if [ "$(qpatch "$bad" u8 $e)" -eq 0 ] &&
     [ "$(qpatch "$bad" u8 $((e + 1)))" -eq 4 ]; then
    qpatch "$bad" u8 $((e + 1)) 30
    found=1
  fi
done
[ -n "$found" ] || fail "qemu-img wrote no name for incompatible bit 4"
qpatch "$bad" set-bits 72 $((1 << 30))
expect_open_error "$bad" "bit 30 \(extended L2 entries\)"

# Encryption: crypt_method 1 (AES) patched in, 2 (LUKS) without its
# header, and an unknown one (the LUKS refusals: test-luks-refused.sh).
cp "$good" "$bad"
qpatch "$bad" be32 32 1
expect_open_error "$bad" "legacy AES method \(crypt_method 1 at header offset 0x20\)" \
  "qemu-img convert"
cp "$good" "$bad"
qpatch "$bad" be32 32 2
expect_open_error "$bad" "LUKS-encrypted \(crypt_method 2\) but has no encryption header extension"
cp "$good" "$bad"
qpatch "$bad" be32 32 3
expect_open_error "$bad" "unknown encryption method 3 \(crypt_method at header offset 0x20\)"

# External data file: bit 2 set but no data file named; the raw data
# autoclear bit without a data file; the named data file missing.
cp "$good" "$bad"
qpatch "$bad" set-bits 72 4
expect_open_error "$bad" \
  "image needs an external data file \(incompatible feature bit 2\) but names none"
cp "$good" "$bad"
qpatch "$bad" set-bits 88 2
expect_open_error "$bad" \
  "autoclear bit 1 \(raw external data\) is set but the image has no external data file"
( cd "$tmp" && qemu-img create -q -f qcow2 -o data_file=data.raw ext.qcow2 4M )
rm "$tmp/data.raw"
expect_open_error "$tmp/ext.qcow2" \
  "cannot open external data file \"$tmp/data.raw\" for writing" \
  "No such file or directory"
