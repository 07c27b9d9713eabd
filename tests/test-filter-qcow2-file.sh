#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter over nbdkit's file plugin reads and maps the image as
# the qcow2 plugin does; backing files from the image's folder, from
# backing-dir=, named explicitly (backing=FILE ...), or none; a missing
# one said at start; snapshots; read-only with nbdkit -r; QEMU's image
# locks on the file, both ways.
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/filter-qcow2-image.sh"

# Byte-identical to the plugin form, block status too; backing files in
# the image's folder (as qemu resolves them), wherever nbdkit runs.
read_as plugin qcow2 "$img"
read_as filter --filter=qcow2 file "$img"
cmp "$tmp/want.raw" "$tmp/plugin.raw" || fail "the plugin form reads wrong"
cmp "$tmp/plugin.raw" "$tmp/filter.raw" || fail "the filter reads differently from the plugin"
cmp "$tmp/plugin.map" "$tmp/filter.map" || fail "the filter's block status differs from the plugin's"

# backing-dir= names another folder: the backing file is not there.
mkdir "$tmp/empty"
rc=0
timeout 60 nbdkit -U - --filter=qcow2 file "$img" backing-dir="$tmp/empty" \
  --run 'nbdinfo --size "$uri"' > /dev/null 2> "$tmp/missing.log" || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "a missing backing file: exit status $rc"
grep -q "cannot open backing file \"$tmp/empty/base.qcow2\"" "$tmp/missing.log" ||
  fail "no message about the missing backing file: $(cat "$tmp/missing.log")"
cp "$base" "$tmp/empty/base.qcow2"
read_as bdir --filter=qcow2 file "$img" backing-dir="$tmp/empty"
cmp "$tmp/want.raw" "$tmp/bdir.raw" || fail "backing-dir="

# backing=none: the image alone.
read_as alone --filter=qcow2 file "$img" backing=none
cmp -s "$tmp/alone.raw" "$tmp/want.raw" && fail "backing=none read the backing file"
cmp -n 1M "$tmp/alone.raw" /dev/zero || fail "backing=none: the backing file's data showed"

# An explicit chain: top over other.qcow2 over a raw file, relative
# names in the image's folder; what qemu reads after the same rebase.
qemu-img create -q -f raw "$tmp/dir/low.raw" 3M
qemu-io -f raw -c 'write -P 0x55 0 3M' "$tmp/dir/low.raw" >/dev/null
qemu-img create -q -f qcow2 "$tmp/dir/other.qcow2" 8M
qemu-io -f qcow2 -c 'write -P 0x66 2M 1M' "$tmp/dir/other.qcow2" >/dev/null
read_as chain --filter=qcow2 file "$img" backing=other.qcow2 backing=low.raw
cp "$img" "$tmp/dir/rebased.qcow2"
qemu-img rebase -q -u -b other.qcow2 -F qcow2 "$tmp/dir/rebased.qcow2"
qemu-img rebase -q -u -b low.raw -F raw "$tmp/dir/other.qcow2"
qemu-img convert -f qcow2 -O raw "$tmp/dir/rebased.qcow2" "$tmp/want-chain.raw"
cmp "$tmp/want-chain.raw" "$tmp/chain.raw" || fail "backing=FILE backing=FILE"
read_as chain1 --filter=qcow2 file "$img" backing="$tmp/dir/other.qcow2" backing=none
cmp -n 1M "$tmp/chain1.raw" /dev/zero || fail "backing=FILE backing=none read further down"
# A chain that cannot be: said, nothing served.
rc=0
timeout 60 nbdkit -U - --filter=qcow2 file "$img" backing=low.raw backing=base.qcow2 \
  --run 'nbdinfo --size "$uri"' > /dev/null 2> "$tmp/raw.log" || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "a backing file below a raw one: exit status $rc"
grep -q "raw, so it has no backing file" "$tmp/raw.log" || fail "$(cat "$tmp/raw.log")"
nbdkit -U - --filter=qcow2 file "$img" backing=none backing=low.raw --run true \
  2> "$tmp/none.log" && fail "backing=none backing=FILE accepted"
grep -q "backing=none ends the chain" "$tmp/none.log" || fail "$(cat "$tmp/none.log")"

# A snapshot.
read_as snap --filter=qcow2 file "$img" snapshot=s1
cmp "$tmp/want-s1.raw" "$tmp/snap.raw" || fail "snapshot= through the filter"

# nbdkit -r: read-only.
nbdkit -r -U - --filter=qcow2 file "$img" \
  --run 'nbdsh -u "$uri" -c "assert h.is_read_only()"' ||
  fail "nbdkit -r: the filter serves read-write"

# QEMU's locks on the file the plugin serves: qemu-io cannot write the
# image while the filter serves it (nor read it while it is written),
# and the filter refuses an image qemu-io has open for writing.
nbdkit -U - --filter=qcow2 file "$img" --run '
  qemu-io -f qcow2 -c "read 0 512" "'"$img"'" > "'"$tmp"'/qio-rw.log" 2>&1 && exit 9
  qemu-io -r -f qcow2 -c "read 0 512" "'"$img"'" > "'"$tmp"'/qio-ro.log" 2>&1 && exit 9
  nbdinfo --size "$uri" > /dev/null' ||
  fail "qemu-io opened an image the filter serves read-write"
grep -q 'Failed to get "write" lock' "$tmp/qio-rw.log" || fail "$(cat "$tmp/qio-rw.log")"
grep -q 'Failed to get shared "write" lock' "$tmp/qio-ro.log" || fail "$(cat "$tmp/qio-ro.log")"
nbdkit -r -U - --filter=qcow2 file "$img" --run '
  qemu-io -r -f qcow2 -c "read -P 0x44 5M 4k" "'"$img"'" > /dev/null' ||
  fail "qemu-io -r could not read an image the filter serves read-only"
fifo=$tmp/fifo
mkfifo "$fifo"
(cd "$tmp/dir" && qemu-io -f qcow2 "$img" < "$fifo" > /dev/null 2>&1) &
exec 3> "$fifo"
sleep 1
rc=0
timeout 60 nbdkit -U - --filter=qcow2 file "$img" --run 'nbdinfo --size "$uri"' \
  > /dev/null 2> "$tmp/locked.log" || rc=$?
rc2=0
nbdkit -r -U - --filter=qcow2 file "$img" locking=off \
  --run 'nbdinfo --size "$uri"' > /dev/null || rc2=$?
echo quit >&3
exec 3>&-
wait
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "served an image qemu-io writes: $rc"
grep -q "$img"': failed to get "write" lock' "$tmp/locked.log" ||
  fail "no lock message: $(cat "$tmp/locked.log")"
[ "$rc2" -eq 0 ] || fail "locking=off did not serve the image qemu-io writes"
qemu-img check -q "$img" || fail "qemu-img check at the end"
