#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Space under churn: the same seeded requests (bench/churn.py:
# fill, then cycles of trimming a scattered half and writing it again)
# through our plugin and through qemu-nbd --discard=unmap, on new images
# of 512-byte to 2 MiB clusters; after every flush, the image's file end
# and its disk use.  Prints one table per cluster size with both servers
# and their ratios (ours / qemu-nbd).
#
# Usage, from the top of a built tree:
#   bench/churn.sh [SIZE [CYCLES [CLUSTER_SIZES]]]   default 256M 8
#                                                    "512 4096 65536 2097152"
# Environment: BENCH_DIR (default /var/tmp/nbdkit-qcow2-bench) holds the
# images; CHURN_BASE=PATH adds a third server, our plugin from another
# build (e.g. before a change).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
plugin=$top/plugins/qcow2/.libs/nbdkit-qcow2-plugin.so
export PATH=/usr/bin:$PATH
size=${1:-256M} cycles=${2:-8} sizes=${3:-512 4096 65536 2097152}
bytes=$(numfmt --from=iec "$size")
dir=${BENCH_DIR:-/var/tmp/nbdkit-qcow2-bench}/churn
mkdir -p "$dir"
sock=$dir/sock img=$dir/img.qcow2
servers=(ours qemu)
[ -n "${CHURN_BASE:-}" ] && servers+=(base)

run ()
{
  local server=$1 cs=$2 pid i
  rm -f "$img" "$sock"
  qemu-img create -q -f qcow2 -o cluster_size="$cs" "$img" "$size"
  case $server in
    ours) nbdkit -f -U "$sock" "$plugin" "file=$img" & ;;
    base) nbdkit -f -U "$sock" "$CHURN_BASE" "file=$img" & ;;
    qemu) qemu-nbd -k "$sock" -f qcow2 --discard=unmap --cache=writeback \
            --aio=threads "$img" & ;;
  esac
  pid=$!
  for i in $(seq 200); do
    [ -S "$sock" ] && break
    sleep 0.05
  done
  unit=$(( cs / 16 > 4096 ? cs / 16 : 4096 ))
  /usr/bin/python3 "$top/bench/churn.py" "$sock" "$img" "$bytes" "$cycles" 1 \
    "$unit" > "$dir/$server-$cs.txt"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

: > "$dir/ratios"
for cs in $sizes; do
  for s in "${servers[@]}"; do
    run "$s" "$cs"
  done
  echo "### $cs-byte clusters, $size disk, $cycles cycles"
  echo
  /usr/bin/python3 - "$dir" "$cs" "${servers[@]}" <<'EOF'
import sys
d, cs, servers = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = {s: [l.split() for l in open("%s/%s-%s.txt" % (d, s, cs))]
        for s in servers}
M = 1 << 20
head = "| cycle | after |"
for what in ("file end", "disk use"):
    for s in servers:
        head += " %s %s (MiB) |" % (s, what)
    head += " ours/qemu |"
    if "base" in servers:
        head += " base/qemu |"
print(head)
print("|" + "---|" * (head.count("|") - 1))
for i, (c, ph, *_) in enumerate(rows["ours"]):
    line = "| %s | %s |" % (c, ph)
    for col in (2, 3):
        v = {s: int(rows[s][i][col]) for s in servers}
        for s in servers:
            line += " %.1f |" % (v[s] / M)
        line += " %.2f |" % (v["ours"] / v["qemu"])
        if "base" in servers:
            line += " %.2f |" % (v["base"] / v["qemu"])
    print(line)
print()
# The file's end after the last rewrite, for the chart.
c = rows["ours"][-1][0]
unit = {"512": "512 B", "4096": "4 KiB", "65536": "64 KiB",
        "2097152": "2 MiB"}.get(cs, cs + " B")
with open("%s/ratios" % d, "a") as f:
    f.write("file end, %s clusters, cycle %s\tqemu-nbd\t%.3f\tlower\n"
            % (unit, c, int(rows["ours"][-1][2]) / int(rows["qemu"][-1][2])))
EOF
done
# The ratios into bench/ratios.tsv and its chart, unless BENCH_UPDATE=0.
[ "${BENCH_UPDATE:-1}" = 0 ] ||
  /usr/bin/python3 "$top/bench/report.py" --ratios \
    "space under churn (bench/churn.sh)" < "$dir/ratios"
