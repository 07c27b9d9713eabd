#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter's overlay over nbdkit's curl plugin, against the
# suite's HTTP server (range requests), QEMU the oracle: writes, then
# qcow2-overlay-on-read=true reads of the whole disk; a cache request
# fills just its clusters; the server stopped and its file removed,
# FILE alone (nbdkit qcow2) reads as what was served.  FILE passes
# qemu-img check; the served file is unchanged.
source "${srcdir:-.}/functions.sh"
set -e
requires_nbdkit_plugin curl
source "${srcdir:-.}/overlay-functions.sh"
here=$(cd "${srcdir:-.}" && pwd)
size=$((8 << 20))

mkdir "$tmp/www"
make_base "$tmp/www/base.raw" "$size"
sha256sum "$tmp/www/base.raw" > "$tmp/http.sum"
cp "$tmp/www/base.raw" "$tmp/http.model"
/usr/bin/python3 "$here/range-server.py" "$tmp/www" "$tmp/http.port" &
http=$!
trap 'kill $http 2>/dev/null || true; rm -rf "$tmp"' EXIT
for i in $(seq 50); do [ -s "$tmp/http.port" ] && break; sleep 0.1; done
url=http://127.0.0.1:$(cat "$tmp/http.port")/base.raw
ov=$tmp/http.qcow2
nbdkit -U - --filter=qcow2 curl "$url" qcow2-overlay="$ov" --run '
  /usr/bin/python3 '"$overlay_ops"' "$uri" '"$tmp/http.model"' 3 40' ||
  fail "curl: writes"
# A cache request fills just the clusters it touches.
nbdkit -U - --filter=qcow2 curl "$url" qcow2-overlay="$ov" \
  qcow2-overlay-on-read=true --run '
  nbdsh -u "$uri" -c "h.cache(100, (7 << 20) + 70000)"' ||
  fail "curl: cache request"
qemu-img map --output=json "json:{\"file\":{\"filename\":\"$ov\"},\"backing\":null}" |
  /usr/bin/python3 -c '
import json, sys
m = json.load(sys.stdin)
def present(o):
  return any(e["start"] <= o < e["start"] + e["length"] and e["present"] for e in m)
c = (7 << 20) + 65536
assert present(c), "the cluster of the cache request is not filled"
' || fail "curl: the cache request did not fill its cluster"
nbdkit -U - --filter=qcow2 curl "$url" qcow2-overlay="$ov" \
  qcow2-overlay-on-read=true --run 'nbdcopy "$uri" '"$tmp/http.out" ||
  fail "curl: on-read"
cmp "$tmp/http.out" "$tmp/http.model" || fail "curl: reads differ"
check_overlay "$ov" || fail "curl: qemu-img check"
sha256sum -c --quiet "$tmp/http.sum" || fail "curl: the served file changed"

# The server gone and its file removed: FILE alone holds the disk.
kill "$http"
wait "$http" 2>/dev/null || true
rm "$tmp/www/base.raw"
serves_alone "$ov" "$tmp/http.model" curl
