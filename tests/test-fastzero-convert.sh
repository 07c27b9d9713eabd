#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The qemu-img convert matrix (fast zero): a half-sparse 8 MiB source
# (every other MiB written; bench/convert-matrix.sh uses 100 MiB) copied with qemu-img convert into every
# zeromode/fastzeromode pair of the fastzero filter (probe where it is
# allowed), over the memory plugin and over our qcow2 plugin, by
# qemu-img alone and after a fast zero of the whole target (what
# qemu-img did until 2020).  Each copy must succeed and equal the
# source; the requests the client sent (log filter above fastzero) and
# those that reached the plugin (iostats below it) must be the ones
# tests/convert-matrix.sh explains, case by case; qcow2 images must
# pass qemu-img check with the expected clusters allocated.
# bench/convert-matrix.sh times the same cases.  Last, a zero above
# 64 MiB under zeromode=emulate, written in 64 MiB pieces.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img qemu-io nbdsh
CM_SIZE_MIB=8
source "${srcdir:-.}/convert-matrix.sh"

cm_make_source
n=0
for plugin in memory qcow2; do
  while read -r zm fm; do
    for client in convert prezero; do
      cm_run $plugin "$zm" "$fm" $client
      cm_check $plugin "$zm" "$fm" $client
      echo "ok: $plugin zeromode=$zm fastzeromode=$fm $client:" \
        "pre-zero $prezero, plugin: $p_writes writes," \
        "$p_fast_ok+$p_slow_ok zeroes, ${cm_elapsed} s"
      n=$(( n + 1 ))
    done
  done < <(cm_cases)
done
[ "$n" -eq 76 ] || fail "ran $n cases, expected 76"

# The matrix's zeroes are small: one of 65 MiB, emulated, reaches the
# plugin as a write of 64 MiB and one of 1 MiB, and zeroes both.
nbdkit -U - --filter=fastzero --filter=iostats memory 65M \
  zeromode=emulate iostats-file="$tmp/big.json" iostats-format=json \
  --run 'nbdsh -u "$uri" -c "
h.pwrite(b\"x\" * 512, 0)
h.pwrite(b\"y\" * 512, 65 * 1024 * 1024 - 512)
h.zero(h.get_size(), 0)
assert h.pread(512, 0) == bytes(512)
assert h.pread(512, 65 * 1024 * 1024 - 512) == bytes(512)
"' || fail "an emulated zero of 65 MiB"
/usr/bin/python3 -c '
import json, sys
w = [json.loads(l) for l in open(sys.argv[1])][-1]["ops"]["write"]
sys.exit(w["count"] != 4 or w["bytes"] != 1024 + 65 * 1024 * 1024)
' "$tmp/big.json" || fail "65 MiB emulated zero: not 2 writes (+2): $(cat "$tmp/big.json")"

# The one pair left out of the matrix.
expect_refused 'fastzeromode=probe needs zeromode=emulate, notrim or plugin' \
  --filter=fastzero memory 1M zeromode=none fastzeromode=probe
