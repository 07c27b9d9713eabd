# SPDX-License-Identifier: BSD-3-Clause
# Shared helpers for the shell tests.  Source with:
#   source "${srcdir:-.}/functions.sh"
# Every test gets a private temporary directory $tmp, removed at exit.
# nbdkit runs under timeout (TEST_TIMEOUT seconds, default 120) in the
# helpers, so that a hang fails the test instead of blocking the suite.

set -o pipefail
export LC_ALL=C
# nbdsh needs Debian's python3 with the nbd module.
export PATH="${abs_top_builddir:+$abs_top_builddir:}/usr/bin:$PATH"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/qcow2-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Killed by the suite's time limit (bounded) or by hand: still run the
# EXIT trap, which stops the servers the test started.
trap 'exit 143' TERM INT

# QEMU's tools, bounded too (QEMU_TIMEOUT seconds, default 300): a hang
# in the oracle fails the test, it does not hold the suite.  QEMU 7.2's
# curl driver can hang for good (ppoll with no timeout) reading from a
# web server; the tests that read through it set QEMU_HANG_RETRIES to
# run such a command again rather than fail on the oracle's bug.
_qemu_bounded ()
{
  local try r
  for try in $(seq $((1 + ${QEMU_HANG_RETRIES:-0}))); do
    r=0
    timeout -k 5 "${QEMU_TIMEOUT:-300}" "$@" || r=$?
    [ "$r" -eq 124 ] || return "$r"
    echo "$0: timed out (try $try): $*" >&2
  done
  return 124
}
qemu-img () { _qemu_bounded qemu-img "$@"; }
qemu-io () { _qemu_bounded qemu-io "$@"; }

# requires CMD...: skip the test (exit 77) if a command is missing.
requires ()
{
  local c
  for c in "$@"; do
    if ! type -P "$c" >/dev/null 2>&1; then
      echo "$0: test skipped: $c not found"
      exit 77
    fi
  done
}

# requires_python_nbd: skip the test (exit 77) if /usr/bin/python3
# cannot import libnbd's nbd module, which the tests' Python clients use.
requires_python_nbd ()
{
  /usr/bin/python3 -c 'import nbd' 2>/dev/null || {
    echo "$0: test skipped: /usr/bin/python3 has no nbd module (libnbd's Python bindings)"
    exit 77
  }
}

# requires_nbdkit_plugin NAME...: skip the test (exit 77) if nbdkit
# lacks one of these plugins.
requires_nbdkit_plugin ()
{
  local p
  for p in "$@"; do
    if ! nbdkit "$p" --version >/dev/null 2>&1; then
      echo "$0: test skipped: no nbdkit $p plugin"
      exit 77
    fi
  done
}

# requires_nbdkit_filter NAME...: skip the test (exit 77) if nbdkit
# lacks one of these filters.
requires_nbdkit_filter ()
{
  local f
  for f in "$@"; do
    if ! nbdkit --filter="$f" null --version >/dev/null 2>&1; then
      echo "$0: test skipped: no nbdkit $f filter"
      exit 77
    fi
  done
}

# requires_qemu_driver NAME...: skip the test (exit 77) if qemu-img
# lacks one of these block drivers (curl's are http and https, ssh's
# ssh: Debian's qemu-block-extra).
requires_qemu_driver ()
{
  local d
  qemu-img --help > "$tmp/qemu-img.help" 2>&1 || :
  for d in "$@"; do
    if ! grep -q " $d " "$tmp/qemu-img.help"; then
      echo "$0: test skipped: qemu-img has no $d driver"
      exit 77
    fi
  done
}

fail ()
{
  echo "$0: FAIL: $*" >&2
  exit 1
}

# wait_socket SOCK PID: wait (up to 10 s) until the server PID listens
# on SOCK; false if it exits first or never does.
wait_socket ()
{
  local i
  for i in $(seq 100); do
    [ -S "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  [ -S "$1" ]
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

# _qemu_src IMG: the qemu-img arguments naming the reference for IMG:
# "-f qcow2 IMG", or QEMU_IMG_SRC if set: a "json:{...}" filename (for
# what key=value syntax cannot say, e.g. "backing": null) or else an
# --image-opts string.
_qemu_src ()
{
  case "${QEMU_IMG_SRC:-}" in
    "") qemu_src=(-f qcow2 "$1") ;;
    json:*) qemu_src=("$QEMU_IMG_SRC") ;;
    *) qemu_src=(--image-opts "$QEMU_IMG_SRC") ;;
  esac
}

# _check_served WHAT NBDKIT-ARGS...: the checks shared by check_image and
# check_window; the reference is qemu_src (an array of qemu-img args).
# The two maps are taken first, before anything reads the data: on ext4,
# SEEK_DATA reports a preallocated ("unwritten") extent as a hole until
# something reads it into the page cache, and both qemu and the plugin
# look at holes in the file (preallocation=metadata heuristics).
_check_served ()
{
  local what="$1"; shift
  local ref="$tmp/ref.raw" out="$tmp/out.raw" try
  rm -f "$ref" "$out" "$tmp/map.ref" "$tmp/map.out" "$tmp/map.nbd.json"
  # The page cache can change between the two maps (pages of an
  # unwritten extent evicted under memory pressure turn data back into
  # a hole), so a difference is looked at twice before it counts.
  for try in 1 2; do
    [ -z "${QEMU_IMG_OPTS:-}" ] || break
    qemu-img map --output=json "${qemu_src[@]}" | map_normalize > "$tmp/map.ref" ||
      fail "qemu-img map of $what (the reference) failed"
    timeout -k 10 "${TEST_TIMEOUT:-120}" nbdkit -U - "$@" --run '
      qemu-img map --output=json -f raw "nbd+unix:///?socket=$unixsocket"
    ' > "$tmp/map.nbd.json" || fail "map of $what over NBD: nbdkit $*"
    map_normalize < "$tmp/map.nbd.json" > "$tmp/map.out"
    cmp -s "$tmp/map.ref" "$tmp/map.out" && break
  done
  qemu-img convert ${QEMU_IMG_OPTS:-} "${qemu_src[@]}" -O raw "$ref" ||
    fail "qemu-img convert of $what (the reference) failed"
  timeout -k 10 "${TEST_TIMEOUT:-120}" nbdkit -U - "$@" --run '
    set -e
    nbdcopy "$uri" '"$out"'
    qemu-img compare -f raw -F raw '"$ref"' "nbd+unix:///?socket=$unixsocket"
  ' > "$tmp/compare.out" || {
    cat "$tmp/compare.out"
    fail "serving $what: nbdkit $*"
  }
  cmp "$ref" "$out" || fail "nbdcopy of $what differs from qemu-img convert"
  if [ -z "${QEMU_IMG_OPTS:-}" ]; then
    diff -u "$tmp/map.ref" "$tmp/map.out" ||
      fail "extents of $what differ from qemu-img map"
  fi
}

# check_image IMG [PLUGIN-ARGS...]: serve IMG with the qcow2 plugin and
# check, against qemu's own reading of the same image:
#  - nbdcopy of the export equals qemu-img convert -O raw, byte for byte;
#  - qemu-img compare of the NBD export against the image says identical;
#  - extents (qemu-img map over NBD) agree with qemu-img map of the image.
# Set QEMU_IMG_OPTS (e.g. "-l snapshot.name=s1") for the reference read
# (this disables the map comparison: qemu-img map has no such option),
# and QEMU_IMG_SRC to a --image-opts string (or a json: filename) where
# the default "-f qcow2 IMG" does not describe what is served.
check_image ()
{
  local img="$1"; shift
  local qemu_src
  _qemu_src "$img"
  _check_served "$img" qcow2 "file=$img" "$@"
}

# check_window IMG OFFSET LENGTH [PLUGIN-ARGS...]: the checks of
# check_image, on the window [OFFSET, OFFSET+LENGTH) of the disk only,
# for disks too big to copy whole.  nbdkit serves the window through
# its offset filter; qemu reads it through a raw node with offset= and
# size= over the qcow2 node.  Ignores QEMU_IMG_SRC.
check_window ()
{
  local img="$1" off="$2" len="$3"; shift 3
  local qemu_src
  qemu_src=(--image-opts
    "driver=raw,offset=$off,size=$len,file.driver=qcow2,file.file.filename=$img")
  _check_served "$img [$off, +$len)" \
    --filter=offset qcow2 "file=$img" "offset=$off" "range=$len" "$@"
}

# check_map IMG [PLUGIN-ARGS...]: only the extents, over the whole disk
# (cheap even for huge sparse disks): qemu-img map over NBD against
# qemu-img map of the image.
check_map ()
{
  local img="$1"; shift
  local qemu_src
  _qemu_src "$img"
  qemu-img map --output=json "${qemu_src[@]}" | map_normalize > "$tmp/map.ref" ||
    fail "qemu-img map of $img (the reference) failed"
  timeout -k 10 "${TEST_TIMEOUT:-120}" nbdkit -U - qcow2 "file=$img" "$@" --run '
    qemu-img map --output=json -f raw "nbd+unix:///?socket=$unixsocket"
  ' > "$tmp/map.nbd.json" || fail "serving $img $*"
  map_normalize < "$tmp/map.nbd.json" > "$tmp/map.out"
  diff -u "$tmp/map.ref" "$tmp/map.out" ||
    fail "extents of $img differ from qemu-img map"
}

# expect_refused MESSAGE-REGEXP NBDKIT-ARGS...: nbdkit must refuse to
# start (an error exit, not a crash or a hang; nothing run) with an
# error message matching the extended regexp, every line of its stderr
# one of nbdkit's messages (message_shape).
expect_refused ()
{
  local re="$1"; shift
  local r=0
  timeout -k 10 "${TEST_TIMEOUT:-120}" nbdkit -U - "$@" --run 'echo SERVED' > "$tmp/refused.out" 2> "$tmp/refused.err" || r=$?
  if [ "$r" -eq 0 ] || grep -q SERVED "$tmp/refused.out"; then
    fail "nbdkit $* was expected to fail, but served"
  fi
  if [ "$r" -eq 124 ] || [ "$r" -gt 128 ]; then
    cat "$tmp/refused.err" >&2
    fail "nbdkit $*: timed out or killed by a signal (exit status $r)"
  fi
  grep -Eq -- "$re" "$tmp/refused.err" || {
    cat "$tmp/refused.err" >&2
    fail "nbdkit $*: error does not match /$re/"
  }
  message_shape "$tmp/refused.err" ||
    fail "nbdkit $*: a line that is not one of nbdkit's messages"
}

# message_shape FILE: each line of FILE (nbdkit's stderr) is one of
# nbdkit's messages, "nbdkit: " first: an error, a notice, a debug line,
# or a hint (the remedy of the error or notice before it, on a line of
# its own).  A line without the prefix, a message's second line, would
# be lost to "grep nbdkit:" and to syslog.  Says which lines are not.
message_shape ()
{
  awk '
    /^nbdkit: ([^ :]+: )?error: hint: / ||
    /^nbdkit: [^ :]+: notice: .*: hint: / {
      if (!said) { print FILENAME ":" FNR ": a hint of nothing: " $0; bad = 1 }
      next
    }
    /^nbdkit: ([^ :]+: )?(error|notice): / { said = 1; next }
    /^nbdkit: ([^ :]+: )?debug: / { next }
    { print FILENAME ":" FNR ": not a line of nbdkit: " $0; bad = 1 }
    END { exit bad }' "$1" >&2
}

# expect_read_only IMG MESSAGE-REGEXP NBDKIT-ARGS...: nbdkit serves a
# read-only export (a client's write fails with EPERM) with a message
# matching the extended regexp (none asked if it is empty) in
# $tmp/read-only.err, and the file IMG stays unchanged.
expect_read_only ()
{
  local img="$1" re="$2"; shift 2
  local sum
  sum=$(md5sum < "$img")
  nbdkit "$@" --run 'nbdsh -u "$uri" -c "
import errno
assert h.is_read_only()
try:
    h.pwrite(b\"x\" * 512, 0)
    raise AssertionError(\"write succeeded\")
except nbd.Error as e:
    assert e.errnum == errno.EPERM, e
"' 2> "$tmp/read-only.err" || { cat "$tmp/read-only.err"; fail "nbdkit $*"; }
  [ -z "$re" ] || grep -Eq -- "$re" "$tmp/read-only.err" ||
    fail "nbdkit $*: no message /$re/: $(cat "$tmp/read-only.err")"
  [ "$(md5sum < "$img")" = "$sum" ] || fail "nbdkit $*: the file changed"
}

# qsrc IMG: set qsrc to the qemu-img or qemu-io arguments that open
# IMG (qcow2), with the password QEMU_SECRET when that is set (LUKS).
qsrc ()
{
  if [ -n "${QEMU_SECRET:-}" ]; then
    qsrc=(--object "secret,id=sec0,data=$QEMU_SECRET" --image-opts
          "driver=qcow2,file.filename=$1,encrypt.key-secret=sec0")
  else
    qsrc=(-f qcow2 "$1")
  fi
}

# qio IMG CMD...: run the qemu-io commands CMD... on IMG (format qcow2,
# or $QIO_FMT; see qsrc for QEMU_SECRET), quietly; any failing command
# fails the test.
qio ()
{
  local img="$1"; shift
  local args=() c qsrc
  for c in "$@"; do args+=(-c "$c"); done
  if [ -n "${QIO_FMT:-}" ]; then qsrc=(-f "$QIO_FMT" "$img"); else qsrc "$img"; fi
  qemu-io "${qsrc[@]}" "${args[@]}" > "$tmp/qio.out" 2>&1 || {
    cat "$tmp/qio.out" >&2
    fail "qemu-io on $img: $*"
  }
}

# qemu_img_pbkdf ARGS...: qemu-img ARGS, for commands that make LUKS
# key slots.  QEMU times its first PBKDF2 iterations with getrusage and
# fails ("Unable to get accurate CPU usage") when they take under a
# millisecond, as they often do on a fast CPU: tried again, up to 60
# times.  Any other failure prints qemu-img's message and returns 1.
qemu_img_pbkdf ()
{
  local i
  for i in $(seq 60); do
    qemu-img "$@" 2> "$tmp/qemu-img.err" && return 0
    grep -q "accurate CPU usage" "$tmp/qemu-img.err" || break
  done
  cat "$tmp/qemu-img.err" >&2
  return 1
}
