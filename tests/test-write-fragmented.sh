#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Requests over fragmented images: clusters written in reverse and in
# random order, so that one guest request maps to many runs scattered
# in the file.  Reads and overwrites of those runs are done at once by
# the plugin's I/O threads (io-threads=, default 4), and in turn with
# io-threads=0; with the page cache (where overwrites go in turn) and
# with cache=none (O_DIRECT through aligned bounce buffers, requests
# unaligned).  diffwrite.py checks every reply against its model while
# long requests run on two connections; afterwards qemu-img check finds
# nothing and qemu reads what the model holds.
source "${srcdir:-.}/write-functions.sh"
set -e

K=1024 M=1048576
cs=$((16 * K)) size=$((4 * M)) n=$((4 * M / (16 * K)))

# fragmented IMG ORDER: every cluster written once by qemu-io, in ORDER
# (reverse or random), so that host order differs from guest order.
fragmented ()
{
  local img="$1" order="$2" i cmds=()
  rm -f "$img"
  qemu-img create -q -f qcow2 -o cluster_size=$cs "$img" $size
  for i in $(/usr/bin/python3 -c '
import random, sys
n, order = int(sys.argv[1]), sys.argv[2]
c = list(range(n))
if order == "reverse": c.reverse()
else: random.Random(77).shuffle(c)
print(" ".join(map(str, c)))' $n "$order"); do
    cmds+=("write -P $((i % 251 + 1)) $((i * cs)) $cs")
  done
  qio "$img" "${cmds[@]}"
  # The premise: the first guest MiB is scattered over many host runs.
  local runs
  runs=$(qemu-img map --output=json -f qcow2 "$img" | /usr/bin/python3 -c '
import json, sys
print(sum(1 for e in json.load(sys.stdin) if e["start"] < 1048576))')
  [ "$runs" -ge 32 ] || fail "$img ($order): only $runs host runs in 1 MiB"
}

seed=1100
for order in reverse random; do
  for opts in "" "io-threads=0" "cache=none" "cache=none io-threads=2"; do
    img=$tmp/frag-$order.qcow2
    fragmented "$img" $order
    seed=$((seed + 1))
    # shellcheck disable=SC2086
    diffwrite "$img" --seed $seed --ops 1500 --max-len $((M + 3 * K)) \
      --connections 2 --inflight 8 -- $opts
  done
done
