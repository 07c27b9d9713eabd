# SPDX-License-Identifier: BSD-3-Clause
# Helpers for the overlay tests (test-overlay-*.sh: the qcow2 filter's
# qcow2-overlay=FILE), after functions.sh.
requires qemu-img qemu-io nbdsh nbdcopy nbdinfo cmp sha256sum
requires_python_nbd
# overlay-ops.py, for --run commands (see there).
overlay_ops="$(cd "${srcdir:-.}" && pwd)/overlay-ops.py"

# make_base FILE SIZE: a raw disk of SIZE bytes (a multiple of 8 MiB
# or less than 8): random data in [0, 3/8) and [5/8, 6/8) of it,
# holes elsewhere.
make_base ()
{
  /usr/bin/python3 -c '
import random, sys
path, size = sys.argv[1], int(sys.argv[2])
r = random.Random(size)
with open(path, "wb") as f:
    f.write(r.randbytes(size * 3 // 8))
    f.seek(size * 5 // 8)
    f.write(r.randbytes(size // 8))
    f.truncate(size)
' "$1" "$2"
}

# expect_unserved MESSAGE-REGEXP NBDKIT-ARGS...: nbdkit starts, but the
# overlay, opened at start, fails: a client is refused, and the error
# matches the extended regexp.
expect_unserved ()
{
  local re="$1"; shift
  if timeout -k 10 "${TEST_TIMEOUT:-120}" nbdkit -U - "$@" \
       --run 'nbdinfo --size "$uri"' > "$tmp/unserved.out" \
       2> "$tmp/unserved.err"; then
    fail "nbdkit $* served: $(cat "$tmp/unserved.out")"
  fi
  grep -Eq -- "$re" "$tmp/unserved.err" || {
    cat "$tmp/unserved.err" >&2
    fail "nbdkit $*: error does not match /$re/"
  }
}

# served_map URI: qemu-img map of the export, normalized.
served_map ()
{
  qemu-img map --output=json -f raw "$1" | map_normalize
}

# serves_alone FILE MODEL WHAT: FILE detached from what was below it
# (its backing name dropped) and served alone by the plugin reads as
# MODEL, the disk that was served through the filter.
serves_alone ()
{
  qemu-img rebase -u -b "" "$1"
  nbdkit -U - qcow2 "$1" --run 'nbdcopy "$uri" '"$tmp/alone.out" ||
    fail "$3: nbdkit qcow2 FILE alone"
  cmp "$tmp/alone.out" "$2" ||
    fail "$3: FILE alone differs from what was served"
}

# check_overlay FILE: qemu-img check of FILE alone, which QEMU opens
# only so when FILE records our own backing name (no qcow2-overlay-
# backing=), as the man page says.
check_overlay ()
{
  qemu-img check -q "json:{\"file\":{\"filename\":\"$1\"},\"backing\":null}"
}
