#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Encrypted throughput: our plugin against qemu-nbd on the same
# LUKS-encrypted image (qemu-img's default setup, aes-256 xts plain64,
# 64 KiB clusters, every cluster allocated), in the same run, fio's nbd
# engine over a Unix socket:
#   randread-4k    random 4 KiB reads, 16 in flight
#   randwrite-4k   random 4 KiB writes, 16 in flight (in place)
#   seqread-1m     sequential 1 MiB reads, one at a time
#   seqread-1m-qd4 the same, 4 in flight
# Servers: ours (nbdkit qcow2 file=IMG password=+FILE, its defaults) and
# qemu-wb (qemu-nbd --cache=writeback --aio=threads -e 8 --object
# secret --image-opts ...,encrypt.key-secret=), each run in turn, in a
# rotated order every round.  Prints the median of each and the ratio.
#
# Usage: bench/luks.sh [ROUNDS [SECONDS [SIZE]]]   (default 5 5 1G)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
plugin=$top/plugins/qcow2/.libs/nbdkit-qcow2-plugin.so
export PATH=/usr/bin:$PATH
rounds=${1:-5} secs=${2:-5} size=${3:-1G}
work=$(mktemp -d /var/tmp/luks-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
sock=$work/sock img=$work/luks.qcow2
printf 'bench-password' > "$work/pw"

# Incompressible data over the whole disk, converted into an encrypted
# image by qemu-img (tried again: its PBKDF2 timing sometimes fails).
head -c "$(numfmt --from=iec "$size")" /dev/urandom > "$work/src.raw"
for i in $(seq 60); do
  qemu-img convert -f raw -O qcow2 --object "secret,id=sec0,file=$work/pw" \
    -o encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=100,cluster_size=64k \
    "$work/src.raw" "$img" 2> "$work/err" && break
  grep -q "accurate CPU usage" "$work/err" || { cat "$work/err"; exit 1; }
done
rm "$work/src.raw"

start ()
{
  rm -f "$sock"
  case $1 in
    ours) nbdkit -f -U "$sock" "$plugin" "file=$img" "password=+$work/pw" & ;;
    qemu-wb) qemu-nbd -t -e 8 -k "$sock" --cache=writeback --aio=threads \
               --object "secret,id=sec0,file=$work/pw" --image-opts \
               "driver=qcow2,file.filename=$img,encrypt.key-secret=sec0" & ;;
  esac
  pid=$!
  for _ in $(seq 200); do [ -S "$sock" ] && return; sleep 0.05; done
  echo "$1 did not start" >&2; exit 1
}

stop ()
{
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

# run CASE: fio's IOPS (4k) or MiB/s (1m) for the server running.
run ()
{
  local args
  case $1 in
    randread-4k) args=(--rw=randread --bs=4k --iodepth=16) ;;
    randwrite-4k) args=(--rw=randwrite --bs=4k --iodepth=16) ;;
    seqread-1m) args=(--rw=read --bs=1M --iodepth=1) ;;
    seqread-1m-qd4) args=(--rw=read --bs=1M --iodepth=4) ;;
  esac
  fio --name="$1" --ioengine=nbd --uri="nbd+unix:///?socket=$sock" \
    "${args[@]}" --time_based --runtime="$secs" --ramp_time=1 \
    --output-format=json --output="$work/fio.json" >/dev/null
  /usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
print(round(j["read"]["iops"] + j["write"]["iops"]) if sys.argv[2].endswith("4k")
      else round((j["read"]["bw"] + j["write"]["bw"]) / 1024))' "$work/fio.json" "$1"
}

cases="randread-4k randwrite-4k seqread-1m seqread-1m-qd4"
servers=(ours qemu-wb)
: > "$work/results"
for r in $(seq "$rounds"); do
  for c in $cases; do
    for k in 0 1; do
      s=${servers[$(( (k + r) % 2 ))]}
      sync "$img"
      start "$s"
      v=$(run "$c")
      stop
      echo "$c $s $v" >> "$work/results"
      echo "round $r $c $s: $v" >&2
    done
  done
done

echo "| case | unit | ours | qemu-nbd | ours/qemu-nbd |"
echo "|---|---|---|---|---|"
for c in $cases; do
  /usr/bin/python3 -c '
import statistics, sys
c = sys.argv[1]
v = {"ours": [], "qemu-wb": []}
for line in open(sys.argv[2]):
    n, s, x = line.split()
    if n == c:
        v[s].append(float(x))
o, q = statistics.median(v["ours"]), statistics.median(v["qemu-wb"])
unit = "IOPS" if c.endswith("4k") else "MiB/s"
what = {"randread-4k": "random 4 KiB reads, QD16",
        "randwrite-4k": "random 4 KiB writes, QD16",
        "seqread-1m": "sequential 1 MiB reads, QD1",
        "seqread-1m-qd4": "sequential 1 MiB reads, QD4"}[c]
with open(sys.argv[3], "a") as f:
    f.write(f"{what}\tqemu-nbd\t{o / q:.3f}\thigher\n")
print(f"| {c} | {unit} | {o:.0f} | {q:.0f} | {o / q:.2f} |")' "$c" "$work/results" \
    "$work/ratios"
done
echo "(medians of $rounds rounds of $secs s; $size image; $(nproc) CPUs)"
# The ratios into bench/ratios.tsv and its chart, unless BENCH_UPDATE=0.
[ "${BENCH_UPDATE:-1}" = 0 ] ||
  /usr/bin/python3 "$top/bench/report.py" --ratios "LUKS (bench/luks.sh)" \
    < "$work/ratios"
