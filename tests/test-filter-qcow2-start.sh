#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter and an image it cannot serve (not qcow2, without its
# password or with a wrong one, held by QEMU, marked corrupt): nbdkit
# exits at start with status 1 and one message, in the foreground, in
# the background, and under --run, whose command is refused at once
# (not kept waiting, not told "No such file or directory").  The
# missing password's hint names qcow2-password=.  A corrupt image is
# served with -r, and -v says read-only.  Over the nbd plugin, nbdkit
# logs no "no connection in this thread" at start.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo

# start_fails NAME REGEXP NBDKIT-ARGS...: nbdkit --run exits 1 within
# seconds, the command's client failing (nbdkit exits with the
# command's status, else with the server's if it has exited by then),
# and nbdkit says one thing: an error matching REGEXP.
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
start_fails notq "$tmp/notq.img: not a qcow2 image \(magic" \
  --filter=qcow2 file "$tmp/notq.img"

# The foreground (-f): exits, with the message.
r=0
timeout -k 5 30 nbdkit -f -U "$tmp/f.sock" --filter=qcow2 file "$tmp/notq.img" \
  2> "$tmp/fg.err" || r=$?
[ "$r" -eq 1 ] || fail "nbdkit -f: exit status $r, not 1: $(cat "$tmp/fg.err")"
grep -q "not a qcow2 image" "$tmp/fg.err" || fail "nbdkit -f: $(cat "$tmp/fg.err")"

# The background: nbdkit has forked before the filter opens the image
# (its first process exits 0), and the server then ends.
nbdkit -U "$tmp/bg.sock" -P "$tmp/bg.pid" --filter=qcow2 file "$tmp/notq.img" ||
  fail "nbdkit in the background: its first process failed"
for i in $(seq 100); do
  kill -0 "$(cat "$tmp/bg.pid")" 2>/dev/null || break
  sleep 0.1
done
! kill -0 "$(cat "$tmp/bg.pid")" 2>/dev/null ||
  fail "the background server runs on, with an image it cannot serve"

# LUKS: without the password (the hint names the filter's option), and
# with a wrong one.
qemu_img_pbkdf create -q -f qcow2 --object secret,id=s0,data=right \
  -o encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 \
  "$tmp/luks.qcow2" 4M
start_fails nopw "$tmp/luks.qcow2: the image is encrypted \(LUKS, [^)]*\): give its password with qcow2-password=$" \
  --filter=qcow2 file "$tmp/luks.qcow2"
start_fails wrongpw "$tmp/luks.qcow2: wrong password" \
  --filter=qcow2 file "$tmp/luks.qcow2" qcow2-password=wrong
nbdkit -U - --filter=qcow2 file "$tmp/luks.qcow2" qcow2-password=right \
  --run 'nbdinfo --size "$uri"' > /dev/null || fail "the right password"

# An image a QEMU process holds for writing.
qemu-img create -q -f qcow2 "$tmp/img.qcow2" 4M
mkfifo "$tmp/fifo"
qemu-io -f qcow2 "$tmp/img.qcow2" < "$tmp/fifo" > /dev/null 2>&1 &
exec 3> "$tmp/fifo"
sleep 1
locked=0
(start_fails locked "$tmp/img.qcow2: failed to get \"write\" lock" \
  --filter=qcow2 file "$tmp/img.qcow2") || locked=1
echo quit >&3
exec 3>&-
wait
[ "$locked" -eq 0 ] || exit 1

# Marked corrupt: refused as the plugin refuses it, served with -r, and
# -v says what is served.
cp "$tmp/img.qcow2" "$tmp/corrupt.qcow2"
/usr/bin/python3 "${srcdir:-.}/qcow2-patch.py" "$tmp/corrupt.qcow2" set-bits 72 2
start_fails corrupt "$tmp/corrupt.qcow2: image is marked corrupt .*refusing write access$" \
  --filter=qcow2 file "$tmp/corrupt.qcow2"
grep -q "^qemu-img check -r all repairs it; nbdkit -r serves it read-only$" \
  "$tmp/corrupt.err" || fail "corrupt: no remedy on the next line"
nbdkit -v -U - --filter=qcow2 file "$tmp/corrupt.qcow2" \
  --run 'nbdinfo --size "$uri"' 2> "$tmp/rw.err" &&
  fail "a corrupt image served without -r"
! grep -E "corrupt.qcow2: qcow2 v3, .*read-write" "$tmp/rw.err" ||
  fail "-v says read-write of an image marked corrupt"
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
kill "$(cat "$tmp/raw.pid")"
cat "$tmp/nbd.err"
[ ! -s "$tmp/nbd.err" ] || fail "over the nbd plugin, nbdkit says something at start"
