#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The systemd unit of the man page: started on its socket as systemd
# would (systemd-socket-activate), create=if-missing makes the image at
# the first connection, not before, and a restart serves the same disk;
# qemu-img check finds it clean.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh systemd-socket-activate

img=$tmp/new.qcow2
sock=$tmp/sa.sock
sa=
trap 'if [ -n "$sa" ]; then kill "$sa" 2>/dev/null || :; fi; rm -rf "$tmp"' EXIT
for round in 1 2; do
  systemd-socket-activate -l "$sock" nbdkit --foreground qcow2 "$img" \
    create=if-missing size=20M > "$tmp/sa.log" 2>&1 &
  sa=$!
  for i in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
  [ "$round" = 1 ] && [ -e "$img" ] && fail "the image was made before the first connection"
  nbdsh -u "nbd+unix:///?socket=$sock" -c "
assert h.get_size() == 20 * 1024 * 1024
if $round == 1:
    h.pwrite(b'\x44' * 512, 1 << 20)
    h.flush()
else:
    assert h.pread(512, 1 << 20) == b'\x44' * 512
" || { cat "$tmp/sa.log"; fail "socket activation, round $round"; }
  kill "$sa"; wait "$sa" || true
  sa=
  rm -f "$sock"
done
qemu-img check -q "$img" || fail "qemu-img check after socket activation"
