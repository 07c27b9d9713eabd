#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Streaming: an empty qcow2 overlay (a local file) over a 1 GiB raw base,
# half of it data (8 MiB of data, then 8 MiB of hole, and so on), served
# over NBD by nbdkit's file plugin with 2 ms on every read (nbdkit's
# delay filter), and over HTTP on 127.0.0.1 by tests/range-server.py
# (Range requests, 2 ms before every answer), in interleaved rounds:
#   ours   nbdkit qcow2 OVERLAY stream=true: the time from start to the
#          end notice ("done: ... in S s"), which is before the detach
#   qemu   qemu-storage-daemon with the same overlay, its block-stream
#          job started over QMP: the time from the command to the
#          BLOCK_JOB_COMPLETED event (which follows its detach)
# and random 4 KiB reads, QD16, for SECONDS (fio's nbd engine, as
# bench/remote.sh), of our export of a fresh overlay during the stream
# against the same without it (stream=false).  A reading taken while
# the stream was over is discarded (counted in the output); the reads
# are measured over the NBD base only.
# Usage: [STREAM_BASES="nbd http"] bench/stream.sh [ROUNDS [SECONDS]]
# (default both bases, 3 rounds of 5 s; STREAM_SERVERS="ours qemu" the
# servers of the stream, every other round in reverse order: ours, or builds
# of other trees as ours (BENCH_TREES, bench/lib.sh), and qemu;
# STREAM_READS=0 measures no reads)
# Prints the medians and the ratios of the first server to the second,
# which go into bench/ratios.tsv and its chart unless BENCH_UPDATE=0.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
export PATH=$top:/usr/bin:$PATH
rounds=${1:-3} secs=${2:-5}
bases=${STREAM_BASES:-nbd http}
servers=${STREAM_SERVERS:-ours qemu}
work=$(mktemp -d /var/tmp/stream-bench.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
      bench_kill_pidfiles "$work"/*.pid; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

qemu-img create -q -f raw "$work/base.raw" 1G
cmds=()
for i in $(seq 0 2 127); do cmds+=(-c "write -P $((i % 200 + 1)) $((i * 8))M 8M"); done
qemu-io -f raw "${cmds[@]}" "$work/base.raw" > /dev/null
for b in $bases; do
  case $b in
    nbd)
      nbdkit -U "$work/base.sock" -P "$work/base.pid" -r --filter=delay \
        file "$work/base.raw" delay-read=2ms
      bench_wait_sock "$work/base.sock" "$work/base.pid"
      pids+=("$(cat "$work/base.pid")")
      url="nbd+unix:///?socket=$work/base.sock" ;;
    http)
      RANGE_SERVER_DELAY=0.002 /usr/bin/python3 "$top/tests/range-server.py" \
        "$work" "$work/http.port" &
      pids+=("$!")
      for i in $(seq 100); do [ -s "$work/http.port" ] && break; sleep 0.1; done
      url="http://127.0.0.1:$(cat "$work/http.port")/base.raw" ;;
    *) echo "$0: unknown base $b (nbd or http)" >&2; exit 1 ;;
  esac
  qemu-img create -q -f qcow2 -F raw -b "$url" "$work/empty-$b.qcow2"
done

# serve SERVER NAME ARGS...: the plugin of SERVER's tree, its messages
# in $work/NAME.log, its pid in $work/NAME.pid (for the trap: it runs
# in a subshell).
serve ()
{
  local server=$1 name=$2; shift 2
  rm -f "$work/$name.sock" "$work/$name.pid"
  "$(bench_nbdkit "$server")" -f -U "$work/$name.sock" -P "$work/$name.pid" \
    --log=stderr qcow2 "$@" 2> "$work/$name.log" &
  bench_wait_sock "$work/$name.sock" "$work/$name.pid"
}

# ours SERVER BASE: seconds of the stream, from the end notice.
ours ()
{
  cp "$work/empty-$2.qcow2" "$work/ours.qcow2"
  serve "$1" ours "$work/ours.qcow2" stream=true
  for i in $(seq 3000); do
    grep -q "no longer depends" "$work/ours.log" && break
    sleep 0.1
  done
  bench_kill_pidfiles "$work/ours.pid"
  sed -n 's/.*: stream: done: .* in \([0-9.]*\) s .*/\1/p' "$work/ours.log"
}

# qemu BASE: seconds of qemu-storage-daemon's block-stream job.
qemu ()
{
  cp "$work/empty-$1.qcow2" "$work/qemu.qcow2"
  rm -f "$work/qmp.sock"
  qemu-storage-daemon \
    --blockdev "driver=file,node-name=f,filename=$work/qemu.qcow2" \
    --blockdev driver=qcow2,node-name=top,file=f \
    --chardev "socket,id=c,path=$work/qmp.sock,server=on,wait=off" \
    --monitor chardev=c &
  local qpid=$!
  for i in $(seq 100); do [ -S "$work/qmp.sock" ] && break; sleep 0.1; done
  /usr/bin/python3 - "$work/qmp.sock" <<'EOF'
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
def send(cmd, **args):
    f.write(json.dumps({"execute": cmd, "arguments": args}) + "\n")
    f.flush()
def until(pred):
    while True:
        m = json.loads(f.readline())
        if "error" in m:
            sys.exit("QMP: %s" % m["error"])
        if pred(m):
            return m
until(lambda m: "QMP" in m)
send("qmp_capabilities")
until(lambda m: "return" in m)
t = time.monotonic()
send("block-stream", **{"job-id": "s", "device": "top"})
m = until(lambda m: m.get("event") == "BLOCK_JOB_COMPLETED")
if "error" in m["data"]:
    sys.exit("block-stream: %s" % m["data"]["error"])
print("%.2f" % (time.monotonic() - t))
send("quit")
EOF
  wait "$qpid" 2>/dev/null || true
}

# iops STREAM: random 4 KiB reads, QD16, of a fresh overlay, with
# stream=STREAM; "-" if the stream ended before fio did.
iops ()
{
  cp "$work/empty-nbd.qcow2" "$work/fio.qcow2"
  serve ours fio "$work/fio.qcow2" stream="$1"
  local n
  n=$(bench_fio_read "nbd+unix:///?socket=$work/fio.sock" randread 4k 16 \
        "$secs" 0)
  if [ "$1" = true ] && grep -q "stream: done" "$work/fio.log"; then n=-; fi
  bench_kill_pidfiles "$work/fio.pid"
  echo "$n"
}

# The name of a server in the table.
name ()
{
  case $(bench_kind "$1") in
    qemu) echo "qemu-storage-daemon block-stream" ;;
    *) echo "$1" ;;
  esac
}

declare -A res r
for r in $(seq "$rounds"); do
  for b in $bases; do
    for s in $(bench_order "$r" $servers); do
      case $(bench_kind "$s") in
        qemu) v=$(qemu "$b") ;;
        *) v=$(ours "$s" "$b") ;;
      esac
      res[$s-$b]+="$v "
      bench_record "stream-$b" "$s" "$r" "$v"
    done
  done
  case " $bases " in
    *" nbd "*)
      [ "${STREAM_READS:-1}" = 0 ] && continue
      res[without]+="$(iops false) "
      res[during]+="$(iops true) " ;;
  esac
done

ratio () { echo "$1 / $2" | bc -l; }
read -r first second _ <<< "$servers"
echo "$rounds rounds; medians; load average $(bench_load)"
echo "| measure | $(name "$first") | $(name "${second:-$first}") | ratio |"
echo "|---|---|---|---|"
for b in $bases; do
  o=$(bench_median "${res[$first-$b]}")
  q=$(bench_median "${res[${second:-$first}-$b]}")
  printf '| stream 1 GiB (half data) over %s, s | %s | %s | %.2f of its time |\n' \
    "${b^^}" "$o" "$q" "$(ratio "$o" "$q")"
  r[$b]=$(ratio "$o" "$q")
done
w= d=
if [ -n "${res[without]:-}" ]; then
  w=$(bench_median "${res[without]}") d=$(bench_median "${res[during]}")
  printf '| random 4 KiB reads QD16, IOPS | %s during the stream | %s without | %.2f |\n' \
    "$d" "$w" "$(ratio "$d" "$w")"
fi
[ "${BENCH_UPDATE:-1}" = 0 ] || {
  # The NBD row keeps its old name, so that its history goes on.
  [ -z "${r[nbd]:-}" ] ||
    printf 'stream 1 GiB\tqemu-storage-daemon block-stream\t%.3f\tlower\n' "${r[nbd]}"
  [ -z "${r[http]:-}" ] ||
    printf 'stream 1 GiB over HTTP\tqemu-storage-daemon block-stream\t%.3f\tlower\n' "${r[http]}"
  [ -z "$w" ] ||
    printf 'client IOPS during\twithout the stream\t%.3f\thigher\n' "$(ratio "$d" "$w")"
} | /usr/bin/python3 "$top/bench/report.py" --ratios \
    "streaming, 2 ms a read (bench/stream.sh)"
echo "all rounds:"
for k in $(printf "%s\n" "${!res[@]}" | sort); do echo "$k: ${res[$k]}"; done
