#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The systemd unit of the plugin's man page (its EXAMPLES), started on
# its socket as systemd would (systemd-socket-activate), in namespaces
# of its own as test-examples.sh runs the examples: it serves the disk
# the unit names, of the size the unit gives.
source "${srcdir:-.}/functions.sh"
set -e
requires nbdinfo unshare systemd-socket-activate
source "${srcdir:-.}/examples-functions.sh"

page=plugins/qcow2/nbdkit-qcow2-plugin.pod
/usr/bin/python3 "$here/examples.py" "$top/$page" --units > "$tmp/unit.sh"
mkdir "$tmp/unit.d"
run unit "$tmp/unit.d" "$tmp/unit.sh"
grep -qx '21474836480' "$tmp/unit.log" ||
  fail "the systemd unit's disk: $(cat "$tmp/unit.log")"
