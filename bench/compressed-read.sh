#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# CPU per GiB of sequential reads of a compressed image:
# nbdcopy reads the whole disk from each server in turn, several
# rounds, and the server's own CPU time (user + system, from
# /proc/PID/stat) is divided by the data read.  Servers: our plugin,
# qemu-nbd, and nbdkit's file plugin over the equivalent raw file (the
# floor: no decompression at all).  nbdkit's qcow2dec filter is used too
# if the nbdkit run has it (1.36 and later).
#
# Usage, from the top of a built tree:
#   bench/compressed-read.sh [ROUNDS [SIZE]]     default 5 1G
# Environment: BENCH_DIR (default /var/tmp/nbdkit-qcow2-bench);
# OURS_PLUGIN=PATH to measure another build of the plugin beside this
# one (as "ours-other"); NBDKIT=PATH to run another nbdkit (a newer
# one has the qcow2dec filter; plugins load into newer nbdkit).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
plugin=$top/plugins/qcow2/.libs/nbdkit-qcow2-plugin.so
export PATH=/usr/bin:$PATH
rounds=${1:-5} size=${2:-1G}
nbdkit=${NBDKIT:-nbdkit}
dir=${BENCH_DIR:-/var/tmp/nbdkit-qcow2-bench}/compressed
mkdir -p "$dir"
sock=$dir/sock results=$dir/results.tsv
: > "$results"
hz=$(getconf CLK_TCK)

raw=$dir/data.raw
if [ ! -f "$raw" ] || [ "$(stat -c %s "$raw")" != "$(numfmt --from=iec "$size")" ]; then
  # Text-like data: compresses about 3:1, as a typical guest's files.
  python3 -c '
import random, sys
r = random.Random(1)
words = [bytes(r.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(r.randrange(2, 9))) for _ in range(5000)]
n = int(sys.argv[2])
with open(sys.argv[1], "wb") as f:
    while n > 0:
        chunk = b" ".join(r.choice(words) for _ in range(20000))[:min(n, 1 << 20)]
        f.write(chunk)
        n -= len(chunk)
' "$raw" "$(numfmt --from=iec "$size")"
  for ct in zlib zstd; do
    qemu-img convert -c -f raw -O qcow2 -o compression_type=$ct "$raw" "$dir/$ct.qcow2"
  done
fi

servers="ours qemu file"
[ -n "${OURS_PLUGIN:-}" ] && servers="$servers ours-other"
"$nbdkit" --filter=qcow2dec null --dump-plugin >/dev/null 2>&1 &&
  servers="$servers qcow2dec"

start ()
{
  local server=$1 img=$2 i
  rm -f "$sock"
  case $server in
    ours) "$nbdkit" -f -U "$sock" "$plugin" "file=$img" & ;;
    ours-other) "$nbdkit" -f -U "$sock" "$OURS_PLUGIN" "file=$img" & ;;
    qemu) qemu-nbd -t -e 8 -k "$sock" --cache=writeback --aio=threads \
            -f qcow2 -r "$img" & ;;
    file) "$nbdkit" -f -U "$sock" file "file=$raw" & ;;
    qcow2dec) "$nbdkit" -f -U "$sock" --filter=qcow2dec file "file=$img" & ;;
  esac
  pid=$!
  for i in $(seq 200); do [ -S "$sock" ] && return 0; sleep 0.05; done
  echo "$0: $server did not start" >&2
  exit 1
}

cpu () { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

for round in $(seq "$rounds"); do
  for ct in zlib zstd; do
    for server in $servers; do
      start "$server" "$dir/$ct.qcow2"
      cat "$raw" "$dir/$ct.qcow2" > /dev/null    # all in the page cache
      c0=$(cpu "$pid")
      t0=$(date +%s.%N)
      nbdcopy "nbd+unix:///?socket=$sock" null:
      t1=$(date +%s.%N)
      c1=$(cpu "$pid")
      kill "$pid"
      wait "$pid" || :
      # CPU seconds per GiB read, and GiB/s.
      echo "$ct $server $round $(echo "($c1 - $c0) / $hz / ($(numfmt --from=iec "$size") / 2^30)" | bc -l) $(echo "$(numfmt --from=iec "$size") / 2^30 / ($t1 - $t0)" | bc -l)" >> "$results"
    done
  done
done

echo "median over $rounds rounds, sequential read of a $size disk (nbdcopy)"
printf '%-6s %-10s %14s %10s\n' type server "CPU s/GiB" "GiB/s"
for ct in zlib zstd; do
  for server in $servers; do
    awk -v c=$ct -v s=$server '$1 == c && $2 == s { print $4, $5 }' "$results" |
      sort -n | awk -v c=$ct -v s=$server '{ cpu[NR] = $1; bw[NR] = $2 }
        END { m = int((NR + 1) / 2); printf "%-6s %-10s %14.3f %10.3f\n", c, s, cpu[m], bw[m] }'
  done
done

# CPU per GiB, ours against each peer: into bench/ratios.tsv and its
# chart, unless BENCH_UPDATE=0.
[ "${BENCH_UPDATE:-1}" = 0 ] || /usr/bin/python3 - "$results" <<'PY' |
import collections, statistics, sys
cpu = collections.defaultdict(list)
for line in open(sys.argv[1]):
    ct, server, _round, c, _bw = line.split()
    cpu[ct, server].append(float(c))
for ct in ("zlib", "zstd"):
    for peer, name in (("qemu", "qemu-nbd"), ("qcow2dec", "qcow2dec")):
        if cpu[ct, "ours"] and cpu[ct, peer]:
            print("%s, CPU per GiB\t%s\t%.3f\tlower" % (
                ct, name, statistics.median(cpu[ct, "ours"])
                / statistics.median(cpu[ct, peer])))
PY
  /usr/bin/python3 "$top/bench/report.py" --ratios \
    "compressed reads (bench/compressed-read.sh)"
