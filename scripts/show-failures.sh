#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# show-failures.sh TESTDIR: print the logs of the tests that failed in
# TESTDIR (automake's .trs files), tail first, so that a CI transcript
# that keeps only the end still shows why.
dir=${1:-tests}
for trs in "$dir"/*.trs; do
  grep -qE '^:test-result: (FAIL|ERROR)' "$trs" || continue
  log=${trs%.trs}.log
  echo "===== $log (last 60 lines)"
  tail -n 60 "$log"
done
