#!/usr/bin/env bash
# A request sleeping in the latency filter does not hold nbdkit up:
# over memory and qcow2, with 30 s delays,
#  - nbdkit (with the exitlast filter) exits within 2 s of its only
#    client disconnecting while its requests sleep;
#  - on SIGTERM the sleeping requests fail with ESHUTDOWN within 2 s,
#    and nbdkit exits within 2 s of the client then leaving (nbdkit
#    itself waits for connected clients to leave, filter or not).
# The qcow2 image, whose write never happened, stays clean.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img

img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 1M
qio "$img" 'write -P 7 0 64k'
sock=$tmp/sock

# The client: sends a read and a write, makes sure they are out, then
# says "sent".  With a pid, it sends SIGTERM to it and waits for the
# replies: errors (ESHUTDOWN), within 2 s.  Then it disconnects.
cat > "$tmp/client.py" <<'PY'
import errno, nbd, os, signal, sys, time
h = nbd.NBD()
h.connect_unix(sys.argv[1])
cookies = [h.aio_pread(nbd.Buffer(512), 0),
           h.aio_pwrite(b"\x09" * 512, 0)]
while h.aio_get_direction() & nbd.AIO_DIRECTION_WRITE:
    h.poll(1)
time.sleep(0.2)             # for nbdkit to take them
print("sent", flush=True)
if len(sys.argv) > 2:
    t = time.monotonic()
    os.kill(int(sys.argv[2]), signal.SIGTERM)
    while h.aio_in_flight() > 0 and time.monotonic() - t < 10:
        h.poll(1000)
    took = time.monotonic() - t
    assert h.aio_in_flight() == 0, "no replies after SIGTERM"
    for c in cookies:
        try:
            h.aio_command_completed(c)
            raise AssertionError("a sleeping request succeeded")
        except nbd.Error as e:
            assert e.errnum == errno.ESHUTDOWN, e
    print("replies %.3f s after SIGTERM" % took, flush=True)
    assert took < 2, "the replies took %.3f s" % took
PY

# start TARGET...: nbdkit in the background on $sock, its pid in $pid.
start ()
{
  rm -f "$sock"
  timeout -k 5 60 nbdkit -f -U "$sock" --filter=exitlast --filter=latency \
    "$@" latency-read=30s latency-write=30s &
  pid=$!
  for i in $(seq 100); do [ -S "$sock" ] && return; sleep 0.1; done
  fail "nbdkit $* did not start"
}

# gone_within SECONDS WHAT: nbdkit ($pid) exits within SECONDS.
gone_within ()
{
  local t0=$SECONDS i
  for i in $(seq $(($1 * 20))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    fail "$2: nbdkit still running after $1 s"
  fi
  wait "$pid" || true
  echo "$2: nbdkit gone after at most $((SECONDS - t0 + 1)) s"
}

for target in "memory 1M" "qcow2 $img"; do
  # The client disconnects while its requests sleep.
  start $target
  timeout 20 /usr/bin/python3 "$tmp/client.py" "$sock" > "$tmp/out" ||
    fail "$target: client"
  grep -q sent "$tmp/out" || fail "$target: the client did not send"
  gone_within 2 "$target, client gone"

  # SIGTERM while the client waits for its requests.
  start $target
  timeout 20 /usr/bin/python3 "$tmp/client.py" "$sock" "$pid" ||
    fail "$target: SIGTERM"
  gone_within 2 "$target, SIGTERM then client gone"
done

qemu-img check -q "$img" || fail "qemu-img check"
qio "$img" 'read -P 7 0 64k'
