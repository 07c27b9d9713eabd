#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# An NBD server that answers reads wrongly (bad-nbd-server.py): a
# chunk covering part of the range, chunks over each other, a chunk
# outside the range, a simple reply where structured replies were
# negotiated, the wrong handle.  Each read of the base fails with EIO,
# never served (the bytes missing would be whatever the buffer held),
# and a partial write (copy-on-write from the base) fails too, leaving
# the overlay clean with nothing but what was written in full.  The
# same server answering rightly is the control: QEMU reads the overlay
# as we wrote it; and answering rightly but backwards, with a hole (the
# buffer not zeroed first, the hole must be).
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
source "${srcdir:-.}/remote-functions.sh"

# The client: a whole cluster written (no base read), a read of the
# base, a partial write; what each did on stdout.
cat > "$tmp/client.py" <<'PY'
def attempt(what, fn):
    try:
        fn()
        print(what, "ok")
    except nbd.Error as e:
        print(what, "EIO" if e.errno == "EIO" else e)
attempt("write-full", lambda: h.pwrite(b"\xaa" * 65536, 0))
def read():
    global got
    got = h.pread(65536, 1 << 20)
attempt("read", read)
attempt("write-part", lambda: h.pwrite(b"\xbb" * 4096, (2 << 20) + 4096))
if "got" in globals():
    open("read.out", "wb").write(got)
PY

# expected OFF LEN: the server's content there (bad-nbd-server.py's).
expected ()
{
  /usr/bin/python3 -c '
import sys
off, n = int(sys.argv[1]), int(sys.argv[2])
sys.stdout.buffer.write(bytes(((off + i) * 7 + 1) & 255 for i in range(n)))' "$@"
}

# One server: the export's name is the mode.
/usr/bin/python3 "${srcdir:-.}/bad-nbd-server.py" "$tmp/port" &
servers+=("$!")
for i in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(cat "$tmp/port") || fail "bad-nbd-server.py did not start"

for mode in good scattered short overlap gap outside simple handle; do
  ovl=$tmp/ovl-$mode.qcow2
  qemu-img create -q -f qcow2 -u -b "nbd://127.0.0.1:$port/$mode" -F raw \
    "$ovl" 4M
  (cd "$tmp" && rm -f read.out &&
   timeout 120 nbdkit -U - qcow2 "$ovl" --run 'nbdsh -u "$uri" -c "exec(open(\"client.py\").read())"' \
     > "$tmp/client.out" 2> "$tmp/nbdkit.err") ||
    { cat "$tmp/nbdkit.err" >&2; fail "$mode: nbdkit or nbdsh failed"; }
  # The overlay alone (its backing file left out): clean, and holding
  # exactly what was written.
  alone='json:{"driver":"qcow2","file":{"driver":"file","filename":"'"$ovl"'"},"backing":null}'
  qemu-img check -q "$alone" || fail "$mode: qemu-img check fails"
  if [ "$mode" = good ]; then
    printf '%s\n' "write-full ok" "read ok" "write-part ok" |
      cmp -s - "$tmp/client.out" ||
      fail "good: $(cat "$tmp/client.out" "$tmp/nbdkit.err")"
    expected $((1 << 20)) 65536 | cmp -s - "$tmp/read.out" ||
      fail "good: the read is not the server's bytes"
    # QEMU's own NBD client reading the same server is the oracle.
    expected 0 $((4 << 20)) > "$tmp/model.raw"
    /usr/bin/python3 -c '
import sys
with open(sys.argv[1], "r+b") as f:
    f.write(b"\xaa" * 65536)
    f.seek((2 << 20) + 4096)
    f.write(b"\xbb" * 4096)' "$tmp/model.raw"
    qemu-img convert -O raw "$ovl" "$tmp/qemu.raw"
    cmp "$tmp/model.raw" "$tmp/qemu.raw" || fail "good: QEMU reads otherwise"
    continue
  fi
  if [ "$mode" = scattered ]; then
    { expected $((1 << 20)) 16384; head -c 32768 /dev/zero
      expected $(((1 << 20) + 49152)) 16384; } | cmp -s - "$tmp/read.out" ||
      fail "scattered: the read is not the server's bytes and hole"
    grep -q "^write-part ok" "$tmp/client.out" ||
      fail "scattered: $(cat "$tmp/client.out" "$tmp/nbdkit.err")"
    continue
  fi
  printf '%s\n' "write-full ok" "read EIO" "write-part EIO" |
    cmp -s - "$tmp/client.out" || {
      cat "$tmp/nbdkit.err" >&2
      fail "$mode: expected the read and the partial write to fail with EIO, got: $(cat "$tmp/client.out")"
    }
  [ ! -e "$tmp/read.out" ] || fail "$mode: a read was served"
  qemu-img map --output=json "$alone" | map_normalize > "$tmp/map"
  printf '%s\n' "0 65536 1 0" "65536 4128768 0 1" |
    cmp -s - "$tmp/map" ||
    fail "$mode: the overlay holds more than the full write: $(cat "$tmp/map")"
  qemu-io -c 'read -q -P 0xaa 0 64k' "$alone" > "$tmp/qio.out" &&
    ! grep -q 'Pattern verification failed' "$tmp/qio.out" ||
    fail "$mode: the cluster written is not what was written"
  case $mode in
    short|overlap|gap)
      grep -q "the server answered a read of 65536 bytes at 1048576 with .*: the read fails" \
        "$tmp/nbdkit.err" || fail "$mode: no message saying why: $(cat "$tmp/nbdkit.err")" ;;
  esac
done
