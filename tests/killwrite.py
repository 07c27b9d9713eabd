#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# The client of test-crash-kill.sh: random writes, zeroes, trims, FUA
# writes and flushes to an NBD server, up to 8 in flight, then SIGKILL
# to the server at a random moment while requests are in flight.
# Writes what the image must hold afterwards: the bytes every completed
# flush or FUA request made durable (EXPECTED), and a mask of the bytes
# written since then (DIRTY: 1 where any value written is allowed).
#
# Usage: killwrite.py SOCKET PID MODEL CLUSTER SEED EXPECTED DIRTY
#   MODEL: what the disk holds now (raw); CLUSTER: the cluster size
#   (trims are whole clusters, which then read as zeros).  Prints the
#   requests sent, the flushes done and the requests in flight at the
#   kill.

import os
import random
import signal
import sys
import time

import nbd

sock, pid, model, cluster, seed, out_expected, out_dirty = sys.argv[1:]
pid, cluster, seed = int(pid), int(cluster), int(seed)
rng = random.Random(seed)

with open(model, "rb") as f:
    acked = bytearray(f.read())
size = len(acked)
durable = bytearray(acked)
dirty = bytearray(size)
inflight = {}               # cookie -> (offset, data, fua)

h = nbd.NBD()
h.connect_unix(sock)
assert h.get_size() == size


def overlaps(off, n):
    return any(o < off + n and off < o + len(d)
               for o, d, _ in inflight.values())


def complete(cookie):
    off, data, fua = inflight.pop(cookie)
    acked[off:off + len(data)] = data
    if fua:
        durable[off:off + len(data)] = data
        dirty[off:off + len(data)] = bytes(len(data))


def collect():
    for cookie in list(inflight):
        if h.aio_command_completed(cookie):
            complete(cookie)


def drain():
    while inflight:
        h.poll(-1)
        collect()


def pick_range():
    # Mostly the first quarter: overwrites, copies and frees.
    span = size // 4 if rng.random() < 0.7 else size
    if rng.random() < 0.5:
        off = rng.randrange(span // cluster) * cluster
    else:
        off = rng.randrange(span)
    n = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 3) * cluster,
                    rng.randrange(1, 16) * cluster, 512])
    return off, min(n, size - off)


def submit():
    k = rng.random()
    if k < 0.12:
        global flushes
        drain()
        h.flush()
        flushes += 1
        durable[:] = acked
        dirty[:] = bytes(size)
        return
    off, n = pick_range()
    if k < 0.22:                # trim whole clusters: they read as zeros
        off = off // cluster * cluster
        n = max(cluster, n // cluster * cluster)
        n = min(n, size - off)
        data = bytes(n)
        kind = "trim"
    elif k < 0.30:
        data = bytes(n)
        kind = "zero"
    else:
        data = rng.randbytes(n)
        kind = "write"
    fua = rng.random() < 0.1
    if overlaps(off, n):
        drain()
    flags = nbd.CMD_FLAG_FUA if fua else 0
    dirty[off:off + n] = b"\1" * n
    if kind == "trim":
        cookie = h.aio_trim(n, off, flags=flags)
    elif kind == "zero":
        cookie = h.aio_zero(n, off, flags=flags)
    else:
        cookie = h.aio_pwrite(data, off, flags=flags)
    inflight[cookie] = (off, data, fua)


requests = rng.randrange(1, 150)
flushes = at_kill = 0
try:
    for i in range(requests):
        while len(inflight) >= 8:
            h.poll(-1)
            collect()
        submit()
        collect()
    # The kill lands while requests are in flight (or just after).
    time.sleep(rng.random() * 0.01)
    collect()
    at_kill = len(inflight)
    os.kill(pid, signal.SIGKILL)
    while inflight:
        h.poll(-1)
        collect()
except nbd.Error:
    pass                    # the server is gone: in flight, unknown

print(requests, flushes, at_kill)
with open(out_expected, "wb") as f:
    f.write(durable)
with open(out_dirty, "wb") as f:
    f.write(dirty)
