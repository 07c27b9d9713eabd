#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# control=SOCKET with one image (file=), while a client writes
# byte-granular against a model of its disk:
#  - export-snapshot {id, file} with FILE an absolute path beside the
#    image, then a bare name: FILE holds the data of the instant (read
#    by qemu-img convert -U), the image goes on over it; FILE in another
#    folder, or existing already, refused;
#  - block-commit and block-job-complete: the chain one layer shorter;
#  - block-stream with a speed, paused and resumed, then the server
#    killed (SIGKILL) mid-job: started again with stream=true, it serves
#    every flushed write and goes on from where the stream got to (less
#    left to copy), until the image has no backing file.
# Every file then passes qemu-img check (leaks aside, after the kill)
# and the image reads as its model.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io
requires_python_nbd
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/control-functions.sh"

d="$tmp/img"
mkdir "$d" "$d/other"
qemu-img create -q -f qcow2 "$d/base.qcow2" 16M
qio "$d/base.qcow2" 'write -P 0x11 0 14M'
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$d/top.qcow2"
qio "$d/top.qcow2" 'write -P 0x41 1M 64k'
qemu-img convert -f qcow2 -O raw "$d/top.qcow2" "$tmp/model"
export d tmp

# A Python part against server NAME: the writer, the model kept in
# $tmp/model; its steps in the heredoc on stdin.
control_py ()
{
  /usr/bin/python3 - "$tmp/$1.sock" "$tmp/$1.qmp" ||
    { cat "$tmp/$1.log" >&2; fail "$2"; }
}

control_serve a qcow2 "$d/top.qcow2"
control_py a "snapshot and commit" <<'PY'
import json, os, subprocess, sys, time
import nbd, qmpclient
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient, modelwriter
sock, qmp = sys.argv[1], sys.argv[2]
d, tmp = os.environ["d"], os.environ["tmp"]

def raw(path):
    return modelwriter.image_data(path, tmp + "/raw")

def backing(path):
    info = subprocess.check_output(["qemu-img", "info", "-U",
                                    "--output=json", path])
    return json.loads(info).get("backing-filename")

q = qmpclient.QMP(qmp)
q.negotiate()
[e] = q.execute("query-block-exports")
assert e["id"] == "top.qcow2" and e["node-name"] == d + "/top.qcow2", e
w = modelwriter.Writer(fleetclient.connect(sock, ""),
                       open(tmp + "/model", "rb").read())
for snap in (d + "/frozen1.qcow2", "frozen2.qcow2"):
    path = os.path.join(d, snap)
    time.sleep(0.5)
    frozen = w.pause()
    r = q.execute("export-snapshot", {"id": "top.qcow2", "file": snap})
    assert r["paused-ns"] > 0, r
    w.resume()
    assert raw(path) == frozen, "%s is not the frozen data" % snap
    assert backing(d + "/top.qcow2") == os.path.basename(path)
    assert "exists" in q.refused("export-snapshot", {"id": "top.qcow2",
                                                     "file": snap})
    assert "folder" in q.refused("export-snapshot", {
        "id": "top.qcow2", "file": d + "/other/x.qcow2"})
    assert not os.path.exists(d + "/other/x.qcow2")
    q.execute("block-commit", {"device": "top.qcow2"})
    q.event("BLOCK_JOB_READY", timeout=120)
    q.execute("block-job-complete", {"device": "top.qcow2"})
    e = q.event("BLOCK_JOB_COMPLETED", timeout=30)
    assert "error" not in e["data"], e
    assert not os.path.exists(path), "%s still there" % snap
    assert backing(d + "/top.qcow2") == "base.qcow2"
# A slow stream, paused and resumed, then the writer's data flushed.
q.execute("block-stream", {"device": "top.qcow2", "speed": 256 << 10})
time.sleep(1)
q.execute("block-job-pause", {"device": "top.qcow2"})
time.sleep(0.3)
[j] = q.execute("query-block-jobs")
time.sleep(0.5)
[k] = q.execute("query-block-jobs")
assert j["paused"] and k["offset"] == j["offset"] > 0, (j, k)
q.execute("block-job-resume", {"device": "top.qcow2"})
time.sleep(1)
w.finish()
assert not w.errors, w.errors
open(tmp + "/model", "wb").write(w.model)
[j] = q.execute("query-block-jobs")
assert j["status"] == "running" and j["offset"] < j["len"], j
PY
started=$(grep -c "stream: started" "$tmp/a.log")
[ "$started" = 1 ] || fail "the stream did not start once"
kill -9 "$(cat "$tmp/a.pid")"
for i in $(seq 100); do kill -0 "$(cat "$tmp/a.pid")" 2>/dev/null || break; sleep 0.1; done
# sound FILE: qemu-img check finds no corruption (leaks of what the
# killed server had not flushed aside: 3).
sound ()
{
  local r=0
  qemu-img check -q "$1" >/dev/null || r=$?
  [ "$r" = 0 ] || [ "$r" = 3 ] || fail "qemu-img check $1 says $r"
}
sound "$d/top.qcow2"

control_serve b qcow2 "$d/top.qcow2" stream=true
control_py b "after the kill" <<'PY'
import os, sys, time
import nbd
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
h = fleetclient.connect(sys.argv[1], "")
model = open(os.environ["tmp"] + "/model", "rb").read()
assert h.pread(len(model), 0) == model, "a flushed write lost"
h.shutdown()
PY
for i in $(seq 300); do
  grep -q "no longer depends on" "$tmp/b.log" && break
  sleep 0.1
done
grep -q "no longer depends on" "$tmp/b.log" || fail "the stream did not end"
left() { sed -n 's/.*stream: started: \([0-9]*\) bytes.*/\1/p' "$1"; }
[ "$(left "$tmp/b.log")" -lt "$(left "$tmp/a.log")" ] ||
  fail "the stream started over: $(left "$tmp/b.log") of $(left "$tmp/a.log")"
stop_server b
[ -z "$(qemu-img info "$d/top.qcow2" | grep "^backing file")" ] ||
  fail "top.qcow2 still has a backing file"
for f in "$d"/*.qcow2; do sound "$f"; done
qemu-img compare -q -f qcow2 -F raw "$d/top.qcow2" "$tmp/model" ||
  fail "top.qcow2 does not read as its model"
echo "$0: ok"
