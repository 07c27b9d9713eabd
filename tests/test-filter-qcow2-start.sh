#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter and an image it cannot serve, as the man page's
# "Errors at start" says:
#  - over nbdkit's file plugin alone (not qcow2, zeros, a missing
#    backing file, an unknown incompatible feature, without its
#    password or with a wrong one, a password for a clear image, held
#    by QEMU, marked corrupt, create=true over data): refused before
#    nbdkit forks, so that nbdkit in the background (no -f) exits 1
#    with one message on its stderr and leaves no pid file, and under
#    --run exits 1 with it, the command not run (three tries: it used
#    to race); a good image is served, in the background too, locked;
#  - with a filter between (the image read after the fork): with -f,
#    exit 1 and the message; under --run, the command's client is
#    refused at once (not kept waiting, not told "No such file or
#    directory") and nbdkit exits 1; in the background, nbdkit exits 1
#    with the message once the filter refused, leaving no pid file
#    (test-filter-qcow2-background.sh has each kind of refusal).
# The missing password's hint names qcow2-password=.  A corrupt image
# is served with -r, and -v says read-only.  Over the nbd plugin,
# nbdkit logs no "no connection in this thread" at start (nbdkit before
# 1.43.9 does, as the filter opens the plugin for all clients), and
# with -v what nbdkit logs of that open is kept, in order.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo

# refused NAME REGEXP NBDKIT-ARGS...: refused before the fork, in the
# background and under --run $runs times (3; 1 for the refusals beyond
# the issue's, to keep the test short), with one message from nbdkit
# (a hint aside), an error matching REGEXP.
refused ()
{
  local name="$1" re="$2" r i; shift 2
  r=0
  timeout -k 5 60 nbdkit -U "$tmp/bg.sock" -P "$tmp/bg.pid" "$@" \
    2> "$tmp/$name.err" || r=$?
  cat "$tmp/$name.err"
  if [ -e "$tmp/bg.pid" ]; then
    kill "$(cat "$tmp/bg.pid")" 2>/dev/null || true
    fail "$name: started in the background (exit status $r)"
  fi
  [ "$r" -eq 1 ] || fail "$name: in the background, exit status $r, not 1"
  [ "$(grep -v '^nbdkit: error: hint: ' "$tmp/$name.err" |
       grep -c '^nbdkit:')" -eq 1 ] ||
    fail "$name: not exactly one message from nbdkit"
  grep -Eq "^nbdkit: error: $re" "$tmp/$name.err" ||
    fail "$name: the message does not match /$re/"
  for i in $(seq "${runs:-3}"); do
    r=0
    timeout -k 5 60 nbdkit -U - "$@" --run 'echo ran' \
      > "$tmp/run.out" 2> "$tmp/run.err" || r=$?
    [ "$r" -eq 1 ] || fail "$name: --run, exit status $r, not 1"
    [ ! -s "$tmp/run.out" ] || fail "$name: --run ran the command"
    grep -Eq "^nbdkit: error: $re" "$tmp/run.err" ||
      fail "$name: --run: $(cat "$tmp/run.err")"
  done
}

# start_fails NAME REGEXP NBDKIT-ARGS...: refused after the fork:
# nbdkit --run exits 1 within seconds, the command's client failing
# (nbdkit exits with the command's status, else with the server's if
# it has exited by then), and nbdkit says one thing: an error matching
# REGEXP.
start_fails ()
{
  local name="$1" re="$2"; shift 2
  local r=0
  timeout -k 5 60 nbdkit -U - "$@" \
    --run 'nbdinfo --size "$uri"; r=$?; echo "client $r"; exit $r' \
    > "$tmp/$name.out" 2> "$tmp/$name.err" || r=$?
  cat "$tmp/$name.err"
  [ "$r" -eq 1 ] || fail "$name: exit status $r, not 1"
  grep -q '^client [1-9]' "$tmp/$name.out" ||
    fail "$name: the command's client did not fail"
  [ "$(grep -c '^nbdkit:' "$tmp/$name.err")" -eq 1 ] ||
    fail "$name: not exactly one message from nbdkit"
  grep -Eq "^nbdkit: error: $re" "$tmp/$name.err" ||
    fail "$name: the message does not match /$re/"
  ! grep -q 'No such file or directory' "$tmp/$name.err" ||
    fail "$name: the client was told ENOENT"
}

head -c 1M /dev/urandom > "$tmp/notq.img"
refused notq "$tmp/notq.img: not a qcow2 image \(magic" \
  --filter=qcow2 file "$tmp/notq.img"
truncate -s 1M "$tmp/zeros.img"
runs=1 refused zeros "$tmp/zeros.img: not a qcow2 image \(magic 0 " \
  --filter=qcow2 file "$tmp/zeros.img"
grep -q "^nbdkit: error: hint: .*zeros.img holds no image yet" \
  "$tmp/zeros.err" || fail "zeros: no hint"
qemu-img create -q -f qcow2 -u -b gone.raw -F raw "$tmp/orphan.qcow2" 4M
refused orphan "$tmp/orphan.qcow2: cannot open backing file \"$tmp/gone.raw\"" \
  --filter=qcow2 file "$tmp/orphan.qcow2"
qemu-img create -q -f qcow2 "$tmp/feature.qcow2" 4M
/usr/bin/python3 "${srcdir:-.}/qcow2-patch.py" "$tmp/feature.qcow2" set-bits 72 0x80
refused feature "$tmp/feature.qcow2: image uses unsupported incompatible feature\(s\): bit 7" \
  --filter=qcow2 file "$tmp/feature.qcow2"
printf 'data' | dd of="$tmp/data.img" bs=1 seek=$((10 << 20)) conv=notrunc \
  2> /dev/null
truncate -s 12M "$tmp/data.img"
runs=1 refused data "create=true: $tmp/data.img is not empty \(data at offset 10485760\)" \
  --filter=qcow2 file "$tmp/data.img" create=true virtual-size=4M

# With a filter between, the image is read after the fork.  The
# foreground (-f): exits, with the message.
r=0
timeout -k 5 30 nbdkit -f -U "$tmp/f.sock" --filter=qcow2 --filter=delay \
  file "$tmp/notq.img" 2> "$tmp/fg.err" || r=$?
[ "$r" -eq 1 ] || fail "nbdkit -f: exit status $r, not 1: $(cat "$tmp/fg.err")"
grep -q "not a qcow2 image" "$tmp/fg.err" || fail "nbdkit -f: $(cat "$tmp/fg.err")"
start_fails delay "$tmp/notq.img: not a qcow2 image \(magic" \
  --filter=qcow2 --filter=delay file "$tmp/notq.img"
# The background: nbdkit has forked before the filter opens the image;
# its first process waits for the server's word, and exits 1 with the
# message.
r=0
timeout -k 5 30 nbdkit -U "$tmp/bg.sock" -P "$tmp/bg.pid" --filter=qcow2 \
  --filter=delay file "$tmp/notq.img" 2> "$tmp/bg.err" || r=$?
if [ "$r" -eq 0 ]; then
  kill "$(cat "$tmp/bg.pid")" 2>/dev/null || :
  fail "nbdkit in the background: its first process exits 0"
fi
[ "$r" -eq 1 ] || fail "nbdkit in the background: exit status $r, not 1"
grep -q "^nbdkit: error: $tmp/notq.img: not a qcow2 image" "$tmp/bg.err" ||
  fail "nbdkit in the background: $(cat "$tmp/bg.err")"
[ ! -e "$tmp/bg.pid" ] || fail "nbdkit in the background leaves its pid file"

# LUKS: without the password (the hint names the filter's option), and
# with a wrong one; a password for a clear image.
qemu_img_pbkdf create -q -f qcow2 --object secret,id=s0,data=right \
  -o encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 \
  "$tmp/luks.qcow2" 4M
runs=1 refused nopw "$tmp/luks.qcow2: the image is encrypted \(LUKS, [^)]*\): give its password with qcow2-password=$" \
  --filter=qcow2 file "$tmp/luks.qcow2"
runs=1 refused wrongpw "$tmp/luks.qcow2: wrong password" \
  --filter=qcow2 file "$tmp/luks.qcow2" qcow2-password=wrong
nbdkit -U - --filter=qcow2 file "$tmp/luks.qcow2" qcow2-password=right \
  --run 'nbdinfo --size "$uri"' > /dev/null || fail "the right password"
qemu-img create -q -f qcow2 "$tmp/img.qcow2" 4M
runs=1 refused clearpw "$tmp/img.qcow2 is not encrypted, nor is any backing file, but qcow2-password= was given" \
  --filter=qcow2 file "$tmp/img.qcow2" qcow2-password=right

# A good image, in the background: served, and locked after the fork.
nbdkit -U "$tmp/good.sock" -P "$tmp/good.pid" --filter=qcow2 \
  file "$tmp/img.qcow2" || fail "a good image in the background"
wait_socket "$tmp/good.sock" "$(cat "$tmp/good.pid")" || fail "the good server"
size=$(nbdinfo --size "nbd+unix:///?socket=$tmp/good.sock") || size=
qemu-io -f qcow2 "$tmp/img.qcow2" -c 'read 0 512' > /dev/null 2>&1 &&
  locked=no || locked=yes
kill "$(cat "$tmp/good.pid")"
[ "$size" = 4194304 ] || fail "the good image: size $size"
[ "$locked" = yes ] || fail "the good image is not locked once served"

# An image a QEMU process holds for writing.
mkfifo "$tmp/fifo"
qemu-io -f qcow2 "$tmp/img.qcow2" < "$tmp/fifo" > /dev/null 2>&1 &
exec 3> "$tmp/fifo"
sleep 1
locked=0
(refused locked "$tmp/img.qcow2: failed to get \"write\" lock" \
  --filter=qcow2 file "$tmp/img.qcow2") || locked=1
echo quit >&3
exec 3>&-
wait
[ "$locked" -eq 0 ] || exit 1

# Marked corrupt: refused as the plugin refuses it, served with -r, and
# -v says what is served.
cp "$tmp/img.qcow2" "$tmp/corrupt.qcow2"
/usr/bin/python3 "${srcdir:-.}/qcow2-patch.py" "$tmp/corrupt.qcow2" set-bits 72 2
runs=1 refused corrupt "$tmp/corrupt.qcow2: image is marked corrupt .*refusing write access$" \
  --filter=qcow2 file "$tmp/corrupt.qcow2"
grep -q "^nbdkit: error: hint: qemu-img check -r all repairs it; nbdkit -r serves it read-only$" \
  "$tmp/corrupt.err" || fail "corrupt: no remedy in a hint"
nbdkit -v -r -U - --filter=qcow2 file "$tmp/corrupt.qcow2" \
  --run 'nbdinfo "$uri"' > "$tmp/ro.out" 2> "$tmp/ro.err" ||
  fail "nbdkit -r does not serve a corrupt image: $(grep -v debug "$tmp/ro.err")"
grep -q 'is_read_only: true' "$tmp/ro.out" || fail "a corrupt image served writable"
grep -E "corrupt.qcow2: qcow2 v3, .*, read-only$" "$tmp/ro.err" ||
  fail "-v does not say read-only: $(grep corrupt.qcow2 "$tmp/ro.err")"
! grep -E "corrupt.qcow2: qcow2 v3, .*read-write" "$tmp/ro.err" ||
  fail "-v says read-write"

# Over the nbd plugin: quiet at start.
nbdkit -U "$tmp/raw.sock" -P "$tmp/raw.pid" file "$tmp/img.qcow2"
wait_socket "$tmp/raw.sock" "$(cat "$tmp/raw.pid")" || fail "the file server"
nbdkit -U - --filter=qcow2 nbd socket="$tmp/raw.sock" \
  --run 'nbdinfo --size "$uri"' > "$tmp/nbd.out" 2> "$tmp/nbd.err" ||
  { cat "$tmp/nbd.err"; kill "$(cat "$tmp/raw.pid")"; fail "over the nbd plugin"; }
r=0
nbdkit -v -U - --filter=qcow2 nbd socket="$tmp/raw.sock" \
  --run 'nbdinfo --size "$uri"' > "$tmp/nbdv.out" 2> "$tmp/nbdv.err" || r=$?
kill "$(cat "$tmp/raw.pid")"
cat "$tmp/nbd.err"
[ ! -s "$tmp/nbd.err" ] || fail "over the nbd plugin, nbdkit says something at start"
[ "$r" -eq 0 ] || fail "over the nbd plugin, -v: $(grep -v debug "$tmp/nbdv.err")"
! grep -q "no connection in this thread" "$tmp/nbdv.err" ||
  fail "over the nbd plugin, -v: nbdkit logs \"no connection in this thread\""
grep -A1 '^nbdkit: debug: nbd: open readonly=. exportname="" tls=0$' \
  "$tmp/nbdv.err" | grep -q '^nbdkit: debug: nbd: open returned handle' ||
  fail "over the nbd plugin, -v: nbdkit's lines of the open are not kept: $(grep 'nbd: open' "$tmp/nbdv.err")"
