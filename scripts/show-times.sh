#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# show-times.sh TESTDIR [N]: the N slowest tests of the last make check
# in TESTDIR (default 12) and the sum of all, from the wall time that
# tests/bounded writes at the end of each log.
dir=${1:-tests}
n=${2:-12}
for log in "$dir"/*.log; do
  [ -f "${log%.log}.trs" ] || continue
  t=$(sed -n 's/^bounded: \([0-9]*\) s$/\1/p' "$log" | tail -n 1)
  [ -n "$t" ] && echo "$t ${log##*/}"
done | sort -rn | awk -v n="$n" '
  NR <= n { printf "%6d s  %s\n", $1, $2 }
  { sum += $1 }
  END { printf "%6d s  in all (%d tests; make -j runs them side by side)\n", sum, NR }'
