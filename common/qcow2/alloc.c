/* Cluster allocation and freeing.
 *
 * Allocation searches for free clusters from a hint (the lowest cluster
 * that may be free) rather than always appending.  Freeing is deferred:
 * a cluster whose last reference was dropped is released only after the
 * L2 update that dropped it is durable (flush), so a crash never leaves
 * a table pointing at a reused cluster, and no request still reading a
 * cluster sees it reused (the release holds data_lock exclusively).
 *
 * Called with img->lock held.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "internal.h"

/* Find the first run of at least n free contiguous clusters, and take
 * it up to max long (*len), without taking them.  With n small, a
 * fragmented file costs no more to search than single clusters do.
 */
int
alloc_find_free (struct qcow2_image *img, uint64_t n, uint64_t max,
                 uint64_t *host_offset, uint64_t *len)
{
  uint64_t start = img->free_hint, run = 0;

  for (uint64_t c = start; run < max; c++) {
    uint64_t rc;
    int r = refcount_read (img, c, &rc);
    if (r < 0)
      return r;
    if (!rc)
      run++;
    else if (run >= n)
      break;
    else {
      run = 0;
      start = c + 1;
    }
  }
  *host_offset = start << img->cluster_bits;
  *len = run;
  return 0;
}

/* Make sure every refcount block counting [first, first+n) exists, so
 * that taking the references allocates nothing in between.  Returns 1
 * if a block was made (the free run must be searched again).
 */
static int
alloc_ensure_blocks (struct qcow2_image *img, uint64_t first, uint64_t n)
{
  uint64_t per_block_bits = img->cluster_bits + 3 - img->h.refcount_order;
  int made = 0;

  for (uint64_t idx = first >> per_block_bits;
       idx <= (first + n - 1) >> per_block_bits; idx++) {
    if (idx < img->reftable_size && img->reftable[idx])
      continue;
    /* Made directly, not by counting a cluster of its range: the block
     * lands in the range's first cluster, which would then be counted
     * twice (past the maximum of 1-bit refcounts).
     */
    int r = refcount_new_block (img, idx);
    if (r < 0)
      return r;
    made = 1;
  }
  return made;
}

/* The reserve.  Allocating a cluster normally dirties a refcount block,
 * and the tables that then point at the cluster must wait for that
 * block to be durable: a second host flush.  So each flush also counts
 * a run of clusters ahead of need (twice what was allocated since the
 * previous flush); once that flush is done their refcounts are
 * durable, and later allocations taken from them depend on nothing.
 * One client flush then costs one fdatasync.  After a crash the unused
 * reserve is leaked (qemu-img check: leaks, no corruption); a clean
 * close releases it.
 */
#define RESERVE_MIN 16
#define RESERVE_MAX_BYTES (256u << 20)

static int alloc_counted (struct qcow2_image *img, uint64_t n, uint64_t max,
                          uint64_t *host_offset, uint64_t *len,
                          bool *zeroed);

/* Take at least n, at most max clusters (*len) from the reserve. */
static bool
alloc_from_reserve (struct qcow2_image *img, uint64_t n, uint64_t max,
                    uint64_t *first, uint64_t *len)
{
  if (img->reserve_cur == img->reserve_cur_end && img->reserve_next_durable) {
    img->reserve_cur = img->reserve_next;
    img->reserve_cur_end = img->reserve_next_end;
    img->reserve_next = img->reserve_next_end = 0;
    img->reserve_next_durable = false;
  }
  if (img->reserve_cur_end - img->reserve_cur < n)
    return false;
  *first = img->reserve_cur;
  *len = MIN (max, img->reserve_cur_end - img->reserve_cur);
  img->reserve_cur += *len;
  return true;
}

/* How many clusters to take ahead of need: twice what was allocated
 * since the last flush.
 */
static uint64_t
alloc_ahead (struct qcow2_image *img)
{
  uint64_t want = MAX (RESERVE_MIN, 2 * img->allocated_since_flush);

  return MIN (want, MAX (RESERVE_MAX_BYTES >> img->cluster_bits, 1));
}

/* Count the next run of the reserve; called by a flush before it writes
 * the refcount blocks.
 */
int
alloc_refill_reserve (struct qcow2_image *img)
{
  uint64_t per_block_bits = img->cluster_bits + 3 - img->h.refcount_order;
  uint64_t want, have, offset, len;
  bool zeroed;
  int r;

  /* Only for images that are allocating. */
  if (!img->lazy_refcounts && img->data_io == img->io && !img->closing &&
      img->allocated_since_flush > 0) {
    /* A run longer than a refcount block's range could never be found
     * where blocks are still missing (each new block lands in the run).
     */
    want = MIN (alloc_ahead (img), (UINT64_C (1) << per_block_bits) - 1);
    have = (img->reserve_cur_end - img->reserve_cur)
      + (img->reserve_next_end - img->reserve_next);
    img->allocated_since_flush = 0;
    if (have < want / 2 && img->reserve_next == img->reserve_next_end) {
      if ((r = alloc_counted (img, want, want, &offset, &len, &zeroed)) < 0)
        return r;
      img->reserve_next = offset >> img->cluster_bits;
      img->reserve_next_end = img->reserve_next + len;
    }
  }
  /* The flush that makes the run's counts durable makes the file cover
   * it too, so that its clusters need no flush before their L2 entries
   * (see write_allocating); an extension that failed is tried again by
   * the next flush.
   */
  io_extend (img, img->reserve_next_end << img->cluster_bits);
  return 0;
}

/* The flush that counted the next run is durable: it is used as soon
 * as the current run is.
 */
void
alloc_reserve_durable (struct qcow2_image *img)
{
  img->reserve_next_durable = img->reserve_next != img->reserve_next_end;
}

/* Give back what the reserve holds (clean close). */
int
alloc_release_reserve (struct qcow2_image *img)
{
  int r = 0;

  for (uint64_t c = img->reserve_cur; c < img->reserve_cur_end && !r; c++)
    r = refcount_update (img, c, -1, NULL);
  for (uint64_t c = img->reserve_next; c < img->reserve_next_end && !r; c++)
    r = refcount_update (img, c, -1, NULL);
  if (r == 0) {
    img->free_hint = MIN (img->free_hint,
                          MIN (img->reserve_cur, img->reserve_next));
    img->reserve_cur = img->reserve_cur_end = 0;
    img->reserve_next = img->reserve_next_end = 0;
    img->reserve_next_durable = false;
  }
  return r;
}

/* Find at least n, at most max free contiguous clusters (*len) and
 * count them.
 */
static int
alloc_counted (struct qcow2_image *img, uint64_t n, uint64_t max,
               uint64_t *host_offset, uint64_t *len, bool *zeroed)
{
  uint64_t offset, first;
  int r;

  do {
    if ((r = alloc_find_free (img, n, max, &offset, len)) < 0)
      return r;
    first = offset >> img->cluster_bits;
  } while ((r = alloc_ensure_blocks (img, first, *len)) == 1);
  if (r < 0)
    return r;

  for (uint64_t i = 0; i < *len; i++) {
    if ((r = refcount_update (img, first + i, 1, NULL)) < 0)
      return r;
  }
  img->free_hint = first + *len;
  *zeroed = offset >= img->file_size;
  *host_offset = offset;
  return 0;
}

/* Allocate at least n, at most max contiguous clusters (*len) with
 * refcount 1, from the reserve if it can.  *zeroed tells whether they
 * lie past the end of the file (and so read as zeros).
 */
int
alloc_clusters_upto (struct qcow2_image *img, uint64_t n, uint64_t max,
                     uint64_t *host_offset, uint64_t *len, bool *zeroed)
{
  uint64_t first;
  int r;

  if (alloc_from_reserve (img, n, max, &first, len)) {
    img->allocated_since_flush += *len;
    *host_offset = first << img->cluster_bits;
    *zeroed = *host_offset >= img->file_size;
    return 0;
  }
  if ((r = alloc_counted (img, n, max, host_offset, len, zeroed)) < 0)
    return r;
  img->allocated_since_flush += *len;
  img->l2_needs_sync_first |= !img->lazy_refcounts;
  /* Without the reserve (lazy refcounts), each new cluster past the
   * durable end of the file would cost a flush before its L2 entry
   * (see write_allocating): extend the file ahead, so that one flush
   * covers the allocations to come.  In steps, once less than half
   * the distance is left: a write per allocation would double the
   * writes of a sequential fill.
   */
  if (*zeroed && img->lazy_refcounts) {
    uint64_t end = *host_offset + (*len << img->cluster_bits);
    uint64_t ahead = alloc_ahead (img) << img->cluster_bits;
    if (end + ahead / 2 > img->written_end)
      io_extend (img, end + ahead);
  }
  return 0;
}

/* Allocate exactly n contiguous clusters. */
int
alloc_clusters (struct qcow2_image *img, uint64_t n, uint64_t *host_offset,
                bool *zeroed)
{
  uint64_t len;

  return alloc_clusters_upto (img, n, n, host_offset, &len, zeroed);
}

/* Whether cluster c still has a reference to drop.  In a corrupt
 * image it may not: the allocator takes a cluster whose refcount is 0,
 * or counts it into the reserve, though a table still points at it,
 * and dropping that table's reference would then free the new owner
 * (an L2 table, say).  So the reference is left alone, as QEMU leaves
 * a free that would make a refcount negative, and the error names the
 * cluster.
 */
static int
alloc_has_reference (struct qcow2_image *img, uint64_t c, bool *has)
{
  uint64_t rc;
  int r = refcount_read (img, c, &rc);

  if (r < 0)
    return r;
  *has = rc > 0 &&
    !(c >= img->reserve_cur && c < img->reserve_cur_end) &&
    !(c >= img->reserve_next && c < img->reserve_next_end);
  if (!*has)
    qcow2_err (img, "corrupt image: a reference to the cluster at host "
               "offset %#" PRIx64 " is dropped, but the cluster is free "
               "(refcount %" PRIu64 "%s): left as is (qemu-img check -r all "
               "repairs the image)", c << img->cluster_bits, rc,
               rc ? ", counted ahead for new allocations" : "");
  return 0;
}

/* Drop one reference from each cluster of [host_offset, +bytes) once
 * the change that dropped it is durable.
 */
int
alloc_free_later (struct qcow2_image *img, uint64_t host_offset,
                  uint64_t bytes)
{
  uint64_t first = host_offset >> img->cluster_bits;
  uint64_t last = (host_offset + bytes - 1) >> img->cluster_bits;

  for (uint64_t c = first; c <= last; c++) {
    bool has;
    int r = alloc_has_reference (img, c, &has);

    if (r < 0)
      return r;
    if (!has)
      continue;
    if (img->pending_len == img->pending_cap) {
      size_t cap = img->pending_cap ? img->pending_cap * 2 : 64;
      uint64_t *p = realloc (img->pending_free, cap * sizeof *p);
      if (!p)
        return -ENOMEM;
      img->pending_free = p;
      img->pending_cap = cap;
    }
    img->pending_free[img->pending_len++] = c;
  }
  img->changed = true;
  return 0;
}

/* Cluster c has no reference left: it may be allocated again. */
void
alloc_released (struct qcow2_image *img, uint64_t c)
{
  uint64_t offset = c << img->cluster_bits;

  img->free_hint = MIN (img->free_hint, c);
  cache_forget (img->cache, offset, img->cluster_size);
  overlap_remove (img, offset, img->cluster_size);
  if (img->discard && img->io->ops->punch)
    img->io->ops->punch (img->io, offset, img->cluster_size);
}

/* Release the first n frees that alloc_free_later queued: those whose
 * table changes a completed flush made durable.  Clusters left unreferenced
 * are punched, so the space returns to the host and stale data never
 * shows through a later allocation.
 */
int
alloc_apply_frees (struct qcow2_image *img, size_t n)
{
  int r = 0;

  for (size_t i = 0; i < n && r == 0; i++) {
    uint64_t c = img->pending_free[i], rc;
    bool has;

    /* Twice in the queue with one reference: a corrupt image again. */
    r = alloc_has_reference (img, c, &has);
    if (r == 0 && has)
      r = refcount_update (img, c, -1, &rc);
    if (r == 0 && has && rc == 0)
      alloc_released (img, c);
  }
  /* Frees queued since that flush wait for the next one. */
  if (n > 0) {
    memmove (img->pending_free, img->pending_free + n,
             (img->pending_len - n) * sizeof *img->pending_free);
    img->pending_len -= n;
  }
  return r;
}

/* Grow the refcount table to at least min_entries.  The new table and
 * the refcount blocks that count it go together past the end of the
 * file, in one area whose every cluster they count; then the header
 * switches to the new table.  Rare, so it syncs as it goes.
 */
int
alloc_grow_reftable (struct qcow2_image *img, uint64_t min_entries)
{
  uint64_t cs = img->cluster_size;
  uint64_t per_cluster = cs / 8;
  uint64_t per_block_bits = img->cluster_bits + 3 - img->h.refcount_order;
  uint64_t entries, table_clusters, start, nblocks = 0, needed;
  uint64_t old_offset = img->h.refcount_table_offset;
  uint64_t old_clusters = img->h.refcount_table_clusters;
  uint64_t *table = NULL;
  uint8_t *area = NULL;
  int r;

  entries = MAX (min_entries, img->reftable_size + img->reftable_size / 2);
  /* Past the end of the file and past the reserve, which is counted
   * but may not be written yet.
   */
  start = div_round_up (img->file_size, cs);
  start = MAX (start, MAX (img->reserve_cur_end, img->reserve_next_end));

  /* Find how many new blocks the area needs to count itself. */
  for (;;) {
    entries = div_round_up (entries, per_cluster) * per_cluster;
    table_clusters = entries / per_cluster;
    uint64_t end = start + table_clusters + nblocks;
    needed = 0;
    for (uint64_t idx = start >> per_block_bits;
         idx <= (end - 1) >> per_block_bits; idx++)
      if (idx >= img->reftable_size || !img->reftable[idx])
        needed++;
    uint64_t last_idx = (end - 1) >> per_block_bits;
    if (last_idx >= entries) {
      entries = last_idx + 1;
      continue;
    }
    if (needed <= nblocks)
      break;
    nblocks = needed;
  }
  if (table_clusters * cs > QCOW2_MAX_REFTABLE_BYTES) {
    qcow2_err (img, "the refcount table would exceed %u bytes",
               QCOW2_MAX_REFTABLE_BYTES);
    return -EFBIG;
  }

  uint64_t total = table_clusters + nblocks;
  uint64_t end = start + total;
  table = calloc (entries, sizeof *table);
  area = calloc (total, cs);
  if (!table || !area) {
    r = -ENOMEM;
    goto out;
  }
  memcpy (table, img->reftable, img->reftable_size * sizeof *table);

  /* Place the new blocks after the table and count the area. */
  uint64_t b = 0;
  for (uint64_t idx = start >> per_block_bits;
       idx <= (end - 1) >> per_block_bits; idx++)
    if (!table[idx])
      table[idx] = (start + table_clusters + b++) << img->cluster_bits;
  for (uint64_t c = start; c < end; c++) {
    uint64_t idx = c >> per_block_bits;
    uint64_t blk = table[idx] >> img->cluster_bits;
    if (blk >= start && blk < end)
      refcount_entry_set (area + (blk - start) * cs, img->h.refcount_order,
                          c & ((UINT64_C (1) << per_block_bits) - 1), 1);
    else if ((r = refcount_update (img, c, 1, NULL)) < 0)
      goto out;
  }
  for (uint64_t i = 0; i < entries; i++)
    be64_put (area + i * 8, table[i]);

  /* Everything the header will point at must be durable first. */
  if ((r = cache_writeback (img, img->refcount_cache)) < 0 ||
      (r = refcount_switch_table (img, area, total, start, table, entries,
                                  table_clusters, "new refcount table")) < 0)
    goto out;
  table = NULL;
  r = alloc_free_later (img, old_offset, old_clusters * cs);
 out:
  free (table);
  free (area);
  return r;
}
