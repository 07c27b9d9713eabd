#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What an image from someone else can make the server do.  A cookie in
# a json: name that nbdkit's curl plugin would read as a file ("+FILE")
# or a descriptor ("-FD", "-") is refused, through the plugin and the
# filter, and the web server (logging each request's headers) never
# sees the file's content; a plain cookie goes out as it is.  An https
# base answering with a redirect to http:// is not followed in clear
# when backing-protocols= allows only https (the clear server gets no
# request), and is with http allowed too.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh openssl
requires_nbdkit_plugin curl
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

# An https base redirecting to http://: backing-protocols=https keeps
# nbdkit's curl plugin (its protocols=) off the clear server.
QIO_FMT=raw qio "$tmp/web/base.raw" 'write -P 0x44 0 64k'
RANGE_SERVER_LOG=$tmp/clear.log http_server "$tmp/web"
clear_port=$http_port
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 \
  -keyout "$tmp/tls.pem" -out "$tmp/cert.pem" 2>/dev/null
cat "$tmp/cert.pem" >> "$tmp/tls.pem"
RANGE_SERVER_REDIRECT=http://127.0.0.1:$clear_port \
  RANGE_SERVER_LOG=$tmp/tls.log http_server "$tmp/web" "$tmp/tls.pem"
qemu-img create -q -f qcow2 -u -F raw \
  -b 'json:{"driver":"raw","file":{"driver":"https","url":"https://127.0.0.1:'"$http_port"'/base.raw","sslverify":false}}' \
  "$tmp/redir.qcow2" 1M
rm -f "$tmp/clear.log"
expect_refused "cannot open backing file .*nbdkit's curl plugin cannot serve it \\(its message is above\\); it may use only https, redirects included \\(backing-protocols=\\)" \
  qcow2 "$tmp/redir.qcow2" backing-protocols=https
grep -q '^HEAD /base.raw' "$tmp/tls.log" ||
  fail "the https server was not asked: $(cat "$tmp/tls.log" 2>&1)"
[ ! -e "$tmp/clear.log" ] ||
  fail "a redirect was followed in clear: $(cat "$tmp/clear.log")"
# Schemes compared without case, in the key and in names.
timeout 60 nbdkit -U - qcow2 "$tmp/redir.qcow2" backing-protocols=HTTPS,Http \
  --run 'nbdsh -u "$uri" -c "assert h.pread(65536, 0) == b\"\\x44\" * 65536"' ||
  fail "the redirect, allowed, did not read the base"
grep -q '^GET /base.raw' "$tmp/clear.log" ||
  fail "the allowed redirect did not reach the clear server"
qemu-img create -q -f qcow2 -u -F raw -b "HTTP://127.0.0.1:$clear_port/base.raw" \
  "$tmp/upper.qcow2" 1M
timeout 60 nbdkit -U - qcow2 "$tmp/upper.qcow2" backing-protocols=HTTP \
  --run 'nbdsh -u "$uri" -c "assert h.pread(65536, 0) == b\"\\x44\" * 65536"' ||
  fail "HTTP:// with backing-protocols=HTTP did not read the base"
