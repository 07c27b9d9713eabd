#!/usr/bin/env bash
# The whole test suite: set up (packages, build), then make check.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
make -j"$(nproc)" check
