#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# How long a flush waits under a steady read load.
#
#   flushwait.py URI [--seconds S] [--readers R] [--limit SECONDS]
#       [--cluster-size BYTES]
#
# R connections read without pause (several requests in flight each);
# two connections overwrite compressed or allocated clusters and trim
# others, so that the image has clusters waiting to be freed (which a
# flush frees, excluding readers of them meanwhile); one connection
# flushes every 50 ms and another writes with FUA every 50 ms, each
# timing its request.  Prints the longest and the median of each;
# exits 1 if the longest flush or FUA write took more than --limit.
import argparse
import random
import statistics
import sys
import threading
import time

import nbd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("uri")
    p.add_argument("--seconds", type=float, default=6)
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--limit", type=float, default=1.0)
    p.add_argument("--cluster-size", type=int, default=65536)
    p.add_argument("--read-size", type=int, default=1 << 20)
    a = p.parse_args()

    stop = threading.Event()
    errors = []
    cs = a.cluster_size

    def connect():
        h = nbd.NBD()
        h.connect_uri(a.uri)
        return h

    size = connect().get_size()
    clusters = size // cs

    def guarded(fn):
        def run(*args):
            try:
                fn(*args)
            except Exception as e:  # report, end the run
                errors.append(repr(e))
                stop.set()
        return run

    @guarded
    def reader(seed):
        h = connect()
        r = random.Random(seed)
        n = a.read_size
        buf = [nbd.Buffer(n) for _ in range(8)]
        while not stop.is_set():
            pending = {h.aio_pread(b, r.randrange(size // n) * n)
                       for b in buf}
            while pending:
                h.poll(-1)
                pending = {c for c in pending
                           if not h.aio_command_completed(c)}

    @guarded
    def writer(seed):
        h = connect()
        r = random.Random(seed)
        data = bytes([seed % 255 + 1]) * cs
        while not stop.is_set():
            c = r.randrange(clusters)
            if r.random() < 0.5:
                h.pwrite(data, c * cs)
            else:
                h.trim(cs, c * cs)

    waits = {"flush": [], "fua write": []}

    @guarded
    def timed(kind):
        h = connect()
        r = random.Random(kind)
        data = b"F" * 4096
        while not stop.is_set():
            time.sleep(0.05)
            t = time.monotonic()
            if kind == "flush":
                h.flush()
            else:
                h.pwrite(data, r.randrange(clusters) * cs,
                         nbd.CMD_FLAG_FUA)
            waits[kind].append(time.monotonic() - t)

    threads = [threading.Thread(target=reader, args=(i,))
               for i in range(a.readers)]
    threads += [threading.Thread(target=writer, args=(100 + i,))
                for i in range(2)]
    threads += [threading.Thread(target=timed, args=(k,)) for k in waits]
    for t in threads:
        t.start()
    time.sleep(a.seconds)
    stop.set()
    for t in threads:
        t.join()
    if errors:
        sys.exit("flushwait: " + errors[0])
    bad = False
    for kind, w in waits.items():
        if not w:
            sys.exit("flushwait: no %s completed in %g s" % (kind, a.seconds))
        print("flushwait: %d of %s: longest %.3f s, median %.3f s"
              % (len(w), kind, max(w), statistics.median(w)))
        bad |= max(w) > a.limit
    if bad:
        sys.exit("flushwait: a request waited more than %g s" % a.limit)


if __name__ == "__main__":
    main()
