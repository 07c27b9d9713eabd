#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A backing file on a web server that answers 404: nbdkit refuses to
# start, the curl plugin's message saying 404, then ours naming the
# backing file.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img
requires_nbdkit_plugin curl
source "${srcdir:-.}/remote-functions.sh"

mkdir "$tmp/web"
http_server "$tmp/web"
qemu-img create -q -f qcow2 -u -b "http://127.0.0.1:$http_port/none.raw" \
  -F raw "$tmp/ovl.qcow2" 4M
expect_refused "cannot open backing file \"http://127.0.0.1:$http_port/none.raw\": nbdkit's curl plugin cannot serve it \\(its message is above\\)" \
  qcow2 "$tmp/ovl.qcow2"
grep -q "404" "$tmp/refused.err" ||
  fail "the curl plugin's message does not say 404: $(cat "$tmp/refused.err")"
