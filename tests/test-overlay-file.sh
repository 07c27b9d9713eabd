#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter's overlay (qcow2-overlay=FILE) over nbdkit's file
# plugin, with QEMU as the oracle:
#  - FILE made at the first start; writes, zeroes, trims, FUA and
#    flushes against a model; qemu-img check clean; the plugin's file
#    unchanged (checksum) and locked against writers while served, FILE
#    locked as an image;
#  - continued at a restart: reads back the model, and block status
#    equals qemu-img map of FILE over the plugin's file (its holes from
#    the plugin's extents, zero clusters as zeros);
#  - no backing name QEMU opens recorded, until the man page's
#    qemu-img rebase (test-overlay-identity.sh has what is recorded);
#    with qcow2-overlay-backing=NAME, FILE alone (qemu-img, and our
#    plugin) reads as what was served;
#  - nbdkit -r leaves FILE as it was; a FILE over another file (before
#    its size: test-overlay-start.sh has that), another backing name or
#    not qcow2 is refused, naming both.
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/overlay-functions.sh"

base=$tmp/base.raw ov=$tmp/ov.qcow2
make_base "$base" $((8 << 20))
sha256sum "$base" > "$tmp/base.sum"
cp "$base" "$tmp/model.raw"

# map_check: block status ($tmp/map.json, over NBD) as qemu-img maps
# FILE over the plugin's file.
map_check ()
{
  map_normalize < "$tmp/map.json" > "$tmp/map.out"
  qemu-img map --output=json --image-opts \
    "driver=qcow2,file.filename=$ov,backing.driver=raw,backing.file.filename=$base" |
    map_normalize > "$tmp/map.ref"
  diff -u "$tmp/map.ref" "$tmp/map.out" ||
    fail "block status differs from qemu-img map ($1)"
}

# Made (block status all the plugin's, holes included), then written.
nbdkit -U - --filter=qcow2 file "$base" qcow2-overlay="$ov" --run '
  nbdsh -u "$uri" -c "
assert h.can_multi_conn() and h.can_zero() and h.can_fast_zero()
assert h.can_trim() and h.can_fua() and h.can_flush() and h.is_read_only() == 0
" && qemu-img map --output=json -f raw "$uri"' > "$tmp/map.json" ||
  fail "a new FILE"
map_check "a new FILE"
grep -q "^3145728 2097152 0 1$" "$tmp/map.out" || fail "the plugin's holes"
nbdkit -U - --filter=qcow2 file "$base" qcow2-overlay="$ov" --run '
  /usr/bin/python3 '"$overlay_ops"' "$uri" '"$tmp/model.raw"' 1 60' ||
  fail "writes through the overlay"
check_overlay "$ov" || fail "qemu-img check of the overlay"
sha256sum -c --quiet "$tmp/base.sum" || fail "the plugin's file was written"
qemu-img info --output=json "$ov" > "$tmp/info.json"
grep -q '"backing-filename": "json:.*nbdkit-qcow2-overlay' "$tmp/info.json" ||
  fail "not our own backing name: $(cat "$tmp/info.json")"
grep -q '"virtual-size": 8388608' "$tmp/info.json" || fail "FILE's size"
grep -q '"cluster-size": 65536' "$tmp/info.json" || fail "FILE's cluster size"

# Continued: the model read back, block status as qemu maps FILE over
# the plugin's file.
nbdkit -U - --filter=qcow2 file "$base" qcow2-overlay="$ov" --run '
  nbdcopy "$uri" '"$tmp/out.raw"' && qemu-img map --output=json -f raw "$uri"
' > "$tmp/map.json" || fail "restart"
cmp "$tmp/out.raw" "$tmp/model.raw" || fail "read back after a restart"
map_check "after writes"

# Locks while served: QEMU sees FILE in use (as with qemu-nbd, -U
# reads it anyway), and may not write it, nor the plugin's file under
# it.
sock=$tmp/sock
nbdkit -U "$sock" -P "$tmp/pid" --filter=qcow2 file "$base" qcow2-overlay="$ov"
trap 'kill "$(cat "$tmp/pid")" 2>/dev/null || true; rm -rf "$tmp"' EXIT
wait_socket "$sock" "$(cat "$tmp/pid")" || fail "nbdkit did not start"
nbdinfo --size "nbd+unix:///?socket=$sock" > /dev/null || fail "not served"
qemu-img info "$ov" > "$tmp/lock.out" 2>&1 && fail "QEMU did not see FILE in use"
grep -q "lock" "$tmp/lock.out" || fail "FILE: $(cat "$tmp/lock.out")"
qemu-img info -U "$ov" > /dev/null || fail "qemu-img info -U refused while served"
qemu-io -f qcow2 -c 'write 0 512' "$ov" > "$tmp/lock.out" 2>&1 &&
  fail "QEMU wrote FILE while it was served"
grep -q "lock" "$tmp/lock.out" || fail "FILE: $(cat "$tmp/lock.out")"
qemu-io -f raw -c 'write 0 512' "$base" > "$tmp/lock.out" 2>&1 &&
  fail "QEMU wrote the plugin's file while it was under FILE"
grep -q "lock" "$tmp/lock.out" || fail "base: $(cat "$tmp/lock.out")"
kill "$(cat "$tmp/pid")"
for i in $(seq 50); do kill -0 "$(cat "$tmp/pid")" 2>/dev/null || break; sleep 0.1; done
trap 'rm -rf "$tmp"' EXIT

# The man page's rebase gives FILE its backing name: FILE alone reads
# as what was served.
qemu-img rebase -u -b base.raw -F raw "$ov"
qemu-img compare -f qcow2 -F raw "$ov" "$tmp/model.raw" ||
  fail "FILE rebased onto the plugin's file differs from what was served"

# qcow2-overlay-backing=NAME recorded in a new FILE; then QEMU and our
# plugin open FILE alone.
ov2=$tmp/named.qcow2
nbdkit -U - --filter=qcow2 file "$base" qcow2-overlay="$ov2" \
  qcow2-overlay-backing=base.raw --run '
  nbdsh -u "$uri" -c "h.pwrite(b\"\\x5a\" * 70000, 3 << 20)" &&
  nbdcopy "$uri" '"$tmp/served.raw"'
' || fail "an overlay with a backing name"
qemu-img info "$ov2" | grep -q "backing file: base.raw" || fail "no backing name"
qemu-img info "$ov2" | grep -q "backing file format: raw" || fail "no backing format"
qemu-img compare -f qcow2 -F raw "$ov2" "$tmp/served.raw" ||
  fail "FILE alone differs from what was served"
nbdkit -U - qcow2 "$ov2" --run 'nbdcopy "$uri" '"$tmp/plugin.raw" ||
  fail "nbdkit qcow2 FILE"
cmp "$tmp/served.raw" "$tmp/plugin.raw" || fail "nbdkit qcow2 FILE differs"

# A new FILE preallocated (extended L2: the clusters mapped, their
# subclusters not, so the plugin's disk shows through), as qemu-img
# allows it over a backing file; without extended L2, refused.
nbdkit -U - --filter=qcow2 file "$base" qcow2-overlay="$tmp/prealloc.qcow2" \
  preallocation=falloc extended-l2=on --run 'nbdcopy "$uri" '"$tmp/prealloc.raw" ||
  fail "preallocation=falloc extended-l2=on"
cmp "$tmp/prealloc.raw" "$base" || fail "a preallocated FILE hides the disk"
check_overlay "$tmp/prealloc.qcow2" || fail "qemu-img check of a preallocated FILE"
[ "$(du -k "$tmp/prealloc.qcow2" | cut -f1)" -ge 8192 ] ||
  fail "preallocation=falloc gave FILE no space"
expect_refused "preallocation= needs extended-l2=on" \
  --filter=qcow2 file "$base" qcow2-overlay="$tmp/refused.qcow2" \
  preallocation=metadata
[ ! -e "$tmp/refused.qcow2" ] || fail "a refused FILE was made"

# -r: FILE served as it is, not changed.
sha256sum "$ov2" > "$tmp/ov2.sum"
nbdkit -r -U - --filter=qcow2 file "$base" qcow2-overlay="$ov2" --run '
  nbdcopy "$uri" '"$tmp/ro.raw"' &&
  nbdsh -u "$uri" -c "assert h.is_read_only()"' || fail "nbdkit -r"
cmp "$tmp/served.raw" "$tmp/ro.raw" || fail "read-only reads differ"
sha256sum -c --quiet "$tmp/ov2.sum" || fail "nbdkit -r changed FILE"
sha256sum -c --quiet "$tmp/base.sum" || fail "the plugin's file was written"

# Refusals, each naming what differs.
cp "$base" "$tmp/grown.raw"
truncate -s +1M "$tmp/grown.raw"
expect_refused "records \"base.raw\" format raw \(another file below it than the plugin's\)" \
  --filter=qcow2 file "$tmp/grown.raw" qcow2-overlay="$ov2"
expect_unserved "records \"base.raw\" format raw \(another disk below it\)" \
  --filter=qcow2 file "$base" qcow2-overlay="$ov2" qcow2-overlay-backing=other.raw
grep -q "^nbdkit: error: hint: .*qemu-img rebase -u -b 'other.raw' -F raw" \
  "$tmp/unserved.err" || fail "no rebase command: $(cat "$tmp/unserved.err")"
nbdkit -U - --filter=qcow2 file "$base" qcow2-overlay="$tmp/plain.qcow2" --run true
expect_unserved "records \"json:.*\" format raw \(another disk below it\)" \
  --filter=qcow2 file "$base" qcow2-overlay="$tmp/plain.qcow2" \
  qcow2-overlay-backing=base.raw
grep -q "^nbdkit: error: hint: .*qemu-img rebase -u -b 'base.raw' -F raw" \
  "$tmp/unserved.err" || fail "no rebase command: $(cat "$tmp/unserved.err")"
expect_unserved "is not a qcow2 image" \
  --filter=qcow2 file "$base" qcow2-overlay="$tmp/model.raw"
expect_unserved "does not exist, and nbdkit serves read-only" \
  -r --filter=qcow2 file "$base" qcow2-overlay="$tmp/missing.qcow2"
[ ! -e "$tmp/missing.qcow2" ] || fail "-r made FILE"
expect_refused "qcow2-overlay-on-read=true writes what is read.*not with nbdkit -r" \
  -r --filter=qcow2 file "$base" qcow2-overlay="$ov2" qcow2-overlay-on-read=true
expect_refused "cannot go with create=true" \
  --filter=qcow2 file "$base" qcow2-overlay="$ov2" create=true virtual-size=1M
expect_refused "cannot go with backing=" \
  --filter=qcow2 file "$base" qcow2-overlay="$ov2" backing=none
expect_refused "qcow2-overlay-backing= needs qcow2-overlay=FILE" \
  --filter=qcow2 file "$base" qcow2-overlay-backing=base.raw
sha256sum -c --quiet "$tmp/base.sum" || fail "the plugin's file was written"

# As the cow filter's cow-on-read=/PATH: copy-on-read while PATH
# exists, toggled at run time; qcow2-overlay-on-cache= as cow-on-cache=.
# filled FILE OFFSET...: each offset's cluster is in FILE (present);
# "-OFFSET": not.
filled ()
{
  local f="$1"; shift
  qemu-img map --output=json "json:{\"file\":{\"filename\":\"$f\"},\"backing\":null}" |
    /usr/bin/python3 -c '
import json, sys
m = json.load(sys.stdin)
for a in sys.argv[1:]:
    o = abs(int(a))
    p = any(e["start"] <= o < e["start"] + e["length"] and e["present"] for e in m)
    assert p == (not a.startswith("-")), "offset %d: present=%s" % (o, p)
' "$@"
}
flag=$tmp/on-read
nbdkit -U - --filter=qcow2 file "$base" qcow2-overlay="$tmp/toggle.qcow2" \
  qcow2-overlay-on-read="$flag" --run '
  nbdsh -u "$uri" -c "h.pread(65536, 0)" &&
  touch '"$flag"' && nbdsh -u "$uri" -c "h.pread(65536, 1 << 20)" &&
  rm '"$flag"' && nbdsh -u "$uri" -c "h.pread(65536, 2 << 20)"' ||
  fail "qcow2-overlay-on-read=/PATH"
filled "$tmp/toggle.qcow2" -0 1048576 -2097152 ||
  fail "qcow2-overlay-on-read=/PATH: copied while PATH existed only"
nbdkit -U - --filter=qcow2 file "$base" qcow2-overlay="$tmp/nocache.qcow2" \
  qcow2-overlay-on-read=true qcow2-overlay-on-cache=false --run '
  nbdsh -u "$uri" -c "h.cache(65536, 0); h.pread(65536, 1 << 20)"' ||
  fail "qcow2-overlay-on-cache=false"
filled "$tmp/nocache.qcow2" -0 1048576 || fail "qcow2-overlay-on-cache=false filled"
nbdkit -U - --filter=qcow2 file "$base" qcow2-overlay="$tmp/cache.qcow2" \
  qcow2-overlay-on-cache=true --run '
  nbdsh -u "$uri" -c "assert h.can_cache(); h.cache(65536, 0); h.pread(65536, 1 << 20)"' ||
  fail "qcow2-overlay-on-cache=true"
filled "$tmp/cache.qcow2" 0 -1048576 || fail "qcow2-overlay-on-cache=true"
for f in toggle nocache cache; do
  check_overlay "$tmp/$f.qcow2" || fail "qemu-img check of $f.qcow2"
done
expect_refused "qcow2-overlay-on-cache=true writes what is read.*not with nbdkit -r" \
  -r --filter=qcow2 file "$base" qcow2-overlay="$ov2" qcow2-overlay-on-cache=true
sha256sum -c --quiet "$tmp/base.sum" || fail "the plugin's file was written"
