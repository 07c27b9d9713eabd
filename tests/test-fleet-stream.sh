#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir= with stream=true: each export's image streams while it is open.
#  - three exports over one shared base stream while a client of each
#    writes and reads (every byte checked against a model of its disk);
#    a fourth opens later, and still streams over the base when the
#    first three are cut loose: the base stays open (once) for it, and
#    closes when the last export has detached;
#  - the listing says how far each stream got ("streaming: N%, ...",
#    as file='s description words it), "streaming: not running" for an
#    image not open, nbdinfo --list prints it;
#  - a fifth export, never opened while the others stream, is served
#    from the base as it was, and streams in its turn;
#  - every image then has no backing file, passes qemu-img check and
#    reads as its model (the chain as it was, plus the client's writes);
#  - an image closed mid-stream (idle-close=1) keeps its backing file
#    and what was copied, and at its next open the stream goes on from
#    where it stands, and ends;
#  - nbdkit -r, readonly=true and snapshot= are refused with
#    stream=true;
#  - template=: the template, with no backing file, is served (read-only)
#    as it is; a new export made over it streams and is cut loose.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo
requires_python_nbd
[ -d /proc/self/fd ] || { echo "$0: test skipped: no /proc/PID/fd"; exit 77; }
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

# 16 MiB base: data, a hole, data; each overlay its own bytes.
d="$tmp/vms"
mkdir "$d"
qemu-img create -q -f qcow2 "$d/base.qcow2" 16M
qio "$d/base.qcow2" 'write -P 0x11 0 10M' 'write -P 0x12 12M 4M'
for i in 1 2 3 4 5; do
  qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$d/vm$i"
  qio "$d/vm$i" "write -P $((0x40 + i)) $((i * 1024))k 64k"
done
cp -a "$d" "$tmp/orig"
for i in 1 2 3 4 5; do
  qemu-img convert -f qcow2 -O raw "$d/vm$i" "$tmp/vm$i.model"
done
export d tmp

stream_serve s qcow2 dir="$d" stream=true stream-rate=4M idle-close=0
pid=$(cat "$tmp/s.pid")

/usr/bin/python3 - "$tmp/s.sock" "$pid" <<'PY' || { cat "$tmp/s.log" >&2; fail "streaming exports"; }
import nbd, os, random, re, subprocess, sys, threading, time

sock, pid = sys.argv[1], sys.argv[2]
d, tmp = os.environ["d"], os.environ["tmp"]
base = os.path.realpath(d + "/base.qcow2")
size = 16 << 20

def base_fds():
    return fleetclient.fds_on(pid, base)

import functools
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
connect = functools.partial(fleetclient.connect, sock)
listing = functools.partial(fleetclient.listing, sock)

STREAMED = "no backing file; streamed: no longer depends on its backing chain"
NOT_RUNNING = "backing file base.qcow2; streaming: not running"

errors = []

class Client:
    """A client writing and reading vmN while its image streams, every
    read checked against the model of its disk.
    """
    def __init__(self, n):
        self.name = "vm%d" % n
        self.model = bytearray(open("%s/%s.model" % (tmp, self.name), "rb").read())
        self.h = connect(self.name)
        self.rand = random.Random(n)
        self.stop = False
        # A daemon: a failed check ends the script, not waits on it.
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        try:
            while not self.stop:
                self.step()
                time.sleep(0.005)
        except Exception as e:
            errors.append("%s: %r" % (self.name, e))

    def step(self):
        r = self.rand
        off = r.randrange(0, size - (256 << 10), 512)
        n = r.randrange(512, 256 << 10, 512)
        op = r.random()
        if op < 0.3:
            data = bytes([r.randrange(1, 256)]) * n
            self.h.pwrite(data, off)
            self.model[off:off + n] = data
        elif op < 0.35:
            self.h.zero(n, off)
            self.model[off:off + n] = bytes(n)
        elif op < 0.37:
            self.h.flush()
        else:
            got = self.h.pread(n, off)
            if got != self.model[off:off + n]:
                raise AssertionError("reads otherwise at %d+%d" % (off, n))

    def finish(self):
        self.stop = True
        self.t.join()
        for off in range(0, size, 1 << 20):
            if self.h.pread(1 << 20, off) != self.model[off:off + (1 << 20)]:
                errors.append("%s reads otherwise at %d at the end"
                              % (self.name, off))
        self.h.flush()
        self.h.shutdown()
        with open("%s/%s.model" % (tmp, self.name), "wb") as f:
            f.write(self.model)

def wait_for(what, cond, secs=120):
    for _ in range(secs * 10):
        got = listing()
        if cond(got):
            return got
        assert not errors, errors
        time.sleep(0.1)
    raise AssertionError("%s: %r" % (what, got))

# Nothing open: every overlay waits for a client.
l = listing()
for n in range(1, 6):
    assert NOT_RUNNING in l["vm%d" % n], l
assert base_fds() == 0, "the base open with no export open"

clients = [Client(n) for n in (1, 2, 3)]
l = wait_for("three streams under way",
             lambda l: all("; streaming: " in l["vm%d" % n] and
                           "%" in l["vm%d" % n] for n in (1, 2, 3)))
for n in (1, 2, 3):
    assert l["vm%d" % n].startswith(
        "qcow2, virtual size 16777216 bytes, backing file base.qcow2; "
        "streaming: "), l
assert NOT_RUNNING in l["vm4"] and NOT_RUNNING in l["vm5"], l
assert base_fds() == 1, "the base open %d times for 3 exports" % base_fds()

# nbdinfo --list prints the progress (it opens each export to ask:
# vm4 and vm5 for a moment, which closes them again, idle-close=0).
out = subprocess.run(["nbdinfo", "--list", "nbd+unix:///?socket=" + sock],
                     capture_output=True, text=True).stdout
assert "backing file base.qcow2; streaming: " in out, out

# The fourth starts once the first three are half done: they are cut
# loose before it.
def percent(desc):
    m = re.search(r"; streaming: ([0-9]+)%", desc)
    return int(m.group(1)) if m else 100 if desc.endswith(STREAMED) else 0
wait_for("three streams half done",
         lambda l: all(percent(l["vm%d" % n]) >= 50 for n in (1, 2, 3)))
clients.append(Client(4))
l = wait_for("three detached, the fourth streaming",
             lambda l: all(l["vm%d" % n].endswith(STREAMED)
                           for n in (1, 2, 3)) or
                       l["vm4"].endswith(STREAMED))
fds = base_fds()
l2 = listing()
assert "; streaming: " in l["vm4"] and "; streaming: " in l2["vm4"], \
    "vm4 ended before the others: %r" % l2
assert fds == 1, "the base open %d times for vm4 alone" % fds

l = wait_for("vm4 detached", lambda l: l["vm4"].endswith(STREAMED))
for _ in range(50):
    if base_fds() == 0:
        break
    time.sleep(0.1)
assert base_fds() == 0, "the base still open, no export over it"
for c in clients:
    c.finish()
assert not errors, errors

# vm5, not open while the others streamed: served from the base as it
# was, then streamed too.
assert listing()["vm5"].find("backing file base.qcow2") > 0
clients = [Client(5)]
time.sleep(1)
assert base_fds() == 1
wait_for("vm5 detached", lambda l: l["vm5"].endswith(STREAMED))
clients[0].finish()
assert not errors, errors
PY
stop_server s
for i in 1 2 3 4 5; do
  check_streamed "$d/vm$i" "$tmp/vm$i.model" "" raw
done
qemu-img compare -q "$d/base.qcow2" "$tmp/orig/base.qcow2" ||
  fail "the base changed"
grep -q 'vm1: stream: the image no longer depends on "base.qcow2"' \
  "$tmp/s.log" || fail "no notice of vm1's detach: $(cat "$tmp/s.log")"
message_shape "$tmp/s.log" || fail "a line that is not one of nbdkit's"

# An image closed mid-stream (idle-close=1), then opened again.
rm -rf "$d"
cp -a "$tmp/orig" "$d"
stream_serve i qcow2 dir="$d" stream=true stream-rate=2M idle-close=1
/usr/bin/python3 - "$tmp/i.sock" <<'PY' || { cat "$tmp/i.log" >&2; fail "closed mid-stream"; }
import nbd, os, subprocess, sys, time
sock, d = sys.argv[1], os.environ["d"]

import functools
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
listing = functools.partial(fleetclient.listing, sock)

h = fleetclient.connect(sock, "vm1")
# The stream starts at the first request, not at the open.
assert "streaming: 0%" in listing()["vm1"] or \
    "streaming: starting" in listing()["vm1"], listing()["vm1"]
h.pread(512, 0)
for _ in range(300):
    l = listing()["vm1"]
    if "; streaming: " in l and "%" in l and not "streaming: 0%" in l:
        break
    time.sleep(0.1)
else:
    raise AssertionError("vm1 does not stream: %s" % l)
h.shutdown()
# Closed a second after its client left (its locks then released): the
# stream stops with it.
for _ in range(100):
    l = listing()["vm1"]
    info = subprocess.run(["qemu-img", "info", d + "/vm1"],
                          capture_output=True)
    if "not running" in l and info.returncode == 0:
        break
    time.sleep(0.1)
else:
    raise AssertionError("vm1 still open: %s" % l)
PY
qemu-img info "$d/vm1" | grep -q '^backing file: base.qcow2' ||
  fail "vm1 closed mid-stream lost its backing file"
qemu-img check -q "$d/vm1" || fail "qemu-img check of vm1 closed mid-stream"
qemu-img compare -q "$d/vm1" "$tmp/orig/vm1" ||
  fail "vm1 closed mid-stream reads otherwise"
first=$(sed -n 's/.*vm1: stream: started: \([0-9]*\) bytes.*/\1/p' "$tmp/i.log")
[ -n "$first" ] || fail "no notice at the start: $(cat "$tmp/i.log")"
/usr/bin/python3 - "$tmp/i.sock" <<'PY' || { cat "$tmp/i.log" >&2; fail "the reopened stream"; }
import nbd, sys, time
sock = sys.argv[1]

import functools, os
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
listing = functools.partial(fleetclient.listing, sock)

h = fleetclient.connect(sock, "vm1")
h.pread(512, 0)                 # the first request starts it
for _ in range(600):
    l = listing()["vm1"]
    if l.endswith("streamed: no longer depends on its backing chain"):
        break
    time.sleep(0.1)
else:
    raise AssertionError("vm1 reopened does not end its stream: %s" % l)
h.shutdown()
PY
stop_server i
starts=$(sed -n 's/.*vm1: stream: started: \([0-9]*\) bytes.*/\1/p' "$tmp/i.log")
second=$(echo "$starts" | sed -n 2p)
[ -n "$second" ] && [ "$second" -lt "$first" ] ||
  fail "vm1 reopened copies $second bytes (of $first): not from where it was"
check_streamed "$d/vm1" "$tmp/orig/vm1" ""

# Read-only: nothing to stream into.
expect_refused "stream=true copies the backing chain into each image of dir=, which is served read-only" \
  -r qcow2 dir="$d" stream=true
expect_refused "stream=true copies the backing chain into each image of dir=, which is served read-only" \
  qcow2 dir="$d" stream=true readonly=true
expect_refused "stream=true copies the backing chain into each image of dir=, which is served read-only \\(snapshot=\\)" \
  qcow2 dir="$d" stream=true snapshot=s1

# template=: the template (no backing file) served read-only as it is,
# a new export made over it streams and is cut loose.
stream_serve t qcow2 dir="$d" stream=true template=base.qcow2 idle-close=0
nbdsh -u "nbd+unix:///base.qcow2?socket=$tmp/t.sock" \
  -c 'assert h.is_read_only() and h.pread(4096, 0) == b"\x11" * 4096' ||
  fail "the template served with stream=true"
/usr/bin/python3 - "$tmp/t.sock" <<'PY' || { cat "$tmp/t.log" >&2; fail "a new export streamed"; }
import nbd, sys, time
sock = sys.argv[1]
h = nbd.NBD()
h.set_export_name("new1")
h.set_full_info(True)
h.connect_unix(sock)
h.pwrite(b"N" * 4096, 8 << 20)
for _ in range(600):
    g = nbd.NBD()
    g.set_export_name("new1")
    g.set_full_info(True)
    g.connect_unix(sock)
    desc = g.get_export_description()
    g.shutdown()
    if desc.endswith("streamed: no longer depends on its backing chain"):
        break
    time.sleep(0.1)
else:
    raise AssertionError("new1 does not end its stream: %s" % desc)
assert h.pread(4096, 8 << 20) == b"N" * 4096
assert h.pread(4096, 0) == b"\x11" * 4096
h.shutdown()
PY
stop_server t
cp "$tmp/orig/base.qcow2" "$tmp/new1.ref"
qio "$tmp/new1.ref" 'write -P 0x4e 8M 4k'
check_streamed "$d/new1" "$tmp/new1.ref" ""
echo "$0: ok"
