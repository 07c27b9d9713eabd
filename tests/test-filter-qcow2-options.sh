#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter on a par with the plugin: the same --dump-plugin
# keys and -D flags, its own --help, readonly=, create=true with
# preallocation=; messages that name the plugin and what it serves
# (never a made-up path; the curl plugin and its URL without the
# password: test-filter-qcow2-http.sh); a clear refusal when given
# twice or over the qcow2 plugin, and when the image to make does not
# fit in the export.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdinfo nbdsh

# refused REGEXP NBDKIT-ARGS...: nbdkit exits with an error matching
# REGEXP, and --run's command (started before the filter opens the
# image) cannot connect.
refused ()
{
  local re="$1"; shift
  local r=0
  timeout -k 5 60 nbdkit -U - "$@" --run 'nbdinfo --size "$uri"' \
    > /dev/null 2> "$tmp/refused.err" || r=$?
  [ "$r" -ne 0 ] && [ "$r" -ne 124 ] ||
    fail "nbdkit $*: exit status $r: $(cat "$tmp/refused.err")"
  grep -Eq -- "$re" "$tmp/refused.err" || {
    cat "$tmp/refused.err" >&2
    fail "nbdkit $*: error does not match /$re/"
  }
}

# --dump-plugin: the plugin's qcow2_* keys, the same.
nbdkit --dump-plugin qcow2 | grep '^qcow2_' > "$tmp/plugin.keys"
# (nbdkit 1.35.9 and later add the filter's qcow2_path= and qcow2_name=.)
nbdkit --filter=qcow2 memory --dump-plugin | grep '^qcow2_' |
  grep -Ev '^qcow2_(path|name)=' > "$tmp/filter.keys"
[ -s "$tmp/plugin.keys" ] || fail "the plugin lists no qcow2_* keys"
diff -u "$tmp/plugin.keys" "$tmp/filter.keys" ||
  fail "--dump-plugin: the filter's keys differ from the plugin's"

# --help: the filter's own defaults and options.
nbdkit --filter=qcow2 memory --help > "$tmp/help"
grep -q 'request at once (default 16, 0: none)' "$tmp/help" ||
  fail "--help: the filter's io-threads default"
grep -q 'plugin serves, else the current directory' "$tmp/help" ||
  fail "--help: backing-dir's default"
# Each key where nbdkit's bash completion finds keys (a line starting
# KEY=), the create keys too; the preallocation= the filter takes
# (falloc only for a new qcow2-overlay= FILE, which can allocate).
grep -E '^[-a-z0-9]+=' "$tmp/help" | sed 's/=.*/=/' > "$tmp/completion"
for key in backing= backing-dir= qcow2-password= qcow2-backing-password= \
           qcow2-overlay= readonly= compress= io-threads= create= \
           virtual-size= cluster-size= compat= extended-l2= lazy-refcounts= \
           refcount-bits= compression-type= encrypt-format= \
           encrypt-cipher-alg= encrypt-cipher-mode= encrypt-ivgen-alg= \
           encrypt-ivgen-hash-alg= encrypt-hash-alg= encrypt-iter-time= \
           preallocation= options=; do
  grep -qx -- "$key" "$tmp/completion" || fail "--help: $key not at a line's start"
done
grep -q '^preallocation=off|metadata|full ' "$tmp/help" &&
  ! grep -q '^preallocation=.*falloc' "$tmp/help" ||
  fail "--help: preallocation= lists what create=true refuses"
refused '^nbdkit: error: preallocation=falloc: a plugin.s export cannot allocate space' \
  --filter=qcow2 memory 64M create=true virtual-size=32M preallocation=falloc

# -D qcow2.cache=1 and -D qcow2.flush=1, as with the plugin.
qemu-img create -q -f qcow2 "$tmp/img.qcow2" 4M
truncate -s 8M "$tmp/img.qcow2"
nbdkit -v -D qcow2.cache=1 -D qcow2.flush=1 -U - --filter=qcow2 \
  file "$tmp/img.qcow2" \
  --run 'nbdsh -u "$uri" -c "h.pwrite(b\"x\" * 512, 0); h.flush()"' \
  2> "$tmp/debug.log" || fail "nbdkit -D qcow2.*"
grep -q 'L2 cache miss: slice' "$tmp/debug.log" || fail "-D qcow2.cache=1"
grep -q 'host flushes so far' "$tmp/debug.log" || fail "-D qcow2.flush=1"

# create=true formats only an export with no data anywhere: block
# status tells where the plugin has zeros, the rest is read.  A raw
# file of zeros with data at 10 MiB, or in its last byte, is refused
# with the offset and left as it was, with block status or without
# (noextents: all of it read); a sparse file is formatted, and so is a
# sparse 4 GiB disk (holes, nothing read); more than 1 GiB not reported
# as zeros is refused, though it reads as zeros.
truncate -s 20M "$tmp/at10m.raw" "$tmp/last.raw"
printf x | dd of="$tmp/at10m.raw" bs=1 seek=10M conv=notrunc status=none
printf y | dd of="$tmp/last.raw" bs=1 seek=$(( (20 << 20) - 1 )) conv=notrunc status=none
cp "$tmp/at10m.raw" "$tmp/at10m.model"
cp "$tmp/last.raw" "$tmp/last.model"
for f in "" "--filter=noextents"; do
  refused "^nbdkit: error: create=true: $tmp/at10m.raw is not empty \(data at offset 10485760\)" \
    --filter=qcow2 $f file "$tmp/at10m.raw" create=true virtual-size=1G
  refused "^nbdkit: error: create=true: $tmp/last.raw is not empty \(data at offset 20971519\)" \
    --filter=qcow2 $f file "$tmp/last.raw" create=true virtual-size=1G
done
cmp "$tmp/at10m.raw" "$tmp/at10m.model" && cmp "$tmp/last.raw" "$tmp/last.model" ||
  fail "create=true wrote over an export with data"
truncate -s 20M "$tmp/sparse.raw"
nbdkit -U - --filter=qcow2 file "$tmp/sparse.raw" create=true virtual-size=1G \
  --run 'nbdsh -u "$uri" -c "h.pwrite(b\"\\x5c\" * 4096, 900 << 20); h.flush()"' ||
  fail "create=true refused a sparse file of zeros"
qemu-img check -q "$tmp/sparse.raw" || fail "create=true in a sparse file: qemu-img check"
truncate -s 1G "$tmp/model.raw"
printf '\x5c%.0s' $(seq 4096) | dd of="$tmp/model.raw" bs=1M seek=900 conv=notrunc status=none
qemu-img compare -q -f qcow2 -F raw "$tmp/sparse.raw" "$tmp/model.raw" ||
  fail "create=true in a sparse file: not the model's bytes"
nbdkit -U - --filter=qcow2 memory 4G create=true virtual-size=1T \
  --run 'nbdinfo --size "$uri"' > "$tmp/size" || fail "create=true refused 4 GiB of holes"
[ "$(cat "$tmp/size")" = $(( 1 << 40 )) ] || fail "create=true over 4 GiB of holes: size $(cat "$tmp/size")"
refused '^nbdkit: error: create=true: memory export may hold data: block status reports more than 1 GiB of it as data, of which 1 GiB was read, all zeros \(to offset 1073741824\)' \
  --filter=qcow2 --filter=noextents memory 2G create=true virtual-size=1G
grep -q '^nbdkit: error: hint: if it holds nothing you need, "qemu-img create -f qcow2" formats it' \
  "$tmp/refused.err" || fail "more than 1 GiB to read: no hint"

# readonly=true: the plugin's export opened read-only, the image too.
sum=$(md5sum < "$tmp/img.qcow2")
nbdkit -v -U - --filter=qcow2 file "$tmp/img.qcow2" readonly=true \
  --run 'nbdsh -u "$uri" -c "assert h.is_read_only()"' 2> "$tmp/ro.log" ||
  fail "readonly=true: served writable"
grep -q 'img.qcow2: locked as QEMU locks an image it reads' "$tmp/ro.log" ||
  fail "readonly=true: the file is locked for writing"
[ "$(md5sum < "$tmp/img.qcow2")" = "$sum" ] || fail "readonly=true wrote the file"

# create=true preallocation=metadata|full in a file the file plugin
# serves: what qemu-img makes, every cluster allocated.
for p in metadata full; do
  truncate -s 80M "$tmp/$p.qcow2"
  nbdkit -U - --filter=qcow2 file "$tmp/$p.qcow2" create=true \
    virtual-size=64M preallocation=$p \
    --run 'nbdsh -u "$uri" -c "h.pwrite(b\"\\x5c\" * 4096, 1 << 20); h.flush()"' ||
    fail "create=true preallocation=$p"
  qemu-img check -q "$tmp/$p.qcow2" || fail "preallocation=$p: qemu-img check"
  qemu-img map --output=json "$tmp/$p.qcow2" > "$tmp/$p.map"
  /usr/bin/python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
assert all(e["data"] for e in m), "a cluster left unallocated"
assert sum(e["length"] for e in m) == 64 << 20' "$tmp/$p.map" ||
    fail "preallocation=$p: not every cluster allocated: $(cat "$tmp/$p.map")"
  qemu-io -f qcow2 -c 'read -P 0x5c 1M 4k' -c 'read -P 0 0 1M' \
    "$tmp/$p.qcow2" > /dev/null || fail "preallocation=$p: other data"
done

# Names: the plugin and its keys, not a path that does not exist.
refused '^nbdkit: error: memory export: not a qcow2 image' \
  --filter=qcow2 memory 1M
grep -q '^nbdkit: error: hint: memory export holds no image yet .*create=true virtual-size=SIZE' \
  "$tmp/refused.err" || fail "no hint for an export of zeros"
! grep -q '/image' "$tmp/refused.err" || fail "a made-up path named"
head -c 1M /dev/urandom > "$tmp/notq.img"
nbdkit -U "$tmp/raw.sock" -P "$tmp/raw.pid" file "$tmp/notq.img"
wait_socket "$tmp/raw.sock" "$(cat "$tmp/raw.pid")" || fail "the file server"
refused "^nbdkit: error: nbd socket=$tmp/raw.sock: not a qcow2 image" \
  --filter=qcow2 nbd socket="$tmp/raw.sock"
kill "$(cat "$tmp/raw.pid")"

# Stacked twice, or over the qcow2 plugin: refused, saying why.
refused '^nbdkit: error: --filter=qcow2 is given 2 times' \
  --filter=qcow2 --filter=qcow2 file "$tmp/img.qcow2"
refused '^nbdkit: error: --filter=qcow2 over the qcow2 plugin$' \
  --filter=qcow2 qcow2 "$tmp/img.qcow2"
grep -q '^nbdkit: error: hint: the plugin serves the image already' "$tmp/refused.err" ||
  fail "no hint: $(cat "$tmp/refused.err")"

# An image too big for the export: the sizes said.
refused '^nbdkit: error: create=true: memory export is 1048576 bytes, and the image.s metadata needs [0-9]+ \(virtual-size=109951162777600, 65536-byte clusters\)' \
  --filter=qcow2 memory 1M create=true virtual-size=100T
refused '^nbdkit: error: create=true: memory export is 10485760 bytes, and the image.s metadata with its data preallocated needs [0-9]+' \
  --filter=qcow2 memory 10M create=true virtual-size=64M preallocation=metadata
# A password with create=true but no encryption asked, as qemu-img
# refuses it: the image made would not be encrypted.
refused '^nbdkit: error: qcow2-password= with create=true needs encrypt-format=luks' \
  --filter=qcow2 memory 64M create=true virtual-size=32M qcow2-password=secret
