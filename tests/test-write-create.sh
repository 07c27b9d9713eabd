#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# create=true makes a new image that qemu-img check finds clean and
# qemu-img info describes as asked, with or without a backing file and
# preallocation; refused with a clear error where it cannot be done.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh

write_some ()   # IMG ARGS...: create, then write three patterns
{
  local img="$1"; shift
  rm -f "$img"
  nbdkit -U - qcow2 "$img" create=true "$@" --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x11\" * 70000, 1000000)
h.pwrite(b\"\\x22\" * 512, 0)
h.zero(65536, 8 * 1024 * 1024)
h.flush()
"'
  qemu-img check -q "$img" || fail "qemu-img check $img ($*)"
  qemu-io -f qcow2 -c 'read -P 0x11 1000000 70000' -c 'read -P 0x22 0 512' \
    -c 'read -P 0 8388608 65536' "$img" >/dev/null || fail "data of $img ($*)"
}

info_has ()     # IMG REGEX: qemu-img info of IMG matches
{
  qemu-img info "$1" | grep -Eq "$2" || fail "$1: qemu-img info lacks /$2/: $(qemu-img info "$1")"
}

img=$tmp/new.qcow2
write_some "$img" size=64M
info_has "$img" 'virtual size: 64 MiB'
info_has "$img" 'cluster_size: 65536'
info_has "$img" 'compat: 1.1'

for cs in 512:512 4K:4096 2M:2097152; do
  write_some "$img" size=100M cluster-size=${cs%:*}
  info_has "$img" "cluster_size: ${cs#*:}\$"
done
write_some "$img" size=64M compat=0.10
info_has "$img" 'compat: 0.10'
write_some "$img" size=64M extended-l2=on cluster-size=128K
info_has "$img" 'extended l2: true'
write_some "$img" size=64M lazy-refcounts=true
info_has "$img" 'lazy refcounts: true'
write_some "$img" size=3T cluster-size=2M
info_has "$img" 'virtual size: 3 TiB'

# Preallocation: every cluster allocated; full also takes the space.
write_some "$img" size=16M preallocation=metadata
# (but the zeroed cluster, freed since NBD zeroes may punch holes)
qemu-img map --output=json "$img" | /usr/bin/python3 -c '
import json, sys
bad = [e for e in json.load(sys.stdin)
       if not e["data"] and (e["start"], e["length"]) != (8 << 20, 65536)]
sys.exit(1 if bad else 0)' || fail "preallocation=metadata left unallocated clusters"
write_some "$img" size=16M preallocation=full cluster-size=4K
[ "$(stat -c %b "$img")" -ge $((15 * 2048)) ] || fail "preallocation=full did not take the space"

# A backing file: its size and format taken, its data shown through.
qemu-img create -q -f qcow2 "$tmp/base.qcow2" 32M
qemu-io -f qcow2 -c 'write -P 5 0 32M' "$tmp/base.qcow2" >/dev/null
write_some "$img" backing=base.qcow2
info_has "$img" 'virtual size: 32 MiB'
info_has "$img" 'backing file: base.qcow2'
info_has "$img" 'backing file format: qcow2'
qemu-io -f qcow2 -c 'read -P 5 2M 1M' "$img" >/dev/null || fail "backing data not shown"
qemu-img create -q -f raw "$tmp/base.raw" 20M
write_some "$img" backing=base.raw backing-fmt=raw size=40M
info_has "$img" 'backing file format: raw'
info_has "$img" 'virtual size: 40 MiB'

# Refused.
expect_refused 'already exists' qcow2 "$img" create=true size=1M
rm -f "$img"
expect_refused 'needs size=' qcow2 "$img" create=true
expect_refused 'cluster-size' qcow2 "$img" create=true size=1M cluster-size=3000
rm -f "$img"
expect_refused 'extended L2' qcow2 "$img" create=true size=1M extended-l2=on cluster-size=4K
rm -f "$img"

# Create-only options without create=: an error naming the option.
qemu-img create -q -f qcow2 "$img" 1M
for opt in size=1M cluster-size=4K compat=1.1 extended-l2=on \
           lazy-refcounts=on preallocation=full backing=other.qcow2; do
  expect_refused "${opt%%=*}= describes an image to make: it needs create=true" \
    qcow2 "$img" "$opt"
done
expect_refused 'backing=none' qcow2 "$img" backing=other.qcow2
rm -f "$img"

# The size rounded up to whole sectors, as qemu-img does.
nbdkit -U - qcow2 "$img" create=true size=1000 --run 'nbdinfo --size "$uri"' \
  > "$tmp/size" || fail "create=true size=1000"
[ "$(cat "$tmp/size")" = 1024 ] || fail "size=1000 served as $(cat "$tmp/size") bytes, not 1024"
info_has "$img" 'virtual size: 1 KiB \(1024 bytes\)'
qemu-img check -q "$img" || fail "qemu-img check after size=1000"
rm -f "$img"

# Every option checked before the file is touched: nothing left behind.
for opts in "cluster-size=3000" "extended-l2=on cluster-size=4K" \
            "compat=0.10 lazy-refcounts=on" "size=1T cluster-size=512" \
            "backing=missing.qcow2" "data-file=$tmp/data.raw compat=0.10" \
            "backing=base.raw"; do
  # shellcheck disable=SC2086
  expect_refused '.' qcow2 "$img" create=true size=1M $opts
  [ ! -e "$img" ] || fail "create=true $opts left $img behind"
  [ ! -e "$tmp/data.raw" ] || fail "create=true $opts made the data file"
done
expect_refused 'backing-fmt=raw' qcow2 "$img" create=true backing=base.raw
# A failure after the image is written (preallocation past the file
# size limit): the new file removed, an empty file left empty.
(trap '' XFSZ; ulimit -f 4096
 expect_refused 'File too large' qcow2 "$img" create=true size=64M \
   preallocation=full)
[ ! -e "$img" ] || fail "a failed create=true left $img behind"
: > "$img"
(trap '' XFSZ; ulimit -f 4096
 expect_refused 'File too large' qcow2 "$img" create=true size=64M \
   preallocation=full)
[ -e "$img" ] && [ ! -s "$img" ] || fail "a failed create=true did not leave the empty $img empty"
rm -f "$img"
# The same with an external data file: both removed.
(trap '' XFSZ; ulimit -f 4096
 expect_refused 'File too large' qcow2 "$img" create=true size=64M \
   data-file="$tmp/data.raw" preallocation=full)
[ ! -e "$img" ] && [ ! -e "$tmp/data.raw" ] ||
  fail "a failed create=true left $img or its data file behind"

# create=if-missing: made the first time, served as it is after (what a
# service unit that restarts needs), if it is the image the options
# describe.
nbdkit -U - qcow2 "$img" create=if-missing size=8M --run 'nbdsh -u "$uri" -c "
assert h.get_size() == 8 * 1024 * 1024
h.pwrite(b\"\\x33\" * 4096, 4096)
h.flush()
"' || fail "create=if-missing, first start"
nbdkit -U - qcow2 "$img" create=if-missing size=8M --run 'nbdsh -u "$uri" -c "
assert h.pread(4096, 4096) == b\"\\x33\" * 4096
"' || fail "create=if-missing, second start: the data is not there"
nbdkit -U - qcow2 "$img" create=if-missing size=8M cluster-size=64K \
  compat=1.1 extended-l2=off lazy-refcounts=off refcount-bits=16 \
  compression-type=zlib --run 'nbdinfo --size "$uri"' > "$tmp/size" ||
  fail "create=if-missing with every format option the image has"
[ "$(cat "$tmp/size")" = 8388608 ] || fail "create=if-missing changed the existing image"
# Options that only describe the format otherwise: served as it is,
# a notice saying what differs.
nbdkit -U - qcow2 "$img" create=if-missing size=8M compat=0.10 \
  extended-l2=on lazy-refcounts=on refcount-bits=8 compression-type=zstd \
  cluster-size=4K --run 'nbdinfo --size "$uri"' > "$tmp/size" \
  2> "$tmp/notice" || fail "create=if-missing with other format options"
[ "$(cat "$tmp/size")" = 8388608 ] || fail "create=if-missing changed the image"
grep -q "notice: .*create=if-missing: the image there is served as it is: its clusters are 65536 bytes, not cluster-size=4096; it is version 3, not compat=0.10; its L2 entries are not extended, not extended-l2=on; lazy refcounts are off, not lazy-refcounts=on; its refcounts are 16 bits, not refcount-bits=8; its compression type is zlib, not compression-type=zstd" \
  "$tmp/notice" || fail "no notice of the format options: $(cat "$tmp/notice")"
# What would serve another disk is refused, saying what differs, the
# image left as it is (and nobody told to remove it).
sum=$(md5sum < "$img")
expect_refused "^nbdkit: error: create=if-missing: .* is another disk: its virtual size is 8388608 bytes, less than size=16777216$" \
  qcow2 "$img" create=if-missing size=16M
grep -q "^nbdkit: error: hint: it is left as it is, and not served: give the options it has" \
  "$tmp/refused.err" || fail "no hint: $(cat "$tmp/refused.err")"
grep -q "remove" "$tmp/refused.err" && fail "told to remove the image"
expect_refused "it is not encrypted, but encrypt-format=luks is given" \
  qcow2 "$img" create=if-missing size=8M encrypt-format=luks password=x
expect_refused 'its backing file is none, not backing=base.qcow2' \
  qcow2 "$img" create=if-missing backing=base.qcow2
[ "$(md5sum < "$img")" = "$sum" ] || fail "a refused create=if-missing changed the image"
qemu-img check -q "$img" || fail "qemu-img check after create=if-missing"
qio "$img" 'read -P 0x33 4096 4096'
# The service disk resized by its admin: served, larger, with a notice.
qemu-img resize -q "$img" +8M
nbdkit -U - qcow2 "$img" create=if-missing size=8M --run 'nbdsh -u "$uri" -c "
assert h.get_size() == 16 * 1024 * 1024
assert h.pread(4096, 4096) == b\"\\x33\" * 4096
h.pwrite(b\"\\x34\" * 4096, 12 << 20)
"' 2> "$tmp/notice" || fail "create=if-missing after qemu-img resize"
grep -q "notice: .*its virtual size is 16777216 bytes, more than size=8388608 (grown since" \
  "$tmp/notice" || fail "no notice of the larger size: $(cat "$tmp/notice")"
qemu-img check -q "$img" || fail "qemu-img check after the resized image was served"
qio "$img" 'read -P 0x34 12M 4096'
# Not a qcow2 image: left alone.
head -c 4096 /dev/urandom > "$tmp/raw.img"
cp "$tmp/raw.img" "$tmp/raw.copy"
expect_refused 'create=if-missing: .* exists but is not a qcow2 image: it is left as it is' \
  qcow2 "$tmp/raw.img" create=if-missing size=1M
cmp "$tmp/raw.img" "$tmp/raw.copy" || fail "create=if-missing changed a file that is not qcow2"
# An encrypted image described as such, and its password: served.
rm -f "$tmp/enc.qcow2"
for round in 1 2; do
  nbdkit -U - qcow2 "$tmp/enc.qcow2" create=if-missing size=1M \
    encrypt-format=luks password=pw encrypt-iter-time=10 --run true ||
    fail "create=if-missing encrypt-format=luks, round $round"
done
# A password without encrypt-format= would make an unencrypted image:
# refused, as qemu-img refuses it.
for c in true if-missing; do
  expect_refused "password= with create=$c needs encrypt-format=luks" \
    qcow2 "$tmp/pw.qcow2" create=$c size=1M password=x
  [ ! -e "$tmp/pw.qcow2" ] || fail "create=$c password= made an image"
done
expect_refused 'already exists and is not empty$' \
  qcow2 "$img" create=true size=1M
grep -q '^nbdkit: error: hint: .*create=if-missing' "$tmp/refused.err" ||
  fail "no hint: $(cat "$tmp/refused.err")"
