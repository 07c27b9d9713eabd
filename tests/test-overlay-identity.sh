#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What the qcow2 filter's overlay FILE records of the disk it sits on,
# and what a later start does with it, with qemu-io reading the same
# FILE:
#  - made without qcow2-overlay-backing=: FILE records a json: name of
#    our own that QEMU refuses (never read as a whole disk), naming the
#    plugin's file; the same start continues it, another file of the
#    same size is refused, naming both and the qemu-img rebase that
#    makes them agree, which then works;
#  - with qcow2-overlay-backing=NAME: QEMU reads FILE over NAME; NAME
#    naming another file than the plugin's is refused, at the first
#    start and later ones;
#  - a standalone image made by qemu-img, and one with a chain of its
#    own, are refused; qcow2-overlay-force=true serves them anyway (a
#    notice says so), FILE left as it was;
#  - the plugin's file as its own overlay: refused, saying so;
#  - the plugin's file spelled otherwise (./, ../, a symbolic link) is
#    the same disk; filters below and their keys (not those of filters
#    that change no byte), a sh plugin's keys (not credentials) are
#    recorded and compared; a FILE of the previous version (no stack)
#    is continued with a notice whose rebase then records the stack.
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/overlay-functions.sh"

a=$tmp/a.raw b=$tmp/b.raw ov=$tmp/ov.qcow2
make_base "$a" $((8 << 20))
/usr/bin/python3 -c 'import sys; open(sys.argv[1], "wb").write(b"\x6b" * (8 << 20))' "$b"
sha256sum "$a" "$b" > "$tmp/base.sum"

# put FILE OFFSET BYTE...: a cluster written through an overlay over
# a.raw.
put ()
{
  nbdkit -U - --filter=qcow2 file "$a" qcow2-overlay="$1" "${@:4}" --run '
    nbdsh -u "$uri" -c "h.pwrite(b\"\\x'"$3"'\" * 65536, '"$2"')"' ||
    fail "writing through $1"
}
# putx FILE OFFSET BYTE NBDKIT-ARGS...: the same over what ARGS serve.
putx ()
{
  nbdkit -U - --filter=qcow2 "${@:4}" qcow2-overlay="$1" --run '
    nbdsh -u "$uri" -c "h.pwrite(b\"\\x'"$3"'\" * 65536, '"$2"')"' ||
    fail "writing through $1 over ${*:4}"
}

# Made without a name: QEMU refuses FILE, naming our driver.
put "$ov" 0 11
qemu-img info "$ov" | grep -q 'backing file: json:.*"driver":"nbdkit-qcow2-overlay".*"plugin":"file file='"$a"'"' ||
  fail "FILE does not record the plugin's file: $(qemu-img info "$ov")"
qemu-io -c 'read 0 512' "$ov" > "$tmp/qio.out" 2>&1 &&
  fail "qemu-io read FILE made without a backing name as a whole disk"
grep -q "Unknown driver 'nbdkit-qcow2-overlay'" "$tmp/qio.out" ||
  fail "qemu-io: $(cat "$tmp/qio.out")"
# The same start continues it; a file of the same size is refused.
put "$ov" 65536 22
expect_unserved "records \"json:.*file file=$a.*\" format raw \(another disk below it\), but the plugin serves file file=$b$" \
  --filter=qcow2 file "$b" qcow2-overlay="$ov"
grep -Eq "^nbdkit: error: hint: .*\"qemu-img rebase -u -b 'json:.*file file=$b\",\"stack\":\"\"}}' -F raw $ov\"" \
  "$tmp/unserved.err" || fail "no rebase command: $(cat "$tmp/unserved.err")"
# Its command makes them agree.
cmd=$(sed -n 's/.*"\(qemu-img rebase .*\)" records it.*/\1/p' "$tmp/unserved.err")
eval "$cmd" || fail "$cmd"
nbdkit -U - --filter=qcow2 file "$b" qcow2-overlay="$ov" --run '
  nbdcopy "$uri" '"$tmp/out.raw" || fail "over b.raw after the rebase"
cp "$b" "$tmp/model.raw"
/usr/bin/python3 -c '
import sys
with open(sys.argv[1], "r+b") as f:
    f.write(b"\x11" * 65536 + b"\x22" * 65536)
' "$tmp/model.raw"
cmp "$tmp/out.raw" "$tmp/model.raw" || fail "FILE over b.raw"
check_overlay "$ov" || fail "qemu-img check"

# A name: QEMU reads FILE over it; the plugin's file must be that file.
named=$tmp/named.qcow2
put "$named" 0 33 qcow2-overlay-backing=a.raw
qemu-io -c 'read -P 0x33 0 65536' "$named" > /dev/null || fail "qemu-io over a.raw"
put "$named" 65536 44
expect_unserved "records \"a.raw\" format raw \(another file below it than the plugin's\), but the plugin serves file file=$b" \
  --filter=qcow2 file "$b" qcow2-overlay="$named"
expect_unserved "qcow2-overlay-backing=a.raw is another file than the plugin's \($b\)" \
  --filter=qcow2 file "$b" qcow2-overlay="$named" qcow2-overlay-backing=a.raw
expect_unserved "qcow2-overlay-backing=a.raw is another file than the plugin's \($b\)" \
  --filter=qcow2 file "$b" qcow2-overlay="$tmp/new.qcow2" qcow2-overlay-backing=a.raw
[ ! -e "$tmp/new.qcow2" ] || fail "a refused FILE was made"

# A standalone image, and one with a chain of its own: refused; with
# qcow2-overlay-force=true, served over the plugin's disk, unchanged.
qemu-img create -q -f qcow2 "$tmp/alone.qcow2" 8M
qemu-io -c 'write -P 0x55 0 4096' "$tmp/alone.qcow2" > /dev/null
qemu-img create -q -f qcow2 -b a.raw -F raw "$tmp/mid.qcow2"
qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 "$tmp/top.qcow2"
expect_unserved "alone.qcow2 records no backing file \(a standalone image" \
  --filter=qcow2 file "$a" qcow2-overlay="$tmp/alone.qcow2"
expect_unserved "top.qcow2 records \"mid.qcow2\" format qcow2 \(a chain of its own" \
  --filter=qcow2 file "$a" qcow2-overlay="$tmp/top.qcow2"
sha256sum "$tmp/alone.qcow2" "$tmp/top.qcow2" > "$tmp/images.sum"
nbdkit -r -U - --filter=qcow2 file "$a" qcow2-overlay="$tmp/alone.qcow2" \
  qcow2-overlay-force=true --run 'nbdcopy "$uri" '"$tmp/forced.raw" \
  2> "$tmp/forced.err" || fail "qcow2-overlay-force=true"
grep -q "notice: .*qcow2-overlay-force=true: served over file file=$a although FILE records no backing file" \
  "$tmp/forced.err" || fail "no notice: $(cat "$tmp/forced.err")"
cp "$a" "$tmp/model.raw"
# qemu-io wrote one whole cluster of the standalone image, over zeros.
/usr/bin/python3 -c '
import sys
with open(sys.argv[1], "r+b") as f:
    f.write(b"\x55" * 4096 + bytes(61440))
' "$tmp/model.raw"
cmp "$tmp/forced.raw" "$tmp/model.raw" || fail "forced: not the plugin's disk under FILE"
sha256sum -c --quiet "$tmp/images.sum" || fail "a refused or -r FILE changed"

# The plugin's file as its own overlay.
expect_unserved "qcow2-overlay=$a is the file the plugin serves" \
  --filter=qcow2 file "$a" qcow2-overlay="$a"
expect_refused "qcow2-overlay-force= needs qcow2-overlay=FILE" \
  --filter=qcow2 file "$a" qcow2-overlay-force=true

# The plugin's file spelled otherwise (./a.raw, ../d/a.raw, a symbolic
# link) is the same disk: compared by what it is.
put "$tmp/sp.qcow2" 0 55
mkdir "$tmp/d"
ln -s a.raw "$tmp/link.raw"
(cd "$tmp" && putx sp.qcow2 4096 56 file ./a.raw) ||
  fail "./a.raw is another disk"
(cd "$tmp/d" && putx ../sp.qcow2 8192 57 file ../a.raw) ||
  fail "../d/a.raw is another disk"
putx "$tmp/sp.qcow2" 12288 58 file "$tmp/link.raw"
nbdkit -U - --filter=qcow2 file "$a" qcow2-overlay="$tmp/sp.qcow2" --run '
  nbdsh -u "$uri" -c "
assert h.pread(4, 0) == b\"\\x55\" * 4 and h.pread(4, 12288) == b\"\\x58\" * 4
"' || fail "the writes through other spellings"

# The stack below: the filters between and the keys passed on (not
# those of filters that change no byte, like delay, nor credentials);
# other keys are another disk.  A plugin whose keys are not known
# (sh) has them all recorded.
putx "$tmp/off.qcow2" 0 66 --filter=offset file "$a" offset=1M range=2M
qemu-img info "$tmp/off.qcow2" |
  grep -q '"plugin":"file file='"$a"'","stack":"--filter=offset offset=1M range=2M"' ||
  fail "the stack: $(qemu-img info "$tmp/off.qcow2")"
putx "$tmp/off.qcow2" 65536 67 --filter=offset --filter=delay file "$a" \
  offset=1M range=2M delay-read=1ms
expect_refused "\(other filters or keys below it\), but the plugin serves file file=$a --filter=offset offset=1M range=3M$" \
  --filter=qcow2 --filter=offset file "$a" offset=1M range=3M \
  qcow2-overlay="$tmp/off.qcow2"
cat > "$tmp/disk.sh" <<'EOS'
case "$1" in
  config) exit 0 ;;
  get_size) echo 1M ;;
  pread) head -c "$3" /dev/zero ;;
  *) exit 2 ;;
esac
EOS
chmod +x "$tmp/disk.sh"
nbdkit -U - --filter=qcow2 sh "$tmp/disk.sh" disk=one secret-key=xyzzy \
  qcow2-overlay="$tmp/sh.qcow2" --run true || fail "over sh"
qemu-img info "$tmp/sh.qcow2" |
  grep -q '"plugin":"sh","stack":"script='"$tmp"'/disk.sh disk=one"' ||
  fail "sh's keys: $(qemu-img info "$tmp/sh.qcow2")"
expect_refused "\(other filters or keys below it\), but the plugin serves sh script=$tmp/disk.sh disk=two$" \
  --filter=qcow2 sh "$tmp/disk.sh" disk=two qcow2-overlay="$tmp/sh.qcow2"

# A FILE made before the stack was recorded names the plugin only: it
# is continued, on the plugin alone, a notice giving the rebase that
# records the stack, after which another stack is refused.
old='json:{"driver":"raw","file":{"driver":"nbdkit-qcow2-overlay","plugin":"file file='"$a"'"}}'
qemu-img rebase -u -b "$old" -F raw "$tmp/off.qcow2"
nbdkit -U - --filter=qcow2 --filter=offset file "$a" offset=1M range=2M \
  qcow2-overlay="$tmp/off.qcow2" --run 'nbdsh -u "$uri" -c "
assert h.pread(2, 65535) == b\"\\x66\\x67\"
"' 2> "$tmp/old.err" || fail "a FILE of the previous version: $(cat "$tmp/old.err")"
cmd=$(sed -n 's/.*notice: .*what is between, --filter=offset offset=1M range=2M, is not checked; "\(qemu-img rebase .*\)" records it$/\1/p' \
      "$tmp/old.err")
[ -n "$cmd" ] || fail "no notice: $(cat "$tmp/old.err")"
eval "$cmd" || fail "$cmd"
putx "$tmp/off.qcow2" 131072 68 --filter=offset file "$a" offset=1M range=2M
expect_refused "other filters or keys below it" \
  --filter=qcow2 --filter=offset file "$a" offset=3M range=2M \
  qcow2-overlay="$tmp/off.qcow2"
check_overlay "$tmp/off.qcow2" || fail "qemu-img check"
sha256sum -c --quiet "$tmp/base.sum" || fail "the plugin's files were written"
