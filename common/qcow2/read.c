/* SPDX-License-Identifier: BSD-3-Clause */
/* The read path: each mapped run of a request is read from where it
 * lives (data file, backing layer, compressed cluster, or zeros).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "errstr.h"
#include "internal.h"

/* A run that is not allocated reads from the backing layer, as far as
 * it goes.  Returns how many bytes of [offset, offset+len) that is.
 */
static uint64_t
read_backing_len (struct qcow2_image *img, uint64_t offset, uint64_t len)
{
  struct qcow2_image *b = img->backing;

  return b && offset < b->size ? MIN (len, b->size - offset) : 0;
}

/* [offset, offset+count) of the backing layer b, through its
 * read-ahead if it has one.
 */
static int
read_below (struct qcow2_image *b, uint8_t *buf, uint64_t count,
            uint64_t offset)
{
  return b->readahead ? readahead_read (b->readahead, buf, count, offset)
    : layer_read (b, buf, count, offset);
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

/* Returns how many of the runs are read as pieces: data in the file, and what
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

/* Returns the error of a piece that failed, logged where the layer did
 * not.
 */
static int
read_piece_error (struct qcow2_image *img, const struct pool_piece *p)
{
  if (p->fn)
    return p->r;                /* the layer below logged it */
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
