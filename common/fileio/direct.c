/* SPDX-License-Identifier: BSD-3-Clause */
/* fileio's O_DIRECT (cache=none; see fileio.h): requests that are not
 * aligned as the file system requires go through each thread's aligned
 * bounce buffer, a write of part of a block reads the block first, and
 * the blocks being changed are registered so that no other write undoes
 * such a read-modify-write.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"
#include "fileio-internal.h"
#include "threadobj.h"

/* O_DIRECT: each thread's aligned buffer, for requests that are not
 * aligned, grown to what they need from 64 KiB up to 1 MiB; larger
 * requests go through it in parts.
 */
#define FILEIO_BOUNCE_MIN (64u << 10)
#define FILEIO_BOUNCE_MAX (1u << 20)

static pthread_key_t fileio_bounce_key;
static pthread_once_t fileio_bounce_once = PTHREAD_ONCE_INIT;
static int fileio_bounce_err;   /* making the key failed so */

static int
fileio_direct_pwrite_fd (int fd, const void *buf, size_t count,
                         uint64_t offset, bool ring)
{
  struct iovec iov = { (void *) buf, count };

  return fileio_rw_fd (fd, &iov, 1, offset, true, ring);
}

struct fileio_bounce {
  uint8_t *buf;
  size_t size;
};

static void
fileio_bounce_free (void *arg)
{
  struct fileio_bounce *b = arg;

  free (b->buf);
  free (b);
}

static void
fileio_bounce_init (void)
{
  fileio_bounce_err = pthread_key_create (&fileio_bounce_key,
                                          fileio_bounce_free);
}

int
fileio_bounce_ready (void)
{
  pthread_once (&fileio_bounce_once, fileio_bounce_init);
  return fileio_bounce_err;
}

/* Returns this thread's aligned buffer, of want bytes or more (within
 * the bounds above), or NULL; sets *size to its size.
 */
static uint8_t *
fileio_bounce (size_t want, size_t *size)
{
  struct fileio_bounce *b;

  want = MIN (MAX (want, FILEIO_BOUNCE_MIN), FILEIO_BOUNCE_MAX);
  want = (want + FILEIO_MAX_ALIGN - 1) & ~(size_t) (FILEIO_MAX_ALIGN - 1);
  /* The open made the key (fileio_bounce_ready). */
  if (fileio_bounce_err ||
      !(b = thread_object (fileio_bounce_key, sizeof *b, NULL)))
    return NULL;
  if (b->size < want) {
    void *p;
    if (posix_memalign (&p, FILEIO_MAX_ALIGN, want) != 0)
      return NULL;
    free (b->buf);
    b->buf = p;
    b->size = want;
  }
  *size = b->size;
  return b->buf;
}

static bool
fileio_aligned (size_t align, const void *buf, size_t count, uint64_t offset)
{
  return (((uintptr_t) buf | count | offset) & (align - 1)) == 0;
}

/* O_DIRECT read of whole blocks into an aligned buffer.  A read that
 * stops short of a block boundary has met the end of the file.
 */
static int
fileio_pread_blocks (struct fileio *f, uint8_t *buf, size_t count,
                     uint64_t offset)
{
  assert (fileio_aligned (f->align, buf, count, offset));
  while (count > 0) {
    struct iovec iov = { buf, count };
    ssize_t n = fileio_xfer (f->fd, &iov, 1, offset, false, false);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0 || (n & (f->align - 1))) {
      memset (buf + n, 0, count - n);
      return 0;
    }
    buf += n;
    count -= n;
    offset += n;
  }
  return 0;
}

/* The next piece of a transfer through the bounce buffer: the whole
 * blocks [lo, lo+span) that hold the piece's n bytes at offset, which
 * start head bytes into them.
 */
struct fileio_piece {
  uint64_t lo;
  size_t head, n, span;
};

static struct fileio_piece
fileio_next_piece (const struct fileio *f, uint64_t offset, size_t left,
                   size_t bsize)
{
  struct fileio_piece p;

  p.lo = offset & ~(uint64_t) (f->align - 1);
  p.head = offset - p.lo;
  p.n = MIN (left, bsize - p.head);
  p.span = (p.head + p.n + f->align - 1) & ~(f->align - 1);
  /* Every piece moves on, and fits in the bounce buffer. */
  assert (p.n > 0 && p.span <= bsize);
  return p;
}

static int
fileio_direct_preadv (struct qcow2_io *io, const struct iovec *iov, int cnt,
                      uint64_t offset)
{
  struct fileio *f = (struct fileio *) io;
  size_t count = fileio_iov_len (iov, cnt), pos = 0;
  uint8_t *bounce;
  size_t bsize;

  if (cnt > QCOW2_IOV_MAX)
    return -EINVAL;
  if (cnt == 1 && fileio_aligned (f->align, iov[0].iov_base, count, offset))
    return fileio_pread_blocks (f, iov[0].iov_base, count, offset);
  if (!(bounce = fileio_bounce (count + 2 * f->align, &bsize)))
    return -ENOMEM;
  while (pos < count) {
    struct fileio_piece p = fileio_next_piece (f, offset + pos, count - pos,
                                               bsize);
    int r = fileio_pread_blocks (f, bounce, p.span, p.lo);

    if (r < 0)
      return r;
    fileio_iov_copy (iov, cnt, pos, bounce + p.head, p.n, true);
    pos += p.n;
  }
  return 0;
}

static int
fileio_direct_pread (struct qcow2_io *io, void *buf, size_t count,
                     uint64_t offset)
{
  struct iovec iov = { buf, count };

  return fileio_direct_preadv (io, &iov, 1, offset);
}

static bool
fileio_range_conflicts (struct fileio *f, const struct fileio_range *w)
  TSA_REQUIRES (f->ranges_lock)
{
  for (const struct fileio_range *r = f->ranges; r; r = r->next)
    if ((r->rmw || w->rmw) && r->lo < w->hi && w->lo < r->hi)
      return true;
  return false;
}

/* Register the blocks of [offset, offset+count), waiting until no
 * range registered before conflicts.  Returns whether a write there
 * goes through the ring: it reaches past the file's end while other
 * writes or punches are in flight.
 */
static bool
fileio_range_begin (struct fileio *f, struct fileio_range *w,
                    uint64_t offset, uint64_t count, bool rmw)
  TSA_EXCLUDES (f->ranges_lock)
{
  bool others;

  assert (f->align > 0);        /* O_DIRECT only */
  w->lo = offset & ~(uint64_t) (f->align - 1);
  w->hi = (offset + count + f->align - 1) & ~(uint64_t) (f->align - 1);
  w->rmw = rmw;
  lock_acquire (&f->ranges_lock);
  while (fileio_range_conflicts (f, w))
    lock_wait (&f->ranges_lock, &f->ranges_done);
  others = f->ranges != NULL && w->hi > f->end;
  w->next = f->ranges;
  f->ranges = w;
  lock_release (&f->ranges_lock);
  return others;
}

static void
fileio_range_end (struct fileio *f, struct fileio_range *w)
  TSA_EXCLUDES (f->ranges_lock)
{
  struct fileio_range **p;

  lock_acquire (&f->ranges_lock);
  for (p = &f->ranges; *p != w; p = &(*p)->next)
    assert (*p);                /* w was registered */
  *p = w->next;
  f->end = MAX (f->end, w->hi);
  pthread_cond_broadcast (&f->ranges_done);
  lock_release (&f->ranges_lock);
}

/* O_DIRECT write.  A block written only in part is read, changed and
 * written whole, with its range registered (see struct fileio_range);
 * writes that overlap are the caller's to avoid, as always.
 */
static int
fileio_direct_pwritev (struct qcow2_io *io, const struct iovec *iov, int cnt,
                       uint64_t offset)
{
  struct fileio *f = (struct fileio *) io;
  size_t count = fileio_iov_len (iov, cnt), pos = 0;
  uint8_t *bounce;
  size_t bsize;

  if (cnt > QCOW2_IOV_MAX)
    return -EINVAL;
  if (cnt == 1 && fileio_aligned (f->align, iov[0].iov_base, count, offset)) {
    struct fileio_range w;
    bool ring = fileio_range_begin (f, &w, offset, count, false);
    int r = fileio_rw_fd (f->fd, iov, 1, offset, true, ring);

    fileio_range_end (f, &w);
    return r;
  }
  if (!(bounce = fileio_bounce (count + 2 * f->align, &bsize)))
    return -ENOMEM;
  while (pos < count) {
    struct fileio_piece p = fileio_next_piece (f, offset + pos, count - pos,
                                               bsize);
    uint64_t last = p.lo + p.span - f->align;
    bool part_head = p.head > 0, part_tail = (p.head + p.n) & (f->align - 1);
    struct fileio_range w;
    bool ring = fileio_range_begin (f, &w, p.lo, p.span,
                                    part_head || part_tail);
    int r = 0;

    if (part_head)
      r = fileio_pread_blocks (f, bounce, f->align, p.lo);
    if (r == 0 && part_tail && !(part_head && last == p.lo))
      r = fileio_pread_blocks (f, bounce + p.span - f->align, f->align, last);
    if (r == 0) {
      fileio_iov_copy (iov, cnt, pos, bounce + p.head, p.n, false);
      r = fileio_direct_pwrite_fd (f->fd, bounce, p.span, p.lo, ring);
    }
    fileio_range_end (f, &w);
    if (r < 0)
      return r;
    pos += p.n;
  }
  return 0;
}

static int
fileio_direct_pwrite (struct qcow2_io *io, const void *buf, size_t count,
                      uint64_t offset)
{
  struct iovec iov = { (void *) buf, count };

  return fileio_direct_pwritev (io, &iov, 1, offset);
}

/* Zeros punched into part of a block must not be undone by a
 * read-modify-write of the block's other bytes.
 */
static int
fileio_direct_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  struct fileio *f = (struct fileio *) io;
  struct fileio_range w;
  int r;

  fileio_range_begin (f, &w, offset, count, false);
  r = fileio_punch (io, offset, count);
  fileio_range_end (f, &w);
  return r;
}

const struct qcow2_io_ops fileio_direct_ops = {
  .pread = fileio_direct_pread,
  .pwrite = fileio_direct_pwrite,
  .preadv = fileio_direct_preadv,
  .pwritev = fileio_direct_pwritev,
  .flush = fileio_flush,
  .punch = fileio_direct_punch,
  .size = fileio_size,
  .status = fileio_status,
  .allocated = fileio_allocated,
  .preallocate = fileio_preallocate,
  .close = fileio_close,
};

/* Kernels that do not say get the usual page size. */
size_t
fileio_direct_align (int fd)
{
#ifdef STATX_DIOALIGN
  struct statx stx;

  if (statx (fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN))
    return MAX (stx.stx_dio_mem_align, stx.stx_dio_offset_align);
#endif
  return 4096;
}
