#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Fuzz the qcow2 engine and the backing file name parsers with
# libFuzzer for a bounded time.
#
#   fuzz/run-fuzz.sh [SECONDS]     fuzz for SECONDS in all (default 60):
#                                  an eighth each on fuzz-exports
#                                  (corpus-exports/), fuzz-names
#                                  (corpus-names/) and fuzz-control
#                                  (corpus-control/), the rest on
#                                  fuzz-qcow2 (corpus/)
#   fuzz/run-fuzz.sh FILE...       run a target once on each FILE:
#                                  fuzz-names if the first one's path
#                                  holds "names" (fuzz-exports,
#                                  "exports"; fuzz-control, "control"),
#                                  else fuzz-qcow2
#
# The target is built with clang, ASan and UBSan (--enable-fuzzing) in a
# temporary copy of this tree, so the build tree here is never touched,
# and fuzzes from a scratch copy of fuzz/corpus/ (the committed seeds do
# not change).  Exits non-zero on a crash, leak, timeout, out-of-memory
# or sanitizer error, saying where the input that caused it was saved.
#
# Environment:
#   FUZZ_ARTIFACTS  where failing inputs go (default: fuzz-findings/ at
#                   the top of this tree, ignored by git)
#   FUZZ_ARGS       more libFuzzer options, e.g. "-jobs=2 -workers=2"
#   FUZZ_KEEP=1     keep the temporary build and corpus
#   FUZZ_TARGET     fuzz-qcow2, fuzz-names, fuzz-exports or fuzz-control:
#                   the target to run FILE... on
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
artifacts=${FUZZ_ARTIFACTS:-$src/fuzz-findings}
work=$(mktemp -d "${TMPDIR:-/tmp}/fuzz-qcow2.XXXXXX")
if [ "${FUZZ_KEEP:-}" = 1 ]; then
  echo "run-fuzz: keeping $work"
else
  trap 'rm -rf "$work"' EXIT
fi

mode=fuzz secs=60
if [ $# -gt 0 ]; then
  case $1 in
    *[!0-9]*) mode=repro ;;
    *) secs=$1 ;;
  esac
fi

# The sources as they are now (uncommitted changes too), without any
# build products.
mkdir "$work/tree"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z -co --exclude-standard |
     tar -c --null --ignore-failed-read -T - 2>/dev/null) |
    tar -x -C "$work/tree"
else
  cp -a "$src/." "$work/tree"
  make -C "$work/tree" distclean >/dev/null 2>&1 || true
fi

echo "run-fuzz: building in $work/tree"
(
  cd "$work/tree" &&
  autoreconf -fi &&
  # -Werror off: clang warns about things gcc does not.
  ./configure CC=clang --enable-fuzzing --disable-werror \
    CFLAGS="-g -O1 -fno-omit-frame-pointer -fno-sanitize-recover=all -fsanitize=fuzzer-no-link,address,undefined" &&
  make -j"$(nproc)" -C common &&
  make -C fuzz
) >"$work/build.log" 2>&1 || {
  tail -n 40 "$work/build.log"
  echo "run-fuzz: build failed (log: $work/build.log)" >&2
  trap - EXIT
  exit 1
}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

if [ "$mode" = repro ]; then
  case ${FUZZ_TARGET:-$1} in
    *exports*) target=fuzz-exports ;;
    *control*) target=fuzz-control ;;
    *names*) target=fuzz-names ;;
    *) target=fuzz-qcow2 ;;
  esac
  "$work/tree/fuzz/$target" -rss_limit_mb=2048 -timeout=10 "$@"
  exit
fi

# fuzz TARGET CORPUS SECONDS MAX_LEN: fuzz from a scratch copy of
# fuzz/CORPUS; exits on a finding, its input saved as TARGET-*.
fuzz ()
{
  local target=$1 corpus=$2 t=$3 max_len=$4 status=0
  mkdir -p "$artifacts" "$work/$corpus"
  cp "$src/fuzz/$corpus"/* "$work/$corpus/"
  echo "run-fuzz: fuzzing $target for $t s"
  # shellcheck disable=SC2086
  "$work/tree/fuzz/$target" -max_total_time="$t" -max_len="$max_len" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/$target-" ${FUZZ_ARGS:-} "$work/$corpus" \
    >"$work/$target.log" 2>&1 || status=$?

  if [ "$status" -ne 0 ]; then
    # The report from the sanitizer or libFuzzer, then the saved input.
    sed -n '/==[0-9]*==\|^==\|ERROR\|invariant violated\|runtime error\|Assertion/,$p' \
      "$work/$target.log" | head -n 150
    echo "run-fuzz: $target FAILED (exit $status)" >&2
    grep -h "Test unit written to" "$work/$target.log" |
      sed 's/.*Test unit written to /run-fuzz: input saved as /' >&2 || true
    echo "run-fuzz: reproduce with: fuzz/run-fuzz.sh FILE" >&2
    exit 1
  fi
  grep -E '^stat::|^Done' "$work/$target.log" || true
}

# -max_len: the largest image seed is under 200 KiB; names are short;
# control input long enough for several messages, nested deep.
names_secs=$(( secs / 4 > 0 ? secs / 4 : 1 ))
exports_secs=$(( names_secs / 2 > 0 ? names_secs / 2 : 1 ))
control_secs=$(( secs / 8 > 0 ? secs / 8 : 1 ))
fuzz fuzz-exports corpus-exports "$exports_secs" 512
fuzz fuzz-names corpus-names "$(( names_secs - exports_secs > 0 ? names_secs - exports_secs : 1 ))" 4096
fuzz fuzz-control corpus-control "$control_secs" 8192
fuzz fuzz-qcow2 corpus "$(( secs - names_secs - control_secs > 0 ? secs - names_secs - control_secs : 1 ))" 262144
echo "run-fuzz: no crash, leak or timeout in $secs s"
