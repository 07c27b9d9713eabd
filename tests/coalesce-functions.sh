# SPDX-License-Identifier: BSD-3-Clause
# Helpers of the flush-coalesce tests with many clients
# (coalesce-clients.py) and the invariant checker (coalesce-check.py).
# Source after functions.sh.

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
