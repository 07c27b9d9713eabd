#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Elapsed times of the qemu-img convert matrix (fast zero): the cases of
# tests/test-fastzero-convert.sh (every zeromode/fastzeromode pair,
# over the memory plugin and over the qcow2 plugin, by qemu-img alone
# and after a pre-zero), with a delay on every write that reaches the
# plugin, each run checked as the test checks it.  Prints a Markdown
# table of the median seconds of each case on standard output.
#
# Usage, in a built tree:
#   bench/convert-matrix.sh [RUNS]
# RUNS (default 3) runs of each case, taken in turns (every case once,
# then again) so that a slow spell of the machine spreads over all
# cases.  CM_LATENCY holds the latency filter's parameters, default
# "latency-writes=2ms": 2 ms on each write, zero and trim that reaches
# it (it is below blocksize: on each 256 KiB piece of a write; fast
# zeroes wait too); set it empty for no latency filter.
#
# The time of a case is that of the copy: the whole qemu-img convert,
# plus the pre-zero's request (without nbdsh's start), measured inside
# nbdkit's --run; not nbdkit's start, nor the checks.
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
export abs_top_builddir="${abs_top_builddir:-$top}"
srcdir="${abs_top_srcdir:-$top}/tests"
source "$srcdir/functions.sh"
requires qemu-img qemu-io nbdsh
source "$srcdir/convert-matrix.sh"
export CM_LATENCY="${CM_LATENCY-latency-writes=2ms}"
runs="${1:-3}"

# sees: what reached the plugin, in the notation of convert-matrix.sh's
# table, from cm_expect's variables.
sees ()
{
  local s="$p_writes W"
  [ "$p_slow_ok" -eq 0 ] || s="$s + $p_slow_ok Z"
  [ "$p_fast_ok" -eq 0 ] || s="$s + $p_fast_ok fast Z"
  echo "$s"
}

# median of the numbers in a file, one per line.
median ()
{
  sort -n "$1" | awk '{ v[NR] = $1 }
    END { if (NR % 2) print v[(NR + 1) / 2];
          else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

cm_make_source
mapfile -t cases < <(cm_cases)
times=$tmp/times
mkdir -p "$times"
for (( r = 1; r <= runs; r++ )); do
  for c in "${cases[@]}"; do
    read -r zm fm <<< "$c"
    for plugin in memory qcow2; do
      for client in convert prezero; do
        cm_run $plugin "$zm" "$fm" $client
        cm_check $plugin "$zm" "$fm" $client
        echo "$cm_elapsed" >> "$times/$plugin.$zm.$fm.$client"
        echo "run $r: $plugin $zm $fm $client: $cm_elapsed s" >&2
      done
    done
  done
done

echo "| zeromode | fastzeromode | convert: plugin sees | memory | qcow2 | prezero: fast zero | plugin sees | memory | qcow2 |"
echo "| --- | --- | --- | ---: | ---: | --- | --- | ---: | ---: |"
for c in "${cases[@]}"; do
  read -r zm fm <<< "$c"
  row="| $zm | $fm"
  for client in convert prezero; do
    cm_expect "$zm" "$fm" "$client"
    if [ "$client" = prezero ]; then
      [ "$prezero" != none ] || prezero="not offered"
      row="$row | $prezero"
    fi
    row="$row | $(sees)"
    for plugin in memory qcow2; do
      row="$row | $(median "$times/$plugin.$zm.$fm.$client")"
    done
  done
  echo "$row |"
done
