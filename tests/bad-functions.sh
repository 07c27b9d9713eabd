# SPDX-License-Identifier: BSD-3-Clause
# Helpers for the malformed-image tests (test-bad-*.sh).  Source with:
#   source "${srcdir:-.}/bad-functions.sh"
# after which $tmp, fail, requires (functions.sh) are available too.

source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdkit nbdsh /usr/bin/python3

# No core files from qemu-io's "abort" or from a crashing nbdkit.
ulimit -c 0

# qpatch ARGS...: tests/qcow2-patch.py (see its header for commands).
qpatch ()
{
  /usr/bin/python3 "${srcdir:-.}/qcow2-patch.py" "$@"
}

# check_status WHAT RC EXPECTED [LOG]: a timeout or a signal (or, in
# LOG, nbdkit reporting its server or the --run command killed by a
# signal) is always a bug; otherwise the exit status must be EXPECTED.
check_status ()
{
  local what="$1" rc="$2" expected="$3" log="${4:-/dev/null}"
  if grep -q "killed by signal" "$log"; then
    fail "$what: a process was killed by a signal (crash)"
  fi
  case "$rc" in
    124) fail "$what: timed out (hang?)" ;;
    "$expected") ;;
    *)
      if [ "$rc" -gt 128 ]; then
        fail "$what: killed by signal $((rc - 128)) (crash)"
      fi
      fail "$what: exit status $rc, expected $expected" ;;
  esac
}

# expect_open_error IMG REGEX...: nbdkit must refuse to serve IMG at
# startup: exit status 1 (not success, not a crash, not a hang), the
# --run command never runs, an "error:" line names the file the problem
# is in ($ERR_FILE, default IMG), the messages match each REGEX
# (extended, case-insensitive), and each line is one of nbdkit's
# messages (message_shape).  Extra plugin arguments: $OPEN_ARGS.
expect_open_error ()
{
  local img="$1"; shift
  local log="$tmp/open-error.log" rc=0 re
  rm -f "$tmp/ran"
  echo "== $img: expecting an error at open: $*"
  timeout 30 nbdkit -U - qcow2 "file=$img" ${OPEN_ARGS:-} \
    --run "touch '$tmp/ran'" > "$log" 2>&1 || rc=$?
  sed 's/^/    /' "$log"
  [ "$rc" -ne 0 ] || fail "$img: nbdkit served a malformed image"
  check_status "nbdkit serving $img" "$rc" 1 "$log"
  [ ! -e "$tmp/ran" ] || fail "$img: nbdkit started serving the image"
  grep -qF "error: ${ERR_FILE:-$img}: " "$log" ||
    fail "$img: no error message naming ${ERR_FILE:-$img}"
  for re in "$@"; do
    grep -qiE -- "$re" "$log" || fail "$img: error does not match: $re"
  done
  message_shape "$log" || fail "$img: a line that is not one of nbdkit's messages"
}

# Python for nbdsh: expect_eio (offset, count) asserts that the read (or
# with blockstatus=True, the block status request) fails with EIO;
# expect_pattern (offset, count, byte) asserts what a read returns.
# libnbd's nbd.Error: .errnum is the number, .errno the name.
BAD_PRELUDE='
import errno
def expect_eio(offset, count, blockstatus=False):
    try:
        if blockstatus:
            h.block_status(count, offset, lambda *args: 0)
        else:
            h.pread(count, offset)
    except nbd.Error as e:
        print("expected error at %d+%d: %s" % (offset, count, e))
        assert e.errnum == errno.EIO, "errno %s, expected EIO" % e.errno
    else:
        raise AssertionError("request at %d+%d did not fail" % (offset, count))
def expect_pattern(offset, count, byte):
    buf = h.pread(count, offset)
    assert buf == bytes([byte]) * count, \
        "read at %d+%d: unexpected data" % (offset, count)
'

# expect_served_errors IMG SCRIPT REGEX...: serve IMG (read-only, as
# the plugin is) and run the Python SCRIPT in one nbdsh session, with
# BAD_PRELUDE's functions; the script must succeed (so every request
# that should fail fails with EIO, and the server keeps answering), and
# nbdkit's messages must match each REGEX.
expect_served_errors ()
{
  local img="$1" script="$2"; shift 2
  local log="$tmp/served.log" rc=0 re
  echo "== $img: expecting errors while serving: $*"
  export BAD_PRELUDE BAD_SCRIPT="$script"
  timeout 60 nbdkit -U - qcow2 "file=$img" \
    --run 'nbdsh --base-allocation -u "$uri" -c "$BAD_PRELUDE" -c "$BAD_SCRIPT"' \
    > "$log" 2>&1 || rc=$?
  sed 's/^/    /' "$log"
  check_status "serving $img" "$rc" 0 "$log"
  for re in "$@"; do
    grep -qiE -- "$re" "$log" || fail "$img: messages do not match: $re"
  done
}
