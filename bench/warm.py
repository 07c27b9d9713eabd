#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Read the data extents of files (skipping holes, found with
SEEK_DATA), so that they are in the page cache: warm.py FILE...
"""
import os
import sys

for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    end = os.lseek(fd, 0, os.SEEK_END)
    off = 0
    while off < end:
        try:
            data = os.lseek(fd, off, os.SEEK_DATA)
        except OSError:         # ENXIO: only a hole up to the end
            break
        hole = os.lseek(fd, data, os.SEEK_HOLE)
        while data < hole:
            n = len(os.pread(fd, min(1 << 20, hole - data), data))
            if n == 0:
                break
            data += n
        off = hole
    os.close(fd)
