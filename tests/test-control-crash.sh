#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A live snapshot and a live commit killed at each of their steps
# (SIGKILL delivered by strace as the step's system call begins), then
# the same command line started again: every flushed write is served
# under the export's name, qemu-img check finds no corruption in any
# file, nothing hidden is left behind, and
#  - a snapshot killed before its rename is undone (the frozen name
#    gone), one killed after it is kept (the frozen name holds the data
#    of the instant);
#  - a commit killed while it copies, or at its switch, leaves the chain
#    as it was, reading the same, and a commit started again finishes.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io strace
requires_python_nbd
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/control-functions.sh"

fresh ()
{
  rm -rf "$d"
  mkdir "$d"
  qemu-img create -q -f qcow2 "$d/base.qcow2" 8M
  qio "$d/base.qcow2" 'write -P 0x11 0 6M'
  qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$d/vm1"
}
d="$tmp/vms"
export d tmp

# py SCRIPT ARGS...: the tests' Python, with our QMP client.
py () { /usr/bin/python3 - "$@"; }

# written SOCK PATTERN: writes 1 MiB of PATTERN at 2M into vm1, flushed.
written ()
{
  py "$1" "$2" <<'PY'
import os, sys
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
h = fleetclient.connect(sys.argv[1], "vm1")
h.pwrite(bytes([int(sys.argv[2], 0)]) * (1 << 20), 2 << 20)
h.flush()
h.shutdown()
PY
}

# killed_at SYSCALLS[@N] COMMAND ARGS-JSON: a server whose first (or
# Nth, in a thread) of the SYSCALLS is met with SIGKILL, made to run
# the command; it must die.
killed_at ()
{
  local calls=${1%@*} when=1 cmd=$2 args=$3 pid
  case $1 in *@*) when=${1#*@} ;; esac
  rm -f "$tmp/k.sock" "$tmp/k.qmp"
  strace -f -qq -o /dev/null -e trace="$calls" \
    -e inject="$calls":signal=SIGKILL:when="$when" \
    nbdkit -f -U "$tmp/k.sock" qcow2 dir="$d" idle-close=0 \
    control="$tmp/k.qmp" 2>> "$tmp/k.log" &
  pid=$!
  wait_socket "$tmp/k.qmp" "$pid" || fail "$calls: nbdkit did not start"
  written "$tmp/k.sock" 0x22
  py "$tmp/k.qmp" "$cmd" "$args" <<'PY' || true
import json, sys, qmpclient
q = qmpclient.QMP(sys.argv[1])
q.negotiate()
try:
    q.execute(sys.argv[2], json.loads(sys.argv[3]))
except Exception:
    pass
PY
  for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  ! kill -0 "$pid" 2>/dev/null || fail "$calls: the server was not killed"
  wait "$pid" 2>/dev/null || true
}

# after WANT_FROZEN: the same command line again: vm1 reads 0x22 at 2M
# (flushed before the kill), every file is sound, nothing hidden left;
# the frozen name there (yes) or not (no).
after ()
{
  control_serve a qcow2 dir="$d" idle-close=0
  py "$tmp/a.sock" <<'PY' || fail "after the kill: vm1 lost a write"
import os, sys
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
h = fleetclient.connect(sys.argv[1], "vm1")
assert h.pread(1 << 20, 2 << 20) == b"\x22" * (1 << 20)
assert h.pread(4096, 0) == b"\x11" * 4096
h.shutdown()
PY
  stop_server a
  for f in "$d"/*; do qemu-img check -q "$f" || fail "qemu-img check $f"; done
  ! ls -A "$d" | grep -q '^\.' || fail "hidden files left: $(ls -A "$d")"
  case $1 in
    yes) [ -e "$d/snap" ] || fail "a finished snapshot undone" ;;
    no) [ ! -e "$d/snap" ] || fail "an unfinished snapshot kept" ;;
  esac
  # Kept or undone, vm1 stands on what it must.
  if [ -e "$d/snap" ]; then want=snap; else want=base.qcow2; fi
  qemu-img info --output=json "$d/vm1" |
    grep -q "\"backing-filename\": \"$want\"" ||
    fail "vm1 does not stand on $want"
}

# The snapshot: killed before the link, before the rename, after it
# (kept or undone as the step says), and at each of its five syncs
# (the control thread's fsyncs are the snapshot's: the journal, the
# folder then, after the link, after the rename, at the end; kept or
# undone as where each falls, vm1 standing on what it must either way).
for point in linkat:no renameat,renameat2:no unlinkat:yes fsync@1:any \
             fsync@2:any fsync@3:any fsync@4:any fsync@5:any; do
  fresh
  killed_at "${point%:*}" export-snapshot '{"id": "vm1", "file": "snap"}'
  after "${point#*:}"
  grep -q "export-snapshot of vm1 into snap was interrupted" "$tmp/a.log" ||
    [ "${point%:*}" != renameat,renameat2 ] ||
    fail "$point: no notice of the recovery"
done
qemu-img info --output=json "$d/vm1" | grep -q '"backing-filename": "snap"' ||
  fail "the snapshot kept is not vm1's base"

# The commit: killed at its switch, on a chain vm1 over snap over the
# base, as a snapshot leaves it.
fresh
mv "$d/vm1" "$d/snap"
qemu-img create -q -f qcow2 -b snap -F qcow2 "$d/vm1"
rm -f "$tmp/k.sock" "$tmp/k.qmp"
strace -f -qq -o /dev/null -e trace=renameat,renameat2 \
  -e inject=renameat,renameat2:signal=SIGKILL:when=1 \
  nbdkit -f -U "$tmp/k.sock" qcow2 dir="$d" idle-close=0 \
  control="$tmp/k.qmp" 2>> "$tmp/k.log" &
pid=$!
wait_socket "$tmp/k.qmp" "$pid" || fail "commit: nbdkit did not start"
written "$tmp/k.sock" 0x22
py "$tmp/k.qmp" <<'PY' || fail "commit to its switch"
import sys, qmpclient
q = qmpclient.QMP(sys.argv[1])
q.negotiate()
q.execute("block-commit", {"device": "vm1"})
q.event("BLOCK_JOB_READY", timeout=60)
try:
    q.execute("block-job-complete", {"device": "vm1"})
except Exception:
    pass
PY
for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$pid" 2>/dev/null || fail "commit: the server was not killed"
after yes
# Killed while it copies (paced), then run again to its end.
control_serve c qcow2 dir="$d" idle-close=0
py "$tmp/c.qmp" <<'PY' || fail "a commit under way"
import sys, time, qmpclient
q = qmpclient.QMP(sys.argv[1])
q.negotiate()
q.execute("block-commit", {"device": "vm1", "speed": 256 << 10})
time.sleep(1)
PY
kill -9 "$(cat "$tmp/c.pid")"
sleep 0.5
after yes
control_serve c2 qcow2 dir="$d" idle-close=0
py "$tmp/c2.qmp" <<'PY' || fail "the commit started again"
import sys, qmpclient
q = qmpclient.QMP(sys.argv[1])
q.negotiate()
q.execute("block-commit", {"device": "vm1"})
q.event("BLOCK_JOB_READY", timeout=60)
q.execute("block-job-complete", {"device": "vm1"})
q.event("BLOCK_JOB_COMPLETED", timeout=30)
PY
stop_server c2
after no
qemu-img info --output=json "$d/vm1" | grep -q '"backing-filename": "base.qcow2"' ||
  fail "the commit started again did not finish"
echo "$0: ok"
