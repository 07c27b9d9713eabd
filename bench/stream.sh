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
# (default both bases, 3 rounds of 5 s)
# Prints the medians and the ratios, which go into bench/ratios.tsv and
# its chart unless BENCH_UPDATE=0.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
export PATH=$top:/usr/bin:$PATH
rounds=${1:-3} secs=${2:-5}
bases=${STREAM_BASES:-nbd http}
work=$(mktemp -d /var/tmp/stream-bench.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT

qemu-img create -q -f raw "$work/base.raw" 1G
cmds=()
for i in $(seq 0 2 127); do cmds+=(-c "write -P $((i % 200 + 1)) $((i * 8))M 8M"); done
qemu-io -f raw "${cmds[@]}" "$work/base.raw" > /dev/null
for b in $bases; do
  case $b in
    nbd)
      nbdkit -U "$work/base.sock" -P "$work/base.pid" -r --filter=delay \
        file "$work/base.raw" delay-read=2ms
      for i in $(seq 100); do [ -S "$work/base.sock" ] && break; sleep 0.1; done
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

# serve NAME ARGS...: our plugin in the foreground of a background job,
# its messages in $work/NAME.log.
serve ()
{
  local name=$1; shift
  rm -f "$work/$name.sock"
  nbdkit -f -U "$work/$name.sock" --log=stderr qcow2 "$@" 2> "$work/$name.log" &
  spid=$!
  for i in $(seq 100); do [ -S "$work/$name.sock" ] && break; sleep 0.1; done
}
stop () { kill "$1"; wait "$1" 2>/dev/null || true; }

# ours BASE: seconds of the stream, from the end notice.
ours ()
{
  cp "$work/empty-$1.qcow2" "$work/ours.qcow2"
  serve ours "$work/ours.qcow2" stream=true
  for i in $(seq 3000); do
    grep -q "no longer depends" "$work/ours.log" && break
    sleep 0.1
  done
  stop "$spid"
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
  serve fio "$work/fio.qcow2" stream="$1"
  local n
  n=$(fio --name=r --ioengine=nbd --uri="nbd+unix:///?socket=$work/fio.sock" \
        --rw=randread --bs=4k --iodepth=16 --time_based --runtime="$secs" \
        --output-format=json 2>/dev/null |
      /usr/bin/python3 -c '
import json, sys
out = sys.stdin.read()
print("%.0f" % json.loads(out[out.index("{"):])["jobs"][0]["read"]["iops"])')
  if [ "$1" = true ] && grep -q "stream: done" "$work/fio.log"; then n=-; fi
  stop "$spid"
  echo "$n"
}

declare -A res r
for r in $(seq "$rounds"); do
  for b in $bases; do
    res[ours-$b]+="$(ours "$b") "
    res[qemu-$b]+="$(qemu "$b") "
  done
  case " $bases " in
    *" nbd "*)
      res[without]+="$(iops false) "
      res[during]+="$(iops true) " ;;
  esac
done

median () { printf '%s\n' $1 | grep -v '^-$' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio () { echo "$1 / $2" | bc -l; }
echo "$rounds rounds; medians"
echo "| measure | ours | peer | ratio |"
echo "|---|---|---|---|"
for b in $bases; do
  o=$(median "${res[ours-$b]}") q=$(median "${res[qemu-$b]}")
  printf '| stream 1 GiB (half data) over %s, s | %s | %s (qemu-storage-daemon block-stream) | %.2f of its time |\n' \
    "${b^^}" "$o" "$q" "$(ratio "$o" "$q")"
  r[$b]=$(ratio "$o" "$q")
done
w= d=
if [ -n "${res[without]:-}" ]; then
  w=$(median "${res[without]}") d=$(median "${res[during]}")
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
