/* SPDX-License-Identifier: BSD-3-Clause */
/* The read path: each mapped run of a request is read from where it
 * lives (data file, backing layer, compressed cluster, or zeros), and
 * the read-ahead of backing layers on remote storage.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"
#include "errstr.h"
#include "internal.h"
#include "monotonic.h"

/* A run that is not allocated reads from the backing layer, as far as
 * it goes: how many bytes of [offset, offset+len) that is.
 */
static uint64_t
read_backing_len (struct qcow2_image *img, uint64_t offset, uint64_t len)
{
  struct qcow2_image *b = img->backing;

  return b && offset < b->size ? MIN (len, b->size - offset) : 0;
}

/* Read-ahead of a backing layer on remote storage (storage with
 * pread_many: each request costs a round trip).  A read of the layer
 * that starts where the last one ended reads READAHEAD_WINDOW more in
 * the same request, kept in a window that the next sequential reads
 * are copied from: a guest read sequentially costs one round trip a
 * window, not one a request.  It is by guest offset, so that it also
 * works for a qcow2 layer whose clusters lie anywhere in its file.
 * Backing layers are never written, so a window never goes stale.
 *
 * It starts with the second read of a sequential run (a lone read, such
 * as the first sector's, gets what it asked for), with as much again
 * as the read (READAHEAD_MIN at least), doubled by each further read of
 * the run up to READAHEAD_WINDOW, and never more than the link was
 * measured to deliver in READAHEAD_MS: over a slow link a small read
 * does not wait for megabytes it did not ask for.
 *
 * A reader with several requests in flight (a guest's own read-ahead,
 * nbdcopy, qemu-img convert) is its own read-ahead: a read that comes
 * while another read of the layer is under way starts no window and
 * waits for no other request, but goes out at once with what it asked
 * for, all in flight together on the storage's connections.  Only a
 * read that falls in a window being filled waits for it (a reader
 * turning deep while a window fills; the window is as much again as
 * the read that started it, doubled per read of the run, so that read
 * waits for little more than its own data).  Two windows, so that one
 * stays readable while the other fills.
 *
 * Read-ahead pays for itself: over a real network every byte fetched
 * and not read costs, and a guest's boot (scattered small reads, files
 * read in short runs) ends most runs a window early.  So the bytes of
 * windows never read, less the bytes read again from a window (which
 * cost no fetch), are kept within a READAHEAD_THRIFT-th of the bytes
 * read of the layer: past that no window starts until reads have paid
 * for it, and the layer sends little more than a reader without
 * read-ahead (qemu's nbd driver) makes it send.  And a window is
 * capped by how the last ones fared: a window dropped with more than
 * half of it unread halves the cap (down to READAHEAD_MIN), one read
 * to its end doubles it, to twice that window at least (up to
 * READAHEAD_WINDOW); the cap never holds a window below the size of
 * the read that starts it.  A sequential reader reads every window to
 * its end: its windows grow much as they did without the cap.
 */
#define READAHEAD_WINDOW (4u << 20)
#define READAHEAD_MIN (64u << 10)
#define READAHEAD_MS 200
#define READAHEAD_DEEP 8
#define READAHEAD_THRIFT 128

enum window_state { WINDOW_EMPTY, WINDOW_FILLING, WINDOW_FULL };

struct readahead {
  pthread_mutex_t lock;         /* guards all below */
  pthread_cond_t filled;        /* a window stopped filling */
  uint64_t next;                /* where the last read ended */
  unsigned run;                 /* reads that continued the one before */
  unsigned busy;                /* reads of the layer under way */
  /* Reads lately that came while others were under way, up to
   * READAHEAD_DEEP, less one per read that came alone: windows are for
   * a reader at 0 only.
   */
  unsigned deep;
  uint64_t rate;                /* bytes a second the layer gave (0: ?) */
  uint64_t asked;               /* bytes read of the layer */
  /* Bytes of dropped windows never read, less those read again from a
   * window: what the read-ahead cost (negative: it saved).
   */
  int64_t cost;
  uint64_t cap;                 /* the largest window now */
  struct {
    enum window_state state;
    uint64_t start, len;
    uint64_t served;            /* bytes read from it (some twice) */
    uint8_t *buf;
  } w[2];
};

struct readahead *
readahead_new (void)
{
  struct readahead *ra = calloc (1, sizeof *ra);

  if (!ra)
    return NULL;
  pthread_mutex_init (&ra->lock, NULL);
  pthread_cond_init (&ra->filled, NULL);
  ra->next = UINT64_MAX;        /* the first read starts no run */
  ra->cap = READAHEAD_MIN;
  return ra;
}

void
readahead_free (struct readahead *ra)
{
  if (!ra)
    return;
  free (ra->w[0].buf);
  free (ra->w[1].buf);
  pthread_cond_destroy (&ra->filled);
  pthread_mutex_destroy (&ra->lock);
  free (ra);
}

/* The window holding [offset, end), or -1; with ra->lock held. */
static int
readahead_find (struct readahead *ra, uint64_t offset, uint64_t end)
{
  for (int i = 0; i < 2; i++)
    if (ra->w[i].state != WINDOW_EMPTY && offset >= ra->w[i].start &&
        end <= ra->w[i].start + ra->w[i].len)
      return i;
  return -1;
}

/* [offset, end) of the full window i into buf, and counted (ra->lock
 * held).
 */
static void
readahead_take (struct readahead *ra, int i, uint8_t *buf, uint64_t offset,
                uint64_t end)
{
  bool was_short = ra->w[i].served < ra->w[i].len;

  memcpy (buf, ra->w[i].buf + (offset - ra->w[i].start), end - offset);
  ra->w[i].served += end - offset;
  ra->asked += end - offset;
  if (was_short && ra->w[i].served >= ra->w[i].len)
    ra->cap = MIN (MAX (ra->cap, ra->w[i].len) * 2, READAHEAD_WINDOW);
}

/* Window i dropped: what it cost, and the cap it leaves (ra->lock
 * held).
 */
static void
readahead_drop (struct readahead *ra, int i)
{
  if (ra->w[i].state == WINDOW_FULL) {
    ra->cost += (int64_t) ra->w[i].len - (int64_t) ra->w[i].served;
    if (ra->w[i].served < ra->w[i].len / 2)
      ra->cap = MAX (ra->cap / 2, READAHEAD_MIN);
  }
  free (ra->w[i].buf);
  ra->w[i].buf = NULL;
  ra->w[i].state = WINDOW_EMPTY;
}

/* What the read-ahead cost so far, the unread part of the full
 * windows counted as lost (ra->lock held).
 */
static int64_t
readahead_owed (const struct readahead *ra)
{
  int64_t owed = ra->cost;

  for (int i = 0; i < 2; i++)
    if (ra->w[i].state == WINDOW_FULL)
      owed += (int64_t) ra->w[i].len - (int64_t) ra->w[i].served;
  return owed;
}

/* [offset, offset+count) copied from a window full of it, if one is. */
static bool
readahead_copy (struct readahead *ra, uint8_t *buf, uint64_t count,
                uint64_t offset)
{
  int i;

  pthread_mutex_lock (&ra->lock);
  i = readahead_find (ra, offset, offset + count);
  if (i >= 0 && ra->w[i].state == WINDOW_FULL) {
    readahead_take (ra, i, buf, offset, offset + count);
    if (offset == ra->next)
      ra->run++;
    ra->next = MAX (ra->next, offset + count);
  }
  else
    i = -1;
  pthread_mutex_unlock (&ra->lock);
  return i >= 0;
}

/* Reads up to end, count bytes in all, were made without the
 * read-ahead.
 */
static void
readahead_note (struct readahead *ra, uint64_t end, uint64_t count)
{
  pthread_mutex_lock (&ra->lock);
  ra->next = end;
  ra->asked += count;
  pthread_mutex_unlock (&ra->lock);
}

static uint64_t
readahead_now_us (void)
{
  return monotonic_ns () / 1000;
}

/* How much to read after a read of count bytes (ra->lock held). */
static uint64_t
readahead_extra (const struct readahead *ra, uint64_t count)
{
  uint64_t w;

  if (ra->run == 0 ||
      readahead_owed (ra) > (int64_t) (ra->asked / READAHEAD_THRIFT))
    return 0;
  w = MIN (count, READAHEAD_WINDOW);
  w = MAX (w, READAHEAD_MIN) << MIN (ra->run - 1, 8u);
  w = MIN (w, MIN (MAX (ra->cap, count), READAHEAD_WINDOW));
  if (ra->rate)
    w = MIN (w, ra->rate / (1000 / READAHEAD_MS));
  /* Ending where a read of the run will: one that straddled the end
   * would fetch the part it shares with the window again.
   */
  return w - w % (count <= w ? count : READAHEAD_MIN);
}

/* Read len bytes at offset of b, and learn the link's rate from it:
 * what it delivers (latency included) averaged with what it did.
 */
static int
readahead_timed (struct qcow2_image *b, uint8_t *buf, uint64_t len,
                 uint64_t offset)
{
  struct readahead *ra = b->readahead;
  uint64_t t = readahead_now_us (), rate;
  int r = layer_read (b, buf, len, offset);

  t = readahead_now_us () - t;
  if (r == 0) {
    rate = len * 1000000 / MAX (t, 1);
    pthread_mutex_lock (&ra->lock);
    ra->rate = ra->rate ? ra->rate / 2 + rate / 2 : rate;
    pthread_mutex_unlock (&ra->lock);
  }
  return r;
}

/* Read [offset, offset+count) of b directly (a read that starts no
 * window), counted in ra->busy (ra->lock held on entry and return).
 */
static int
readahead_direct (struct qcow2_image *b, uint8_t *buf, uint64_t count,
                  uint64_t offset)
{
  struct readahead *ra = b->readahead;
  int r;

  ra->busy++;
  pthread_mutex_unlock (&ra->lock);
  r = readahead_timed (b, buf, count, offset);
  pthread_mutex_lock (&ra->lock);
  assert (ra->busy > 0);
  ra->busy--;
  return r;
}

static int
readahead_read (struct qcow2_image *b, uint8_t *buf, uint64_t count,
                uint64_t offset)
{
  struct readahead *ra = b->readahead;
  uint64_t end = offset + count, len, extra, head;
  uint8_t *wbuf;
  int i, r;

  pthread_mutex_lock (&ra->lock);
  if ((i = readahead_find (ra, offset, end)) >= 0 &&
      ra->w[i].state == WINDOW_FILLING) {
    ra->deep = MIN (ra->deep + 1, READAHEAD_DEEP);
    while ((i = readahead_find (ra, offset, end)) >= 0 &&
           ra->w[i].state == WINDOW_FILLING)
      pthread_cond_wait (&ra->filled, &ra->lock);
  }
  if (i >= 0) {
    readahead_take (ra, i, buf, offset, end);
    ra->next = MAX (ra->next, end);
    pthread_mutex_unlock (&ra->lock);
    return 0;
  }
  /* A read that starts in a full window and goes past it (a run whose
   * reads changed size) takes what the window has, and fetches only the
   * rest, which continues the run.
   */
  if ((i = readahead_find (ra, offset, offset + 1)) >= 0 &&
      ra->w[i].state == WINDOW_FULL) {
    head = ra->w[i].start + ra->w[i].len - offset;
    readahead_take (ra, i, buf, offset, offset + head);
    ra->next = MAX (ra->next, offset + head);
    buf += head;
    offset += head;
    count -= head;
  }
  ra->asked += count;
  /* A deep reader: what it asks for now; its run starts again once it
   * has read one request at a time for a while.
   */
  if (ra->busy > 0 || ra->deep > 0) {
    ra->deep = ra->busy > 0 ? MIN (ra->deep + 1, READAHEAD_DEEP)
               : ra->deep - 1;
    ra->run = 0;
    ra->next = MAX (ra->next, end);
    r = readahead_direct (b, buf, count, offset);
    pthread_mutex_unlock (&ra->lock);
    return r;
  }
  ra->run = offset == ra->next ? ra->run + 1 : 0;
  ra->next = end;
  extra = readahead_extra (ra, count);
  /* A window to fill: not the one filling, nor a request as large. */
  i = ra->w[0].state == WINDOW_FILLING ? 1
      : ra->w[1].state == WINDOW_FILLING ? 0
      : ra->w[0].start > ra->w[1].start;
  len = MIN (end + extra, b->size) - offset;
  wbuf = len > count && count < READAHEAD_WINDOW &&
         ra->w[i].state != WINDOW_FILLING ? malloc (len) : NULL;
  if (!wbuf) {
    r = readahead_direct (b, buf, count, offset);
    pthread_mutex_unlock (&ra->lock);
    return r;
  }
  readahead_drop (ra, i);
  ra->w[i].buf = wbuf;
  ra->w[i].start = offset;
  ra->w[i].len = len;
  ra->w[i].served = count;
  ra->w[i].state = WINDOW_FILLING;
  ra->busy++;
  pthread_mutex_unlock (&ra->lock);

  r = readahead_timed (b, wbuf, len, offset);
  if (r == 0)
    memcpy (buf, wbuf, count);

  pthread_mutex_lock (&ra->lock);
  assert (ra->busy > 0 && ra->w[i].state == WINDOW_FILLING);
  ra->busy--;
  ra->w[i].state = r == 0 ? WINDOW_FULL : WINDOW_EMPTY;
  pthread_cond_broadcast (&ra->filled);
  pthread_mutex_unlock (&ra->lock);
  return r;
}

/* [offset, offset+count) of the backing layer b, through its
 * read-ahead if it has one.
 */
static int
read_below (struct qcow2_image *b, uint8_t *buf, uint64_t count,
            uint64_t offset)
{
  return (b->readahead ? readahead_read : layer_read) (b, buf, count, offset);
}

/* What the backing file shows at guest [offset, offset+count): past
 * its end, or with none, zeros.
 */
int
read_backing (struct qcow2_image *img, uint8_t *buf, uint64_t count,
              uint64_t offset)
{
  uint64_t n = read_backing_len (img, offset, count);
  int r;

  if (n > 0 && (r = read_below (img->backing, buf, n, offset)) < 0)
    return r;
  memset (buf + n, 0, count - n);
  return 0;
}

/* A piece read from a backing layer (arg). */
static int
read_layer_piece (struct pool_piece *piece)
{
  return read_below (piece->arg, piece->buf, piece->len, piece->offset);
}

static int
read_compressed (struct qcow2_image *img, uint8_t *buf, const
                 struct qcow2_run *run, uint64_t offset)
{
  return compress_read (img, run->comp_offset, run->comp_size,
                        offset & (img->geo.cluster_size - 1), run->length,
                        buf);
}

/* Runs mapped under one hold of the lock and read as one batch. */
#define READ_BATCH 32

/* The runs that are not read as pieces: zeros (past the backing
 * layer's end too), compressed clusters.  Returns the first error.
 */
static int
read_other_runs (struct qcow2_image *img, uint8_t *buf,
                 const struct qcow2_run *runs, size_t n, uint64_t offset)
{
  for (size_t i = 0; i < n; i++) {
    uint64_t len = runs[i].length, b;
    int r = 0;

    switch (runs[i].kind) {
    case RUN_UNALLOCATED:
      b = read_backing_len (img, offset, len);
      memset (buf + b, 0, len - b);
      break;
    case RUN_ZERO:
      memset (buf, 0, len);
      break;
    case RUN_DATA:
      break;
    case RUN_COMPRESSED:
      r = read_compressed (img, buf, &runs[i], offset);
      break;
    }
    if (r < 0)
      return r;
    buf += len;
    offset += len;
  }
  return 0;
}

/* A raw layer: no metadata, no lock. */
static int
read_raw (struct qcow2_image *img, uint8_t *buf, uint64_t count,
          uint64_t offset)
{
  int r = img->io->ops->pread (img->io, buf, count, offset);

  if (r < 0) {
    log_error (img, "reading %" PRIu64 " bytes at %#" PRIx64 ": %s",
               count, offset, errstr (-r));
    return io_errno (r);
  }
  return 0;
}

/* How many of the runs are read as pieces: data in the file, and what
 * the backing layer holds.
 */
static size_t
read_pieces (const struct qcow2_run *runs, size_t n)
{
  size_t pieces = 0;

  for (size_t i = 0; i < n; i++)
    pieces += runs[i].kind == RUN_DATA || runs[i].kind == RUN_UNALLOCATED;
  return pieces;
}

/* The pieces of runs[0, n) (at guest offset, into buf) read from
 * storage: data in the file, into data[] (*nd), and what the backing
 * layer holds, into below[] (*nb): a raw layer's file, or the layer.
 */
static void
read_plan (struct qcow2_image *img, uint8_t *buf, const struct qcow2_run *runs,
           size_t n, uint64_t offset, struct pool_piece *data, size_t *nd,
           struct pool_piece *below, size_t *nb)
{
  struct qcow2_image *b = img->backing;

  *nd = *nb = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t len = runs[i].length, blen;

    /* Data past the end of a file cut short reads as zeros, as in
     * QEMU (storage reads so): no error, and nothing written.
     */
    if (runs[i].kind == RUN_DATA)
      data[(*nd)++] = (struct pool_piece) {
        .io = img->guest_io, .buf = buf, .len = len,
        .offset = runs[i].host_offset,
      };
    else if (runs[i].kind == RUN_UNALLOCATED &&
             (blen = read_backing_len (img, offset, len)) > 0 &&
             !(b->raw && b->readahead &&
               readahead_copy (b->readahead, buf, blen, offset)))
      below[(*nb)++] = b->raw
        ? (struct pool_piece) { .io = b->io, .buf = buf, .len = blen,
                                .offset = offset, .arg = b }
        : (struct pool_piece) { .fn = read_layer_piece, .arg = b,
                                .buf = buf, .len = blen, .offset = offset };
    buf += len;
    offset += len;
  }
  /* Of a raw layer that reads ahead, one piece goes through its
   * read-ahead; several (a fragmented overlay) are read at once.
   */
  if (*nb == 1 && b->raw && b->readahead)
    below[0].fn = read_layer_piece;
  else if (*nb > 1 && b->raw && b->readahead) {
    uint64_t sum = 0;
    for (size_t i = 0; i < *nb; i++)
      sum += below[i].len;
    readahead_note (b->readahead, below[*nb - 1].offset + below[*nb - 1].len,
                    sum);
  }
}

/* The error of a piece that failed, said where the layer did not. */
static int
read_piece_error (struct qcow2_image *img, const struct pool_piece *p)
{
  if (p->fn)
    return p->r;                /* the layer below said it */
  if (p->arg)
    log_error (p->arg, "reading %zu bytes at %#" PRIx64 ": %s", p->len,
               p->offset, errstr (-p->r));
  else
    log_error (img, "reading %zu bytes of data at host offset %#" PRIx64
               ": %s", p->len, p->offset, errstr (-p->r));
  return io_errno (p->r);
}

/* What a batch needs (its runs, their pieces and the pieces' merged
 * and grouped forms), about 12 KiB: on the heap, so that a read
 * through a deep backing chain (a layer_read per layer) takes little
 * stack per layer.
 */
struct read_batch {
  struct qcow2_run runs[READ_BATCH];
  struct pool_piece pieces[READ_BATCH], below[READ_BATCH];
  struct iovec iov[READ_BATCH];
  struct qcow2_io_read reads[2 * READ_BATCH];
};

/* Read the n runs of rb mapped from offset into buf, by the pool if
 * given and there is more than one piece to read.  Needs no lock.
 */
static int
read_runs (struct qcow2_image *img, uint8_t *buf, struct read_batch *rb,
           size_t n, uint64_t offset, struct io_pool *pool)
{
  const struct qcow2_run *runs = rb->runs;
  struct pool_piece *pieces = rb->pieces, *below = rb->below;
  struct iovec *iov = rb->iov;
  struct qcow2_io_read *reads = rb->reads;
  struct pool_batch batch = { .pieces = pieces, .n = 0 };
  size_t nd, nb;
  int r;

  assert (n <= READ_BATCH);
  read_plan (img, buf, runs, n, offset, pieces, &nd, below, &nb);
  /* Pieces of one file next to each other there become one request,
   * those of remote storage one pread_many; a raw backing file's too.
   */
  nd = pool_group (pieces, pool_merge (pieces, nd, iov), reads);
  if (nb > 0 && !below[0].fn && img->backing->io->ops->pread_many)
    nb = pool_group (below, nb, reads + READ_BATCH);
  memcpy (pieces + nd, below, nb * sizeof *below);
  batch.n = nd + nb;
  if (batch.n < 2)
    pool = NULL;
  /* The pool reads the pieces while this thread does the rest. */
  pool_start (pool, &batch);
  r = read_other_runs (img, buf, runs, n, offset);
  pool_finish (pool, &batch);
  for (size_t i = 0; i < batch.n; i++)
    if (pieces[i].r < 0)
      return read_piece_error (img, &pieces[i]);
  return r;
}

int
layer_read (struct qcow2_image *img, uint8_t *buf, uint64_t count,
            uint64_t offset)
{
  CLEANUP_FREE struct read_batch *rb = NULL;

  if (img->raw)
    return read_raw (img, buf, count, offset);
  if (!(rb = malloc (sizeof *rb)))
    return -ENOMEM;

  while (count > 0) {
    struct qcow2_run *runs = rb->runs;
    struct io_pool *pool = NULL;
    uint64_t len = 0;
    size_t n = 0;
    int r = 0;

    image_lock (img);
    /* Runs already mapped stay valid if the lock is released while
     * mapping the next: what a concurrent write changes, a read that
     * overlaps it may see either way.
     */
    while (n < READ_BATCH && len < count &&
           (r = cluster_map_may_unlock (img, offset + len, count - len,
                                        &runs[n])) == 0)
      len += runs[n++].length;
    if (r == 0 && read_pieces (runs, n) > 1)
      pool = pool_get (img);
    image_unlock (img);
    if (r < 0 || (r = read_runs (img, buf, rb, n, offset, pool)) < 0)
      return r;
    buf += len;
    offset += len;
    count -= len;
  }
  return 0;
}

/* What the guest sees now, for copy-on-write: called with img->lock
 * held (backing layers take their own).  The pieces are read in turn:
 * the lock is not held while waiting for other threads.
 */
int
read_locked (struct qcow2_image *img, uint8_t *buf, uint64_t count,
             uint64_t offset)
{
  CLEANUP_FREE struct read_batch *rb = NULL;

  ASSERT_LOCKED (img);
  if (img->raw)
    return read_raw (img, buf, count, offset);
  if (!(rb = malloc (sizeof *rb)))
    return -ENOMEM;

  while (count > 0) {
    struct qcow2_run *runs = rb->runs;
    uint64_t len = 0;
    size_t n = 0;
    int r = 0;

    while (n < READ_BATCH && len < count &&
           (r = cluster_map (img, offset + len, count - len,
                             &runs[n])) == 0)
      len += runs[n++].length;
    if (r < 0 || (r = read_runs (img, buf, rb, n, offset, NULL)) < 0)
      return r;
    buf += len;
    offset += len;
    count -= len;
  }
  return 0;
}
