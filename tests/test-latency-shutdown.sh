#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A request sleeping in the latency filter does not hold nbdkit up.
# Over memory and qcow2, with 30 s delays on a read and a write in
# flight:
#  - the client disconnects (NBD_CMD_DISC): the requests fail with
#    ESHUTDOWN at once, and nbdkit (with the exitlast filter) exits
#    within 2 s;
#  - the client drops the connection without a word: the requests end
#    within 2 s (the log filter above sees them return), and so does
#    nbdkit;
#  - nbdkit gets SIGTERM: the requests fail with ESHUTDOWN at once,
#    and nbdkit exits within 2 s of the client then leaving (nbdkit
#    itself waits for connected clients to leave, filter or not).
# The qcow2 image, whose write never happened, stays clean.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img
requires_python_nbd

img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 1M
qio "$img" 'write -P 7 0 64k'
sock=$tmp/sock

# The client: sends a read and a write and makes sure they are out,
# then: "disc", disconnects; "drop", closes the socket; PID, sends it
# SIGTERM.  The requests must fail with ESHUTDOWN within 2 s (for
# "drop" it cannot know).
cat > "$tmp/client.py" <<'PY'
import errno, nbd, os, signal, sys, time
h = nbd.NBD()
h.connect_unix(sys.argv[1])
cookies = [h.aio_pread(nbd.Buffer(512), 0),
           h.aio_pwrite(b"\x09" * 512, 0)]
while h.aio_get_direction() & nbd.AIO_DIRECTION_WRITE:
    h.poll(1)
time.sleep(0.2)             # for nbdkit to take them
how = sys.argv[2]
if how == "drop":
    sys.exit(0)
t = time.monotonic()
if how == "disc":
    h.shutdown()
else:
    os.kill(int(how), signal.SIGTERM)
    while h.aio_in_flight() > 0 and time.monotonic() - t < 10:
        h.poll(1000)
took = time.monotonic() - t
assert h.aio_in_flight() == 0, "no replies"
for c in cookies:
    try:
        h.aio_command_completed(c)
        raise AssertionError("a sleeping request succeeded")
    except nbd.Error as e:
        assert e.errnum == errno.ESHUTDOWN, e
print("%s: replies after %.3f s" % ("SIGTERM" if how != "disc" else how, took))
assert took < 2, "the replies took %.3f s" % took
if how != "disc":
    h.shutdown()
PY

# start TARGET...: nbdkit in the background on $sock, its pid in $pid
# (killed at exit if need be), the log filter's output in $tmp/log.
pid=
trap 'if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null || :; fi; rm -rf "$tmp"' EXIT
start ()
{
  rm -f "$sock" "$tmp/log"
  nbdkit -f -U "$sock" --filter=exitlast --filter=log \
    --filter=latency "$@" latency-read=30s latency-write=30s \
    logfile="$tmp/log" &
  pid=$!
  for i in $(seq 100); do [ -S "$sock" ] && return; sleep 0.1; done
  fail "nbdkit $* did not start"
}

# gone_within SECONDS WHAT: nbdkit ($pid) exits within SECONDS.
gone_within ()
{
  local i
  for i in $(seq $(($1 * 20))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    fail "$2: nbdkit still running after $1 s"
  fi
  wait "$pid" || true
}

for target in "memory 1M" "qcow2 $img"; do
  start $target
  timeout 20 /usr/bin/python3 "$tmp/client.py" "$sock" disc ||
    fail "$target: disconnect"
  gone_within 2 "$target, client disconnected"

  start $target
  timeout 20 /usr/bin/python3 "$tmp/client.py" "$sock" drop ||
    fail "$target: drop"
  for i in $(seq 40); do
    [ "$(grep -Ec '\.\.\.(Read|Write) id=[0-9]+ return=-1 error=ESHUTDOWN' \
         "$tmp/log")" -eq 2 ] && break
    sleep 0.05
  done
  [ "$i" -lt 40 ] || { cat "$tmp/log"; fail "$target: requests still sleeping"; }
  gone_within 2 "$target, client gone"

  start $target
  timeout 20 /usr/bin/python3 "$tmp/client.py" "$sock" "$pid" ||
    fail "$target: SIGTERM"
  gone_within 2 "$target, SIGTERM then client gone"
done

qemu-img check -q "$img" || fail "qemu-img check"
qio "$img" 'read -P 7 0 64k'
