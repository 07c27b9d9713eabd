#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter over remote storage: the nbd plugin forwarding to a
# second nbdkit serving the image's bytes (read and written); backing
# files local, in backing-dir=.  (Over the curl plugin:
# test-filter-qcow2-http.sh.)
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/filter-qcow2-image.sh"

# nbd: the raw bytes served by another nbdkit, with room to grow.
cp "$img" "$tmp/dir/w.qcow2"
truncate -s +8M "$tmp/dir/w.qcow2"
sock=$tmp/raw.sock
nbdkit -U "$sock" -P "$tmp/raw.pid" file "$tmp/dir/w.qcow2"
wait_socket "$sock" "$(cat "$tmp/raw.pid")" || fail "the file server"
read_as remote --filter=qcow2 nbd socket="$sock" backing-dir="$tmp/dir"
cmp "$tmp/want.raw" "$tmp/remote.raw" || fail "read over the nbd plugin"
nbdkit -U - --filter=qcow2 nbd socket="$sock" backing-dir="$tmp/dir" \
  --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x5a\" * 100000, (6 << 20) + 3)
h.zero(4096, 1 << 20)
h.flush()
"' || fail "writes over the nbd plugin"
kill "$(cat "$tmp/raw.pid")"
qemu-img check -q "$tmp/dir/w.qcow2" || fail "qemu-img check after writes over nbd"
qemu-io -f qcow2 -c 'read -P 0x5a 6291459 100000' -c 'read -P 0 1M 4k' \
  -c 'read -P 0x22 1052672 4k' "$tmp/dir/w.qcow2" > "$tmp/qio.log" ||
  { cat "$tmp/qio.log"; fail "qemu-io reads other data than was written over nbd"; }
