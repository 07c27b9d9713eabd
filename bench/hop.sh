#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What serving an overlay costs our server beyond the base's own
# server: nbdcopy --connections=1 --requests=16 to null: (with block
# status, and with --no-extents) of an empty qcow2 overlay over a 256
# MiB raw base of random data, in interleaved rounds, timed and with the
# CPU seconds (user + system) of the serving nbdkit:
#   local   the base a local file: ours (nbdkit qcow2 on the overlay)
#           against nbdkit's file plugin serving the base
#   nbd     the base served over NBD by nbdkit's file plugin with 2 ms
#           on every read (as bench/remote.sh): ours against nbdkit's
#           nbd plugin forwarding to the base (a server that does
#           nothing but forward: the cost of the hop itself), and the
#           base read directly (no server of ours: CPU 0)
# Usage: bench/hop.sh [ROUNDS]   (default 5)
# Prints the medians; not written to bench/ratios.tsv.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
export PATH=$top:/usr/bin:$PATH
rounds=${1:-5}
work=$(mktemp -d /var/tmp/hop-bench.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
hz=$(getconf CLK_TCK)

head -c 256M /dev/urandom > "$work/base.raw"
nbdkit -U "$work/base.sock" -P "$work/base.pid" -r --filter=delay \
  file "$work/base.raw" delay-read=2ms
for i in $(seq 100); do [ -S "$work/base.sock" ] && break; sleep 0.1; done
pids+=("$(cat "$work/base.pid")")
qemu-img create -q -f qcow2 -F raw -b "$work/base.raw" "$work/local.qcow2"
qemu-img create -q -f qcow2 -F raw \
  -b "nbd+unix:///?socket=$work/base.sock" "$work/nbd.qcow2"

# cpu PID: its CPU seconds so far.
cpu () { awk -v hz="$hz" '{ printf "%.3f", ($14 + $15) / hz }' "/proc/$1/stat"; }

# one SETUP SERVER: "wall cpu" of a copy with and without extents.
one ()
{
  local setup=$1 server=$2 uri pid= c0 t0 out=
  rm -f "$work/s.sock" "$work/s.pid"
  case $setup,$server in
    *,ours) nbdkit -U "$work/s.sock" -P "$work/s.pid" -r qcow2 \
              "$work/$setup.qcow2" ;;
    local,peer) nbdkit -U "$work/s.sock" -P "$work/s.pid" -r file \
                  "$work/base.raw" ;;
    nbd,peer) nbdkit -U "$work/s.sock" -P "$work/s.pid" -r nbd \
                socket="$work/base.sock" ;;
    nbd,direct) ln -s "$work/base.sock" "$work/s.sock" ;;
  esac
  for i in $(seq 100); do [ -S "$work/s.sock" ] && break; sleep 0.1; done
  [ "$server" = direct ] || pid=$(cat "$work/s.pid")
  uri="nbd+unix:///?socket=$work/s.sock"
  for opt in "" --no-extents; do
    c0=$([ -n "$pid" ] && cpu "$pid" || echo 0)
    t0=$(date +%s.%N)
    nbdcopy --connections=1 --requests=16 $opt "$uri" null:
    out+="$(echo "$(date +%s.%N) - $t0" | bc -l) "
    out+="$([ -n "$pid" ] && echo "$(cpu "$pid") - $c0" | bc -l || echo 0) "
  done
  [ -z "$pid" ] || { kill "$pid"; while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done; }
  rm -f "$work/s.sock"
  echo "$out"
}

declare -A res
runs="local,ours local,peer nbd,ours nbd,peer nbd,direct"
for r in $(seq "$rounds"); do
  for run in $runs; do
    read -r a b c d <<< "$(one "${run%,*}" "${run#*,}")"
    res[$run,ext]+="$a " res[$run,ext-cpu]+="$b "
    res[$run,noext]+="$c " res[$run,noext-cpu]+="$d "
  done
done

median () { printf '%s\n' $1 | sort -g | awk '{ v[NR] = $1 } END { printf "%.3f", v[int((NR + 1) / 2)] }'; }
echo "$rounds rounds, medians, seconds a copy of 256 MiB (CPU: the serving nbdkit's); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| base | server | copy s | CPU s | --no-extents s | CPU s |"
echo "|---|---|---|---|---|---|"
for run in $runs; do
  name=${run#*,}
  [ "$name" = peer ] && { [ "${run%,*}" = local ] && name="file plugin (the base)" || name="nbd plugin (a proxy)"; }
  echo "| ${run%,*} | $name | $(median "${res[$run,ext]}") | $(median "${res[$run,ext-cpu]}") | $(median "${res[$run,noext]}") | $(median "${res[$run,noext-cpu]}") |"
done
echo "all rounds:"
for run in $runs; do
  for k in ext ext-cpu noext noext-cpu; do echo "$run $k: ${res[$run,$k]}"; done
done
