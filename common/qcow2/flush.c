/* SPDX-License-Identifier: BSD-3-Clause */
/* Writing metadata and making it durable, in an order that keeps the
 * image consistent at every instant:
 *
 *  - refcount blocks (and new tables' contents) before the L2/L1/
 *    reftable entries that point at newly allocated clusters, and the
 *    reftable entry of a new block before those L2/L1 entries;
 *  - guest data before the L2 entry that makes it visible, except where
 *    a crash between the two could only show zeros where there were
 *    zeros and the file durably covers the cluster (see write.c);
 *  - L2 updates before the refcount decrements that free clusters
 *    (frees are applied only after a flush, see alloc.c);
 *  - one host flush per client flush when nothing depends on a
 *    refcount or copied data that is not durable yet, and none at all
 *    when nothing changed since the last flush.
 *
 * Called with img->lock held.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

#define HDR_INCOMPAT 72
#define HDR_AUTOCLEAR 88

void
io_note_end (struct qcow2_image *img, uint64_t end)
{
  /* Read without the lock by the data paths, see image_file_size. */
  if (end > img->file_size)
    __atomic_store_n (&img->file_size, end, __ATOMIC_RELAXED);
}

/* Called with the lock held: in-place data writes, which run without
 * it, do not say where they end, so written_end may fall short, which
 * is safe.
 */
void
io_note_written (struct qcow2_image *img, uint64_t end)
{
  img->written_end = MAX (img->written_end, end);
}

static int
io_write_meta_unchecked (struct qcow2_image *img, const void *buf,
                         uint64_t len, uint64_t offset, const char *what,
                         uint32_t may_touch)
{
  int r = overlap_check (img, offset, len, may_touch);

  if (r < 0)
    return r;                   /* the guard said why */
  r = img->io->ops->pwrite (img->io, buf, len, offset);
  if (r < 0) {
    qcow2_err (img, "writing %s at %#" PRIx64 ": %s", what, offset,
               errstr (-r));
    return io_errno (r);
  }
  io_note_end (img, offset + len);
  io_note_written (img, offset + len);
  return 0;
}

/* Every metadata write to the image file goes through the overlap
 * guard: it may touch only the structures in may_touch.  Once the
 * image is marked corrupt (by the guard, perhaps while this request
 * was under way), no metadata is written but the header's feature
 * bits.
 */
int
io_write_meta (struct qcow2_image *img, const void *buf, uint64_t len,
               uint64_t offset, const char *what, uint32_t may_touch)
{
  if (qcow2_is_corrupt (img)) {
    qcow2_err (img, "not writing %s at %#" PRIx64 ": the image is marked "
               "corrupt", what, offset);
    return -EIO;
  }
  return io_write_meta_unchecked (img, buf, len, offset, what, may_touch);
}

/* Make the file at least end bytes long (a hole), so that the next
 * flush makes clusters below end part of the file even if their data
 * never reaches the disk.  The hole still counts as never written: new
 * clusters there read as zeros (file_size does not move).  Only saves
 * flushes (see write_allocating), so a failure (a full disk) is not an
 * error.
 */
void
io_extend (struct qcow2_image *img, uint64_t end)
{
  int r;

  if (end <= img->written_end)
    return;
  r = overlap_check (img, end - 1, 1, 0);
  if (r == 0)
    r = img->io->ops->pwrite (img->io, "", 1, end - 1);
  if (r < 0)
    qcow2_dbg (img, "extending the file to %" PRIu64 " bytes: %s", end,
               errstr (-r));
  else
    io_note_written (img, end);
}

/* Guest data never lands on metadata.  With the lock held. */
int
io_check_data (struct qcow2_image *img, uint64_t len, uint64_t offset)
{
  return img->data_io == img->io ? overlap_check (img, offset, len, 0) : 0;
}

/* Report a failed write of guest data; returns what the client is
 * told.
 */
int
io_data_error (struct qcow2_image *img, uint64_t len, uint64_t offset, int r)
{
  qcow2_err (img, "writing %" PRIu64 " bytes of data at host offset %#"
             PRIx64 ": %s", len, offset, errstr (-r));
  return io_errno (r);
}

/* Write guest data that io_check_data passed; needs no lock. */
int
io_write_checked (struct qcow2_image *img, const void *buf, uint64_t len,
                  uint64_t offset)
{
  int r = img->data_io->ops->pwrite (img->data_io, buf, len, offset);

  return r < 0 ? io_data_error (img, len, offset, r) : 0;
}

int
io_write_data (struct qcow2_image *img, const void *buf, uint64_t len,
               uint64_t offset)
{
  int r = io_check_data (img, len, offset);

  return r ? r : io_write_checked (img, buf, len, offset);
}

/* Metadata could not be written: mark the image dirty (v3), so that
 * the next read-write open rebuilds its refcounts and reclaims what
 * was leaked.  Best effort: if this write is lost too, the image has
 * leaks at worst, since nothing was ever written out of order.
 */
void
flush_mark_dirty (struct qcow2_image *img)
{
  struct qcow2_header *h = &img->h;

  if (h->version < 3 || (h->incompatible_features & QCOW2_INCOMPAT_DIRTY))
    return;
  image_set_incompat (img, QCOW2_INCOMPAT_DIRTY);
  if (header_write_features (img) == 0 && !img->flush_failed)
    io_flush (img);
}

/* A failed host flush cannot be taken back: the writes before it may
 * be lost while the file still shows them (Linux marks the pages
 * clean), and a later flush would succeed without them, breaking the
 * order that every write relies on.  So, as QEMU does, every later
 * flush fails too (reopening the image recovers), and the image is
 * marked dirty.
 */
static void
io_flush_failed (struct qcow2_image *img)
{
  img->flush_failed = true;
  flush_mark_dirty (img);
}

int
io_flush (struct qcow2_image *img)
{
  uint64_t end = img->written_end;
  int r;

  if (img->flush_failed) {
    qcow2_err (img, "an earlier flush failed: what was written since the "
               "flush before it may be lost, so no flush can succeed until "
               "the image is opened again");
    return -EIO;
  }
  if (img->data_io != img->io &&
      (r = img->data_io->ops->flush (img->data_io)) < 0) {
    qcow2_err (img, "flushing the external data file: %s", errstr (-r));
    io_flush_failed (img);
    return io_errno (r);
  }
  r = img->io->ops->flush (img->io);
  if (r < 0) {
    qcow2_err (img, "flushing: %s", errstr (-r));
    io_flush_failed (img);
    return io_errno (r);
  }
  img->flushes++;
  img->durable_end = end;
  return 0;
}

/* Grow the dirty range [*lo, *hi) of a table to cover index. */
static void
flush_mark_range (struct qcow2_image *img, uint64_t *lo, uint64_t *hi,
                  uint64_t index)
{
  if (*lo == *hi) {
    *lo = index;
    *hi = index + 1;
  }
  else {
    *lo = MIN (*lo, index);
    *hi = MAX (*hi, index + 1);
  }
  img->changed = true;
}

void
flush_mark_l1_dirty (struct qcow2_image *img, uint32_t index)
{
  flush_mark_range (img, &img->l1_dirty_lo, &img->l1_dirty_hi, index);
}

void
flush_mark_reftable_dirty (struct qcow2_image *img, uint64_t index)
{
  flush_mark_range (img, &img->rt_dirty_lo, &img->rt_dirty_hi, index);
}

/* Write table entries [lo, hi) of an in-memory table of u64. */
static int
flush_write_table (struct qcow2_image *img, const uint64_t *table,
                   uint64_t lo, uint64_t hi, uint64_t table_offset,
                   const char *what, uint32_t may_touch)
{
  uint64_t n = hi - lo;
  uint8_t *buf = malloc (n * 8);
  int r;

  if (!buf)
    return -ENOMEM;
  for (uint64_t i = 0; i < n; i++)
    be64_put (buf + i * 8, table[lo + i]);
  r = io_write_meta (img, buf, n * 8, table_offset + lo * 8, what,
                     may_touch);
  free (buf);
  return r;
}

/* Before any L2 or L1 entry reaches the disk, make durable what it
 * may point at: refcount blocks, then the refcount table entries of new
 * blocks (after the blocks: a second flush, but a block counts many
 * clusters, so it is rare).  Cache evictions call this too.
 */
int
flush_l2_dependencies (struct qcow2_image *img)
{
  int r;

  if (!img->l2_needs_sync_first)
    return 0;
  if ((r = cache_writeback (img, img->refcount_cache)) < 0 ||
      (r = io_flush (img)) < 0)
    return r;
  if (img->rt_dirty_hi > img->rt_dirty_lo) {
    r = flush_write_table (img, img->reftable, img->rt_dirty_lo,
                           img->rt_dirty_hi, img->h.refcount_table_offset,
                           "refcount table", OL (REFCOUNT_TABLE));
    if (r < 0 || (r = io_flush (img)) < 0)
      return r;
    img->rt_dirty_lo = img->rt_dirty_hi = 0;
  }
  img->l2_needs_sync_first = false;
  return 0;
}

static int
flush_tables (struct qcow2_image *img)
{
  int r;

  /* New refcount blocks always come with l2_needs_sync_first; this
   * only makes sure that their table entries are written.
   */
  if (img->rt_dirty_hi > img->rt_dirty_lo)
    img->l2_needs_sync_first = true;
  if ((r = alloc_refill_reserve (img)) < 0 ||
      (r = cache_writeback (img, img->refcount_cache)) < 0 ||
      (r = flush_l2_dependencies (img)) < 0)
    return r;
  if ((r = cache_writeback (img, img->cache)) < 0)
    return r;
  if (img->l1_dirty_hi > img->l1_dirty_lo) {
    r = flush_write_table (img, img->l1, img->l1_dirty_lo, img->l1_dirty_hi,
                           img->h.l1_table_offset, "L1 table", OL (ACTIVE_L1));
    if (r < 0)
      return r;
    img->l1_dirty_lo = img->l1_dirty_hi = 0;
  }
  return 0;
}

int
flush_locked (struct qcow2_image *img)
{
  int r;

  if (!img->changed)
    return 0;
  if ((r = flush_tables (img)) < 0 || (r = io_flush (img)) < 0)
    return r;
  alloc_reserve_durable (img);
  img->changed = false;
  return 0;
}

/* Patch the feature bit fields of a v3 header in place (also on an
 * image marked corrupt: that is how the mark is written).
 */
int
header_write_features (struct qcow2_image *img)
{
  uint8_t buf[8];
  int r;

  be64_put (buf, img->h.incompatible_features);
  r = io_write_meta_unchecked (img, buf, 8, HDR_INCOMPAT, "header",
                               OL (MAIN_HEADER));
  if (r < 0)
    return r;
  be64_put (buf, img->h.autoclear_features);
  return io_write_meta_unchecked (img, buf, 8, HDR_AUTOCLEAR, "header",
                                  OL (MAIN_HEADER));
}

/* Before the first change:
 *  - an image left dirty by a crash under lazy refcounts gets its
 *    refcounts rebuilt (its refcounts cannot be trusted for allocation);
 *  - autoclear features we do not know are cleared, as the spec
 *    requires of an editor that does not know them;
 *  - the persistent bitmaps kept up to date are marked in use;
 *  - with lazy refcounts, the dirty bit is set and made durable before
 *    any metadata changes.
 */
int
flush_begin_write (struct qcow2_image *img)
{
  struct qcow2_header *h = &img->h;
  uint64_t known;
  bool dirty;
  int r;

  /* Every write, zero and trim passes here under img->lock, cluster by
   * cluster: one the overlap guard marked corrupt since the request
   * began goes no further.
   */
  if (qcow2_is_corrupt (img))
    return qcow2_check_writable (img);
  if (img->write_started)
    return 0;
  if (h->incompatible_features & QCOW2_INCOMPAT_DIRTY) {
    if ((r = check_rebuild_refcounts (img)) < 0)
      return r;
    image_clear_incompat (img, QCOW2_INCOMPAT_DIRTY);
    if ((r = header_write_features (img)) < 0 || (r = io_flush (img)) < 0)
      return r;
    qcow2_notice (img, "the image was not closed cleanly (dirty bit set): "
                  "refcounts rebuilt");
  }
  known = QCOW2_AUTOCLEAR_DATA_RAW |
    (h->has_bitmaps_ext ? QCOW2_AUTOCLEAR_BITMAPS : 0);
  if (h->version >= 3 && (h->autoclear_features & ~known)) {
    h->autoclear_features &= known;
    if ((r = header_write_features (img)) < 0 || (r = io_flush (img)) < 0)
      return r;
  }
  if ((r = bitmap_begin_write (img)) < 0)
    return r;
  dirty = img->lazy_refcounts && h->version >= 3;
  if (dirty) {
    image_set_incompat (img, QCOW2_INCOMPAT_DIRTY);
    if ((r = header_write_features (img)) < 0 || (r = io_flush (img)) < 0)
      return r;
  }
  img->write_started = true;
  return 0;
}

/* Clean close: everything durable, frees released, dirty bit cleared. */
int
flush_close (struct qcow2_image *img)
{
  int r;

  if (!img->write_started)
    return 0;
  img->closing = true;
  if ((r = bitmap_store (img)) < 0 ||
      (r = flush_locked (img)) < 0 ||
      (r = alloc_apply_frees (img, img->pending_len)) < 0 ||
      (r = alloc_release_reserve (img)) < 0 ||
      (r = flush_locked (img)) < 0)
    return r;
  img->pending_durable = 0;
  /* New clusters written only in part leave the file short of them:
   * make it cover every cluster, as QEMU's images do.
   */
  int64_t size = img->io->ops->size (img->io);
  if (size >= 0 && (uint64_t) size < img->file_size &&
      ((r = io_write_meta (img, "", 1, img->file_size - 1,
                           "end of file", 0)) < 0 ||
       (r = io_flush (img)) < 0))
    return r;
  if (img->h.incompatible_features & QCOW2_INCOMPAT_DIRTY) {
    image_clear_incompat (img, QCOW2_INCOMPAT_DIRTY);
    if ((r = header_write_features (img)) < 0 || (r = io_flush (img)) < 0)
      return r;
  }
  return 0;
}
