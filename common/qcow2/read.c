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

/* What the backing file shows at guest [offset, offset+count): past
 * its end, or with none, zeros.
 */
int
read_backing (struct qcow2_image *img, uint8_t *buf, uint64_t count,
              uint64_t offset)
{
  struct qcow2_image *b = img->backing;
  uint64_t n = 0;

  if (b && offset < b->size) {
    int r;
    n = MIN (count, b->size - offset);
    r = layer_read (b, buf, n, offset);
    if (r < 0)
      return r;
  }
  memset (buf + n, 0, count - n);
  return 0;
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

/* The runs that are not data in the file: zeros, the backing file,
 * compressed clusters.  Returns the first error.
 */
static int
read_other_runs (struct qcow2_image *img, uint8_t *buf,
                 const struct qcow2_run *runs, size_t n, uint64_t offset)
{
  for (size_t i = 0; i < n; i++) {
    int r = 0;

    switch (runs[i].kind) {
    case RUN_UNALLOCATED:
      r = read_backing (img, buf, runs[i].length, offset);
      break;
    case RUN_ZERO:
      memset (buf, 0, runs[i].length);
      break;
    case RUN_DATA:
      break;
    case RUN_COMPRESSED:
      r = read_compressed (img, buf, &runs[i], offset);
      break;
    }
    if (r < 0)
      return r;
    buf += runs[i].length;
    offset += runs[i].length;
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

/* How many of the runs are data in the file. */
static size_t
read_data_runs (const struct qcow2_run *runs, size_t n)
{
  size_t data = 0;

  for (size_t i = 0; i < n; i++)
    data += runs[i].kind == RUN_DATA;
  return data;
}

/* Read n runs mapped from offset into buf, by the pool if given and
 * there is more than one piece of data to read.  Needs no lock.
 */
static int
read_runs (struct qcow2_image *img, uint8_t *buf,
           const struct qcow2_run *runs, size_t n, uint64_t offset,
           struct io_pool *pool)
{
  struct pool_piece pieces[READ_BATCH];
  struct iovec iov[READ_BATCH];
  struct pool_batch batch = { .pieces = pieces, .n = 0 };
  int r, r2;

  assert (n <= READ_BATCH);
  for (size_t i = 0, pos = 0; i < n; pos += runs[i++].length) {
    if (runs[i].kind != RUN_DATA)
      continue;
    r = cluster_check_data_offset (img, runs[i].host_offset,
                                   runs[i].length);
    if (r < 0)
      return r;
    pieces[batch.n++] = (struct pool_piece) {
      .io = img->guest_io, .buf = buf + pos, .len = runs[i].length,
      .offset = runs[i].host_offset,
    };
  }

  batch.n = pool_merge (pieces, batch.n, iov);
  if (batch.n < 2)
    pool = NULL;
  /* The pool reads the data while this thread does the rest. */
  pool_start (pool, &batch);
  r = read_other_runs (img, buf, runs, n, offset);
  pool_finish (pool, &batch);
  for (size_t i = 0; i < batch.n; i++) {
    struct pool_piece *p = &pieces[i];
    if ((r2 = p->r) < 0) {
      log_error (img, "reading %zu bytes of data at host offset %#"
                 PRIx64 ": %s", p->len, p->offset, errstr (-r2));
      return io_errno (r2);
    }
  }
  return r;
}

int
layer_read (struct qcow2_image *img, uint8_t *buf, uint64_t count,
            uint64_t offset)
{
  if (img->raw)
    return read_raw (img, buf, count, offset);

  while (count > 0) {
    struct qcow2_run runs[READ_BATCH];
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
    if (r == 0 && read_data_runs (runs, n) > 1)
      pool = pool_get (img);
    image_unlock (img);
    if (r < 0 || (r = read_runs (img, buf, runs, n, offset, pool)) < 0)
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
  ASSERT_LOCKED (img);
  if (img->raw)
    return read_raw (img, buf, count, offset);

  while (count > 0) {
    struct qcow2_run runs[READ_BATCH];
    uint64_t len = 0;
    size_t n = 0;
    int r = 0;

    while (n < READ_BATCH && len < count &&
           (r = cluster_map (img, offset + len, count - len,
                             &runs[n])) == 0)
      len += runs[n++].length;
    if (r < 0 || (r = read_runs (img, buf, runs, n, offset, NULL)) < 0)
      return r;
    buf += len;
    offset += len;
    count -= len;
  }
  return 0;
}
