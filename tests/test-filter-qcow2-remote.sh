#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter over remote storage: the nbd plugin forwarding to a
# second nbdkit serving the image's bytes (read and written), and the
# curl plugin against a local HTTP server that answers range requests
# (read-only); backing files local, in backing-dir=.
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/filter-qcow2-image.sh"
here=$(cd "${srcdir:-.}" && pwd)

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

# curl: HTTP with range requests, read-only.
if nbdkit curl --version >/dev/null 2>&1 && /usr/bin/python3 -c 'import http.server'; then
  port_file=$tmp/http.port
  /usr/bin/python3 "$here/range-server.py" "$tmp/dir" "$port_file" &
  http=$!
  for i in $(seq 50); do [ -s "$port_file" ] && break; sleep 0.1; done
  read_as http -r --filter=qcow2 curl "http://127.0.0.1:$(cat "$port_file")/top.qcow2" \
    backing-dir="$tmp/dir"
  kill "$http"
  cmp "$tmp/want.raw" "$tmp/http.raw" || fail "over HTTP (curl plugin)"
else
  echo "$0: the curl plugin or python3's http.server is missing: HTTP not tested"
fi
