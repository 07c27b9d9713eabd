#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The examples of README.md and of the plugin's and the filter's man
# pages, run as a newcomer pastes them: in order, each document in an
# empty folder (README.md from the top of the build tree, as it says),
# every command succeeding; the plugin page's systemd unit started on
# its socket as systemd would (systemd-socket-activate).  They run in
# namespaces of their own (user, network, mount, PID): the examples
# that serve TCP port 10809, write /run and /var/lib (the unit) or
# leave a server in the background touch nothing outside, and what
# they start ends with them.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo nbdsh nbdcopy unshare
here=$(cd "${srcdir:-.}" && pwd)
top=$(cd "$here/.." && pwd)
build=${abs_top_builddir:-$(cd .. && pwd)}

ns=(unshare --user --map-root-user --net --mount --pid --fork --mount-proc)
if ! "${ns[@]}" true 2>/dev/null; then
  echo "$0: test skipped: no user, network, mount and PID namespaces here"
  exit 77
fi
units=--units
command -v systemd-socket-activate >/dev/null ||
  { units=; echo "$0: no systemd-socket-activate: the systemd unit not run"; }

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

/usr/bin/python3 "$here/examples.py" "$top/README.md" > "$tmp/readme.sh"
run README.md "$build" "$tmp/readme.sh"

for page in plugins/qcow2/nbdkit-qcow2-plugin.pod \
            filters/qcow2/nbdkit-qcow2-filter.pod; do
  name=${page##*/}
  mkdir "$tmp/$name.d"
  /usr/bin/python3 "$here/examples.py" "$top/$page" $units > "$tmp/$name.sh"
  run "$name" "$tmp/$name.d" "$tmp/$name.sh"
done

# What they say they do.
grep -q 'read 5/5 bytes' "$tmp/README.md.log" || fail "README: hello not read back"
grep -q 'No errors were found on the image' "$tmp/README.md.log" ||
  fail "README: qemu-img check"
grep -q 'dirty' "$tmp/README.md.log" || fail "README: the bitmap's dirty range"
grep -q 'Failed to get shared "write" lock' "$tmp/README.md.log" ||
  fail "README: qemu-img info opened an image nbdkit serves"
grep -q 'cluster_size: 4096' "$tmp/nbdkit-qcow2-plugin.pod.log" ||
  grep -q 'cluster size: 4096' "$tmp/nbdkit-qcow2-plugin.pod.log" ||
  fail "the plugin's options= example made another image"
grep -q 'Images are identical' "$tmp/nbdkit-qcow2-plugin.pod.log" ||
  fail "the plugin's overlay example wrote its base"
grep -q 'export="vm1.qcow2"' "$tmp/nbdkit-qcow2-plugin.pod.log" &&
  grep -q 'backing file: golden.qcow2' "$tmp/nbdkit-qcow2-plugin.pod.log" ||
  fail "the plugin's dir= example made no overlay of golden.qcow2"
if [ -n "$units" ]; then
  grep -qx '21474836480' "$tmp/nbdkit-qcow2-plugin.pod.log" ||
    fail "the systemd unit's disk: $(cat "$tmp/nbdkit-qcow2-plugin.pod.log")"
fi
grep -q 'No errors were found on the image' "$tmp/nbdkit-qcow2-filter.pod.log" ||
  fail "the filter's file example: qemu-img check"
grep -q 'kept' "$tmp/README.md.log" ||
  fail "README: the overlay did not keep the write"
grep -q 'changed' "$tmp/nbdkit-qcow2-filter.pod.log" ||
  fail "the filter's overlay example: the write not in the overlay"
