/* SPDX-License-Identifier: BSD-3-Clause */
/* Writing metadata and making it durable, in an order that keeps the
 * image consistent at every instant:
 *
 *  - refcount blocks (and new tables' contents) before the L2/L1/
 *    reftable entries that point at newly allocated clusters, and the
 *    reftable entry of a new block before those L2/L1 entries;
 *  - guest data before the L2 entry that makes it visible, except where
 *    a crash between the two could only show zeros where there were
 *    zeros and the file durably covers the cluster (see write-alloc.c);
 *  - L2 updates before the refcount decrements that free clusters
 *    (frees are applied only after a flush, see alloc.c);
 *  - one host flush per client flush when nothing depends on a
 *    refcount or copied data that is not durable yet, and none at all
 *    when nothing changed since the last flush;
 *  - an evicted L2 slice syncs only if it changed since the last sync
 *    of dependencies (a generation per slice, see cache_write_entry),
 *    so that a client that never flushes pays about one sync per
 *    cache's worth of evictions, not one per eviction;
 *  - with lazy refcounts, none of the above for refcount blocks once
 *    the dirty bit is durable (see flush_refcounts_lazy).
 *
 * Called with img->lock held.
 */
#include <errno.h>
#include <stdlib.h>

#include "be.h"
#include "checked.h"
#include "internal.h"

/* Write table entries [lo, hi) of an in-memory table of u64. */
static int
flush_write_table (struct qcow2_image *img, const uint64_t *table,
                   uint64_t lo, uint64_t hi, uint64_t table_offset,
                   const char *what, uint32_t may_touch)
  TSA_REQUIRES (img->lock)
{
  uint64_t n = hi - lo;
  uint8_t *buf;
  int r;

  assert (lo < hi);
  if (!(buf = malloc (n * 8)))
    return -ENOMEM;
  for (uint64_t i = 0; i < n; i++)
    be64_put (buf + i * 8, table[lo + i]);
  r = io_write_meta (img, buf, n * 8, table_offset + lo * 8, what,
                     may_touch);
  free (buf);
  return r;
}

/* With lazy refcounts, once the first write has made the dirty bit
 * durable, refcount blocks reach the disk only when evicted from their
 * cache or at a clean close: neither a flush nor an L2 entry waits for
 * them.  A crash leaves the image dirty, and the next read-write open
 * rebuilds the refcounts from the tables (check_rebuild_refcounts), as
 * QEMU does (qcow2_need_accurate_refcounts).  New refcount blocks and
 * their table entries keep their order: rare, and the structure stays
 * one that qemu-img check can walk.
 */
static bool
flush_refcounts_lazy (const struct qcow2_image *img)
  TSA_REQUIRES (img->lock)
{
  return img->lazy_refcounts && !img->alloc.closing &&
    (img->h.incompatible_features & QCOW2_INCOMPAT_DIRTY);
}

/* Write the dirty refcount blocks, unless lazy refcounts defer them. */
static int
flush_refcount_blocks (struct qcow2_image *img)
  TSA_REQUIRES (img->lock)
{
  if (flush_refcounts_lazy (img))
    return 0;
  return cache_writeback (img, img->caches.refcount);
}

/* Before any L2 or L1 entry reaches the disk, make durable what it
 * may point at: refcount blocks, then the refcount table entries of new
 * blocks (after the blocks: a second flush, but a block counts many
 * clusters, so it is rare).  Cache evictions call this too, for the
 * slices changed since the last such sync (see cache_write_entry); the
 * reserve is counted ahead here as at a client flush, so that a client
 * that never flushes still allocates mostly from it.
 */
int
flush_l2_dependencies (struct qcow2_image *img)
{
  int r;

  ASSERT_LOCKED (img);
  if (!img->dirty.l2_needs_sync_first)
    return 0;
  if ((r = alloc_refill_reserve (img)) < 0 ||
      (r = flush_refcount_blocks (img)) < 0 ||
      (r = io_flush (img)) < 0)
    return r;
  if (img->dirty.rt_hi > img->dirty.rt_lo) {
    assert (img->dirty.rt_hi <= img->reftable_size);
    r = flush_write_table (img, img->reftable, img->dirty.rt_lo,
                           img->dirty.rt_hi, img->h.refcount_table_offset,
                           "refcount table", OL (REFCOUNT_TABLE));
    if (r < 0 || (r = io_flush (img)) < 0)
      return r;
    img->dirty.rt_lo = img->dirty.rt_hi = 0;
  }
  img->dirty.l2_needs_sync_first = false;
  img->dirty.dep_syncs++;
  alloc_reserve_durable (img);
  return 0;
}

static int
flush_tables (struct qcow2_image *img)
  TSA_REQUIRES (img->lock)
{
  int r;

  /* New refcount blocks always come with l2_needs_sync_first; this
   * only makes sure that their table entries are written.
   */
  if (img->dirty.rt_hi > img->dirty.rt_lo)
    img->dirty.l2_needs_sync_first = true;
  if ((r = alloc_refill_reserve (img)) < 0 ||
      (r = flush_refcount_blocks (img)) < 0 ||
      (r = flush_l2_dependencies (img)) < 0)
    return r;
  if ((r = cache_writeback (img, img->caches.l2)) < 0)
    return r;
  if (img->dirty.l1_hi > img->dirty.l1_lo) {
    assert (img->dirty.l1_hi <= img->l1_size);
    r = flush_write_table (img, img->l1, img->dirty.l1_lo, img->dirty.l1_hi,
                           img->h.l1_table_offset, "L1 table", OL (ACTIVE_L1));
    if (r < 0)
      return r;
    img->dirty.l1_lo = img->dirty.l1_hi = 0;
  }
  return 0;
}

int
flush_locked (struct qcow2_image *img)
{
  int r;

  ASSERT_LOCKED (img);
  if (!img->dirty.changed)
    return 0;
  if ((r = flush_tables (img)) < 0 || (r = io_flush (img)) < 0)
    return r;
  /* Nothing is left for the next flush to write in order. */
  assert (!img->dirty.l2_needs_sync_first);
  assert (img->dirty.l1_lo == img->dirty.l1_hi);
  assert (img->dirty.rt_lo == img->dirty.rt_hi);
  alloc_reserve_durable (img);
  img->dirty.changed = false;
  return 0;
}

int
qcow2_flush (struct qcow2_image *img)
{
  size_t queued;
  bool frees;
  int r;

  image_lock (img);
  queued = img->alloc.pending_len;
  r = flush_locked (img);
  /* The changes that dropped the references queued before this flush
   * are durable now (later ones wait for the next flush).
   */
  if (r == 0)
    alloc_frees_durable (img, queued);
  frees = img->alloc.pending_durable > 0;
  image_unlock (img);
  if (r < 0 || !frees)
    return r;

  image_data_wrlock (img);
  image_lock (img);
  r = alloc_apply_frees (img, img->alloc.pending_durable);
  /* Written now, synced by the next flush: a process killed before it
   * then leaks nothing more than the reserve.
   */
  if (r == 0)
    r = flush_refcount_blocks (img);
  image_unlock (img);
  image_data_unlock (img);
  return r;
}
