#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dir= template=: 40 exports made at once and written, then nbdkit
# killed (SIGKILL) while they are still being written: every overlay
# passes qemu-img check (leaks aside), and QEMU reads in each every
# write flushed before the kill over the golden image's data.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
requires_python_nbd

d="$tmp/vms"
mkdir "$d"
qemu-img create -q -f qcow2 "$d/golden.qcow2" 4M
qio "$d/golden.qcow2" "write -P 0x11 0 4M"
sock="$tmp/sock"
nbdkit -f -U "$sock" qcow2 dir="$d" template=golden.qcow2 &
pid=$!
trap 'kill -9 $pid 2>/dev/null || :; rm -rf "$tmp"' EXIT
wait_socket "$sock" $pid || fail "nbdkit did not start"

# Each of 40 clients: 8 blocks of its own byte in the first half,
# flushed (recorded), then blocks written unflushed in the second half
# until the server dies.
/usr/bin/python3 - "$sock" "$tmp" $pid <<'PY' || fail "the writers"
import json, nbd, os, random, signal, sys, threading, time
sock, tmp, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
flushed, errors = {}, []
ready = threading.Semaphore(0)
def run(i):
    name = "vm%02d" % i
    try:
        h = nbd.NBD()
        h.set_export_name(name)
        h.connect_unix(sock)
        rnd = random.Random(i)
        blocks = rnd.sample(range(256), 8)
        for b in blocks:
            h.pwrite(bytes([i + 1]) * 4096, b * 4096)
        h.flush()
        flushed[name] = blocks
    except Exception as e:
        errors.append("%s: %s" % (name, e))
    ready.release()
    try:
        while True:
            h.pwrite(b"\xee" * 4096, (256 + rnd.randrange(256)) * 4096)
    except Exception:
        pass
ts = [threading.Thread(target=run, args=(i,)) for i in range(40)]
for t in ts: t.start()
for t in ts: ready.acquire()
time.sleep(0.2)
os.kill(pid, signal.SIGKILL)
for t in ts: t.join()
assert not errors, errors
json.dump(flushed, open(tmp + "/flushed.json", "w"))
PY
wait $pid 2>/dev/null || :

for i in $(seq 0 39); do
  v=$(printf vm%02d "$i")
  r=0; qemu-img check -q "$d/$v" > "$tmp/check" 2>&1 || r=$?
  [ $r -eq 0 ] || [ $r -eq 3 ] || { cat "$tmp/check"; fail "qemu-img check $v: $r"; }
  qemu-img convert -U -f qcow2 -O raw "$d/$v" "$tmp/$v.raw"
done
/usr/bin/python3 - "$tmp" <<'PY' || fail "a flushed write lost"
import json, sys
tmp = sys.argv[1]
flushed = json.load(open(tmp + "/flushed.json"))
assert len(flushed) == 40
for name, blocks in flushed.items():
    data = open("%s/%s.raw" % (tmp, name), "rb").read()
    byte = int(name[2:]) + 1
    for b in range(256):
        want = bytes([byte if b in blocks else 0x11]) * 4096
        assert data[b * 4096:(b + 1) * 4096] == want, "%s: block %d" % (name, b)
PY
ls -A "$d" | grep -q '^\.' && fail "hidden files left: $(ls -A "$d")"
echo "$0: ok"
