#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# How the cost grows with the work, ours (our plugin) against qemu-nbd
# on the same images, in interleaved rounds (medians):
#   alloc   random 4 KiB writes, QD16, no client flush, to a new 1 TiB
#           image (64 KiB clusters: 128 MiB of L2 tables, 32 MiB of
#           default cache), once allocation has passed the cache: IOPS,
#           and fdatasyncs (strace -f -c over 16,384 writes after as
#           many to warm up, the client's disconnect included)
#   conns   random 4 KiB overwrites, QD4 per connection, of a 1 GiB
#           preallocated image, from 1 and 64 connections: IOPS, server
#           CPU per write (us; its growth both as the ratio of the medians
#           and as the median of each round's own ratio) and peak memory
#           per connection (KiB);
#           ours also with nbdkit -t 2 and -t 1 (-t 1: no worker
#           threads, a connection's requests served one at a time), and
#           nbdkit's file plugin on a raw file of the same size (what
#           nbdkit's threads cost alone)
#   layers  chains of 1, 10, 100 and 1,000 images of 1 GiB (each with
#           one cluster of data of its own): time from the server's start
#           to a first 4 KiB read of the bottom's cluster, and peak RSS
#   tables  empty images of 1 GiB, 1 TiB and the largest qemu-img makes
#           with 64 KiB clusters (2 PiB: a 32 MiB L1 table): time to a
#           first read and peak RSS
# Usage: bench/scale.sh [ROUNDS [SECONDS]]   (default 3 rounds of 10 s;
# SCALE_CASES="alloc conns layers tables" runs only those; for conns,
# SCALE_SERVERS="ours-t2 qemu-nbd" only those servers, qemu-nbd among them;
# file-t2 and file-t1 are the file plugin with nbdkit -t 2 and -t 1)
# The ratios (ours/qemu-nbd; times and memory: qemu-nbd/ours, so that
# above 1 is ours better) go into bench/ratios.tsv unless BENCH_UPDATE=0.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
export PATH=$top:/usr/bin:$PATH
rounds=${1:-3} secs=${2:-10}
work=$(mktemp -d /var/tmp/scale-bench.XXXXXX)
spid=
trap '[ -z "$spid" ] || kill "$spid" 2>/dev/null || true; rm -rf "$work"' EXIT
cases=${SCALE_CASES:-alloc conns layers tables}
conns_servers=${SCALE_SERVERS:-ours ours-t2 ours-t1 file qemu-nbd}

# start SERVER IMAGE [ARGS]: the server on $work/s.sock, $spid its pid.
# SERVER ours or file, with -tN for nbdkit -t N (ours-t2), or qemu-nbd.
start ()
{
  local server=$1 img=$2 threads=(); shift 2
  rm -f "$work/s.sock" "$work/s.pid"
  case $server in
    *-t*) threads=(-t "${server##*-t}"); server=${server%-t*} ;;
  esac
  case $server in
    ours)
      nbdkit "${threads[@]}" -U "$work/s.sock" -P "$work/s.pid" "$@" \
        qcow2 "$img" ;;
    file)
      nbdkit "${threads[@]}" -U "$work/s.sock" -P "$work/s.pid" "$@" \
        file "${img%.qcow2}.raw" ;;
    qemu-nbd)
      qemu-nbd -t -f qcow2 --cache=writeback -e 0 -k "$work/s.sock" \
        --pid-file="$work/s.pid" "$img" >/dev/null 2>&1 & ;;
  esac
  for i in $(seq 600); do
    [ -S "$work/s.sock" ] && [ -s "$work/s.pid" ] && break; sleep 0.05
  done
  spid=$(cat "$work/s.pid")
}
stop ()
{
  kill "$spid"
  while kill -0 "$spid" 2>/dev/null; do sleep 0.05; done
  spid=
}
uri () { echo "nbd+unix:///?socket=$work/s.sock"; }
cpu_ticks () { awk '{ print $14 + $15 }' "/proc/$spid/stat"; }
hwm_kib () { awk '/^VmHWM/ { print $2 }' "/proc/$spid/status"; }

# fio_json ARGS: IOPS of the writes, one number.
fio_iops ()
{
  fio --name=w --ioengine=nbd --uri="$(uri)" --output-format=json "$@" \
      2>/dev/null |
    /usr/bin/python3 -c '
import json, sys
out = sys.stdin.read()
jobs = json.loads(out[out.index("{"):])["jobs"]
print("%.0f" % sum(j["write"]["iops"] for j in jobs))'
}

median () { printf '%s\n' $1 | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
declare -A res
add () { res[$1]+="$2 "; }

# alloc: a fresh 1 TiB image per run (removed at the end: removing a
# file of many extents takes long on a loaded machine).
alloc_img ()
{
  local img
  img=$(mktemp -u --suffix=.qcow2 "$work/aXXXXXX")
  qemu-img create -q -f qcow2 "$img" 1T
  echo "$img"
}
alloc_one ()
{
  local s=$1
  start "$s" "$(alloc_img)"
  # Past the cache: the first 16,384 writes fill it (its 8,192 slices).
  fio_iops --rw=randwrite --bs=4k --iodepth=16 --number_ios=16384 >/dev/null
  add "alloc,$s" "$(fio_iops --rw=randwrite --bs=4k --iodepth=16 \
                      --time_based --runtime="$secs")"
  stop
}
alloc_syncs ()
{
  local s=$1 n
  start "$s" "$(alloc_img)"
  fio_iops --rw=randwrite --bs=4k --iodepth=16 --number_ios=16384 >/dev/null
  strace -q -f -c -e trace=fdatasync -p "$spid" -o "$work/strace" &
  local tpid=$!
  sleep 1
  fio_iops --rw=randwrite --bs=4k --iodepth=16 --number_ios=16384 >/dev/null
  kill -INT "$tpid"; wait "$tpid" 2>/dev/null || true
  n=$(awk '$NF == "fdatasync" { print $4 }' "$work/strace")
  echo "${n:-0}"
  stop
}

# conns: overwrites of a preallocated image, N connections.
conns_one ()
{
  local s=$1 n=$2 t0 t1 ios iops hwm
  start "$s" "$work/c.qcow2"
  t0=$(cpu_ticks)
  iops=$(fio_iops --rw=randwrite --bs=4k --iodepth=4 --numjobs="$n" \
           --time_based --runtime="$secs")
  t1=$(cpu_ticks)
  hwm=$(hwm_kib)
  ios=$(echo "$iops * $secs" | bc -l)
  add "conns$n,$s,iops" "$iops"
  add "conns$n,$s,cpu" "$(echo "($t1 - $t0) * 1000000 / $(getconf CLK_TCK) / $ios" | bc -l)"
  add "conns$n,$s,hwm" "$hwm"
  stop
}

# open NAME IMAGE SERVER OFFSET: seconds to the first read, and peak KiB.
open_one ()
{
  local name=$1 img=$2 s=$3 off=$4 t0 t1
  t0=$(date +%s.%N)
  start "$s" "$img"
  nbdsh -u "$(uri)" -c "h.pread(4096, $off)"
  t1=$(date +%s.%N)
  add "$name,$s,time" "$(echo "$t1 - $t0" | bc -l)"
  add "$name,$s,hwm" "$(hwm_kib)"
  stop
}

# A chain of n images over base (bottom first), made by patching the
# backing name of one template: qemu-img create for each is too slow.
make_chain ()
{
  local n=$1
  qemu-img create -q -f qcow2 "$work/l0000.qcow2" 1G
  qemu-io -f qcow2 -c 'write -P 0x42 0 64k' "$work/l0000.qcow2" >/dev/null
  qemu-img create -q -u -f qcow2 -b l9999.qcow2 -F qcow2 "$work/tmpl.qcow2" 1G
  /usr/bin/python3 - "$work" "$n" <<'EOF'
import sys
work, n = sys.argv[1], int(sys.argv[2])
t = open(work + "/tmpl.qcow2", "rb").read()
for i in range(1, n):
    open("%s/l%04d.qcow2" % (work, i), "wb").write(
        t.replace(b"l9999.qcow2", b"l%04d.qcow2" % (i - 1)))
EOF
}

for c in $cases; do
  case $c in
    conns)
      qemu-img create -q -f qcow2 -o preallocation=metadata "$work/c.qcow2" 1G
      qemu-img create -q -f raw -o preallocation=falloc "$work/c.raw" 1G ;;
    layers) make_chain 1000 ;;
    tables)
      qemu-img create -q -f qcow2 "$work/t1g.qcow2" 1G
      qemu-img create -q -f qcow2 "$work/t1t.qcow2" 1T
      qemu-img create -q -f qcow2 "$work/t2p.qcow2" 2P ;;
  esac
done

for r in $(seq "$rounds"); do
  for c in $cases; do
    case $c in
      alloc) for s in ours qemu-nbd; do alloc_one $s; done ;;
      conns)
        for n in 1 64; do
          for s in $conns_servers; do conns_one $s $n; done
        done ;;
      layers)
        for n in 1 10 100 1000; do
          for s in ours qemu-nbd; do
            open_one "layers$n" "$work/l$(printf %04d $((n - 1))).qcow2" $s 0
          done
        done ;;
      tables)
        for t in 1g 1t 2p; do
          for s in ours qemu-nbd; do
            open_one "tables-$t" "$work/t$t.qcow2" $s 0
          done
        done ;;
    esac
  done
done

m () { median "${res[$1]}"; }
# paired A B: the median of the rounds' own ratios A/B (a round's two
# runs are close in time, so the machine's drift cancels).
paired ()
{
  median "$(paste <(printf '%s\n' ${res[$1]}) <(printf '%s\n' ${res[$2]}) |
            awk '{ print $1 / $2 }')"
}
ratio () { printf '%.2f' "$(echo "$1 / $2" | bc -l)"; }
: > "$work/ratios"
echo "bench/scale.sh $rounds rounds of $secs s (medians); $(nproc) cores," \
  "$(uptime | sed 's/.*load average/load average/')"
for c in $cases; do
  case $c in
    alloc)
      o=$(m alloc,ours) q=$(m alloc,qemu-nbd)
      so=$(alloc_syncs ours) sq=$(alloc_syncs qemu-nbd)
      echo "| alloc | ours IOPS | qemu-nbd IOPS | ratio | ours fdatasyncs in 16,384 writes | qemu-nbd's |"
      echo "|---|---|---|---|---|---|"
      echo "| 1 TiB, random 4 KiB QD16 | $o | $q | $(ratio "$o" "$q") | $so | $sq |"
      printf 'alloc: random 4K writes past the L2 cache\tqemu-nbd\t%s\thigher\n' \
        "$(ratio "$o" "$q")" >> "$work/ratios" ;;
    conns)
      echo "| conns | server | IOPS | CPU us/write | peak RSS KiB |"
      echo "|---|---|---|---|---|"
      for n in 1 64; do
        for s in $conns_servers; do
          printf '| %s | %s | %s | %.1f | %s |\n' "$n" "$s" \
            "$(m "conns$n,$s,iops")" "$(m "conns$n,$s,cpu")" \
            "$(m "conns$n,$s,hwm")"
        done
      done
      for s in $conns_servers; do
        printf '%s: CPU/write 64 vs 1 connection %.2f (per round %.2f); memory per extra connection %.0f KiB\n' \
          "$s" "$(echo "$(m "conns64,$s,cpu") / $(m "conns1,$s,cpu")" | bc -l)" \
          "$(paired "conns64,$s,cpu" "conns1,$s,cpu")" \
          "$(echo "($(m "conns64,$s,hwm") - $(m "conns1,$s,hwm")) / 63" | bc -l)"
      done
      for s in $conns_servers; do
        case $s in ours*) ;; *) continue ;; esac
        printf 'conns: 64 connections IOPS (%s)\tqemu-nbd\t%s\thigher\n' "$s" \
          "$(ratio "$(m "conns64,$s,iops")" "$(m "conns64,qemu-nbd,iops")")" >> "$work/ratios"
      done ;;
    layers|tables)
      if [ "$c" = layers ]; then names="layers1 layers10 layers100 layers1000"
      else names="tables-1g tables-1t tables-2p"; fi
      echo "| $c | ours s | qemu-nbd s | qemu/ours time | ours KiB | qemu-nbd KiB | qemu/ours memory |"
      echo "|---|---|---|---|---|---|---|"
      for n in $names; do
        to=$(m "$n,ours,time") tq=$(m "$n,qemu-nbd,time")
        ho=$(m "$n,ours,hwm") hq=$(m "$n,qemu-nbd,hwm")
        printf '| %s | %.3f | %.3f | %s | %s | %s | %s |\n' "$n" "$to" "$tq" \
          "$(ratio "$tq" "$to")" "$ho" "$hq" "$(ratio "$hq" "$ho")"
        printf '%s: open to a first read (time)\tqemu-nbd\t%s\thigher\n' "$n" \
          "$(ratio "$tq" "$to")" >> "$work/ratios"
        printf '%s: open to a first read (peak memory)\tqemu-nbd\t%s\thigher\n' "$n" \
          "$(ratio "$hq" "$ho")" >> "$work/ratios"
      done ;;
  esac
done
[ "${BENCH_UPDATE:-1}" = 0 ] ||
  /usr/bin/python3 "$top/bench/report.py" --ratios \
    "scale (bench/scale.sh)" < "$work/ratios"
echo "all rounds:"
for k in "${!res[@]}"; do echo "$k: ${res[$k]}"; done | sort
