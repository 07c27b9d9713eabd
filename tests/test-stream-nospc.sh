#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# stream=true with no space left on the top's file system (a tmpfs of
# 2 MiB, which needs root): the job stops with a notice, the image
# stays consistent and keeps its backing file, a client's write fails
# with ENOSPC while its reads go on.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdinfo nbdsh mount umount
source "${srcdir:-.}/remote-functions.sh"
source "${srcdir:-.}/stream-functions.sh"

base=$tmp/base.raw
stream_raw_base "$base"
mkdir "$tmp/small"
mount -t tmpfs -o size=2m tmpfs "$tmp/small" 2>/dev/null || {
  echo "$0: test skipped: cannot mount a small tmpfs here (root needed)"
  exit 77
}
# Servers stopped first (one has the top open), then the mount.
trap 'for p in "${servers[@]}"; do kill "$p" 2>/dev/null || true; done
      sleep 0.5; umount "$tmp/small" 2>/dev/null || true; rm -rf "$tmp"' EXIT
top=$tmp/small/top.qcow2
qemu-img create -q -f qcow2 -b "$base" -F raw "$top"
stream_serve nospc qcow2 "$top" stream=true
d=$(wait_streamed nospc)
case "$d" in *stopped*) ;; *) fail "with no space: $d" ;; esac
grep -q "no space left for the copy .* the job stops" "$tmp/nospc.log" ||
  fail "no notice of the full disk: $(cat "$tmp/nospc.log")"
nbdsh -u "nbd+unix:///?socket=$tmp/nospc.sock" \
  -c 'assert h.pread(4096, 21 << 20) == b"\x12" * 4096' ||
  fail "a read with the disk full"
! nbdsh -u "nbd+unix:///?socket=$tmp/nospc.sock" \
  -c 'h.pwrite(b"\x44" * (4 << 20), 26 << 20); h.flush()' \
  2> "$tmp/nospc.err" || fail "a write with the disk full succeeded"
grep -q "No space left on device" "$tmp/nospc.err" ||
  fail "the client's write failed otherwise: $(cat "$tmp/nospc.err")"
stop_server nospc
qemu-img check -q "$top" || fail "qemu-img check (no space)"
qemu-img info "$top" | grep -q "backing file: $base" ||
  fail "the backing link went with the job stopped"
qemu-img compare -q -f qcow2 -F raw "$top" "$base" ||
  fail "the top does not read as the chain did (no space)"
kill "${servers[@]}" 2>/dev/null || true
sleep 0.5
umount "$tmp/small"
echo OK
