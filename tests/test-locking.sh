#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Image locking beside QEMU's tools (QEMU's OFD lock bytes), both ways:
#  - while we serve an image read-write, qemu-img info (without -U),
#    qemu-io and qemu-nbd fail on it as against another QEMU process,
#    and qemu-img info -U works; its backing file and its data file
#    cannot be written;
#  - an image qemu-nbd serves read-write is refused at start, with -r
#    too, with a message that says what to do; locking=off serves it;
#  - readers share: nbdkit -r and qemu-nbd -r serve one image at once;
#  - a SIGKILL releases the locks; create=true holds them.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io qemu-nbd nbdinfo

cd "$tmp"
qemu-img create -q -f qcow2 base.qcow2 16M
qemu-img create -q -f qcow2 -b "$tmp/base.qcow2" -F qcow2 top.qcow2
qemu-img create -q -f qcow2 -o data_file="$tmp/img.data" ext.qcow2 16M

# refused CMD...: a QEMU tool must fail with QEMU's lock message.  In
# a file, for the --run commands (run by /bin/sh) too.
cat > "$tmp/refused.sh" <<'EOS'
refused ()
{
  r=0
  "$@" > "$tmp/out" 2>&1 || r=$?
  if [ $r -eq 0 ] || ! grep -q "Is another process using the image" "$tmp/out"
  then
    echo "FAIL: not refused by the lock: $* (exit $r): $(cat "$tmp/out")" >&2
    exit 1
  fi
}
EOS
. "$tmp/refused.sh"
export tmp

# qemu_serve ARGS...: qemu-nbd serving on $tmp/q.sock, pid in qpid.
qemu_serve ()
{
  rm -f "$tmp/q.sock"
  qemu-nbd -t -k "$tmp/q.sock" "$@" &
  qpid=$!
  wait_socket "$tmp/q.sock" $qpid || fail "qemu-nbd $* did not start"
}

# 1. Ours read-write: QEMU's tools keep off.
nbdkit -U - qcow2 top.qcow2 --run '
  set -e
  . "$tmp/refused.sh"
  refused qemu-img info top.qcow2
  refused qemu-io -f qcow2 -c "write 0 512" top.qcow2
  refused qemu-nbd -r -k "$tmp/q.sock" -f qcow2 top.qcow2
  qemu-img info -U top.qcow2 > /dev/null
  refused qemu-io -f qcow2 -c "write 0 512" base.qcow2
  refused qemu-img resize base.qcow2 32M
  # The backing file may be read, as QEMU lets readers share.
  qemu-img info base.qcow2 > /dev/null
' || fail "qemu tools beside a read-write server"
nbdkit -U - qcow2 ext.qcow2 --run '
  . "$tmp/refused.sh"
  refused qemu-io -f raw -c "write 0 512" img.data
' || fail "the data file beside a read-write server"

# 2. qemu-nbd read-write: we keep off, even read-only; locking=off
# lets us through.
qemu_serve -f qcow2 top.qcow2
for ro in "" -r; do
  nbdkit $ro -U - qcow2 top.qcow2 --run true 2> "$tmp/err" &&
    fail "nbdkit $ro served an image qemu-nbd writes"
  grep -A1 "error: .*top.qcow2: failed to get .*\"write\" lock" "$tmp/err" |
    grep -q "error: hint: locking=off serves it anyway" ||
    fail "unclear message: $(cat "$tmp/err")"
done
nbdkit -r -U - qcow2 top.qcow2 locking=off --run 'nbdinfo --size "$uri"' \
  > /dev/null || fail "locking=off"
kill $qpid; wait $qpid || :
# The backing file of an overlay qemu-nbd writes: readable, not writable.
qemu_serve -f qcow2 top.qcow2
nbdkit -r -U - qcow2 base.qcow2 --run 'nbdinfo --size "$uri"' > /dev/null ||
  fail "a backing file qemu-nbd reads could not be read"
nbdkit -U - qcow2 base.qcow2 --run true 2>/dev/null &&
  fail "a backing file qemu-nbd reads was opened for writing"
kill $qpid; wait $qpid || :
# A data file qemu-nbd writes.
qemu_serve -f qcow2 ext.qcow2
nbdkit -U - qcow2 ext.qcow2 --run true 2>/dev/null &&
  fail "an image with a data file qemu-nbd writes was served"
kill $qpid; wait $qpid || :

# 3. Readers share.
qemu_serve -r -f qcow2 top.qcow2
nbdkit -r -U - qcow2 top.qcow2 --run '
  set -e
  . "$tmp/refused.sh"
  nbdinfo --size "$uri" && nbdinfo --size "nbd+unix:///?socket=$tmp/q.sock"
  refused qemu-io -f qcow2 -c "write 0 512" top.qcow2
' > /dev/null || fail "two readers"
kill $qpid; wait $qpid || :

# A snapshot export is a reader, as qemu-nbd -l is: QEMU's readers,
# qemu-nbd -l and another of ours (of another snapshot) share the
# image, a writer does not; it opens the file read-only, saying only
# that it serves read-only, and leaves the file as it was.
qemu-img snapshot -c s1 top.qcow2
qemu-img snapshot -c s2 top.qcow2
sum=$(md5sum < top.qcow2)
nbdkit -U - qcow2 top.qcow2 snapshot=s1 --run '
  set -e
  . "$tmp/refused.sh"
  qemu-img info top.qcow2 > /dev/null
  qemu-img check -q top.qcow2
  qemu-io -r -f qcow2 -c "read 0 512" top.qcow2 > /dev/null
  nbdkit -U - qcow2 top.qcow2 snapshot=s2 --run "nbdinfo --size \"\$uri\""
  qemu-nbd -t -r -l s2 -k "$tmp/q.sock" -f qcow2 top.qcow2 & q=$!
  for i in $(seq 50); do [ -S "$tmp/q.sock" ] && break; sleep 0.1; done
  nbdinfo --size "nbd+unix:///?socket=$tmp/q.sock"
  kill $q; wait $q || :
  refused qemu-io -f qcow2 -c "write 0 512" top.qcow2
  nbdinfo --can write "$uri" && exit 1 || :
' > /dev/null 2> "$tmp/err" || { cat "$tmp/err"; fail "a snapshot export beside readers"; }
[ "$(grep -v "served read-only: a snapshot is served" "$tmp/err")" = "" ] ||
  fail "a snapshot export said: $(cat "$tmp/err")"
[ "$(md5sum < top.qcow2)" = "$sum" ] || fail "a snapshot export changed the image"

# 4. SIGKILL releases the locks.
nbdkit -f -U "$tmp/k.sock" qcow2 top.qcow2 &
kpid=$!
wait_socket "$tmp/k.sock" $kpid || fail "nbdkit did not start"
refused qemu-img info top.qcow2
kill -9 $kpid; wait $kpid 2>/dev/null || :
qemu-img info top.qcow2 > /dev/null || fail "locks left after SIGKILL"

# 5. create=true: the new image is locked as soon as it is served.
nbdkit -U - qcow2 new.qcow2 create=true size=1M --run '
  . "$tmp/refused.sh"
  refused qemu-img info new.qcow2
' || fail "create=true"
echo "$0: ok"
