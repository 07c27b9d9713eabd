#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter over slow storage: 2 ms of latency on every read
# below it (our latency filter), 1 MiB reads (QD1) of an image whose
# 64 KiB clusters are scattered, so that each read is 16 pieces.  With
# the pieces issued at once a read costs about one round trip; one at a
# time, 16.  Servers, each over nbdkit's file plugin:
#   raw            the latency filter over the raw file (1 request/read)
#   filter-io0     the qcow2 filter with io-threads=0 (pieces in turn)
#   filter-io4     io-threads=4 (the plugin's default)
#   filter         the filter's default (io-threads=16)
#   qcow2dec       nbdkit's own qcow2dec filter, if NBDKIT_NEW names an
#                  nbdkit with it (1.36+) and NEW_BUILD a tree of ours
#                  built against it (for its latency filter and ours)
# Usage: bench/filter-latency.sh [READS]   (default 100 reads per server)
# Prints a table of ms per read (median, and the mean) and pieces.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
export PATH=/usr/bin:$PATH
reads=${1:-100}
work=$(mktemp -d /var/tmp/filter-latency.XXXXXX)
trap 'rm -rf "$work"' EXIT

# 64 MiB written in random cluster order: guest-adjacent clusters are
# apart in the file.
"$top/bench/mkimage.sh" layout random 64M "$work/frag.qcow2" >/dev/null
qemu-img convert -O raw "$work/frag.qcow2" "$work/frag.raw"
pieces=$(qemu-img map --output=json "$work/frag.qcow2" |
  /usr/bin/python3 -c '
import json, sys
m = json.load(sys.stdin)
# host runs within the first 1 MiB reads, on average over 64 of them
runs = 0
for k in range(64):
    lo, hi = k << 20, (k + 1) << 20
    prev = None
    for e in m:
        if e["start"] + e["length"] <= lo or e["start"] >= hi or "offset" not in e:
            continue
        s = max(e["start"], lo)
        off = e["offset"] + (s - e["start"])
        if prev is None or off != prev:
            runs += 1
        prev = off + min(e["start"] + e["length"], hi) - s
print(runs / 64)')

# time_reads URI: ms per 1 MiB read at random aligned offsets, median
# and mean, from a single client, one request at a time.
time_reads ()
{
  nbdsh -u "$1" -c "
import random, statistics, time
random.seed(1)
n = h.get_size() >> 20
t = []
for i in range($reads):
    off = random.randrange(n) << 20
    a = time.perf_counter()
    h.pread(1 << 20, off)
    t.append((time.perf_counter() - a) * 1000)
print('%.2f %.2f' % (statistics.median(t), statistics.mean(t)))"
}

lat=$top/filters/latency/.libs/nbdkit-latency-filter.so
qf=$top/filters/qcow2/.libs/nbdkit-qcow2-filter.so
run ()
{
  local name=$1; shift
  local r
  r=$("$@" --run "$(declare -f time_reads); reads=$reads; time_reads \"\$uri\"")
  printf '| %-12s | %s | %s |\n' "$name" "${r% *}" "${r#* }"
  printf '%s\t%s\n' "$name" "${r% *}" >> "$work/medians"
}

echo "1 MiB reads, QD1, $reads per server, 2 ms latency per read below; host runs per read: $pieces"
echo "| server | median ms/read | mean ms/read |"
echo "|---|---|---|"
run raw nbdkit -U - --filter="$lat" file "$work/frag.raw" latency-read=2ms
run filter-io0 nbdkit -U - --filter="$qf" --filter="$lat" file "$work/frag.qcow2" \
  latency-read=2ms io-threads=0
run filter-io4 nbdkit -U - --filter="$qf" --filter="$lat" file "$work/frag.qcow2" \
  latency-read=2ms io-threads=4
run filter nbdkit -U - --filter="$qf" --filter="$lat" file "$work/frag.qcow2" \
  latency-read=2ms
if [ -n "${NBDKIT_NEW:-}" ] && [ -n "${NEW_BUILD:-}" ]; then
  nlat=$NEW_BUILD/filters/latency/.libs/nbdkit-latency-filter.so
  nqf=$NEW_BUILD/filters/qcow2/.libs/nbdkit-qcow2-filter.so
  run "filter $("$NBDKIT_NEW" --version | cut -d' ' -f2)" "$NBDKIT_NEW" -U - --filter="$nqf" \
    --filter="$nlat" file "$work/frag.qcow2" latency-read=2ms
  run "qcow2dec" "$NBDKIT_NEW" -U - --filter=qcow2dec --filter="$nlat" file \
    "$work/frag.qcow2" latency-read=2ms
fi

# The filter's median time against the others' (qcow2dec's, with
# NBDKIT_NEW): into bench/ratios.tsv and its chart, unless
# BENCH_UPDATE=0.
[ "${BENCH_UPDATE:-1}" = 0 ] || /usr/bin/python3 - "$work/medians" <<'PY' |
import sys
m = dict(line.rstrip("\n").split("\t") for line in open(sys.argv[1]))
for peer, name in (("qcow2dec", "qcow2dec"), ("raw", "the raw file")):
    if peer in m:
        print("fragmented 1 MiB reads, 2 ms below, time\t%s\t%.3f\tlower"
              % (name, float(m["filter"]) / float(m[peer])))
PY
  /usr/bin/python3 "$top/bench/report.py" --ratios \
    "qcow2 filter (bench/filter-latency.sh)"
