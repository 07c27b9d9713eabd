#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Backing files on a web server (a local one answering Range requests,
# HTTP and HTTPS), read through nbdkit's curl plugin; QEMU's curl driver
# is the oracle (bytes and block status).  A qcow2 base on the server
# naming its own backing file by a relative name (resolved against the
# URL, as QEMU resolves it); json: names with the curl driver's options
# (sslverify=false for a certificate of our own); writes over it.  A
# base down for a while: the curl plugin's error, which it repeats for
# every request failing, is said once, then counted.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdcopy nbdsh openssl
requires_nbdkit_plugin curl
requires_qemu_driver https
source "${srcdir:-.}/remote-functions.sh"
# The oracle's own hang (functions.sh): a read through QEMU's curl
# driver that has not ended in two minutes is run again, twice at most.
QEMU_TIMEOUT=120
QEMU_HANG_RETRIES=2

mkdir -p "$tmp/web/d"
base=$tmp/web/d/base.raw
qemu-img create -q -f raw "$base" 4M
QIO_FMT=raw qio "$base" 'write -P 0x11 0 1M' 'write -P 0x12 3M 64k'
mid=$tmp/web/d/mid.qcow2
qemu-img create -q -f qcow2 -b base.raw -F raw "$mid"
qio "$mid" 'write -P 0x21 512k 128k' 'write -z 3M 4k'
http_server "$tmp/web"
url=http://127.0.0.1:$http_port/d

# top -> mid.qcow2 over HTTP -> base.raw, relative to mid's URL, as
# QEMU resolves it.  QEMU 7.2 reading data through two of its curl
# nodes at once stops for ever now and then (not with one, nor mapping),
# so its reading of the same chain from the local files is the
# reference for the bytes; its map over HTTP for the extents.
qemu-img create -q -f qcow2 -b "$url/mid.qcow2" -F qcow2 "$tmp/top.qcow2"
qio "$tmp/top.qcow2" 'write -P 0x31 1020k 8k'
qemu-img info --backing-chain "$tmp/top.qcow2" | grep -q "actual path: $url/base.raw" ||
  fail "qemu-img resolves mid.qcow2's backing file otherwise"
local_chain='json:{"driver":"qcow2","file":{"driver":"file","filename":"'"$tmp/top.qcow2"'"},"backing":{"driver":"qcow2","file":{"driver":"file","filename":"'"$mid"'"}}}'
qemu-img convert -O raw "$local_chain" "$tmp/top-ref.raw"
timeout 60 nbdkit -U - -r qcow2 "$tmp/top.qcow2" \
  --run 'nbdcopy "$uri" '"$tmp"'/top-out.raw' || fail "reading top over HTTP"
cmp "$tmp/top-ref.raw" "$tmp/top-out.raw" || fail "top over HTTP reads other data"
check_map "$tmp/top.qcow2"

# json: with the curl driver's options.
qemu-img create -q -f qcow2 -F raw \
  -b 'json:{"driver":"raw","file":{"driver":"http","url":"'"$url"'/base.raw","readahead":65536,"timeout":20}}' \
  "$tmp/json.qcow2"
check_image "$tmp/json.qcow2"

# Writes over the web server, copying on write from it.
nbdkit -U - qcow2 "$tmp/top.qcow2" --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"\\x41\" * 5000, 3 * 1024 * 1024 - 1000)
h.flush()
"' || fail "writes over a base on a web server"
qemu-img check -q "$tmp/top.qcow2" || fail "qemu-img check after writes over HTTP"
qemu-io -r -c 'read -P 0x41 3144728 5000' -c 'read -P 0 3149728 96' \
  -c 'read -P 0x12 3149824 4096' -c 'read -P 0x11 0 512k' "$local_chain" \
  > "$tmp/qio.out" ||
  { cat "$tmp/qio.out"; fail "qemu-io reads other data after writes over HTTP"; }

# HTTPS with a certificate of our own: refused unless sslverify is off,
# by QEMU and by us.
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 \
  -keyout "$tmp/tls.pem" -out "$tmp/cert.pem" 2>/dev/null
cat "$tmp/cert.pem" >> "$tmp/tls.pem"
http_server "$tmp/web" "$tmp/tls.pem"
surl=https://127.0.0.1:$http_port/d
qemu-img create -q -f qcow2 -F raw \
  -b 'json:{"driver":"raw","file":{"driver":"https","url":"'"$surl"'/base.raw","sslverify":false}}' \
  "$tmp/tls.qcow2"
check_image "$tmp/tls.qcow2"
qemu-img create -q -f qcow2 -u -b "$surl/base.raw" -F raw "$tmp/verify.qcow2" 4M
expect_refused "cannot open backing file \"$surl/base.raw\": nbdkit's curl plugin cannot serve it" \
  qcow2 "$tmp/verify.qcow2"
grep -Eqi 'certificate|SSL' "$tmp/refused.err" ||
  fail "the curl plugin's message does not say what TLS refused: $(cat "$tmp/refused.err")"
! qemu-io -f qcow2 -c 'read 0 4k' "$tmp/verify.qcow2" >/dev/null 2>&1 ||
  fail "qemu-io read past a certificate nobody signed"

# A base down: every read fails, and nbdkit's curl plugin says the same
# for each; relayed, the first is said and the others counted.
mkdir "$tmp/down"
qemu-img create -q -f raw "$tmp/down/big.raw" 64M
http_server "$tmp/down"
down_pid=${servers[-1]}
qemu-img create -q -f qcow2 -u -b "http://127.0.0.1:$http_port/big.raw" \
  -F raw "$tmp/down.qcow2" 64M
timeout 60 nbdkit -U - -r qcow2 "$tmp/down.qcow2" --run 'nbdsh -u "$uri" -c "
import os
h.pread(4096, 0)
os.kill('"$down_pid"', 15)
failed = 0
for i in range(100):
    try:
        h.pread(4096, (i * 7919 * 4096) % (64 << 20))
    except nbd.Error:
        failed += 1
assert failed >= 50, failed
"' 2> "$tmp/down.err" || { cat "$tmp/down.err"; fail "reads with the base down"; }
! grep -q '^nbdkit: curl' "$tmp/down.err" ||
  fail "the curl plugin's lines were not relayed: $(grep -c '^nbdkit: curl' "$tmp/down.err")"
# (The first read may meet the connection reset, a line of its own.)
[ "$(grep -c "nbdkit's curl plugin" "$tmp/down.err")" -le 3 ] &&
  grep -q "nbdkit's curl plugin said the same [0-9]* more times in" "$tmp/down.err" ||
  fail "not the first line, then a count: $(grep "curl plugin" "$tmp/down.err")"

# The same from a server forked into the background (-v and --log
# keep its stderr): the serving process relays its helpers' lines.
http_server "$tmp/down"
down_pid=${servers[-1]}
qemu-img create -q -f qcow2 -u -b "http://127.0.0.1:$http_port/big.raw" \
  -F raw "$tmp/bg.qcow2" 64M
nbd_server bg -v --log=stderr -r qcow2 "$tmp/bg.qcow2" 2> "$tmp/bg.err"
timeout 60 nbdsh -u "nbd+unix:///?socket=$tmp/bg.sock" -c "
import os
h.pread(4096, 0)
os.kill($down_pid, 15)
for i in range(30):
    try:
        h.pread(4096, (i * 7919 * 4096) % (64 << 20))
    except nbd.Error:
        pass
" || fail "reads from the background server"
stop_server bg
! grep -q '^nbdkit: curl' "$tmp/bg.err" ||
  fail "forked: the curl plugin's lines were not relayed"
grep -q "nbdkit's curl plugin said the same [0-9]* more times in" \
  "$tmp/bg.err" ||
  fail "forked: no count: $(grep "curl plugin" "$tmp/bg.err")"
