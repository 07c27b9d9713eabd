#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir= with stream=true over a base on an NBD server, shared by the
# exports above it: two exports opened two seconds apart stream from one
# set of connections; when the first is cut loose the connections stay
# for the second, still streaming; when it is cut loose too they close,
# though both exports stay open.  A third, not open meanwhile, connects
# again and reads the base.  Every image is then detached, passes
# qemu-img check and reads as the chain did (with the clients' writes).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io
requires_python_nbd
requires_nbdkit_plugin file
requires_nbdkit_filter log
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

base=$tmp/base.raw
qemu-img create -q -f raw "$base" 4M
qemu-io -f raw -c "write -P 0x11 0 3M" "$base" > /dev/null
nbd_server base --filter=log -r file "$base" logfile="$tmp/base.log"
d="$tmp/vms"
mkdir "$d"
for v in vmA vmB vmC; do
  qemu-img create -q -f qcow2 -b "nbd+unix:///?socket=$tmp/base.sock" \
    -F raw "$d/$v"
  qemu-img convert -f qcow2 -O raw "$d/$v" "$tmp/$v.model"
done
# What QEMU's reading connected, counted out.
before=$(grep -c " Connect " "$tmp/base.log" || true)
export d tmp before

stream_serve s qcow2 dir="$d" stream=true stream-rate=1M idle-close=0
/usr/bin/python3 - "$tmp/s.sock" <<'PY' || { cat "$tmp/s.log" >&2; fail "streaming over an NBD base"; }
import nbd, os, re, sys, time
sock = sys.argv[1]
tmp, before = os.environ["tmp"], int(os.environ["before"])
STREAMED = "no backing file; streamed: no longer depends on its backing chain"

def connections():
    """Connections to the base made since the start, and open now."""
    return fleetclient.connections(tmp + "/base.log", before)

import functools
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
connect = functools.partial(fleetclient.connect, sock)
listing = functools.partial(fleetclient.listing, sock)

def wait_for(what, cond, secs=120):
    for _ in range(secs * 10):
        got = listing()
        if cond(got):
            return got
        time.sleep(0.1)
    raise AssertionError("%s: %r" % (what, got))

models = {v: bytearray(open("%s/%s.model" % (tmp, v), "rb").read())
          for v in ("vmA", "vmB", "vmC")}
handles = {"vmA": connect("vmA")}
handles["vmA"].pwrite(b"A" * 4096, 1 << 20)
models["vmA"][1 << 20:(1 << 20) + 4096] = b"A" * 4096
time.sleep(2)
handles["vmB"] = connect("vmB")
handles["vmB"].pwrite(b"B" * 4096, 2 << 20)
models["vmB"][2 << 20:(2 << 20) + 4096] = b"B" * 4096

wait_for("vmA detached", lambda l: l["vmA"].endswith(STREAMED) or
                                   l["vmB"].endswith(STREAMED))
l1 = listing()
open_now = connections()[1]
l2 = listing()
assert l1["vmA"].endswith(STREAMED) and "; streaming: " in l2["vmB"], \
    "vmB ended before vmA: %r" % l2
assert open_now >= 1, "vmA's detach closed the base vmB streams from"
assert "streaming: not running" in l2["vmC"], l2

wait_for("vmB detached", lambda l: l["vmB"].endswith(STREAMED))
for _ in range(100):
    if connections()[1] == 0:
        break
    time.sleep(0.1)
assert connections()[1] == 0, "connections to the base left open"
made = connections()[0]

# Both still served, from their images alone.
for v in ("vmA", "vmB"):
    assert handles[v].pread(4 << 20, 0) == models[v], v + " reads otherwise"

# vmC, not open meanwhile: the base connected again.
handles["vmC"] = connect("vmC")
assert handles["vmC"].pread(4 << 20, 0) == models["vmC"]
assert connections()[0] > made and connections()[1] >= 1
wait_for("vmC detached", lambda l: l["vmC"].endswith(STREAMED))
for h in handles.values():
    h.flush()
    h.shutdown()
for v, m in models.items():
    open("%s/%s.model" % (tmp, v), "wb").write(m)
PY
stop_server s
for v in vmA vmB vmC; do
  check_streamed "$d/$v" "$tmp/$v.model" "" raw
done
echo "$0: ok"
