/* SPDX-License-Identifier: BSD-3-Clause */
/* A small pool of threads reading or writing the pieces of one request
 * at once.
 *
 * A guest request that maps to several host runs (a fragmented image)
 * would otherwise read or write them one after the other.  The
 * requesting thread queues its pieces as a batch, does its other work,
 * then takes the pieces no worker has taken yet and waits for the rest:
 * when every worker is busy it does everything itself, no slower than
 * before.
 *
 * Threads start at the first batch, not at open: a server may fork
 * after opening the image, and threads do not survive a fork.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "errstr.h"
#include "internal.h"

/* Order: p->lock is taken with no image's lock held (internal.h). */
struct io_pool {
  struct lock lock;             /* guards all below but threads */
  pthread_cond_t work;          /* a batch was queued, or stop */
  struct pool_batch *head, *tail;       /* batches with pieces left */
  bool stop;
  unsigned nthreads;
  pthread_t threads[];
};

static void
pool_unqueue (struct io_pool *p, struct pool_batch *b)
  TSA_REQUIRES (p->lock)
{
  if (b->prev)
    b->prev->next = b->next;
  else
    p->head = b->next;
  if (b->next)
    b->next->prev = b->prev;
  else
    p->tail = b->prev;
}

/* Take the next piece of b. */
static struct pool_piece *
pool_take (struct io_pool *p, struct pool_batch *b)
  TSA_REQUIRES (p->lock)
{
  struct pool_piece *piece;

  assert (b->taken < b->n);
  piece = &b->pieces[b->taken++];

  if (b->taken == b->n)
    pool_unqueue (p, b);
  return piece;
}

static void
pool_do_piece (struct pool_piece *piece)
{
  struct qcow2_io *io = piece->io;

  if (piece->fn)
    piece->r = piece->fn (piece);
  else if (piece->nreads) {
    io->ops->pread_many (io, piece->reads, piece->nreads);
    piece->r = 0;
    for (size_t i = 0; i < piece->nreads && !piece->r; i++)
      if ((piece->r = piece->reads[i].r) < 0) {
        piece->offset = piece->reads[i].offset;
        piece->len = piece->reads[i].count;
      }
  }
  else if (piece->iovcnt && piece->write)
    piece->r = io->ops->pwritev (io, piece->iov, piece->iovcnt,
                                 piece->offset);
  else if (piece->iovcnt)
    piece->r = io->ops->preadv (io, piece->iov, piece->iovcnt,
                                piece->offset);
  else if (piece->write)
    piece->r = io->ops->pwrite (io, piece->buf, piece->len, piece->offset);
  else
    piece->r = io->ops->pread (io, piece->buf, piece->len, piece->offset);
}

/* Pieces (at most QCOW2_IOV_MAX, all of one io) that follow each
 * other in the file, though not in the request (a guest range written
 * in another order), become one vectored request: one large read or
 * write instead of several small ones, which matters with O_DIRECT.
 * Rewrites pieces[] and returns their new count; iov[] (room for n)
 * holds the merged pieces' buffers.
 */
size_t
pool_merge (struct pool_piece *pieces, size_t n, struct iovec *iov)
{
  size_t m = 0, niov = 0;

  if (n < 2 || n > QCOW2_IOV_MAX || !pieces[0].io->ops->preadv ||
      pieces[0].io->ops->pread_many)
    return n;
  /* Sorted by file offset in place, not into a copy: this runs on every
   * one of nbdkit's many worker threads, where a large frame costs its
   * pages in each.  n is small.
   */
  for (size_t i = 1; i < n; i++) {
    struct pool_piece p = pieces[i];
    size_t j = i;
    for (; j > 0 && pieces[j - 1].offset > p.offset; j--)
      pieces[j] = pieces[j - 1];
    pieces[j] = p;
  }
  for (size_t i = 0, j; i < n; i = j) {
    struct pool_piece first = pieces[i];

    for (j = i + 1; j < n &&
           pieces[j - 1].offset + pieces[j - 1].len == pieces[j].offset; j++)
      ;
    if (j - i > 1) {
      first.iov = &iov[niov];
      first.iovcnt = j - i;
      first.len = 0;
      for (size_t k = i; k < j; k++) {
        iov[niov++] = (struct iovec) { pieces[k].buf, pieces[k].len };
        first.len += pieces[k].len;
      }
    }
    pieces[m++] = first;        /* m <= i: nothing still to read */
  }
  assert (m >= 1 && m <= n && niov <= n);
  return m;
}

/* Reads (all of one io) from storage where each costs a round trip
 * (its pread_many) become one piece that has them all in flight at
 * once, rather than one thread for each.  Rewrites pieces[] and
 * returns their new count; reads[] (room for n) holds the reads.
 */
size_t
pool_group (struct pool_piece *pieces, size_t n, struct qcow2_io_read *reads)
{
  if (n < 2 || !pieces[0].io->ops->pread_many)
    return n;
  for (size_t i = 0; i < n; i++) {
    assert (!pieces[i].write && !pieces[i].fn && pieces[i].io == pieces[0].io);
    reads[i] = (struct qcow2_io_read) { .buf = pieces[i].buf,
                                        .count = pieces[i].len,
                                        .offset = pieces[i].offset };
  }
  pieces[0].reads = reads;
  pieces[0].nreads = n;
  return 1;
}

/* Do a piece, letting p->lock go meanwhile. */
static void
pool_run_piece (struct io_pool *p, struct pool_batch *b,
                struct pool_piece *piece)
  TSA_REQUIRES (p->lock)
{
  lock_release (&p->lock);
  pool_do_piece (piece);
  lock_acquire (&p->lock);
  /* The requester may return as soon as done reaches n: b is not
   * touched after that.
   */
  assert (b->done < b->n);
  if (++b->done == b->n)
    pthread_cond_signal (&b->finished);
}

static void *
pool_worker (void *arg)
{
  struct io_pool *p = arg;

  lock_acquire (&p->lock);
  for (;;) {
    while (!p->head && !p->stop)
      lock_wait (&p->lock, &p->work);
    if (p->stop)
      break;
    struct pool_batch *b = p->head;
    pool_run_piece (p, b, pool_take (p, b));
  }
  lock_release (&p->lock);
  return NULL;
}

static struct io_pool *
pool_create (unsigned nthreads)
{
  struct io_pool *p = calloc (1, sizeof *p + nthreads * sizeof (pthread_t));
  sigset_t all, old;
  int e = 0;

  if (!p)
    return NULL;
  lock_init (&p->lock);
  lock_cond_init (&p->work);
  /* Signals are for the server's own threads. */
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  for (; p->nthreads < nthreads; p->nthreads++) {
    e = pthread_create (&p->threads[p->nthreads], NULL, pool_worker, p);
    if (e)
      break;
  }
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (e) {
    pool_destroy (p);
    errno = e;
    return NULL;
  }
  return p;
}

void
pool_destroy (struct io_pool *p)
  TSA_EXCLUDES (p->lock)
{
  if (!p)
    return;
  lock_acquire (&p->lock);
  p->stop = true;
  pthread_cond_broadcast (&p->work);
  lock_release (&p->lock);
  for (unsigned i = 0; i < p->nthreads; i++)
    pthread_join (p->threads[i], NULL);
  pthread_cond_destroy (&p->work);
  lock_destroy (&p->lock);
  free (p);
}

/* Returns the pool, started by the first request that has several runs; NULL
 * without one.  Called with img->lock held.
 */
struct io_pool *
pool_get (struct qcow2_image *img)
{
  if (!img->pool && img->io_threads > 0) {
    img->pool = pool_create (img->io_threads);
    if (!img->pool) {
      log_debug (img, "cannot start %u I/O threads, doing runs in "
                 "turn: %s", img->io_threads, errstr (errno));
      img->io_threads = 0;
    }
  }
  return img->pool;
}

void
pool_start (struct io_pool *p, struct pool_batch *b)
  TSA_EXCLUDES (p->lock)
{
  if (!p)
    return;
  b->taken = b->done = 0;
  b->next = NULL;
  lock_cond_init (&b->finished);
  lock_acquire (&p->lock);
  b->prev = p->tail;
  if (p->tail)
    p->tail->next = b;
  else
    p->head = b;
  p->tail = b;
  /* The requester reads at least one piece itself. */
  for (size_t i = 1; i < b->n && i <= p->nthreads; i++)
    pthread_cond_signal (&p->work);
  lock_release (&p->lock);
}

void
pool_finish (struct io_pool *p, struct pool_batch *b)
  TSA_EXCLUDES (p->lock)
{
  if (!p) {
    for (size_t i = 0; i < b->n; i++)
      pool_do_piece (&b->pieces[i]);
    return;
  }
  lock_acquire (&p->lock);
  while (b->taken < b->n)
    pool_run_piece (p, b, pool_take (p, b));
  while (b->done < b->n)
    lock_wait (&p->lock, &b->finished);
  lock_release (&p->lock);
  pthread_cond_destroy (&b->finished);
}
