#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Where a flush64 write's time goes with cache=none: bench/run.sh's
# flush64-seqwrite job (64 KiB sequential writes at QD1 into an empty
# 1 GiB image, a flush every 64, 512 MiB: every write allocates)
# against ours with cache=none, with nbdkit's default threads and with
# -t 1, and qemu-nbd --cache=none --aio=native, in interleaved rounds
# on fresh images.  Per server and round: write IOPS; fio's mean
# submission latency (slat: from the request's start until the
# client's send returns, which on 2 cores includes the server's work
# until it blocks), completion latency (clat) and flush latency; and
# the server's CPU time (user + system) a write.
# Usage: bench/flush-latency.sh [ROUNDS [LAZY]]   (default 5 rounds,
# lazy_refcounts=on)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
export PATH=$top:/usr/bin:$PATH
rounds=${1:-5} lazy=${2:-on}
for prog in fio jq qemu-img qemu-nbd nbdkit /usr/bin/python3; do
  command -v "$prog" >/dev/null || { echo "$0: $prog is needed" >&2; exit 1; }
done
work=$(mktemp -d /var/tmp/flush-latency.XXXXXX)
trap '[ ! -s "$work/pid" ] || kill "$(cat "$work/pid")" 2>/dev/null
      rm -rf "$work"' EXIT
echo "bench/flush-latency.sh: $rounds rounds, lazy_refcounts=$lazy;" \
  "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start"

# one SERVER: a run on a fresh image; prints its line.
one ()
{
  local server=$1 img=$work/img.qcow2 sock=$work/sock pid cpu
  rm -f "$img" "$sock"
  qemu-img create -q -f qcow2 -o lazy_refcounts="$lazy" "$img" 1G
  sync "$img"
  case $server in
    ours) nbdkit -f -U "$sock" qcow2 "file=$img" cache=none & ;;
    ours-t1) nbdkit -f -t 1 -U "$sock" qcow2 "file=$img" cache=none & ;;
    qemu-nbd)
      qemu-nbd -t -e 8 -k "$sock" --cache=none --aio=native --image-opts \
        "driver=qcow2,file.driver=file,file.filename=$img" & ;;
  esac
  pid=$!
  echo "$pid" > "$work/pid"
  for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
  fio --name=flush64 --ioengine=nbd --uri="nbd+unix:///?socket=$sock" \
    --rw=write --bs=64k --iodepth=1 --fsync=64 --io_size=512M \
    --output-format=json --output="$work/fio.json" >/dev/null \
    2>"$work/fio.err" || {
    echo "$0: fio failed with $server:" >&2
    cat "$work/fio.err" >&2
    exit 1
  }
  # The server's CPU time, clock ticks, from its start to the job's end.
  cpu=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
  kill "$pid"
  wait "$pid" 2>/dev/null || :
  : > "$work/pid"
  jq -r --arg s "$server" --argjson cpu "$cpu" \
    --argjson hz "$(getconf CLK_TCK)" '.jobs[0] as $j | [$s,
      ($j.write.iops | floor), ($j.write.slat_ns.mean / 1000 | floor),
      ($j.write.clat_ns.mean / 1000 | floor),
      ($j.sync.lat_ns.mean / 1000 | floor),
      ($cpu / $hz * 1e6 / $j.write.total_ios | floor)] | @tsv' \
    "$work/fio.json"
}

printf 'server\tIOPS\tslat us\tclat us\tflush us\tCPU us a write\n'
for r in $(seq "$rounds"); do
  for s in ours ours-t1 qemu-nbd; do one "$s" >> "$work/all"; done
done
cat "$work/all"
echo "medians:"
/usr/bin/python3 -c '
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
for s in ("ours", "ours-t1", "qemu-nbd"):
    mine = [r for r in rows if r[0] == s]
    print("\t".join([s] + ["%g" % statistics.median(float(r[i]) for r in mine)
                           for i in range(1, 6)]))' "$work/all"
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at end"
