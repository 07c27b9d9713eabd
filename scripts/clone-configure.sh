#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# clone-configure.sh DIR [CONFIGURE-ARGS...]: a fresh clone of the
# committed tree in DIR, configured with those arguments, for a second
# build beside the in-tree one (automake builds in one configured tree
# at a time): the sanitizer, distcheck and ThreadSanitizer builds.  The
# caller builds.  Run from the top of the source tree.
set -euo pipefail
dir=$1; shift
rm -rf "$dir"
git clone -q . "$dir"
cd "$dir"
autoreconf -fi >/dev/null 2>&1
./configure "$@" >/dev/null
