#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The shape of what the plugin and the filter say when they refuse to
# serve: every line of nbdkit's stderr is one of nbdkit's messages
# ("nbdkit: " first); each message is one line, what failed and where;
# a remedy is a line of its own, "nbdkit: error: hint: ...", right
# after the error it remedies; one error per refusal.  A line without
# nbdkit's prefix (a message's second line) would be lost to "grep
# nbdkit:" and to syslog, which keeps one line a message.  The
# refusals are those the suite knows, of images, of keys, of files
# named by images, of locks, and of the filter's overlay.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io /usr/bin/python3

qpatch () { /usr/bin/python3 "${srcdir:-.}/qcow2-patch.py" "$@"; }
count=0

# refused ERROR-RE HINT-RE NBDKIT-ARGS...: nbdkit refuses to serve, its
# stderr is shaped (expect_refused), it holds one error line matching
# ERROR-RE, and a hint line matching HINT-RE right after it (with
# HINT-RE empty: no hint).  Both are extended regexps.
refused ()
{
  local error_re="$1" hint_re="$2"; shift 2
  local err=$tmp/refused.err
  expect_refused "$error_re" "$@"
  [ "$(grep -c '^nbdkit: \([^ :]*: \)\?error: ' "$err")" -eq \
    "$(( 1 + $(grep -c '^nbdkit: \([^ :]*: \)\?error: hint: ' "$err") ))" ] || {
    cat "$err"; fail "nbdkit $*: not one error"; }
  grep -E -- "$error_re" "$err" | grep -q '^nbdkit: \([^ :]*: \)\?error: ' || {
    cat "$err"; fail "nbdkit $*: /$error_re/ is not the error's line"; }
  if [ -n "$hint_re" ]; then
    grep -A1 '^nbdkit: \([^ :]*: \)\?error: ' "$err" |
      grep -E '^nbdkit: ([^ :]*: )?error: hint: ' | grep -Eq -- "$hint_re" || {
      cat "$err"; fail "nbdkit $*: no hint /$hint_re/ after the error"; }
  else
    ! grep -q ': hint: ' "$err" || {
      cat "$err"; fail "nbdkit $*: a hint where none was expected"; }
  fi
  count=$((count + 1))
}

# message_shape itself: a message's second line, or a hint of nothing,
# is found; nbdkit's lines, the thread's name in them, pass.
printf '%s\n' 'nbdkit: qcow2[1]: error: a: b' 'nbdkit: error: hint: c' \
  'nbdkit: qcow2: notice: /f: d' 'nbdkit: qcow2: notice: /f: hint: e' \
  'nbdkit: debug: f' > "$tmp/good"
message_shape "$tmp/good" || fail "message_shape refuses nbdkit's lines"
printf '%s\n' 'nbdkit: error: a' 'what to do' > "$tmp/bare"
! message_shape "$tmp/bare" 2>/dev/null || fail "message_shape takes a bare line"
printf '%s\n' 'nbdkit: error: hint: what to do' > "$tmp/stray"
! message_shape "$tmp/stray" 2>/dev/null || fail "message_shape takes a hint of nothing"

img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 4M
qemu-io -f qcow2 -c 'write -P 0x55 0 64k' "$img" > /dev/null

# The plugin's keys.
refused 'you must supply the file=<FILENAME> parameter' 'or dir=<DIR>' qcow2
refused 'l2-cache-size: expected a size.*"foo"' '' qcow2 "$img" l2-cache-size=foo
refused 'locking: expected on, off or auto, not "yes please"' '' \
  qcow2 "$img" "locking=yes please"
refused 'overlap-check.nosuch: unknown structure' 'the structures are main-header' \
  qcow2 "$img" overlap-check.nosuch=on
refused 'io-threads: expected a number of threads' '' qcow2 "$img" io-threads=100000
refused 'backing-protocols: "ftp" is not a protocol here' '' \
  qcow2 "$img" backing-protocols=file,ftp
refused 'no snapshot with ID or name "nosuch"' '' qcow2 "$img" snapshot=nosuch
refused 'compress=zstd, but the image.s compressed clusters are zlib' \
  'compression type is set when it is made' qcow2 "$img" compress=zstd

# Images made, refused.
refused 'create: .*img.qcow2 already exists and is not empty' \
  'remove it, drop create=true, or use create=if-missing' \
  qcow2 "$img" create=true size=1M
refused 'create=if-missing: .*img.qcow2 is another disk' 'it is left as it is' \
  qcow2 "$img" create=if-missing size=8M
refused 'a backing file and preallocation can only be used together with extended-l2=on' \
  'the preallocated clusters would hide' \
  qcow2 "$tmp/new.qcow2" create=true backing="$img" preallocation=metadata
refused 'encrypt-cipher-alg=nosuch is not supported' 'supported: aes-128' \
  qcow2 "$tmp/new.qcow2" create=true size=1M encrypt-format=luks password=x \
  encrypt-cipher-alg=nosuch
[ ! -e "$tmp/new.qcow2" ] || fail "a refused create left a file"

# Bad images: not qcow2, qcow2's predecessor, a foreign format, AES,
# marked corrupt, a field out of range.
head -c 1M /dev/urandom > "$tmp/noise.img"
refused 'noise.img: not a qcow2 image \(magic' "nbdkit's file plugin serves it" qcow2 "$tmp/noise.img"
qemu-img create -q -f qcow "$tmp/v1.qcow" 1M
refused 'v1.qcow: unsupported qcow2 version 1' 'qemu-img convert -f qcow -O qcow2' \
  qcow2 "$tmp/v1.qcow"
qemu-img create -q -f vmdk "$tmp/disk.vmdk" 1M
refused 'disk.vmdk: a VMDK image \(its signature at offset 0\)' 'qemu-img convert -f vmdk -O qcow2' \
  qcow2 "$tmp/disk.vmdk"
cp "$img" "$tmp/aes.qcow2"
qpatch "$tmp/aes.qcow2" be32 32 1
refused 'aes.qcow2: legacy AES method' 'convert the image to LUKS' \
  qcow2 "$tmp/aes.qcow2"
cp "$img" "$tmp/corrupt.qcow2"
qpatch "$tmp/corrupt.qcow2" set-bits 72 2
refused 'corrupt.qcow2: image is marked corrupt' 'qemu-img check -r all repairs it' \
  qcow2 "$tmp/corrupt.qcow2"
cp "$img" "$tmp/bits.qcow2"
qpatch "$tmp/bits.qcow2" be32 20 8
refused 'bits.qcow2: cluster_bits 8 \(header offset 0x14\) is out of range' '' \
  qcow2 "$tmp/bits.qcow2"

# Files an image names: a backing file gone, refused by the policy, a
# data file gone.
qemu-img create -q -f qcow2 -u -b gone.qcow2 -F qcow2 "$tmp/orphan.qcow2" 4M
refused 'cannot open backing file ".*/gone.qcow2": No such file or directory$' \
  '^nbdkit: error: hint: backing=none serves the image without it' \
  qcow2 "$tmp/orphan.qcow2"
qemu-img create -q -f qcow2 -b img.qcow2 -F qcow2 "$tmp/top.qcow2"
refused 'a local file, protocol file is refused by backing-protocols=nbd' \
  'backing-protocols=nbd,file allows it' \
  qcow2 "$tmp/top.qcow2" backing-protocols=nbd
mkdir "$tmp/root"
refused 'not under backing-root=.*/root: refused' 'backing-root=.* allows it' \
  qcow2 "$tmp/top.qcow2" backing-root="$tmp/root"
qemu-img create -q -f qcow2 -o data_file="$tmp/data.raw" "$tmp/data.qcow2" 1M
rm "$tmp/data.raw"
refused 'cannot open external data file ".*data.raw".*No such file or directory' \
  'data-file=FILE names where it is' qcow2 "$tmp/data.qcow2"

# Passwords: for an image in clear, a wrong one.
refused 'img.qcow2 is not encrypted, nor is any backing file, but password= was given' \
  'without password= it is served as it is' qcow2 "$img" password=x
qemu_img_pbkdf create -q -f qcow2 --object secret,id=sec0,data=right \
  -o encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10 \
  "$tmp/luks.qcow2" 1M
refused 'wrong password: it opens none of the image.s 1 active' '' \
  qcow2 "$tmp/luks.qcow2" password=wrong

# A lock: the image served already by another server.
nbdkit -U "$tmp/held.sock" -P "$tmp/held.pid" qcow2 "$img"
trap 'kill "$(cat "$tmp/held.pid")"; rm -rf "$tmp"' EXIT
wait_socket "$tmp/held.sock" "$(cat "$tmp/held.pid")" || fail "the holder did not start"
refused 'img.qcow2: .*lock' 'locking=off serves it anyway' qcow2 "$img"
kill "$(cat "$tmp/held.pid")"
trap 'rm -rf "$tmp"' EXIT

# The filter: its keys, its stacking, its overlay.
qemu-img create -q -f raw "$tmp/base.raw" 4M
refused 'virtual-size: expected .*"1x"' '' --filter=qcow2 memory 1M virtual-size=1x
refused 'create=true needs virtual-size=' 'virtual-size= is the size of the disk' \
  --filter=qcow2 memory 1M create=true
refused '--filter=qcow2 over the qcow2 plugin' 'the plugin serves the image already' \
  --filter=qcow2 qcow2 "$img"
refused '--filter=qcow2 is given 2 times' 'one qcow2 filter serves the image' \
  --filter=qcow2 --filter=qcow2 memory 1M
refused 'qcow2-overlay=.*base.raw is the file the plugin serves' \
  "FILE keeps the changes to the plugin's disk" \
  --filter=qcow2 file "$tmp/base.raw" qcow2-overlay="$tmp/base.raw"
refused 'qcow2-overlay=.*: preallocation= needs extended-l2=on' \
  "would hide the plugin's disk" \
  --filter=qcow2 file "$tmp/base.raw" qcow2-overlay="$tmp/ov.qcow2" \
  preallocation=metadata
refused 'qcow2-overlay-backing= needs qcow2-overlay=FILE' '' \
  --filter=qcow2 file "$tmp/base.raw" qcow2-overlay-backing=base.raw
qemu-img create -q -f qcow2 "$tmp/alone.qcow2" 4M
refused 'records no backing file' '"nbdkit qcow2 .*alone.qcow2" serves it' \
  --filter=qcow2 file "$tmp/base.raw" qcow2-overlay="$tmp/alone.qcow2"
refused 'noise.img: not a qcow2 image' '' --filter=qcow2 file "$tmp/noise.img"
refused 'corrupt.qcow2: image is marked corrupt' 'qemu-img check -r all repairs it' \
  --filter=qcow2 file "$tmp/corrupt.qcow2"

# Our other filters: a bad boolean is one error naming the key (not
# nbdkit_parse_bool's line before it).
refused 'coalesce-fua=maybe: expected true or false' '' \
  --filter=flush-coalesce memory 1M coalesce-fua=maybe
refused 'iostats-append=maybe: expected true or false' '' \
  --filter=iostats memory 1M iostats-append=maybe
refused "latency-fast-zero: expected true or false, not 'maybe'" '' \
  --filter=latency memory 1M latency-fast-zero=maybe

echo "$count refusals, each shaped"
[ "$count" -ge 25 ] || fail "only $count refusals"
