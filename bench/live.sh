#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Live operations against qemu-storage-daemon (issue 55): a 1 GiB qcow2
# overlay, half written (8 MiB of data, 8 MiB of hole, and so on: 512
# MiB), over a 1 GiB qcow2 base, half written too (16 MiB of data, 16 of
# hole: half the overlay's data lies over the base's), local files in
# the page cache, copied afresh for every run, served by
#   ours  nbdkit qcow2 dir=FOLDER idle-close=0 control=SOCKET, the
#         overlay its export vm.qcow2 (builds of other trees as ours:
#         BENCH_TREES, bench/lib.sh)
#   qsd   qemu-storage-daemon, the overlay the node "top" over the node
#         "base" (both named), exported writable over NBD (--nbd-server,
#         --export type=nbd) as vm.qcow2, QMP on its monitor
# in interleaved rounds, ours and qsd alternating which goes first.
# Cases (LIVE_CASES):
#   commit  block-commit of the overlay into its base (qsd's base-node
#           the node below: QEMU's default is the deepest), and
#           block-job-complete at BLOCK_JOB_READY, no client: seconds
#           from block-commit to BLOCK_JOB_COMPLETED
#   iops    fio randrw 4 KiB QD16 over NBD (fio's nbd engine), its
#           requests a second from the commit's block-commit to its
#           READY (the commit started 1 s into fio's run, and completed
#           at READY), against a run of SECONDS without a job (from 1 s
#           in to its end); and the commit's seconds under that load
#   pause   fio randwrite 4 KiB QD16, and 1.5 s into its SECONDS ours'
#           export-snapshot or qsd's blockdev-snapshot-sync: the longest
#           latency of a write in flight while the command ran, against
#           the longest of the second before it; the command's round
#           trip; ours' paused-ns (its reply's)
# Each request's latency and completion time from fio's per-request log
# (write_lat_log, log_unix_epoch), set beside the QMP commands' times by
# bench/live.py.
# Usage: bench/live.sh [ROUNDS [SECONDS]]   (default 5 rounds, 4 s;
# LIVE_SERVERS="ours qsd", LIVE_CASES="commit iops pause", LIVE_SIZE=1G
# the disk's size, a multiple of 32 MiB, LIVE_SETTLE=5: see fresh)
# Prints the medians and ratios, which go into bench/ratios.tsv and its
# chart unless BENCH_UPDATE=0; every round's values after them.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
export PATH=$top:/usr/bin:$PATH
rounds=${1:-5} secs=${2:-4}
servers=${LIVE_SERVERS:-ours qsd}
cases=${LIVE_CASES:-commit iops pause}
size=${LIVE_SIZE:-1G}
live=$top/bench/live.py
work=$(mktemp -d /var/tmp/live-bench.XXXXXX)
trap 'bench_kill_pidfiles "$work"/*.pid; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

mkdir "$work/orig"
qemu-img create -q -f qcow2 "$work/orig/base.qcow2" "$size"
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$work/orig/vm.qcow2" "$size"
chunks=$(( $(qemu-img info --output=json "$work/orig/vm.qcow2" |
             sed -n 's/.*"virtual-size": \([0-9]*\).*/\1/p') >> 23 ))
base_cmds=() vm_cmds=()
for ((i = 0; i < chunks; i++)); do
  ((i % 4 > 1)) || base_cmds+=(-c "write -P $((i % 100 + 1)) $((i * 8))M 8M")
  ((i % 2)) || vm_cmds+=(-c "write -P $((i % 100 + 101)) $((i * 8))M 8M")
done
qemu-io -f qcow2 "${base_cmds[@]}" "$work/orig/base.qcow2" > /dev/null
qemu-io -f qcow2 "${vm_cmds[@]}" "$work/orig/vm.qcow2" > /dev/null

# fresh: the images copied afresh into $work/run, on the disk before a
# run begins (so that no writeback of the copy falls into it), then
# LIVE_SETTLE seconds (default 5) for the machine to settle: on these
# VMs the memory freed (the last run's files) goes back to the host
# within a few seconds (the balloon's free page reporting), and a
# server that allocates its page cache before that is three times as
# fast as one after (0.3 s against 1.1 for the same commit, either
# server): each run starts from the same state.
fresh ()
{
  rm -rf "$work/run"
  mkdir "$work/run"
  cp --sparse=always "$work/orig/base.qcow2" "$work/orig/vm.qcow2" "$work/run/"
  sync "$work/run"/*
  sync
  sleep "${LIVE_SETTLE:-5}"
}

# serve SERVER: SERVER on fresh images, NBD on $work/s.sock, QMP on
# $work/s.qmp, its pid in $work/s.pid (for the trap: runs go on in
# command substitutions' subshells), its messages in $work/s.log (its
# output too: it must not hold the substitution's pipe).
serve ()
{
  fresh
  rm -f "$work/s.sock" "$work/s.qmp" "$work/s.pid"
  case $(bench_kind "$1") in
    qsd)
      qemu-storage-daemon \
        --blockdev "driver=file,node-name=base-file,filename=$work/run/base.qcow2" \
        --blockdev driver=qcow2,node-name=base,file=base-file \
        --blockdev "driver=file,node-name=top-file,filename=$work/run/vm.qcow2" \
        --blockdev driver=qcow2,node-name=top,file=top-file,backing=base \
        --chardev "socket,id=c,path=$work/s.qmp,server=on,wait=off" \
        --monitor chardev=c \
        --nbd-server "addr.type=unix,addr.path=$work/s.sock" \
        --export type=nbd,id=e,node-name=top,name=vm.qcow2,writable=on \
        --pidfile "$work/s.pid" > "$work/s.log" 2>&1 & ;;
    *)
      "$(bench_nbdkit "$1")" -f -U "$work/s.sock" -P "$work/s.pid" \
        qcow2 dir="$work/run" idle-close=0 control="$work/s.qmp" \
        > "$work/s.log" 2>&1 & ;;
  esac
  bench_wait_sock "$work/s.sock" "$work/s.pid"
  bench_wait_sock "$work/s.qmp"
}

stop () { bench_kill_pidfiles "$work/s.pid"; }

# commit_args SERVER: the arguments of live.py commit for SERVER.
commit_args ()
{
  case $(bench_kind "$1") in
    qsd) echo "$work/s.qmp top base" ;;
    *) echo "$work/s.qmp vm.qcow2" ;;
  esac
}

# writers RW SECONDS: fio over the export in the background ($fio_pid,
# and $work/fio.pid for the trap), every request logged in
# $work/fio_lat.1.log.
writers ()
{
  rm -f "$work"/fio_*.log
  fio --name=w --ioengine=nbd --uri="nbd+unix:///vm.qcow2?socket=$work/s.sock" \
      --rw="$1" --bs=4k --iodepth=16 --time_based --runtime="$2" \
      --write_lat_log="$work/fio" --log_avg_msec=0 --log_unix_epoch=1 \
      > "$work/fio.out" 2>&1 &
  fio_pid=$!
  echo "$fio_pid" > "$work/fio.pid"
}

# writers_end [now]: fio's end (now: stopped by SIGINT, its logs
# written all the same, its status not 0).
writers_end ()
{
  local rc=0
  [ -z "${1:-}" ] || kill -INT "$fio_pid"
  wait "$fio_pid" || rc=$?
  rm "$work/fio.pid"
  [ -s "$work/fio_lat.1.log" ] && { [ -n "${1:-}" ] || [ "$rc" = 0 ]; } ||
    { tail -5 "$work/fio.out" >&2; echo "$0: fio failed ($rc)" >&2; exit 1; }
}

sub () { awk -v a="$1" -v b="$2" -v k="${3:-1}" 'BEGIN { printf "%.3f\n", (a - b) * k }'; }

# run_commit SERVER: the commit's seconds, no client.
run_commit ()
{
  local start ready done
  serve "$1"
  read -r start ready done < <("$live" commit $(commit_args "$1"))
  stop
  sub "$done" "$start"
}

# run_iops SERVER JOB: "IOPS COMMIT-SECONDS" with JOB commit (IOPS until
# READY), "IOPS -" with JOB none.
run_iops ()
{
  local start ready done iops
  serve "$1"
  if [ "$2" = none ]; then
    writers randrw "$secs"
    writers_end
    read -r iops _ < <("$live" log "$work/fio_lat.1.log" first+1 last)
    echo "$iops -"
  else
    writers randrw 600
    sleep 1
    read -r start ready done < <("$live" commit $(commit_args "$1"))
    writers_end now
    read -r iops _ < <("$live" log "$work/fio_lat.1.log" "$start" "$ready")
    echo "$iops $(sub "$done" "$start")"
  fi
  stop
}

# run_pause SERVER: "LONGEST LONGEST-BEFORE COMMAND-MS PAUSED-MS", ms.
run_pause ()
{
  local sent replied paused longest before
  serve "$1"
  writers randwrite "$secs"
  sleep 1.5
  case $(bench_kind "$1") in
    qsd) read -r sent replied paused < <("$live" snapshot "$work/s.qmp" qsd \
                                          top "$work/run/vm-snap.qcow2") ;;
    *) read -r sent replied paused < <("$live" snapshot "$work/s.qmp" ours \
                                        vm.qcow2 vm-snap.qcow2) ;;
  esac
  writers_end
  stop
  read -r _ longest before < <("$live" log "$work/fio_lat.1.log" "$sent" "$replied")
  echo "$longest $before $(sub "$replied" "$sent" 1000)" \
    "$(case $(bench_kind "$1") in qsd) echo - ;; *) sub "$paused" 0 1e-6 ;; esac)"
}

# keep SERVER "V ..." NAME...: a run's values, each the measure the
# NAME in its place names, SERVER's in this round.
declare -A res
keep ()
{
  local server=$1 vals=($2) k
  shift 2
  for k in "${!vals[@]}"; do
    res[${@:k+1:1}-$server]+="${vals[k]} "
    bench_record "${@:k+1:1}" "$server" "$r" "${vals[k]}"
  done
}
for r in $(seq "$rounds"); do
  echo "round $r, load $(bench_load)" >&2
  for c in $cases; do
    for s in $(bench_order "$r" $servers); do
      # A run's values assigned first: a run that fails ends the script.
      case $c in
        commit) v=$(run_commit "$s"); keep "$s" "$v" commit ;;
        iops)
          for j in $(bench_order "$r" none commit); do
            v=$(run_iops "$s" "$j")
            if [ "$j" = none ]; then keep "$s" "$v" iops-without
            else keep "$s" "$v" iops-during commit-loaded
            fi
          done ;;
        pause)
          v=$(run_pause "$s")
          keep "$s" "$v" pause-longest pause-before pause-command pause-paused ;;
        *) echo "$0: unknown case $c (commit, iops, pause)" >&2; exit 1 ;;
      esac
    done
  done
done

# med NAME SERVER FORMAT: NAME's median for SERVER, printed by FORMAT.
med ()
{
  local m
  m=$(bench_median "${res[$1-$2]:-}")
  if [ "$m" = - ]; then echo -; else printf "$3\n" "$m"; fi
}
ratio ()
{
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"
                                   else printf "%.2f\n", a / b }'
}
read -r first second _ <<< "$servers"
second=${second:-$first}
# row TEXT NAME FORMAT: the table's row of NAME's medians.
row ()
{
  local a b
  a=$(med "$2" "$first" "$3") b=$(med "$2" "$second" "$3")
  echo "| $1 | $a | $b | $(ratio "$a" "$b") |"
}
has () { case " $cases " in *" $1 "*) return 0 ;; esac; return 1; }
echo "$rounds rounds of $size, ${secs} s runs; medians; load average $(bench_load)"
echo "| measure | $first | $second | $first/$second |"
echo "|---|---|---|---|"
! has commit ||
  row "commit of the overlay (half data) into its base, s" commit %.2f
declare -A d
if has iops; then
  row "the same under the client's randrw, s" commit-loaded %.2f
  row "client randrw 4 KiB QD16, IOPS, no job" iops-without %.0f
  row "client IOPS during the commit (to READY)" iops-during %.0f
  for s in "$first" "$second"; do
    d[$s]=$(ratio "$(med iops-during "$s" %f)" "$(med iops-without "$s" %f)")
  done
  echo "| during/without | ${d[$first]} | ${d[$second]} | |"
fi
if has pause; then
  row "snapshot: writers' longest write latency across the command, ms" \
    pause-longest %.1f
  row "writers' longest latency, the second before it, ms" pause-before %.1f
  row "the snapshot command's round trip, ms" pause-command %.1f
  row "paused-ns (ours' reply), ms" pause-paused %.1f
fi

[ "${BENCH_UPDATE:-1}" = 0 ] || [ "$second" = "$first" ] || {
  ours_qsd () { ratio "$(med "$1" "$first" %f)" "$(med "$1" "$second" %f)"; }
  r1=$(ours_qsd commit) r2=$(ours_qsd iops-during) r3=${d[$first]:--}
  r4=$(ours_qsd pause-longest)
  [ "$r1" = - ] || printf 'commit 1 GiB overlay (half data), time\tqemu-storage-daemon block-commit\t%s\tlower\n' "$r1"
  [ "$r2" = - ] || printf 'client IOPS during the commit\tqemu-storage-daemon during its commit\t%s\thigher\n' "$r2"
  [ "$r3" = - ] || printf 'client IOPS during the commit\twithout the commit\t%s\thigher\n' "$r3"
  [ "$r4" = - ] || printf "writers' pause at the snapshot, QD16\tqemu-storage-daemon blockdev-snapshot-sync\t%s\tlower\n" "$r4"
} | /usr/bin/python3 "$top/bench/report.py" --ratios \
    "live operations (bench/live.sh)"
echo "all rounds:"
for k in $(printf "%s\n" "${!res[@]}" | sort); do echo "$k: ${res[$k]}"; done
