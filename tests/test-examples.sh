#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The examples of README.md and of the plugin's and the filter's man
# pages, run as a newcomer pastes them: in order, each document in an
# empty folder (README.md from the top of the build tree, as it says),
# every command succeeding.  They run in namespaces of their own (user,
# network, mount, PID): the examples that serve TCP port 10809, write
# /run or /var/lib or leave a server in the background touch nothing
# outside, and what they start ends with them.  (The plugin page's systemd unit:
# test-examples-unit.sh.)
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo nbdsh nbdcopy unshare
source "${srcdir:-.}/examples-functions.sh"

/usr/bin/python3 "$here/examples.py" "$top/README.md" > "$tmp/readme.sh"
run README.md "$build" "$tmp/readme.sh"

for page in plugins/qcow2/nbdkit-qcow2-plugin.pod \
            filters/qcow2/nbdkit-qcow2-filter.pod; do
  name=${page##*/}
  mkdir "$tmp/$name.d"
  /usr/bin/python3 "$here/examples.py" "$top/$page" > "$tmp/$name.sh"
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
grep -q 'No errors were found on the image' "$tmp/nbdkit-qcow2-filter.pod.log" ||
  fail "the filter's file example: qemu-img check"
grep -q 'kept' "$tmp/README.md.log" ||
  fail "README: the overlay did not keep the write"
grep -q 'changed' "$tmp/nbdkit-qcow2-filter.pod.log" ||
  fail "the filter's overlay example: the write not in the overlay"
