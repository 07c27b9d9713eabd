#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Install the Debian 12 packages the project needs (only those missing),
# then configure and build in the source tree if that was not done yet.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential nbdkit nbdkit-plugin-dev libnbd-bin libnbd-dev
          python3-libnbd qemu-utils zlib1g-dev libzstd-dev nettle-dev autoconf automake
          libtool pkg-config fio perl strace xz-utils
          # a local sshd for the qcow2 filter over the ssh plugin
          openssh-server openssh-client
          # clang and libFuzzer, for fuzz/run-fuzz.sh
          clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
    missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure ${CONFIGURE_ARGS:-}
make -j"$(nproc)"
