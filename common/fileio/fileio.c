/* SPDX-License-Identifier: BSD-3-Clause */
/* A qcow2_io backend over a local file: pread/pwrite, fdatasync,
 * hole punching, and SEEK_HOLE for finding holes; optionally O_DIRECT.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef HAVE_LIBURING
#include <liburing.h>
#endif

#include "checked.h"
#include "errstr.h"
#include "fileio.h"
#include "lock.h"
#include "threadobj.h"

/* O_DIRECT: each thread's aligned buffer, for requests that are not
 * aligned, grown to what they need from 64 KiB up to 1 MiB; larger
 * requests go through it in parts.
 */
#define FILEIO_BOUNCE_MIN (64u << 10)
#define FILEIO_BOUNCE_MAX (1u << 20)
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

static pthread_key_t fileio_bounce_key;
static pthread_once_t fileio_bounce_once = PTHREAD_ONCE_INIT;

static int
fileio_fd (struct qcow2_io *io)
{
  return ((struct fileio *) io)->fd;
}

#ifdef HAVE_LIBURING
/* O_DIRECT writes past the file's end made while others are in flight
 * go through an io_uring of the calling thread's own, one at a time:
 * the thread still waits for its write, but the kernel runs it as
 * asynchronous I/O.  A synchronous O_DIRECT write that allocates (into
 * a hole inside the file, on ext4) holds the inode lock until the
 * device has written it and its extent is converted; an asynchronous
 * one lets go of the lock once submitted, so that the allocating writes
 * of many threads reach the disk together, as qemu-nbd's --aio=native
 * ones do.  Overwrites inside the file share the lock and measured
 * slower through the ring (QD16 4 KiB: 0.88 of pwrite's rate; four
 * connections' mixed I/O 0.85), so they go as pwrite.  A write alone
 * goes as pwrite: through the ring, one that allocates would wait for a
 * kernel worker thread to take it (measured slower at one request in
 * flight), and reads, which share the lock, measured slower through the
 * ring too.  Without a ring (the kernel refuses one, or
 * NBDKIT_QCOW2_IO_URING=0 in the environment): pwrite.
 */
struct fileio_ring {
  struct io_uring ring;
  bool ready;                   /* false: system calls for this thread */
};

static pthread_key_t fileio_ring_key;
static pthread_once_t fileio_ring_once = PTHREAD_ONCE_INIT;
static bool fileio_ring_off;

static void
fileio_ring_free (void *arg)
{
  struct fileio_ring *t = arg;

  if (t->ready)
    io_uring_queue_exit (&t->ring);
  free (t);
}

static void
fileio_ring_init (void)
{
  const char *e = getenv ("NBDKIT_QCOW2_IO_URING");

  fileio_ring_off = e && strcmp (e, "0") == 0;
  pthread_key_create (&fileio_ring_key, fileio_ring_free);
}

/* Returns this thread's ring, made on first use, or NULL. */
static struct fileio_ring *
fileio_ring (void)
{
  struct fileio_ring *t;
  bool made;

  pthread_once (&fileio_ring_once, fileio_ring_init);
  if (fileio_ring_off)
    return NULL;
  t = thread_object (fileio_ring_key, sizeof *t, &made);
  if (made)
    t->ready = io_uring_queue_init (2, &t->ring, 0) == 0;
  return t && t->ready ? t : NULL;
}

/* One write through the thread's ring.  Returns false if it could not
 * be submitted (the ring is then given up, for system calls); else true
 * with *n set as pwritev would return it.
 */
static bool
fileio_ring_wr (struct fileio_ring *t, int fd, const struct iovec *iov,
                int k, uint64_t at, ssize_t *n)
{
  struct io_uring_sqe *sqe = io_uring_get_sqe (&t->ring);
  struct io_uring_cqe *cqe;
  int r;

  /* The ring holds two entries and each call reaps the one it used. */
  assert (sqe);
  io_uring_prep_writev (sqe, fd, iov, k, at);
  /* Nothing submitted: the entry stays queued, so the ring goes. */
  if (io_uring_submit_and_wait (&t->ring, 1) < 1) {
    io_uring_queue_exit (&t->ring);
    t->ready = false;
    return false;
  }
  while ((r = io_uring_wait_cqe (&t->ring, &cqe)) == -EINTR)
    ;
  /* The write is in flight: returning would let the caller reuse a
   * buffer the kernel still reads.
   */
  if (r < 0) {
    fprintf (stderr, "fileio: io_uring_wait_cqe: %s\n", errstr (-r));
    abort ();
  }
  *n = cqe->res < 0 ? (errno = -cqe->res, -1) : cqe->res;
  io_uring_cqe_seen (&t->ring, cqe);
  return true;
}
#endif

/* One read or write of the k buffers at at, as pread/pwrite (preadv/
 * pwritev) return: a write through the thread's io_uring if ring (see
 * above).
 */
static ssize_t
fileio_xfer (int fd, const struct iovec *iov, int k, uint64_t at,
             bool write, bool ring)
{
#ifdef HAVE_LIBURING
  struct fileio_ring *t;
  ssize_t n;

  if (ring && write && (t = fileio_ring ()) &&
      fileio_ring_wr (t, fd, iov, k, at, &n))
    return n;
#else
  (void) ring;
#endif
  /* A single buffer goes as pread or pwrite, as strace users expect. */
  return k == 1 && write ? pwrite (fd, iov[0].iov_base, iov[0].iov_len, at)
    : k == 1 ? pread (fd, iov[0].iov_base, iov[0].iov_len, at)
    : write ? pwritev (fd, iov, k, at)
    : preadv (fd, iov, k, at);
}

/* Copies the iovec from position pos on into iov[] (room for
 * QCOW2_IOV_MAX): what is left to do after a short read or write.
 * Returns the count.
 */
static int
fileio_iov_from (const struct iovec *in, int cnt, size_t pos,
                 struct iovec *iov)
{
  int n = 0;

  assert (cnt <= QCOW2_IOV_MAX);
  for (int i = 0; i < cnt; i++) {
    if (pos >= in[i].iov_len) {
      pos -= in[i].iov_len;
      continue;
    }
    iov[n].iov_base = (char *) in[i].iov_base + pos;
    iov[n++].iov_len = in[i].iov_len - pos;
    pos = 0;
  }
  return n;
}

static size_t
fileio_iov_len (const struct iovec *iov, int cnt)
{
  size_t len = 0;

  for (int i = 0; i < cnt; i++)
    len += iov[i].iov_len;
  return len;
}

/* Copy n bytes between flat and the iovec's bytes from position pos:
 * into the iovec if to_iov, else out of it.
 */
static void
fileio_iov_copy (const struct iovec *in, int cnt, size_t pos, void *flat,
                 size_t n, bool to_iov)
{
  struct iovec iov[QCOW2_IOV_MAX];
  int k = fileio_iov_from (in, cnt, pos, iov);
  uint8_t *p = flat;

  for (int i = 0; i < k && n > 0; i++) {
    size_t m = MIN (n, iov[i].iov_len);
    if (to_iov)
      memcpy (iov[i].iov_base, p, m);
    else
      memcpy (p, iov[i].iov_base, m);
    p += m;
    n -= m;
  }
  assert (n == 0);              /* the iovec holds what is copied */
}

/* Read (with zeros past the end of the file) or write, looping over
 * short transfers.
 */
static int
fileio_rw_fd (int fd, const struct iovec *in, int cnt, uint64_t offset,
              bool write, bool ring)
{
  size_t count = fileio_iov_len (in, cnt), done = 0;
  struct iovec iov[QCOW2_IOV_MAX];

  while (done < count) {
    int k = fileio_iov_from (in, cnt, done, iov);
    ssize_t n = fileio_xfer (fd, iov, k, offset + done, write, ring);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0 && !write) {     /* past the end of the file */
      for (int i = 0; i < k; i++)
        memset (iov[i].iov_base, 0, iov[i].iov_len);
      return 0;
    }
    done += n;
  }
  return 0;
}

static int
fileio_direct_pwrite_fd (int fd, const void *buf, size_t count,
                         uint64_t offset, bool ring)
{
  struct iovec iov = { (void *) buf, count };

  return fileio_rw_fd (fd, &iov, 1, offset, true, ring);
}

static int
fileio_preadv (struct qcow2_io *io, const struct iovec *iov, int cnt,
               uint64_t offset)
{
  if (cnt > QCOW2_IOV_MAX)
    return -EINVAL;
  return fileio_rw_fd (fileio_fd (io), iov, cnt, offset, false, false);
}

static int
fileio_pwritev (struct qcow2_io *io, const struct iovec *iov, int cnt,
                uint64_t offset)
{
  if (cnt > QCOW2_IOV_MAX)
    return -EINVAL;
  return fileio_rw_fd (fileio_fd (io), iov, cnt, offset, true, false);
}

static int
fileio_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  struct iovec iov = { buf, count };

  return fileio_preadv (io, &iov, 1, offset);
}

static int
fileio_pwrite (struct qcow2_io *io, const void *buf, size_t count,
               uint64_t offset)
{
  struct iovec iov = { (void *) buf, count };

  return fileio_pwritev (io, &iov, 1, offset);
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
  pthread_key_create (&fileio_bounce_key, fileio_bounce_free);
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
  pthread_once (&fileio_bounce_once, fileio_bounce_init);
  if (!(b = thread_object (fileio_bounce_key, sizeof *b, NULL)))
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

static int
fileio_flush (struct qcow2_io *io)
{
  return fdatasync (fileio_fd (io)) == -1 ? -errno : 0;
}

static int
fileio_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  if (fallocate (fileio_fd (io), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                 offset, count) == -1)
    return -errno;
  return 0;
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

static int
fileio_preallocate (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  /* posix_fallocate, unlike fallocate, also works (by writing zeros
   * into the holes) where the file system cannot allocate.
   */
  return -posix_fallocate (fileio_fd (io), offset, count);
}

static int64_t
fileio_size (struct qcow2_io *io)
{
  /* lseek rather than fstat, so block devices work too. */
  off_t size = lseek (fileio_fd (io), 0, SEEK_END);

  return size == -1 ? -errno : size;
}

static int
fileio_status (struct qcow2_io *io, uint64_t offset, uint64_t count,
               uint32_t *type, uint64_t *len)
{
  int fd = fileio_fd (io);
  off_t data = lseek (fd, offset, SEEK_DATA);

  *type = QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO;
  if (data == -1) {
    /* A block device has no SEEK_DATA (EINVAL): all of it is data. */
    if (errno == EINVAL) {
      *type = 0;
      *len = count;
      return 0;
    }
    if (errno != ENXIO)
      return -errno;
    *len = count;               /* no data from here to the end */
    return 0;
  }
  if ((uint64_t) data > offset) {
    *len = data - offset;
    return 0;
  }
  off_t hole = lseek (fd, offset, SEEK_HOLE);
  if (hole == -1)
    return -errno;
  *type = 0;
  *len = hole - offset;
  return 0;
}

static int64_t
fileio_allocated (struct qcow2_io *io)
{
  struct stat st;

  if (fstat (fileio_fd (io), &st) == -1)
    return -errno;
  return (int64_t) st.st_blocks * 512;
}

static void
fileio_close (struct qcow2_io *io)
{
  struct fileio *f = (struct fileio *) io;

  close (f->fd);
  if (f->align) {
    assert (!f->ranges);        /* no write in flight */
    lock_destroy (&f->ranges_lock);
    pthread_cond_destroy (&f->ranges_done);
  }
  free (f);
}

static const struct qcow2_io_ops fileio_ops = {
  .pread = fileio_pread,
  .pwrite = fileio_pwrite,
  .preadv = fileio_preadv,
  .pwritev = fileio_pwritev,
  .flush = fileio_flush,
  .punch = fileio_punch,
  .size = fileio_size,
  .status = fileio_status,
  .allocated = fileio_allocated,
  .preallocate = fileio_preallocate,
  .close = fileio_close,
};

static const struct qcow2_io_ops fileio_direct_ops = {
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

/* Returns the alignment O_DIRECT needs on fd's file system, or 0 if it
 * does not support O_DIRECT.  Kernels that do not say get the usual page
 * size.
 */
static size_t
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

/* QEMU's lock bytes (block/file-posix.c): 100+N "uses permission N",
 * 200+N "does not share permission N".
 */
#define LOCK_USE 100
#define LOCK_SHARE 200
#define PERM_CONSISTENT_READ 0
#define PERM_WRITE 1
#define PERM_RESIZE 3
#define PERM_COUNT 5

static const char *const perm_names[PERM_COUNT] = {
  "consistent read", "write", "write unchanged", "resize", "change children",
};

static int
fileio_lock_byte (int fd, int cmd, short type, off_t byte)
{
  struct flock fl = {
    .l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1,
  };

  if (fcntl (fd, cmd, &fl) == -1)
    return -errno;
  if (cmd == F_OFD_GETLK)
    return fl.l_type == F_UNLCK ? 0 : 1;
  return 0;
}

/* Take the locks of a file open for reading or writing, then check
 * that nobody else holds what conflicts (QEMU's raw_apply_lock_bytes
 * and raw_check_lock_bytes).  Returns 0, or -errno with *why set.
 */
static int
fileio_lock (int fd, const char *path, bool readonly,
             const struct fileio_options *opts, char **why)
{
  unsigned use = 1u << PERM_CONSISTENT_READ;
  unsigned unshared = 1u << PERM_WRITE | 1u << PERM_RESIZE;
  enum fileio_locking mode = opts ? opts->locking : FILEIO_LOCKING_AUTO;
  int r = 0;

  if (mode == FILEIO_LOCKING_OFF) {
    if (opts->debug)
      opts->debug (path, "not locked (locking=off)");
    return 0;
  }
  if (!readonly)
    use |= 1u << PERM_WRITE | 1u << PERM_RESIZE;
  for (int n = 0; n < PERM_COUNT && r == 0; n++) {
    if (use & 1u << n)
      r = fileio_lock_byte (fd, F_OFD_SETLK, F_RDLCK, LOCK_USE + n);
    if (r == 0 && unshared & 1u << n)
      r = fileio_lock_byte (fd, F_OFD_SETLK, F_RDLCK, LOCK_SHARE + n);
  }
  if (r == -EINVAL || r == -EOPNOTSUPP || r == -ENOLCK || r == -ENOSYS) {
    if (mode == FILEIO_LOCKING_ON) {
      if (asprintf (why, "cannot lock it (%s): the file system does not "
                    "support OFD locks\nlocking=off opens it unlocked",
                    errstr (-r)) == -1)
        *why = NULL;
      return r;
    }
    if (opts && opts->notice)
      opts->notice (path, "not locked: the file system does not support "
                    "OFD locks, so QEMU cannot see that it is in use");
    return 0;
  }
  for (int n = 0; n < PERM_COUNT && r == 0; n++) {
    const char *what = NULL;
    bool shared = false;
    int c = 0;

    if (use & 1u << n &&
        (c = fileio_lock_byte (fd, F_OFD_GETLK, F_WRLCK, LOCK_SHARE + n)) > 0)
      what = "another process (QEMU?) has it open and shares that with "
        "nobody";
    else if (c == 0 && unshared & 1u << n &&
             (c = fileio_lock_byte (fd, F_OFD_GETLK, F_WRLCK,
                                    LOCK_USE + n)) > 0) {
      what = n == PERM_WRITE ? "another process (QEMU?) has it open for "
        "writing" : "another process (QEMU?) has it open and may change it";
      shared = true;
    }
    if (c < 0)
      r = c;
    else if (what) {
      if (asprintf (why, "failed to get %s\"%s\" lock: %s (is another "
                    "process using the image?)\nlocking=off serves it "
                    "anyway, as qemu's -U or file.locking=off does",
                    shared ? "shared " : "", perm_names[n], what) == -1)
        *why = NULL;
      r = -EAGAIN;
    }
  }
  if (r == 0 && opts && opts->debug)
    opts->debug (path, readonly ? "locked as QEMU locks an image it reads "
                 "(OFD lock bytes 100, 201, 203)"
                 : "locked as QEMU locks an image it writes "
                 "(OFD lock bytes 100, 101, 103, 201, 203)");
  return r;
}

/* The name of path under opts->beneath, or NULL if it is not there. */
static const char *
fileio_beneath_name (const char *path, const struct fileio_options *opts)
{
  size_t n = opts && opts->beneath ? strlen (opts->beneath) : 0;

  if (n && strncmp (path, opts->beneath, n) == 0 && path[n] == '/')
    return path + n + 1;
  return NULL;
}

/* open (path, flags, mode), or under opts->beneath fileio_open_beneath,
 * then (there) refused unless a regular file, *why saying why.
 */
static int
fileio_open_path (const char *path, int flags, mode_t mode,
                  const struct fileio_options *opts, char **why)
{
  const char *name = fileio_beneath_name (path, opts);
  struct stat st;
  int fd, e;

  if (!name)
    return open (path, flags, mode);
  fd = fileio_open_beneath (opts->beneath_fd, name, flags, mode);
  if (fd == -1) {
    e = errno;
    if ((e == EXDEV || e == ELOOP) &&
        asprintf (why, "refused: %s leads out of %s (by \"..\" or a "
                  "symbolic link to an absolute name), or through more "
                  "than 40 links", name, opts->beneath) == -1)
      *why = NULL;
    errno = e == EXDEV ? EPERM : e;
    return -1;
  }
  if (fstat (fd, &st) == -1) {
    e = errno;
    close (fd);
    errno = e;
    return -1;
  }
  if (!S_ISREG (st.st_mode)) {
    if (asprintf (why, "refused: %s in %s is not a regular file (a "
                  "folder, FIFO, socket or device)", name,
                  opts->beneath) == -1)
      *why = NULL;
    close (fd);
    errno = EPERM;
    return -1;
  }
  return fd;
}

/* A qcow2_io over fd (open on path as opts says, O_NONBLOCK), which
 * it takes: closed on failure.
 */
static struct qcow2_io *
fileio_from_fd (int fd, const char *path, bool readonly,
                const struct fileio_options *opts, char **why)
{
  bool direct = opts && opts->direct;
  struct fileio *f;
  struct stat st;
  size_t align = 0;
  int e;

  if (fstat (fd, &st) == -1 ||
      fcntl (fd, F_SETFL, fcntl (fd, F_GETFL) & ~O_NONBLOCK) == -1)
    goto err;
  if (S_ISDIR (st.st_mode)) {
    errno = EISDIR;
    goto err;
  }
  if (S_ISREG (st.st_mode) &&
      (e = fileio_lock (fd, path, readonly, opts, why)) < 0) {
    errno = -e;
    goto err;
  }
  if (direct) {
    align = fileio_direct_align (fd);
    if (align == 0 || align > FILEIO_MAX_ALIGN || !is_power_of_2 (align)) {
      errno = EINVAL;
      goto err;
    }
  }
  f = malloc (sizeof *f);
  if (!f)
    goto err;
  f->fd = fd;
  f->align = align;
  f->io.ops = direct ? &fileio_direct_ops : &fileio_ops;
  f->io.serial_writes = !direct && S_ISREG (st.st_mode);
  f->io.grows_by_writes = direct && S_ISREG (st.st_mode);
  f->ranges = NULL;
  f->end = st.st_size;
  if (direct) {
    lock_init (&f->ranges_lock);
    lock_cond_init (&f->ranges_done);
  }
  return &f->io;

 err:
  e = errno;
  close (fd);
  errno = e;
  return NULL;
}

/* Open path as fileio_open_with does, with more flags (O_CREAT...). */
static struct qcow2_io *
fileio_open_flags (const char *path, bool readonly, int more, mode_t mode,
                   const struct fileio_options *opts, char **why)
{
  bool direct = opts && opts->direct;
  struct qcow2_io *io;
  char *discard = NULL;
  int fd, e;

  if (!why)
    why = &discard;
  *why = NULL;
  /* Not blocking in open on a FIFO (which then fails below or at its
   * first read): O_NONBLOCK is dropped once the file is open.
   */
  fd = fileio_open_path (path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC |
                         O_NONBLOCK | (direct ? O_DIRECT : 0) | more, mode,
                         opts, why);
  io = fd == -1 ? NULL : fileio_from_fd (fd, path, readonly, opts, why);
  e = errno;
  free (discard);
  errno = e;
  return io;
}

struct qcow2_io *
fileio_open_with (const char *path, bool readonly,
                  const struct fileio_options *opts, char **why)
{
  return fileio_open_flags (path, readonly, 0, 0, opts, why);
}

bool
fileio_is_beneath (const char *path, const struct fileio_options *opts)
{
  return fileio_beneath_name (path, opts) != NULL;
}

int
fileio_stat_with (const char *path, const struct fileio_options *opts,
                  struct stat *st)
{
  const char *name = fileio_beneath_name (path, opts);
  int fd, r, e;

  if (!name)
    return stat (path, st);
  fd = fileio_open_beneath (opts->beneath_fd, name, O_PATH, 0);
  if (fd == -1)
    return -1;
  r = fstat (fd, st);
  e = errno;
  close (fd);
  errno = e;
  return r;
}

int
fileio_stat (struct qcow2_io *io, struct stat *st)
{
  return fstat (((struct fileio *) io)->fd, st);
}

struct qcow2_io *
fileio_create (const char *path, const struct fileio_options *opts,
               char **why)
{
  struct qcow2_io *io = fileio_open_flags (path, false, O_CREAT, 0644, opts,
                                          why);
  int64_t size;

  if (!io)
    return NULL;
  size = io->ops->size (io);
  if (size != 0) {
    io->ops->close (io);
    errno = size < 0 ? (int) -size : EEXIST;
    return NULL;
  }
  return io;
}

struct qcow2_io *
fileio_create_new (const char *path, const struct fileio_options *opts,
                   char **why)
{
  return fileio_open_flags (path, false, O_CREAT | O_EXCL, 0666, opts, why);
}

char *
fileio_env_identity (void *opaque, const char *path)
{
  (void) opaque;
  return realpath (path, NULL);
}

struct qcow2_io *
fileio_env_open (void *opaque, const char *path, bool readonly, char **id)
{
  struct qcow2_io *io = fileio_open_with (path, readonly, opaque, id);

  if (!io)
    return NULL;
  *id = realpath (path, NULL);
  if (!*id) {
    int e = errno;
    io->ops->close (io);
    errno = e;
    return NULL;
  }
  return io;
}
