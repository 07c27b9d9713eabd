#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What the demo and the build need: the Debian 12 packages missing
# (only those), then configure and build in the source tree if that
# was not done yet.  What only the tests need, scripts/test.sh
# installs.  No service is installed, started or enabled.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh

# One a line, so that lists changed on two branches merge.
packages=(
  # the build
  autoconf
  automake
  build-essential
  libjson-c-dev                 # JSON: json: backing names, the control socket
  libtool
  nbdkit-plugin-dev
  nettle-dev
  libnbd-dev
  libzstd-dev
  liburing-dev                  # optional: io_uring for cache=none
  perl
  pkg-config
  zlib1g-dev
  # the demo: nbdkit, nbdinfo, nbdsh, qemu-img and qemu-io
  libnbd-bin
  nbdkit
  python3-libnbd
  qemu-utils
)
install_missing "${packages[@]}"

[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure ${CONFIGURE_ARGS:-}
make -j"$(nproc)"
