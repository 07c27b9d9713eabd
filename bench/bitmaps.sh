#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The cost of keeping persistent dirty bitmaps up to date:
# random 4 KiB writes at QD16 into a written image, without bitmaps and
# with two enabled ones (64 KiB and 512-byte granularity), through our
# plugin and, for reference, qemu-nbd, in interleaved rounds (servers
# in a rotated order) so that the machine's load falls on all alike.
#
# Usage, from the top of a built tree:
#   bench/bitmaps.sh [ROUNDS [SECONDS [SIZE]]]     default 5 3 1G
# Environment: BENCH_DIR (default /var/tmp/nbdkit-qcow2-bench), where
# the images are made (and kept).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
plugin=$top/plugins/qcow2/.libs/nbdkit-qcow2-plugin.so
export PATH=/usr/bin:$PATH
rounds=${1:-5} runtime=${2:-3} size=${3:-1G}
dir=${BENCH_DIR:-/var/tmp/nbdkit-qcow2-bench}/bitmaps
mkdir -p "$dir"
sock=$dir/sock results=$dir/results.tsv
: > "$results"

master=$dir/master.qcow2 plain=$dir/plain.qcow2 marked=$dir/bitmaps.qcow2
if [ ! -f "$master" ] || [ "$(qemu-img info --output=json "$master" |
                              jq '."virtual-size"')" != "$(numfmt --from=iec "$size")" ]; then
  "$top/bench/mkimage.sh" full "$size" "$master" "$dir/master.raw"
  rm -f "$dir/master.raw"
fi

start ()
{
  local server=$1 img=$2 i
  rm -f "$sock"
  case $server in
    ours) nbdkit -f -U "$sock" "$plugin" "file=$img" & ;;
    qemu) qemu-nbd -t -e 8 -k "$sock" --cache=writeback --aio=threads \
            -f qcow2 "$img" & ;;
  esac
  pid=$!
  for i in $(seq 200); do
    [ -S "$sock" ] && return 0
    sleep 0.05
  done
  echo "$0: $server did not start" >&2
  exit 1
}

runs=("ours plain" "ours bitmaps" "qemu plain" "qemu bitmaps")
for round in $(seq "$rounds"); do
  # Fresh copies, fresh bitmaps each round: every run starts from the
  # same state (clean bitmaps, nothing in use), and both files are
  # written out in full (no holes for the host file system to fill).
  cp --sparse=never "$master" "$plain"
  cp --sparse=never "$master" "$marked"
  qemu-img bitmap --add -g 65536 "$marked" coarse
  qemu-img bitmap --add -g 512 "$marked" fine
  for k in $(seq 0 3); do
    set -- ${runs[$(( (k + round) % 4 ))]}
    img=$plain
    [ "$2" = bitmaps ] && img=$marked
    sync
    start "$1" "$img"
    fio --name=bm --ioengine=nbd --uri="nbd+unix:///?socket=$sock" \
        --rw=randwrite --bs=4k --iodepth=16 --time_based \
        --runtime="$runtime" --ramp_time=1 --output-format=json \
        --output="$dir/fio.json" >/dev/null
    kill "$pid"
    wait "$pid" || :
    iops=$(jq -r '.jobs[0].write.iops' "$dir/fio.json")
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$round" "$iops" >> "$results"
    echo "round $round: $1 $2: $iops IOPS"
  done
  qemu-img info "$marked" | grep -q in-use &&
    { echo "$0: bitmaps left in use" >&2; exit 1; }
done

median () { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
m () { awk -F'\t' -v s="$1" -v i="$2" '$1 == s && $2 == i { print $4 }' "$results" | median; }
op=$(m ours plain) ob=$(m ours bitmaps) qp=$(m qemu plain) qb=$(m qemu bitmaps)
echo
echo "median write IOPS over $rounds rounds of ${runtime}s, randwrite 4 KiB QD16, $size image"
printf '%-6s %12s %12s %10s\n' server "no bitmaps" "2 bitmaps" ratio
printf '%-6s %12.0f %12.0f %10.3f\n' ours "$op" "$ob" "$(echo "$ob / $op" | bc -l)"
printf '%-6s %12.0f %12.0f %10.3f\n' qemu "$qp" "$qb" "$(echo "$qb / $qp" | bc -l)"
# The ratios into bench/ratios.tsv and its chart, unless BENCH_UPDATE=0.
[ "${BENCH_UPDATE:-1}" = 0 ] ||
  printf 'random 4 KiB writes, 2 bitmaps\tqemu-nbd\t%s\thigher\nrandom 4 KiB writes, 2 bitmaps\tours without bitmaps\t%s\thigher\n' \
    "$(echo "$ob / $qb" | bc -l)" "$(echo "$ob / $op" | bc -l)" |
  /usr/bin/python3 "$top/bench/report.py" --ratios \
    "persistent bitmaps (bench/bitmaps.sh)"
