#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A live snapshot and a live commit on the control socket, in a fleet,
# while a client writes byte-granular against a model of its disk:
#  - export-snapshot {id: vm1, file: NAME}: NAME holds vm1's data as of
#    that instant, read back by qemu-img convert -U and as a read-only
#    export at once; vm1 goes on, an overlay of NAME, no client
#    reconnecting; the writers' pause is reported;
#  - block-commit {device: vm1}: BLOCK_JOB_READY, block-job-complete:
#    BLOCK_JOB_COMPLETED, the chain one layer shorter (vm1 over the base
#    again, NAME gone, and not held open), query-block-jobs shows the
#    job as "commit";
#  - twice over, then every image passes qemu-img check and vm1 reads
#    as its model; the golden base never changes;
#  - refusals: a snapshot name that exists, or is refused as an export
#    name; a commit into the base every VM shares (the template, or
#    another image on it), a commit asked twice.
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
for v in vm1 vm2; do
  qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$d/$v"
done
qio "$d/vm1" 'write -P 0x41 1M 64k'
qemu-img convert -f qcow2 -O raw "$d/vm1" "$tmp/vm1.model"
cp "$d/base.qcow2" "$tmp/base.orig"
export d tmp

control_serve s qcow2 dir="$d" idle-close=0 template=base.qcow2
/usr/bin/python3 - "$tmp/s.sock" "$tmp/s.qmp" <<'PY' || { cat "$tmp/s.log" >&2; fail "snapshot and commit"; }
import os, subprocess, sys, time
import nbd, qmpclient
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient, modelwriter
sock, qmp = sys.argv[1], sys.argv[2]
d, tmp = os.environ["d"], os.environ["tmp"]
size = 16 << 20

def raw(path):
    return modelwriter.image_data(path, tmp + "/raw")

def deleted_held():
    """The deleted files the server holds open."""
    pid = open(tmp + "/s.pid").read().strip()
    held = []
    for fd in os.listdir("/proc/%s/fd" % pid):
        try:
            held.append(os.readlink("/proc/%s/fd/%s" % (pid, fd)))
        except FileNotFoundError:
            pass
    return [f for f in held if f.endswith(" (deleted)")]

q = qmpclient.QMP(qmp)
q.negotiate()
w = modelwriter.Writer(fleetclient.connect(sock, "vm1"),
                       open(tmp + "/vm1.model", "rb").read())
for round in (1, 2):
    snap = "vm1-snap%d" % round
    time.sleep(1)
    frozen = w.pause()
    r = q.execute("export-snapshot", {"id": "vm1", "file": snap})
    assert r["paused-ns"] > 0, r
    w.resume()
    time.sleep(1)
    # The frozen data, at once: by QEMU's tools and as an export.
    assert raw(d + "/" + snap) == frozen, "%s is not the frozen data" % snap
    h = fleetclient.connect(sock, snap)
    assert h.is_read_only(), "%s served writable" % snap
    assert h.pread(size, 0) == frozen, "export %s reads otherwise" % snap
    h.shutdown()
    info = subprocess.check_output(["qemu-img", "info", "-U", d + "/vm1"],
                                   text=True)
    assert "backing file: " + snap in info, info
    assert "already" in q.refused("export-snapshot", {"id": "vm1",
                                                      "file": snap})
    assert "refused" in q.refused("export-snapshot", {"id": "vm1",
                                                      "file": "../x"})
    # The commit, while the writer goes on.
    q.execute("block-commit", {"device": "vm1", "speed": 32 << 20})
    assert "busy" in q.refused("block-commit", {"device": "vm1"})
    jobs = q.execute("query-block-jobs")
    assert [j["type"] for j in jobs] == ["commit"], jobs
    e = q.event("BLOCK_JOB_READY", timeout=120)
    assert e["data"]["device"] == "vm1", e
    time.sleep(0.5)
    q.execute("block-job-complete", {"device": "vm1"})
    e = q.event("BLOCK_JOB_COMPLETED", timeout=30)
    assert "error" not in e["data"], e
    assert q.execute("query-block-jobs") == []
    assert not os.path.exists(d + "/" + snap), "%s still there" % snap
    # The old top's file, held across the switch, is closed once the
    # event is out.
    assert not deleted_held(), deleted_held()
    info = subprocess.check_output(["qemu-img", "info", "-U", d + "/vm1"],
                                   text=True)
    assert "backing file: base.qcow2" in info, info
w.finish()
assert not w.errors, w.errors
open(tmp + "/vm1.model", "wb").write(w.model)
# Refused: the base every VM shares.
assert "template" in q.refused("block-commit", {"device": "vm2"})
PY
stop_server s
for f in "$d"/*; do
  qemu-img check -q "$f" || fail "qemu-img check $f"
done
qemu-img compare -q -f qcow2 -F raw "$d/vm1" "$tmp/vm1.model" ||
  fail "vm1 does not read as its model"
qemu-img compare -q "$d/base.qcow2" "$tmp/base.orig" || fail "the base changed"
grep -q "notice: .*export-snapshot: vm1 frozen as vm1-snap1, clients held off" \
  "$tmp/s.log" || fail "the snapshot not logged"
echo "$0: ok"
