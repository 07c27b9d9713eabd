#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Persistent bitmap checks, with QEMU as the reader of the bitmaps.
#
#   bitmapcheck.py dirty URI NAME          dirty ranges of bitmap NAME,
#                                          as exported by qemu-nbd -B
#   bitmapcheck.py workload URI SEED N     N random writes, zeroes and
#                                          trims; prints their ranges
#   bitmapcheck.py expect BEFORE OPS GRAN AFTER [--unchanged]
#
# "expect" checks that AFTER (the dirty ranges read after the workload)
# is exactly BEFORE plus every granule of GRAN bytes that an operation
# in OPS touched, or, with --unchanged (a disabled bitmap), BEFORE.
# All files are JSON lists of [offset, length].
import json
import random
import sys

import nbd


def dirty(uri, name):
    h = nbd.NBD()
    ctx = "qemu:dirty-bitmap:" + name
    h.add_meta_context(ctx)
    h.connect_uri(uri)
    if not h.can_meta_context(ctx):
        sys.exit("bitmapcheck: the server does not export " + ctx)
    size = h.get_size()
    ranges = []
    off = 0

    def cb(metacontext, offset, entries, err):
        nonlocal off
        if metacontext != ctx:
            return
        for i in range(0, len(entries), 2):
            length, flags = entries[i], entries[i + 1]
            if flags & 1:
                if ranges and ranges[-1][0] + ranges[-1][1] == off:
                    ranges[-1][1] += length
                else:
                    ranges.append([off, length])
            off += length

    while off < size:
        start = off
        h.block_status(min(size - off, 1 << 30), off, cb)
        if off == start:
            sys.exit("bitmapcheck: no progress at %d" % off)
    h.shutdown()
    return ranges


def workload(uri, seed, n):
    rng = random.Random(seed)
    h = nbd.NBD()
    h.connect_uri(uri)
    size = h.get_size()
    ops = []
    for i in range(n):
        length = rng.choice([1, 511, 512, 4096, 5000, 65536, 200000])
        length = min(length, size)
        off = rng.randrange(0, size - length + 1)
        kind = rng.random()
        if kind < 0.6:
            h.pwrite(bytes([rng.randrange(1, 256)]) * length, off)
        elif kind < 0.8 and h.can_zero():
            h.zero(length, off)
        elif h.can_trim():
            h.trim(length, off)
        else:
            continue
        ops.append([off, length])
        if rng.random() < 0.1:
            h.flush()
    h.flush()
    h.shutdown()
    return ops


def granules(ranges, gran):
    s = set()
    for off, length in ranges:
        s.update(range(off // gran, (off + length - 1) // gran + 1))
    return s


def expect(before, ops, gran, after, unchanged):
    # The disk's end may cut the last granule short: compare granules.
    want = granules(before, gran)
    if not unchanged:
        want |= granules(ops, gran)
    got = granules(after, gran)
    if got != want:
        missing = sorted(want - got)[:10]
        extra = sorted(got - want)[:10]
        sys.exit("bitmapcheck: dirty granules (of %d bytes) differ: "
                 "%d missing, first %s; %d extra, first %s"
                 % (gran, len(want - got), [g * gran for g in missing],
                    len(got - want), [g * gran for g in extra]))


def load(path):
    with open(path) as f:
        return json.load(f)


def main(argv):
    if argv[1] == "dirty":
        print(json.dumps(dirty(argv[2], argv[3])))
    elif argv[1] == "workload":
        print(json.dumps(workload(argv[2], int(argv[3]), int(argv[4]))))
    elif argv[1] == "expect":
        expect(load(argv[2]), load(argv[3]), int(argv[4]), load(argv[5]),
               "--unchanged" in argv[6:])
    else:
        sys.exit("bitmapcheck: unknown command " + argv[1])


if __name__ == "__main__":
    main(sys.argv)
