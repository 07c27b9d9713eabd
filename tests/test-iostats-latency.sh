#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# iostats latencies are what the layers below take: with nbdkit's
# delay filter below, reads delayed 100 ms have p50 and mean of about
# 0.1 s while undelayed writes stay fast; with a plugin whose reads
# take two distinct times, the percentiles fall on the right side.
source "${srcdir:-.}/functions.sh"
set -e
requires nbdsh qemu-img

# percentiles FILE: "op count p50 p90 p99 max mean" lines from a JSON
# report.
percentiles ()
{
  /usr/bin/python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read())
for op, o in r["ops"].items():
    print(op, o["count"], o["p50_s"], o["p90_s"], o["p99_s"], o["max_s"],
          o["mean_s"])
' "$1"
}

# within VALUE LOW HIGH
within ()
{
  /usr/bin/python3 -c 'import sys; v, lo, hi = map(float, sys.argv[1:]); sys.exit(not lo <= v <= hi)' "$@"
}

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

# Reads beyond 64 KiB take 0.3 s more: 16 quick reads, 4 slow ones.  The
# 50th percentile is the 10th quickest read: a quick one; the 90th and
# 99th are the 18th and 20th: slow ones.
if nbdkit eval --dump-plugin >/dev/null 2>&1; then
  reads='
for i in range(20):
    h.pread(512, 65536 if i % 5 == 2 else 0)
'
  export reads
  # The sanitizer runtime that ./nbdkit may preload is for nbdkit, not
  # for the commands of the script.
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
else
  echo "$0: the eval plugin is missing: bimodal percentiles not tested"
fi
