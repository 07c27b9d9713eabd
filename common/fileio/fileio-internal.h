/* SPDX-License-Identifier: BSD-3-Clause */
/* What the files of fileio share: an open file's state, and the
 * functions one file gives the others (README: from the bottom up,
 * each file calls only those before it).
 */
#ifndef FILEIO_INTERNAL_H
#define FILEIO_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "fileio.h"
#include "lock.h"
#include "tsa.h"

/* O_DIRECT: the largest alignment served (of offsets, lengths and
 * buffers); the bounce buffers are aligned to it.
 */
#define FILEIO_MAX_ALIGN 4096

/* O_DIRECT: blocks that a write or punch is changing.  A write of part
 * of a block reads the block, changes it and writes it whole: no other
 * write or punch may touch the block in between, or the bytes it
 * changed would be written back stale.  So every O_DIRECT write and
 * punch registers its blocks while it runs; a read-modify-write waits
 * until no registered range touches its blocks, and the others wait
 * only for read-modify-writes (two of them never share a block, since
 * requests in flight never overlap).
 */
struct fileio_range {
  uint64_t lo, hi;              /* block-aligned bytes [lo, hi) */
  bool rmw;
  struct fileio_range *next;
};

struct fileio {
  struct qcow2_io io;
  int fd;
  /* O_DIRECT only: the alignment of offsets, lengths and buffers. */
  size_t align;
  struct lock ranges_lock;      /* guards ranges and end */
  pthread_cond_t ranges_done;
  struct fileio_range *ranges;
  /* Where the file ends, as the writes done left it (a hint: which
   * writes may go through the ring).
   */
  uint64_t end;
};

/* uring.c */

/* Whether writes may go through the threads' io_uring: 0, or the error
 * making the key of the threads' rings (then the open fails).
 */
extern int fileio_ring_ready (void);
/* One read or write of the k buffers at at, as pread/pwrite (preadv/
 * pwritev) return: a write through the thread's io_uring if ring.
 */
extern ssize_t fileio_xfer (int fd, const struct iovec *iov, int k,
                            uint64_t at, bool write, bool ring);

/* rw.c: the ops of a file open through the page cache, and what the
 * O_DIRECT ones share of them.
 */
extern const struct qcow2_io_ops fileio_ops;
extern size_t fileio_iov_len (const struct iovec *iov, int cnt);
extern void fileio_iov_copy (const struct iovec *in, int cnt, size_t pos,
                             void *flat, size_t n, bool to_iov);
extern int fileio_rw_fd (int fd, const struct iovec *in, int cnt,
                         uint64_t offset, bool write, bool ring);
extern int fileio_flush (struct qcow2_io *io);
extern int fileio_punch (struct qcow2_io *io, uint64_t offset,
                         uint64_t count);
extern int fileio_preallocate (struct qcow2_io *io, uint64_t offset,
                               uint64_t count);
extern int64_t fileio_size (struct qcow2_io *io);
extern int fileio_status (struct qcow2_io *io, uint64_t offset,
                          uint64_t count, uint32_t *type, uint64_t *len);
extern int64_t fileio_allocated (struct qcow2_io *io);
extern void fileio_close (struct qcow2_io *io);

/* direct.c: the ops of a file open with O_DIRECT. */
extern const struct qcow2_io_ops fileio_direct_ops;
/* 0, or the error making the key of the threads' bounce buffers (then
 * the open fails).
 */
extern int fileio_bounce_ready (void);
/* The alignment O_DIRECT needs on fd's file system, or 0 if it does
 * not support O_DIRECT.
 */
extern size_t fileio_direct_align (int fd);

/* locking.c */

/* Take the locks of a file open for reading or writing (see
 * fileio_open_with), then check that nobody else holds what conflicts.
 * Returns 0, or -errno with *why set.
 */
extern int fileio_lock (int fd, const char *path, bool readonly,
                        const struct fileio_options *opts, char **why);

#endif /* FILEIO_INTERNAL_H */
