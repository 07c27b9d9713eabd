#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Two revisions compared case by case, in one run:
#   bench/compare.sh OLD NEW
# OLD and NEW are git revisions of this repository, each checked out in
# a worktree of its own (in a temporary folder, removed at the end) and
# built there, or trees built already (folders).  Both are measured by
# this tree's bench scripts (bench/run.sh, remote.sh, fleet.sh,
# stream.sh, which serve other trees' builds by BENCH_TREES:
# bench/lib.sh), every case in interleaved rounds: each round runs OLD
# and NEW one after the other, the one that goes first alternating, so
# that a change in the machine's load falls on both alike.
#
# Cases, by kind (the setup of each is its script's):
#   local-...    bench/run.sh, the page cache: randread and randwrite
#                4 KiB at QD1 and QD16 (512 MiB written image);
#                flush64-seqwrite (64 KiB sequential writes, a flush
#                every 64)
#   direct-...   bench/run.sh, cache=none: randread 4 KiB QD16
#   remote-nbd-...   bench/remote.sh, an empty overlay over a raw base on
#                NBD, 2 ms a read: fio sequential 256 KiB QD16, nbdcopy
#                (--connections=1 --requests=16) on a fresh server (cold)
#                and after a first pass (warm), fio random 4 KiB QD16;
#                the serving server's CPU seconds a copy (-cpu: steadier
#                than the time on a busy machine)
#   remote-http-...  the same base on a web server: nbdcopy cold, warm
#   fleet-...    bench/fleet.sh, 40 overlays of a local base connecting
#                at once, `nbdkit -t 1`: first byte (median), the late
#                disks' first byte, memory (PSS), read IOPS; and memory
#                with nbdkit's default threads; and memory with writes
#                of up to 4 MiB (FLEET_WRITE_MAX), either thread count
#   stream-...   bench/stream.sh, stream=true of 1 GiB (half data) over
#                NBD, 2 ms a read: seconds to the end notice
#
# Output: a table on stdout, and one row a case in $COMPARE_OUT, tab
# separated: case, old, new, ratio, verdict (comment lines first: the
# revisions, the rounds, the machine's load at each script's start and
# end).  old and new are the medians of the rounds' values (the unit is
# in the table).  ratio is the median of the rounds' ratios, each NEW
# against OLD of the same round, as a plain decimal where above 1 is
# NEW better: new/old for what is better higher (IOPS, MiB/s), old/new
# for what is better lower (ms, MiB of memory, seconds).  verdict:
#   regressed  the ratio below 1 - T (T = COMPARE_TOLERANCE, 0.1) with
#              rounds that agree: every round's ratio below 1, and
#              their mean (of logarithms) further from 1 than chance
#              makes it with their spread, 99 times in 100 (Student's t)
#   better     the ratio above 1 / (1 - T), the rounds agreeing so
#   noisy      beyond either bound with rounds that do not agree, or
#              rounds on both sides of the bounds
#   same       otherwise
# A tree against itself gives same or noisy: chance makes a false
# verdict about once in 100 cases however noisy the machine; a real
# change needs more rounds to show the more the rounds scatter (at
# least 2; on this machine, loaded, 5 to 7).  Every round's figures go
# beside the TSV, in its name with .rounds.tsv for .tsv.
#
# Environment:
#   COMPARE_ROUNDS=N      rounds (default 3; more where the machine is
#                         busy)
#   COMPARE_OUT=FILE      the TSV (default bench/compare.tsv)
#   COMPARE_QUICK=1       a subset covering local, remote and fleet
#                         (local-randread-4k-qd16, local-randwrite-4k-qd16,
#                         remote-nbd-seq-256k-qd16, remote-nbd-copy-warm
#                         and its -cpu, fleet-40-first-byte, fleet-40-pss,
#                         fleet-40-read-iops), shorter runs: about 5
#                         minutes on 2 cores, the builds included
#   COMPARE_CASES=REGEX   only the cases whose name matches
#   COMPARE_SECONDS=S     the timed cases' seconds a run (default 3;
#                         quick 1, remote 3)
#   COMPARE_BUILDS=DIR    revisions' worktrees made and built there (by
#                         commit) and kept, reused by the next run with
#                         the same commit (bisecting); remove them with
#                         git worktree remove
#   COMPARE_CONFIGURE='ARGS'   configure's arguments for both builds
#   BENCH_DIR             bench/run.sh's images (kept for the next run)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/bench/lib.sh"
export PATH=/usr/bin:$PATH

[ $# = 2 ] || { sed -n '3,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 1; }
quick=${COMPARE_QUICK:-0}
rounds=${COMPARE_ROUNDS:-3}
tolerance=${COMPARE_TOLERANCE:-0.1}
out=${COMPARE_OUT:-$top/bench/compare.tsv}
only=${COMPARE_CASES:-}
if [ "$quick" = 1 ]; then secs=${COMPARE_SECONDS:-1}; else secs=${COMPARE_SECONDS:-3}; fi

work=$(mktemp -d /var/tmp/compare.XXXXXX)
made=()
cleanup ()
{
  local d
  for d in "${made[@]}"; do git -C "$top" worktree remove --force "$d" || :; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log () { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
die () { echo "bench/compare.sh: $*" >&2; exit 1; }

# tree SPEC NAME: sets tree_dir to the built tree of SPEC (a folder
# built already, or a revision built in a worktree of its own).
tree ()
{
  local spec=$1 name=$2 sha dir
  if [ -d "$spec" ]; then
    tree_dir=$(cd "$spec" && pwd)
    [ -f "$tree_dir/plugins/qcow2/.libs/nbdkit-qcow2-plugin.so" ] &&
      [ -x "$tree_dir/nbdkit" ] || die "$spec: not a built tree"
    tree_desc="$spec (a built tree)"
    return
  fi
  sha=$(git -C "$top" rev-parse --verify --quiet "$spec^{commit}") ||
    die "$spec: neither a built tree nor a revision"
  tree_desc="$spec ($(git -C "$top" log -1 --format='%h %s' "$sha"))"
  if [ -n "${COMPARE_BUILDS:-}" ]; then
    mkdir -p "$COMPARE_BUILDS"
    dir=$(cd "$COMPARE_BUILDS" && pwd)/$sha
  else
    dir=$work/$name
  fi
  tree_dir=$dir
  [ ! -f "$dir/.compare-built" ] || return 0
  # A build cut short: its worktree made again (-f: registered, even
  # if its folder is gone; other worktrees of the repository untouched).
  git -C "$top" worktree remove --force "$dir" > /dev/null 2>&1 || :
  rm -rf "$dir"
  git -C "$top" worktree add -f --detach "$dir" "$sha" > /dev/null 2>&1 ||
    die "git worktree add $dir $sha failed"
  [ -n "${COMPARE_BUILDS:-}" ] || made+=("$dir")
  log "building $spec in $dir"
  (cd "$dir" && nice autoreconf -fi && nice ./configure ${COMPARE_CONFIGURE:-} &&
     nice make -j"$(nproc)") > "$dir.build.log" 2>&1 || {
    tail -30 "$dir.build.log" >&2
    die "building $spec failed (the log's end above)"
  }
  touch "$dir/.compare-built"
}

# The cases: name, group (the script run), the script's case, the
# servers' suffix, unit, which is better, whether COMPARE_QUICK runs it.
cases_all="\
local-randread-4k-qd1	local	randread-4k-qd1	-	IOPS	higher	-
local-randread-4k-qd16	local	randread-4k	-	IOPS	higher	quick
local-randwrite-4k-qd1	local	randwrite-4k-qd1	-	IOPS	higher	-
local-randwrite-4k-qd16	local	randwrite-4k	-	IOPS	higher	quick
local-flush64-seqwrite	local	flush64-seqwrite	-	IOPS	higher	-
direct-randread-4k-qd16	direct	randread-4k	-none	IOPS	higher	-
remote-nbd-seq-256k-qd16	remote	seq-256k-qd16	-	MiB/s	higher	quick
remote-nbd-copy-cold	remote	copy	-	MiB/s	higher	-
remote-nbd-copy-warm	remote	copy-warm	-	MiB/s	higher	quick
remote-nbd-copy-cold-cpu	remote	copy-cpu	-	CPU s	lower	-
remote-nbd-copy-warm-cpu	remote	copy-warm-cpu	-	CPU s	lower	quick
remote-nbd-rand-4k-qd16	remote	rand-4k	-	IOPS	higher	-
remote-http-copy-cold	remote	copy-http	-	MiB/s	higher	-
remote-http-copy-warm	remote	copy-http-warm	-	MiB/s	higher	-
fleet-40-first-byte	fleet	40-local-ttfb	-t1	ms	lower	quick
fleet-40-first-byte-late	fleet	40-local-lfb	-t1	ms	lower	-
fleet-40-pss	fleet	40-local-pss	-t1	MiB	lower	quick
fleet-40-read-iops	fleet	40-local-iops	-t1	IOPS	higher	quick
fleet-40-pss-default-threads	fleet	40-local-pss	-	MiB	lower	-
fleet-40-pss-4m-writes	fleetw	40-local-w4M-pss	-	MiB	lower	-
fleet-40-pss-4m-writes-t1	fleetw	40-local-w4M-pss	-t1	MiB	lower	-
stream-nbd-1g	stream	stream-nbd	-	s	lower	-"
: > "$work/cases"
while IFS=$'\t' read -r name group key suffix unit better q; do
  [ "$quick" != 1 ] || [ "$q" = quick ] || continue
  [ -z "$only" ] || [[ $name =~ $only ]] || continue
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$group" "$key" "${suffix#-}" \
    "$unit" "$better" >> "$work/cases"
done <<< "$cases_all"
[ -s "$work/cases" ] || die "no case matches ${only:-the selection}"

tree "$1" old
old=$tree_dir old_desc=$tree_desc
tree "$2" new
new=$tree_dir new_desc=$tree_desc
export BENCH_TREES="old=$old new=$new" BENCH_UPDATE=0

# keys GROUP: the group's script cases (CASE-cpu is CASE's CPU time);
# servers GROUP: its servers.
keys ()
{
  awk -F'\t' -v g="$1" '$2 == g { sub(/-cpu$/, "", $3); print $3 }' \
    "$work/cases" | sort -u
}
servers ()
{
  awk -F'\t' -v g="$1" '$2 == g { print $4 }' "$work/cases" | sort -u |
    while IFS= read -r s; do echo "old${s:+-$s} new${s:+-$s}"; done
}

# run GROUP: the group's script, its figures into $work/GROUP.tsv.
run ()
{
  local group=$1 list
  list=$(keys "$group")
  [ -n "$list" ] || return 0
  echo "# $group: load at start: $(uptime)" >> "$work/loads"
  log "$group: $(echo $list) with $(echo $(servers "$group")), $rounds rounds"
  export BENCH_TSV=$work/$group.tsv
  case $group in
    local | direct)
      BENCH_CASES="^($(echo $list | tr ' ' '|'))\$" \
        BENCH_SERVERS="$(servers "$group")" BENCH_REPS=$rounds \
        BENCH_RUNTIME=$secs BENCH_SYNCS=0 \
        "$top/bench/run.sh" --quick ;;
    remote)
      REMOTE_CASES="$(echo $list)" REMOTE_SERVERS="$(servers remote)" \
        "$top/bench/remote.sh" "$rounds" "$(( secs < 3 ? 3 : secs ))" ;;
    fleet)
      local late=8
      [[ $list == *-lfb* ]] || late=0
      FLEET_SERVERS="$(servers fleet)" FLEET_BASES=local FLEET_LATE=$late \
        "$top/bench/fleet.sh" "$rounds" 40 ;;
    fleetw)
      FLEET_SERVERS="$(servers fleetw)" FLEET_BASES=local FLEET_LATE=0 \
        FLEET_WRITE_MAX=4M "$top/bench/fleet.sh" "$rounds" 40 ;;
    stream)
      STREAM_SERVERS="$(servers stream)" STREAM_BASES=nbd STREAM_READS=0 \
        "$top/bench/stream.sh" "$rounds" ;;
  esac > "$work/$group.log" 2>&1 || {
    # Its cases are missing (an old tree may lack what they need).
    tail -15 "$work/$group.log" >&2
    log "$group: its script failed (the log's end above)"
    echo "# $group: failed (its cases missing): $(tail -1 "$work/$group.log")" \
      >> "$work/loads"
    rm -f "$BENCH_TSV"
    return 0
  }
  echo "# $group: load at end: $(uptime)" >> "$work/loads"
}

start=$(date -u '+%Y-%m-%d %H:%M UTC')
: > "$work/loads"
for group in local direct remote fleet fleetw stream; do run "$group"; done

# The rows: each case's rounds paired, OLD's value against NEW's.
cat "$work"/*.tsv 2>/dev/null | awk -F'\t' -v cases="$work/cases" \
    -v tol="$tolerance" -v rounds="$rounds" -v out="$work/rows" \
    -v each="$work/rounds" '
# Two-sided 99% points of the t distribution, by degrees of freedom.
function tcrit(df) {
  split("63.66 9.925 5.841 4.604 4.032 3.707 3.499 3.355 3.250 3.169 3.106 3.055 3.012 2.977 2.947", t, " ")
  return df <= 15 ? t[df] : 2.9
}
# Returns true if the n ratios r[] lean one way by more than chance.
function agree(r, n,   i, s, ss, mean, sd) {
  if (n < 2)
    return 0
  for (i = 1; i <= n; i++)
    s += log(r[i])
  mean = s / n
  for (i = 1; i <= n; i++)
    ss += (log(r[i]) - mean) ^ 2
  sd = sqrt(ss / (n - 1))
  return mean * mean > (tcrit(n - 1) * sd) ^ 2 / n
}
function median(a, n,   i, j, t) {
  for (i = 2; i <= n; i++)
    for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
      t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
    }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ v[$1, $2, $3] = $4 }
END {
  lo = 1 - tol; hi = 1 / lo
  while ((getline line < cases) > 0) {
    split(line, c, "\t")
    name = c[1]; key = c[3]; sfx = c[4] == "" ? "" : "-" c[4]
    n = 0; below = above = 0; list = ""
    delete o; delete w; delete r
    for (i = 1; i <= rounds; i++) {
      a = v[key, "old" sfx, i]; b = v[key, "new" sfx, i]
      if (a == "" || b == "" || a == "-" || b == "-" || a + 0 <= 0 || b + 0 <= 0)
        continue
      n++
      o[n] = a + 0; w[n] = b + 0
      r[n] = c[6] == "higher" ? b / a : a / b
      printf "%s\t%d\t%s\t%s\t%.3f\n", name, i, a, b, r[n] > each
      below += r[n] < 1; above += r[n] > 1
      list = list sprintf("%s%.3f", n > 1 ? " " : "", r[n])
      rmin = n == 1 || r[n] < rmin ? r[n] : rmin
      rmax = n == 1 || r[n] > rmax ? r[n] : rmax
    }
    if (n == 0) {
      printf "%s\t-\t-\t-\tmissing\t%s\t%s\t\n", name, c[5], c[6] > out
      continue
    }
    m = median(r, n)
    if (m < lo) verdict = below == n && agree(r, n) ? "regressed" : "noisy"
    else if (m > hi) verdict = above == n && agree(r, n) ? "better" : "noisy"
    else if (rmin < lo && rmax > hi) verdict = "noisy"
    else verdict = "same"
    printf "%s\t%.6g\t%.6g\t%.3f\t%s\t%s\t%s\t%s\n", name, median(o, n),
      median(w, n), m, verdict, c[5], c[6], list > out
  }
}'

{
  echo "# bench/compare.sh, $start: OLD $old_desc; NEW $new_desc"
  echo "# $rounds rounds$([ "$quick" = 1 ] && echo ', quick'), $secs s a timed run; $(nproc) cores"
  echo "# ratio: NEW against OLD, median of the rounds' ratios, above 1 NEW" \
    "better: new/old where higher is better (IOPS, MiB/s), old/new where" \
    "lower is (ms, MiB of memory, s)"
  echo "# verdict: regressed below $(awk -v t="$tolerance" 'BEGIN { print 1 - t }')" \
    "with every round below 1 and their mean beyond chance (t, 99%)," \
    "better the same above the inverse, noisy if the rounds do not" \
    "agree, same otherwise"
  cat "$work/loads"
  printf 'case\told\tnew\tratio\tverdict\n'
  cut -f1-5 "$work/rows"
} > "$out"
{
  printf 'case\tround\told\tnew\tratio\n'
  cat "$work/rounds" 2>/dev/null
} > "${out%.tsv}.rounds.tsv"

echo "OLD: $old_desc"
echo "NEW: $new_desc"
echo "$rounds rounds; ratio above 1: NEW better (old/new for ms, MiB, s)"
sed 's/^# /  /' "$work/loads"
echo
echo "| case | unit | old | new | ratio | rounds' ratios | verdict |"
echo "|---|---|---:|---:|---:|---|---|"
awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s |\n",
              $1, $6 ($7 == "lower" ? ", lower better" : ""), $2, $3, $4,
              $8, $5 }' "$work/rows"
echo
echo "Not the same: $(awk -F'\t' '$5 != "same" { printf "%s%s (%s)", n++ ? ", " : "", $1, $5 }
                                   END { if (!n) printf "none" }' "$work/rows")"
echo "TSV: $out (every round: ${out%.tsv}.rounds.tsv)"
