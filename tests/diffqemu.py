#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Differential test: the same seeded stream of requests to our plugin
# (URI-A) and to qemu-nbd (URI-B), each serving its own copy of one
# image; qemu-nbd is the oracle.
#
#   diffqemu.py URI-A URI-B [--seed N] [--ops N] [--connections K]
#       [--inflight Q] [--cluster-size BYTES] [--trim-keeps]
#
# Requests go in batches of up to K*Q, spread over K connections to
# each server, never two in a batch on the same bytes: reads (unaligned,
# odd-sized, now and then up to 32 MiB), writes (some with FUA), zeroes
# (with and without NO_HOLE, and FAST_ZERO where both servers offer it:
# refused by either, the range is zeroed plainly on both), trims,
# flushes and block status.  Every read must return the same bytes
# from both servers; every range either server reports as reading as
# zeros must read as zeros from both.  Trimmed bytes may read as
# anything until written again (NBD says so, and QEMU and the plugin
# free different parts of partial clusters): they are not compared, and
# are zeroed on both servers at the end, so that the two images can be
# compared with qemu-img compare once the servers have exited.  With
# --trim-keeps (a version 2 image over a backing file, where QEMU keeps
# the data rather than show the backing file's) trimmed bytes are
# compared too.
import argparse
import errno
import random
import select
import sys

import nbd

MiB = 1 << 20


def die(msg):
    print("diffqemu: " + msg, file=sys.stderr)
    sys.exit(1)


class Server:
    def __init__(self, uri, k):
        self.h = [nbd.NBD() for _ in range(k)]
        for h in self.h:
            h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
            h.connect_uri(uri)
        self.size = self.h[0].get_size()

    def wait(self, pending):
        """Run until every (handle, cookie) completed; their errors."""
        errs = {}
        while True:
            for h, c in list(pending):
                try:
                    if not h.aio_command_completed(c):
                        continue
                except nbd.Error as e:
                    errs[(h, c)] = e.errno or str(e)
                pending.remove((h, c))
            if not pending:
                return errs
            poller = select.poll()
            fds = {}
            for h in {h for h, _ in pending}:
                d = h.aio_get_direction()
                ev = ((select.POLLIN if d & nbd.AIO_DIRECTION_READ else 0) |
                      (select.POLLOUT if d & nbd.AIO_DIRECTION_WRITE else 0))
                if ev:
                    fds[h.aio_get_fd()] = h
                    poller.register(h.aio_get_fd(), ev)
            ready = poller.poll(60000)
            if not ready:
                die("a server is silent for 60 s")
            for fd, ev in ready:
                if ev & select.POLLIN:
                    fds[fd].aio_notify_read()
                if ev & select.POLLOUT:
                    fds[fd].aio_notify_write()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ops", type=int, default=600)
    p.add_argument("--connections", type=int, default=3)
    p.add_argument("--inflight", type=int, default=4)
    p.add_argument("--cluster-size", type=int, default=65536)
    p.add_argument("--trim-keeps", action="store_true",
                   help="a trim changes nothing (v2 over a backing file)")
    a = p.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    k = a.connections
    A, B = Server(a.a, k), Server(a.b, k)
    if A.size != B.size:
        die("sizes differ: %d and %d" % (A.size, B.size))
    size, cs = A.size, a.cluster_size
    both = (A, B)
    can = {f: all(getattr(s.h[0], f)() for s in both)
           for f in ("can_zero", "can_trim", "can_fast_zero", "can_fua")}
    # What qemu-nbd offers, the plugin must too, or its requests would
    # go untested (fast zero aside: either may refuse it).
    for f in ("can_zero", "can_trim", "can_fua"):
        if getattr(B.h[0], f)() and not can[f]:
            die("%s: qemu-nbd offers it, the plugin does not" % f)
    undefined = bytearray(size)  # 1: trimmed since last written
    counts = {}
    history = []                # (kind, off, n) of changes, in order

    def pick_range(big=False):
        if big and rng.random() < 0.3:
            n = rng.randrange(1, min(size, 32 * MiB) + 1)
        else:
            n = rng.choice([1, 511, 512, 4096, 4097, cs - 1, cs, cs + 1,
                            2 * cs, 3 * cs + 700, 200000])
        n = min(n, size)
        if rng.random() < 0.5:
            off = rng.randrange(0, size // cs + 1) * cs
            off += rng.choice([0, 0, 512, cs - 512, 1]) if off < size else 0
        else:
            off = rng.randrange(0, size)
        off = min(off, size - n)
        return off, n

    def compare(kind, off, n, da, db):
        if da == db:
            return
        for j in range(n):
            if da[j] != db[j] and not undefined[off + j]:
                o = off + j
                last = [h for h in history if h[1] <= o < h[1] + h[2]][-4:]
                die("seed %d: %s at %#x+%d: byte %#x reads %#x from ours, "
                    "%#x from qemu-nbd; the last changes there: %s"
                    % (seed, kind, off, n, o, da[j], db[j],
                       "; ".join("%s %#x+%d%s" % h for h in last) or
                       "none"))

    done = 0
    while done < a.ops:
        busy = []               # (off, n) reserved in this batch
        batch = []
        for i in range(k * a.inflight):
            kind = rng.choices(
                ["read", "write", "zero", "trim", "flush", "status"],
                [30, 35, 12, 8, 3, 12])[0]
            if kind == "zero" and not can["can_zero"]:
                kind = "write"
            if kind == "trim" and not can["can_trim"]:
                kind = "write"
            off, n = pick_range(big=kind in ("read", "status"))
            if any(o < off + n and off < o + m for o, m in busy):
                continue
            busy.append((off, n))
            # What both servers get: drawn once.
            data, flags = None, 0
            if kind == "write":
                data = bytes(rng.randrange(256) for _ in range(7))
                data = (data * (n // 7 + 1))[:n]
                if can["can_fua"] and rng.random() < 0.2:
                    flags = nbd.CMD_FLAG_FUA
            elif kind == "zero":
                if rng.random() < 0.4:
                    flags |= nbd.CMD_FLAG_NO_HOLE
                if can["can_fast_zero"] and rng.random() < 0.4:
                    flags |= nbd.CMD_FLAG_FAST_ZERO
            batch.append((i % k, kind, off, n, data, flags))
        # Issued on both servers, then waited for on both.
        cookies = {A: [], B: []}
        bufs = {}
        for conn, kind, off, n, data, flags in batch:
            for s in both:
                h = s.h[conn]
                c = None        # block status: checked below
                if kind == "read":
                    buf = nbd.Buffer(n)
                    c = h.aio_pread(buf, off)
                    bufs[(s, c)] = buf
                elif kind == "write":
                    c = h.aio_pwrite(data, off, flags=flags)
                elif kind == "zero":
                    c = h.aio_zero(n, off, flags=flags)
                elif kind == "trim":
                    c = h.aio_trim(n, off)
                elif kind == "flush":
                    c = h.aio_flush()
                cookies[s].append((h, c))
        errs = {s: s.wait([x for x in cookies[s] if x[1] is not None])
                for s in both}
        for i, (conn, kind, off, n, data, flags) in enumerate(batch):
            ca, cb = cookies[A][i][1], cookies[B][i][1]
            ea, eb = errs[A].get(cookies[A][i]), errs[B].get(cookies[B][i])
            counts[kind] = counts.get(kind, 0) + 1
            done += 1
            if kind == "zero" and (ea or eb):
                # A fast zero either refused: zero plainly on both.
                if {ea, eb} - {None, errno.ENOTSUP, "ENOTSUP"}:
                    die("seed %d: zero at %#x+%d failed: %s, %s"
                        % (seed, off, n, ea, eb))
                for s in both:
                    s.h[conn].zero(n, off)
                ea = eb = None
            if ea or eb:
                die("seed %d: %s at %#x+%d failed: ours %s, qemu-nbd %s"
                    % (seed, kind, off, n, ea, eb))
            if kind == "read":
                compare("read", off, n, bufs[(A, ca)].to_bytearray(),
                        bufs[(B, cb)].to_bytearray())
            elif kind == "status":
                check_status(seed, both, conn, off, n, undefined)
            elif kind in ("write", "zero", "trim"):
                history.append((kind, off, n, " flags %#x" % flags))
                undefined[off:off + n] = (
                    b"\1" if kind == "trim" and not a.trim_keeps
                    else b"\0") * n
    # Trimmed bytes: zeroed on both, then everything compared.
    j = 0
    while j < size:
        if undefined[j]:
            e = j
            while e < size and undefined[e]:
                e += 1
            for s in both:
                s.h[0].zero(e - j, j)
            j = e
        else:
            j += 1
    for s in both:
        s.h[0].flush()
    step = 8 * MiB
    for off in range(0, size, step):
        n = min(step, size - off)
        compare("final read", off, n, A.h[0].pread(n, off),
                B.h[0].pread(n, off))
    for s in both:
        for h in s.h:
            h.shutdown()
    print("diffqemu: seed %d: %s: ours and qemu-nbd agree"
          % (seed, ", ".join("%d %s" % (counts[x], x)
                             for x in sorted(counts))))


def check_status(seed, both, conn, off, n, undefined):
    """Every range reported as reading as zeros reads as zeros on both."""
    for s in both:
        h = s.h[conn]
        zeros = []

        def cb(ctx, start, entries, err):
            pos = start
            for i in range(0, len(entries), 2):
                if entries[i + 1] & nbd.STATE_ZERO:
                    zeros.append((pos, entries[i]))
                pos += entries[i]
            return 0

        h.block_status(n, off, cb)
        for zo, zn in zeros:
            zn = min(zn, off + n - zo)
            for t in both:
                d = t.h[conn].pread(zn, zo)
                bad = [i for i in range(zn) if d[i] and not undefined[zo + i]]
                if bad:
                    j = bad[0]
                    die("seed %d: %s reports %#x+%d as zeros, but %s reads "
                        "%#x at %#x" % (seed, "ours" if s is both[0] else
                                        "qemu-nbd", zo, zn,
                                        "ours" if t is both[0] else
                                        "qemu-nbd", d[j], zo + j))


if __name__ == "__main__":
    main()
