#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Checks, from the log filter's log of what reached the plugin
# (PLUGIN-LOG, "--filter=flush-coalesce --filter=log") and the clients'
# log (CLIENT-LOG, from coalesce-clients.py), that every client flush
# (or FUA write) that succeeded made durable every write completed
# before the client sent it:
#
#   there is a plugin flush that succeeded, that started after each of
#   those writes returned from the plugin, and that returned before the
#   client's next request (the marker read sent after the flush's
#   reply) reached the server.
#
# The evidence is the order of lines in the plugin log, which the log
# filter writes one at a time: "...Write return" is written after the
# plugin's write returned, "Flush ..." before the plugin's flush starts,
# "...Flush return" after it returned, "Read ..." (the marker) after the
# read reached the server.  Line order, not timestamps: the log filter
# takes the time before it takes the file's lock.
#
# A limit: the marker follows the flush's reply, so a filter that
# replied just before its plugin flush returned would pass if that
# flush returned within the client's round trip.
#
# Prints "flushes=N fua=N plugin_flushes=N" and exits 0 if the
# property holds, else lists the client flushes it fails for and
# exits 1.
#
# Usage: coalesce-check.py PLUGIN-LOG CLIENT-LOG
import bisect
import re
import sys

plugin_log, client_log = sys.argv[1:3]

req_re = re.compile(r" connection=(\d+) (\.\.\.)?(Write|Zero|Trim|Flush|Read)"
                    r" id=(\d+)(.*)$")
enter = {}              # (connection, id) -> (kind, offset, line)
write_done = {}         # offset -> line of the plugin write's return
flushes = []            # (start line, return line), successful ones
all_flushes = 0
markers = {}            # offset -> line of the marker read
problems = []

with open(plugin_log) as f:
    for i, line in enumerate(f):
        m = req_re.search(line)
        if not m:
            continue
        conn, leave, kind, rid, rest = m.groups()
        key = (conn, rid)
        if not leave:
            off = re.search(r"offset=(0x[0-9a-f]+)", rest)
            off = int(off.group(1), 16) if off else None
            enter[key] = (kind, off, i)
            if kind == "Read":
                markers[off] = i
            elif kind == "Flush":
                all_flushes += 1
            continue
        kind_in, off, start = enter.pop(key)
        assert kind_in == kind, line
        ok = re.search(r"return=0\b", rest) is not None
        if kind == "Flush":
            if ok:
                flushes.append((start, i))
        elif kind in ("Write", "Zero", "Trim"):
            if off in write_done:
                problems.append("offset %d written twice in the plugin log"
                                % off)
            if ok:
                write_done[off] = i

writes = []             # (seq, line of its plugin return)
checks = []             # (seq, kind, marker, own offset or None)
failed = 0
with open(client_log) as f:
    for line in f:
        w = line.split()
        if w[0] == "W":
            off = int(w[2])
            if off not in write_done:
                problems.append("the write at offset %d completed at the "
                                "client but not in the plugin" % off)
                continue
            writes.append((int(w[1]), write_done[off]))
        elif w[0] == "F":
            if w[3] != "1":
                failed += 1
                continue
            own = int(w[5]) if w[2] == "fua" else None
            checks.append((int(w[1]), w[2], int(w[4]), own))

# The latest plugin return among the writes numbered below each seq.
writes.sort()
seqs = [s for s, _ in writes]
latest = []
for _, done in writes:
    latest.append(max(done, latest[-1]) if latest else done)

# Plugin flushes by start line; the earliest return among those that
# start at or after each of them.
flushes.sort()
starts = [s for s, _ in flushes]
earliest_end = [0] * len(flushes)
for j in range(len(flushes) - 1, -1, -1):
    end = flushes[j][1]
    earliest_end[j] = min(end, earliest_end[j + 1]) if j + 1 < len(flushes) \
        else end

for seq, kind, marker, own in checks:
    k = bisect.bisect_left(seqs, seq)
    need = latest[k - 1] if k else -1
    if own is not None:
        need = max(need, write_done.get(own, -1))
    if need < 0:
        continue
    if marker not in markers:
        problems.append("%s sent at %d: its marker read is not in the "
                        "plugin log" % (kind, seq))
        continue
    j = bisect.bisect_right(starts, need)
    if j == len(flushes) or earliest_end[j] >= markers[marker]:
        problems.append("%s sent at %d: no plugin flush started after line "
                        "%d (its latest covered write) and ended before "
                        "line %d (its marker)" % (kind, seq, need + 1,
                                                  markers[marker] + 1))

print("flushes=%d fua=%d failed=%d plugin_flushes=%d" % (
    sum(1 for c in checks if c[1] == "flush"),
    sum(1 for c in checks if c[1] == "fua"), failed, all_flushes))
if problems:
    print("%d problems, e.g.:" % len(problems))
    print("\n".join(problems[:10]))
    sys.exit(1)
