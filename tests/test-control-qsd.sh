#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The same job sequences driven on copies of the same images against
# qemu-storage-daemon's QMP and against control=SOCKET, the final
# images compared with qemu-img compare:
#  - a stream with a speed, paused, resumed, sped up, run to its end
#    (both cut loose from the base); another cancelled (both keep it);
#  - writes over NBD, a snapshot (QEMU's blockdev-snapshot-sync, ours
#    export-snapshot), more writes, an active commit with writes while
#    it runs, completed: the disk each ends with reads the same.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io qemu-storage-daemon
requires_python_nbd
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/control-functions.sh"

for who in ours qsd; do
  mkdir "$tmp/$who"
  qemu-img create -q -f qcow2 "$tmp/$who/base.qcow2" 16M
  qio "$tmp/$who/base.qcow2" 'write -P 0x11 0 12M'
  for v in vm1 vm2 vm3; do
    qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$tmp/$who/$v"
    qio "$tmp/$who/$v" "write -P 0x44 4M 64k"
  done
done
export tmp

qsd ()
{
  local args=()
  for v in vm1 vm2 vm3; do
    args+=(--blockdev "driver=file,filename=$tmp/qsd/$v,node-name=f-$v"
           --blockdev "driver=qcow2,file=f-$v,node-name=$v")
  done
  qemu-storage-daemon "${args[@]}" \
    --chardev socket,id=c0,path="$tmp/qsd.qmp",server=on,wait=off \
    --monitor chardev=c0 \
    --nbd-server addr.type=unix,addr.path="$tmp/qsd.sock" \
    --export type=nbd,id=e-vm3,node-name=vm3,name=vm3,writable=on \
    2> "$tmp/qsd.log" &
  qsd_pid=$!
  servers+=("$qsd_pid")
  disown "$qsd_pid"
  wait_socket "$tmp/qsd.qmp" "$qsd_pid" || { cat "$tmp/qsd.log"; fail "qsd"; }
}
qsd
control_serve ours qcow2 dir="$tmp/ours" idle-close=0

/usr/bin/python3 - "$tmp/ours.qmp" "$tmp/qsd.qmp" "$tmp/ours.sock" \
  "$tmp/qsd.sock" <<'PY' || { cat "$tmp/ours.log" "$tmp/qsd.log" >&2; fail "the same sequence"; }
import os, sys, time
import nbd, qmpclient
tmp = os.environ["tmp"]
qo, qq = qmpclient.QMP(sys.argv[1]), qmpclient.QMP(sys.argv[2])
for q in (qo, qq):
    q.negotiate()

def both(name, args_ours, args_qsd=None):
    qo.execute(name, args_ours)
    qq.execute(name, args_ours if args_qsd is None else args_qsd)

def nbd_at(sock, name):
    h = nbd.NBD()
    h.set_export_name(name)
    h.connect_unix(sock)
    return h

def ended(name, job):
    for q in (qo, qq):
        e = q.event(name, timeout=120)
        assert e["data"]["device"] == job, (name, e)
        assert "error" not in e["data"], e

# vm1: a stream with a speed, paused, resumed, sped up, to its end.
both("block-stream", {"device": "vm1", "job-id": "s1", "speed": 1 << 20})
time.sleep(0.5)
both("block-job-pause", {"device": "s1"})
time.sleep(0.5)
both("block-job-resume", {"device": "s1"})
both("block-job-set-speed", {"device": "s1", "speed": 0})
ended("BLOCK_JOB_COMPLETED", "s1")
# vm2: a stream cancelled at once.
both("block-stream", {"device": "vm2", "job-id": "s2", "speed": 64 << 10})
both("block-job-cancel", {"device": "s2"})
ended("BLOCK_JOB_CANCELLED", "s2")

# vm3: writes, a snapshot, writes, an active commit with writes.
ho, hq = nbd_at(sys.argv[3], "vm3"), nbd_at(sys.argv[4], "vm3")
def write(pattern, off, n):
    for h in (ho, hq):
        h.pwrite(bytes([pattern]) * n, off)
        h.flush()
write(0x51, 1 << 20, 100000)
qo.execute("export-snapshot", {"id": "vm3", "file": "vm3.snap"})
qq.execute("blockdev-snapshot-sync",
           {"node-name": "vm3", "snapshot-file": tmp + "/qsd/vm3.snap",
            "snapshot-node-name": "vm3-top", "format": "qcow2"})
write(0x52, 3 << 20, 77777)
qo.execute("block-commit", {"device": "vm3", "job-id": "c3"})
# QEMU's default base is the deepest (the golden image): named here.
qq.execute("block-commit", {"device": "vm3-top", "job-id": "c3",
                            "base-node": "vm3"})
write(0x53, 5 << 20, 55555)
for q in (qo, qq):
    e = q.event("BLOCK_JOB_READY", timeout=120)
    assert e["data"]["device"] == "c3", e
write(0x54, 7 << 20, 33333)
both("block-job-complete", {"device": "c3"})
ended("BLOCK_JOB_COMPLETED", "c3")
for h in (ho, hq):
    h.shutdown()
PY
stop_server ours
kill "$qsd_pid"
for i in $(seq 100); do kill -0 "$qsd_pid" 2>/dev/null || break; sleep 0.1; done
for v in vm1 vm2 vm3; do
  qemu-img compare -q "$tmp/ours/$v" "$tmp/qsd/$v" ||
    fail "$v: ours and qemu-storage-daemon's end otherwise"
  qemu-img check -q "$tmp/ours/$v" || fail "qemu-img check ours/$v"
done
for v in vm1 vm2 vm3; do
  for who in ours qsd; do
    qemu-img info --output=json "$tmp/$who/$v" |
      sed -n 's/.*"backing-filename": "\(.*\)",*$/\1/p' > "$tmp/$who.$v.b"
  done
  cmp -s "$tmp/ours.$v.b" "$tmp/qsd.$v.b" ||
    fail "$v: backing files differ: $(cat "$tmp/ours.$v.b") / $(cat "$tmp/qsd.$v.b")"
done
[ ! -s "$tmp/ours.vm1.b" ] && [ -s "$tmp/ours.vm2.b" ] ||
  fail "vm1 should be cut loose, vm2 keep its base"
echo "$0: ok"
