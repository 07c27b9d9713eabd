#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What an image from someone else can make the server do.  A cookie in
# a json: name that nbdkit's curl plugin would read as a file ("+FILE")
# or a descriptor ("-FD", "-") is refused, through the plugin and the
# filter, and the web server (logging each request's headers) never
# sees the file's content; a plain cookie goes out as it is.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh
nbdkit curl --version >/dev/null 2>&1 || { echo "$0: no curl plugin: skipped"; exit 77; }
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/overlay-functions.sh"      # expect_unserved

mkdir "$tmp/web"
qemu-img create -q -f raw "$tmp/web/base.raw" 1M
echo "SECRET-LINE-$$" > "$tmp/secret"
export RANGE_SERVER_LOG=$tmp/http.log
http_server "$tmp/web"
url=http://127.0.0.1:$http_port/base.raw

# curl_json COOKIE: a backing name with the curl driver and this cookie.
curl_json ()
{
  echo 'json:{"driver":"raw","file":{"driver":"http","url":"'"$url"'","cookie":"'"$1"'"}}'
}

for cookie in "+$tmp/secret" "-" "-0" "-3"; do
  qemu-img create -q -f qcow2 -u -b "$(curl_json "$cookie")" -F raw \
    "$tmp/ovl.qcow2" 1M
  re="the cookie \"$(printf '%s' "$cookie" | sed 's/[+]/\\+/g')\" is refused: nbdkit's curl plugin would read it as the name of a file or descriptor"
  expect_refused "$re" qcow2 "$tmp/ovl.qcow2"
  expect_unserved "$re" --filter=qcow2 file "$tmp/ovl.qcow2"
done
! grep -q SECRET "$tmp/http.log" 2>/dev/null ||
  fail "the file's content went out: $(cat "$tmp/http.log")"

# A cookie with a line break in it would end the header.
qemu-img create -q -f qcow2 -u -b "$(curl_json 'a=b\r\nX-Evil: 1')" -F raw \
  "$tmp/ovl.qcow2" 1M
expect_refused 'the cookie is refused: it holds a line break' \
  qcow2 "$tmp/ovl.qcow2"

# A plain cookie is sent as it is.
qemu-img create -q -f qcow2 -u -b "$(curl_json 'session=+x-1')" -F raw \
  "$tmp/ovl.qcow2" 1M
timeout 60 nbdkit -U - qcow2 "$tmp/ovl.qcow2" \
  --run 'nbdsh -u "$uri" -c "h.pread(4096, 0)"' || fail "a plain cookie"
grep -q '^Cookie: session=+x-1' "$tmp/http.log" ||
  fail "the cookie did not go out as it is: $(cat "$tmp/http.log")"
