#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The whole test suite: set up (packages, build), then make check.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# On failure, show the failing tests' logs: CI keeps only this output.
make -j"$(nproc)" check || { scripts/show-failures.sh tests; exit 1; }
