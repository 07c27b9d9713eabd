#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qcow2 filter's persistent overlay against nbdkit's cow filter.
#
# 1. Same run, same plugin (nbdkit's file plugin over a raw file of
#    random data, in the page cache), fio's nbd engine over a Unix
#    socket, each server started on a fresh overlay for every case:
#      randwrite-4k   random 4 KiB writes, 16 in flight
#      randread-4k    random 4 KiB reads, 16 in flight
#      seqread-1m     sequential 1 MiB reads, one at a time
#      seqread-1m-qd4 the same, 4 in flight
#    Servers: overlay (--filter=qcow2 qcow2-overlay=FILE, a new FILE)
#    and cow (--filter=cow), in a rotated order every round.  Goal:
#    overlay within 10% of cow (ratio overlay/cow at least 0.9).  Each
#    run does a fixed amount of work (SECONDS sets it: 20,000 4 KiB
#    requests or 400 MiB a second), and nbdkit's CPU time (user +
#    system, from /proc) per unit of it is shown too: on a loaded
#    machine the rates vary from run to run, what a request costs
#    much less.
# 2. Copy-on-read over slow storage: our latency filter adds 2 ms to
#    every read of the plugin, under --filter=qcow2 qcow2-overlay=FILE
#    qcow2-overlay-on-read=true; a first pass over the whole disk, then
#    a second (FILE now holds it all), by fio's sequential reads of 64
#    KiB, 256 KiB and 1 MiB one at a time, of 1 MiB 16 at a time, and
#    by nbdcopy to null: (its defaults: 4 connections, 64 requests in
#    flight each).  Goal: the second pass at least 10 times as fast as
#    the first.  The cow filter with cow-on-read=true (which keeps what
#    it copies in its temporary file) in the same run, for comparison.
#
# Usage: bench/overlay.sh [ROUNDS [SECONDS [SIZE [SIZE2]]]]
#   (default 5 rounds of 5 s of work on a 1G disk; part 2, up to 3 rounds, on
#   SIZE2, default 512M; ROUNDS 0: part 2 only, once)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
qf=$top/filters/qcow2/.libs/nbdkit-qcow2-filter.so
lat=$top/filters/latency/.libs/nbdkit-latency-filter.so
export PATH=/usr/bin:$PATH
rounds=${1:-5} secs=${2:-5} size=${3:-1G} size2=${4:-512M}
rounds2=$(( rounds > 3 ? 3 : rounds > 0 ? rounds : 1 ))
work=$(mktemp -d /var/tmp/overlay-bench.XXXXXX)
pid=
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT
sock=$work/sock base=$work/base.raw ov=$work/ov.qcow2

head -c "$(numfmt --from=iec "$size")" /dev/urandom > "$base"
head -c "$(numfmt --from=iec "$size2")" /dev/urandom > "$work/base2.raw"
cat "$base" "$work/base2.raw" > /dev/null      # into the page cache

start ()
{
  rm -f "$sock" "$ov"
  case $1 in
    overlay) nbdkit -f -U "$sock" --filter="$qf" file "$base" \
               qcow2-overlay="$ov" & ;;
    cow) nbdkit -f -U "$sock" --filter=cow file "$base" & ;;
  esac
  pid=$!
  for _ in $(seq 200); do [ -S "$sock" ] && return; sleep 0.05; done
  echo "$1 did not start" >&2; exit 1
}

stop ()
{
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
}

# fio_run ARGS...: fio's MiB/s and IOPS for the server running.
fio_run ()
{
  fio --name=bench --ioengine=nbd --uri="nbd+unix:///?socket=$sock" \
    "$@" --output-format=json --output="$work/fio.json" > /dev/null
  /usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
print("%.1f %d" % ((j["read"]["bw"] + j["write"]["bw"]) / 1024,
                   round(j["read"]["iops"] + j["write"]["iops"])))' "$work/fio.json"
}

# cpu_ticks: the CPU time nbdkit used so far, in clock ticks.
cpu_ticks ()
{
  awk '{ print $14 + $15 }' "/proc/$pid/stat"
}

# run CASE: IOPS (4k) or MiB/s (1m) of a fio run of fixed work, and
# nbdkit's CPU milliseconds per 1000 requests (4k) or per GiB (1m).
run ()
{
  local args r c0 c1 amount
  case $1 in
    randwrite-4k) args=(--rw=randwrite --bs=4k --iodepth=16) ;;
    randread-4k) args=(--rw=randread --bs=4k --iodepth=16) ;;
    seqread-1m) args=(--rw=read --bs=1M --iodepth=1) ;;
    seqread-1m-qd4) args=(--rw=read --bs=1M --iodepth=4) ;;
  esac
  case $1 in *4k) amount=$(( secs * 20000 * 4 ))k ;; *) amount=$(( secs * 400 ))m ;; esac
  c0=$(cpu_ticks)
  r=$(fio_run "${args[@]}" --io_size="$amount")
  c1=$(cpu_ticks)
  echo "$r $(( c1 - c0 )) $(getconf CLK_TCK) $secs" | awk -v k="$1" '{
    ms = $3 * 1000 / $4
    if (k ~ /4k$/) printf "%d %.1f\n", $2, ms / ($5 * 20)
    else printf "%.1f %.1f\n", $1, ms / ($5 * 400 / 1024) }'
}

cases="randwrite-4k randread-4k seqread-1m seqread-1m-qd4"
servers=(overlay cow)
: > "$work/results"
: > "$work/ratios"
[ "$rounds" -gt 0 ] || cases=
for r in $(seq "$rounds"); do
  for c in $cases; do
    for k in 0 1; do
      s=${servers[$(( (k + r) % 2 ))]}
      start "$s"
      v=$(run "$c")
      stop
      echo "$c $s $v" >> "$work/results"
      echo "round $r $c $s: $v" >&2
    done
  done
done

[ -z "$cases" ] ||
  printf '%s\n\n%s\n%s\n' "Part 1: against --filter=cow over the file plugin, $size disk, a fresh overlay each run" \
    "| case | unit | overlay | cow | overlay/cow | CPU unit | overlay CPU | cow CPU | cow/overlay CPU |" \
    "|---|---|---|---|---|---|---|---|---|"
for c in $cases; do
  /usr/bin/python3 -c '
import statistics, sys
c = sys.argv[1]
v = {"overlay": [], "cow": []}
cpu = {"overlay": [], "cow": []}
for line in open(sys.argv[2]):
    n, s, x, y = line.split()
    if n == c:
        v[s].append(float(x))
        cpu[s].append(float(y))
o, w = statistics.median(v["overlay"]), statistics.median(v["cow"])
co, cw = statistics.median(cpu["overlay"]), statistics.median(cpu["cow"])
unit = "IOPS" if c.endswith("4k") else "MiB/s"
cunit = "ms/1000 req" if c.endswith("4k") else "ms/GiB"
print(f"| {c} | {unit} | {o:.0f} | {w:.0f} | {o / w:.2f} | {cunit} | {co:.1f} | {cw:.1f} | {cw / co:.2f} |")
what = {"randread-4k": "random 4 KiB reads, QD16",
        "randwrite-4k": "random 4 KiB writes, QD16",
        "seqread-1m": "sequential 1 MiB reads, QD1",
        "seqread-1m-qd4": "sequential 1 MiB reads, QD4"}[c]
with open(sys.argv[3], "a") as f:
    f.write(f"{what}\tnbdkit cow filter\t{o / w:.3f}\thigher\n")' "$c" "$work/results" \
    "$work/ratios"
done
[ -z "$cases" ] || echo "(medians of $rounds rounds; $(nproc) CPUs)"

# Part 2: two passes with copy-on-read over 2 ms of latency.
start_cor ()
{
  rm -f "$sock" "$ov"
  case $1 in
    overlay) nbdkit -f -U "$sock" --filter="$qf" --filter="$lat" file \
               "$work/base2.raw" latency-read=2ms qcow2-overlay="$ov" \
               qcow2-overlay-on-read=true & ;;
    cow) nbdkit -f -U "$sock" --filter=cow --filter="$lat" file \
           "$work/base2.raw" latency-read=2ms cow-on-read=true & ;;
  esac
  pid=$!
  for _ in $(seq 200); do [ -S "$sock" ] && return; sleep 0.05; done
  echo "the copy-on-read overlay did not start" >&2; exit 1
}

# pass HOW: seconds for one pass over the disk (fio's: the size over
# its bandwidth, without its start; nbdcopy's: the wall time).
pass ()
{
  local t0 t1 r
  case $1 in
    fio-*)
      # fio-BS-qdN
      local bs=${1#fio-} qd=${1##*-qd}
      r=$(fio_run --rw=read --bs="${bs%-qd*}" --iodepth="$qd")
      echo "${r% *}" | awk -v mib="$(( $(numfmt --from=iec "$size2") >> 20 ))" \
        '{ printf "%.3f\n", mib / $1 }' ;;
    nbdcopy)
      t0=$(date +%s.%N)
      nbdcopy "nbd+unix:///?socket=$sock" null:
      t1=$(date +%s.%N)
      echo "$t0 $t1" | awk '{ printf "%.3f\n", $2 - $1 }' ;;
  esac
}

echo
echo "Part 2: qcow2-overlay-on-read=true over 2 ms a read below, $size2 disk"
echo
echo "| pass by | overlay first s | second s | first/second | cow-on-read first s | second s | first/second |"
echo "|---|---|---|---|---|---|---|"
: > "$work/passes"
for r in $(seq "$rounds2"); do
  for how in fio-64k-qd1 fio-256k-qd1 fio-1m-qd1 fio-1m-qd16 nbdcopy; do
    for k in 0 1; do
      s=${servers[$(( (k + r) % 2 ))]}
      start_cor "$s"
      first=$(pass "$how")
      second=$(pass "$how")
      stop
      # FILE records our own backing name, which QEMU refuses: checked
      # alone, as the filter's man page says.
      [ "$s" = cow ] ||
        qemu-img check -q "json:{\"file\":{\"filename\":\"$ov\"},\"backing\":null}"
      echo "$how $s $first $second" >> "$work/passes"
      echo "round $r $how $s: $first $second" >&2
    done
  done
done
/usr/bin/python3 -c '
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    how, s, a, b = line.split()
    rows.setdefault(how, {}).setdefault(s, []).append((float(a), float(b)))
out = open(sys.argv[2], "a")
for how, sv in rows.items():
    cells, med = [], {}
    for s in ("overlay", "cow"):
        a = statistics.median(x for x, _ in sv[s])
        b = statistics.median(y for _, y in sv[s])
        med[s] = (a, b)
        cells.append("%.3f | %.3f | %.1f" % (a, b, a / b))
    print("| %s | %s |" % (how, " | ".join(cells)))
    for i, p in enumerate(("first", "second")):
        out.write("%s on-read pass, %s\tcow-on-read, its %s pass\t%.3f\tlower\n"
                  % (p, how, p, med["overlay"][i] / med["cow"][i]))
' "$work/passes" "$work/ratios"
echo "(medians of $rounds2 rounds)"
# The ratios against the cow filter into bench/ratios.tsv and its
# chart, unless BENCH_UPDATE=0.
[ "${BENCH_UPDATE:-1}" = 0 ] ||
  /usr/bin/python3 "$top/bench/report.py" --ratios \
    "persistent overlay (bench/overlay.sh)" < "$work/ratios"
