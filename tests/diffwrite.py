#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Randomized differential write test.
#
#   /usr/bin/python3 diffwrite.py URI [--model RAW] [--backing RAW]
#       [--seed N] [--ops N] [--connections K] [--inflight Q]
#       [--max-len BYTES] [--cluster-size BYTES] [--dump FILE]
#       [--any-trim] [--require-multi-conn]
#
# Drives random, unaligned writes, zeroes, trims, flushes and reads
# against the NBD export URI over K connections with up to Q requests in
# flight on each, and applies every completed request, in step, to an
# independent model of the disk (a bytearray).  No two requests in
# flight ever touch the same byte (their result would be undefined), so
# the model can apply each request when it completes.  Reads during
# the run (of half the writes soon after they complete, often on another
# connection, and of random ranges), and a read of the whole disk at the
# end, must agree with the model.  Offsets and lengths are biased
# towards --cluster-size boundaries and the end of the disk; requests
# use only what the server advertises (zero, trim, fast zero, FUA,
# flush).  A fast zero the server refuses (ENOTSUP) must change nothing;
# it is sent again as a plain zero.
#
# The model starts as RAW (--model; e.g. the output of qemu-img convert
# -O raw of the image served), checked against the export before the
# first write; without --model it starts as whatever the export reads.
#
# Trims: NBD lets a trimmed range read back as anything until it is
# written again.  Servers of disk images do better: a trimmed byte reads
# as what it held before the trim, as zero, or as what the backing file
# holds there (--backing RAW; zeros without it).  That is checked byte by
# byte, unless --any-trim.  The final read decides what trimmed bytes
# hold, and the model written by --dump has them so: it must be what
# the image holds once the server has exited.
#
# Prints one summary line; exits 1 on any mismatch (naming the first
# differing offset and the last requests that touched it), any failed
# request, or a server silent for --stall seconds; 2 on bad usage.
# The seed fixes the random choices, but with several requests in flight
# the order of replies matters too: --connections 1 --inflight 1
# repeats a run exactly.

import argparse
import collections
import errno
import random
import select
import sys
import time

import nbd

KiB = 1024
MiB = 1024 * KiB


def die(msg, code=1):
    print("diffwrite: " + msg, file=sys.stderr)
    sys.exit(code)


def parse_size(s):
    s = s.strip()
    mult = {"k": KiB, "m": MiB, "g": 1024 * MiB}
    if s and s[-1].lower() in mult:
        return int(s[:-1]) * mult[s[-1].lower()]
    return int(s)


# Byte-wise helpers on little-endian big integers (no numpy here):
# nz(x, n) has byte i = 1 where byte i of x is nonzero, else 0.
_ones_cache = {}


def ones(n):
    v = _ones_cache.get(n)
    if v is None:
        v = int.from_bytes(b"\x01" * n, "little")
        if len(_ones_cache) > 64:
            _ones_cache.clear()
        _ones_cache[n] = v
    return v


def nz(x, n):
    x |= x >> 4
    x |= x >> 2
    x |= x >> 1
    return x & ones(n)


class Model:
    """The disk as the server must hold it.  data[i] is the byte's value;
    known[i] is 0 for bytes trimmed since they were last written, whose
    data[i] is then their value before the trim."""

    def __init__(self, data, backing, any_trim):
        self.size = len(data)
        self.data = bytearray(data)
        self.known = bytearray(b"\x01") * self.size
        self.backing = backing      # bytes of self.size, or None: zeros
        self.any_trim = any_trim

    def write(self, off, buf):
        n = len(buf)
        self.data[off:off + n] = buf
        self.known[off:off + n] = b"\x01" * n

    def zero(self, off, n):
        self.data[off:off + n] = bytes(n)
        self.known[off:off + n] = b"\x01" * n

    def trim(self, off, n):
        self.known[off:off + n] = bytes(n)

    def unknown_bytes(self):
        return self.size - self.known.count(1)

    def check(self, off, got):
        """Offset of the first byte of got (read at off) that the model
        does not allow, or None."""
        n = len(got)
        exp = memoryview(self.data)[off:off + n]
        if got == exp:
            return None
        # The byte-wise test costs in proportion to its length: give it
        # only the blocks that differ (trimmed ones, or a wrong byte).
        got = memoryview(got)
        for i in range(0, n, self.BLOCK):
            if got[i:i + self.BLOCK] != exp[i:i + self.BLOCK]:
                bad = self.check_block(off + i, got[i:i + self.BLOCK])
                if bad is not None:
                    return bad
        return None

    BLOCK = 4096

    def check_block(self, off, got):
        n = len(got)
        exp = self.data[off:off + n]
        g = int.from_bytes(got, "little")
        kn = int.from_bytes(self.known[off:off + n], "little")
        ne_old = nz(g ^ int.from_bytes(exp, "little"), n)
        bad = ne_old & kn
        if not self.any_trim:
            unk = kn ^ ones(n)
            if unk:
                alt = nz(g, n)          # not zero ...
                if self.backing is not None:   # ... and not the backing
                    alt &= nz(g ^ int.from_bytes(
                        self.backing[off:off + n], "little"), n)
                bad |= ne_old & alt & unk
        if bad == 0:
            return None
        return off + bad.to_bytes(n, "little").find(1)

    def describe(self, off, got_byte):
        s = "read 0x%02x, " % got_byte
        if self.known[off]:
            return s + "expected 0x%02x" % self.data[off]
        b = self.backing[off] if self.backing is not None else 0
        return s + ("trimmed: expected its old value 0x%02x, zero or the "
                    "backing file's 0x%02x" % (self.data[off], b))


class Cmd:
    __slots__ = ("no", "kind", "off", "n", "flags", "conn", "cookie",
                 "buf", "data", "t0")

    def __init__(self, no, kind, off, n, flags, conn, data=None):
        self.no, self.kind, self.off, self.n = no, kind, off, n
        self.flags, self.conn, self.data = flags, conn, data
        self.cookie = None
        self.buf = None


FLAG_NAMES = [(nbd.CMD_FLAG_FUA, "fua"), (nbd.CMD_FLAG_NO_HOLE, "no-hole"),
              (nbd.CMD_FLAG_FAST_ZERO, "fast")]


def flag_str(flags):
    s = [name for f, name in FLAG_NAMES if flags & f]
    return "+" + ",".join(s) if s else ""


class Driver:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed)
        self.stats = collections.Counter()
        self.history = []           # (no, conn, kind, off, n, flags)
        self.inflight = {}          # cookie-independent: id(cmd) -> cmd
        self.recent = collections.deque(maxlen=32)  # recently written
        self.to_verify = collections.deque()  # written, to read back soon
        self.next_no = 0
        self.issued = 0

    # ---- connections -------------------------------------------------
    def connect(self):
        a = self.a
        self.handles = []
        for i in range(a.connections):
            h = nbd.NBD()
            h.set_handle_name("diffwrite-%d" % i)
            h.connect_uri(a.uri)
            self.handles.append(h)
        h = self.handles[0]
        self.size = h.get_size()
        if h.is_read_only():
            die("the export is read-only")
        self.can = {
            "flush": h.can_flush(), "fua": h.can_fua(), "trim": h.can_trim(),
            "zero": h.can_zero(), "fast_zero": h.can_fast_zero(),
            "multi_conn": h.can_multi_conn(),
        }
        for o in self.handles[1:]:
            if o.get_size() != self.size:
                die("connections disagree on the export size")
        if a.connections > 1 and not self.can["multi_conn"]:
            if a.require_multi_conn:
                die("%d connections, but the server does not advertise "
                    "multi-conn" % a.connections)
            print("diffwrite: note: the server does not advertise "
                  "multi-conn; using %d connections anyway" % a.connections,
                  file=sys.stderr)
        self.min_block = max(1, h.get_block_size(nbd.SIZE_MINIMUM))
        mx = h.get_block_size(nbd.SIZE_MAXIMUM) or 32 * MiB
        self.max_req = min(mx, 32 * MiB)
        self.conn_inflight = [0] * a.connections

    # ---- model -------------------------------------------------------
    def load_model(self):
        a = self.a
        backing = None
        if a.backing:
            with open(a.backing, "rb") as f:
                backing = f.read(self.size)
            backing += bytes(self.size - len(backing))
        if a.model:
            with open(a.model, "rb") as f:
                data = f.read()
            if len(data) != self.size:
                die("--model %s has %d bytes, the export %d" %
                    (a.model, len(data), self.size))
            self.model = Model(data, backing, a.any_trim)
            self.verify_all("initial contents")
        else:
            self.model = Model(self.read_all(), backing, a.any_trim)

    def read_all(self):
        h = self.handles[0]
        out = bytearray()
        step = min(self.max_req, 4 * MiB)
        for off in range(0, self.size, step):
            out += h.pread(min(step, self.size - off), off)
        return out

    def verify_all(self, what):
        data = self.read_all()
        step = 4 * MiB
        for off in range(0, self.size, step):
            bad = self.model.check(off, data[off:off + step])
            if bad is not None:
                self.mismatch(bad, data[bad], what)
        return data

    def mismatch(self, off, got_byte, what):
        lines = ["MISMATCH at offset %d (0x%x) in %s: %s" %
                 (off, off, what, self.model.describe(off, got_byte))]
        touched = [r for r in self.history if r[3] <= off < r[3] + r[4]]
        if touched:
            lines.append("  last requests covering it:")
            for no, conn, kind, o, n, flags in touched[-8:]:
                lines.append("    #%d conn %d %s%s [%d, +%d)" %
                             (no, conn, kind, flag_str(flags), o, n))
        else:
            lines.append("  no request touched it (initial contents)")
        lines.append("  seed %d; %s" % (self.a.seed, self.summary()))
        die("\n".join(lines))

    # ---- random requests ---------------------------------------------
    def rand_data(self, n):
        r = self.rng.random()
        if r < 0.55:                              # random
            p = self.rng.randrange(len(self.pool) - n + 1)
            return self.pool[p:p + n]
        if r < 0.75:                              # one byte repeated
            v = self.rng.choice([0, 0xff, self.rng.randrange(1, 256)])
            return bytes([v]) * n
        if r < 0.9:                               # a short pattern
            pat = self.rng.randbytes(self.rng.randrange(2, 17))
            return (pat * (n // len(pat) + 1))[:n]
        # mostly zeros with a few bytes set (partially-zero buffers)
        b = bytearray(n)
        for _ in range(self.rng.randrange(1, 4)):
            b[self.rng.randrange(n)] = self.rng.randrange(1, 256)
        return bytes(b)

    def rand_range(self, big_ok):
        """A random [off, off+n) inside the disk, biased towards cluster
        boundaries and the end of the disk."""
        rng, cs, size = self.rng, self.a.cluster_size, self.size
        max_len = min(self.a.max_len, self.max_req, size)
        nclusters = max(1, (size + cs - 1) // cs)
        r = rng.random()
        if big_ok and r < 0.01:                    # big zero/trim
            n = rng.randrange(1, min(size // 4 + 1, 1 << 31) + 1)
            off = rng.randrange(size - n + 1)
            return self.align(off, n)
        r = rng.random()
        if r < 0.15:                               # whole clusters
            k = rng.randrange(nclusters)
            off, n = k * cs, cs * rng.randint(1, 3)
        elif r < 0.35:                             # across a boundary
            k = rng.randrange(1, nclusters) if nclusters > 1 else 0
            before = rng.choice([1, rng.randint(1, 600),
                                 rng.randint(1, max(1, cs))])
            after = rng.choice([1, rng.randint(1, 600),
                                rng.randint(1, max(1, cs))])
            off, n = k * cs - before, before + after
        else:
            lr = rng.random()
            if lr < 0.3:
                n = rng.randint(1, 16)
            elif lr < 0.6:
                n = rng.randint(1, 4 * KiB + 100)
            elif lr < 0.85:
                n = rng.randint(1, max(1, cs + 1))
            else:
                n = rng.randint(1, max_len)
            orr = rng.random()
            if orr < 0.4:
                off = rng.randrange(size)
            elif orr < 0.6:                        # near a cluster start
                off = rng.randrange(nclusters) * cs + rng.randint(-40, 40)
            elif orr < 0.75:                       # near a cluster end
                off = (rng.randrange(nclusters) + 1) * cs - n + \
                    rng.randint(-40, 40)
            elif orr < 0.85:                       # near the end of disk
                off = size - n - rng.randint(0, 600)
            else:
                off = rng.randrange(size // 512) * 512
        n = max(1, min(n, max_len, size))
        off = max(0, min(off, size - n))
        return self.align(off, n)

    def align(self, off, n):
        m = self.min_block
        if m > 1:
            off -= off % m
            n = max(m, (n + m - 1) // m * m)
            n = min(n, self.size - off)
        return off, n

    def overlaps(self, off, n):
        end = off + n
        for c in self.inflight.values():
            if c.n and off < c.off + c.n and c.off < end:
                return True
        return False

    def pick_free_range(self, big_ok, tries=12):
        for _ in range(tries):
            off, n = self.rand_range(big_ok)
            if not self.overlaps(off, n):
                return off, n
        return None

    def gen(self, conn):
        """Issue one random request on connection conn; False if every
        range tried is busy."""
        rng, can = self.rng, self.can
        if self.to_verify and rng.random() < 0.5:  # read back a write
            off, n = self.to_verify.popleft()
            if not self.overlaps(off, n):
                return self.issue(Cmd(self.next_no, "read", off, n, 0, conn))
        fua = nbd.CMD_FLAG_FUA if can["fua"] and rng.random() < 0.1 else 0
        r = rng.random()
        if r < 0.04 and can["flush"]:
            return self.issue(Cmd(self.next_no, "flush", 0, 0, 0, conn))
        if r < 0.25:                               # read back
            rng_ = None
            if self.recent and rng.random() < 0.6:
                off, n = rng.choice(self.recent)
                if not self.overlaps(off, n):
                    rng_ = (off, n)
            if rng_ is None:
                rng_ = self.pick_free_range(False)
            if rng_ is None:
                return False
            return self.issue(Cmd(self.next_no, "read", rng_[0], rng_[1],
                                  0, conn))
        if r < 0.42 and can["zero"]:
            rr = self.pick_free_range(True)
            if rr is None:
                return False
            flags = fua
            if rng.random() < 0.5:
                flags |= nbd.CMD_FLAG_NO_HOLE
            if can["fast_zero"] and rng.random() < 0.3:
                flags |= nbd.CMD_FLAG_FAST_ZERO
            return self.issue(Cmd(self.next_no, "zero", rr[0], rr[1],
                                  flags, conn))
        if r < 0.52 and can["trim"]:
            rr = self.pick_free_range(True)
            if rr is None:
                return False
            return self.issue(Cmd(self.next_no, "trim", rr[0], rr[1],
                                  fua, conn))
        rr = self.pick_free_range(False)
        if rr is None:
            return False
        data = self.rand_data(rr[1])
        return self.issue(Cmd(self.next_no, "write", rr[0], rr[1], fua,
                              conn, data))

    def issue(self, c):
        h = self.handles[c.conn]
        if c.kind == "write":
            c.buf = nbd.Buffer.from_bytearray(bytearray(c.data))
            c.cookie = h.aio_pwrite(c.buf, c.off, flags=c.flags)
        elif c.kind == "read":
            c.buf = nbd.Buffer(c.n)
            c.cookie = h.aio_pread(c.buf, c.off)
        elif c.kind == "zero":
            c.cookie = h.aio_zero(c.n, c.off, flags=c.flags)
        elif c.kind == "trim":
            c.cookie = h.aio_trim(c.n, c.off, flags=c.flags)
        elif c.kind == "flush":
            c.cookie = h.aio_flush()
        c.t0 = time.monotonic()
        if c.no == self.next_no:
            self.next_no += 1
            self.issued += 1
        self.history.append((c.no, c.conn, c.kind, c.off, c.n, c.flags))
        self.inflight[id(c)] = c
        self.conn_inflight[c.conn] += 1
        if len(self.inflight) > self.stats["max-inflight"]:
            self.stats["max-inflight"] = len(self.inflight)
        return True

    # ---- completions -------------------------------------------------
    def complete(self, c):
        m, st = self.model, self.stats
        st[c.kind] += 1
        if c.flags & nbd.CMD_FLAG_FUA:
            st["fua"] += 1
        if c.kind == "write":
            m.write(c.off, c.data)
            st["written"] += c.n
            self.recent.append((c.off, c.n))
            if self.rng.random() < 0.5:
                self.to_verify.append((c.off, c.n))
        elif c.kind == "zero":
            m.zero(c.off, c.n)
            if c.flags & nbd.CMD_FLAG_NO_HOLE:
                st["no-hole"] += 1
            if c.flags & nbd.CMD_FLAG_FAST_ZERO:
                st["fast"] += 1
            self.recent.append((c.off, c.n))
        elif c.kind == "trim":
            m.trim(c.off, c.n)
        elif c.kind == "read":
            got = c.buf.to_bytearray()
            bad = m.check(c.off, got)
            if bad is not None:
                self.mismatch(bad, got[bad - c.off],
                              "read #%d conn %d [%d, +%d)" %
                              (c.no, c.conn, c.off, c.n))
            st["read-bytes"] += c.n

    def reap(self):
        for key, c in list(self.inflight.items()):
            h = self.handles[c.conn]
            try:
                done = h.aio_command_completed(c.cookie)
            except nbd.Error as e:
                del self.inflight[key]
                self.conn_inflight[c.conn] -= 1
                if c.kind == "zero" and c.flags & nbd.CMD_FLAG_FAST_ZERO \
                        and e.errnum == errno.ENOTSUP:
                    # A fast zero may fail so: nothing changed; the
                    # range stays ours, zero it the slow way.
                    self.stats["fast-enotsup"] += 1
                    c.flags &= ~nbd.CMD_FLAG_FAST_ZERO
                    self.issue(c)
                    continue
                die("#%d conn %d %s%s [%d, +%d) failed: %s (seed %d)" %
                    (c.no, c.conn, c.kind, flag_str(c.flags), c.off, c.n,
                     e.string, self.a.seed))
            if done:
                del self.inflight[key]
                self.conn_inflight[c.conn] -= 1
                self.complete(c)

    def wait(self, timeout):
        rl, wl, by_fd = [], [], {}
        for h in self.handles:
            fd, d = h.aio_get_fd(), h.aio_get_direction()
            by_fd[fd] = h
            if d & nbd.AIO_DIRECTION_READ:
                rl.append(fd)
            if d & nbd.AIO_DIRECTION_WRITE:
                wl.append(fd)
        r, w, _ = select.select(rl, wl, [], timeout)
        for fd in r:
            by_fd[fd].aio_notify_read()
        for fd in w:
            by_fd[fd].aio_notify_write()
        return bool(r or w)

    def run(self):
        a = self.a
        pool_len = max(min(a.max_len, self.max_req), 4 * self.a.cluster_size,
                       1 * MiB) + 4096
        self.pool = self.rng.randbytes(pool_len)
        last_progress = time.monotonic()
        conns = list(range(a.connections))
        while self.issued < a.ops or self.inflight:
            self.rng.shuffle(conns)
            for conn in conns:
                while self.issued < a.ops and \
                        self.conn_inflight[conn] < a.inflight:
                    if not self.gen(conn):
                        break
            if not self.inflight:
                continue
            if self.wait(1.0):
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > a.stall:
                old = min(self.inflight.values(), key=lambda c: c.t0)
                die("no reply from the server for %d s; oldest request "
                    "in flight: #%d conn %d %s [%d, +%d)" %
                    (a.stall, old.no, old.conn, old.kind, old.off, old.n))
            self.reap()

    def finish(self):
        if self.can["flush"]:
            for h in self.handles:
                h.flush()
        data = self.verify_all("the final read of the whole disk")
        unknown = self.model.unknown_bytes()
        if self.a.dump:
            # Trimmed bytes are what the final read found there.
            m = self.model
            i = m.known.find(0)
            while i != -1:
                j = m.known.find(1, i)
                if j == -1:
                    j = m.size
                m.data[i:j] = data[i:j]
                i = m.known.find(0, j)
            with open(self.a.dump, "wb") as f:
                f.write(m.data)
        for h in self.handles:
            h.shutdown()
        self.stats["unknown-at-end"] = unknown

    def summary(self):
        st = self.stats
        return ("%d requests over %d connection(s): %d writes (%d bytes), "
                "%d zeroes (%d no-hole, %d fast, %d fast refused), "
                "%d trims, %d flushes, %d fua, %d reads (%d bytes); "
                "up to %d in flight; size %d, cluster %d; %d trimmed bytes unknown at the end"
                % (self.issued, self.a.connections, st["write"],
                   st["written"], st["zero"], st["no-hole"], st["fast"],
                   st["fast-enotsup"], st["trim"], st["flush"], st["fua"],
                   st["read"], st["read-bytes"], st["max-inflight"], self.size,
                   self.a.cluster_size, st["unknown-at-end"]))


def main():
    p = argparse.ArgumentParser(description="randomized differential "
                                "write test of an NBD export")
    p.add_argument("uri")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--connections", type=int, default=1)
    p.add_argument("--inflight", type=int, default=8)
    p.add_argument("--max-len", type=parse_size, default=None,
                   help="longest write (default: 3 clusters + 1000)")
    p.add_argument("--cluster-size", type=parse_size, default=64 * KiB)
    p.add_argument("--model", help="raw file: the disk's contents now")
    p.add_argument("--backing", help="raw file: what the backing file "
                   "holds (trimmed bytes may read so); default zeros")
    p.add_argument("--dump", help="write the final model here")
    p.add_argument("--any-trim", action="store_true",
                   help="trimmed bytes may read as anything")
    p.add_argument("--require-multi-conn", action="store_true")
    p.add_argument("--stall", type=int, default=60,
                   help="fail after this many seconds without a reply")
    a = p.parse_args()
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1 << 31)
    if a.max_len is None:
        a.max_len = 3 * a.cluster_size + 1000
    if a.ops < 0 or a.connections < 1 or a.inflight < 1 or a.max_len < 1 \
            or a.cluster_size < 1:
        die("bad arguments", 2)

    d = Driver(a)
    d.connect()
    d.load_model()
    t0 = time.monotonic()
    d.run()
    d.finish()
    print("diffwrite: OK seed %d, %.1f s: %s" %
          (a.seed, time.monotonic() - t0, d.summary()))


if __name__ == "__main__":
    main()
