#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir=: a backing layer on an NBD server, shared by the exports above
# it: 24 exports over one base served by nbdkit on a Unix socket, all
# connected and read at once (each read checked against what qemu-img
# convert reads of its overlay), make one set of connections to the
# base's server (at most nbdio's NBDIO_MAX_CONNS, where one per export
# would be 24 or more), closed with the last export.  Then, the base's
# server slow to open a connection (200 ms), all connected at once with
# none open before: the exports opened together wait for the one
# opening the base, which still makes one set of connections.  Last,
# the base's server gone: every export opened at once is refused (the
# ones that waited for a failed opening try on their own), none hangs.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io
requires_python_nbd
requires_nbdkit_plugin file
requires_nbdkit_filter log
source "${srcdir:-.}/remote-functions.sh"

n=24
base=$tmp/base.raw
qemu-img create -q -f raw "$base" 4M
qemu-io -f raw -c "write -P 0x11 0 3M" "$base" > /dev/null
nbd_server base --filter=log -r file "$base" logfile="$tmp/base.log"
d="$tmp/vms"
mkdir "$d"
for i in $(seq 0 $((n - 1))); do
  v=$(printf "vm%02d" "$i")
  qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$tmp/base.sock" \
    -F raw "$d/$v"
  qemu-io -f qcow2 -c "write -P $((i + 1)) $((i * 64))k 4k" "$d/$v" > /dev/null
  qemu-img convert -f qcow2 -O raw "$d/$v" "$tmp/$v.raw"
done
# What QEMU's reading connected, counted out.
before=$(grep -c " Connect " "$tmp/base.log" || true)
export d tmp n before

nbdkit -U - qcow2 dir="$d" idle-close=0 --run '
/usr/bin/python3 - "$unixsocket" <<"PY"
import nbd, os, re, sys, threading, time
sock = sys.argv[1]
tmp, n, before = os.environ["tmp"], int(os.environ["n"]), int(os.environ["before"])
size = 4 << 20
MAX_CONNS = 4                   # NBDIO_MAX_CONNS (common/nbdio/nbdio.h)

def connections():
    """Connections to the base made since the start, and open now."""
    return fleetclient.connections(tmp + "/base.log", before)

import functools
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
connect = functools.partial(fleetclient.connect, sock)

names = ["vm%02d" % i for i in range(n)]
# The first alone, the others all at once.
handles = {names[0]: connect(names[0])}
def open_one(v):
    handles[v] = connect(v)
ts = [threading.Thread(target=open_one, args=(v,)) for v in names[1:]]
for t in ts: t.start()
for t in ts: t.join()
assert len(handles) == n

errors = []
def check(v):
    try:
        want = open("%s/%s.raw" % (tmp, v), "rb").read()
        for off in range(0, size, 1 << 20):
            if handles[v].pread(1 << 20, off) != want[off:off + (1 << 20)]:
                errors.append("%s differs at %d" % (v, off))
    except Exception as e:
        errors.append("%s: %s" % (v, e))
ts = [threading.Thread(target=check, args=(v,)) for v in names]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors[:5]

made, open_now = connections()
assert 1 <= open_now <= MAX_CONNS, \
    "%d connections open to the base for %d exports" % (open_now, n)
assert made <= MAX_CONNS, "%d connections made for %d exports" % (made, n)

for h in handles.values():
    h.shutdown()
for _ in range(100):
    if connections()[1] == 0:
        break
    time.sleep(0.1)
assert connections()[1] == 0, "connections to the base left open"
PY
' 2> "$tmp/err" || { cat "$tmp/err"; fail "exports over one NBD base"; }

stop_server base
nbd_server base --filter=delay --filter=log -r file "$base" \
  logfile="$tmp/base2.log" delay-open=200ms
nbdkit -U - qcow2 dir="$d" --run '
/usr/bin/python3 - "$unixsocket" <<"PY"
import nbd, os, re, sys, threading
sock, tmp, n = sys.argv[1], os.environ["tmp"], int(os.environ["n"])
MAX_CONNS = 4                   # NBDIO_MAX_CONNS (common/nbdio/nbdio.h)
errors = []
def open_read(v):
    try:
        h = nbd.NBD()
        h.set_export_name(v)
        h.connect_unix(sock)
        want = open("%s/%s.raw" % (tmp, v), "rb").read(1 << 20)
        if h.pread(1 << 20, 0) != want:
            errors.append("%s differs" % v)
        h.shutdown()
    except Exception as e:
        errors.append("%s: %s" % (v, e))
ts = [threading.Thread(target=open_read, args=("vm%02d" % i,))
      for i in range(n)]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors[:5]
made = len(re.findall(r" Connect ", open(tmp + "/base2.log").read()))
assert 1 <= made <= MAX_CONNS, \
    "%d connections made for %d exports opened at once" % (made, n)
PY
' 2> "$tmp/err" || { cat "$tmp/err"; fail "exports opened at once"; }

stop_server base
nbdkit -U - qcow2 dir="$d" --run '
/usr/bin/python3 - "$unixsocket" <<"PY"
import nbd, os, sys, threading
sock, n = sys.argv[1], int(os.environ["n"])
served = []
def try_open(v):
    try:
        h = nbd.NBD()
        h.set_export_name(v)
        h.connect_unix(sock)
        served.append(v)
    except nbd.Error:
        pass
ts = [threading.Thread(target=try_open, args=("vm%02d" % i,), daemon=True)
      for i in range(n)]
for t in ts: t.start()
for t in ts: t.join(60)
assert not any(t.is_alive() for t in ts), "an export still opening after 60 s"
assert not served, "served without their base: %s" % served[:5]
PY
' 2> "$tmp/err" || { cat "$tmp/err"; fail "exports over a base gone"; }
grep -c "vm[0-9][0-9].*base.sock" "$tmp/err" > /dev/null ||
  { cat "$tmp/err"; fail "no message naming the base gone"; }
echo "$0: ok"
