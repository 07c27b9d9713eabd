#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter's overlay over other plugins, QEMU the oracle:
#  - memory: writes against a model kept in FILE across restarts (the
#    plugin's disk is new and empty each time); NBD cache requests fill
#    FILE (zeros as zero clusters);
#  - curl, against the suite's HTTP server (range requests): writes,
#    then qcow2-overlay-on-read=true reads of the whole disk; the
#    server stopped and its file removed, FILE alone (nbdkit qcow2)
#    reads as what was served; with qcow2-overlay-backing=URL, FILE
#    alone as QEMU opens it (its curl driver) equals what was served;
#    a cache request fills just its clusters;
#  - xz (nbdkit's xz filter over a file): writes, a restart, on-read,
#    then FILE alone after the archive is removed.
# Every FILE passes qemu-img check; the plugins' files are unchanged.
source "${srcdir:-.}/functions.sh"
set -e
source "${srcdir:-.}/overlay-functions.sh"
here=$(cd "${srcdir:-.}" && pwd)
size=$((8 << 20))

# --- memory
ov=$tmp/mem.qcow2
truncate -s "$size" "$tmp/mem.model"
for seed in 1 2; do
  nbdkit -U - --filter=qcow2 memory "$size" qcow2-overlay="$ov" --run '
    /usr/bin/python3 '"$overlay_ops"' "$uri" '"$tmp/mem.model"' '"$seed"' 40' ||
    fail "memory: writes (round $seed)"
done
check_overlay "$ov" || fail "memory: qemu-img check"
nbdkit -U - --filter=qcow2 memory "$size" qcow2-overlay="$ov" \
  qcow2-overlay-on-read=true --run '
  nbdsh -u "$uri" -c "
assert h.can_cache()
h.cache(h.get_size(), 0)
" && nbdcopy "$uri" '"$tmp/mem.out"'' || fail "memory: cache request"
cmp "$tmp/mem.out" "$tmp/mem.model" || fail "memory: read back after restarts"
check_overlay "$ov" || fail "memory: qemu-img check after the cache request"
# Filled whole, FILE holds every cluster (zeros as zero clusters):
# detached from the plugin as the man page says, QEMU reads it alone.
qemu-img rebase -u -b "" "$ov"
qemu-img map --output=json -f qcow2 "$ov" | grep -q '"present": false' &&
  fail "memory: the cache request left clusters unfilled"
qemu-img compare -f qcow2 -F raw "$ov" "$tmp/mem.model" ||
  fail "memory: FILE alone differs"

# --- curl
if nbdkit curl --version > /dev/null 2>&1; then
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

  # A recorded URL: QEMU opens FILE alone over HTTP.
  ov2=$tmp/http-named.qcow2
  nbdkit -U - --filter=qcow2 curl "$url" qcow2-overlay="$ov2" \
    qcow2-overlay-backing="$url" --run '
    nbdsh -u "$uri" -c "h.pwrite(b\"\\xa5\" * 100000, 5 << 20)" &&
    nbdcopy "$uri" '"$tmp/named.out"'' || fail "curl: a recorded URL"
  if qemu-img info "$url" > /dev/null 2>&1; then
    qemu-img compare -f qcow2 -F raw "$ov2" "$tmp/named.out" ||
      fail "curl: FILE alone over HTTP differs from what was served"
  else
    echo "$0: QEMU's curl driver is missing: FILE alone over HTTP not compared"
  fi

  # The server gone and its file removed: FILE alone holds the disk.
  kill "$http"
  wait "$http" 2>/dev/null || true
  rm "$tmp/www/base.raw"
  qemu-img rebase -u -b "" "$ov"
  nbdkit -U - qcow2 "$ov" --run 'nbdcopy "$uri" '"$tmp/alone.out" ||
    fail "curl: nbdkit qcow2 FILE alone"
  cmp "$tmp/alone.out" "$tmp/http.model" ||
    fail "curl: FILE alone differs from what was served"
else
  echo "$0: nbdkit's curl plugin is missing: curl not tested"
fi

# --- xz
if nbdkit --filter=xz null --version > /dev/null 2>&1 && command -v xz > /dev/null; then
  make_base "$tmp/xz.raw" "$size"
  cp "$tmp/xz.raw" "$tmp/xz.model"
  xz -q --block-size=1MiB "$tmp/xz.raw"
  sha256sum "$tmp/xz.raw.xz" > "$tmp/xz.sum"
  ov=$tmp/xz.qcow2
  for seed in 4 5; do
    nbdkit -U - --filter=qcow2 --filter=xz file "$tmp/xz.raw.xz" \
      qcow2-overlay="$ov" --run '
      /usr/bin/python3 '"$overlay_ops"' "$uri" '"$tmp/xz.model"' '"$seed"' 30' ||
      fail "xz: writes (round $seed)"
  done
  nbdkit -U - --filter=qcow2 --filter=xz file "$tmp/xz.raw.xz" \
    qcow2-overlay="$ov" qcow2-overlay-on-read=true --run '
    nbdcopy "$uri" '"$tmp/xz.out"'' || fail "xz: on-read"
  cmp "$tmp/xz.out" "$tmp/xz.model" || fail "xz: reads differ"
  check_overlay "$ov" || fail "xz: qemu-img check"
  sha256sum -c --quiet "$tmp/xz.sum" || fail "xz: the archive changed"
  rm "$tmp/xz.raw.xz"
  qemu-img rebase -u -b "" "$ov"
  nbdkit -U - qcow2 "$ov" --run 'nbdcopy "$uri" '"$tmp/xz-alone.out" ||
    fail "xz: nbdkit qcow2 FILE alone"
  cmp "$tmp/xz-alone.out" "$tmp/xz.model" ||
    fail "xz: FILE alone differs from what was served"
else
  echo "$0: nbdkit's xz filter or xz is missing: xz not tested"
fi
