#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes (diffwrite.py, randomized and differential) on the top of
# three-deep backing chains: partial-cluster writes must copy what the
# chain below holds, zeroes must hide it, and the backing files must
# not change.  Chains: qcow2 <- qcow2 <- qcow2 with different cluster
# sizes; raw <- v2 <- v2 (no zero flag in v2); and backing files
# shorter than the overlay above them, with writes across their ends.
# Afterwards qemu-img check finds no error and no leak in the top,
# qemu reads exactly what the driver's model holds, and every backing
# file is byte for byte what it was.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576

# chain_test TOP FILES...: diffwrite on TOP (extra driver arguments in
# $dw_args), then the FILES (its backing chain) must be unchanged.
chain_test ()
{
  local top="$1"; shift
  local f sums=() i=0
  for f in "$@"; do sums+=("$(md5sum < "$f")"); done
  diffwrite "$top" $dw_args
  for f in "$@"; do
    [ "$(md5sum < "$f")" = "${sums[$i]}" ] || fail "backing file $f changed"
    i=$((i + 1))
  done
}

# 1. qcow2 (64k) <- qcow2 (4k) <- qcow2 (64k), all 32M.
base=$tmp/a-base.qcow2 mid=$tmp/a-mid.qcow2 top=$tmp/a-top.qcow2
make_image "$base" $((32 * M)) cluster_size=64k 400
qemu-img create -q -f qcow2 -o cluster_size=4k -b "$base" -F qcow2 "$mid"
qio "$mid" "write -P 0x21 1000 70000" "write -P 0x22 $((3 * M)) $M" \
           "write -z $((5 * M)) 128k" "discard $((6 * M)) 64k" \
           "write -P 0x23 $((12 * M + 7)) 8k" "write -c -P 0x24 $((20 * M)) 64k"
qemu-img create -q -f qcow2 -o cluster_size=64k -b "$mid" -F qcow2 "$top"
qio "$top" "write -P 0x31 $((2 * M)) 4096" "write -P 0x32 $((3500 * K)) 100" \
           "write -z $((8 * M)) $((2 * M))" "write -P 0x33 $((32 * M - 512)) 512"
dw_args="--seed 401 --ops 3000 --inflight 8" chain_test "$top" "$base" "$mid"
# The same chain over two connections.
dw_args="--seed 402 --ops 2000 --inflight 8 --connections 2" \
  chain_test "$top" "$base" "$mid"

# 2. raw <- v2 (512-byte clusters) <- v2 (64k): v2 has no zero flag.
base=$tmp/b-base.raw mid=$tmp/b-mid.qcow2 top=$tmp/b-top.qcow2
random_raw "$base" $((16 * M)) 410
qemu-img create -q -f qcow2 -o compat=0.10,cluster_size=512 \
  -b "$base" -F raw "$mid"
qio "$mid" "write -P 0x41 100 1000" "write -z $((5 * M)) 4k" \
           "write -P 0x42 $((7 * M)) 3000" "discard $((M)) 64k"
qemu-img create -q -f qcow2 -o compat=0.10,cluster_size=64k \
  -b "$mid" -F qcow2 "$top"
qio "$top" "write -P 0x43 $((4 * K)) 2k" "write -z $((M + 5)) 8k" \
           "write -P 0x44 $((5 * M)) 70000"
dw_args="--seed 411 --ops 3000 --inflight 8" chain_test "$top" "$base" "$mid"

# 3. Backing files shorter than the overlays above them: base 16M
# (2M clusters) <- mid 20M + 36k (64k clusters, subclusters) <- top 28M
# (4k clusters).  Past the end of a backing file the layer above reads
# zeros.
base=$tmp/c-base.qcow2 mid=$tmp/c-mid.qcow2 top=$tmp/c-top.qcow2
make_image "$base" $((16 * M)) cluster_size=2M 420
qemu-img create -q -f qcow2 -o cluster_size=64k,extended_l2=on \
  -b "$base" -F qcow2 "$mid" $((20 * M + 36 * K))
qio "$mid" "write -P 0x51 $((16 * M - 3000)) 6000" "write -P 0x52 $((M)) 5000"
qemu-img create -q -f qcow2 -o cluster_size=4k -b "$mid" -F qcow2 "$top" \
  $((28 * M))
qio "$top" "write -P 0x61 $((20 * M + 30 * K)) 12k" "write -z $((2 * M)) 4k"
dw_args="--seed 421 --ops 3000 --inflight 8" chain_test "$top" "$base" "$mid"
