#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir=: the listing always answers.  nbdinfo --list exits 0 for a
# folder in a fleet's normal state and with bad files in it:
#  - a truncated image, a corrupt one and one whose backing file is
#    gone are left out, each logged once (not again at the next
#    listing), with why;
#  - a golden image that is not the template, the base of an open
#    overlay, is listed and (as nbdinfo opens each export) served
#    read-only, not refused;
#  - the exports come sorted by name;
#  - a backing name with bytes outside printable ASCII is shown escaped;
#  - with stream=true, a listing (which opens each export a moment)
#    starts no stream: the images keep their backing files.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo
requires_python_nbd

d="$tmp/vms"
mkdir "$d"
qemu-img create -q -f qcow2 "$d/golden-alma.qcow2" 4M
qio "$d/golden-alma.qcow2" 'write -P 0x61 0 1M'
for v in vm3 vm1 vm2; do
  qemu-img create -q -f qcow2 -b golden-alma.qcow2 -F qcow2 "$d/$v"
done
qemu-img create -q -f qcow2 "$d/truncated.qcow2" 1M
truncate -s 300 "$d/truncated.qcow2"
{ printf 'QFI\xfb\0\0\0\3'; head -c 4000 /dev/urandom; } > "$d/corrupt.qcow2"
odd=$(printf 'we\tird\033[1m')
qemu-img create -q -f qcow2 "$d/$odd" 1M
qemu-img create -q -f qcow2 -u -b "$odd" -F qcow2 "$d/odd.qcow2" 1M
qemu-img create -q -f qcow2 -u -b gone.qcow2 -F qcow2 "$d/orphan.qcow2" 1M
export d tmp

nbdkit -U - qcow2 dir="$d" idle-close=0 --run '
/usr/bin/python3 - "$unixsocket" <<"PY"
import json, os, subprocess, sys
sock, d, tmp = sys.argv[1], os.environ["d"], os.environ["tmp"]
sys.path.insert(0, os.environ["abs_top_srcdir"] + "/tests")
import fleetclient
uri = "nbd+unix:///?socket=" + sock

def nbdinfo_list(n):
    r = subprocess.run(["nbdinfo", "--list", "--json", uri],
                       capture_output=True, text=True)
    assert r.returncode == 0, "listing %d: exit %d: %s" % (n, r.returncode,
                                                           r.stderr)
    return json.loads(r.stdout)["exports"]

# A fleet in use: vm1 open over golden-alma.qcow2.
vm = fleetclient.connect(sock, "vm1")
vm.pread(512, 0)
for n in (1, 2):
    l = nbdinfo_list(n)
    names = [e["export-name"] for e in l]
    assert names == sorted(names), "not sorted: %r" % names
    assert names == ["golden-alma.qcow2", "odd.qcow2", "vm1", "vm2",
                     "vm3"], names
    got = {e["export-name"]: e for e in l}
    assert got["golden-alma.qcow2"]["is_read_only"], got["golden-alma.qcow2"]
    assert got["odd.qcow2"]["description"] == \
        "qcow2, virtual size 1048576 bytes, backing file we\\x09ird\\x1b[1m", \
        got["odd.qcow2"]["description"]
vm.shutdown()
PY
' 2> "$tmp/err" || { cat "$tmp/err"; fail "nbdinfo --list in a fleet"; }
for f in truncated.qcow2 corrupt.qcow2 orphan.qcow2; do
  [ "$(grep -c "export \"$f\": not listed: " "$tmp/err")" = 1 ] ||
    { cat "$tmp/err"; fail "$f: not logged once"; }
done
grep -q 'export "truncated.qcow2": not listed: .*L1 table .* lies beyond the end of the file' \
  "$tmp/err" || { cat "$tmp/err"; fail "truncated.qcow2: no reason"; }
grep -q 'export "orphan.qcow2": not listed: its backing file gone.qcow2: No such file' \
  "$tmp/err" || { cat "$tmp/err"; fail "orphan.qcow2: no reason"; }
! grep -Eq 'another process|locking=off' "$tmp/err" ||
  { cat "$tmp/err"; fail "a misleading message"; }
! grep -q "$(printf '\033')" "$tmp/err" || fail "a raw escape byte in the log"

# stream=true: listings start nothing.
rm "$d/truncated.qcow2" "$d/corrupt.qcow2" "$d/odd.qcow2" "$d/$odd" \
  "$d/orphan.qcow2"
nbdkit -U - qcow2 dir="$d" stream=true idle-close=0 --run '
  nbdinfo --list "$uri" > /dev/null && nbdinfo --list "$uri" > /dev/null
' 2> "$tmp/err" || { cat "$tmp/err"; fail "nbdinfo --list, stream=true"; }
! grep -q "stream: started" "$tmp/err" || { cat "$tmp/err"; fail "a listing started a stream"; }
for v in vm1 vm2 vm3; do
  qemu-img info "$d/$v" | grep -q '^backing file: golden-alma.qcow2' ||
    fail "$v streamed by a listing"
done
echo "$0: ok"
