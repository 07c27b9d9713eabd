# SPDX-License-Identifier: BSD-3-Clause
# What the bench scripts share, sourced by them once they have set top
# (the tree they run from):  . "$top/bench/lib.sh"
#
# Other builds as servers.  BENCH_TREES='NAME=DIR ...' names built
# trees (checkouts built in place, as bench/compare.sh makes them).  A
# server called NAME, or NAME-SUFFIX, is then the script's "ours" (or
# "ours-SUFFIX": old-t1 is ours-t1, old-none ours-none) served by DIR's
# build instead of this tree's, so that one script measures two
# revisions in the same rounds.
#
# Figures for another script.  With BENCH_TSV=FILE each script appends
# one line a measure taken, "CASE<TAB>SERVER<TAB>ROUND<TAB>VALUE"
# (bench/compare.sh reads them).

# bench_tree SERVER: the build tree that serves SERVER.
bench_tree ()
{
  local t
  for t in ${BENCH_TREES:-}; do
    case $1 in
      "${t%%=*}" | "${t%%=*}"-*) echo "${t#*=}"; return ;;
    esac
  done
  echo "$top"
}

# bench_kind SERVER: which of the script's servers SERVER is: a tree's
# server is ours, with its suffix.
bench_kind ()
{
  local t
  for t in ${BENCH_TREES:-}; do
    case $1 in
      "${t%%=*}") echo ours; return ;;
      "${t%%=*}"-*) echo "ours-${1#"${t%%=*}"-}"; return ;;
    esac
  done
  echo "$1"
}

# bench_nbdkit SERVER: the nbdkit command of SERVER's tree (its
# build-tree wrapper: "qcow2" and our filters' names are its build's).
bench_nbdkit () { echo "$(bench_tree "$1")/nbdkit"; }

# bench_plugin SERVER: the qcow2 plugin of SERVER's tree.
bench_plugin ()
{
  echo "$(bench_tree "$1")/plugins/qcow2/.libs/nbdkit-qcow2-plugin.so"
}

# bench_order ROUND ITEM...: the items, one a line, in their order in an
# odd round and the other way round in an even one: of any two servers,
# each goes first in every other round, so that a change in the
# machine's load, or what one run leaves the next (dirty pages, a warm
# cache), falls on both alike.
bench_order ()
{
  local round=$1 i
  shift
  for ((i = 0; i < $#; i++)); do
    if ((round % 2)); then printf '%s\n' "${@:i+1:1}"
    else printf '%s\n' "${@:$#-i:1}"
    fi
  done
}

# bench_median "V ...": the median of the values (the lower middle one
# of an even count), "-" values left out; "-" if no value is left.
bench_median ()
{
  printf '%s\n' $1 | sort -g |
    awk '$1 != "-" { v[++n] = $1 } END { print n ? v[int((n + 1) / 2)] : "-" }'
}

# bench_record CASE SERVER ROUND VALUE: a measure into $BENCH_TSV.
bench_record ()
{
  [ -z "${BENCH_TSV:-}" ] || printf '%s\t%s\t%s\t%s\n' "$@" >> "$BENCH_TSV"
}

# bench_load: the machine's load average (1, 5, 15 minutes).
bench_load () { cut -d' ' -f1-3 /proc/loadavg; }

# bench_cpu PID: the CPU seconds (user and system) PID has used, or "-"
# (no PID, or gone).
bench_cpu ()
{
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f\n", ($14 + $15) / hz }' \
    "/proc/${1:-none}/stat" 2>/dev/null || echo -
}

# bench_wait_sock SOCKET [PIDFILE]: returns once the socket (and the
# pid file, not empty) exist; fails after 30 s.
bench_wait_sock ()
{
  local i
  for i in $(seq 600); do
    [ -S "$1" ] && { [ -z "${2:-}" ] || [ -s "$2" ]; } && return
    sleep 0.05
  done
  echo "$0: $1 not there after 30 s" >&2
  return 1
}

# bench_kill_pidfiles FILE...: ends the processes the pid files name
# (those that exist), and waits for them: a trap's cleaning up of the
# servers a subshell started.
bench_kill_pidfiles ()
{
  local f p
  for f in "$@"; do
    [ -s "$f" ] || continue
    p=$(cat "$f")
    kill "$p" 2>/dev/null || continue
    while kill -0 "$p" 2>/dev/null; do sleep 0.05; done
  done
}

# bench_fio_read URI RW BS DEPTH SECONDS [RAMP]: fio's nbd engine
# reading URI for SECONDS after RAMP (default 1); prints IOPS for 4 KiB
# blocks, else MiB/s.
bench_fio_read ()
{
  fio --name=r --ioengine=nbd --uri="$1" --rw="$2" --bs="$3" \
      --iodepth="$4" --time_based --runtime="$5" --ramp_time="${6:-1}" \
      --output-format=json 2>/dev/null |
    /usr/bin/python3 -c '
import json, sys
out = sys.stdin.read()   # JSON after a line saying "connected"
r = json.loads(out[out.index("{"):])["jobs"][0]["read"]
print("%.1f" % (r["iops"] if sys.argv[1] == "4k" else r["bw"] / 1024))' "$3"
}
