#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Persistent dirty bitmaps kept up to date, read back by QEMU: random
# writes, zeroes and trims through the plugin, then qemu-nbd -B exports
# each bitmap and its dirty granules must be exactly those it had plus
# those the plugin's requests touched (enabled bitmaps), or unchanged
# (disabled ones).  Granularities 512 B to 2 MiB, several bitmaps,
# internal snapshots, an overlay; qemu-img info shows no in-use bitmap
# and no "lacking bitmap support" warning, qemu-img check finds nothing,
# and qemu-img bitmap --merge/--clear still work.  A SIGKILL leaves the
# enabled bitmaps in use (inconsistent), never stale.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io qemu-nbd nbdsh
requires_python_nbd
bc="/usr/bin/python3 ${srcdir:-.}/bitmapcheck.py"

# qemu_serve IMG CMD BITMAP...: run CMD with $uri naming IMG exported
# read-only by qemu-nbd with the given bitmaps.
qemu_serve ()
{
  local img="$1" cmd="$2"; shift 2
  local sock="$tmp/qemu-nbd.sock" pid b args=() r=0
  for b in "$@"; do args+=(-B "$b"); done
  rm -f "$sock"
  qemu-nbd -r -t -f qcow2 "${args[@]}" -k "$sock" "$img" &
  pid=$!
  wait_socket "$sock" "$pid" ||
    { wait "$pid" || :; fail "qemu-nbd cannot export $*"; }
  uri="nbd+unix:///?socket=$sock" bash -c "$cmd" || r=$?
  kill "$pid"
  wait "$pid" || :
  return $r
}

# dirty_all IMG TAG BITMAP...: $tmp/TAG-BITMAP.json for each bitmap.
dirty_all ()
{
  local img="$1" tag="$2"; shift 2
  local cmd="" b
  for b in "$@"; do
    cmd+="$bc dirty \"\$uri\" $b > $tmp/$tag-$b.json && "
  done
  qemu_serve "$img" "${cmd}true" "$@" ||
    fail "$img: qemu-nbd cannot read the bitmaps ($tag)"
}

# clean_info IMG: no bitmap in use, no warning; qemu-img check clean.
clean_info ()
{
  local img="$1"
  qemu-img info "$img" > "$tmp/info" 2>&1
  ! grep -Eq "in-use|lacking bitmap support" "$tmp/info" ||
    fail "$img: bitmaps left in use or stale: $(cat "$tmp/info")"
  qemu-img check -q "$img" || fail "$img: qemu-img check exit $?"
}

# bitmap_flags IMG NAME: the bitmap's flags, as qemu-img info lists them.
bitmap_flags ()
{
  qemu-img info --output=json "$1" | /usr/bin/python3 -c '
import json, sys
for b in json.load(sys.stdin)["format-specific"]["data"].get("bitmaps", []):
    if b["name"] == sys.argv[1]:
        print(" ".join(b["flags"]))
' "$2"
}

# run_case IMG SEED ENABLED DISABLED [PLUGIN-ARGS]: the workload through
# the plugin, then every bitmap checked (ENABLED and DISABLED are
# space-separated "name:granularity" lists).
run_case ()
{
  local img="$1" seed="$2" enabled="$3" disabled="$4"; shift 4
  local names=() nb
  for nb in $enabled $disabled; do names+=("${nb%%:*}"); done
  dirty_all "$img" before "${names[@]}"
  nbdkit -U - qcow2 "file=$img" "$@" \
    --run "$bc workload \"\$uri\" $seed 300 > $tmp/ops.json" ||
    fail "$img: workload"
  clean_info "$img"
  dirty_all "$img" after "${names[@]}"
  for nb in $enabled; do
    $bc expect "$tmp/before-${nb%%:*}.json" "$tmp/ops.json" "${nb##*:}" \
      "$tmp/after-${nb%%:*}.json" || fail "$img: bitmap ${nb%%:*}"
  done
  for nb in $disabled; do
    $bc expect "$tmp/before-${nb%%:*}.json" "$tmp/ops.json" "${nb##*:}" \
      "$tmp/after-${nb%%:*}.json" --unchanged ||
      fail "$img: disabled bitmap ${nb%%:*} changed"
  done
}

M=1048576
seed=1
for cs in 512 4k 64k 2M; do
  img=$tmp/bm-$cs.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=$cs "$img" 24M
  qemu-img bitmap --add -g 512 "$img" g512
  qemu-img bitmap --add -g 65536 "$img" g64k
  qio "$img" 'write -P 0x11 1M 3M' 'write -P 0x12 20M 5000'
  qemu-img bitmap --add -g 2M "$img" g2m
  qemu-img bitmap --add -g 65536 --disable "$img" off
  qemu-img bitmap --merge g512 "$img" off
  run_case "$img" $((seed++)) "g512:512 g64k:65536 g2m:2097152" "off:65536" \
    discard=unmap
  # A second session goes on from what the first wrote back.
  run_case "$img" $((seed++)) "g512:512 g64k:65536 g2m:2097152" "off:65536" \
    discard=ignore
  # qemu's own bitmap tools on the result.
  qemu-img bitmap --merge g512 "$img" g2m
  qemu-img bitmap --clear "$img" g64k
  qemu-img bitmap --disable "$img" g512
  clean_info "$img"
  run_case "$img" $((seed++)) "g64k:65536 g2m:2097152" "off:65536 g512:512"
done

# An image with internal snapshots.
img=$tmp/bm-snap.qcow2
qemu-img create -q -f qcow2 "$img" 16M
qemu-img bitmap --add -g 4096 "$img" b
qio "$img" 'write -P 0x21 0 4M'
qemu-img snapshot -c s1 "$img"
qio "$img" 'write -P 0x22 2M 4M'
qemu-img snapshot -c s2 "$img"
run_case "$img" $((seed++)) "b:4096" ""
qemu-img snapshot -l "$img" | grep -q s2 || fail "snapshots lost"

# An overlay with a bitmap, over a base with one (the base is not
# written, so its bitmap does not change).
base=$tmp/bm-base.qcow2
img=$tmp/bm-top.qcow2
qemu-img create -q -f qcow2 "$base" 16M
qemu-img bitmap --add "$base" basebm
qio "$base" 'write -P 0x31 0 16M'
qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$img"
qemu-img bitmap --add -g 8192 "$img" top
run_case "$img" $((seed++)) "top:8192" ""
dirty_all "$base" base basebm
[ "$(cat "$tmp/base-basebm.json")" = "[[0, $((16 * M))]]" ] ||
  fail "the base's bitmap changed: $(cat "$tmp/base-basebm.json")"
clean_info "$base"

# No change, no mark: a session that only reads leaves the bitmaps
# untouched (not in use, the file not rewritten).
img=$tmp/bm-64k.qcow2
sum=$(md5sum < "$img")
nbdkit -U - qcow2 "file=$img" --run 'nbdsh -u "$uri" -c "h.pread(65536, 0)"'
[ "$(md5sum < "$img")" = "$sum" ] || fail "a read-only session changed $img"

# SIGKILL after a flushed write: the enabled bitmaps are in use (QEMU
# will not export them), the disabled one is not; qemu-img check finds
# no corruption; qemu-img bitmap --remove drops the inconsistent ones.
img=$tmp/bm-4k.qcow2
nbdkit -f -U "$tmp/kill.sock" qcow2 "file=$img" &
pid=$!
wait_socket "$tmp/kill.sock" $pid || fail "nbdkit did not start"
nbdsh -u "nbd+unix:///?socket=$tmp/kill.sock" \
  -c 'h.pwrite(b"K" * 4096, 8 * 1048576); h.flush()'
kill -9 $pid
wait $pid || :
for b in g64k g2m; do
  [ "$(bitmap_flags "$img" $b)" = "in-use auto" ] ||
    fail "bitmap $b not in use after a crash: $(bitmap_flags "$img" $b)"
done
[ "$(bitmap_flags "$img" off)" = "" ] ||
  fail "the disabled bitmap was marked: $(bitmap_flags "$img" off)"
qemu-nbd -r -f qcow2 -B g64k -k "$tmp/k2.sock" "$img" 2>"$tmp/err" &&
  fail "qemu-nbd exported an in-use bitmap"
r=0; qemu-img check -q "$img" || r=$?
[ $r -eq 0 ] || [ $r -eq 3 ] || fail "qemu-img check after SIGKILL: exit $r"
# Reopened and written again, the in-use bitmaps stay in use, untouched,
# and a notice says each is inconsistent, its hint that the next backup
# must be full.
nbdkit -U - qcow2 "file=$img" \
  --run 'nbdsh -u "$uri" -c "h.pwrite(b\"L\" * 512, 0); h.flush()"' \
  2> "$tmp/notice"
for b in g64k g2m; do
  grep -A1 "notice: .*bitmap \"$b\" is in use (qemu-img info: in-use): inconsistent" \
    "$tmp/notice" | grep -q "^nbdkit: qcow2: notice: $img: hint: .*the next backup must be a full one" ||
    fail "no notice of in-use bitmap $b: $(cat "$tmp/notice")"
done
! grep -q 'bitmap "off"' "$tmp/notice" || fail "a notice of the disabled bitmap"
[ "$(bitmap_flags "$img" g2m)" = "in-use auto" ] ||
  fail "an in-use bitmap was cleared: $(bitmap_flags "$img" g2m)"
qemu-img bitmap --remove "$img" g64k
qemu-img bitmap --remove "$img" g2m
qemu-img check -q -r leaks "$img" >/dev/null 2>&1 || :
clean_info "$img"
echo "$0: ok"
