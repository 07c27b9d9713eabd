#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The whole test suite: set up (the packages of the build, the build),
# the packages only the tests and CI need, then make check.  sshd comes
# without its service: the ssh test starts its own, on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
source scripts/packages.sh

# One a line, so that lists changed on two branches merge.
packages=(
  # a local sshd and its client, for the qcow2 filter over ssh
  openssh-client
  openssh-server
  # the syscall test; the xz filter under the qcow2 filter
  strace
  xz-utils
  # CI: the lock contract (clang -Wthread-safety) and the fuzzer
  clang
  libclang-rt-14-dev
  # the benchmarks (bench/)
  fio
  # bench/stream.sh: qemu-storage-daemon's block-stream job, the peer
  qemu-system-common
  # the control socket driven as an admin drives QMP
  socat
  # remote backing files: QEMU's nbd, curl and ssh drivers as the
  # tests' oracle, and the HTTPS test server's certificate
  qemu-block-extra
  openssl
)
install_missing "${packages[@]}"

# SANITIZE=1 (what CI runs): the suite built with AddressSanitizer and
# UndefinedBehaviorSanitizer, in a clone of the committed tree
# (build-sanitize/: automake builds in one configured tree at a time),
# so that a memory error or undefined behaviour fails the test that
# met it.
top=$PWD
if [ -n "${SANITIZE:-}" ]; then
  scripts/clone-configure.sh build-sanitize \
    CFLAGS="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  cd build-sanitize
  make -j"$(nproc)" >/dev/null
fi

# Two tests a core: they spend much of their time waiting for the
# servers and tools they start (with four at once on two cores, the
# suite kept 1.87 cores busy).  On failure, show the failing tests'
# logs: CI keeps only this output.
make -j"$(( 2 * $(nproc) ))" check ||
  { "$top/scripts/show-failures.sh" tests; exit 1; }
"$top/scripts/show-times.sh" tests
