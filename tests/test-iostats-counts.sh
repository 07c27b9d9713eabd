#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# iostats counts exactly what a known workload sends, in text and in
# JSON, with the memory plugin and with the qcow2 plugin: requests,
# bytes, FUA, fast and slow zeroes, extents, cache, flushes; and it
# refuses bad parameters.
source "${srcdir:-.}/functions.sh"
set -e
requires nbdsh qemu-img

# 5 reads of 4 KiB, 3 writes of 8 KiB (1 with FUA), 2 zeroes of 64 KiB
# (1 fast), 4 trims of 4 KiB, 2 extents of 1 MiB, 1 cache of 512 bytes
# (where the plugin offers it), 3 flushes.
workload='
for i in range(3):
    h.pwrite(b"\x01" * 8192, i * 8192, nbd.CMD_FLAG_FUA if i == 1 else 0)
for i in range(5):
    h.pread(4096, i * 4096)
h.zero(65536, 65536)
h.zero(65536, 131072, nbd.CMD_FLAG_FAST_ZERO)
for i in range(4):
    h.trim(4096, 262144 + i * 65536)
for i in range(2):
    h.block_status(1048576, 0, lambda *args: 0)
if h.can_cache():
    h.cache(512, 0)
for i in range(3):
    h.flush()
'
export workload

# run_workload NAME PLUGIN-ARGS...: the workload, text then JSON.
run_workload ()
{
  local name="$1"; shift
  timeout -k 10 60 nbdkit -U - --filter=iostats "$@" \
    iostats-file="$tmp/$name.txt" \
    --run 'nbdsh --base-allocation -u "$uri" -c "$workload"' ||
    fail "$name: the text run failed"
  timeout -k 10 60 nbdkit -U - --filter=iostats "$@" \
    iostats-file="$tmp/$name.json" iostats-format=json \
    --run 'nbdsh --base-allocation -u "$uri" -c "$workload"' ||
    fail "$name: the JSON run failed"
}

# check_text NAME CACHE-OPS
check_text ()
{
  local f="$tmp/$1.txt" cache="$2" re
  cat "$f"
  for re in \
    '^elapsed time: [0-9]+\.[0-9]{6} s$' \
    '^read: 5 ops, [0-9.]+ s, 20480 bytes \(20\.00 KiB\), ' \
    '^write: 3 ops, [0-9.]+ s, 24576 bytes \(24\.00 KiB\), ' \
    '^  fua: 1 ops$' \
    '^trim: 4 ops, [0-9.]+ s, 16384 bytes \(16\.00 KiB\), ' \
    '^zero: 2 ops, [0-9.]+ s, 131072 bytes \(128\.00 KiB\), ' \
    '^  fast: 1 ok$' \
    '^  slow: 1 ok$' \
    '^extents: 2 ops, [0-9.]+ s, 2097152 bytes \(2\.00 MiB\), ' \
    '^flush: 3 ops, [0-9.]+ s$' \
    '^  latency: mean [0-9.]+ s, p50 [0-9.]+ s, p90 [0-9.]+ s, p99 [0-9.]+ s, max [0-9.]+ s$'
  do
    grep -Eq "$re" "$f" || fail "$1: no line matching /$re/ in the text output"
  done
  if [ "$cache" -eq 1 ]; then
    grep -Eq '^cache: 1 ops, [0-9.]+ s, 512 bytes, ' "$f" ||
      fail "$1: cache not counted"
  else
    ! grep -q '^cache:' "$f" || fail "$1: a cache line with no cache request"
  fi
  ! grep -q 'errors:' "$f" || fail "$1: errors reported where none occurred"
  [ "$(grep -c '^elapsed time:' "$f")" -eq 1 ] || fail "$1: more than one report"
}

# check_json NAME CACHE-OPS
check_json ()
{
  /usr/bin/python3 - "$tmp/$1.json" "$2" <<'EOF' || fail "$1: JSON output"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
r = json.loads(lines[0])
print(lines[0])
assert r["final"] is True and r["elapsed"] > 0, r
ops = r["ops"]
assert sorted(ops) == sorted(["read", "write", "trim", "zero", "extents",
                              "cache", "flush"]), ops.keys()
cache = int(sys.argv[2])
want = {"read": (5, 20480), "write": (3, 24576), "trim": (4, 16384),
        "zero": (2, 131072), "extents": (2, 2097152),
        "cache": (cache, 512 * cache), "flush": (3, 0)}
for op, (count, nbytes) in want.items():
    o = ops[op]
    assert (o["count"], o["bytes"]) == (count, nbytes), (op, o)
    assert o["errors"] == {}, (op, o)
    for k in ("total_s", "mean_s", "p50_s", "p90_s", "p99_s", "max_s"):
        assert isinstance(o[k], float) and o[k] >= 0, (op, k, o)
    if count:
        assert 0 < o["p50_s"] <= o["p90_s"] <= o["p99_s"] <= o["max_s"], (op, o)
        assert o["max_s"] <= o["total_s"] + 1e-9, (op, o)
        assert abs(o["mean_s"] * count - o["total_s"]) < 1e-6, (op, o)
    else:
        assert o["total_s"] == o["max_s"] == o["p50_s"] == 0, (op, o)
assert ops["write"]["fua"] == 1 and ops["zero"]["fua"] == 0 and \
    ops["trim"]["fua"] == 0, ops
assert ops["zero"]["fast"] == {"ok": 1, "ENOTSUP": 0}, ops["zero"]
assert ops["zero"]["slow"] == {"ok": 1, "ENOTSUP": 0}, ops["zero"]
EOF
}

run_workload memory memory 1M
check_text memory 1
check_json memory 1

img=$tmp/disk.qcow2
qemu-img create -q -f qcow2 "$img" 1M
run_workload qcow2 qcow2 "file=$img"
# The qcow2 plugin answers NBD_CMD_CACHE too, as qemu-nbd does.
check_text qcow2 1
check_json qcow2 1
qemu-img check -q "$img" || fail "qemu-img check $img"

# Appending keeps the earlier report.
timeout -k 10 60 nbdkit -U - --filter=iostats memory 1M \
  iostats-file="$tmp/memory.txt" iostats-append=true \
  --run 'nbdsh -u "$uri" -c "h.pread(512, 0)"' || fail "the appending run"
[ "$(grep -c '^elapsed time:' "$tmp/memory.txt")" -eq 2 ] ||
  fail "iostats-append=true did not keep the first report"
grep -q '^read: 1 ops, [0-9.]* s, 512 bytes' "$tmp/memory.txt" ||
  fail "the appended report is missing"

# Without iostats-file: standard error.
timeout -k 10 60 nbdkit -U - --filter=iostats memory 1M \
  --run 'nbdsh -u "$uri" -c "h.pwrite(b\"x\" * 1024, 0)"' 2> "$tmp/stderr" ||
  fail "the run to standard error"
grep -q '^write: 1 ops, [0-9.]* s, 1024 bytes (1.00 KiB)' "$tmp/stderr" || {
  cat "$tmp/stderr"
  fail "no statistics on standard error"
}

expect_refused 'iostats-format=xml: expected text or json' \
  --filter=iostats memory 1M iostats-format=xml
expect_refused 'iostats-interval=-1: expected a number of seconds' \
  --filter=iostats memory 1M iostats-interval=-1
expect_refused 'iostats-interval=1s: expected a number of seconds' \
  --filter=iostats memory 1M iostats-interval=1s
expect_refused 'iostats-interval=0.0001: the shortest interval is 0.001 s' \
  --filter=iostats memory 1M iostats-interval=0.0001
expect_refused 'iostats-file=/nonexistent/dir/stats: No such file or directory' \
  --filter=iostats memory 1M iostats-file=/nonexistent/dir/stats
expect_refused 'iostats-append=maybe: expected true or false' \
  --filter=iostats memory 1M iostats-append=maybe
