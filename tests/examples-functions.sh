# SPDX-License-Identifier: BSD-3-Clause
# Helpers of the tests that run the documents' examples (examples.py).
# Source after functions.sh; the test skips (exit 77) without user,
# network, mount and PID namespaces.

here=$(cd "${srcdir:-.}" && pwd)
top=$(cd "$here/.." && pwd)
build=${abs_top_builddir:-$(cd .. && pwd)}

ns=(unshare --user --map-root-user --net --mount --pid --fork --mount-proc)
if ! "${ns[@]}" true 2>/dev/null; then
  echo "$0: test skipped: no user, network, mount and PID namespaces here"
  exit 77
fi

# run NAME DIR SCRIPT: SCRIPT run from DIR in the namespaces, with the
# build tree's nbdkit first in PATH, its output in $tmp/NAME.log.
run ()
{
  local name="$1" dir="$2" script="$3"
  echo "== $name"
  if ! (cd "$dir" &&
        TMPDIR="$tmp" PATH="$build:/usr/bin:$PATH" timeout -k 10 120 \
          "${ns[@]}" bash -c '
            ip link set lo up
            mount -t tmpfs tmpfs /run
            mount -t tmpfs tmpfs /var/lib
            exec bash "$1"' bash "$script") > "$tmp/$name.log" 2>&1; then
    cat "$tmp/$name.log"
    fail "the examples of $name: the last command above failed"
  fi
}
