#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir=: an image is closed idle-close= seconds after its last client
# left (its locks then released), not before; an export deleted (or
# replaced) while served keeps its clients, and new clients get that
# open image too until the last has left, then the file of that name
# or nothing, each step logged; the base of an overlay in use, asked
# for as an export, is served read-only (said once), and writable once
# the overlay is idle; password= opens an encrypted image each time it
# is opened.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
requires_python_nbd

d="$tmp/vms"
mkdir "$d"
qemu-img create -q -f qcow2 "$d/base.qcow2" 4M
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$d/vm1"
qemu-img create -q -f qcow2 "$d/vm2" 2M
export d tmp

# locked NAME: whether our server holds the image's locks.
cat > "$tmp/locked.sh" <<'EOS'
locked () { ! qemu-img info "$d/$1" > /dev/null 2>&1; }
EOS
. "$tmp/locked.sh"

nbdkit -U - qcow2 dir="$d" idle-close=2 --run '
  set -e
  . "$tmp/locked.sh"
  nbdinfo --size "nbd+unix:///vm1?socket=$unixsocket" > /dev/null
  sleep 0.5
  locked vm1 || { echo "vm1 closed before idle-close=2"; exit 1; }
  for i in $(seq 40); do locked vm1 || break; sleep 0.1; done
  ! locked vm1 || { echo "vm1 still open 6 s after its client left"; exit 1; }
' 2> "$tmp/err" || { cat "$tmp/err"; fail "idle-close=2"; }

nbdkit -U - qcow2 dir="$d" idle-close=0 --run '
/usr/bin/python3 - "$unixsocket" <<"PY"
import nbd, os, subprocess, sys, time
sock, d = sys.argv[1], os.environ["d"]
import functools
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
connect = functools.partial(fleetclient.connect, sock)

def refused(name):
    try:
        connect(name)
    except nbd.Error:
        return True
    return False
# Deleted while served: its client goes on, and so does a new one, on
# the open image (the name is not remade under a VM writing to it),
# until the last has left; then the name is the file it names, if any.
a = connect("vm2")
a.pwrite(b"A" * 4096, 0)
os.unlink(d + "/vm2")
c = connect("vm2")
assert c.get_size() == 2 << 20 and c.pread(4096, 0) == b"A" * 4096, \
    "a new client of a deleted export got another disk"
a.pwrite(b"B" * 4096, 4096)
a.flush()
assert c.pread(8192, 0) == b"A" * 4096 + b"B" * 4096
subprocess.check_call(["qemu-img", "create", "-q", "-f", "qcow2",
                       d + "/vm2", "1M"])
e = connect("vm2")
assert e.get_size() == 2 << 20, "a replaced name served its new file early"
for h in (a, c, e):
    h.shutdown()
for i in range(50):             # closed when the server sees them leave
    b = connect("vm2")
    if b.get_size() == 1 << 20:
        break
    b.shutdown()
    time.sleep(0.1)
else:
    raise AssertionError("the deleted image stays served, its clients gone")
assert b.pread(4096, 0) == b"\0" * 4096
b.shutdown()
os.unlink(d + "/vm2")
for i in range(50):
    if refused("vm2"):
        break
    time.sleep(0.1)
else:
    raise AssertionError("a deleted export served, no client left")
# The base of an overlay in use: served read-only, not refused.
o = connect("vm1")
w = connect("base.qcow2")
assert w.is_read_only(), "the base of an overlay in use was served writable"
try:
    w.pwrite(b"W" * 512, 0)
    raise AssertionError("the base of an overlay in use was written")
except nbd.Error:
    pass
w.shutdown()
o.pwrite(b"O" * 512, 0)
o.shutdown()
for i in range(50):             # closed when the server sees it leave
    w = connect("base.qcow2")
    ro = w.is_read_only()
    w.shutdown()
    if not ro:
        break
    time.sleep(0.1)
else:
    raise AssertionError("the base of an idle overlay stays read-only")
PY
' 2> "$tmp/err" || { cat "$tmp/err"; fail "deleted, base in use"; }
for re in 'notice: .*/vm2: export "vm2": its file was deleted while 1 client\(s\) used it: they and new clients keep the open image' \
          'notice: .*/vm2: export "vm2": closed: its file was deleted or replaced while it was open, and its last client left' \
          'export "vm2": no such image in' \
          'notice: .*/base.qcow2: served read-only: it is the backing file of images open here'; do
  grep -Eq "$re" "$tmp/err" || { cat "$tmp/err"; fail "no message /$re/"; }
done
! grep -Eq 'another process|locking=off' "$tmp/err" ||
  { cat "$tmp/err"; fail "an export of ours blamed on another process"; }
qemu-img check -q "$d/vm1" && qemu-img check -q "$d/base.qcow2" ||
  fail "qemu-img check"
qio "$d/vm1" "read -P 0x4f 0 512"

# password=: kept for the images opened later, each time one is.
e="$tmp/enc"
mkdir "$e"
qemu_img_pbkdf create -q --object secret,id=sec0,data=pw -f qcow2 \
  -o encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10 \
  "$e/disk" 1M || fail "qemu-img create (LUKS)"
nbdkit -U - qcow2 dir="$e" password=pw idle-close=0 --run '
  set -e
  for i in 1 2; do
    nbdsh -u "nbd+unix:///disk?socket=$unixsocket" -c "h.pwrite(b\"E\" * 512, 0)"
    sleep 0.3
  done
' || fail "an encrypted image, opened twice"
QEMU_SECRET=pw qio "$e/disk" "read -P 0x45 0 512"

# The server stopped while clients are still connected (nbdkit quits
# without closing their connections): every image closed all the same,
# with what they flushed, and nbdkit exits 0.
qemu-img create -q -f qcow2 "$d/vm3" 1M
r=0
nbdkit -U - qcow2 dir="$d" --run '
  set -e
  for v in vm1 vm3; do
    nbdsh -u "nbd+unix:///$v?socket=$unixsocket" \
      -c "h.pwrite(b\"Q\" * 512, 512); h.flush()" \
      -c "open(\"$tmp/$v.ready\", \"w\").close()" \
      -c "import time; time.sleep(60)" &
    echo $! >> "$tmp/holders"
  done
  for i in $(seq 100); do
    [ -e "$tmp/vm1.ready" ] && [ -e "$tmp/vm3.ready" ] && exit 0
    sleep 0.1
  done
  exit 1
' 2> "$tmp/err" || r=$?
kill $(cat "$tmp/holders") 2>/dev/null || :
# (The server's own end is not --run's exit status: its messages are.)
[ $r -eq 0 ] && [ ! -s "$tmp/err" ] ||
  { cat "$tmp/err"; fail "stopped with clients connected: exit $r"; }
for v in vm1 vm3; do
  qemu-img check -q "$d/$v" || fail "qemu-img check $v after the stop"
  qio "$d/$v" "read -P 0x51 512 512"
done
echo "$0: ok"
