#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# iostats latencies are what the layers below take: with nbdkit's
# delay filter below, reads delayed 100 ms have p50 and mean of about
# 0.1 s while undelayed writes stay fast.  (A plugin whose reads take
# two distinct times: test-iostats-bimodal.sh.)
source "${srcdir:-.}/functions.sh"
set -e
requires nbdsh qemu-img
source "${srcdir:-.}/iostats-functions.sh"

rw='
for i in range(8):
    h.pread(4096, i * 4096)
    h.pwrite(b"\x05" * 4096, i * 4096)
h.flush()
'
export rw

img=$tmp/disk.qcow2
qemu-img create -q -f qcow2 "$img" 1M
for plugin in memory qcow2; do
  if [ $plugin = memory ]; then args=(memory 1M); else args=(qcow2 "file=$img"); fi
  timeout -k 10 60 nbdkit -U - --filter=iostats --filter=delay "${args[@]}" \
    rdelay=100ms iostats-file="$tmp/$plugin.json" iostats-format=json \
    --run 'nbdsh -u "$uri" -c "$rw"' || fail "$plugin: the delayed run failed"
  percentiles "$tmp/$plugin.json" | tee "$tmp/p"
  read -r _ n p50 p90 p99 max mean < <(grep '^read ' "$tmp/p")
  [ "$n" -eq 8 ] || fail "$plugin: $n reads counted"
  # Percentiles are the middles of buckets 1/32 wide: at least 0.0984 s
  # for 0.1 s; the upper bound leaves room for a loaded machine.
  within "$p50" 0.0984 0.25 || fail "$plugin: read p50 $p50, not about 0.1 s"
  within "$mean" 0.1 0.25 || fail "$plugin: read mean $mean, not about 0.1 s"
  within "$max" 0.1 1 || fail "$plugin: read max $max"
  within "$p90" "$p50" "$max" || fail "$plugin: read p90 $p90 out of order"
  within "$p99" "$p90" "$max" || fail "$plugin: read p99 $p99 out of order"
  read -r _ n p50 p90 p99 max mean < <(grep '^write ' "$tmp/p")
  [ "$n" -eq 8 ] || fail "$plugin: $n writes counted"
  within "$p99" 0 0.05 || fail "$plugin: undelayed writes have p99 $p99"
done
qemu-img check -q "$img" || fail "qemu-img check $img"
