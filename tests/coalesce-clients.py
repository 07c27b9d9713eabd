#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Clients for the flush-coalesce tests: CONNS connections (one thread
# each) loop over one or two writes, zeroes or trims, then a flush, now
# and then a second flush, and (with --fua) FUA writes.  After each
# flush or FUA write a "marker" read follows at once.
#
# Every request touches its own offset, so that it can be found in the
# log filter's log of the plugin's side.  The client log (CLIENT-LOG)
# orders events of all threads with one sequence number taken under a
# lock: a write's number is taken after its reply arrived, a flush's
# before it is sent; so a write with a smaller number than a flush
# completed before the flush was sent.  Lines:
#   W SEQ OFFSET             a write, zero or trim completed
#   F SEQ KIND OK MARKER [OFFSET]
#                            a flush (KIND flush) or FUA write (KIND fua,
#                            at OFFSET) sent at SEQ; OK 1 if it
#                            succeeded; MARKER the offset of the read
#                            sent after its reply
#
# Usage: coalesce-clients.py URI CLIENT-LOG CONNS ITERATIONS [--fua]
import random
import sys
import threading

import nbd

uri, client_log, conns, iterations = sys.argv[1:5]
conns, iterations = int(conns), int(iterations)
fua = "--fua" in sys.argv[5:]

OP = 4096                   # size of each write, zero and trim
MARKER_BASE = 8 << 20       # markers are reads of 512 bytes from here

lock = threading.Lock()
seq = 0
next_op = 0
next_marker = 0
events = []
errors = []


def tick():
    global seq
    seq += 1
    return seq


def new_offset():
    global next_op
    with lock:
        next_op += 1
        assert next_op * OP < MARKER_BASE
        return (next_op - 1) * OP


def marker(h):
    global next_marker
    with lock:
        next_marker += 1
        off = MARKER_BASE + (next_marker - 1) * 512
    h.pread(512, off)
    return off


def flush(h, kind, rng):
    if kind == "fua":
        off = new_offset()
        with lock:
            s = tick()
        try:
            h.pwrite(bytes([rng.randrange(1, 256)]) * OP, off,
                     nbd.CMD_FLAG_FUA)
            ok = 1
        except nbd.Error:
            ok = 0
        with lock:
            events.append("W %d %d" % (tick(), off))
        m = marker(h)
        with lock:
            events.append("F %d fua %d %d %d" % (s, ok, m, off))
    else:
        with lock:
            s = tick()
        try:
            h.flush()
            ok = 1
        except nbd.Error:
            ok = 0
        m = marker(h)
        with lock:
            events.append("F %d flush %d %d" % (s, ok, m))


def client(n):
    rng = random.Random(n)
    try:
        h = nbd.NBD()
        h.connect_uri(uri)
        for _ in range(iterations):
            for _ in range(rng.choice((1, 1, 2))):
                off = new_offset()
                what = rng.random()
                if what < 0.7:
                    h.pwrite(bytes([rng.randrange(1, 256)]) * OP, off)
                elif what < 0.85:
                    h.zero(OP, off)
                else:
                    h.trim(OP, off)
                with lock:
                    events.append("W %d %d" % (tick(), off))
            flush(h, "fua" if fua and rng.random() < 0.3 else "flush", rng)
            if rng.random() < 0.2:
                flush(h, "flush", rng)
        h.shutdown()
    except Exception as e:
        errors.append("client %d: %r" % (n, e))


threads = [threading.Thread(target=client, args=(n,)) for n in range(conns)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with open(client_log, "w") as f:
    f.write("\n".join(events) + "\n")
if errors:
    sys.exit("\n".join(errors))
