#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The latency filter's per-operation delays, timed by the client over
# the memory and qcow2 plugins: each delayed request takes at least
# its delay (in s, ms, us or a plain number of seconds), others stay
# fast; latency-writes covers write, zero and trim but not flush, and
# later parameters override it; zeroes and cache requests that the
# layer below emulates are delayed as zeroes and cache requests; fast
# zeroes wait, or with latency-fast-zero=false fail at once.  Bad
# values are refused, naming the parameter.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh

# Helpers for the client: took(f) runs f and returns the seconds it
# took; slow(f, s) and fast(f) assert them.  FAST: well below every
# delay used here.
cat > "$tmp/timing.py" <<'PY'
import errno, time
FAST = 0.25
def took(f):
    t = time.monotonic()
    f()
    return time.monotonic() - t
def slow(what, f, s):
    t = took(f)
    assert t >= s, "%s took %.3f s, expected at least %.3f s" % (what, t, s)
# A loaded machine (or a sanitizer build) may stall any one request;
# an undelayed operation is fast at least once in three tries, a
# delayed one never is.
def fast(what, f):
    t = min(took(f) for _ in range(3)) if took(f) >= FAST else 0
    assert t < FAST, "%s took %.3f s, expected under %.3f s" % (what, t, FAST)
def extents():
    h.block_status(65536, 0, lambda *args: 0)
OPS = {
    "read": lambda: h.pread(512, 0),
    "write": lambda: h.pwrite(b"x" * 512, 0),
    "zero": lambda: h.zero(512, 0),
    "trim": lambda: h.trim(65536, 0),
    "extents": extents,
    "flush": lambda: h.flush(),
    "cache": lambda: h.cache(512, 0),
}
# expect(SLOW, s): the operations named in SLOW take at least s
# seconds, all others are fast.
def expect(slow_ops, s):
    for name, f in OPS.items():
        if name in slow_ops:
            slow(name, f, s)
        else:
            fast(name, f)
PY

# serve TARGET... -- PYTHON: run PYTHON (with the helpers) over
# --filter=latency; TARGET is the plugin, its arguments and the
# filter's.
serve ()
{
  local args=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  PY="exec(open('$tmp/timing.py').read())
$2" timeout -k 10 60 nbdkit -U - --filter=latency "${args[@]}" \
    --run 'nbdsh --base-allocation -u "$uri" -c "$PY"' ||
    fail "nbdkit --filter=latency ${args[*]}"
}

img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 1M
for target in "memory 1M" "qcow2 $img"; do
  # Each operation alone, each unit.
  for delay in read=1s:1 write=300ms:0.3 zero=0.3:0.3 trim=300000us:0.3 \
               extents=.3s:0.3 flush=0.3s:0.3 cache=300ms:0.3; do
    op=${delay%%=*}
    serve $target "latency-${delay%:*}" -- "expect(['$op'], ${delay#*:})"
  done
  # latency-writes: write, zero, trim; a later latency-trim overrides it.
  serve $target latency-writes=300ms latency-trim=0 -- '
expect(["write", "zero"], 0.3)
'
  # Fast zeroes wait by default, fail at once with latency-fast-zero=false.
  serve $target latency-zero=300ms -- '
assert h.can_fast_zero()
slow("fast zero", lambda: h.zero(65536, 0, nbd.CMD_FLAG_FAST_ZERO), 0.3)
'
  serve $target latency-zero=300ms latency-fast-zero=false -- '
def fast_zero():
    try:
        h.zero(65536, 0, nbd.CMD_FLAG_FAST_ZERO)
        raise AssertionError("fast zero succeeded")
    except nbd.Error as e:
        assert e.errnum == errno.ENOTSUP, e
fast("failing fast zero", fast_zero)
slow("zero", lambda: h.zero(65536, 0), 0.3)
'
done
qemu-img check -q "$img" || fail "qemu-img check"

# Emulated below: zeroes written by nozero, cache done by nocache with
# reads; the zero and cache delays apply, not the write and read ones.
serve --filter=nozero memory 1M zeromode=emulate latency-zero=300ms -- '
slow("emulated zero", lambda: h.zero(512, 0), 0.3)
fast("write", lambda: h.pwrite(b"x" * 512, 0))
'
serve --filter=nocache memory 1M cachemode=emulate latency-cache=300ms -- '
assert h.can_cache()
slow("emulated cache", lambda: h.cache(512, 0), 0.3)
fast("read", lambda: h.pread(512, 0))
'

for bad in latency-read=abc latency-read=-1 latency-read=1x latency-read=1. \
           latency-read= latency-write=2ms5 latency-zero=1e3 "latency-flush= 1"; do
  expect_refused "${bad%%=*}: cannot parse '${bad#*=}' as a delay" \
    --filter=latency memory 1M "$bad"
done
expect_refused "latency-trim: delay '86401' is longer than the limit of 86400 s" \
  --filter=latency memory 1M latency-trim=86401
expect_refused "latency-writes: delay '99999999999999999999ms' is longer" \
  --filter=latency memory 1M latency-writes=99999999999999999999ms
for bad in 101 ten -5 5%% ""; do
  expect_refused "latency-jitter: '$bad' is not a percentage from 0 to 100" \
    --filter=latency memory 1M "latency-jitter=$bad"
done
for bad in x -1 18446744073709551616; do
  expect_refused "latency-seed: '$bad' is not a number from 0 to 18446744073709551615" \
    --filter=latency memory 1M "latency-seed=$bad"
done
expect_refused "latency-fast-zero: expected true or false, not 'maybe'" \
  --filter=latency memory 1M latency-fast-zero=maybe
