#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir=: a backing layer shared by the open exports above it.
#  - 100 exports over one base, all connected at once: the base is open
#    once (one descriptor in nbdkit's /proc/PID/fd), each export reads
#    as qemu-img convert reads its overlay;
#  - half of them closed while the others keep reading (each read
#    checked): the base stays open, once; closed with the last export;
#  - the base asked for as an export while overlays use it is served
#    read-only (a write refused), said in one line naming it and why;
#    the other way round (the base open for writing), an overlay is
#    refused, one line naming the export that writes its base; with
#    QEMU's image locks (locking=on) and without them (locking=off),
#    never blaming another process.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io
requires_python_nbd
[ -d /proc/self/fd ] || { echo "$0: test skipped: no /proc/PID/fd"; exit 77; }

n=100
d="$tmp/vms"
mkdir "$d"
qemu-img create -q -f qcow2 "$d/base.qcow2" 4M
qemu-io -f qcow2 -c "write -P 0x5a 0 4M" "$d/base.qcow2" > /dev/null
for i in $(seq 0 $((n - 1))); do
  v=$(printf "vm%03d" "$i")
  qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$d/$v"
  # Each its own bytes somewhere, so that a mix-up shows.
  qemu-io -f qcow2 -c "write -P $((i + 1)) $((i * 40))k 8k" "$d/$v" > /dev/null
  qemu-img convert -f qcow2 -O raw "$d/$v" "$tmp/$v.raw"
done
export d tmp n

shared_run ()
{
  nbdkit -t 2 -U - -P "$tmp/pid" qcow2 dir="$d" idle-close=0 "$@" --run '
/usr/bin/python3 - "$unixsocket" "$tmp/pid" <<"PY"
import nbd, os, sys, threading
sock, pidfile = sys.argv[1], sys.argv[2]
d, tmp, n = os.environ["d"], os.environ["tmp"], int(os.environ["n"])
base = os.path.realpath(d + "/base.qcow2")
size = 4 << 20

def base_fds():
    return fleetclient.fds_on(pid, base)

import functools
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
connect = functools.partial(fleetclient.connect, sock)

def refused(name, why):
    try:
        connect(name)
    except nbd.Error:
        return
    raise AssertionError("%s served: %s" % (name, why))

names = ["vm%03d" % i for i in range(n)]
handles = {v: connect(v) for v in names}
# Read only now: nbdkit starts the --run command before it writes its
# -P file, and writes it before it accepts a connection.
pid = open(pidfile).read().strip()
assert base_fds() == 1, "base open %d times for %d exports" % (base_fds(), n)
w = connect("base.qcow2")
assert w.is_read_only(), "base.qcow2 writable while %d exports read it" % n
try:
    w.pwrite(b"W" * 512, 0)
    raise AssertionError("base.qcow2 written while %d exports read it" % n)
except nbd.Error:
    pass
w.shutdown()

errors = []
def check(v, rounds):
    try:
        want = open("%s/%s.raw" % (tmp, v), "rb").read()
        for _ in range(rounds):
            for off in range(0, size, 1 << 20):
                if handles[v].pread(1 << 20, off) != want[off:off + (1 << 20)]:
                    errors.append("%s differs at %d" % (v, off))
                    return
    except Exception as e:
        errors.append("%s: %s" % (v, e))

# Every export read whole, all at once.
ts = [threading.Thread(target=check, args=(v, 1)) for v in names]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors[:5]

# Half closed while the other half reads.
readers = [threading.Thread(target=check, args=(v, 3)) for v in names[n//2:]]
for t in readers: t.start()
for v in names[:n//2]:
    handles.pop(v).shutdown()
for t in readers: t.join()
assert not errors, errors[:5]
assert base_fds() == 1, "base open %d times after half closed" % base_fds()
for h in handles.values():
    h.shutdown()
handles.clear()

# The images close as their clients leave (idle-close=0).
import time
for _ in range(100):
    if base_fds() == 0:
        break
    time.sleep(0.1)
assert base_fds() == 0, "base still open with no export using it"

# The other way round: the base written, an overlay refused.
h = connect("base.qcow2")
refused("vm000", "over a base open for writing")
h.shutdown()
# Once the base is closed, the overlay is served again.
for _ in range(100):
    if base_fds() == 0:
        break
    time.sleep(0.1)
connect("vm000").shutdown()
PY
' 2> "$tmp/err" || { cat "$tmp/err"; fail "shared base, $*"; }
}

for locking in off on; do
  shared_run locking=$locking
  # One line each, naming the export and why.
  grep -E "base\.qcow2: served read-only: it is the backing file of images open here" \
    "$tmp/err" > /dev/null ||
    { cat "$tmp/err"; fail "locking=$locking: the base's notice"; }
  grep -E "vm000: backing file \".*/base\.qcow2\" refused: it is open here for writing, an image of its own" \
    "$tmp/err" > /dev/null ||
    { cat "$tmp/err"; fail "locking=$locking: the overlay's refusal"; }
  [ "$(grep -c "vm000" "$tmp/err")" = 1 ] ||
    { cat "$tmp/err"; fail "locking=$locking: not one line"; }
  ! grep -Eq "another process|locking=off" "$tmp/err" ||
    { cat "$tmp/err"; fail "locking=$locking: blamed on another process"; }
done
echo "$0: ok"
