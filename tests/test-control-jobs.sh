#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# control=SOCKET's jobs and exports, in a fleet (dir=) whose clients
# write byte-granular against a model of each disk while jobs run:
#  - query-block-exports lists the open exports, their clients;
#  - block-stream with a speed, query-block-jobs, block-job-set-speed,
#    -pause (the offset stays), -resume, the job run to its end:
#    BLOCK_JOB_COMPLETED, and the image no longer has a backing file;
#  - another cancelled: BLOCK_JOB_CANCELLED, its backing file kept;
#  - QEMU's errors: a device not found, a job not found, a job asked
#    twice, an argument unknown or of the wrong type;
#  - block-export-del: safe refused while a client is connected, hard
#    closes the image (its locks released: qemu-img opens it), its
#    client's requests then fail, BLOCK_EXPORT_DELETED; a new client
#    opens it again as usual;
#  - nbdkit-fleet-set changes max-exports= and template= live (logged);
#  - every image then passes qemu-img check and reads as its model.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io
requires_python_nbd
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/control-functions.sh"

d="$tmp/vms"
mkdir "$d"
qemu-img create -q -f qcow2 "$d/base.qcow2" 16M
qio "$d/base.qcow2" 'write -P 0x11 0 12M'
for i in 1 2 3; do
  qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$d/vm$i"
  qio "$d/vm$i" "write -P $((0x40 + i)) $((i * 1024))k 64k"
  qemu-img convert -f qcow2 -O raw "$d/vm$i" "$tmp/vm$i.model"
done
cp "$d/base.qcow2" "$tmp/golden2.qcow2"
export d tmp

control_serve s qcow2 dir="$d" idle-close=0
/usr/bin/python3 - "$tmp/s.sock" "$tmp/s.qmp" <<'PY' || { cat "$tmp/s.log" >&2; fail "jobs"; }
import os, subprocess, sys, time
import nbd, qmpclient
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient, modelwriter
sock, qmp = sys.argv[1], sys.argv[2]
d, tmp = os.environ["d"], os.environ["tmp"]

def writer(n):
    """A client writing and reading its disk against a model while the
    jobs run, byte-granular (and throttled: a VM's pace, not a flood);
    the first 4 MiB only: the stream has the rest to copy."""
    name = "vm%d" % n
    model = open("%s/%s.model" % (tmp, name), "rb").read()
    return modelwriter.Writer(fleetclient.connect(sock, name), model,
                              seed=n, span=4 << 20, writes=0.5, pace=0.002)

def refused(cls, name, args=None):
    try:
        q.execute(name, args)
    except qmpclient.QMPError as e:
        assert e.error_class == cls, (name, args, e.reply)
        return e.desc
    raise AssertionError("%s %r was not refused" % (name, args))

q = qmpclient.QMP(qmp)
q.negotiate()
w = [writer(1), writer(2)]
ex = {e["id"]: e for e in q.execute("query-block-exports")}
assert set(ex) == {"vm1", "vm2"}, ex
assert ex["vm1"]["type"] == "nbd" and ex["vm1"]["clients"] == 1, ex
assert ex["vm1"]["node-name"] == os.path.realpath(d) + "/vm1", ex

# vm1: streamed at 1M/s, paused, sped up, resumed, to the end.
q.execute("block-stream", {"device": "vm1", "speed": 1 << 20})
jobs = q.execute("query-block-jobs")
assert [j["device"] for j in jobs] == ["vm1"], jobs
assert jobs[0]["type"] == "stream" and jobs[0]["speed"] == 1 << 20, jobs
assert "busy" in refused("GenericError", "block-stream", {"device": "vm1"})
time.sleep(1)
q.execute("block-job-pause", {"device": "vm1"})
time.sleep(0.5)
a = q.execute("query-block-jobs")[0]
time.sleep(1)
b = q.execute("query-block-jobs")[0]
assert a["paused"] and a["status"] == "paused", a
assert a["offset"] == b["offset"], (a, b)
q.execute("block-job-set-speed", {"device": "vm1", "speed": 0})
assert q.execute("query-block-jobs")[0]["speed"] == 0
q.execute("block-job-resume", {"device": "vm1"})
e = q.event("BLOCK_JOB_COMPLETED", timeout=120)
assert e["data"]["device"] == "vm1" and "error" not in e["data"], e
assert e["data"]["offset"] == e["data"]["len"], e
assert "timestamp" in e and "seconds" in e["timestamp"], e
assert q.execute("query-block-jobs") == []

# vm2: streamed with its own job id, then cancelled.
q.execute("block-stream", {"device": "vm2", "job-id": "j2", "speed": 256 << 10})
assert q.execute("query-block-jobs")[0]["device"] == "j2"
time.sleep(0.5)
q.execute("block-job-cancel", {"device": "j2"})
e = q.event("BLOCK_JOB_CANCELLED", timeout=30)
assert e["data"]["device"] == "j2", e
assert q.execute("query-block-jobs") == []

# QEMU's errors.
refused("DeviceNotFound", "block-stream", {"device": "nosuch"})
refused("DeviceNotActive", "block-job-pause", {"device": "nosuch"})
refused("DeviceNotActive", "block-job-cancel", {"device": "vm1"})
assert "unexpected" in refused("GenericError", "block-stream",
                                {"device": "vm1", "bogus": 1})
assert "Invalid parameter type" in refused("GenericError", "block-stream",
                                           {"device": 7})
assert "missing" in refused("GenericError", "block-export-del", {})
for i, x in enumerate(w, 1):
    x.finish()
    open("%s/vm%d.model" % (tmp, i), "wb").write(x.model)
errors = [e for x in w for e in x.errors]
assert not errors, errors

# block-export-del: safe refused with a client, hard closes the image.
h = fleetclient.connect(sock, "vm3")
h.pread(512, 0)
assert "in use" in refused("GenericError", "block-export-del", {"id": "vm3"})
q.execute("block-export-del", {"id": "vm3", "mode": "hard"})
e = q.event("BLOCK_EXPORT_DELETED", timeout=10)
assert e["data"] == {"id": "vm3"}, e
subprocess.check_call(["qemu-img", "info", d + "/vm3"],
                      stdout=subprocess.DEVNULL)
try:
    h.pread(512, 0)
    raise AssertionError("a deleted export still served")
except nbd.Error:
    pass
try:
    h.shutdown()
except nbd.Error:
    pass                        # dropped (nbdkit 1.34 on): gone already
h = fleetclient.connect(sock, "vm3")
assert h.pread(512, 3 << 20) == b"\x43" * 512
h.shutdown()
refused("GenericError", "block-export-del", {"id": "nosuch"})

# The fleet's keys, live (once the server has seen its clients leave).
for i in range(50):
    if not q.execute("query-block-exports"):
        break
    time.sleep(0.1)
f = q.execute("nbdkit-fleet-set", {"max-exports": 1})
assert f["max-exports"] == 1 and f["template"] is None, f
for i in range(100):            # an image still closing counts
    try:
        a = fleetclient.connect(sock, "vm1")
        break
    except nbd.Error:
        time.sleep(0.1)
else:
    raise AssertionError("max-exports=1 let no image open")
try:
    fleetclient.connect(sock, "vm2")
    raise AssertionError("max-exports=1 let a second image open")
except nbd.Error:
    pass
a.shutdown()
refused("GenericError", "nbdkit-fleet-set", {"template": "nosuch.qcow2"})
assert q.execute("nbdkit-query-fleet")["template"] is None
q.execute("nbdkit-fleet-set", {"template": tmp + "/golden2.qcow2",
                               "max-exports": 0})
n = fleetclient.connect(sock, "new1")
assert n.pread(512, 0) == b"\x11" * 512
n.shutdown()
PY
stop_server s
grep -q "notice: .*control: max-exports=1 from now on" "$tmp/s.log" ||
  fail "a change of a key not logged"
grep -q "notice: .*event: BLOCK_JOB_COMPLETED" "$tmp/s.log" ||
  fail "an event not logged"
qemu-img info "$d/vm1" | grep -q '^backing file' && fail "vm1 still backed"
qemu-img info "$d/vm2" | grep -q '^backing file: base.qcow2' ||
  fail "vm2, cancelled, lost its backing file"
for i in 1 2 3; do
  qemu-img check -q "$d/vm$i" || fail "qemu-img check vm$i"
done
for i in 1 2; do
  qemu-img compare -q -f qcow2 -F raw "$d/vm$i" "$tmp/vm$i.model" ||
    fail "vm$i does not read as its model"
done
qemu-img compare -q "$d/base.qcow2" "$tmp/golden2.qcow2" ||
  fail "the base changed"
echo "$0: ok"
