#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The Debian packages of the committed tree, built as Debian builds
# them (debian/: dh with autoreconf, Debian's hardening flags) in a
# fresh clone in build-deb/, then checked by lintian: any error or
# warning fails, the informational and pedantic tags are shown.  The
# .debs are left in build-deb/.  The package's tests (make check) run
# in the build unless DEB_BUILD_OPTIONS has nocheck; the packages
# missing for the build (and for its tests, when they run) are
# installed first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh

# One a line, so that lists changed on two branches merge: those of
# debian/control (dpkg-buildpackage refuses to build without one of
# them, and names it).
packages=(
  # dpkg-buildpackage, dh with autoreconf, lintian
  debhelper
  dpkg-dev
  lintian
  # Build-Depends
  libjson-c-dev
  libnbd-dev
  liburing-dev
  libzstd-dev
  nbdkit
  nbdkit-plugin-dev
  nettle-dev
  perl
  pkg-config
  zlib1g-dev
)
# Build-Depends <!nocheck>: what the tests use.
check_packages=(
  iproute2
  libnbd-bin
  openssh-client
  openssh-server
  openssl
  python3-libnbd
  qemu-block-extra
  qemu-utils
  strace
  systemd
  xz-utils
)
# Two jobs a core unless told otherwise, as scripts/test.sh runs the
# suite: its tests spend much of their time waiting.
if [[ " ${DEB_BUILD_OPTIONS:-} " != *" parallel="* ]]; then
  export DEB_BUILD_OPTIONS="${DEB_BUILD_OPTIONS:+$DEB_BUILD_OPTIONS }parallel=$(( 2 * $(nproc) ))"
fi
profiles=()
if [[ " ${DEB_BUILD_OPTIONS} " == *" nocheck "* ]]; then
  # The nocheck profile drops the test packages from Build-Depends.
  profiles=(-Pnocheck)
else
  packages+=("${check_packages[@]}")
fi
install_missing "${packages[@]}"

rm -rf build-deb
mkdir build-deb
git clone -q . build-deb/nbdkit-qcow2
(
  cd build-deb/nbdkit-qcow2
  # The source package and the binary ones (and -dbgsym): lintian then
  # checks the source too.  The clone's .git stays out of the source
  # tarball (dpkg-source leaves version control files out).
  dpkg-buildpackage -us -uc "${profiles[@]}" >../build.log 2>&1 ||
    { tail -60 ../build.log; echo "dpkg-buildpackage failed (build-deb/build.log)"; exit 1; }
)
changes=$(ls build-deb/*.changes)
echo "built: $(cd build-deb && ls ./*.deb ./*.dsc | tr '\n' ' ')"
lintian --fail-on error,warning "$changes"
echo "lintian: no error or warning; the informational and pedantic tags:"
lintian --fail-on none --display-info --pedantic "$changes"
