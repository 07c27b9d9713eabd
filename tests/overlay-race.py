#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Two connections writing while a third reads (with copy-on-read, and
# cache requests), each in its own process, over an NBD export of the
# raw disk BASE.  Writer k writes only in the clusters c with
# c % 2 == k, bytes that are BASE's flipped (~), up to 8 requests in
# flight; so every byte the reader sees must be BASE's or its flip, and
# once all are done the disk must be BASE with exactly the bytes
# written flipped, which is written to EXPECTED.
#
# Usage: overlay-race.py URI BASE SEED OPS EXPECTED [CLUSTER]

import multiprocessing
import random
import sys

import nbd

uri, base_path, seed, ops, expected = sys.argv[1:6]
seed, ops = int(seed), int(ops)
cluster = int(sys.argv[6]) if len(sys.argv) > 6 else 65536
with open(base_path, "rb") as f:
    base = f.read()
size = len(base)
flipped = base.translate(bytes(255 - i for i in range(256)))
# Bytes that are neither 0 nor 0xff map to 1.
NEITHER = bytes(0 if i in (0, 255) else 1 for i in range(256))


def xor(a, b):
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).to_bytes(
        len(a), "big")


def writer(k, out):
    rng = random.Random(seed * 3 + k)
    h = nbd.NBD()
    h.connect_uri(uri)
    mask = bytearray(size)
    inflight = []
    for i in range(ops):
        c = rng.randrange(size // cluster // 2) * 2 + k
        off = c * cluster + rng.randrange(cluster)
        n = 1 + rng.randrange(min(cluster * 2, c * cluster + cluster - off))
        n = min(n, c * cluster + cluster - off)
        inflight.append(h.aio_pwrite(flipped[off:off + n], off))
        mask[off:off + n] = b"\xff" * n
        while len(inflight) >= 8:
            h.poll(-1)
            inflight = [x for x in inflight if not h.aio_command_completed(x)]
    while inflight:
        h.poll(-1)
        inflight = [x for x in inflight if not h.aio_command_completed(x)]
    h.flush()
    with open(out, "wb") as f:
        f.write(mask)


def reader(out):
    rng = random.Random(seed * 3 + 2)
    h = nbd.NBD()
    h.connect_uri(uri)
    bad = 0
    for i in range(ops):
        off = rng.randrange(size)
        n = 1 + rng.randrange(min(1 << 20, size - off))
        if i % 5 == 4:
            h.cache(n, off)
            continue
        got = h.pread(n, off)
        if xor(got, base[off:off + n]).translate(NEITHER).count(1):
            bad += 1
            print("read %#x+%#x: bytes that are neither the disk's nor a "
                  "writer's" % (off, n), file=sys.stderr)
    with open(out, "w") as f:
        f.write(str(bad))


procs = [multiprocessing.Process(target=writer, args=(k, "%s.w%d" % (expected, k)))
         for k in (0, 1)]
procs.append(multiprocessing.Process(target=reader, args=(expected + ".r",)))
for p in procs:
    p.start()
for p in procs:
    p.join()
    if p.exitcode != 0:
        sys.exit("a client failed")
with open(expected + ".r") as f:
    if int(f.read()) != 0:
        sys.exit("reads saw bytes that no one wrote")
# Where a writer wrote (0xff in its mask), the flip.
want = base
for k in (0, 1):
    with open("%s.w%d" % (expected, k), "rb") as f:
        want = xor(want, f.read())
with open(expected, "wb") as f:
    f.write(want)
