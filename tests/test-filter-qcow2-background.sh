#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter's refusals after nbdkit forked (it opens the plugin
# no earlier) heard as those before the fork, as the man page's "Errors
# at start" says: in the background (no -f), nbdkit exits 1 once the
# filter refused, with the message on its stderr, no pid file (-P) and
# no socket left; with -f the same; under --run, exit 1 with the
# message and no pid file.  Each kind: an overlay FILE that cannot be
# made (no such folder, a file where a folder is) or opened (held by
# QEMU), FILE's size over a filter, an export that is not an image,
# create=true over data, the plugin's own open failing.  A server that
# starts: the first process exits 0 once it is ready (a client then
# connects at once), and a notice it logs at start is heard too.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo

# bg NAME REGEXP NBDKIT-ARGS...: in the background, refused after the
# fork: exit status 1, an error matching REGEXP, only lines of nbdkit's,
# nothing left.
bg ()
{
  local name="$1" re="$2" r=0; shift 2
  timeout -k 5 60 nbdkit -U "$tmp/bg.sock" -P "$tmp/bg.pid" "$@" \
    2> "$tmp/$name.err" || r=$?
  cat "$tmp/$name.err"
  if [ "$r" -eq 0 ] && [ -e "$tmp/bg.pid" ]; then
    kill "$(cat "$tmp/bg.pid")" 2>/dev/null || :
  fi
  [ "$r" -eq 1 ] || fail "$name: in the background, exit status $r, not 1"
  grep -Eq "^nbdkit: error: $re" "$tmp/$name.err" ||
    fail "$name: in the background, no message /$re/"
  message_shape "$tmp/$name.err" || fail "$name: lines not of nbdkit's"
  [ ! -e "$tmp/bg.pid" ] || fail "$name: the pid file is left"
  [ ! -e "$tmp/bg.sock" ] || fail "$name: the socket is left"
  rm -f "$tmp/bg.pid" "$tmp/bg.sock"
}

# modes NAME REGEXP NBDKIT-ARGS...: bg, then with -f (exit 1, the
# message, nothing left), then under --run (exit 1, the message, the
# command's client refused, no pid file).
modes ()
{
  local name="$1" re="$2" r=0; shift 2
  bg "$name" "$re" "$@"
  timeout -k 5 60 nbdkit -f -U "$tmp/fg.sock" -P "$tmp/fg.pid" "$@" \
    2> "$tmp/$name-f.err" || r=$?
  [ "$r" -eq 1 ] || fail "$name: -f, exit status $r, not 1"
  grep -Eq "^nbdkit: error: $re" "$tmp/$name-f.err" ||
    fail "$name: -f: $(cat "$tmp/$name-f.err")"
  [ ! -e "$tmp/fg.pid" ] && [ ! -e "$tmp/fg.sock" ] ||
    fail "$name: -f leaves its pid file or socket"
  r=0
  timeout -k 5 60 nbdkit -U "$tmp/run.sock" -P "$tmp/run.pid" "$@" \
    --run 'nbdinfo --size "$uri"' > "$tmp/$name-run.out" \
    2> "$tmp/$name-run.err" || r=$?
  [ "$r" -eq 1 ] || fail "$name: --run, exit status $r, not 1"
  grep -Eq "^nbdkit: error: $re" "$tmp/$name-run.err" ||
    fail "$name: --run: $(cat "$tmp/$name-run.err")"
  [ ! -s "$tmp/$name-run.out" ] || fail "$name: --run: the client was served"
  [ ! -e "$tmp/run.pid" ] || fail "$name: --run leaves its pid file"
  rm -f "$tmp/run.sock"
}

# An overlay FILE that cannot be made, over the memory plugin (the
# issue's case), and under a regular file.
modes nofolder "qcow2-overlay: making $tmp/none/x.qcow2: No such file or directory$" \
  --filter=qcow2 memory 1G qcow2-overlay="$tmp/none/x.qcow2"
touch "$tmp/reg"
bg notfolder "qcow2-overlay: making $tmp/reg/x.qcow2: Not a directory$" \
  --filter=qcow2 memory 1G qcow2-overlay="$tmp/reg/x.qcow2"

# FILE empty (made at open) and held by QEMU for writing (qemu-io
# sleeping 20 s, killed once the start is refused).
: > "$tmp/held.qcow2"
qemu-io -f raw "$tmp/held.qcow2" -c 'sleep 20000' > /dev/null 2>&1 &
qemu=$!
sleep 1
held=0
(bg held "qcow2-overlay: making $tmp/held.qcow2: failed to get shared \"write\" lock" \
  --filter=qcow2 memory 1G qcow2-overlay="$tmp/held.qcow2") || held=1
kill "$qemu"
wait "$qemu" || :
[ "$held" -eq 0 ] || exit 1

# FILE's size, known once the plugin is open: a filter between.
truncate -s 8M "$tmp/a.raw"
nbdkit -U - --filter=qcow2 file "$tmp/a.raw" qcow2-overlay="$tmp/ov.qcow2" \
  --run true || fail "an overlay over a.raw"
truncate -s 9M "$tmp/a.raw"
modes size "qcow2-overlay: $tmp/ov.qcow2 holds a disk of 8388608 bytes, but the plugin's disk is 9437184 bytes$" \
  --filter=qcow2 --filter=delay file "$tmp/a.raw" qcow2-overlay="$tmp/ov.qcow2"

# No image in the export, with its hint; create=true over data; the
# plugin's own refusal (its message, as with -f).
bg notq "memory export: not a qcow2 image \(magic 0 at offset 0" \
  --filter=qcow2 memory 1M
grep -q "^nbdkit: error: hint: memory export holds no image yet" \
  "$tmp/notq.err" || fail "notq: no hint"
bg data "create=true: data export is not empty \(data at offset 0\)" \
  --filter=qcow2 data "1" size=1M create=true virtual-size=512K
bg plugin "nbd_connect_unix: connect: No such file or directory$" \
  --filter=qcow2 nbd socket="$tmp/none.sock"

# Served: the first process returns once the server is ready, a client
# served at once; a notice at start (an overlay streamed already,
# served alone) on the first process's stderr.
qemu-img create -q -f qcow2 "$tmp/alone.qcow2" 1M
timeout -k 5 60 nbdkit -U "$tmp/ok.sock" -P "$tmp/ok.pid" --filter=qcow2 \
  --filter=delay file "$tmp/a.raw" qcow2-overlay="$tmp/alone.qcow2" \
  qcow2-overlay-stream=true 2> "$tmp/ok.err" || fail "a good start: $(cat "$tmp/ok.err")"
size=$(nbdinfo --size "nbd+unix:///?socket=$tmp/ok.sock") || size=
kill "$(cat "$tmp/ok.pid")"
cat "$tmp/ok.err"
[ "$size" = 1048576 ] || fail "a good start: size $size"
grep -q "^nbdkit: qcow2: notice: $tmp/alone.qcow2: qcow2-overlay-stream=true: .*served alone" \
  "$tmp/ok.err" || fail "a good start: the notice is not heard"
message_shape "$tmp/ok.err" || fail "a good start: lines not of nbdkit's"
echo OK
