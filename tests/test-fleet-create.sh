#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir= template=: creation bounded and logged.
#  - max-images=N bounds the images in DIR (those already there count):
#    a name past it is refused, one line naming the export and the
#    bound, and no file is made, however many names clients ask for, one
#    after another or 40 at once;
#  - min-free=: no image made when less would stay free;
#  - template-match=GLOB: only names of GLOB are made (a name typed in
#    the wrong case gets no blank disk);
#  - every image made is logged (notice) with its name and the
#    template; its open file shows under its own name in /proc/PID/fd,
#    never as a hidden temporary one;
#  - template= and default-export= are checked at start: a missing
#    template is an error naming template=; a default export that does
#    not exist is an error unless template= can make it.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io
requires_python_nbd
[ -d /proc/self/fd ] || { echo "$0: test skipped: no /proc/PID/fd"; exit 77; }

d="$tmp/vms"
mkdir "$d"
qemu-img create -q -f qcow2 "$d/golden.qcow2" 4M
qemu-img create -q -f qcow2 -b golden.qcow2 -F qcow2 "$d/vm-old"
export d tmp

nbdkit -U - -P "$tmp/pid" qcow2 dir="$d" template=golden.qcow2 \
       template-match='vm-*' max-images=4 idle-close=0 --run '
/usr/bin/python3 - "$unixsocket" "$tmp/pid" <<"PY"
import nbd, os, sys
sock, pidfile, d = sys.argv[1], sys.argv[2], os.environ["d"]
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient

def refused(name):
    try:
        fleetclient.connect(sock, name).shutdown()
    except nbd.Error:
        return True
    return False

# golden.qcow2 and vm-old count: two more may be made.
h = fleetclient.connect(sock, "vm-1")
pid = open(pidfile).read().strip()
fds = [os.readlink("/proc/%s/fd/%s" % (pid, f))
       for f in os.listdir("/proc/%s/fd" % pid)]
assert d + "/vm-1" in fds, "vm-1 not open by its name: %r" % fds
assert not [f for f in fds if ".new-" in f], "a temporary name: %r" % fds
h.pwrite(b"1" * 512, 0)
h.shutdown()
assert refused("VM-2"), "a name outside template-match= was made"
assert refused("other"), "a name outside template-match= was made"
fleetclient.connect(sock, "vm-2").shutdown()
for i in range(3, 40):
    assert refused("vm-%d" % i), "max-images=4 passed by vm-%d" % i
PY
' 2> "$tmp/err" || { cat "$tmp/err"; fail "bounded creation"; }
[ "$(ls "$d" | sort | tr '\n' ' ')" = "golden.qcow2 vm-1 vm-2 vm-old " ] ||
  fail "files made: $(ls -A "$d")"
for v in vm-1 vm-2; do
  grep -q "notice: $d/$v: export \"$v\": made, an overlay of template=golden.qcow2" \
    "$tmp/err" || { cat "$tmp/err"; fail "$v: its making not logged"; }
  qemu-img check -q "$d/$v" || fail "qemu-img check $v"
done
qio "$d/vm-1" "read -P 0x31 0 512"
grep -q 'export "VM-2": no such image in .*, and template-match= does not allow making it' \
  "$tmp/err" || { cat "$tmp/err"; fail "template-match=: no message"; }
grep -q "export \"vm-3\": refused: no such image, and making it would pass max-images=4 ($d holds 4)" \
  "$tmp/err" || { cat "$tmp/err"; fail "max-images=: no message"; }
[ "$(grep -c 'export "vm-3"' "$tmp/err")" = 1 ] ||
  { cat "$tmp/err"; fail "vm-3: not one line"; }

# A flood of new names from 40 clients at once: max-images= holds.
f="$tmp/flood"
mkdir "$f"
cp "$d/golden.qcow2" "$f/"
nbdkit -U - qcow2 dir="$f" template=golden.qcow2 max-images=12 \
       idle-close=0 --run '
/usr/bin/python3 - "$unixsocket" <<"PY"
import nbd, os, sys, threading
sock = sys.argv[1]
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
made, errors = [], []
def ask(i):
    try:
        h = fleetclient.connect(sock, "vm%02d" % i)
        h.pwrite(bytes([i]) * 512, 0)
        h.flush()
        made.append(h)
    except nbd.Error:
        pass
    except Exception as e:
        errors.append(e)
ts = [threading.Thread(target=ask, args=(i,)) for i in range(40)]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors
assert len(made) == 11, "%d made under max-images=12" % len(made)
for h in made:
    h.shutdown()
PY
' 2> "$tmp/err" || { cat "$tmp/err"; fail "a flood of new names"; }
[ "$(ls -A "$f" | wc -l)" = 12 ] || fail "flood: files in DIR: $(ls -A "$f")"
for v in $(ls "$f"); do qemu-img check -q "$f/$v" || fail "qemu-img check $v"; done

# min-free= larger than the file system: nothing made.
nbdkit -U - qcow2 dir="$d" template=golden.qcow2 min-free=1E --run '
  nbdinfo --size "nbd+unix:///vm-9?socket=$unixsocket"
' 2> "$tmp/err" && fail "made an image with min-free=1E"
grep -q "export \"vm-9\": refused: no such image, and $d has .* free: making one would leave less than min-free=1 EiB" \
  "$tmp/err" || { cat "$tmp/err"; fail "min-free=: no message"; }
[ ! -e "$d/vm-9" ] || fail "vm-9 made past min-free="
! ls -A "$d" | grep -q '^\.new-' || fail "a temporary file left"

# Checked at start.
expect_refused 'template=nosuch\.qcow2: no such file' \
  qcow2 dir="$d" template=nosuch.qcow2
expect_refused 'default-export=nosuch: no such image in dir=, and template= would not make it' \
  qcow2 dir="$d" default-export=nosuch
expect_refused 'default-export=VM-5: no such image in dir=, and template= would not make it' \
  qcow2 dir="$d" template=golden.qcow2 template-match='vm-*' \
  default-export=VM-5
expect_refused 'template-match= limits the names template= makes images of: it needs template=' \
  qcow2 dir="$d" template-match='vm-*'
nbdkit -U - qcow2 dir="$d" template=golden.qcow2 default-export=vm-5 --run '
  nbdinfo --size "$uri"' > "$tmp/size" || fail "default-export= made by template="
[ "$(cat "$tmp/size")" = 4194304 ] || fail "default-export=vm-5: $(cat "$tmp/size")"
echo "$0: ok"
