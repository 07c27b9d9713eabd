#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test-bad-compressed.sh with zstd compressed clusters, a test of its
# own so that a QEMU built without zstd skips it alone.
ct=zstd
source "${srcdir:-.}/test-bad-compressed.sh"
