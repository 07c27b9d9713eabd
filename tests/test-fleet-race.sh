#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir=: a name swapped under a tight loop of clients, between an image
# in the folder and a symbolic link to an image outside it (as anyone
# who may rename entries in DIR can): no client is ever served the
# outside image, nor writes to it; no listing describes it; strace
# shows no open of it at all; with openat2 and with the walk done
# without it (NBDKIT_QCOW2_OPENAT2=0).  Every client either gets the
# image inside or a refusal, each naming the export.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io strace
requires_python_nbd
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

d="$tmp/vms"
mkdir "$d"
qemu-img create -q -f qcow2 "$d/.real" 2M
qio "$d/.real" 'write -P 0x11 0 64k'
qemu-img create -q -f qcow2 "$tmp/outside.qcow2" 3M
qio "$tmp/outside.qcow2" 'write -P 0xee 0 64k'
cp "$tmp/outside.qcow2" "$tmp/outside.orig"
ln "$d/.real" "$d/race"
export d tmp

race ()
{
  local name=$1; shift
  env "$@" strace -f -qq -e trace=open,openat,openat2,creat \
    -o "$tmp/$name.strace" nbdkit -f -U "$tmp/$name.sock" \
    -P "$tmp/$name.pid" qcow2 dir="$d" idle-close=0 2>> "$tmp/$name.log" &
  servers+=("$!")
  wait_socket "$tmp/$name.sock" "$!" ||
    { cat "$tmp/$name.log" >&2; fail "$name: nbdkit did not start"; }
  /usr/bin/python3 - "$tmp/$name.sock" <<'PY' ||
import nbd, os, sys, threading, time
sock, d, tmp = sys.argv[1], os.environ["d"], os.environ["tmp"]
outside = tmp + "/outside.qcow2"
stop = False

def swap():
    i = 0
    while not stop:
        t = d + "/.swap"
        if i % 2:
            os.symlink(outside, t)
        else:
            os.link(d + "/.real", t)
        os.rename(t, d + "/race")
        # Two links to one file: rename does nothing, t stays.
        if os.path.lexists(t):
            os.unlink(t)
        i += 1

swapper = threading.Thread(target=swap)
swapper.start()
served = refused = listed = 0
try:
    end = time.time() + 6
    while time.time() < end:
        h = nbd.NBD()
        h.set_export_name("race")
        try:
            h.connect_unix(sock)
        except nbd.Error:
            refused += 1
            continue
        assert h.get_size() == 2 << 20, "served the outside image"
        assert h.pread(512, 0) == b"\x11" * 512, "read the outside image"
        h.pwrite(b"\x22" * 512, 65536)
        h.shutdown()
        served += 1
        if served % 8 == 0:
            got = []
            l = nbd.NBD()
            l.set_opt_mode(True)
            l.connect_unix(sock)
            l.opt_list(lambda name, desc: got.append((name, desc)))
            l.opt_abort()
            for name, desc in got:
                assert "3145728" not in desc, "listed the outside image"
            listed += 1
finally:
    stop = True
    swapper.join()
print("served %d, refused %d, listings %d" % (served, refused, listed))
assert served >= 10 and refused >= 1, "the race was not run"
PY
    { cat "$tmp/$name.log" >&2; fail "$name: a swapped link served"; }
  stop_server "$name"
  wait
  ! grep -F "$tmp/outside.qcow2" "$tmp/$name.strace" ||
    fail "$name: the image outside was opened"
  grep -q 'export "race": refused: it is a link leading out of dir=' \
    "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: no refusal"; }
  cmp "$tmp/outside.qcow2" "$tmp/outside.orig" ||
    fail "$name: the image outside changed"
  ln -f "$d/.real" "$d/race"
  qemu-img check -q "$d/race" || fail "$name: qemu-img check"
  qio "$d/race" 'read -P 0x11 0 64k' 'read -P 0x22 64k 512'
}

race openat2 NBDKIT_QCOW2_OPENAT2=1
race walk NBDKIT_QCOW2_OPENAT2=0
echo "$0: ok"
