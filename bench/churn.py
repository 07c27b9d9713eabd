#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# One churn run against an NBD server (see churn.sh): fill the disk,
# then cycles of: trim a scattered half of it, flush, write the trimmed
# half again (in random order), flush.  After each flush, one line:
#   CYCLE PHASE FILE_END DISK_USE
# where FILE_END is the image file's size and DISK_USE the bytes its
# blocks take (st_blocks * 512).  The extents are 1 to 64 units long
# (UNIT: 4 KiB, or a sixteenth of the cluster if more, so that some
# clusters are freed whole) and aligned to a unit, chosen by SEED
# alone, so both servers get the same requests.
#
# Usage: churn.py SOCKET IMAGE SIZE CYCLES SEED UNIT
import os
import random
import sys

import nbd

sock, image, size, cycles, seed, unit = sys.argv[1], sys.argv[2], \
    int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rng = random.Random(seed)
h = nbd.NBD()
h.connect_unix(sock)
assert h.get_size() == size


def report(cycle, phase):
    h.flush()
    st = os.stat(image)
    print(cycle, phase, st.st_size, st.st_blocks * 512, flush=True)


def data(n, tag):
    return (tag.to_bytes(4, "little") * (n // 4 + 1))[:n]


# Fill.
for off in range(0, size, 1 << 20):
    h.pwrite(data(min(1 << 20, size - off), off // 4096 + 1), off)
report(0, "fill")

# The extents: a fixed partition of the disk.
extents = []
off = 0
while off < size:
    n = min(rng.randrange(1, 65) * unit, size - off)
    extents.append((off, n))
    off += n

for cycle in range(1, cycles + 1):
    half = rng.sample(extents, len(extents) // 2)
    for off, n in half:
        h.trim(n, off)
    report(cycle, "trim")
    rng.shuffle(half)
    for off, n in half:
        h.pwrite(data(n, cycle * 1000003 + off // 4096), off)
    report(cycle, "rewrite")
h.shutdown()
