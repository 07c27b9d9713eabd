#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Bad remote storage at start: each case one message naming the
# backing file and what to do, and nbdkit exits 1 (never a hang): a
# server not running (a socket, a TCP port), a name that does not
# resolve, TLS the server does not offer, a server that accepts and
# never answers (remote-timeout=), an export smaller than the layer it
# holds, a json: driver or a protocol we do not open.  (A 404:
# test-remote-errors-http.sh.)
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img
source "${srcdir:-.}/remote-functions.sh"

qemu-img create -q -f raw "$tmp/base.raw" 4M
nbd_server raw -r file "$tmp/base.raw"
sock=$tmp/raw.sock

# refused REGEXP BACKING-NAME [PLUGIN-ARGS...]: an overlay naming it is
# refused with one message matching REGEXP, and exit status 1.
refused ()
{
  local re="$1" name="$2"; shift 2
  local r=0
  qemu-img create -q -f qcow2 -u -b "$name" -F raw "$tmp/ovl.qcow2" 4M
  expect_refused "$re" qcow2 "$tmp/ovl.qcow2" "$@"
  timeout 60 nbdkit -U - qcow2 "$tmp/ovl.qcow2" "$@" --run true 2>/dev/null || r=$?
  [ "$r" -eq 1 ] || fail "$name: nbdkit exited $r, not 1"
  [ "$(grep -v 'error: hint: ' "$tmp/refused.err" | grep -c 'error: ')" -eq 1 ] || {
    cat "$tmp/refused.err"
    fail "$name: more than one message"
  }
}

refused "cannot open backing file \"nbd\\+unix:///\\?socket=$tmp/none.sock\": connect: No such file or directory: is the NBD server running\\?" \
  "nbd+unix:///?socket=$tmp/none.sock"
port=$(free_port)
refused "nbd://127.0.0.1:$port/\": connect: .*Connection refused: is the NBD server running\\?" \
  "nbd://127.0.0.1:$port/"
refused 'getaddrinfo: hostname "no-such-host.invalid".*: does the host name resolve\?' \
  "nbd://no-such-host.invalid/"
refused 'server refused TLS.*\(the server does not offer TLS: nbd:// and nbd\+unix:// connect without it\)' \
  "nbds+unix:///?socket=$sock"
refused 'backing file "json:.*": the sum of offset \(0\) and size \(8388608\) is more than the storage.s size \(4194304\)$' \
  'json:{"driver":"raw","size":8388608,"file":{"driver":"nbd","server":{"type":"unix","path":"'"$sock"'"}}}'
refused 'json: driver "gluster" is not supported: raw or qcow2 over file, nbd, http, https or ssh are' \
  'json:{"driver":"raw","file":{"driver":"gluster","volume":"v","path":"p"}}'
refused 'protocol "iscsi" is not supported \(nbd, nbds, nbd\+unix, nbds\+unix, http, https and ssh are\)' \
  'iscsi://127.0.0.1/iqn.2001-04.com.example/1'

# A server that takes the connection and never answers.
/usr/bin/python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
open(sys.argv[2], "w").write("up")
time.sleep(600)
' "$tmp/mute.sock" "$tmp/mute.up" &
servers+=("$!")
for i in $(seq 100); do [ -s "$tmp/mute.up" ] && break; sleep 0.1; done
start=$(date +%s)
refused 'no answer within 2 s \(remote-timeout=\)' \
  "nbd+unix:///?socket=$tmp/mute.sock" remote-timeout=2
[ $(( $(date +%s) - start )) -lt 20 ] || fail "remote-timeout=2 took too long"
