#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark harness: our plugin against qemu-nbd, on the same
# images, in the same run.
#
# Each case serves one image with each server in turn, drives it with
# fio's nbd engine over a Unix socket, and repeats the round (the
# servers in reverse order every other round) so that the machine's
# other load falls on every server alike.  The servers:
#
#   ours        nbdkit with this tree's qcow2 plugin
#   ours-none   the same with cache=none (O_DIRECT)
#   ours-whole, ours-whole-none   both with l2-slice-size = the cluster
#               size (whole tables as cache entries; the L2 cache cases)
#   qemu-none   qemu-nbd --cache=none --aio=native
#   qemu-wb     qemu-nbd --cache=writeback --aio=threads
#   raw         nbdkit's file plugin over the equivalent raw file (the
#               ceiling)
#
# with the same L2 cache size for ours and qemu-nbd.  Medians and ratios
# go into bench/RESULTS.md, between the markers of its section on qemu-nbd,
# and the ratios into the chart at its top (bench/ratios.svg).
#
# Usage, from the top of a built tree (or "make bench"):
#   bench/run.sh            full mode: 3 rounds, 3 s per run (~30 min)
#   bench/run.sh --quick    3 rounds, 1 s per run, smaller images (~8 min)
#   bench/run.sh --smoke    1 round, 1 s per run, small images; writes
#                           its table to the output folder only
# Environment:
#   BENCH_QUICK=1          same as --quick
#   BENCH_DIR=DIR          images (kept for the next run) and results;
#                          default /var/tmp/nbdkit-qcow2-bench
#   BENCH_CASES=REGEX      only the cases whose name matches (extended
#                          regular expression), e.g. 'randread|seq-read';
#                          it may name the cases of no full run too:
#                          randread-4k-qd1, randwrite-4k-qd1
#   BENCH_REPS=N, BENCH_RUNTIME=S   override the rounds and seconds
#   BENCH_SYNCS=0          no extra run under strace counting the
#                          flush cases' host syncs
#   BENCH_UPDATE=0|1       write RESULTS.md or not (default: 1 unless
#                          --smoke, BENCH_CASES, BENCH_SERVERS or
#                          BENCH_LOAD)
#   BENCH_SERVERS='A B ...'   only these servers in every case (of the
#                          names above, or variants', or trees'), e.g.
#                          'ours-none qemu-none'
#   BENCH_TREES='NAME=DIR ...'   servers NAME and NAME-none, ... (ours,
#                          ours-none, ... with the plugin DIR built):
#                          other revisions in the same run (bench/lib.sh)
#   BENCH_LOAD=CPU         a CPU hog (a busy shell loop) pinned to core
#                          CPU for the whole run, the same for every
#                          server: the machine loaded
#   BENCH_VARIANTS='NAME:OPTS ...'   more servers in every case: our
#                          plugin with OPTS (comma-separated) added, e.g.
#                          'serial:io-threads=0', to compare changes
#                          in the same run; plugin=PATH among OPTS serves
#                          with another build of the plugin; as-filter
#                          serves with the qcow2 filter over nbdkit's file
#                          plugin instead (e.g. 'filter:as-filter')

set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
plugin=$top/plugins/qcow2/.libs/nbdkit-qcow2-plugin.so
filter=$top/filters/qcow2/.libs/nbdkit-qcow2-filter.so
mkimage=$top/bench/mkimage.sh

# Debian's nbdkit and python3 (with the nbd module), not pyenv's.
export PATH=/usr/bin:$PATH

mode=full
[ "${BENCH_QUICK:-0}" = 1 ] && mode=quick
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) mode=quick ;;
    --smoke) mode=smoke ;;
    --full) mode=full ;;
    -h|--help) sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$0: unknown argument $1" >&2; exit 1 ;;
  esac
  shift
done

case $mode in
  full)
    reps=3 runtime=3 ramp=1
    full_size=1G layout_size=1G scattered=512
    alloc_io=32M flush_io=512M small_io=16M ;;
  quick)
    reps=3 runtime=1 ramp=1
    full_size=512M layout_size=256M scattered=128
    alloc_io=8M flush_io=128M small_io=4M ;;
  smoke)
    reps=1 runtime=1 ramp=0
    full_size=512M layout_size=256M scattered=128
    alloc_io=8M flush_io=64M small_io=4M ;;
esac
reps=${BENCH_REPS:-$reps}
runtime=${BENCH_RUNTIME:-$runtime}
only=${BENCH_CASES:-}
only_servers=${BENCH_SERVERS:-}
load_cpu=${BENCH_LOAD:-}
update=1
[ $mode = smoke ] || [ -n "$only$only_servers$load_cpu" ] && update=0
update=${BENCH_UPDATE:-$update}

for prog in fio jq qemu-img qemu-io qemu-nbd nbdkit strace python3 numfmt; do
  command -v $prog >/dev/null || { echo "$0: $prog is needed" >&2; exit 1; }
done
for s in ${only_servers:-ours}; do
  case $(bench_kind "$s") in
    ours*)
      [ -f "$(bench_plugin "$s")" ] || {
        echo "$0: $(bench_plugin "$s") not found: build the tree first" >&2
        exit 1
      } ;;
  esac
done

base=${BENCH_DIR:-/var/tmp/nbdkit-qcow2-bench}
img=$base/images-$full_size-$layout_size-$scattered
out=$base/results-$mode-$(date +%Y%m%d-%H%M%S)
mkdir -p "$img" "$out"
sock=$out/nbd.sock
results=$out/runs.tsv
commands=$out/commands.txt
: > "$results"
: > "$commands"

server_pid=
hog_pid=
cleanup ()
{
  if [ -n "$hog_pid" ]; then
    kill "$hog_pid" 2>/dev/null || :
    wait "$hog_pid" 2>/dev/null || :
  fi
  if [ -n "$server_pid" ]; then
    kill $(pgrep -P "$server_pid") "$server_pid" 2>/dev/null || :
    wait "$server_pid" 2>/dev/null || :
  fi
  rm -f "$sock"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log () { printf '%s %s\n' "$(date +%T)" "$*" >&2; }

# ---------------------------------------------------------------- images

# make NAME COMMAND...: run COMMAND (which makes the files of NAME) once;
# later runs of the harness reuse them.
make_once ()
{
  local name=$1; shift
  [ -f "$img/$name.done" ] && return
  log "making image $name"
  "$@"
  touch "$img/$name.done"
}

make_once full "$mkimage" full "$full_size" "$img/full.qcow2" "$img/full.raw"
make_once mapped "$mkimage" mapped 64k 32G "$img/mapped.qcow2" \
          "$img/mapped.raw"
make_once scattered "$mkimage" scattered 2M 4T "$scattered" \
          "$img/scattered.qcow2" "$img/scattered.raw"
for order in sequential reverse random partly-random; do
  make_once "layout-$order" "$mkimage" layout "$order" "$layout_size" \
            "$img/layout-$order.qcow2"
done
make_once layout-raw qemu-img convert -O raw \
          "$img/layout-sequential.qcow2" "$img/layout.raw"

# --------------------------------------------------------------- servers

# start SERVER QCOW2 RAW: serve on $sock; sets server_pid and the
# command in server_cmd.  Options for the case come from ours_opts (for
# the plugin) and qemu_opts (qcow2 driver options for qemu-nbd).
start ()
{
  local server=$1 qcow2=$2 raw=$3 i so
  local qopts="driver=qcow2,file.driver=file,file.filename=$qcow2$qemu_opts"
  local cmd

  so=$(bench_plugin "$server")
  case $(bench_kind "$server") in
    ours) cmd=(nbdkit -f -U "$sock" "$so" "file=$qcow2" $ours_opts) ;;
    ours-none)
      cmd=(nbdkit -f -U "$sock" "$so" "file=$qcow2" $ours_opts
           cache=none) ;;
    ours-whole)
      cmd=(nbdkit -f -U "$sock" "$so" "file=$qcow2" $ours_opts
           "l2-slice-size=$cluster") ;;
    ours-whole-none)
      cmd=(nbdkit -f -U "$sock" "$so" "file=$qcow2" $ours_opts
           "l2-slice-size=$cluster" cache=none) ;;
    qemu-none)
      cmd=(qemu-nbd -t -e 8 -k "$sock" --cache=none --aio=native
           --image-opts "$qopts") ;;
    qemu-wb)
      cmd=(qemu-nbd -t -e 8 -k "$sock" --cache=writeback --aio=threads
           --image-opts "$qopts") ;;
    raw) cmd=(nbdkit -f -U "$sock" file "file=$raw") ;;
    *)
      local v o opts=() as_filter=
      for v in ${BENCH_VARIANTS:-}; do
        [ "${v%%:*}" = "$server" ] || continue
        v=${v#*:}
        for o in ${v//,/ }; do
          case $o in
            plugin=*) so=${o#plugin=} ;;
            as-filter) as_filter=1 ;;
            *) opts+=("$o") ;;
          esac
        done
      done
      if [ -n "$as_filter" ]; then
        cmd=(nbdkit -f -U "$sock" "--filter=$filter" file "file=$qcow2"
             $ours_opts "${opts[@]}")
      else
        cmd=(nbdkit -f -U "$sock" "$so" "file=$qcow2" $ours_opts "${opts[@]}")
      fi ;;
  esac
  server_cmd="${cmd[*]}"
  rm -f "$sock"
  $server_wrap "${cmd[@]}" >"$out/server.log" 2>&1 &
  server_pid=$!
  for i in $(seq 200); do
    [ -S "$sock" ] && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "$0: $server did not start:" >&2
  cat "$out/server.log" >&2
  exit 1
}

# stop: end the server; sets server_rss to its peak resident set (KiB).
stop ()
{
  local pid=$server_pid
  server_rss=$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status" 2>/dev/null ||
                 echo 0)
  # Under strace, the server is strace's child; strace ends with it.
  if [ -n "$server_wrap" ]; then
    pid=$(pgrep -P "$server_pid" | head -1)
  fi
  kill "$pid"
  wait "$server_pid" || :
  server_pid=
  rm -f "$sock"
}

# ----------------------------------------------------------------- cases
#
# Each case sets: desc (one line, for the table), servers, fio (the
# arguments of the job), metric (read-iops, write-iops, iops,
# read-bw, write-bw: bandwidth in MiB/s), qcow2 and raw (the images),
# optionally fresh (a function that makes new images before each run:
# the allocating writes), ours_opts, qemu_opts, cluster, goal.

all_cases=(randread-4k randwrite-4k
           l2-64k-randread l2-2m-randread
           seq-read-sequential seq-read-reverse seq-read-random
           seq-read-partly-random
           seq-write-sequential seq-write-reverse seq-write-random
           seq-write-partly-random
           cow-randwrite alloc-randwrite
           flush64-seqwrite flush64-seqwrite-lazy
           small-cluster-randwrite
           multiconn-randrw)
# Cases only BENCH_CASES selects (bench/compare.sh's).
extra_cases=(randread-4k-qd1 randwrite-4k-qd1)

timed=(--time_based --runtime="$runtime" --ramp_time="$ramp")
std_servers="ours ours-none qemu-wb qemu-none raw"
l2_servers="ours ours-none ours-whole ours-whole-none qemu-wb qemu-none raw"

fresh_overlay ()
{
  "$mkimage" overlay "$img/full.qcow2" "$out/fresh.qcow2"
  python3 "$top/bench/warm.py" "$img/full.qcow2" "$img/full.raw"
}
fresh_empty ()
{
  "$mkimage" empty "$cluster" "$fresh_size" "$out/fresh.qcow2" "$lazy"
  rm -f "$out/fresh.raw"
  truncate -s "$fresh_size" "$out/fresh.raw"
}

define_case ()
{
  desc= servers=$std_servers fio=() metric= qcow2= raw= fresh=
  ours_opts= qemu_opts= cluster=64k goal= lazy=off fresh_size=
  case $1 in
    randread-4k|randwrite-4k|randread-4k-qd1|randwrite-4k-qd1)
      local rw=${1%%-4k*} depth=16
      [[ $1 != *-qd1 ]] || depth=1
      desc="$rw 4 KiB, QD$depth, $full_size written image, L2 cache covers it"
      qcow2=$img/full.qcow2 raw=$img/full.raw
      fio=(--rw="$rw" --bs=4k --iodepth="$depth" "${timed[@]}")
      metric=${rw#rand}-iops
      goal="qemu>=1.5"
      if [ "$rw" = randread ]; then goal="qemu>=1.5 raw>=0.9"; fi ;;
    l2-64k-randread)
      desc="randread 4 KiB, QD16, 32 GiB all mapped, 64 KiB clusters, 1 MiB L2 cache"
      qcow2=$img/mapped.qcow2 raw=$img/mapped.raw
      servers=$l2_servers
      ours_opts=l2-cache-size=1M
      qemu_opts=,l2-cache-size=1M,l2-cache-entry-size=4096
      fio=(--rw=randread --bs=4k --iodepth=16 "${timed[@]}")
      metric=read-iops
      goal="qemu>=1.0 whole>=2.5" ;;
    l2-2m-randread)
      desc="randread 4 KiB, QD16, 4 TiB with $scattered clusters of 2 MiB scattered, 4 MiB L2 cache"
      qcow2=$img/scattered.qcow2 raw=$img/scattered.raw cluster=2M
      servers=$l2_servers
      ours_opts=l2-cache-size=4M
      qemu_opts=,l2-cache-size=4M,l2-cache-entry-size=4096
      fio=(--rw=randread --bs=4k --iodepth=16 "${timed[@]}")
      metric=read-iops
      goal="qemu>=1.0 whole>=10" ;;
    seq-read-*|seq-write-*)
      local rw=${1#seq-} order=${1#seq-*-}
      rw=${rw%%-*}
      desc="$rw 1 MiB sequential, QD1, $layout_size written in $order order"
      qcow2=$img/layout-$order.qcow2 raw=$img/layout.raw
      fio=(--rw="$rw" --bs=1M --iodepth=1 "${timed[@]}")
      metric=$rw-bw
      goal="qemu>=1.0" ;;
    cow-randwrite)
      desc="randwrite 4 KiB, QD16, $alloc_io into an empty overlay over the $full_size image (COW)"
      qcow2=$out/fresh.qcow2 raw=$img/full.raw fresh=fresh_overlay
      fio=(--rw=randwrite --bs=4k --iodepth=16 --io_size="$alloc_io")
      metric=write-iops
      goal="qemu>=1.0" ;;
    alloc-randwrite)
      desc="randwrite 4 KiB, QD16, $alloc_io into an empty $full_size image"
      qcow2=$out/fresh.qcow2 raw=$out/fresh.raw fresh=fresh_empty
      fresh_size=$full_size
      fio=(--rw=randwrite --bs=4k --iodepth=16 --io_size="$alloc_io")
      metric=write-iops
      goal="qemu>=1.0" ;;
    flush64-seqwrite|flush64-seqwrite-lazy)
      if [ "$1" = flush64-seqwrite-lazy ]; then lazy=on; fi
      desc="write 64 KiB sequential, QD1, flush every 64 writes, $flush_io into an empty image, lazy_refcounts=$lazy"
      qcow2=$out/fresh.qcow2 raw=$out/fresh.raw fresh=fresh_empty
      fresh_size=$full_size
      fio=(--rw=write --bs=64k --iodepth=1 --fsync=64 --io_size="$flush_io")
      metric=write-iops
      # One sync per client flush (two with cache=none, where the file
      # grows by the writes: see report.py), and once more to make the
      # first new L2 table durable before the L1 table points at it;
      # with lazy refcounts, once more when the first write sets the
      # dirty bit.
      goal="qemu>=1.0 syncs+$([ $lazy = on ] && echo 2 || echo 1)" ;;
    small-cluster-randwrite)
      desc="randwrite 4 KiB, QD16, $small_io into an empty 1 GiB image of 512-byte clusters"
      qcow2=$out/fresh.qcow2 raw=$out/fresh.raw fresh=fresh_empty
      cluster=512 fresh_size=1G
      fio=(--rw=randwrite --bs=4k --iodepth=16 --io_size="$small_io")
      metric=write-iops
      goal="qemu>=1.0" ;;
    multiconn-randrw)
      desc="randrw 50% 4 KiB, 4 connections at QD4, $full_size written image"
      qcow2=$img/full.qcow2 raw=$img/full.raw
      fio=(--rw=randrw --rwmixread=50 --bs=4k --iodepth=4 --numjobs=4
           --group_reporting "${timed[@]}")
      metric=iops
      goal="qemu>=1.0" ;;
    *) echo "$0: unknown case $1" >&2; exit 1 ;;
  esac
}

# warm: the images' data (not their holes) read before every run, so
# that every server finds the metadata and the data in the page cache
# whichever ran before.  Not once a round: on this machine, pages left
# unused are reclaimed within seconds, even with free memory.
warm ()
{
  [ -n "$fresh" ] || python3 "$top/bench/warm.py" "$qcow2" "$raw"
}

# run_one CASE SERVER ROUND: one fio run; appends a line to $results.
run_one ()
{
  local name=$1 server=$2 round=$3 json=$out/fio.json value syncs
  local fio_cmd

  [ -z "$fresh" ] || $fresh
  # No server inherits the dirty pages of the one before: their
  # writeback would slow it.
  sync "$qcow2" "$raw"
  warm
  start "$server" "$qcow2" "$raw"
  fio_cmd=(fio --name="$name" --ioengine=nbd
           --uri="nbd+unix:///?socket=$sock" "${fio[@]}"
           --output-format=json --output="$json")
  "${fio_cmd[@]}" >/dev/null 2>"$out/fio.err" || {
    echo "$0: fio failed on $name with $server:" >&2
    cat "$out/fio.err" "$out/server.log" >&2
    exit 1
  }
  stop
  value=$(jq -r --arg m "$metric" '.jobs[0] as $j | {
      "read-iops": $j.read.iops, "write-iops": $j.write.iops,
      "iops": ($j.read.iops + $j.write.iops),
      "read-bw": ($j.read.bw / 1024), "write-bw": ($j.write.bw / 1024)
    }[$m]' "$json")
  syncs=$(jq -r '.jobs[0].sync.total_ios // 0' "$json")
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$server" "$round" "$value" \
         "$server_rss" "$syncs" >> "$results"
  bench_record "$name" "$server" "$round" "$value"
  if [ "$round" = 1 ]; then
    printf '%s\t%s\t%s\t%s\n' "$name" "$server" "$server_cmd" \
           "${fio_cmd[*]}" >> "$commands"
  fi
  log "$name $server round $round: $metric $value, peak RSS $server_rss KiB"
}

# count_syncs CASE SERVER: one more run under strace, to count the host
# syncs while the client runs and those after the server is told to
# stop (closing the image).
count_syncs ()
{
  local name=$1 server=$2 json=$out/fio.json trace=$out/strace.txt
  local n flushes

  [ -z "$fresh" ] || $fresh
  server_wrap="strace -f -e trace=fdatasync,fsync,sync_file_range -o $trace"
  start "$server" "$qcow2" "$raw"
  fio --name="$name" --ioengine=nbd --uri="nbd+unix:///?socket=$sock" \
      "${fio[@]}" --output-format=json --output="$json" >/dev/null 2>&1
  stop
  server_wrap=
  # A call is counted where it starts ("<... resumed>" lines are not).
  n=$(awk '/--- SIGTERM/ { closing = 1 }
           /(fdatasync|fsync|sync_file_range)\(/ { if (closing) c++; else r++ }
           END { print r + 0 "\t" c + 0 }' "$trace")
  flushes=$(jq -r '.jobs[0].sync.total_ios // 0' "$json")
  printf '%s\t%s\t%s\t%s\n' "$name" "$server" "$n" "$flushes" \
         >> "$out/syncs.tsv"
  log "$name $server: host syncs (running, closing) ${n/$'\t'/, } for" \
      "$flushes client flushes"
}

server_wrap=
cases=()
for c in "${all_cases[@]}"; do
  [ -z "$only" ] || [[ $c =~ $only ]] && cases+=("$c")
done
for c in "${extra_cases[@]}"; do
  [ -n "$only" ] && [[ $c =~ $only ]] && cases+=("$c")
done
[ ${#cases[@]} -gt 0 ] || { echo "$0: no case matches $only" >&2; exit 1; }

{
  printf 'mode=%s\nreps=%s\nruntime=%s\nramp=%s\n' $mode $reps $runtime $ramp
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit=$(git -C "$top" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo) x $(nproc)"
  echo "memory=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "kernel=$(uname -r)"
  echo "filesystem=$(df -T "$img" | awk 'NR == 2 { print $2 }')"
  echo "fio=$(fio --version)"
  echo "qemu-nbd=$(qemu-nbd --version | head -1)"
  echo "nbdkit=$(nbdkit --version)"
  echo "load_start=$(bench_load)"
  echo "img=$img"
  echo "out=$out"
  echo "plugin=$plugin"
  echo "variants=${BENCH_VARIANTS:-}"
  echo "servers=$only_servers"
  echo "load_cpu=$load_cpu"
} > "$out/meta.txt"

if [ -n "$load_cpu" ]; then
  taskset -c "$load_cpu" sh -c 'while :; do :; done' &
  hog_pid=$!
  log "CPU hog $hog_pid on core $load_cpu"
fi

for name in "${cases[@]}"; do
  define_case "$name"
  printf '%s\t%s\n' "$name" "$desc" >> "$out/cases.tsv"
  printf '%s\t%s\n' "$name" "$goal" >> "$out/goals.tsv"
done

log "mode $mode, ${#cases[@]} cases, $reps rounds; results in $out"
for round in $(seq "$reps"); do
  for name in "${cases[@]}"; do
    define_case "$name"
    read -ra list <<< "${only_servers:-$servers}"
    for v in ${BENCH_VARIANTS:-}; do
      [[ " ${list[*]} " == *" ${v%%:*} "* ]] || list+=("${v%%:*}")
    done
    for server in $(bench_order "$round" "${list[@]}"); do
      run_one "$name" "$server" "$round"
    done
  done
done

for name in "${cases[@]}"; do
  define_case "$name"
  [[ $goal == *syncs+* ]] && [ "${BENCH_SYNCS:-1}" != 0 ] || continue
  for server in ${only_servers:-$servers} ${BENCH_VARIANTS:+$(for v in $BENCH_VARIANTS; do
                                                echo "${v%%:*}"; done)}; do
    count_syncs "$name" "$server"
  done
done
echo "load_end=$(bench_load)" >> "$out/meta.txt"

python3 "$top/bench/report.py" "$out" > "$out/report.md"
log "table: $out/report.md"
if [ "$update" = 1 ]; then
  python3 "$top/bench/report.py" --update "$top/bench/RESULTS.md" "$out"
  log "updated $top/bench/RESULTS.md"
fi
