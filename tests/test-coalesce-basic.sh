#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# flush-coalesce, one request at a time, as the plugin sees it (through
# nbdkit's log filter below it):
#  - a flush with no write, zero or trim since the last successful
#    flush does not reach the plugin; one after a write, zero or trim
#    does, once;
#  - coalesce-fua=true turns FUA writes, zeroes and trims into the
#    request without FUA and a coalesced flush; by default FUA goes to
#    the plugin;
#  - flushes of one connection do not cover another's writes unless
#    the plugin advertises multi-conn;
#  - the counts at exit (-v) are right.
# Failed flushes and a plugin without flush: test-coalesce-failures.sh.
source "${srcdir:-.}/functions.sh"
set -e
requires nbdsh qemu-img

# plugin_flushes LOG: the flushes that reached the plugin.
plugin_flushes ()
{
  grep -c ' Flush id=' "$1" || true
}

seq_ops='
def flushes():
    return sum(" Flush id=" in l for l in open(log))
import os
log = os.environ["log"]
h.flush()
assert flushes() == 0, "a flush with nothing written reached the plugin"
h.pwrite(b"\x01" * 4096, 0)
h.flush()
assert flushes() == 1
h.flush()
h.flush()
assert flushes() == 1, "a flush after a flush reached the plugin"
h.pread(4096, 0)
h.flush()
assert flushes() == 1, "a flush after a read reached the plugin"
h.zero(4096, 8192)
h.flush()
assert flushes() == 2
h.trim(4096, 8192)
h.flush()
h.flush()
assert flushes() == 3
'
export seq_ops log=$tmp/plugin.log

img=$tmp/disk.qcow2
qemu-img create -q -f qcow2 "$img" 1M
for plugin in memory qcow2; do
  if [ $plugin = memory ]; then args=(memory 1M); else args=(qcow2 "file=$img"); fi
  timeout -k 10 60 nbdkit -v -U - --filter=flush-coalesce --filter=log \
    "${args[@]}" logfile="$log" \
    --run 'nbdsh -u "$uri" -c "$seq_ops"' 2> "$tmp/debug" || {
      grep flush-coalesce "$tmp/debug" | tail -20
      fail "$plugin: flushes one at a time"
    }
  grep -F 'flush-coalesce: 8 flushes and 0 FUA requests received; 5 returned at once, 0 shared a plugin flush; 3 plugin flushes issued, 0 failed' \
    "$tmp/debug" || {
      grep 'flush-coalesce: [0-9]' "$tmp/debug"
      fail "$plugin: the counts at exit"
    }
done
qemu-img check -q "$img" || fail "qemu-img check $img"

# FUA.
fua_ops='
assert h.can_fua()
h.pwrite(b"\x02" * 4096, 0, nbd.CMD_FLAG_FUA)
h.zero(4096, 4096, nbd.CMD_FLAG_FUA)
h.trim(4096, 8192, nbd.CMD_FLAG_FUA)
h.flush()
'
export fua_ops
for plugin in memory qcow2; do
  if [ $plugin = memory ]; then args=(memory 1M); else args=(qcow2 "file=$img"); fi
  timeout -k 10 60 nbdkit -U - --filter=flush-coalesce --filter=log \
    "${args[@]}" logfile="$log" coalesce-fua=true \
    --run 'nbdsh -u "$uri" -c "$fua_ops"' || fail "$plugin: coalesce-fua=true"
  # Each request reaches the plugin without FUA, followed by a flush;
  # the client's flush after them does not.
  grep -Eo '(Write|Zero|Trim|Flush) id=[0-9]+ .*fua=[01]|Flush id=[0-9]+ \.\.\.' "$log" |
    sed -E 's/ id=[0-9]+//; s/ offset=.*fua=/ fua=/' > "$tmp/seen"
  printf '%s\n' 'Write fua=0' 'Flush ...' 'Zero fua=0' 'Flush ...' \
    'Trim fua=0' 'Flush ...' | diff -u - "$tmp/seen" ||
    fail "$plugin: coalesce-fua=true: what the plugin saw"

  timeout -k 10 60 nbdkit -U - --filter=flush-coalesce --filter=log \
    "${args[@]}" logfile="$log" \
    --run 'nbdsh -u "$uri" -c "$fua_ops"' || fail "$plugin: FUA passed through"
  grep -c ' fua=1 ' "$log" | grep -qx 3 ||
    fail "$plugin: FUA did not reach the plugin"
  [ "$(plugin_flushes "$log")" -eq 1 ] ||
    fail "$plugin: FUA passed through: $(plugin_flushes "$log") plugin flushes"
done
qemu-img check -q "$img" || fail "qemu-img check $img"

# Connections share plugin flushes only under multi-conn: connection 2
# writes and flushes after connection 1 wrote; connection 1's flush then
# returns at once if and only if the plugin's flush covers connections.
two_conns='
import os, nbd
log = os.environ["log"]
h2 = nbd.NBD()
h2.connect_uri(os.environ["uri"])
h.pwrite(b"\x03" * 4096, 0)
h2.pwrite(b"\x04" * 4096, 4096)
h2.flush()
h.flush()
print(h.can_multi_conn(),
      [l.split()[2] for l in open(log) if " Flush id=" in l])
'
export two_conns
for mode in plugin disable; do
  timeout -k 10 60 nbdkit -U - --filter=flush-coalesce --filter=multi-conn \
    --filter=log memory 1M multi-conn-mode=$mode multi-conn-track-dirty=off \
    logfile="$log" \
    --run 'export uri; nbdsh -u "$uri" -c "$two_conns"' > "$tmp/out" ||
    fail "multi-conn-mode=$mode: two connections"
  cat "$tmp/out"
  if [ $mode = plugin ]; then
    want="True ['connection=2']"
  else
    want="False ['connection=2', 'connection=1']"
  fi
  [ "$(cat "$tmp/out")" = "$want" ] ||
    fail "multi-conn-mode=$mode: plugin flushes $(cat "$tmp/out"), expected $want"
done

expect_refused 'coalesce-fua=maybe: expected true or false' \
  --filter=flush-coalesce memory 1M coalesce-fua=maybe
