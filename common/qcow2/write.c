/* SPDX-License-Identifier: BSD-3-Clause */
/* The write path: guest writes (zeroes and trims are in zero.c), the
 * loop every write, zero and trim request goes through, and
 * preallocation.
 *
 * A write into a cluster that is allocated, owned by this image alone
 * (COPIED) and not a zero cluster goes to its host offset without
 * holding the image lock.  Any other write allocates (write-alloc.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

/* Wait, with img->lock released meanwhile, until no allocating write
 * works on [start, end).
 */
static void
write_inflight_wait (struct qcow2_image *img, uint64_t start, uint64_t end)
  TSA_REQUIRES (img->lock)
{
  ASSERT_LOCKED (img);
  while (write_inflight_overlaps (img, start, end))
    image_wait (img, &img->inflight_done);
}

/* Where an in-place write of [offset, offset+len) goes: returns 1 and
 * sets *host (0 is a valid offset in an external data file), or 0 if
 * the write must allocate.  The caller writes there.
 */
int
write_in_place_target (struct qcow2_image *img, uint64_t offset,
                       uint64_t len, uint64_t *host)
{
  uint64_t in = offset & (img->geo.cluster_size - 1);
  struct l2_state s;
  uint8_t *slice;
  uint64_t idx;
  int r;

  if ((r = cluster_l2_slice (img, offset, &slice, &idx)) < 0)
    return r;
  if (!slice)
    return 0;
  l2_get (img, slice, idx, &s);
  if (!s.normal || !s.copied || s.zero_flag)
    return 0;
  if (img->geo.extended_l2) {
    uint64_t mask = write_unit_mask (img, in, in + len);
    if ((s.bitmap & mask) != mask || ((s.bitmap >> 32) & mask))
      return 0;
  }
  if ((r = write_alloc_check_host (img, s.host, offset)) < 0)
    return r;
  *host = s.host + in;
  flush_mark_changed (img);     /* the data needs the next flush */
  return 1;
}

int
write_check (struct qcow2_image *img, uint64_t count, uint64_t offset)
{
  if (!qcow2_can_write (img))
    return qcow2_check_writable (img) ? : -EROFS;
  if (range_exceeds (offset, count, img->size)) {
    log_error (img, "write of %" PRIu64 " bytes at %" PRIu64 " is beyond "
               "the virtual size %" PRIu64, count, offset, img->size);
    return -ENOSPC;
  }
  return 0;
}

/* In-place host runs mapped under one hold of the lock and written as
 * one batch: room for them, on the heap, since this runs on each of
 * nbdkit's many worker threads, where a large frame would cost its
 * pages in every one.
 */
#define WRITE_BATCH 32
struct write_batch_room {
  struct pool_piece pieces[WRITE_BATCH];
  struct iovec iov[WRITE_BATCH];
};

/* The in-place runs at the start of [offset, offset+count): as far as
 * the clusters are written in place, in at most cap host runs, each
 * checked against the overlap map, then merged where they follow each
 * other in the file (iov: room for cap).  *len is what
 * they cover, 0 if the first cluster must allocate.  Called with the
 * lock held.
 */
static int
write_in_place_runs (struct qcow2_image *img, const uint8_t *data,
                     uint64_t offset, uint64_t count,
                     struct pool_piece *pieces, struct iovec *iov,
                     size_t cap, size_t *n, uint64_t *len)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size;
  int r;

  *n = 0;
  *len = 0;
  while (*len < count) {
    uint64_t more = MIN (count - *len, cs - ((offset + *len) & (cs - 1)));
    struct pool_piece *last = *n ? &pieces[*n - 1] : NULL;
    uint64_t host;

    if (write_inflight_overlaps (img, offset + *len, offset + *len + more))
      break;                    /* claimed: see struct write_inflight */
    if ((r = write_in_place_target (img, offset + *len, more, &host)) < 0)
      return r;
    if (r == 0)
      break;
    if (last && last->offset + last->len == host)
      last->len += more;
    else if (*n == cap)
      break;
    else
      pieces[(*n)++] = (struct pool_piece) {
        .io = img->guest_io, .buf = (void *) (data + *len), .len = more,
        .offset = host, .write = true,
      };
    *len += more;
  }
  assert (*n <= cap && *len <= count);
  for (size_t i = 0; i < *n; i++)
    if ((r = io_check_data (img, pieces[i].len, pieces[i].offset)) < 0)
      return r;
  *n = pool_merge (pieces, *n, iov);
  return 0;
}

/* Write checked in-place runs, with the lock released: at once by the
 * pool if given.
 */
static int
write_pieces (struct qcow2_image *img, struct io_pool *pool,
              struct pool_batch *batch)
{
  pool_start (pool, batch);
  pool_finish (pool, batch);
  for (size_t i = 0; i < batch->n; i++) {
    struct pool_piece *p = &batch->pieces[i];
    if (p->r < 0)
      return io_data_error (img, p->len, p->offset, p->r);
  }
  return 0;
}

/* The loop every write, zero and trim request goes through: piece by
 * piece, each under img->lock once the allocating writes in flight
 * that it overlaps are done and the image is ready to be written.
 */
int
write_request (struct qcow2_image *img, const struct write_request *req)
{
  uint64_t offset = req->offset, count = req->count;
  int r = 0;

  image_data_rdlock (img);
  if (req->record)
    bitmap_record (img, offset, count);
  while (count > 0 && r == 0) {
    uint64_t n = req->piece_len (img, offset, count);

    image_lock (img);
    write_inflight_wait (img, offset, offset + n);
    r = state_begin_write (img);
    if (r == 0) {
      r = req->piece_unlocks (img, req, offset, count, &n);
      image_released (img);
    }
    else
      image_unlock (img);
    /* Every piece moves on, and stays within the request. */
    assert (r < 0 || (n > 0 && n <= count));
    offset += n;
    count -= n;
  }
  /* Done (or failed part-way, changing some of it): a commit job copies
   * it again.
   */
  commit_note_change (img, req->offset, req->count);
  image_data_unlock (img);
  if (r == 0 && req->fua)
    r = qcow2_flush (img);
  return r;
}

static uint64_t
write_piece_len (struct qcow2_image *img, uint64_t offset, uint64_t count)
{
  uint64_t cs = img->geo.cluster_size;

  return MIN (count, cs - (offset & (cs - 1)));
}

/* Guest data: the clusters written in place, as many as are in a row,
 * with the lock released for the I/O; else one cluster, or a run of
 * whole clusters, allocated.
 */
static int
write_piece_unlocks (struct qcow2_image *img,
                     const struct write_request *req,
                     uint64_t offset, uint64_t count, uint64_t *n)
  TSA_RELEASE (img->lock)
{
  const uint8_t *p = (const uint8_t *) req->opaque + (offset - req->offset);
  struct pool_piece one;
  struct iovec one_iov;
  CLEANUP_FREE struct write_batch_room *room = NULL;
  struct pool_batch batch = { .pieces = &one };
  struct iovec *iov = &one_iov;
  struct io_pool *pool = NULL;
  uint64_t cs = img->geo.cluster_size, in_place = 0, done = 0;
  bool whole = (offset & (cs - 1)) == 0 && count >= cs;
  size_t cap = 1;
  int r;

  /* Within one cluster there is one run.  Without room for more, the
   * runs go one at a time: slower, still right.
   */
  if (count > cs - (offset & (cs - 1)) &&
      (room = malloc (sizeof *room)) != NULL) {
    batch.pieces = room->pieces;
    iov = room->iov;
    cap = WRITE_BATCH;
  }
  r = write_in_place_runs (img, p, offset, count, batch.pieces, iov, cap,
                           &batch.n, &in_place);
  if (r == 0 && in_place > 0) {
    /* Releases hold data_lock exclusively: the runs stay ours. */
    if (batch.n > 1 && !img->guest_io->serial_writes)
      pool = pool_get (img);
    image_unlock (img);
    *n = in_place;
    return write_pieces (img, pool, &batch);
  }
  if (r == 0 && img->compress && whole) {
    r = write_alloc_compressed_may_unlock (img, p, offset, &done);
    /* Cluster by cluster, as qemu-img convert -c: the next cluster of
     * the request may compress though this one did not.
     */
    count = cs;
  }
  if (r == 0 && !done && whole)
    r = write_alloc_run_may_unlock (img, p, offset, count, &done);
  if (done)
    *n = done;
  else if (r == 0)
    r = write_allocating_may_unlock (img, p, offset, *n);
  image_unlock (img);
  return r;
}

int
qcow2_write (struct qcow2_image *img, const void *buf, uint64_t count,
             uint64_t offset, bool fua)
{
  const struct write_request req = {
    .offset = offset, .count = count, .record = true, .fua = fua,
    .piece_len = write_piece_len, .piece_unlocks = write_piece_unlocks,
    .opaque = buf,
  };
  int r;

  if ((r = write_check (img, count, offset)) < 0 ||
      (r = write_request (img, &req)) < 0)
    return r;
  commit_help (img, offset, count);
  return 0;
}

/* Give [*start, *end) of io space of its own (falloc), and empty it. */
static int
write_falloc (struct qcow2_image *img, struct qcow2_io *io, uint64_t *start,
              uint64_t *end)
{
  int r = *end > *start ? io->ops->preallocate (io, *start, *end - *start)
                        : 0;

  if (r < 0)
    log_error (img, "preallocation=falloc of %" PRIu64 " bytes at %#" PRIx64
               ": %s", *end - *start, *start, errstr (-r));
  *start = *end = 0;
  return r;
}

/* Make io end at end, as a hole (as QEMU's truncate leaves it): a byte
 * written there, then its cluster punched.
 */
static int
write_extend_hole (struct qcow2_image *img, struct qcow2_io *io, uint64_t end)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size;
  uint64_t last = (end - 1) & ~(cs - 1);
  int r = io == img->io
    ? io_write_meta (img, "", 1, end - 1, "end of file", 0)
    : io->ops->pwrite (io, "", 1, end - 1);

  if (r < 0) {
    if (io != img->io)
      log_error (img, "extending the external data file to %" PRIu64
                 " bytes: %s", end, errstr (-r));
    return r;
  }
  if (io->ops->punch)
    io->ops->punch (io, last, end - last);       /* only saves a block */
  return 0;
}

int
qcow2_preallocate (struct qcow2_image *img, enum qcow2_preallocation mode)
{
  bool external = img->data_io != img->io;
  uint64_t cs = img->geo.cluster_size;
  uint64_t fa_start = 0, fa_end = 0;    /* a run of clusters to falloc */
  uint8_t *zeros = NULL;
  int r;

  if (mode == QCOW2_PREALLOC_OFF)
    return 0;
  if ((r = write_check (img, 0, 0)) < 0)
    return r;
  /* Encrypted, an unwritten cluster would read as noise. */
  if (img->luks)
    mode = QCOW2_PREALLOC_FULL;
  if (mode == QCOW2_PREALLOC_FALLOC && !img->data_io->ops->preallocate) {
    log_error (img, "preallocation=falloc: this storage cannot allocate "
               "space without writing it\n"
               "preallocation=full can");
    return -EOPNOTSUPP;
  }
  if (mode == QCOW2_PREALLOC_FULL && !(zeros = calloc (1, cs)))
    return -ENOMEM;
  image_lock (img);
  r = state_begin_write (img);
  for (uint64_t off = 0; off < img->size && r == 0; off += cs) {
    struct l2_state s;
    uint8_t *slice;
    uint64_t idx, host, len = external ? MIN (cs, img->size - off) : cs;
    bool zeroed;

    if ((r = cluster_l2_slice_writable (img, off, &slice, &idx)) < 0)
      break;
    l2_get (img, slice, idx, &s);
    if (s.normal || s.compressed)
      continue;
    if (external)
      host = off;               /* external data files map 1:1 */
    else if ((r = alloc_clusters (img, 1, &host, &zeroed)) < 0)
      break;
    else
      io_note_end (img, host + cs);     /* the file covers it now */
    if (mode == QCOW2_PREALLOC_FULL) {
      r = io_write_data (img, zeros, len, host);
      if (r == 0 && !external)
        io_note_written (img, host + cs);
    }
    else if (mode == QCOW2_PREALLOC_FALLOC && host != fa_end)
      r = write_falloc (img, img->data_io, &fa_start, &fa_end);
    if (mode == QCOW2_PREALLOC_FALLOC && r == 0) {
      fa_start = fa_end ? fa_start : host;
      fa_end = host + len;
    }
    if (r < 0 ||
        (r = cluster_l2_slice_writable (img, off, &slice, &idx)) < 0)
      break;
    /* With extended L2 entries, every subcluster stays unallocated:
     * a backing file shows through, else zeros.
     */
    l2_set (img, slice, idx, host | QCOW2_OFLAG_COPIED, 0);
    cache_mark_dirty (img, img->caches.l2, slice);
  }
  if (r == 0 && mode == QCOW2_PREALLOC_FALLOC)
    r = write_falloc (img, img->data_io, &fa_start, &fa_end);
  /* The file covers every cluster, as after qemu-img's preallocation;
   * unwritten clusters stay holes.
   */
  if (r == 0 && mode == QCOW2_PREALLOC_METADATA && img->size > 0)
    r = write_extend_hole (img, img->data_io,
                           external ? img->size : image_file_size (img));
  if (r == 0)
    r = flush_locked (img);
  image_unlock (img);
  free (zeros);
  return r;
}
