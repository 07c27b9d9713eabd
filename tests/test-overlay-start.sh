#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Where the qcow2 filter's overlay refusals are heard, as the man page's
# "Errors at start" says:
#  - what FILE is and records (not ours, not qcow2, the plugin's own
#    file, another disk, other filters below, no backing file, a chain,
#    a backing name of another file, missing under -r) and its size
#    over the file plugin alone: refused before nbdkit forks, so that
#    nbdkit started in the background (no -f) exits 1 with the message
#    on its stderr and leaves no pid file, and nbdkit --run true exits
#    1, every time (three tries);
#  - the size with a filter between (known once the plugin is open):
#    with -f, exit 1 and the message; in the background too, once the
#    filter refused, with no pid file left;
#  - the size hint's qemu-img resize, run as printed, grows or shrinks
#    FILE, which is then served: qemu-img check, and the bytes against
#    a model.
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/overlay-functions.sh"

a=$tmp/a.raw b=$tmp/b.raw ov=$tmp/ov.qcow2
make_base "$a" $((8 << 20))
cp "$a" "$b"
truncate -s 1M "$tmp/raw.img"
nbdkit -U - --filter=qcow2 file "$a" qcow2-overlay="$ov" --run true ||
  fail "an overlay over a.raw"
nbdkit -U - --filter=qcow2 --filter=offset file "$a" offset=1M range=2M \
  qcow2-overlay="$tmp/part.qcow2" --run true || fail "an overlay over offset="
qemu-img create -q -f qcow2 "$tmp/alone.qcow2" 8M
qemu-img create -q -f qcow2 -b a.raw -F raw "$tmp/mid.qcow2"
qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 "$tmp/top.qcow2"
# g.raw, under g.qcow2, grows.
g=$tmp/g.raw gov=$tmp/g.qcow2
cp "$a" "$g"
nbdkit -U - --filter=qcow2 file "$g" qcow2-overlay="$gov" --run '
  nbdsh -u "$uri" -c "h.pwrite(b\"\\x77\" * 65536, 1 << 20)"' || fail "a write"
truncate -s +1M "$g"

# heard MESSAGE-REGEXP NBDKIT-ARGS...: refused before the fork, in the
# background, and under --run true three times (it used to race).
heard ()
{
  local re="$1" r i; shift
  r=0
  nbdkit -U "$tmp/bg.sock" -P "$tmp/bg.pid" "$@" 2> "$tmp/bg.err" || r=$?
  if [ -e "$tmp/bg.pid" ]; then
    kill "$(cat "$tmp/bg.pid")" 2>/dev/null || true
    fail "nbdkit $* in the background: started (exit status $r)"
  fi
  [ "$r" = 1 ] || fail "nbdkit $* in the background: exit status $r"
  grep -Eq -- "$re" "$tmp/bg.err" ||
    fail "nbdkit $* in the background: $(cat "$tmp/bg.err")"
  for i in 1 2 3; do
    r=0
    nbdkit -U - "$@" --run true 2> "$tmp/run.err" || r=$?
    [ "$r" = 1 ] || fail "nbdkit $* --run true: exit status $r"
    grep -Eq -- "$re" "$tmp/run.err" ||
      fail "nbdkit $* --run true: $(cat "$tmp/run.err")"
  done
}

heard "records .*\(another disk below it\), but the plugin serves file file=$b$" \
  --filter=qcow2 file "$b" qcow2-overlay="$ov"
heard "records .*range=2M.*\(other filters or keys below it\), but the plugin serves file file=$a --filter=offset offset=3M range=2M$" \
  --filter=qcow2 --filter=offset file "$a" offset=3M range=2M \
  qcow2-overlay="$tmp/part.qcow2"
heard "records no backing file \(a standalone image" \
  --filter=qcow2 file "$a" qcow2-overlay="$tmp/alone.qcow2"
heard "records \"mid.qcow2\" format qcow2 \(a chain of its own" \
  --filter=qcow2 file "$a" qcow2-overlay="$tmp/top.qcow2"
heard "raw.img is not a qcow2 image" \
  --filter=qcow2 file "$a" qcow2-overlay="$tmp/raw.img"
heard "qcow2-overlay=$a is the file the plugin serves" \
  --filter=qcow2 file "$a" qcow2-overlay="$a"
heard "qcow2-overlay-backing=b.raw is another file than the plugin's" \
  --filter=qcow2 file "$a" qcow2-overlay="$tmp/new.qcow2" \
  qcow2-overlay-backing=b.raw
heard "new.qcow2 does not exist, and nbdkit serves read-only" \
  -r --filter=qcow2 file "$a" qcow2-overlay="$tmp/new.qcow2"
heard "holds a disk of 8388608 bytes, but the plugin's disk is 9437184 bytes" \
  --filter=qcow2 file "$g" qcow2-overlay="$gov"
[ ! -e "$tmp/new.qcow2" ] || fail "a refused FILE was made"

# With a filter between, the size is known once nbdkit has forked:
# with -f nbdkit exits 1 and says it; in the background too (its first
# process waits for the server's word).
r=0
nbdkit -f -U "$tmp/fg.sock" --filter=qcow2 --filter=delay \
  file "$g" qcow2-overlay="$gov" 2> "$tmp/fg.err" || r=$?
[ "$r" = 1 ] || fail "-f over a grown disk: exit status $r"
grep -q "holds a disk of 8388608 bytes, but the plugin's disk is 9437184 bytes" \
  "$tmp/fg.err" || fail "-f: $(cat "$tmp/fg.err")"
r=0
nbdkit -U "$tmp/bg.sock" -P "$tmp/bg.pid" --filter=qcow2 --filter=delay \
  file "$g" qcow2-overlay="$gov" 2> "$tmp/bg.err" || r=$?
if [ "$r" = 0 ]; then
  kill "$(cat "$tmp/bg.pid")"; fail "a server over a grown disk runs"
fi
[ "$r" = 1 ] || fail "in the background over a grown disk: exit status $r"
grep -q "holds a disk of 8388608 bytes, but the plugin's disk is 9437184 bytes" \
  "$tmp/bg.err" || fail "in the background: $(cat "$tmp/bg.err")"
[ ! -e "$tmp/bg.pid" ] || fail "in the background: the pid file is left"

# The hint's command, pasted: FILE grown, then served; the grown part
# reads from the plugin's disk, FILE's cluster as written.
resize ()
{
  local cmd
  cmd=$(sed -n 's/.*hint: .* has [a-z]*, "\(qemu-img resize .*\)" [a-z]* FILE.*/\1/p' "$1")
  [ -n "$cmd" ] || fail "no qemu-img resize: $(cat "$1")"
  eval "$cmd > /dev/null" || fail "$cmd"
}
resize "$tmp/fg.err"
/usr/bin/python3 -c '
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(8 << 20); f.write(b"\x99" * 4096)
    f.seek(0); d = f.read()
with open(sys.argv[2], "wb") as f:
    f.write(d[:1 << 20] + b"\x77" * 65536 + d[(1 << 20) + 65536:])
' "$g" "$tmp/model.raw"
nbdkit -U - --filter=qcow2 --filter=delay file "$g" \
  qcow2-overlay="$gov" --run 'nbdcopy "$uri" '"$tmp/out.raw" ||
  fail "served after the hint's qemu-img resize"
cmp "$tmp/out.raw" "$tmp/model.raw" || fail "FILE grown: not the disk below"
check_overlay "$gov" || fail "qemu-img check after growing"

# Shrunk: --shrink in the hint.
truncate -s 4M "$g"
expect_refused "holds a disk of 9437184 bytes, but the plugin's disk is 4194304 bytes" \
  --filter=qcow2 file "$g" qcow2-overlay="$gov"
grep -q "resize --shrink" "$tmp/refused.err" || fail "no --shrink: $(cat "$tmp/refused.err")"
resize "$tmp/refused.err"
head -c 4M "$tmp/model.raw" > "$tmp/model4.raw"
nbdkit -U - --filter=qcow2 file "$g" qcow2-overlay="$gov" \
  --run 'nbdcopy "$uri" '"$tmp/out.raw" || fail "served after shrinking"
cmp "$tmp/out.raw" "$tmp/model4.raw" || fail "FILE shrunk: not the disk below"
check_overlay "$gov" || fail "qemu-img check after shrinking"
echo OK
