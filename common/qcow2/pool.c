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

struct io_pool {
  pthread_mutex_t lock;
  pthread_cond_t work;          /* a batch was queued, or stop */
  struct pool_batch *head, *tail;       /* batches with pieces left */
  bool stop;
  unsigned nthreads;
  pthread_t threads[];
};

static void
pool_unqueue (struct io_pool *p, struct pool_batch *b)
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

/* Take the next piece of b, with p->lock held. */
static struct pool_piece *
pool_take (struct io_pool *p, struct pool_batch *b)
{
  struct pool_piece *piece = &b->pieces[b->taken++];

  if (b->taken == b->n)
    pool_unqueue (p, b);
  return piece;
}

void
pool_do_piece (struct pool_piece *piece)
{
  if (piece->write)
    piece->r = piece->io->ops->pwrite (piece->io, piece->buf, piece->len,
                                       piece->offset);
  else
    piece->r = piece->io->ops->pread (piece->io, piece->buf, piece->len,
                                      piece->offset);
}

/* Do a piece, with p->lock held; returns with it held. */
static void
pool_run_piece (struct io_pool *p, struct pool_batch *b,
                struct pool_piece *piece)
{
  pthread_mutex_unlock (&p->lock);
  pool_do_piece (piece);
  pthread_mutex_lock (&p->lock);
  /* The requester may return as soon as done reaches n: b is not
   * touched after that.
   */
  if (++b->done == b->n)
    pthread_cond_signal (&b->finished);
}

static void *
pool_worker (void *arg)
{
  struct io_pool *p = arg;

  pthread_mutex_lock (&p->lock);
  for (;;) {
    while (!p->head && !p->stop)
      pthread_cond_wait (&p->work, &p->lock);
    if (p->stop)
      break;
    struct pool_batch *b = p->head;
    pool_run_piece (p, b, pool_take (p, b));
  }
  pthread_mutex_unlock (&p->lock);
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
  pthread_mutex_init (&p->lock, NULL);
  pthread_cond_init (&p->work, NULL);
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
{
  if (!p)
    return;
  pthread_mutex_lock (&p->lock);
  p->stop = true;
  pthread_cond_broadcast (&p->work);
  pthread_mutex_unlock (&p->lock);
  for (unsigned i = 0; i < p->nthreads; i++)
    pthread_join (p->threads[i], NULL);
  pthread_cond_destroy (&p->work);
  pthread_mutex_destroy (&p->lock);
  free (p);
}

/* The pool, started by the first request that has several runs; NULL
 * without one.  Called with img->lock held.
 */
struct io_pool *
pool_get (struct qcow2_image *img)
{
  if (!img->pool && img->io_threads > 0) {
    img->pool = pool_create (img->io_threads);
    if (!img->pool) {
      qcow2_dbg (img, "cannot start %u I/O threads, doing runs in "
                 "turn: %s", img->io_threads, errstr (errno));
      img->io_threads = 0;
    }
  }
  return img->pool;
}

void
pool_start (struct io_pool *p, struct pool_batch *b)
{
  b->taken = b->done = 0;
  b->next = NULL;
  pthread_cond_init (&b->finished, NULL);
  pthread_mutex_lock (&p->lock);
  b->prev = p->tail;
  if (p->tail)
    p->tail->next = b;
  else
    p->head = b;
  p->tail = b;
  /* The requester reads at least one piece itself. */
  for (size_t i = 1; i < b->n && i <= p->nthreads; i++)
    pthread_cond_signal (&p->work);
  pthread_mutex_unlock (&p->lock);
}

void
pool_finish (struct io_pool *p, struct pool_batch *b)
{
  pthread_mutex_lock (&p->lock);
  while (b->taken < b->n)
    pool_run_piece (p, b, pool_take (p, b));
  while (b->done < b->n)
    pthread_cond_wait (&b->finished, &p->lock);
  pthread_mutex_unlock (&p->lock);
  pthread_cond_destroy (&b->finished);
}
