#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A flush waits a bounded time under any read load (flushwait.py): four
# connections read 1 MiB at a time without pause (cache=none, so that
# each read holds the image's data lock for a while), two overwrite and
# trim clusters (so that frees are pending, which a flush makes under
# the data lock held exclusively), and flushes and FUA writes every
# 50 ms must each finish within 1 s, a limit generous for a loaded
# 2-core machine.  With glibc's default reader-preferring lock the
# longest flush here was 2.6 to 4.3 s (the median 0.02 s); with the
# writer-preferring lock, 0.02 s.
source "${srcdir:-.}/write-functions.sh"
set -e
flushwait_py="$(cd "${srcdir:-.}" && pwd)/flushwait.py"

img=$tmp/flushwait.qcow2
qemu-img create -q -f qcow2 -o preallocation=full "$img" 256M
serve_rw "$img" "/usr/bin/python3 $flushwait_py \"\$uri\" --seconds 6 \
  --readers 4 --limit ${FLUSHWAIT_LIMIT:-1}" cache=none ||
  fail "a flush or FUA write waited too long under reads"
check_written "$img"
echo "$0: ok"
