#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Where the plugin's and the filter's notices reach syslog (nbdkit's own
# routing, which modules cannot ask for: common/glue/introspect.c): with
# --log=syslog, and from a server in the background (the filter opens
# the image after nbdkit forked: its notice of an overlay streamed
# already, served alone).  Seen on a /dev/log of our own, in a user and
# mount namespace.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdinfo unshare
if ! unshare -rm true 2>/dev/null; then
  echo "$0: test skipped: no user and mount namespace here"
  exit 77
fi

img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 4M
qemu-img create -q -f raw "$tmp/b.raw" 1M
qemu-img create -q -f qcow2 "$tmp/ov.qcow2" 1M
cat > "$tmp/syslog.sh" <<'EOS'
set -e
mkdir "$tmp/dev"
mount --rbind /dev "$tmp/dev"
mount -t tmpfs tmpfs /dev
for n in null zero urandom random; do
  touch "/dev/$n"; mount --bind "$tmp/dev/$n" "/dev/$n"
done
ln -s /proc/self/fd /dev/fd
/usr/bin/python3 -c '
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("/dev/log")
os.close(os.open(sys.argv[1] + ".ready", os.O_CREAT | os.O_WRONLY))
with open(sys.argv[1], "ab", buffering=0) as f:
    while True:
        f.write(s.recv(65536) + b"\n")
' "$tmp/syslog.txt" &
listener=$!
while [ ! -e "$tmp/syslog.txt.ready" ]; do sleep 0.1; done
nbdkit --log=syslog -U - qcow2 "$img" create=if-missing size=1M \
  --run 'nbdinfo --size "$uri"' > /dev/null
nbdkit -U "$tmp/bg.sock" -P "$tmp/bg.pid" --filter=qcow2 file "$tmp/b.raw" \
  qcow2-overlay="$tmp/ov.qcow2" qcow2-overlay-stream=true
for i in $(seq 100); do [ -S "$tmp/bg.sock" ] && break; sleep 0.1; done
nbdinfo --size "nbd+unix:///?socket=$tmp/bg.sock" > /dev/null
kill "$(cat "$tmp/bg.pid")"
sleep 0.2
kill "$listener"
EOS
tmp="$tmp" img="$img" unshare -rm bash "$tmp/syslog.sh" ||
  fail "the syslog run failed"
cat "$tmp/syslog.txt"
# LOG_DAEMON | LOG_NOTICE is 29.
grep -q "^<29>.*nbdkit\[[0-9]*\]: qcow2: notice: $img: create=if-missing: the image there is served as it is" \
  "$tmp/syslog.txt" || fail "--log=syslog: no notice in syslog"
grep -q "^<29>.*nbdkit\[[0-9]*\]: qcow2: notice: $tmp/ov.qcow2: qcow2-overlay-stream=true: .*served alone" \
  "$tmp/syslog.txt" || fail "in the background: no notice in syslog"
