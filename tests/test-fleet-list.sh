#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir=: each qcow2 image in the folder is an export of its name.
#  - nbdinfo --list lists them with a description (virtual size,
#    backing file), not what is not a qcow2 image, nor hidden files;
#  - images appear and disappear with the folder's files, no restart;
#  - the empty name is refused unless default-export= names one;
#  - export names are untrusted: '/', "..", a leading '.', control
#    bytes, NUL, more than 255 bytes, a link leading out of the folder are
#    refused, one line naming the export and why, nothing outside the
#    folder opened (the image outside stays unlocked);
#  - what is not a regular file (a FIFO) is neither listed (no hang)
#    nor served;
#  - file= and dir= exclude each other; dir='s keys need dir=.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdinfo nbdsh
requires_python_nbd

d="$tmp/vms"
mkdir "$d"
qemu-img create -q -f qcow2 "$d/base.qcow2" 4M
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$d/vm1" 
qemu-img create -q -f qcow2 "$d/big.qcow2" 8M
echo "not an image" > "$d/notes.txt"
qemu-img create -q -f qcow2 "$d/.hidden" 1M
qemu-img create -q -f qcow2 "$tmp/outside.qcow2" 2M
ln -s "$tmp/outside.qcow2" "$d/out"
ln -s ../outside.qcow2 "$d/out2"
ln -s big.qcow2 "$d/alias"
mkfifo "$d/fifo"
export d tmp

nbdkit -U - qcow2 dir="$d" --run '
  set -e
  timeout 20 nbdinfo --list --json "$uri" > "$tmp/list.json"
  # A new image is served at once; a removed one is gone.
  qemu-img create -q -f qcow2 "$d/new.qcow2" 3M
  nbdinfo --size "nbd+unix:///new.qcow2?socket=$unixsocket" > "$tmp/new.size"
  rm "$d/new.qcow2"
  nbdinfo --size "nbd+unix:///new.qcow2?socket=$unixsocket" 2>/dev/null &&
    { echo "a removed image still served"; exit 1; }
  nbdinfo --list "$uri" | grep -q new.qcow2 &&
    { echo "a removed image still listed"; exit 1; }
  for n in "" "out" "out2" "../outside.qcow2" ".hidden" "a/b" "x..y" \
           "$(printf "a\tb")" "$(printf "%0256d" 0)" nothere notes.txt fifo; do
    python3 -c "
import nbd, sys
h = nbd.NBD()
h.set_export_name(sys.argv[1])
try:
    h.connect_unix(sys.argv[2])
except nbd.Error:
    sys.exit(0)
sys.exit(1)
" "$n" "$unixsocket" || { echo "served: [$n]"; exit 1; }
  done
  # Refused before anything was opened: the image outside is unlocked.
  qemu-img info "$tmp/outside.qcow2" > /dev/null
  nbdinfo --size "nbd+unix:///alias?socket=$unixsocket" > "$tmp/alias.size"
  # A NUL byte, by hand (libnbd cannot send one): refused (by nbdkit).
  /usr/bin/python3 - "$unixsocket" <<"PY"
import socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rwb")
assert f.read(18)[:16] == b"NBDMAGICIHAVEOPT"
name = b"vm1\0../../outside.qcow2"
data = struct.pack(">I", len(name)) + name + struct.pack(">H", 0)
f.write(struct.pack(">I", 3) + b"IHAVEOPT" +
        struct.pack(">II", 7, len(data)) + data)          # NBD_OPT_GO
f.flush()
while True:
    _, _, typ, n = struct.unpack(">QIII", f.read(20))
    f.read(n)
    if typ != 3:                                          # NBD_REP_INFO
        break
assert typ & 0x80000000, "a name holding a NUL byte was served"
PY
' 2> "$tmp/err" || { cat "$tmp/err"; fail "serving dir="; }

python3 - "$tmp/list.json" <<'PY' || fail "the listing: $(cat "$tmp/list.json")"
import json, sys
l = json.load(open(sys.argv[1]))
got = {e["export-name"]: e.get("description", "") for e in l["exports"]}
assert sorted(got) == ["alias", "base.qcow2", "big.qcow2", "vm1"], sorted(got)
assert got["vm1"] == "qcow2, virtual size 4194304 bytes, backing file base.qcow2", got
assert got["big.qcow2"] == "qcow2, virtual size 8388608 bytes, no backing file", got
PY
[ "$(cat "$tmp/new.size")" = 3145728 ] || fail "a new image: size $(cat "$tmp/new.size")"
[ "$(cat "$tmp/alias.size")" = 8388608 ] || fail "a link inside the folder"
for re in 'export "": refused: .*default-export=' \
          'export "out": refused: it is a link leading out of dir=' \
          'export "out2": refused: it is a link leading out of dir=' \
          'export "../outside.qcow2": refused: it starts with' \
          'export ".hidden": refused: it starts with' \
          'export "a/b": refused: it holds a '"'/'" \
          'export "x..y": refused: it holds ".."' \
          'export "a\\x09b": refused: it holds a control byte' \
          'export "0{64}\.\.\.": refused: it is longer than 255 bytes' \
          'export "nothere": no such image in' \
          'export "new.qcow2": no such image in' \
          'notes.txt.*(too small|not a qcow2)' \
          'export "fifo": refused: .*/fifo is not a regular file'; do
  grep -Eq "$re" "$tmp/err" || { cat "$tmp/err"; fail "no message /$re/"; }
done
# One line each: no control byte reached the log.
! grep -q "$(printf '\t')" "$tmp/err" || fail "a control byte in the log"

# default-export= serves the empty name.
nbdkit -U - qcow2 dir="$d" default-export=big.qcow2 --run '
  nbdinfo --size "$uri"' > "$tmp/size" || fail "default-export="
[ "$(cat "$tmp/size")" = 8388608 ] || fail "default-export= served another"

# A fleet's images cache 4 KiB slices of L2 (each uses little of its
# disk), where file= keeps whole tables when they fit; l2-slice-size=
# still rules.
slices ()
{
  nbdkit -v -U - qcow2 "$@" --run 'nbdinfo --size "$uri"' \
    2>&1 >/dev/null | grep -oE "big.qcow2: qcow2 v.*L2 cache [0-9]+ slices of [0-9]+ bytes" |
    sed 's/.*L2 cache //'
}
[ "$(slices dir="$d" default-export=big.qcow2)" = "16 slices of 4096 bytes" ] ||
  fail "dir=: not 4 KiB slices: $(slices dir="$d" default-export=big.qcow2)"
[ "$(slices "$d/big.qcow2")" = "2 slices of 65536 bytes" ] ||
  fail "file=: not whole tables: $(slices "$d/big.qcow2")"
[ "$(slices dir="$d" default-export=big.qcow2 l2-slice-size=64K)" = "2 slices of 65536 bytes" ] ||
  fail "dir= with l2-slice-size=64K"

expect_refused 'file= and dir= exclude each other' qcow2 dir="$d" \
  file="$d/vm1"
expect_refused 'template= goes with dir=' qcow2 "$d/vm1" template=base.qcow2
expect_refused 'idle-close= goes with dir=' qcow2 "$d/vm1" idle-close=1
expect_refused 'default-export=\.\./x: refused: it starts with' qcow2 \
  dir="$d" default-export=../x
expect_refused 'dir: .*: not a folder' qcow2 dir="$d/vm1"
expect_refused 'cluster-size= describes an image to make: with dir=, it needs template=' \
  qcow2 dir="$d" cluster-size=4K
echo "$0: ok"
