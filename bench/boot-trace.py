#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""A boot-like read trace, and its replay.

  boot-trace.py gen SIZE [SEED]   prints a trace of reads of a disk of
                                  SIZE bytes: "OFFSET COUNT" a line
  boot-trace.py replay TRACE URI  reads them from URI (NBD) one at a time
                                  and prints the bytes read

No trace of a real boot is committed; this one has its shape (what a
Linux guest's boot asked of its disk, replayed without a VM): mostly
scattered small reads (metadata: 4 to 32 KiB anywhere), files read
from a small first read on in the guest's read-ahead units (128 KiB,
runs of a few), a few long sequential runs (kernel, initrd, large
binaries), and some reads of what was read before.
"""
import random
import sys

K = 1024


def gen(size, seed):
    rnd = random.Random(seed)
    blocks = size // (4 * K)
    done = []
    out = []

    def read(off, count):
        count = min(count, size - off)
        if count > 0:
            out.append((off, count))
            done.append((off, count))

    while len(out) < 2500:
        p = rnd.random()
        off = rnd.randrange(blocks) * 4 * K
        if p < 0.50:
            read(off, rnd.choice([4, 4, 4, 4, 8, 16, 32]) * K)
        elif p < 0.88:
            read(off, rnd.choice([16, 32, 64]) * K)
            off += out[-1][1]
            for _ in range(min(int(rnd.expovariate(1 / 2.5)), 16)):
                read(off, 128 * K)
                off += 128 * K
        elif p < 0.905:
            for _ in range(rnd.randrange(8, 64)):
                read(off, rnd.choice([128, 256]) * K)
                off += out[-1][1]
        elif done:
            o, c = rnd.choice(done)
            read(o, min(c, 64 * K))
    for o, c in out:
        print(o, c)


def replay(trace, uri):
    import nbd
    h = nbd.NBD()
    h.connect_uri(uri)
    total = 0
    with open(trace) as f:
        for line in f:
            off, count = map(int, line.split())
            h.pread(count, off)
            total += count
    h.shutdown()
    print(total)


if __name__ == "__main__":
    if sys.argv[1] == "gen":
        gen(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 43)
    else:
        replay(sys.argv[2], sys.argv[3])
