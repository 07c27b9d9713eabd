#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# bench/live.sh's QMP steps and its reading of fio's latency logs.  Each
# step prints its values on one line, space separated; times are the
# Unix epoch's seconds (as fio's log_unix_epoch=1 logs, so that the two
# can be set side by side).
#
#   live.py commit QMP DEVICE [BASE-NODE]
#       block-commit (job "c"; base-node if given: QEMU's default is the
#       deepest layer), block-job-complete at BLOCK_JOB_READY, until
#       BLOCK_JOB_COMPLETED: START READY COMPLETED
#   live.py snapshot QMP ours EXPORT FILE
#   live.py snapshot QMP qsd NODE FILE
#       export-snapshot {id, file}, or blockdev-snapshot-sync of NODE
#       into FILE: SENT REPLIED PAUSED-NS (ours' reply's; 0 for qsd,
#       which says nothing of it)
#   live.py log LATLOG FROM TO
#       fio's per-request log (write_lat_log, log_avg_msec=0): requests
#       completed in [FROM, TO) a second (IOPS), the longest latency in
#       ms of a request in flight at any time in [FROM, TO] (LONGEST),
#       and of those that completed in the second before FROM
#       (LONGEST-BEFORE): IOPS LONGEST LONGEST-BEFORE.  FROM "first+S"
#       is S seconds after the first completion, TO "last" the last
#       completion
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests"))
import qmpclient                # noqa: E402  (the tests' QMP client)

JOB_TIMEOUT = 600


def connect(path):
    q = qmpclient.QMP(path, timeout=JOB_TIMEOUT)
    q.negotiate()
    return q


def ended(q, name):
    e = q.event(name, timeout=JOB_TIMEOUT)
    if "error" in e["data"]:
        sys.exit("%s: %s" % (name, e["data"]["error"]))


def commit(path, device, base=None):
    q = connect(path)
    args = {"device": device, "job-id": "c"}
    if base:
        args["base-node"] = base
    start = time.time()
    q.execute("block-commit", args)
    ended(q, "BLOCK_JOB_READY")
    ready = time.time()
    q.execute("block-job-complete", {"device": "c"})
    ended(q, "BLOCK_JOB_COMPLETED")
    return start, ready, time.time()


def snapshot(path, kind, name, file):
    q = connect(path)
    if kind == "ours":
        cmd, args = "export-snapshot", {"id": name, "file": file}
    else:
        cmd, args = "blockdev-snapshot-sync", {
            "node-name": name, "snapshot-file": file,
            "snapshot-node-name": "snap", "format": "qcow2"}
    sent = time.time()
    ret = q.execute(cmd, args)
    replied = time.time()
    return sent, replied, ret.get("paused-ns", 0) if ret else 0


def log(path, lo, hi):
    done = []                   # (completion s, latency s), in log order
    with open(path) as f:
        for line in f:
            ms, ns = line.split(",")[:2]
            done.append((int(ms) / 1e3, int(ns) / 1e9))
    if not done:
        sys.exit("%s: no request logged" % path)
    ends = sorted(c for c, _ in done)
    lo = ends[0] + float(lo[6:]) if lo.startswith("first+") else float(lo)
    hi = ends[-1] if hi == "last" else float(hi)
    # The log's times are whole ms: a ms of slack either side.
    slack = 1e-3
    n = sum(lo <= c < hi for c in ends)
    around = [lat for c, lat in done
              if c >= lo - slack and c - lat <= hi + slack]
    before = [lat for c, lat in done if lo - 1 <= c < lo - slack]
    return (n / (hi - lo) if hi > lo else 0, max(around, default=0) * 1e3,
            max(before, default=0) * 1e3)


def main(argv):
    steps = {"commit": commit, "snapshot": snapshot, "log": log}
    if len(argv) < 2 or argv[1] not in steps:
        sys.stderr.write("usage: live.py commit|snapshot|log ... "
                         "(bench/live.py's header)\n")
        return 2
    print(" ".join("%.6f" % v if isinstance(v, float) else str(v)
                   for v in steps[argv[1]](*argv[2:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
