#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Random requests through an NBD export, applied to a raw model file of
# the disk as well: writes (some FUA), zeroes (some with NO_HOLE),
# trims and flushes, then a flush; the export must then read as the
# model.  A trim makes the whole clusters it covers read as zeros (an
# overlay's zero flags) and leaves partial ones as they were.
#
# Usage: overlay-ops.py URI MODEL SEED N [CLUSTER]

import random
import sys

import nbd

uri, model, seed, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cluster = int(sys.argv[5]) if len(sys.argv) > 5 else 65536
rng = random.Random(seed)

h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
with open(model, "r+b") as m:
    assert len(m.read()) == size, "the model is not as large as the export"
    for i in range(n):
        off = rng.randrange(size - 1)
        cnt = min(rng.choice([1, 512, 4096, 65536, 200000, 1 << 20]) +
                  rng.randrange(4096), size - off)
        op = rng.choice("wwwfzztF")
        if op in "wf":
            data = rng.randbytes(cnt)
            h.pwrite(data, off, nbd.CMD_FLAG_FUA if op == "f" else 0)
        elif op == "z":
            h.zero(cnt, off, nbd.CMD_FLAG_NO_HOLE if rng.randrange(2) else 0)
            data = bytes(cnt)
        elif op == "t":
            h.trim(cnt, off)
            first = -(-off // cluster) * cluster
            end = size if off + cnt == size else (off + cnt) // cluster * cluster
            if first < end:
                m.seek(first)
                m.write(bytes(end - first))
            continue
        else:
            h.flush()
            continue
        m.seek(off)
        m.write(data)
    h.flush()
    m.seek(0)
    want = m.read()
got = b"".join(h.pread(min(1 << 22, size - o), o)
               for o in range(0, size, 1 << 22))
if got != want:
    o = next(i for i in range(size) if got[i] != want[i])
    sys.exit("the export reads %#x at %#x, the model %#x" % (got[o], o, want[o]))
