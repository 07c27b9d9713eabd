#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Multi-connection stress with byte-granular ownership.
#
#   stripes.py URI --model RAW [--connections K] [--inflight Q]
#       [--pattern LEN:LEN:...] [--passes N] [--order sweep|random]
#       [--seed N] [--dump FILE]
#
# The disk is cut into stripes whose lengths cycle through --pattern,
# owned by the connections in turn, so that stripes of different
# connections share clusters (and subclusters) and sit next to each
# other: writes on two connections at once touch adjacent bytes of one
# cluster, never the same byte.  Each connection writes (and now and
# then zeroes) its own stripes, whole or in part, with up to Q requests
# in flight and no two of its own on the same bytes, flushes now and
# then, and reads back some of what it wrote as soon as it completed.
# Each connection's stripes are its model: nothing another connection
# does may change them.  With --order sweep every connection goes
# through the disk in address order, all at about the same place (the
# clusters they share are allocated and written by both at once); with
# random, in random order.  At the end the whole disk is read and
# compared with the model (RAW is what the disk holds at the start),
# which --dump writes out for a comparison with the image itself.
#
# Exits 1 at the first mismatch, naming the offset and the stripe's
# owner.
import argparse
import random
import select
import sys

import nbd


def die(msg):
    print("stripes: " + msg, file=sys.stderr)
    sys.exit(1)


class Conn:
    def __init__(self, uri, idx):
        self.h = nbd.NBD()
        self.h.connect_uri(uri)
        self.idx = idx
        self.busy = {}          # cookie -> (kind, off, len, data)
        self.queue = []         # (off, len) still to write or zero


def main():
    p = argparse.ArgumentParser()
    p.add_argument("uri")
    p.add_argument("--model", required=True)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--inflight", type=int, default=16)
    p.add_argument("--pattern", default="512:4096")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--order", choices=["sweep", "random"], default="sweep")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dump")
    a = p.parse_args()

    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    with open(a.model, "rb") as f:
        model = bytearray(f.read())
    conns = [Conn(a.uri, i) for i in range(a.connections)]
    size = conns[0].h.get_size()
    if size != len(model):
        die("the export is %d bytes, the model %d" % (size, len(model)))
    if a.connections > 1 and not conns[0].h.can_multi_conn():
        die("the server does not advertise multi-conn")
    can_zero = conns[0].h.can_zero()
    lens = [int(x) for x in a.pattern.split(":")]

    # The stripes of each connection.
    stripes = [[] for _ in conns]
    off = i = 0
    while off < size:
        n = min(lens[i % len(lens)], size - off)
        stripes[i % a.connections].append((off, n))
        off += n
        i += 1

    for c in conns:
        for _ in range(a.passes):
            order = list(stripes[c.idx])
            if a.order == "random":
                rng.shuffle(order)
            for s_off, s_len in order:
                # Whole, or a part, or two parts of the stripe.
                if s_len > 1 and rng.random() < 0.4:
                    cut = rng.randrange(1, s_len)
                    c.queue.append((s_off, cut))
                    c.queue.append((s_off + cut, s_len - cut))
                else:
                    c.queue.append((s_off, s_len))
        c.queue.reverse()       # popped from the end

    done = 0

    def overlaps(c, off, n):
        return any(o < off + n and off < o + m
                   for _, o, m, _ in c.busy.values())

    def complete(c, cookie):
        kind, off, n, data = c.busy.pop(cookie)
        if kind == "read":
            got = data[1].to_bytearray()
            if got != data[0]:
                j = next(k for k in range(n) if got[k] != data[0][k])
                die("seed %d: connection %d read back byte %#x as %#x just "
                    "after writing %#x" % (seed, c.idx, off + j, got[j],
                                           data[0][j]))
        elif kind != "flush":
            model[off:off + n] = data
            # Read a third of the writes back at once, on this connection.
            if rng.random() < 0.33:
                c.reads.append((off, n))

    for c in conns:
        c.reads = []
    while True:
        for c in conns:
            while len(c.busy) < a.inflight:
                if c.reads and not overlaps(c, *c.reads[-1]):
                    off, n = c.reads.pop()
                    buf = nbd.Buffer(n)
                    cookie = c.h.aio_pread(buf, off)
                    c.busy[cookie] = ("read", off, n,
                                      (bytes(model[off:off + n]), buf))
                    continue
                if not c.queue or overlaps(c, *c.queue[-1]):
                    break
                off, n = c.queue.pop()
                if rng.random() < 0.03:
                    c.busy[c.h.aio_flush()] = ("flush", 0, 0, None)
                if can_zero and rng.random() < 0.15:
                    cookie = c.h.aio_zero(n, off)
                    c.busy[cookie] = ("zero", off, n, bytes(n))
                else:
                    data = bytes([rng.randrange(1, 256)]) * n
                    cookie = c.h.aio_pwrite(data, off)
                    c.busy[cookie] = ("write", off, n, data)
        if not any(c.busy for c in conns):
            if any(c.queue or c.reads for c in conns):
                die("stuck")    # cannot happen: nothing busy blocks
            break
        poller = select.poll()
        fds = {}
        for c in conns:
            d = c.h.aio_get_direction()
            ev = ((select.POLLIN if d & nbd.AIO_DIRECTION_READ else 0) |
                  (select.POLLOUT if d & nbd.AIO_DIRECTION_WRITE else 0))
            if ev:
                fd = c.h.aio_get_fd()
                fds[fd] = c
                poller.register(fd, ev)
        ready = poller.poll(60000)
        if not ready:
            die("seed %d: the server is silent for 60 s" % seed)
        for fd, r in ready:
            c = fds[fd]
            if r & select.POLLIN:
                c.h.aio_notify_read()
            if r & select.POLLOUT:
                c.h.aio_notify_write()
        for c in conns:
            for cookie in list(c.busy):
                if c.h.aio_command_completed(cookie):
                    complete(c, cookie)
                    done += 1

    conns[0].h.flush()
    got = bytearray()
    step = 4 << 20
    for off in range(0, size, step):
        got += conns[0].h.pread(min(step, size - off), off)
    if got != model:
        j = next(k for k in range(size) if got[k] != model[k])
        owner = next(c for c in range(a.connections)
                     if any(o <= j < o + n for o, n in stripes[c]))
        die("seed %d: byte %#x reads %#x, not %#x (stripe of connection "
            "%d)" % (seed, j, got[j], model[j], owner))
    for c in conns:
        c.h.shutdown()
    if a.dump:
        with open(a.dump, "wb") as f:
            f.write(model)
    print("stripes: seed %d: %d requests on %d connections, pattern %s, "
          "%s order: every byte as its owner left it"
          % (seed, done, a.connections, a.pattern, a.order))


if __name__ == "__main__":
    main()
