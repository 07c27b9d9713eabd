#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What a VM's throughput pays for the two knobs of a fleet's memory
# (bench/fleet.sh): nbdkit's threads a connection (-t) and the longest
# request the plugin advertises (max-request=).  One 1 GiB qcow2 image
# served by each configuration in turn, in interleaved rounds, driven
# by QEMU's own client (qemu-img bench, which cuts its requests at the
# server's advertised maximum as a VM's disk does) and by fio:
#   write-4m   4 MiB sequential writes, 16 in flight, over the whole
#              image, then a flush: its second pass (the first, not
#              timed, allocates its clusters and page cache: a page
#              allocated after the VM's balloon gave memory back to the
#              host costs three times as much, at random)
#   read-4m    4 MiB sequential reads of the data just written, 16 in
#              flight (the page cache)
#   read-4m-qd1  the same one at a time (each request's own latency:
#              QEMU sends the pieces of one request one after another)
#   randread-4k  fio 4 KiB random reads, 16 in flight, 3 s
# and the server's peak memory (VmHWM) over the run.
# Configurations (REQUESTS_CONFIGS, default all): NAME:NBDKIT-OPTS:KEYS
# with commas for spaces, e.g. "t1:-t,1:max-request=256K".
# Usage: bench/requests.sh [ROUNDS]   (default 3, about 6 minutes)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
export PATH=/usr/bin:$PATH
rounds=${1:-3}
configs=${REQUESTS_CONFIGS:-"default:: mmap1m::malloc-mmap-threshold=1M \
max1m::max-request=1M max256k::max-request=256K t2:-t,2: \
t2-max1m:-t,2:max-request=1M t1:-t,1: t1-max1m:-t,1:max-request=1M \
t1-max256k:-t,1:max-request=256K"}
plugin=$top/plugins/qcow2/.libs/nbdkit-qcow2-plugin.so
work=$(mktemp -d /var/tmp/requests-bench.XXXXXX)
trap 'bench_kill_pidfiles "$work/s.pid"; rm -rf "$work"' EXIT
sock=$work/s.sock uri="nbd+unix:///?socket=$work/s.sock"
echo "bench/requests.sh: $rounds round(s); $(nproc) cores, load average" \
  "$(bench_load) at start"

# one CONFIG: a run; prints write-4m, read-4m and read-4m-qd1 MiB/s,
# randread-4k IOPS and the peak memory in MiB.
one ()
{
  local opts keys t0 t1 t2 t3 w r r1 q hwm
  IFS=: read -r _ opts keys <<< "$1"
  rm -f "$work/img.qcow2" "$sock" "$work/s.pid"
  qemu-img create -q -f qcow2 "$work/img.qcow2" 1G
  nbdkit ${opts//,/ } -U "$sock" -P "$work/s.pid" "$plugin" \
    file="$work/img.qcow2" ${keys//,/ }
  bench_wait_sock "$sock" "$work/s.pid"
  qemu-img bench -w -f raw -s 4M -d 16 -c 256 "$uri" > /dev/null
  t0=$(date +%s.%N)
  qemu-img bench -w -f raw -s 4M -d 16 -c 256 "$uri" > /dev/null
  qemu-io -f raw -c flush "$uri" > /dev/null
  t1=$(date +%s.%N)
  qemu-img bench -f raw -s 4M -d 16 -c 256 "$uri" > /dev/null
  t2=$(date +%s.%N)
  qemu-img bench -f raw -s 4M -d 1 -c 128 "$uri" > /dev/null
  t3=$(date +%s.%N)
  q=$(bench_fio_read "$uri" randread 4k 16 3)
  hwm=$(awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' \
          "/proc/$(cat "$work/s.pid")/status")
  bench_kill_pidfiles "$work/s.pid"
  w=$(echo "1024 / ($t1 - $t0)" | bc -l)
  r=$(echo "1024 / ($t2 - $t1)" | bc -l)
  r1=$(echo "512 / ($t3 - $t2)" | bc -l)
  printf '%.0f %.0f %.0f %s %s\n' "$w" "$r" "$r1" "$q" "$hwm"
}

declare -A res
names=()
for c in $configs; do names+=("${c%%:*}"); done
for round in $(seq "$rounds"); do
  for c in $(bench_order "$round" $configs); do
    read -r w r r1 q hwm <<< "$(one "$c")"
    n=${c%%:*}
    res[$n,w]+="$w " res[$n,r]+="$r " res[$n,r1]+="$r1 " res[$n,q]+="$q "
    res[$n,m]+="$hwm "
  done
done

m () { bench_median "${res[$1]}"; }
ratio () { printf '%.2f' "$(echo "$1 / $2" | bc -l)"; }
first=${names[0]}
echo "load average $(bench_load) at end; medians of $rounds round(s);" \
  "ratios against $first"
echo "| configuration | nbdkit options, keys | write 4 MiB QD16 MiB/s | read 4 MiB QD16 MiB/s | read 4 MiB QD1 MiB/s | randread 4 KiB QD16 IOPS | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|"
for c in $configs; do
  n=${c%%:*}
  IFS=: read -r _ opts keys <<< "$c"
  echo "| $n | ${opts//,/ } ${keys//,/ } |" \
    "$(m "$n,w") ($(ratio "$(m "$n,w")" "$(m "$first,w")")) |" \
    "$(m "$n,r") ($(ratio "$(m "$n,r")" "$(m "$first,r")")) |" \
    "$(m "$n,r1") ($(ratio "$(m "$n,r1")" "$(m "$first,r1")")) |" \
    "$(m "$n,q") ($(ratio "$(m "$n,q")" "$(m "$first,q")")) |" \
    "$(m "$n,m") |"
done
echo "all rounds:"
for k in "${!res[@]}"; do echo "$k: ${res[$k]}"; done | sort
