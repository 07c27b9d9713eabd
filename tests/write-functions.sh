# SPDX-License-Identifier: BSD-3-Clause
# Helpers for the write tests (test-write-*.sh), on top of functions.sh.
# Source with:
#   source "${srcdir:-.}/write-functions.sh"
#
# The server under test is chosen by WRITE_SERVER:
#   nbdkit    (default) nbdkit with the qcow2 plugin built here;
#   qemu-nbd  qemu's own server, to validate the tests themselves.
# DIFFWRITE_SEED (a number, or "random") and DIFFWRITE_OPS override
# the seed and the number of requests of every diffwrite.py run.

source "${srcdir:-.}/functions.sh"

write_server=${WRITE_SERVER:-nbdkit}
case "$write_server" in
  nbdkit|qemu-nbd) ;;
  *) fail "WRITE_SERVER=$write_server: must be nbdkit or qemu-nbd" ;;
esac
requires qemu-img qemu-io nbdcopy /usr/bin/python3 "$write_server"
requires_python_nbd
diffwrite_py="$(cd "${srcdir:-.}" && pwd)/diffwrite.py"
[ -f "$diffwrite_py" ] || fail "$diffwrite_py not found"

# serve_rw IMG CMD [PLUGIN-ARGS...]: run the shell command CMD with
# $uri naming IMG (a qcow2 image) served writable by the server under
# test, under timeout; the server has exited when this returns.
# PLUGIN-ARGS are for the qcow2 plugin (qemu-nbd ignores them).
serve_rw ()
{
  local img="$1" cmd="$2"; shift 2
  local r=0
  case "$write_server" in
    nbdkit)
      timeout -k 10 "${TEST_TIMEOUT:-120}" \
        nbdkit -U - qcow2 "file=$img" "$@" --run "$cmd" || r=$?
      ;;
    qemu-nbd)
      local sock="$tmp/qemu-nbd.sock" pid
      rm -f "$sock"
      qemu-nbd -t -e 16 -k "$sock" -f qcow2 --cache=writeback \
        --discard=unmap --detect-zeroes=off "$img" &
      pid=$!
      wait_socket "$sock" "$pid" ||
        { kill "$pid" 2>/dev/null; wait "$pid";
          fail "qemu-nbd did not start on $img"; }
      uri="nbd+unix:///?socket=$sock" unixsocket="$sock" \
        timeout -k 10 "${TEST_TIMEOUT:-120}" bash -c "$cmd" || r=$?
      kill "$pid"
      wait "$pid" || true
      ;;
  esac
  return $r
}

# image_info IMG: set img_cluster, img_size, img_backing (full path, or
# empty) and img_backing_fmt from qemu-img info.
image_info ()
{
  local out
  out=$(qemu-img info --output=json -f qcow2 "$1" | /usr/bin/python3 -c '
import json, sys
i = json.load(sys.stdin)
print(i["cluster-size"])
print(i["virtual-size"])
print(i.get("full-backing-filename", ""))
print(i.get("backing-filename-format", ""))
print("end")
') || fail "qemu-img info $1"
  { read -r img_cluster; read -r img_size; read -r img_backing
    read -r img_backing_fmt; } <<< "$out"
}

# header_flags IMG: the incompatible-feature bits "dirty corrupt" of a
# qcow2 v3 header, as 0 or 1 each ("0 0" for v2).
header_flags ()
{
  /usr/bin/python3 -c '
import struct, sys
h = open(sys.argv[1], "rb").read(80)
v = struct.unpack(">I", h[4:8])[0]
f = struct.unpack(">Q", h[72:80])[0] if v >= 3 else 0
print(f & 1, (f >> 1) & 1)
' "$1"
}

# check_written IMG: what a user checks after writing to an image:
# qemu-img check exits 0 (no corruption, no leaks), and the header is
# neither marked corrupt nor left dirty (lazy refcounts) after the
# server exited.
check_written ()
{
  local img="$1" r=0 flags qsrc
  qsrc "$img"
  qemu-img check "${qsrc[@]}" > "$tmp/check.out" 2>&1 || r=$?
  if [ "$r" -ne 0 ]; then
    cat "$tmp/check.out" >&2
    fail "qemu-img check $img exited with $r (2: corrupt, 3: leaks)"
  fi
  flags=$(header_flags "$img")
  [ "${flags#* }" = 0 ] || fail "$img is marked corrupt"
  [ "${flags% *}" = 0 ] || fail "$img is left dirty after the server exited"
}

# diffwrite IMG [DRIVER-ARGS...] [-- PLUGIN-ARGS...]: the randomized
# differential write test on IMG: serve it writable, run diffwrite.py
# against it (with its model starting as qemu-img convert of IMG, and
# trimmed ranges allowed to read as the backing file), then, once the
# server has exited: check_written, and qemu-img convert of IMG must be
# byte for byte the driver's final model.  --cluster-size is IMG's
# unless given.  Leaves the final contents in $tmp/dw-final.raw.
diffwrite ()
{
  local img="$1"; shift
  local dargs=() pargs=() cmd qsrc
  qsrc "$img"
  while [ $# -gt 0 ]; do
    if [ "$1" = -- ]; then shift; pargs=("$@"); break; fi
    dargs+=("$1"); shift
  done
  image_info "$img"
  rm -f "$tmp/dw-start.raw" "$tmp/dw-final.raw" "$tmp/dw-after.raw" \
        "$tmp/dw-backing.raw"
  qemu-img convert "${qsrc[@]}" -O raw "$tmp/dw-start.raw" ||
    fail "qemu-img convert $img"
  dargs=(--cluster-size "$img_cluster" "${dargs[@]}")
  if [ -n "$img_backing" ]; then
    qemu-img convert ${img_backing_fmt:+-f "$img_backing_fmt"} \
      -O raw "$img_backing" "$tmp/dw-backing.raw" ||
      fail "qemu-img convert $img_backing"
    dargs+=(--backing "$tmp/dw-backing.raw")
  fi
  case "${DIFFWRITE_SEED:-}" in
    "") ;;
    random) dargs+=(--seed "$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')") ;;
    *) dargs+=(--seed "$DIFFWRITE_SEED") ;;
  esac
  [ -z "${DIFFWRITE_OPS:-}" ] || dargs+=(--ops "$DIFFWRITE_OPS")
  [ "$write_server" = nbdkit ] && dargs+=(--require-multi-conn)
  cmd="$(printf '%q ' /usr/bin/python3 "$diffwrite_py")\"\$uri\" $(printf '%q ' \
    --model "$tmp/dw-start.raw" --dump "$tmp/dw-final.raw" "${dargs[@]}")"
  echo "diffwrite ${img##*/} (${pargs[*]}): ${dargs[*]}"
  serve_rw "$img" "$cmd" "${pargs[@]}" ||
    fail "diffwrite on $img: ${dargs[*]} (server: $write_server ${pargs[*]})"
  check_written "$img"
  qemu-img convert "${qsrc[@]}" -O raw "$tmp/dw-after.raw" ||
    fail "qemu-img convert $img after writing"
  cmp "$tmp/dw-final.raw" "$tmp/dw-after.raw" ||
    fail "$img after the server exited differs from what it served last"
}

# random_raw FILE SIZE SEED: a raw file of SIZE bytes, deterministic
# from SEED: random (incompressible) data in the first and third
# eighths and at a few scattered places, compressible text-like data
# in the fifth, zeros (holes) elsewhere.
random_raw ()
{
  /usr/bin/python3 -c '
import random, sys
f, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
e = size // 8
with open(f, "wb") as o:
    o.truncate(size)
    o.seek(0); o.write(r.randbytes(e))
    o.seek(2 * e + 777); o.write(r.randbytes(e))
    o.seek(4 * e + 3); o.write((b"qcow2 compressible %d " % seed) * (e // 24))
    for _ in range(16):
        n = r.randrange(1, 70000)
        off = r.randrange(size - n)
        o.seek(off); o.write(r.randbytes(n))
' "$1" "$2" "$3" || fail "random_raw $*"
}

# make_image IMG SIZE CREATE-OPTS [SEED]: a qcow2 image of SIZE bytes
# made with qemu-img convert -o CREATE-OPTS from random_raw, then
# patterns, zeroes and discards written over it by qemu-io.
make_image ()
{
  local img="$1" size="$2" opts="$3" seed="${4:-1}"
  random_raw "$tmp/src.raw" "$size" "$seed"
  rm -f "$img"
  qemu-img convert -f raw -O qcow2 -o "$opts" "$tmp/src.raw" "$img" ||
    fail "qemu-img convert -o $opts"
  local q=$((size / 4))
  qio "$img" "write -P 0x5a $((q + 1001)) $((q / 3))" \
             "write -z $((size / 2 - 4096)) 12345" \
             "discard $((size / 8)) $((size / 16))" \
             "write -P 0xa5 $((size - 1536)) 1536"
}
