#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# iostats percentiles over a plugin whose reads take two distinct times
# (the eval plugin: reads beyond 64 KiB take 0.3 s more): each
# percentile falls on the right side.
source "${srcdir:-.}/functions.sh"
set -e
requires nbdsh
requires_nbdkit_plugin eval
source "${srcdir:-.}/iostats-functions.sh"

# 16 quick reads, 4 slow ones.  The 50th percentile is the 10th
# quickest read: a quick one; the 90th and 99th are the 18th and 20th:
# slow ones.
reads='
for i in range(20):
    h.pread(512, 65536 if i % 5 == 2 else 0)
'
export reads
# The sanitizer runtime that ./nbdkit may preload is for nbdkit, not for
# the commands of the script.
timeout -k 10 60 nbdkit -U - --filter=iostats eval get_size='echo 1M' \
  pread='unset LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS
         if [ "$4" -ge 65536 ]; then sleep 0.3; fi; head -c "$3" /dev/zero' \
  iostats-file="$tmp/eval.json" iostats-format=json \
  --run 'nbdsh -u "$uri" -c "$reads"' || fail "the eval run failed"
percentiles "$tmp/eval.json" | tee "$tmp/p"
read -r _ n p50 p90 p99 max mean < <(grep '^read ' "$tmp/p")
[ "$n" -eq 20 ] || fail "eval: $n reads counted"
within "$p50" 0 0.25 || fail "eval: p50 $p50 is not a quick read"
within "$p90" 0.295 1 || fail "eval: p90 $p90 is not a slow read"
within "$p99" 0.295 1 || fail "eval: p99 $p99 is not a slow read"
within "$p99" "$p90" "$max" || fail "eval: p99 $p99 out of order"
within "$mean" 0.06 0.3 || fail "eval: mean $mean"
