#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A backing file on an NBD server named by a relative Unix socket
# (nbd+unix:///?socket=REL, nbd:unix:REL) is found from the folder
# nbdkit was started in, as QEMU finds it from its own, also once nbdkit
# has forked into the background (and changed to /): every read, not
# only the first.  qemu-io reads the same overlay from the same folder.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
source "${srcdir:-.}/remote-functions.sh"

# A folder whose name libnbd's URL must carry percent-encoded.
dir="$tmp/a b"
mkdir "$dir"
base=$tmp/base.raw
qemu-img create -q -f raw "$base" 8M
QIO_FMT=raw qio "$base" 'write -P 0x11 0 8M'
nbdkit -U "$dir/base.sock" -P "$tmp/base.pid" -r file "$base"
wait_socket "$dir/base.sock" "$(cat "$tmp/base.pid")" || fail "no base server"
servers+=("$(cat "$tmp/base.pid")")

cd "$dir"
for name in "nbd+unix:///?socket=base.sock" "nbd:unix:base.sock"; do
  rm -f ovl.qcow2 "$tmp/q.sock"
  qemu-img create -q -f qcow2 -b "$name" -F raw ovl.qcow2
  qemu-io -f qcow2 -c 'write -P 0x22 1M 64k' ovl.qcow2 >/dev/null
  # Forked into the background: its connections are made after it.
  nbdkit -U "$tmp/q.sock" -P "$tmp/q.pid" qcow2 ovl.qcow2
  wait_socket "$tmp/q.sock" "$(cat "$tmp/q.pid")" || fail "$name: no server"
  servers+=("$(cat "$tmp/q.pid")")
  nbdsh -u "nbd+unix:///?socket=$tmp/q.sock" -c '
for o in range(0, 8 << 20, 1 << 20):
    assert h.pread(65536, o) == bytes([0x22 if o == 1 << 20 else 0x11]) * 65536
h.pwrite(b"\x33" * 4096, 3 << 20)
h.flush()' || fail "$name: reading from the folder it was started in"
  kill "$(cat "$tmp/q.pid")"
  for i in $(seq 50); do kill -0 "$(cat "$tmp/q.pid")" 2>/dev/null || break; sleep 0.1; done
  qemu-img check -q ovl.qcow2 || fail "$name: qemu-img check"
  qemu-io -f qcow2 -c 'read -P 0x11 0 1M' -c 'read -P 0x22 1M 64k' \
    -c 'read -P 0x33 3M 4k' -c 'read -P 0x11 4M 4M' ovl.qcow2 > "$tmp/qio.out" ||
    { cat "$tmp/qio.out"; fail "$name: QEMU reads other data"; }
done
