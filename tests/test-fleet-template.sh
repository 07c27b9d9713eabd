#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir= template=: a client asking for an export that does not exist
# gets an overlay of the template made (with the create keys), under
# a name only of [A-Za-z0-9][A-Za-z0-9._-]*; clients racing for one
# new name get one disk; no temporary file is left; max-exports=
# bounds the images open at once, an idle one making room.  The
# template, in the folder, is served read-only; new images get the mode
# of the umask; temporary files a crash left are removed at start.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
requires_python_nbd

d="$tmp/vms"
mkdir "$d"
qemu-img create -q -f qcow2 "$d/golden.qcow2" 4M
qio "$d/golden.qcow2" "write -P 0x33 0 1M"
: > "$d/.new-Ab12Cd"            # left by a crash
: > "$d/.new-keep"              # not of its pattern
export d tmp

umask 022
nbdkit -U - qcow2 dir="$d" template=golden.qcow2 cluster-size=4K \
       max-exports=3 --run '
/usr/bin/python3 - "$unixsocket" <<"PY"
import nbd, sys, threading
sock = sys.argv[1]
import functools, os
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
connect = functools.partial(fleetclient.connect, sock)

g = connect("golden.qcow2")
assert g.is_read_only(), "the template is served writable"
try:
    g.pwrite(b"x" * 512, 0)
    raise AssertionError("the template was written")
except nbd.Error:
    pass
g.shutdown()
# Eight clients race for one new name, each writing its own block.
errors, hs = [], [None] * 8
def run(i):
    try:
        hs[i] = connect("race.qcow2")
        hs[i].pwrite(bytes([i + 1]) * 4096, (2 << 20) + i * 4096)
        hs[i].flush()
    except Exception as e:
        errors.append("client %d: %s" % (i, e))
ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors
for i in range(8):
    got = hs[0].pread(4096, (2 << 20) + i * 4096)
    assert got == bytes([i + 1]) * 4096, "client %d wrote to another disk" % i
assert hs[0].pread(512, 0) == b"\x33" * 512, "not an overlay of golden"
# Names template= does not make.
for bad in ["-x", "a b", "x!", "_y"]:
    try:
        connect(bad)
        raise AssertionError("made %r" % bad)
    except nbd.Error:
        pass
# max-exports=3: race.qcow2 and two more are in use; a fourth is
# refused, then served once an image is idle.
a, b = connect("a1"), connect("b1")
try:
    connect("c1")
    raise AssertionError("max-exports=3 let a fourth image open")
except nbd.Error:
    pass
for h in hs: h.shutdown()
import time
for i in range(50):             # the server sees them leave soon after
    try:
        c = connect("c1")
        break
    except nbd.Error:
        time.sleep(0.1)
assert c.get_size() == 4 << 20
PY
' 2> "$tmp/err" || { cat "$tmp/err"; fail "template="; }

grep -q 'export "c1": refused: max-exports=3 images are open already' \
  "$tmp/err" || { cat "$tmp/err"; fail "max-exports: no message"; }
grep -q 'golden.qcow2: served read-only: it is the template=' \
  "$tmp/err" || { cat "$tmp/err"; fail "template: no read-only notice"; }
grep -q 'export "a b": no such image in .*template= makes only names of' \
  "$tmp/err" || { cat "$tmp/err"; fail "template: bad name message"; }
for v in race.qcow2 a1 b1 c1; do
  qemu-img check -q "$d/$v" || fail "qemu-img check $v"
  [ "$(stat -c %a "$d/$v")" = 644 ] || fail "$v: mode $(stat -c %a "$d/$v")"
  qemu-img info --output=json "$d/$v" > "$tmp/info"
  grep -q '"backing-filename": "golden.qcow2"' "$tmp/info" &&
    grep -q '"cluster-size": 4096' "$tmp/info" ||
    fail "$v is not an overlay of golden.qcow2 with 4K clusters: $(cat "$tmp/info")"
done
qio "$d/race.qcow2" "read -P 0x33 0 1M" "read -P 8 $(((2 << 20) + 7 * 4096)) 4K"
[ "$(ls -A "$d" | sort | tr '\n' ' ')" = ".new-keep a1 b1 c1 golden.qcow2 race.qcow2 " ] ||
  fail "files left: $(ls -A "$d")"
for bad in -x "a b" "x!" _y; do [ ! -e "$d/$bad" ] || fail "made $bad"; done

expect_refused 'missing.qcow2' qcow2 dir="$d" template=missing.qcow2
expect_refused 'template= makes images to write: not with readonly=true' \
  -r qcow2 dir="$d" template=golden.qcow2
echo "$0: ok"
