#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# flush-coalesce under 8 connections that each loop over writes, zeroes
# or trims and a flush (coalesce-clients.py): coalesce-check.py proves
# from the plugin's side (nbdkit's log filter below the coalescer) that
# every client flush and FUA write that succeeded was covered by a
# plugin flush that started after every write it had to cover and ended
# before the client's next request.  With the memory plugin, the qcow2
# plugin, qcow2 whose flushes take 20 ms, and a plugin whose flush takes
# 0.1 s like a disk's; in the last two the plugin must see far fewer
# flushes than the clients sent.
#
# The checker must also fail: on a pipeline that drops flushes (nbdkit's
# fua filter, fuamode=discard), and on a true log doctored so that the
# last plugin flushes seem to start before the last write ended.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img
requires_python_nbd

clients=$srcdir/coalesce-clients.py
checker=$srcdir/coalesce-check.py
export clients client_log=$tmp/clients.log
log=$tmp/plugin.log

# run NAME CONNS ITERATIONS CLIENT-ARGS NBDKIT-ARGS...: the clients
# against nbdkit with the log filter last; the checker's summary in
# $tmp/NAME.sum, the counts at exit in $tmp/NAME.counts.
run ()
{
  local name="$1" conns="$2" iters="$3" cargs="$4"; shift 4
  timeout -k 10 120 nbdkit -v -U - "$@" logfile="$log" \
    --run '/usr/bin/python3 "$clients" "$uri" "$client_log" '"$conns $iters $cargs" \
    2> "$tmp/debug" || {
      grep -v 'debug:' "$tmp/debug" | tail -20
      fail "$name: the clients failed"
    }
  { grep -o 'flush-coalesce: [0-9].*' "$tmp/debug" || true; } > "$tmp/$name.counts"
  /usr/bin/python3 "$checker" "$log" "$client_log" > "$tmp/$name.sum" || {
    cat "$tmp/$name.sum"
    fail "$name: a client flush was not covered by a plugin flush"
  }
  echo "$name: $(cat "$tmp/$name.sum") $(cat "$tmp/$name.counts")"
}

# summary NAME FIELD: a number from the checker's summary.
summary ()
{
  grep -o "\b$2=[0-9]*" "$tmp/$1.sum" | cut -d= -f2
}

# check_counts NAME: the counts at exit agree with the log.
check_counts ()
{
  local received fua issued
  received=$(summary "$1" flushes) fua=$(summary "$1" fua)
  issued=$(summary "$1" plugin_flushes)
  [ "$(summary "$1" failed)" -eq 0 ] || fail "$1: client flushes failed"
  grep -Eq "^flush-coalesce: $received flushes and $fua FUA requests received; ([0-9]+) returned at once, ([0-9]+) shared a plugin flush; $issued plugin flushes issued, 0 failed$" \
    "$tmp/$1.counts" || fail "$1: the counts at exit disagree with the logs"
  # Every coalesced flush returned at once, shared one or issued one.
  /usr/bin/python3 -c '
import re, sys
n = list(map(int, re.findall(r"\d+", open(sys.argv[1]).read())))
received, fua, at_once, shared, issued = n[:5]
assert received + fua == at_once + shared + issued, n
' "$tmp/$1.counts" || fail "$1: the counts at exit do not add up"
}

# Memory plugin and qcow2 plugin, FUA writes turned into flushes.
run memory 8 40 --fua --filter=flush-coalesce --filter=log memory 16M \
  coalesce-fua=true
check_counts memory

img=$tmp/disk.qcow2
qemu-img create -q -f qcow2 "$img" 16M
run qcow2 8 40 --fua --filter=flush-coalesce --filter=log qcow2 "file=$img" \
  coalesce-fua=true
check_counts qcow2
qemu-img check -q "$img" || fail "qemu-img check $img"

# qcow2 on a disk whose flush takes 20 ms (the latency filter below the
# log): the eight clients share most plugin flushes.
qemu-img create -q -f qcow2 "$img" 16M
run qcow2-slow 8 10 "" --filter=flush-coalesce --filter=log \
  --filter=latency qcow2 "file=$img" latency-flush=20ms
check_counts qcow2-slow
received=$(summary qcow2-slow flushes) issued=$(summary qcow2-slow plugin_flushes)
[ $((issued * 2)) -lt "$received" ] ||
  fail "qcow2, slow flush: $issued plugin flushes for $received client flushes"
qemu-img check -q "$img" || fail "qemu-img check $img"

# A flush that takes 0.1 s, as a disk's may: eight clients share most.
if nbdkit eval --dump-plugin >/dev/null 2>&1; then
  export disk=$tmp/eval.img
  truncate -s 16M "$disk"
  # The sanitizer runtime that ./nbdkit may preload is for nbdkit, not
  # for the commands of the scripts (dd aborts under it).
  clean='unset LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS; '
  run slow 8 10 "" --filter=flush-coalesce --filter=log \
    eval thread_model='echo parallel' can_multi_conn='exit 0' \
    get_size='echo 16M' trim='true' flush="$clean"'sleep 0.1' \
    pread="$clean"'dd if="$disk" skip=$4 count=$3 iflag=count_bytes,skip_bytes status=none' \
    pwrite="$clean"'dd of="$disk" seek=$4 conv=notrunc oflag=seek_bytes status=none'
  check_counts slow
  received=$(summary slow flushes) issued=$(summary slow plugin_flushes)
  [ $((issued * 2)) -lt "$received" ] ||
    fail "slow flush: $issued plugin flushes for $received client flushes"
else
  echo "$0: the eval plugin is missing: slow flushes not tested"
fi

# The checker fails where flushes do not reach the plugin.
timeout -k 10 120 nbdkit -U - --filter=fua --filter=log memory 16M \
  fuamode=discard logfile="$log" \
  --run '/usr/bin/python3 "$clients" "$uri" "$client_log" 8 10' ||
  fail "fuamode=discard: the clients failed"
if /usr/bin/python3 "$checker" "$log" "$client_log" > "$tmp/discard.sum"; then
  cat "$tmp/discard.sum"
  fail "the checker passed a pipeline that drops every flush"
fi
head -n3 "$tmp/discard.sum"

# The checker fails on the memory run's log doctored so that the plugin
# flushes after the last write's return seem to start just before it.
run memory2 8 20 "" --filter=flush-coalesce --filter=log memory 16M
/usr/bin/python3 - "$log" "$tmp/doctored.log" <<'EOF'
import sys
lines = open(sys.argv[1]).read().splitlines(keepends=True)
flushes = [i for i, l in enumerate(lines) if " Flush id=" in l]
last = max(i for i, l in enumerate(lines[:flushes[-1]])
           if " ...Write id=" in l or " ...Zero id=" in l or " ...Trim id=" in l)
moved = [lines[i] for i in flushes if i > last]
rest = [l for i, l in enumerate(lines) if not (i in flushes and i > last)]
out = rest[:last] + moved + rest[last:]
open(sys.argv[2], "w").writelines(out)
print("moved %d flush starts before line %d" % (len(moved), last + 1))
EOF
if /usr/bin/python3 "$checker" "$tmp/doctored.log" "$client_log" > "$tmp/doctored.sum"; then
  cat "$tmp/doctored.sum"
  fail "the checker passed a log where a flush started before a write it covered ended"
fi
head -n3 "$tmp/doctored.sum"
