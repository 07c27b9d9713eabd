#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# latency-jitter: with a seed, the same requests get the same delays
# (as -D latency.verbose=1 logs them), run after run, over memory and
# qcow2; another seed gives others; every delay stays within the
# percentage and they do vary.  Without a seed nbdkit logs the one it
# chose, and that seed repeats the run.  The client's timing agrees
# with the logged delays.
source "${srcdir:-.}/functions.sh"
set -e
requires qemu-img nbdsh

img=$tmp/img.qcow2
qemu-img create -q -f qcow2 "$img" 1M

# delays TARGET ARGS...: 40 reads and 40 writes, one at a time; the
# delays logged, one per line, into $tmp/delays (nbdkit's debug
# output, with the chosen seed, in $tmp/debug).
delays ()
{
  timeout -k 10 60 nbdkit -U - -v -D latency.verbose=1 --filter=latency \
    "$@" latency-read=10ms latency-write=2ms latency-jitter=50 \
    --run 'nbdsh -u "$uri" -c "
import time
t = time.monotonic()
for i in range(40):
    h.pread(512, 0)
    h.pwrite(b\"x\" * 512, 4096)
print(\"client\", time.monotonic() - t)
"' > "$tmp/client" 2> "$tmp/debug" || { cat "$tmp/debug"; fail "nbdkit $*"; }
  sed -n 's/.*latency: \(read\|write\): delay \([0-9.]*\) s$/\1 \2/p' \
    "$tmp/debug" > "$tmp/delays"
  [ "$(wc -l < "$tmp/delays")" -eq 80 ] ||
    { cat "$tmp/debug"; fail "nbdkit $*: not 80 delays logged"; }
}

for target in "memory 1M" "qcow2 $img"; do
  delays $target latency-seed=42
  # Within +-50%, varied, and the client waited at least their sum.
  /usr/bin/python3 - "$tmp/delays" "$tmp/client" <<'PY' || fail "$target: delays"
import sys
d = [l.split() for l in open(sys.argv[1])]
reads = [float(s) for op, s in d if op == "read"]
writes = [float(s) for op, s in d if op == "write"]
assert len(reads) == 40 and len(writes) == 40
assert all(0.005 <= s <= 0.015 for s in reads), reads
assert all(0.001 <= s <= 0.003 for s in writes), writes
assert len(set(reads)) > 30 and len(set(writes)) > 30, d
# Both ends of the range are reached, roughly.
assert min(reads) < 0.0065 and max(reads) > 0.0135, reads
client = float(open(sys.argv[2]).read().split()[1])
assert client >= sum(reads) + sum(writes), (client, sum(reads) + sum(writes))
PY
  cp "$tmp/delays" "$tmp/a"
  delays $target latency-seed=42
  cmp -s "$tmp/a" "$tmp/delays" || fail "$target: seed 42 did not repeat"
  delays $target latency-seed=43
  ! cmp -s "$tmp/a" "$tmp/delays" || fail "$target: seeds 42 and 43 agree"
done

# No seed: the one chosen is logged, and repeats the run.
delays memory 1M
seed=$(sed -n 's/.*latency: jitter 50%, latency-seed=\([0-9]*\)$/\1/p' "$tmp/debug")
[ -n "$seed" ] || fail "no seed logged"
cp "$tmp/delays" "$tmp/a"
delays memory 1M latency-seed="$seed"
cmp -s "$tmp/a" "$tmp/delays" || fail "the logged seed $seed did not repeat the run"

# latency-jitter=0: exactly the delay.
timeout -k 10 60 nbdkit -U - -v -D latency.verbose=1 --filter=latency \
  memory 1M latency-read=10ms latency-jitter=0% latency-seed=1 \
  --run 'nbdsh -u "$uri" -c "h.pread(512, 0); h.pread(512, 0)"' 2> "$tmp/debug"
[ "$(grep -c 'latency: read: delay 0.010000000 s$' "$tmp/debug")" -eq 2 ] ||
  fail "latency-jitter=0 changed the delay"
