#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# iostats-interval: reports are appended while nbdkit serves, on a
# regular grid, each with the counts so far; the report at exit comes
# last; a long interval does not delay nbdkit's exit.
source "${srcdir:-.}/functions.sh"
set -e
requires nbdsh qemu-img

# 24 writes, one every 50 ms; while still connected, the client reads
# the reports written so far.
export stats=$tmp/stats
client='
import os, time
for i in range(24):
    h.pwrite(b"\x06" * 4096, i * 4096)
    time.sleep(0.05)
with open(os.environ["stats"]) as f:
    n = sum(1 for l in f if l.startswith(os.environ["marker"]))
print("reports while serving:", n)
assert n >= 3, "%d reports after 1.2 s at an interval of 0.2 s" % n
'
export client

# JSON, memory plugin.
marker='{' timeout -k 10 60 nbdkit -U - --filter=iostats memory 1M \
  iostats-file="$stats" iostats-format=json iostats-interval=0.2 \
  --run 'nbdsh -u "$uri" -c "$client"' || fail "json: the run failed"
/usr/bin/python3 - "$stats" <<'EOF' || fail "json: periodic reports"
import json, sys
reports = [json.loads(l) for l in open(sys.argv[1])]
for r in reports:
    print(r["elapsed"], r["final"], r["ops"]["write"]["count"])
assert reports[-1]["final"] and not any(r["final"] for r in reports[:-1])
assert reports[-1]["ops"]["write"]["count"] == 24
ticks = [r["elapsed"] for r in reports[:-1]]
assert len(ticks) >= 5, ticks
# On a grid of 0.2 s from the start (late under load, never early).
for i, t in enumerate(ticks):
    assert 0.2 * (i + 1) - 0.001 <= t < 0.2 * (i + 1) + 0.5, (i, t)
counts = [r["ops"]["write"]["count"] for r in reports]
assert counts == sorted(counts) and counts[0] < counts[-1], counts
EOF

# Text, qcow2 plugin, appended to an earlier report.
img=$tmp/disk.qcow2
qemu-img create -q -f qcow2 "$img" 1M
echo "an earlier line" > "$stats"
marker='elapsed time:' timeout -k 10 60 nbdkit -U - --filter=iostats \
  qcow2 "file=$img" iostats-file="$stats" iostats-append=true \
  iostats-interval=0.25 \
  --run 'nbdsh -u "$uri" -c "$client"' || fail "text: the run failed"
cat "$stats"
[ "$(head -n1 "$stats")" = "an earlier line" ] || fail "text: the earlier line is gone"
n=$(grep -c '^elapsed time:' "$stats")
[ "$n" -ge 4 ] || fail "text: $n reports"
# Reports apart by one blank line; the last one has every write.
[ "$(grep -c '^$' "$stats")" -eq $((n - 1)) ] || fail "text: blank lines"
tail -n +"$(grep -n '^elapsed time:' "$stats" | tail -n1 | cut -d: -f1)" "$stats" |
  grep -q '^write: 24 ops, [0-9.]* s, 98304 bytes' || fail "text: the last report"
qemu-img check -q "$img" || fail "qemu-img check $img"

# An hour's interval: nbdkit still exits at once, with its final report.
start=$(date +%s)
timeout -k 10 60 nbdkit -U - --filter=iostats memory 1M \
  iostats-file="$stats" iostats-format=json iostats-interval=3600 \
  --run 'nbdsh -u "$uri" -c "h.pread(512, 0)"' || fail "long interval: the run failed"
end=$(date +%s)
[ $((end - start)) -lt 10 ] || fail "long interval: nbdkit took $((end - start)) s to exit"
[ "$(wc -l < "$stats")" -eq 1 ] && grep -q '"final": true' "$stats" ||
  fail "long interval: not exactly one final report"
