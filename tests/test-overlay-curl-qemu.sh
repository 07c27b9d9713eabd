#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter's overlay over nbdkit's curl plugin with the URL
# recorded as its backing file (qcow2-overlay-backing=URL): QEMU opens
# FILE alone, through its curl driver, and reads what was served.
source "${srcdir:-.}/functions.sh"
set -e
requires_nbdkit_plugin curl
requires_qemu_driver http
source "${srcdir:-.}/overlay-functions.sh"
source "${srcdir:-.}/remote-functions.sh"
size=$((8 << 20))

mkdir "$tmp/www"
make_base "$tmp/www/base.raw" "$size"
http_server "$tmp/www"
url=http://127.0.0.1:$http_port/base.raw
ov2=$tmp/http-named.qcow2
nbdkit -U - --filter=qcow2 curl "$url" qcow2-overlay="$ov2" \
  qcow2-overlay-backing="$url" --run '
  nbdsh -u "$uri" -c "h.pwrite(b\"\\xa5\" * 100000, 5 << 20)" &&
  nbdcopy "$uri" '"$tmp/named.out"'' || fail "curl: a recorded URL"
qemu-img compare -f qcow2 -F raw "$ov2" "$tmp/named.out" ||
  fail "curl: FILE alone over HTTP differs from what was served"
