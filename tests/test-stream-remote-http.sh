#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# stream=true from a raw base on a web server (range-server.py, read
# through nbdkit's curl plugin): the job ends with the detach, the curl
# helper goes with it, and the top passes qemu-img check, has no backing
# file and reads as the chain did.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo
requires_nbdkit_plugin curl
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

base=$tmp/base.raw
stream_raw_base "$base"
mkdir -p "$tmp/web"
cp "$base" "$tmp/web/base.raw"
http_server "$tmp/web"
top=$tmp/http.qcow2
qemu-img create -q -f qcow2 -u -b "http://127.0.0.1:$http_port/base.raw" \
  -F raw "$top" 32M
stream_serve http qcow2 "$top" stream=true
wait_streamed http > /dev/null
# The base's helper process (nbdkit's curl plugin, started by libnbd)
# ended with the detach.
for i in $(seq 50); do
  pgrep -f "curl.*127.0.0.1:$http_port" > /dev/null || break
  sleep 0.1
done
! pgrep -f "curl.*127.0.0.1:$http_port" > /dev/null ||
  fail "the curl helper still runs after the detach"
stop_server http
qemu-img check -q "$top" || fail "qemu-img check (HTTP base)"
qemu-img info "$top" | grep -q "backing file" && fail "still a backing file"
qemu-img compare -q -f qcow2 -F raw "$top" "$base" ||
  fail "the top does not read as the chain did (HTTP base)"
echo OK
