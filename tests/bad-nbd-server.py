# SPDX-License-Identifier: BSD-3-Clause
# A read-only NBD server (newstyle fixed handshake, structured replies)
# that answers reads wrongly on purpose, for the tests of a client that
# must fail such reads rather than serve them.
#
#   bad-nbd-server.py PORTFILE
#
# listens on 127.0.0.1 (the port written to PORTFILE once it listens)
# and serves 4 MiB, byte i being (i * 7 + 1) & 255.  The export's name
# is the mode, saying how each read of [off, off+len) is answered:
#   good     one data chunk covering it (the control)
#   scattered  right, but backwards: the last quarter's data, the
#            middle half as a hole (zeros), the first quarter's data
#   short    one data chunk covering the first half only, then done
#   overlap  [off, off+3/4 len) and [off+1/4 len, off+len): overlapping
#   gap      [off, off+1/2 len) twice: as many bytes as asked, half
#            of them the same ones twice
#   outside  a data chunk for the len bytes after the range
#   simple   a simple reply with the data (structured replies having
#            been negotiated)
#   handle   the right data under the wrong handle
#   zero     reads right, but block status (base:allocation) claims
#            the whole export a hole that reads as zeros
import os
import socket
import struct
import sys
import threading

NBD_OPT_EXPORT_NAME = 1
NBD_OPT_GO = 7
NBD_OPT_STRUCTURED_REPLY = 8
NBD_OPT_SET_META_CONTEXT = 10
NBD_REP_ACK = 1
NBD_REP_INFO = 3
NBD_REP_META_CONTEXT = 4
NBD_REP_ERR_UNSUP = 0x80000001
REPLY_MAGIC = 0x3e889045565a9
STRUCTURED_MAGIC = 0x668e33ef
SIMPLE_MAGIC = 0x67446698
FLAG_DONE = 1
TYPE_NONE = 0
TYPE_OFFSET_DATA = 1
TYPE_OFFSET_HOLE = 2
TYPE_BLOCK_STATUS = 5
CMD_READ, CMD_DISC, CMD_BLOCK_STATUS = 0, 2, 7
STATE_HOLE_ZERO = 3
BASE_ALLOCATION_ID = 1

MODES = ("good", "scattered", "short", "overlap", "gap", "outside", "simple",
         "handle", "zero")
portfile = sys.argv[1]
size = 4 << 20
pattern = bytes((i * 7 + 1) & 255 for i in range(256))


def content(off, n):
    start = off % 256
    reps = (start + n + 255) // 256
    return (pattern * reps)[start:start + n]


def recv(s, n):
    buf = b""
    while len(buf) < n:
        got = s.recv(n - len(buf))
        if not got:
            raise EOFError
        buf += got
    return buf


def opt_reply(s, opt, rtype, data=b""):
    s.sendall(struct.pack(">QIII", REPLY_MAGIC, opt, rtype, len(data)) + data)


def chunk(handle, off, data, done):
    return struct.pack(">IHHQIQ", STRUCTURED_MAGIC, FLAG_DONE if done else 0,
                       TYPE_OFFSET_DATA, handle, 8 + len(data), off) + data


def answer_read(s, mode, handle, off, n):
    half, quarter = n // 2, n // 4
    if mode in ("good", "zero"):
        s.sendall(chunk(handle, off, content(off, n), True))
    elif mode == "scattered":
        hole = struct.pack(">IHHQIQI", STRUCTURED_MAGIC, 0, TYPE_OFFSET_HOLE,
                           handle, 12, off + quarter, n - 2 * quarter)
        s.sendall(chunk(handle, off + n - quarter,
                        content(off + n - quarter, quarter), False) + hole +
                  chunk(handle, off, content(off, quarter), True))
    elif mode == "short":
        s.sendall(chunk(handle, off, content(off, half), True))
    elif mode == "overlap":
        s.sendall(chunk(handle, off, content(off, n - quarter), False) +
                  chunk(handle, off + quarter,
                        content(off + quarter, n - quarter), True))
    elif mode == "gap":
        s.sendall(chunk(handle, off, content(off, half), False) +
                  chunk(handle, off, content(off, n - half), True))
    elif mode == "outside":
        s.sendall(chunk(handle, off + n, content(off + n, n), True))
    elif mode == "simple":
        s.sendall(struct.pack(">IIQ", SIMPLE_MAGIC, 0, handle) +
                  content(off, n))
    elif mode == "handle":
        s.sendall(chunk(handle ^ 0x5a5a, off, content(off, n), True))


def serve(s):
    structured = False
    s.sendall(b"NBDMAGIC" + b"IHAVEOPT" + struct.pack(">H", 3))
    recv(s, 4)                          # the client's flags
    while True:
        magic, opt, length = struct.unpack(">QII", recv(s, 16))
        data = recv(s, length)
        if opt == NBD_OPT_STRUCTURED_REPLY:
            structured = True
            opt_reply(s, opt, NBD_REP_ACK)
        elif (opt == NBD_OPT_SET_META_CONTEXT and
              data[4:4 + struct.unpack(">I", data[:4])[0]] == b"zero"):
            # base:allocation, whatever was asked (the client asks it);
            # the other modes have no block status.
            opt_reply(s, opt, NBD_REP_META_CONTEXT,
                      struct.pack(">I", BASE_ALLOCATION_ID) +
                      b"base:allocation")
            opt_reply(s, opt, NBD_REP_ACK)
        elif (opt == NBD_OPT_GO and
              data[4:4 + struct.unpack(">I", data[:4])[0]].decode() in MODES):
            mode = data[4:4 + struct.unpack(">I", data[:4])[0]].decode()
            # The export's size, read-only (HAS_FLAGS | READ_ONLY).
            opt_reply(s, opt, NBD_REP_INFO, struct.pack(">HQH", 0, size, 3))
            opt_reply(s, opt, NBD_REP_ACK)
            break
        elif opt == NBD_OPT_EXPORT_NAME and data.decode() in MODES:
            mode = data.decode()
            s.sendall(struct.pack(">QH", size, 3))
            break
        else:
            # Anything else, an unknown export's name included.
            opt_reply(s, opt, NBD_REP_ERR_UNSUP)
    assert structured or mode in ("good", "simple")
    while True:
        magic, flags, cmd, handle, off, n = struct.unpack(">IHHQQI",
                                                          recv(s, 28))
        if cmd == CMD_DISC:
            return
        if cmd == CMD_READ:
            answer_read(s, mode, handle, off, n)
        elif cmd == CMD_BLOCK_STATUS and mode == "zero":
            s.sendall(struct.pack(">IHHQIIII", STRUCTURED_MAGIC, FLAG_DONE,
                                  TYPE_BLOCK_STATUS, handle, 12,
                                  BASE_ALLOCATION_ID, n, STATE_HOLE_ZERO))
        else:
            s.sendall(struct.pack(">IIQ", SIMPLE_MAGIC, 22, handle))


def connection(s):
    try:
        serve(s)
    except (EOFError, OSError):
        pass
    finally:
        s.close()


srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0))
srv.listen(16)
with open(portfile + ".tmp", "w") as f:
    f.write(str(srv.getsockname()[1]))
os.rename(portfile + ".tmp", portfile)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=connection, args=(conn,), daemon=True).start()
