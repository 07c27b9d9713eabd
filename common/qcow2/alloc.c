/* SPDX-License-Identifier: BSD-3-Clause */
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
/* The refcount of cluster c, for a search of free clusters: the
 * header's cluster is never free, and a refcount of 0 there is
 * corruption (allocating it would put a table or data on the header).
 */
static int
alloc_refcount (struct qcow2_image *img, uint64_t c, uint64_t *rc)
  TSA_REQUIRES (img->lock)
{
  int r = refcount_read (img, c, rc);

  if (r == 0 && c == 0 && *rc == 0)
    return io_corrupt (img, "the header's cluster has refcount 0 (refcount "
                       "table entry 0 is empty, or its block says so): "
                       "allocation refused");
  return r;
}

static int
alloc_find_free (struct qcow2_image *img, uint64_t n, uint64_t max,
                 uint64_t *host_offset, uint64_t *len)
  TSA_REQUIRES (img->lock)
{
  uint64_t start = img->alloc.free_hint, run = 0;

  assert (n >= 1 && n <= max);
  for (uint64_t c = start; run < max; c++) {
    uint64_t rc;
    int r = alloc_refcount (img, c, &rc);
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
  assert (run <= max);
  *host_offset = start << img->geo.cluster_bits;
  *len = run;
  return 0;
}

/* Make sure every refcount block counting [first, first+n) exists, so
 * that taking the references allocates nothing in between.  Returns 1
 * if a block was made (the free run must be searched again).
 */
static int
alloc_ensure_blocks (struct qcow2_image *img, uint64_t first, uint64_t n)
  TSA_REQUIRES (img->lock)
{
  uint64_t per_block_bits = img->geo.cluster_bits + 3 - img->h.refcount_order;
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
 * block to be durable: a second host flush.  So each flush (and each
 * sync that an evicted L2 slice pays, see flush_l2_dependencies) also
 * counts clusters ahead of need (twice what was allocated since the
 * previous one), the lowest free ones first, so that holes left by
 * freed clusters fill before the file grows; once that flush is done
 * their refcounts are durable, and later allocations taken from them
 * depend on nothing.  One client flush then costs one fdatasync, and a
 * client that never flushes allocates from the reserve too.
 *
 * After a crash the unused reserve is leaked (qemu-img check: leaks,
 * no corruption), so it is bounded: 4 MiB or 64 clusters, whichever
 * is more (the latter also by a sixteenth of the file, see
 * alloc_ahead).  An interval that allocates more than that pays the
 * second host flush, as QEMU does at every flush.  A clean close
 * releases the reserve.
 */
#define RESERVE_MIN 16
#define RESERVE_LIMIT_BYTES (UINT64_C (4) << 20)
#define RESERVE_LIMIT_CLUSTERS 64
#define EXTEND_AHEAD_MAX_BYTES (UINT64_C (256) << 20)

static int alloc_counted (struct qcow2_image *img, uint64_t n, uint64_t max,
                          uint64_t *host_offset, uint64_t *len,
                          bool *zeroed);

/* Append cluster c to runs (which it must follow). */
static int
alloc_runs_add (struct alloc_runs *runs, uint64_t c)
{
  assert (runs->len == 0 || runs->v[runs->len - 1].end <= c);
  if (runs->len > 0 && runs->v[runs->len - 1].end == c) {
    runs->v[runs->len - 1].end++;
    runs->left++;
    return 0;
  }
  if (runs->len == runs->cap) {
    size_t cap = runs->cap ? runs->cap * 2 : 16;
    struct alloc_run *v = realloc (runs->v, cap * sizeof *v);
    if (!v)
      return -ENOMEM;
    runs->v = v;
    runs->cap = cap;
  }
  runs->v[runs->len++] = (struct alloc_run) { c, c + 1 };
  runs->left++;
  return 0;
}

static void
alloc_runs_clear (struct alloc_runs *runs)
{
  runs->head = runs->len = 0;
  runs->left = 0;
}

/* Whether runs hold cluster c, by bisection (ends ascend). */
static bool
alloc_runs_contain (const struct alloc_runs *runs, uint64_t c)
{
  size_t lo = runs->head, hi = runs->len;

  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (runs->v[mid].end <= c)
      lo = mid + 1;
    else
      hi = mid;
  }
  assert (lo == runs->len || runs->v[lo].end > c);
  return lo < runs->len && runs->v[lo].first <= c;
}

static bool
alloc_in_reserve (const struct qcow2_image *img, uint64_t c)
  TSA_REQUIRES (img->lock)
{
  return alloc_runs_contain (&img->alloc.reserve_cur, c) ||
    alloc_runs_contain (&img->alloc.reserve_next, c);
}

/* Returns the cluster after the reserve's last (0 if it is empty). */
uint64_t
alloc_reserve_end (const struct qcow2_image *img)
{
  const struct alloc_runs *r[2] = {
    &img->alloc.reserve_cur, &img->alloc.reserve_next
  };
  uint64_t end = 0;

  for (int i = 0; i < 2; i++)
    if (r[i]->left > 0) {
      assert (r[i]->head < r[i]->len);
      end = MAX (end, r[i]->v[r[i]->len - 1].end);
    }
  return end;
}

/* Take at least n, at most max contiguous clusters (*len) from the
 * reserve: from its first run long enough.
 */
static bool
alloc_from_reserve (struct qcow2_image *img, uint64_t n, uint64_t max,
                    uint64_t *first, uint64_t *len)
  TSA_REQUIRES (img->lock)
{
  struct alloc_runs *cur = &img->alloc.reserve_cur;

  if (cur->left == 0 && img->alloc.reserve_next_durable) {
    struct alloc_runs t = *cur;
    *cur = img->alloc.reserve_next;
    img->alloc.reserve_next = t;
    alloc_runs_clear (&img->alloc.reserve_next);
    img->alloc.reserve_next_durable = false;
  }
  for (size_t i = cur->head; i < cur->len; i++) {
    struct alloc_run *run = &cur->v[i];
    if (run->end - run->first < n)
      continue;
    *first = run->first;
    *len = MIN (max, run->end - run->first);
    assert (*len >= n && *len <= cur->left);
    run->first += *len;
    cur->left -= *len;
    while (cur->head < cur->len &&
           cur->v[cur->head].first == cur->v[cur->head].end)
      cur->head++;
    return true;
  }
  return false;
}

/* Returns how many clusters to take ahead of need: twice what was allocated
 * since the last flush, within the limit.  Past 4 MiB (64 clusters of
 * 2 MiB, say) also within a sixteenth of the file: the reserve's part
 * past the end of the file makes the file longer.
 */
static uint64_t
alloc_ahead (struct qcow2_image *img)
  TSA_REQUIRES (img->lock)
{
  uint64_t want = MAX (RESERVE_MIN, 2 * img->alloc.allocated_since_flush);
  uint64_t limit = MAX (RESERVE_LIMIT_BYTES >> img->geo.cluster_bits,
                        MIN (RESERVE_LIMIT_CLUSTERS,
                             (img->file_size / 16) >> img->geo.cluster_bits));

  return MAX (MIN (want, limit), 1);
}
/* Count the n lowest free clusters into runs (empty).  On failure
 * runs stay empty: clusters already counted are leaked, never left
 * counted in the reserve without their refcount.
 */
static int
alloc_collect (struct qcow2_image *img, uint64_t n, struct alloc_runs *runs)
  TSA_REQUIRES (img->lock)
{
  struct alloc_runs found = { 0 };
  int r, made;

  do {
    uint64_t c = img->alloc.free_hint;

    alloc_runs_clear (&found);
    while (found.left < n) {
      uint64_t rc;
      if ((r = alloc_refcount (img, c, &rc)) < 0 ||
          (rc == 0 && (r = alloc_runs_add (&found, c)) < 0))
        goto out;
      c++;
    }
    /* A refcount block made now lands in the first cluster of its
     * range, perhaps one just found free: look again.
     */
    made = 0;
    for (size_t i = 0; i < found.len; i++) {
      r = alloc_ensure_blocks (img, found.v[i].first,
                               found.v[i].end - found.v[i].first);
      if (r < 0)
        goto out;
      made |= r;
    }
  } while (made);

  for (size_t i = 0; i < found.len; i++)
    for (uint64_t c = found.v[i].first; c < found.v[i].end; c++)
      if ((r = refcount_update (img, c, 1, NULL)) < 0)
        goto out;
  img->alloc.free_hint = found.v[found.len - 1].end;
  free (runs->v);
  *runs = found;
  return 0;
 out:
  free (found.v);
  return r;
}

/* Count the next runs of the reserve; called by a flush (or a sync of
 * L2 dependencies) before it writes the refcount blocks.
 */
int
alloc_refill_reserve (struct qcow2_image *img)
{
  uint64_t want, have;
  int r;

  ASSERT_LOCKED (img);
  /* Only for images that are allocating. */
  if (!img->lazy_refcounts && img->data_io == img->io && !img->alloc.closing &&
      img->alloc.allocated_since_flush > 0) {
    want = alloc_ahead (img);
    have = img->alloc.reserve_cur.left + img->alloc.reserve_next.left;
    img->alloc.allocated_since_flush = 0;
    if (have < want / 2 && img->alloc.reserve_next.left == 0 &&
        (r = alloc_collect (img, want - have, &img->alloc.reserve_next)) < 0)
      return r;
  }
  /* The flush that makes the runs' counts durable makes the file cover
   * them too, so that their clusters need no flush before their L2
   * entries (see write_allocating); an extension that failed is tried
   * again by the next flush.
   */
  io_extend (img, alloc_reserve_end (img) << img->geo.cluster_bits);
  return 0;
}

/* The flush that counted the next runs is durable: they are used as
 * soon as the current ones are.
 */
void
alloc_reserve_durable (struct qcow2_image *img)
{
  img->alloc.reserve_next_durable = img->alloc.reserve_next.left > 0;
}

/* Give back what the reserve holds (clean close). */
int
alloc_release_reserve (struct qcow2_image *img)
{
  struct alloc_runs *runs[2] = {
    &img->alloc.reserve_cur, &img->alloc.reserve_next
  };
  int r = 0;

  for (int i = 0; i < 2; i++) {
    for (size_t j = runs[i]->head; j < runs[i]->len && !r; j++)
      for (uint64_t c = runs[i]->v[j].first; c < runs[i]->v[j].end && !r; c++)
        r = refcount_update (img, c, -1, NULL);
    if (r == 0 && runs[i]->left > 0)
      img->alloc.free_hint = MIN (img->alloc.free_hint,
                                  runs[i]->v[runs[i]->head].first);
  }
  if (r == 0) {
    alloc_runs_clear (runs[0]);
    alloc_runs_clear (runs[1]);
    img->alloc.reserve_next_durable = false;
  }
  return r;
}

void
alloc_free_reserve (struct qcow2_image *img)
{
  free (img->alloc.reserve_cur.v);
  free (img->alloc.reserve_next.v);
}

/* Find at least n, at most max free contiguous clusters (*len) and
 * count them.
 */
static int
alloc_counted (struct qcow2_image *img, uint64_t n, uint64_t max,
               uint64_t *host_offset, uint64_t *len, bool *zeroed)
  TSA_REQUIRES (img->lock)
{
  uint64_t offset, first;
  int r;

  do {
    if ((r = alloc_find_free (img, n, max, &offset, len)) < 0)
      return r;
    first = offset >> img->geo.cluster_bits;
  } while ((r = alloc_ensure_blocks (img, first, *len)) == 1);
  if (r < 0)
    return r;

  for (uint64_t i = 0; i < *len; i++) {
    if ((r = refcount_update (img, first + i, 1, NULL)) < 0)
      return r;
  }
  img->alloc.free_hint = first + *len;
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

  ASSERT_LOCKED (img);
  if (alloc_from_reserve (img, n, max, &first, len)) {
    img->alloc.allocated_since_flush += *len;
    *host_offset = first << img->geo.cluster_bits;
    *zeroed = *host_offset >= img->file_size;
    return 0;
  }
  if ((r = alloc_counted (img, n, max, host_offset, len, zeroed)) < 0)
    return r;
  img->alloc.allocated_since_flush += *len;
  if (!img->lazy_refcounts)
    flush_mark_dependency (img);
  /* Without the reserve (lazy refcounts), each new cluster past the
   * durable end of the file would cost a flush before its L2 entry
   * (see write_allocating): extend the file ahead, so that one flush
   * covers the allocations to come.  In steps, once less than half
   * the distance is left: a write per allocation would double the
   * writes of a sequential fill.  Unlike the reserve, this leaks
   * nothing after a crash (the tail is a hole), so it may go further.
   */
  if (*zeroed && img->lazy_refcounts) {
    uint64_t end = *host_offset + (*len << img->geo.cluster_bits);
    uint64_t ahead = MIN (MAX ((uint64_t) RESERVE_MIN << img->geo.cluster_bits,
                               2 * img->alloc.allocated_since_flush
                               << img->geo.cluster_bits),
                          EXTEND_AHEAD_MAX_BYTES);
    if (end + ahead / 2 > img->host.written_end)
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

  ASSERT_LOCKED (img);
  return alloc_clusters_upto (img, n, n, host_offset, &len, zeroed);
}

/* The n clusters from host_offset that alloc_clusters gave are unused:
 * a write to them failed before anything pointed at them.  Their
 * references go back, so that a full disk leaves no leak behind.
 */
void
alloc_clusters_unused (struct qcow2_image *img, uint64_t host_offset,
                       uint64_t n)
{
  uint64_t first = host_offset >> img->geo.cluster_bits;

  ASSERT_LOCKED (img);
  for (uint64_t c = first; c < first + n; c++)
    refcount_update (img, c, -1, NULL);
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
  TSA_REQUIRES (img->lock)
{
  uint64_t rc;
  int r = refcount_read (img, c, &rc);

  if (r < 0)
    return r;
  *has = rc > 0 && !alloc_in_reserve (img, c);
  if (!*has)
    log_error (img, "corrupt image: a reference to the cluster at host "
               "offset %#" PRIx64 " is dropped, but the cluster is free "
               "(refcount %" PRIu64 "%s): left as is\n"
               "qemu-img check -r all repairs the image",
               c << img->geo.cluster_bits, rc,
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
  uint64_t first = host_offset >> img->geo.cluster_bits;
  uint64_t last = (host_offset + bytes - 1) >> img->geo.cluster_bits;

  ASSERT_LOCKED (img);
  for (uint64_t c = first; c <= last; c++) {
    bool has;
    int r = alloc_has_reference (img, c, &has);

    if (r < 0)
      return r;
    if (!has)
      continue;
    if (img->alloc.pending_len == img->alloc.pending_cap) {
      size_t cap = img->alloc.pending_cap ? img->alloc.pending_cap * 2 : 64;
      uint64_t *p = realloc (img->alloc.pending_free, cap * sizeof *p);
      if (!p)
        return -ENOMEM;
      img->alloc.pending_free = p;
      img->alloc.pending_cap = cap;
    }
    img->alloc.pending_free[img->alloc.pending_len++] = c;
  }
  flush_mark_changed (img);
  return 0;
}

int
alloc_bytes (struct qcow2_image *img, uint64_t len, uint64_t *host)
{
  uint64_t cs = img->geo.cluster_size;
  uint64_t off = img->alloc.free_byte_offset, fresh = UINT64_MAX, rc;
  int r;

  ASSERT_LOCKED (img);
  assert (len > 0 && len <= cs);
  /* Not past what the refcount width counts (1-bit refcounts). */
  if (off && ((r = refcount_read (img, off >> img->geo.cluster_bits, &rc)) < 0
              || rc >= refcount_max (img)))
    off = 0;
  if (!off || cs - (off & (cs - 1)) < len) {
    uint64_t c;
    bool zeroed;

    if ((r = alloc_clusters (img, 1, &c, &zeroed)) < 0)
      return r;
    if (zeroed)
      io_note_end (img, c + cs);
    /* Straddle into it if it follows the cluster being filled. */
    if (!off || ((off + cs - 1) & ~(cs - 1)) != c)
      off = c;
    fresh = c >> img->geo.cluster_bits;
  }
  /* A reference from each cluster the bytes touch (the new one has
   * its first already).
   */
  for (uint64_t c = off >> img->geo.cluster_bits;
       c <= (off + len - 1) >> img->geo.cluster_bits; c++)
    if (c != fresh && (r = refcount_update (img, c, 1, NULL)) < 0)
      return r;
  img->alloc.free_byte_offset = (off + len) & (cs - 1) ? off + len : 0;
  *host = off;
  return 0;
}

/* The bytes alloc_bytes gave at host were not written, and nothing
 * points at them: their references go back, and the next compressed
 * cluster starts a new cluster.
 */
void
alloc_bytes_unused (struct qcow2_image *img, uint64_t host, uint64_t len)
{
  uint64_t first = host >> img->geo.cluster_bits;

  assert (len > 0 && len <= img->geo.cluster_size);
  alloc_clusters_unused (img, host & ~(img->geo.cluster_size - 1),
                         ((host + len - 1) >> img->geo.cluster_bits)
                         - first + 1);
  img->alloc.free_byte_offset = 0;
}

/* Clusters [c, c+n) have no reference left: they may be allocated
 * again.  Punched as one range: on a file system of 4 KiB blocks, a
 * punch of one 512-byte cluster would free nothing.
 */
void
alloc_released (struct qcow2_image *img, uint64_t c, uint64_t n)
{
  uint64_t offset = c << img->geo.cluster_bits;
  uint64_t len = n << img->geo.cluster_bits;

  img->alloc.free_hint = MIN (img->alloc.free_hint, c);
  /* Compressed clusters are not packed into a cluster freed. */
  if (img->alloc.free_byte_offset >= offset &&
      img->alloc.free_byte_offset < offset + len)
    img->alloc.free_byte_offset = 0;
  cache_forget (img->caches.l2, offset, len);
  overlap_remove (img, offset, len);
  if (img->discard && img->io->ops->punch)
    img->io->ops->punch (img->io, offset, len);
}

static int
alloc_cmp_cluster (const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

  return x < y ? -1 : x > y;
}

/* Release the first n frees that alloc_free_later queued: those whose
 * table changes a completed flush made durable.  Clusters left unreferenced
 * are punched, so the space returns to the host and stale data never
 * shows through a later allocation.
 */
int
alloc_apply_frees (struct qcow2_image *img, size_t n)
{
  size_t nreleased = 0;
  int r = 0;

  ASSERT_LOCKED (img);
  assert (n <= img->alloc.pending_len);
  assert (img->alloc.pending_durable <= img->alloc.pending_len);
  for (size_t i = 0; i < n && r == 0; i++) {
    uint64_t c = img->alloc.pending_free[i], rc;
    bool has;

    /* Twice in the queue with one reference: a corrupt image again. */
    r = alloc_has_reference (img, c, &has);
    if (r == 0 && has)
      r = refcount_update (img, c, -1, &rc);
    /* The released ones go to the front of the consumed part. */
    if (r == 0 && has && rc == 0)
      img->alloc.pending_free[nreleased++] = c;
  }
  if (nreleased > 1)
    qsort (img->alloc.pending_free, nreleased, sizeof *img->alloc.pending_free,
           alloc_cmp_cluster);
  for (size_t i = 0, j; i < nreleased; i = j) {
    const uint64_t *p = img->alloc.pending_free;

    for (j = i + 1; j < nreleased && p[j] == p[j - 1] + 1; j++)
      ;
    alloc_released (img, img->alloc.pending_free[i], j - i);
  }
  /* Frees queued since that flush wait for the next one. */
  if (n > 0) {
    memmove (img->alloc.pending_free, img->alloc.pending_free + n,
             (img->alloc.pending_len - n) * sizeof *img->alloc.pending_free);
    img->alloc.pending_len -= n;
  }
  img->alloc.pending_durable = 0;
  return r;
}

/* A flush made durable the changes that queued the first queued frees:
 * they may be applied.
 */
void
alloc_frees_durable (struct qcow2_image *img, size_t queued)
{
  img->alloc.pending_durable = MAX (img->alloc.pending_durable, queued);
}

/* The image is closing: no more reserve is counted. */
void
alloc_begin_close (struct qcow2_image *img)
{
  img->alloc.closing = true;
}

/* The refcounts were rebuilt: any cluster may be free. */
void
alloc_forget_hint (struct qcow2_image *img)
{
  img->alloc.free_hint = 0;
}

/* Grow the refcount table to at least min_entries.  The new table and
 * the refcount blocks that count it go together past the end of the
 * file, in one area whose every cluster they count; then the header
 * switches to the new table.  Rare, so it syncs as it goes.
 */
int
alloc_grow_reftable (struct qcow2_image *img, uint64_t min_entries)
{
  uint64_t cs = img->geo.cluster_size;
  uint64_t per_cluster = cs / 8;
  uint64_t per_block_bits = img->geo.cluster_bits + 3 - img->h.refcount_order;
  uint64_t entries, table_clusters, start, nblocks = 0, needed;
  uint64_t old_offset = img->h.refcount_table_offset;
  uint64_t old_clusters = img->h.refcount_table_clusters;
  CLEANUP_FREE uint64_t *table = NULL;
  CLEANUP_FREE uint8_t *area = NULL;
  int r;

  entries = MAX (min_entries, img->reftable_size + img->reftable_size / 2);
  /* Past the end of the file and past the reserve, which is counted
   * but may not be written yet.
   */
  start = div_round_up (img->file_size, cs);
  start = MAX (start, alloc_reserve_end (img));

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
    log_error (img, "the refcount table would exceed %u bytes",
               QCOW2_MAX_REFTABLE_BYTES);
    return -EFBIG;
  }

  uint64_t total = table_clusters + nblocks;
  uint64_t end = start + total;
  table = calloc (entries, sizeof *table);
  area = calloc (total, cs);
  if (!table || !area)
    return -ENOMEM;
  memcpy (table, img->reftable, img->reftable_size * sizeof *table);

  /* Place the new blocks after the table and count the area. */
  uint64_t b = 0;
  for (uint64_t idx = start >> per_block_bits;
       idx <= (end - 1) >> per_block_bits; idx++)
    if (!table[idx])
      table[idx] = (start + table_clusters + b++) << img->geo.cluster_bits;
  for (uint64_t c = start; c < end; c++) {
    uint64_t idx = c >> per_block_bits;
    uint64_t blk = table[idx] >> img->geo.cluster_bits;
    if (blk >= start && blk < end)
      refcount_entry_set (area + (blk - start) * cs, img->h.refcount_order,
                          c & ((UINT64_C (1) << per_block_bits) - 1), 1);
    else if ((r = refcount_update (img, c, 1, NULL)) < 0)
      return r;
  }
  for (uint64_t i = 0; i < entries; i++)
    be64_put (area + i * 8, table[i]);

  /* Everything the header will point at must be durable first. */
  if ((r = cache_writeback (img, img->caches.refcount)) < 0 ||
      (r = refcount_switch_table (img, area, total, start, table, entries,
                                  table_clusters, "new refcount table")) < 0)
    return r;
  table = NULL;                 /* the image's now */
  /* The header's switch is durable: nothing points at the old table,
   * so it is free at once (a free left for the next flush would leak
   * after a crash before it).
   */
  for (uint64_t c = old_offset >> img->geo.cluster_bits;
       c < (old_offset >> img->geo.cluster_bits) + old_clusters && r == 0;
       c++) {
    uint64_t rc;
    r = refcount_update (img, c, -1, &rc);
    if (r == 0 && rc == 0)
      alloc_released (img, c, 1);
  }
  return r;
}
