#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Patch fields of a qcow2 image, and find where things are in it, so
# that tests can corrupt one specific field of an otherwise valid image.
#
# Usage: qcow2-patch.py IMG COMMAND ARGS...   (COMMAND IMG ARGS... too)
#
# Numbers may be decimal, 0x hexadecimal, or with a k, M or G suffix.
# Queries print decimal.
#
#   u8|be16|be32|be64 OFFSET [VALUE]
#                    write VALUE (big endian) at OFFSET; without VALUE,
#                    print the value there
#   set-bits OFFSET MASK      be64 at OFFSET |= MASK
#   clear-bits OFFSET MASK    be64 at OFFSET &= ~MASK
#   bytes OFFSET HEX          write raw bytes (hex string)
#   fill OFFSET LENGTH BYTE   write LENGTH copies of BYTE
#   random OFFSET LENGTH [SEED]
#                    overwrite LENGTH bytes with pseudo-random bytes
#                    (deterministic for a given SEED, default 1)
#   flip-bits OFFSET LENGTH COUNT [SEED]
#                    flip COUNT random bits in [OFFSET, OFFSET+LENGTH)
#                    (deterministic for a given SEED, default 1)
#   truncate LENGTH           cut (or extend) the file to LENGTH bytes
#   field NAME                print a header field (names as in the spec:
#                    version, cluster_bits, l1_size, l1_table_offset, ...)
#   l1-entry N                print "VALUE FILE_OFFSET" of L1 entry N
#   l2-entry-offset GUEST_OFFSET
#                    print the file offset of the L2 entry that maps
#                    GUEST_OFFSET (fails if its L2 table is unallocated)
#   l2-entry GUEST_OFFSET     print "VALUE FILE_OFFSET" of that L2 entry
#   compressed GUEST_OFFSET   print "HOST_OFFSET LENGTH" of the compressed
#                    cluster that maps GUEST_OFFSET (LENGTH as the
#                    descriptor says, rounded up to sectors)
#   ext-offset TYPE           print the file offset of the header
#                    extension of TYPE (its 8 byte type+length header)
#   add-feature TYPE BIT NAME append an entry to the feature name table
#                    (TYPE 0 incompatible, 1 compatible, 2 autoclear)

import os
import random
import struct
import sys

FIELDS = {
    # name: (offset, struct format)
    "magic": (0, ">I"),
    "version": (4, ">I"),
    "backing_file_offset": (8, ">Q"),
    "backing_file_size": (16, ">I"),
    "cluster_bits": (20, ">I"),
    "size": (24, ">Q"),
    "crypt_method": (32, ">I"),
    "l1_size": (36, ">I"),
    "l1_table_offset": (40, ">Q"),
    "refcount_table_offset": (48, ">Q"),
    "refcount_table_clusters": (56, ">I"),
    "nb_snapshots": (60, ">I"),
    "snapshots_offset": (64, ">Q"),
    "incompatible_features": (72, ">Q"),
    "compatible_features": (80, ">Q"),
    "autoclear_features": (88, ">Q"),
    "refcount_order": (96, ">I"),
    "header_length": (100, ">I"),
    "compression_type": (104, ">B"),
}
WIDTH = {"u8": ">B", "be16": ">H", "be32": ">I", "be64": ">Q"}
FEATURE_TABLE = 0x6803F857
OFFSET_MASK = 0x00FFFFFFFFFFFE00


def die(msg):
    sys.exit("qcow2-patch.py: " + msg)


def num(s):
    """A number: decimal, 0x hex, or with a k/M/G suffix (powers of 2)."""
    mult = {"k": 1 << 10, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        if s and s[-1] in mult:
            return int(s[:-1], 0) * mult[s[-1]]
        return int(s, 0)
    except ValueError:
        die("not a number: %s" % s)


def get(f, off, fmt):
    f.seek(off)
    data = f.read(struct.calcsize(fmt))
    if len(data) != struct.calcsize(fmt):
        die("offset %d is beyond the end of the file" % off)
    return struct.unpack(fmt, data)[0]


def put(f, off, fmt, value):
    if value < 0:               # from shell arithmetic: two's complement
        value += 1 << (8 * struct.calcsize(fmt))
    f.seek(off)
    f.write(struct.pack(fmt, value))


def field(f, name):
    if name not in FIELDS:
        die("unknown header field %s" % name)
    return get(f, *FIELDS[name])


def l1_entry(f, n):
    if n >= field(f, "l1_size"):
        die("L1 index %d is not below l1_size" % n)
    off = field(f, "l1_table_offset") + 8 * n
    return get(f, off, ">Q"), off


def l2_entry(f, guest):
    cluster_bits = field(f, "cluster_bits")
    extl2 = field(f, "version") >= 3 and \
        field(f, "incompatible_features") & (1 << 4)
    entry_size = 16 if extl2 else 8
    l2_bits = cluster_bits - (4 if extl2 else 3)
    l1, _ = l1_entry(f, guest >> (cluster_bits + l2_bits))
    l2_offset = l1 & OFFSET_MASK
    if l2_offset == 0:
        die("guest offset %d has no L2 table" % guest)
    index = (guest >> cluster_bits) & ((1 << l2_bits) - 1)
    off = l2_offset + entry_size * index
    return get(f, off, ">Q"), off


def extensions(f):
    """Yield (offset, type, length) of each header extension."""
    version = field(f, "version")
    end = 1 << field(f, "cluster_bits")
    off = field(f, "header_length") if version >= 3 else 72
    if field(f, "backing_file_offset"):
        end = min(end, field(f, "backing_file_offset"))
    while off + 8 <= end:
        etype, elen = get(f, off, ">I"), get(f, off + 4, ">I")
        if etype == 0:
            return
        yield off, etype, elen
        off += 8 + ((elen + 7) & ~7)


def main(argv):
    if len(argv) < 3:
        die("usage: qcow2-patch.py IMG COMMAND ARGS...")
    # Accept both "IMG COMMAND ARGS" and "COMMAND IMG ARGS".
    if os.path.exists(argv[1]) or not os.path.exists(argv[2]):
        img, cmd, args = argv[1], argv[2], argv[3:]
    else:
        cmd, img, args = argv[1], argv[2], argv[3:]

    with open(img, "r+b") as f:
        if cmd in WIDTH and len(args) in (1, 2):
            if len(args) == 1:
                print(get(f, num(args[0]), WIDTH[cmd]))
            else:
                put(f, num(args[0]), WIDTH[cmd], num(args[1]))
        elif cmd in ("set-bits", "clear-bits") and len(args) == 2:
            off, mask = num(args[0]), num(args[1])
            v = get(f, off, ">Q")
            put(f, off, ">Q", v | mask if cmd == "set-bits" else v & ~mask)
        elif cmd == "bytes" and len(args) == 2:
            f.seek(num(args[0]))
            f.write(bytes.fromhex(args[1]))
        elif cmd == "fill" and len(args) == 3:
            f.seek(num(args[0]))
            f.write(bytes([num(args[2])]) * num(args[1]))
        elif cmd == "random" and len(args) in (2, 3):
            rng = random.Random(num(args[2]) if len(args) == 3 else 1)
            f.seek(num(args[0]))
            f.write(bytes(rng.randrange(256) for _ in range(num(args[1]))))
        elif cmd == "flip-bits" and len(args) in (3, 4):
            rng = random.Random(num(args[3]) if len(args) == 4 else 1)
            start, length = num(args[0]), num(args[1])
            for _ in range(num(args[2])):
                bit = rng.randrange(length * 8)
                f.seek(start + bit // 8)
                b = f.read(1)
                if len(b) != 1:
                    die("offset %d is beyond the end of the file"
                        % (start + bit // 8))
                f.seek(start + bit // 8)
                f.write(bytes([b[0] ^ (1 << (bit % 8))]))
        elif cmd == "truncate" and len(args) == 1:
            f.truncate(num(args[0]))
        elif cmd == "field" and len(args) == 1:
            print(field(f, args[0]))
        elif cmd == "l1-entry" and len(args) == 1:
            print("%d %d" % l1_entry(f, num(args[0])))
        elif cmd == "l2-entry-offset" and len(args) == 1:
            print(l2_entry(f, num(args[0]))[1])
        elif cmd == "l2-entry" and len(args) == 1:
            print("%d %d" % l2_entry(f, num(args[0])))
        elif cmd == "compressed" and len(args) == 1:
            entry, _ = l2_entry(f, num(args[0]))
            if not entry & (1 << 62):
                die("guest offset %s is not compressed" % args[0])
            x = 62 - (field(f, "cluster_bits") - 8)
            host = entry & ((1 << x) - 1)
            sectors = (entry >> x) & ((1 << (62 - x)) - 1)
            print("%d %d" % (host, (sectors + 1) * 512 - (host & 511)))
        elif cmd == "ext-offset" and len(args) == 1:
            for off, etype, _ in extensions(f):
                if etype == num(args[0]):
                    print(off)
                    break
            else:
                die("no header extension of type %s" % args[0])
        elif cmd == "add-feature" and len(args) == 3:
            exts = list(extensions(f))
            for i, (off, etype, elen) in enumerate(exts):
                if etype == FEATURE_TABLE:
                    break
            else:
                die("no feature name table")
            if i != len(exts) - 1 or elen % 8:
                die("the feature name table is not the last extension")
            name = args[2].encode()[:46].ljust(46, b"\0")
            f.seek(off + 8 + elen)
            f.write(bytes([num(args[0]), num(args[1])]) + name)
            f.write(b"\0" * 8)          # end of the extensions
            put(f, off + 4, ">I", elen + 48)
        else:
            die("bad command or arguments: %s %s" % (cmd, " ".join(args)))


if __name__ == "__main__":
    main(sys.argv)
