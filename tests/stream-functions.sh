# SPDX-License-Identifier: BSD-3-Clause
# Helpers of the streaming tests (stream=true).  Source after
# functions.sh and remote-functions.sh.

# stream_serve NAME NBDKIT-ARGS...: nbdkit serving on $tmp/NAME.sock,
# in the foreground of a background job (a server forked into the
# background sends its notices to syslog), its messages (the stream's
# notices) appended to $tmp/NAME.log, its pid in $tmp/NAME.pid.
stream_serve ()
{
  local name="$1"; shift
  rm -f "$tmp/$name.sock" "$tmp/$name.pid"
  nbdkit -f -U "$tmp/$name.sock" -P "$tmp/$name.pid" "$@" 2>> "$tmp/$name.log" &
  local pid=$!
  servers+=("$pid")
  disown "$pid"                 # killed by the test: no message
  wait_socket "$tmp/$name.sock" "$pid" ||
    { cat "$tmp/$name.log" >&2; fail "nbdkit $* did not start"; }
}

# stream_description NAME: the export description of NAME's export.
stream_description ()
{
  nbdinfo "nbd+unix:///?socket=$tmp/$1.sock" | sed -n 's/^\tdescription: //p'
}

# wait_streamed NAME [SECS]: wait (60 s by default) until the job of
# NAME has ended, as its export description says; prints it.
wait_streamed ()
{
  local i d
  for i in $(seq $((${2:-60} * 5))); do
    d=$(stream_description "$1") || fail "nbdinfo on $1 failed"
    case "$d" in streamed*|*stopped*) echo "$d"; return 0 ;; esac
    sleep 0.2
  done
  cat "$tmp/$1.log" >&2
  fail "the stream of $1 did not end: $d"
}

# check_streamed IMG ORIG BACKING [FORMAT]: IMG passes qemu-img check,
# reads as ORIG (the chain as it was, a copy; of FORMAT, qcow2 unless
# given) and has BACKING as its backing file ("" for none).
check_streamed ()
{
  qemu-img check -q "$1" || fail "qemu-img check $1 after the stream"
  local b
  b=$(qemu-img info --output=json "$1" |
      /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin).get("backing-filename", ""))')
  [ "$b" = "$3" ] || fail "$1's backing file is \"$b\", not \"$3\""
  qemu-img compare -q -f qcow2 -F "${4:-qcow2}" "$1" "$2" ||
    fail "$1 does not read as the chain did"
}

# check_killed IMG: after a SIGKILL, qemu-img check finds no corruption
# (exit 0, or 3: clusters of the allocation reserve leaked, as
# test-crash-kill.sh allows).
check_killed ()
{
  local r=0
  qemu-img check "$1" > "$tmp/check.out" 2>&1 || r=$?
  case "$r" in
    0|3) ;;
    *) cat "$tmp/check.out" >&2; fail "qemu-img check $1 after SIGKILL: $r" ;;
  esac
}

# stream_raw_base FILE: a raw base of 32 MiB: 0x11 in [0, 12M), 0x12 in
# [20M, 24M), holes elsewhere.
stream_raw_base ()
{
  qemu-img create -q -f raw "$1" 32M
  QIO_FMT=raw qio "$1" 'write -P 0x11 0 12M' 'write -P 0x12 20M 4M'
}
