#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter over the curl plugin against a local HTTP server
# that answers range requests (range-server.py), read-only, backing
# files local in backing-dir=: it reads as qemu-img does.  A file there
# that is not qcow2 is refused with a message that names the plugin and
# its URL, never the URL's password.
source "${srcdir:-.}/functions.sh"
set -e
requires_nbdkit_plugin curl
source "${srcdir:-.}/filter-qcow2-image.sh"
source "${srcdir:-.}/remote-functions.sh"

head -c 1M /dev/urandom > "$tmp/dir/notq.img"
http_server "$tmp/dir"
read_as http -r --filter=qcow2 curl "http://127.0.0.1:$http_port/top.qcow2" \
  backing-dir="$tmp/dir"
cmp "$tmp/want.raw" "$tmp/http.raw" || fail "over HTTP (curl plugin)"

# The filter opens the image after --run's command started: that
# command cannot connect, and nbdkit exits with the error.
r=0
timeout -k 5 60 nbdkit -U - -r --filter=qcow2 \
  curl "http://someone:secret@127.0.0.1:$http_port/notq.img" \
  --run 'nbdinfo --size "$uri"' > /dev/null 2> "$tmp/refused.err" || r=$?
[ "$r" -ne 0 ] && [ "$r" -ne 124 ] ||
  fail "a file that is not qcow2 over HTTP: exit status $r: $(cat "$tmp/refused.err")"
grep -Eq "^nbdkit: error: curl url=http://127.0.0.1:$http_port/notq.img: not a qcow2 image" \
  "$tmp/refused.err" || fail "the curl plugin not named: $(cat "$tmp/refused.err")"
! grep -q secret "$tmp/refused.err" || fail "a URL's password in a message"
