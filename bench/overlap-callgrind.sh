#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The cost of the overlap guard on a real write load: fill an
# empty image of 512-byte clusters (the most metadata per byte of data,
# so the most checks and map updates) through the plugin under
# callgrind, once with overlap-check=all and once with none, and report
# the share of the plugin's instructions spent in the guard.
#
# Run from the top of a built tree:  bench/overlap-callgrind.sh
# Environment: SIZE (virtual size, default 256M), CLUSTER (cluster
# size, default 512), OUT (where the callgrind files are kept, default
# a new temporary directory).

set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
plugin=$top/plugins/qcow2/.libs/nbdkit-qcow2-plugin.so
size=${SIZE:-256M}
cluster=${CLUSTER:-512}
out=${OUT:-$(mktemp -d /tmp/overlap-callgrind.XXXXXX)}

# Debian's nbdkit, and nbdsh/nbdcopy with Debian's python3.
export PATH=/usr/bin:$PATH

for prog in valgrind callgrind_annotate qemu-img nbdcopy python3; do
  command -v $prog >/dev/null ||
    { echo "$0: $prog is needed" >&2; exit 1; }
done
[ -f "$plugin" ] ||
  { echo "$0: $plugin not found: build the tree first" >&2; exit 1; }
mkdir -p "$out"

pid=
cleanup ()
{
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || :
  rm -f "$out"/*.qcow2 "$out"/*.sock
}
trap cleanup EXIT

# run MODE: fill a new image under callgrind, leave $out/cg.MODE.out.
run ()
{
  local mode=$1 img=$out/$1.qcow2 sock=$out/$1.sock i

  rm -f "$img" "$sock"
  qemu-img create -q -f qcow2 -o cluster_size="$cluster" "$img" "$size"
  valgrind --tool=callgrind --callgrind-out-file="$out/cg.$mode.out" \
           --log-file="$out/valgrind.$mode.log" \
           /usr/bin/nbdkit -f -U "$sock" "$plugin" \
           file="$img" overlap-check="$mode" &
  pid=$!
  for i in $(seq 600); do
    [ -S "$sock" ] && break
    kill -0 $pid 2>/dev/null ||
      { echo "$0: nbdkit died, see $out/valgrind.$mode.log" >&2; exit 1; }
    sleep 0.1
  done
  # One connection, one request at a time: a sequential fill.
  timeout 3600 nbdcopy --connections=1 --requests=1 --flush -- \
          [ nbdkit pattern "$size" ] "nbd+unix:///?socket=$sock"
  # nbdkit exits cleanly on SIGTERM and callgrind writes its file.
  kill -TERM $pid
  wait $pid
  pid=
  qemu-img check -q "$img"
  rm -f "$img"
}

run all
run none

printf '\nfill of %s in %s-byte clusters (%s)\n\n' "$size" "$cluster" "$out"
for mode in all none; do
  python3 "$top/bench/callgrind-share.py" "$out/cg.$mode.out" "$plugin" |
    head -1 | sed "s/^/mode $mode /"
done |
  awk '
    { for (i = 1; i < NF; i += 2) v[$2, $i] = $(i + 1) }
    END {
      print "| overlap-check | plugin Ir | checks | check Ir | Ir/check " \
            "| check share | map upkeep Ir | upkeep share |"
      print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      split("all none", modes, " ")
      for (k = 1; k <= 2; k++) {
        m = modes[k]
        printf "| %s | %.0f | %.0f | %.0f | %.1f | %.3f%% | %.0f | %.3f%% |\n",
               m, v[m, "plugin"], v[m, "calls"], v[m, "check"],
               v[m, "calls"] ? v[m, "check"] / v[m, "calls"] : 0,
               100 * v[m, "check"] / v[m, "plugin"], v[m, "maint"],
               100 * v[m, "maint"] / v[m, "plugin"]
      }
      d = v["all", "plugin"] - v["none", "plugin"]
      printf "\nall costs %.0f Ir more than none: %.3f%% of the plugin " \
             "with all\n", d, 100 * d / v["all", "plugin"]
    }'

printf '\nTop functions of the plugin with overlap-check=all:\n'
python3 "$top/bench/callgrind-share.py" "$out/cg.all.out" "$plugin" 15 |
  tail -n +2
printf '\nMore: callgrind_annotate --inclusive=yes %s/cg.all.out\n' "$out"
