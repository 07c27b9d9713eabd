/* SPDX-License-Identifier: BSD-3-Clause */
/* fileio's bottom (see fileio.h): one transfer, a system call, or a
 * write through the calling thread's io_uring.  It calls no other file
 * of fileio.
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_LIBURING
#include <liburing.h>
#endif

#include "errstr.h"
#include "fileio-internal.h"
#include "threadobj.h"

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
static int fileio_ring_err;     /* making the key failed so */

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
  if (!fileio_ring_off)
    fileio_ring_err = pthread_key_create (&fileio_ring_key, fileio_ring_free);
}

int
fileio_ring_ready (void)
{
  pthread_once (&fileio_ring_once, fileio_ring_init);
  return fileio_ring_err;
}

/* Returns this thread's ring, made on first use, or NULL. */
static struct fileio_ring *
fileio_ring (void)
{
  struct fileio_ring *t;
  bool made;

  /* An open with O_DIRECT made the key (fileio_ring_ready). */
  if (fileio_ring_off || fileio_ring_err)
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
#else
int
fileio_ring_ready (void)
{
  return 0;
}
#endif

ssize_t
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
