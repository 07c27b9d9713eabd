# Shared helpers for the shell tests.  Source with:
#   source "${srcdir:-.}/functions.sh"
# Every test gets a private temporary directory $tmp, removed at exit.

set -o pipefail
export LC_ALL=C
# nbdsh needs Debian's python3 with the nbd module.
export PATH="${abs_top_builddir:+$abs_top_builddir:}/usr/bin:$PATH"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/qcow2-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# requires CMD...: skip the test (exit 77) if a command is missing.
requires ()
{
  local c
  for c in "$@"; do
    if ! command -v "$c" >/dev/null 2>&1; then
      echo "$0: test skipped: $c not found"
      exit 77
    fi
  done
}

fail ()
{
  echo "$0: FAIL: $*" >&2
  exit 1
}

# map_normalize: qemu-img map --output=json on stdin -> one line per
# extent "start length data zero", adjacent equal extents merged, so maps
# from different sources (a qcow2 file, an NBD export) compare equal.
map_normalize ()
{
  /usr/bin/python3 -c '
import json, sys
out = []
for e in json.load(sys.stdin):
    d, z = bool(e["data"]), bool(e["zero"])
    if out and out[-1][2] == d and out[-1][3] == z and \
       out[-1][0] + out[-1][1] == e["start"]:
        out[-1][1] += e["length"]
    else:
        out.append([e["start"], e["length"], d, z])
for s, l, d, z in out:
    print(s, l, int(d), int(z))
'
}

# check_image IMG [PLUGIN-ARGS...]: serve IMG with the qcow2 plugin and
# check, against qemu's own reading of the same image:
#  - nbdcopy of the export equals qemu-img convert -O raw, byte for byte;
#  - qemu-img compare of the NBD export against the image says identical;
#  - extents (qemu-img map over NBD) agree with qemu-img map of the image.
# Set QEMU_IMG_OPTS (e.g. "-l snapshot.name=s1") for the reference read,
# and QEMU_IMG_SRC to a --image-opts string where the default "-f qcow2
# IMG" does not describe what is served.
check_image ()
{
  local img="$1"; shift
  local ref="$tmp/ref.raw" out="$tmp/out.raw"
  rm -f "$ref" "$out"
  if [ -n "${QEMU_IMG_SRC:-}" ]; then
    qemu-img convert ${QEMU_IMG_OPTS:-} --image-opts "$QEMU_IMG_SRC" -O raw "$ref"
    qemu-img map --output=json --image-opts "$QEMU_IMG_SRC" | map_normalize > "$tmp/map.ref"
  else
    qemu-img convert ${QEMU_IMG_OPTS:-} -f qcow2 "$img" -O raw "$ref"
    qemu-img map --output=json -f qcow2 "$img" | map_normalize > "$tmp/map.ref"
  fi
  nbdkit -U - qcow2 "file=$img" "$@" --run '
    set -e
    nbdcopy "$uri" '"$out"'
    qemu-img compare -f raw -F raw '"$ref"' "nbd+unix:///?socket=$unixsocket"
    qemu-img map --output=json -f raw "nbd+unix:///?socket=$unixsocket" > '"$tmp/map.nbd.json"'
  ' || fail "serving $img $*"
  cmp "$ref" "$out" || fail "nbdcopy of $img differs from qemu-img convert"
  map_normalize < "$tmp/map.nbd.json" > "$tmp/map.out"
  if [ -z "${QEMU_IMG_OPTS:-}" ]; then
    diff -u "$tmp/map.ref" "$tmp/map.out" || fail "extents of $img differ from qemu-img map"
  fi
}
