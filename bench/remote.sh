#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Backing files on remote storage: a qcow2 overlay (empty, a local
# file) over a base served over NBD by nbdkit's file plugin with 2 ms on
# every read (nbdkit's delay filter), read with fio's nbd engine from
#   ours      our plugin serving the overlay (the base through libnbd)
#   qemu-nbd  qemu-nbd serving the same overlay (its nbd driver)
#   direct    the raw base itself, the same client: the limit
#   proxy     nbdkit's nbd plugin in front of the base's server, a hop
#             that does nothing but forward: the floor of any server in
#             between on this machine (for the HTTP cases nbdkit's curl
#             plugin alone, as direct)
# in interleaved rounds, every other round in reverse order.  Cases:
#   seq-1m      sequential 1 MiB reads, QD1, of the overlay over a 1 GiB
#               raw base
#   rand-4k     random 4 KiB reads, QD16, of the same
#   frag-1m     sequential 1 MiB reads, QD1, of an overlay over a 1 GiB
#               qcow2 base whose 64 KiB clusters were written in random
#               order (16 pieces in its file a read); direct: the raw
#               base with the same data (one request a read)
#   http-1m     sequential 1 MiB reads, QD1, of an overlay over the raw
#               base on a web server (tests/range-server.py, 2 ms before
#               each answer): ours through nbdkit's curl plugin,
#               qemu-nbd through its curl driver, direct through
#               "nbdkit curl" alone
#   seq-256k-qd16, seq-1m-qd4
#               sequential reads with several in flight (a guest's own
#               read-ahead, qemu-img convert): 256 KiB at QD16, 1 MiB at
#               QD4, of the overlay over the raw base
#   copy, copy-noext
#               nbdcopy --connections=1 --requests=16 of the whole
#               overlay over the raw base to null:, with block status
#               and without (--no-extents); MiB/s from its time, and
#               the bytes the base served per byte copied (counted by
#               nbdkit's log filter on the base's server for these)
#               and the serving server's CPU seconds a copy
#   copy-http   the same of the overlay over the web server (counted
#               from the Range headers it was sent)
#   copy-warm, copy-http-warm
#               copy and copy-http after a first pass of the same copy
#               on the same server (what the read-ahead learnt from the
#               first pass, and kept of it, in play)
#   replay      a boot-like trace of 2,503 reads (226 MiB: scattered
#               small reads, files read in short runs, a few long runs;
#               bench/boot-trace.py) replayed one at a time from the
#               overlay over the logged raw base: MiB/s of what was
#               read, and the bytes the base served per byte read
#   replay-http the same over the web server (the bytes it served
#               counted from the Range headers it was sent)
# Usage: bench/remote.sh [ROUNDS [SECONDS]]   (default 3 rounds of 10 s;
# REMOTE_CASES="rand-4k ..." runs only those, REMOTE_SERVERS="ours
# proxy" only those servers (or builds of other trees: BENCH_TREES, see
# bench/lib.sh); REMOTE_SEED=N replays the trace bench/boot-trace.py
# makes from seed N, not 43)
# Prints MiB/s or IOPS per server (medians) and the ratios of the first
# server to the others, which go into bench/ratios.tsv and its chart
# unless BENCH_UPDATE=0 (set it when only some cases or servers run: the
# bench's rows are replaced as a whole).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
export PATH=$top:/usr/bin:$PATH
rounds=${1:-3} secs=${2:-10}
servers=${REMOTE_SERVERS:-ours qemu-nbd direct proxy}
work=$(mktemp -d /var/tmp/remote-bench.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
      bench_kill_pidfiles "$work/s.pid"; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# The images: the fragmented qcow2 base, and a raw base of its data.
"$top/bench/mkimage.sh" layout random 1G "$work/frag.qcow2" >/dev/null
qemu-img convert -O raw "$work/frag.qcow2" "$work/base.raw"
/usr/bin/python3 "$top/bench/boot-trace.py" gen 1073741824 "${REMOTE_SEED:-43}" \
  > "$work/trace"

# serve NAME ARGS...: nbdkit on $work/NAME.sock.
serve ()
{
  local name=$1; shift
  nbdkit -U "$work/$name.sock" -P "$work/$name.pid" "$@"
  bench_wait_sock "$work/$name.sock" "$work/$name.pid"
  pids+=("$(cat "$work/$name.pid")")
}
serve raw -r --filter=delay file "$work/base.raw" delay-read=2ms
serve frag -r --filter=delay file "$work/frag.qcow2" delay-read=2ms
# The same base with its reads logged, for the copy and replay cases.
serve rawlog -r --filter=log --filter=delay file "$work/base.raw" \
  delay-read=2ms logfile="$work/rawlog.log"
mkdir "$work/web"
ln -s "$work/base.raw" "$work/web/base.raw"
RANGE_SERVER_DELAY=0.002 RANGE_SERVER_LOG="$work/http.log" /usr/bin/python3 "$top/tests/range-server.py" \
  "$work/web" "$work/http.port" &
pids+=("$!")
for i in $(seq 100); do [ -s "$work/http.port" ] && break; sleep 0.1; done
url=http://127.0.0.1:$(cat "$work/http.port")/base.raw

qemu-img create -q -f qcow2 -F raw -b "nbd+unix:///?socket=$work/raw.sock" \
  "$work/ovl-raw.qcow2"
qemu-img create -q -f qcow2 -F qcow2 -b "nbd+unix:///?socket=$work/frag.sock" \
  "$work/ovl-frag.qcow2"
qemu-img create -q -f qcow2 -F raw -b "$url" "$work/ovl-http.qcow2"
qemu-img create -q -f qcow2 -F raw \
  -b "nbd+unix:///?socket=$work/rawlog.sock" "$work/ovl-rawlog.qcow2"

# served SIZE T0 T1 LOG FROM: MiB/s of SIZE bytes read from T0 to T1,
# then the bytes the logged base served (from byte FROM of LOG: nbdkit's
# log filter's, or the web server's headers) per byte read (if it served
# any).
served ()
{
  local size=$1 t0=$2 t1=$3 log=$4 from=$5
  tail -c +"$((from + 1))" "$log" |
    /usr/bin/python3 -c '
import re, sys
size, secs = int(sys.argv[1]), float(sys.argv[2])
got = 0
for line in sys.stdin:
    m = re.search(r" Read id=.* count=(0x[0-9a-f]+|[0-9]+)", line)
    if m:
        got += int(m.group(1), 0)
    m = re.match(r"Range: bytes=(\d+)-(\d+)", line)
    if m:
        got += int(m.group(2)) - int(m.group(1)) + 1
print("%.1f" % (size / secs / 1048576), "%.4f" % (got / size) if got else "")
' "$size" "$(echo "$t1 - $t0" | bc -l)"
}

# copy_run URI LOG [NBDCOPY-OPTIONS]: nbdcopy of the whole export to
# null:, as served says.
copy_run ()
{
  local uri=$1 log=$2 t0 t1 size from
  shift 2
  size=$(nbdinfo --size "$uri")
  from=$(wc -c < "$log")
  t0=$(date +%s.%N)
  nbdcopy --connections=1 --requests=16 "$@" "$uri" null:
  t1=$(date +%s.%N)
  served "$size" "$t0" "$t1" "$log" "$from"
}

# replay_run URI LOG: the boot-like trace read from URI, as served says.
replay_run ()
{
  local uri=$1 log=$2 t0 t1 size from
  from=$(wc -c < "$log")
  t0=$(date +%s.%N)
  size=$(/usr/bin/python3 "$top/bench/boot-trace.py" replay "$work/trace" "$uri")
  t1=$(date +%s.%N)
  served "$size" "$t0" "$t1" "$log" "$from"
}

# one CASE SERVER: start the server, measure, stop it; the server's CPU
# seconds in the measure into $work/cpu (copy cases; "-" for others).
one ()
{
  local case=$1 server=$2 ovl rw=read bs=1m depth=1 uri base=raw log pid c0
  case $case in
    seq-1m) ovl=ovl-raw ;;
    rand-4k) ovl=ovl-raw rw=randread bs=4k depth=16 ;;
    frag-1m) ovl=ovl-frag ;;
    http-*) ovl=ovl-http ;;
    seq-256k-qd16) ovl=ovl-raw bs=256k depth=16 ;;
    seq-1m-qd4) ovl=ovl-raw depth=4 ;;
    copy* | replay) ovl=ovl-rawlog base=rawlog ;;
    replay-http) ovl=ovl-http ;;
  esac
  case $case in copy-http*) ovl=ovl-http ;; esac
  rm -f "$work/s.sock"
  case $(bench_kind "$server") in
    ours)
      "$(bench_nbdkit "$server")" -U "$work/s.sock" -P "$work/s.pid" -r \
        qcow2 "$work/$ovl.qcow2" ;;
    qemu-nbd)
      qemu-nbd -r -t -f qcow2 -k "$work/s.sock" --pid-file="$work/s.pid" \
        "$work/$ovl.qcow2" & ;;
    direct | proxy)
      if [ "$ovl" = ovl-http ]; then
        nbdkit -U "$work/s.sock" -P "$work/s.pid" -r curl "$url"
      elif [ "$server" = proxy ]; then
        nbdkit -U "$work/s.sock" -P "$work/s.pid" -r nbd \
          socket="$work/$base.sock"
      else
        ln -s "$work/$base.sock" "$work/s.sock"
        echo > "$work/s.pid"
      fi ;;
    *) echo "$0: unknown server $server" >&2; exit 1 ;;
  esac
  bench_wait_sock "$work/s.sock" "$work/s.pid"
  uri="nbd+unix:///?socket=$work/s.sock"
  log=$work/rawlog.log
  [ "$ovl" != ovl-http ] || log=$work/http.log
  pid=$(cat "$work/s.pid")
  case $case in
    copy-warm | copy-http-warm) copy_run "$uri" "$log" > /dev/null ;;
  esac
  c0=$(bench_cpu "$pid")
  case $case in
    copy | copy-http | copy-warm | copy-http-warm) copy_run "$uri" "$log" ;;
    copy-noext) copy_run "$uri" "$log" --no-extents ;;
    replay | replay-http) replay_run "$uri" "$log" ;;
    *) bench_fio_read "$uri" "$rw" "$bs" "$depth" "$secs" ;;
  esac
  case $case,$c0 in
    copy*,[0-9]*)
      awk -v a="$(bench_cpu "$pid")" -v b="$c0" 'BEGIN { printf "%.3f\n", a - b }' \
        > "$work/cpu" ;;
    *) echo - > "$work/cpu" ;;
  esac
  bench_kill_pidfiles "$work/s.pid"
  rm -f "$work/s.sock" "$work/s.pid"
}

declare -A res fetched cpu
cases=${REMOTE_CASES:-seq-1m rand-4k frag-1m http-1m seq-256k-qd16 seq-1m-qd4 copy copy-warm copy-noext copy-http replay replay-http}
for r in $(seq "$rounds"); do
  for c in $cases; do
    for s in $(bench_order "$r" $servers); do
      out=$(one "$c" "$s")
      read -r v f <<< "$out"
      res[$c,$s]+="$v "
      fetched[$c,$s]+="${f:+$f }"
      cpu[$c,$s]+="$(cat "$work/cpu") "
      bench_record "$c" "$s" "$r" "$v"
      bench_record "$c-cpu" "$s" "$r" "$(cat "$work/cpu")"
    done
  done
done

read -r -a list <<< "$servers"
first=${list[0]} peers=("${list[@]:1}")
echo "$rounds rounds of $secs s (copy and replay cases: one a round); MiB/s (IOPS for rand-4k), medians; load average $(bench_load)"
head="| case |" rule="|---|"
for s in "${list[@]}"; do head+=" $s |" rule+="---|"; done
for p in "${peers[@]}"; do head+=" $first/$p |" rule+="---|"; done
printf '%s\n%s\n' "$head" "$rule"
# The chart's names of the peers.
declare -A peer_name=([qemu-nbd]=qemu-nbd [direct]="the base read directly"
                      [proxy]="nbdkit's nbd plugin, a proxy")
: > "$work/ratios"
for c in $cases; do
  o=$(bench_median "${res[$c,$first]}")
  printf '| %s |' "$c"
  for s in "${list[@]}"; do printf ' %s |' "$(bench_median "${res[$c,$s]}")"; done
  for p in "${peers[@]}"; do
    r=$(echo "$o / $(bench_median "${res[$c,$p]}")" | bc -l)
    printf ' %.2f |' "$r"
    [ "$first" != ours ] || [ -z "${peer_name[$p]:-}" ] ||
      printf '%s\t%s\t%.3f\thigher\n' "$c" "${peer_name[$p]}" "$r" >> "$work/ratios"
  done
  echo
done
[ "${BENCH_UPDATE:-1}" = 0 ] ||
  /usr/bin/python3 "$top/bench/report.py" --ratios \
    "remote backing files, 2 ms a read (bench/remote.sh)" < "$work/ratios"
echo "bytes the base served per byte copied or read (medians):"
for c in $cases; do
  [ -n "${fetched[$c,$first]}" ] || continue
  echo "$c:" $(for s in "${list[@]}"; do
                 echo "$s $(bench_median "${fetched[$c,$s]}")"; done)
done
echo "the serving server's CPU seconds a copy (medians):"
for c in $cases; do
  [[ $c == copy* ]] || continue
  echo "$c:" $(for s in "${list[@]}"; do
                 echo "$s $(bench_median "${cpu[$c,$s]}")"; done)
done
echo "all rounds:"
for c in $cases; do
  for s in "${list[@]}"; do echo "$c $s: ${res[$c,$s]}"; done
done
