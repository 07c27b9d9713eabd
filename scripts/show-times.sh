#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# show-times.sh TESTDIR [N]: the N slowest tests of the last make check
# in TESTDIR (default 12) and the sum of all: from the start that
# tests/bounded writes first in each log to the time the test driver
# wrote the test's .trs file, at its end.
dir=${1:-tests}
n=${2:-12}
for log in "$dir"/*.log; do
  trs=${log%.log}.trs
  [ -f "$trs" ] || continue
  start=$(sed -n '1s/^bounded: started at \([0-9]*\)$/\1/p' "$log")
  [ -n "$start" ] && echo "$(( $(stat -c %Y "$trs") - start )) ${log##*/}"
done | sort -rn | awk -v n="$n" '
  NR <= n { printf "%6d s  %s\n", $1, $2 }
  { sum += $1 }
  END { printf "%6d s  in all (%d tests; make -j runs them side by side)\n", sum, NR }'
