/* SPDX-License-Identifier: BSD-3-Clause */
/* Checking and repair: every cluster the image references, found by
 * walking all of its metadata, and rebuilding the refcounts from that
 * (a dirty image under lazy refcounts, or one with leaks).
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

/* Told of every reference the walk finds. */
typedef int (*check_ref_fn) (struct qcow2_image *img, void *opaque,
                             uint64_t offset, uint64_t len,
                             const char *what);

/* Every cluster referenced by the L2 tables of an L1 table, and those
 * tables themselves.  L2 entries are read through the cache, which may
 * hold changes not yet written.
 */
static int
check_walk_l1 (struct qcow2_image *img, const uint64_t *l1, uint32_t l1_size,
               check_ref_fn fn, void *opaque)
  TSA_REQUIRES (img->lock)
{
  uint64_t slice_size = cache_entry_size (img->caches.l2);
  bool external = img->data_io != img->io;
  int r;

  for (uint32_t i = 0; i < l1_size; i++) {
    uint64_t l2 = l1[i] & QCOW2_OFFSET_MASK;
    if (!l2)
      continue;
    if ((r = fn (img, opaque, l2, img->geo.cluster_size, "L2 table")) < 0)
      return r;
    for (uint64_t off = 0; off < img->geo.cluster_size; off += slice_size) {
      uint8_t *slice;
      if ((r = cache_get (img, img->caches.l2, l2 + off, &slice)) < 0)
        return r;
      for (uint64_t e = 0; e < slice_size / img->geo.l2_entry_size; e++) {
        struct l2_state s;
        l2_get (img, slice, e, &s);
        if (s.compressed) {
          uint64_t coff, clen;
          l2_compressed_range (&img->geo, s.entry, &coff, &clen);
          r = fn (img, opaque, coff & ~UINT64_C (511), (coff & 511) + clen,
                  "compressed cluster");
        }
        else if (s.host && !external)
          r = fn (img, opaque, s.host, img->geo.cluster_size,
                  "data cluster");
        if (r < 0)
          return r;
        /* The slice may have been evicted by the callback: look again. */
        if ((r = cache_get (img, img->caches.l2, l2 + off, &slice)) < 0)
          return r;
      }
    }
  }
  return 0;
}

static int
check_read (struct qcow2_image *img, void *buf, uint64_t len, uint64_t off,
            const char *what)
{
  int r;

  if (range_exceeds (off, len, img->file_size)) {
    log_error (img, "corrupt image: %s at %#" PRIx64 " (%" PRIu64 " bytes) "
               "lies beyond the end of the file", what, off, len);
    return -EIO;
  }
  r = img->io->ops->pread (img->io, buf, len, off);
  if (r < 0)
    log_error (img, "reading %s at %#" PRIx64 ": %s", what, off,
               errstr (-r));
  return r;
}

/* Reads a snapshot's L1 table from disk. */
static int
check_walk_snapshot (struct qcow2_image *img, const struct qcow2_snapshot *sn,
                     check_ref_fn fn, void *opaque)
  TSA_REQUIRES (img->lock)
{
  uint64_t bytes = (uint64_t) sn->l1_size * 8;
  CLEANUP_FREE uint64_t *l1 = NULL;
  CLEANUP_FREE uint8_t *buf = NULL;
  int r;

  if (bytes > QCOW2_MAX_L1_BYTES)
    return -EIO;
  if (sn->l1_size == 0)
    return 0;
  if ((r = fn (img, opaque, sn->l1_table_offset, bytes,
               "snapshot L1 table")) < 0)
    return r;
  l1 = malloc (bytes);
  buf = malloc (bytes);
  if (!l1 || !buf)
    return -ENOMEM;
  r = check_read (img, buf, bytes, sn->l1_table_offset, "snapshot L1 table");
  if (r < 0)
    return r;
  for (uint32_t i = 0; i < sn->l1_size; i++)
    l1[i] = be64_get (buf + (uint64_t) i * 8);
  return check_walk_l1 (img, l1, sn->l1_size, fn, opaque);
}

/* Persistent bitmaps, while the autoclear bit says they are valid: the
 * directory, each bitmap's table and its data clusters.
 */
static int
check_walk_bitmaps (struct qcow2_image *img, check_ref_fn fn, void *opaque)
  TSA_REQUIRES (img->lock)
{
  const struct qcow2_header *h = &img->h;
  struct bitmap_entry *entries;
  uint8_t *dir, *table = NULL;
  int r;

  if (!h->has_bitmaps_ext || !h->nb_bitmaps ||
      !(h->autoclear_features & QCOW2_AUTOCLEAR_BITMAPS))
    return 0;
  if ((r = bitmap_read_directory (img, &dir, &entries)) < 0)
    return r;
  r = fn (img, opaque, h->bitmap_directory_offset, h->bitmap_directory_size,
          "bitmap directory");
  for (uint32_t i = 0; r == 0 && i < h->nb_bitmaps; i++) {
    uint64_t toff = entries[i].table_offset;
    uint64_t tbytes = (uint64_t) entries[i].table_size * 8;

    if (tbytes == 0)
      continue;
    /* Before trusting the size with an allocation. */
    if (range_exceeds (toff, tbytes, img->file_size)) {
      log_error (img, "corrupt image: bitmap table at %#" PRIx64 " (%"
                 PRIu64 " bytes) lies beyond the end of the file", toff,
                 tbytes);
      r = -EIO;
      break;
    }
    if ((r = fn (img, opaque, toff, tbytes, "bitmap table")) < 0)
      break;
    free (table);
    table = malloc (tbytes);
    if (!table) {
      r = -ENOMEM;
      break;
    }
    if ((r = check_read (img, table, tbytes, toff, "bitmap table")) < 0)
      break;
    for (uint32_t j = 0; j < entries[i].table_size && r == 0; j++) {
      uint64_t data = be64_get (table + (uint64_t) j * 8) & QCOW2_OFFSET_MASK;
      if (data)
        r = fn (img, opaque, data, img->geo.cluster_size, "bitmap data");
    }
  }
  free (dir);
  free (entries);
  free (table);
  return r;
}

/* What check_walk_refs walks. */
enum check_walk {
  CHECK_WALK_ALL,
  CHECK_WALK_BUT_REFCOUNTS,     /* for a rebuild, which replaces them */
};

/* Call fn for every range of the image file that the image uses. */
static int
check_walk_refs (struct qcow2_image *img, enum check_walk what,
                 check_ref_fn fn, void *opaque)
  TSA_REQUIRES (img->lock)
{
  const struct qcow2_header *h = &img->h;
  bool with_refcounts = what == CHECK_WALK_ALL;
  int r;

  if ((r = fn (img, opaque, 0, img->geo.cluster_size, "header")) < 0)
    return r;
  if (h->l1_size &&
      (r = fn (img, opaque, h->l1_table_offset, (uint64_t) h->l1_size * 8,
               "L1 table")) < 0)
    return r;
  if ((r = check_walk_l1 (img, img->l1, img->l1_size, fn, opaque)) < 0)
    return r;
  if (with_refcounts &&
      (r = fn (img, opaque, h->refcount_table_offset,
               (uint64_t) h->refcount_table_clusters * img->geo.cluster_size,
               "refcount table")) < 0)
    return r;
  for (uint64_t i = 0; with_refcounts && i < img->reftable_size; i++) {
    uint64_t b = img->reftable[i] & ~UINT64_C (511);
    if (b && (r = fn (img, opaque, b, img->geo.cluster_size,
                      "refcount block")) < 0)
      return r;
  }
  if (img->nb_snapshots &&
      (r = fn (img, opaque, h->snapshots_offset, img->snapshot_table_bytes,
               "snapshot table")) < 0)
    return r;
  if (h->crypt_method == QCOW2_CRYPT_LUKS &&
      (r = fn (img, opaque, h->crypto_offset, h->crypto_length,
               "encryption header")) < 0)
    return r;
  for (uint32_t i = 0; i < img->nb_snapshots; i++)
    if ((r = check_walk_snapshot (img, &img->snapshots[i], fn, opaque)) < 0)
      return r;
  return check_walk_bitmaps (img, fn, opaque);
}

struct check_counts {
  uint32_t *counts;
  uint64_t n;                   /* clusters counted */
};

static int
check_count (struct qcow2_image *img, void *opaque, uint64_t offset,
             uint64_t len, const char *what)
{
  struct check_counts *cc = opaque;
  uint64_t first = offset >> img->geo.cluster_bits;
  uint64_t last;

  if (len == 0)
    return 0;
  last = (offset + len - 1) >> img->geo.cluster_bits;
  if (range_exceeds (offset, len, cc->n << img->geo.cluster_bits)) {
    log_error (img, "corrupt image: %s at %#" PRIx64 " lies beyond the end "
               "of the file: cannot rebuild the refcounts", what, offset);
    return -EIO;
  }
  for (uint64_t c = first; c <= last; c++)
    if (++cc->counts[c] == 0) {
      log_error (img, "corrupt image: cluster %#" PRIx64 " is referenced "
                 "too often", c << img->geo.cluster_bits);
      return -EIO;
    }
  return 0;
}

/* Whether refcount block idx counts anything: a referenced cluster, or
 * part of the new structure from cluster start on.
 */
static bool
check_block_used (const struct check_counts *cc, uint64_t idx,
                  uint64_t per_block_bits, uint64_t start)
{
  uint64_t lo = idx << per_block_bits;
  uint64_t hi = (idx + 1) << per_block_bits;

  if (hi > start)
    return true;
  for (uint64_t c = lo; c < hi; c++)
    if (cc->counts[c])
      return true;
  return false;
}

/* Rebuild the refcounts from what the metadata references.  The new
 * refcount table and blocks go after the end of the file, counting
 * themselves; the header then switches to them and the old structure
 * becomes free space.
 */
int
check_rebuild_refcounts (struct qcow2_image *img)
{
  uint64_t cs = img->geo.cluster_size, per_cluster = cs / 8;
  uint64_t per_block_bits = img->geo.cluster_bits + 3 - img->h.refcount_order;
  uint64_t max = img->h.refcount_order == 6 ? UINT64_MAX
    : (UINT64_C (1) << (1u << img->h.refcount_order)) - 1;
  struct check_counts cc;
  uint64_t start, tclusters = 1, nblocks = 0, end, entries = 0;
  CLEANUP_FREE uint32_t *counts = NULL;
  CLEANUP_FREE uint8_t *area = NULL;
  CLEANUP_FREE uint64_t *table = NULL;
  struct meta_cache *rc;
  int r;

  /* Dirty metadata reaches the disk first: the walk reads through the
   * caches, but the new structure must describe what is on disk.
   */
  if ((r = cache_writeback (img, img->caches.l2)) < 0)
    return r;
  cc.n = div_round_up (img->file_size, cs);
  cc.counts = counts = calloc (cc.n, sizeof *cc.counts);
  if (!cc.counts)
    return -ENOMEM;
  r = check_walk_refs (img, CHECK_WALK_BUT_REFCOUNTS, check_count, &cc);
  if (r < 0)
    return r;

  /* Size the table and the blocks, which count themselves too. */
  start = cc.n;
  for (;;) {
    end = start + tclusters + nblocks;
    uint64_t nidx = ((end - 1) >> per_block_bits) + 1, needed = 0;
    for (uint64_t idx = 0; idx < nidx; idx++)
      needed += check_block_used (&cc, idx, per_block_bits, start);
    entries = div_round_up (nidx, per_cluster) * per_cluster;
    if (entries / per_cluster == tclusters && needed == nblocks)
      break;
    tclusters = entries / per_cluster;
    nblocks = needed;
  }
  if (tclusters * cs > QCOW2_MAX_REFTABLE_BYTES)
    return -EFBIG;

  area = calloc (tclusters + nblocks, cs);
  table = calloc (entries, sizeof *table);
  if (!area || !table)
    return -ENOMEM;
  uint64_t b = 0;
  for (uint64_t idx = 0; idx < ((end - 1) >> per_block_bits) + 1; idx++)
    if (check_block_used (&cc, idx, per_block_bits, start))
      table[idx] = (start + tclusters + b++) << img->geo.cluster_bits;
  for (uint64_t c = 0; c < end; c++) {
    uint64_t count = c < cc.n ? cc.counts[c] : 1;
    if (!count)
      continue;
    if (count > max) {
      log_error (img, "cluster %#" PRIx64 " is referenced %" PRIu64 " times,"
                 " more than %u-bit refcounts hold",
                 c << img->geo.cluster_bits, count,
                 1u << img->h.refcount_order);
      return -EIO;
    }
    uint64_t blk = (table[c >> per_block_bits] >> img->geo.cluster_bits)
      - start;
    refcount_entry_set (area + blk * cs, img->h.refcount_order,
                        c & ((UINT64_C (1) << per_block_bits) - 1), count);
  }
  for (uint64_t i = 0; i < entries; i++)
    be64_put (area + i * 8, table[i]);

  /* The old structure's blocks must not linger in the cache, nor in
   * the overlap map (they become free space).
   */
  for (uint64_t i = 0; i < img->reftable_size; i++)
    if (img->reftable[i] & ~UINT64_C (511))
      overlap_remove (img, img->reftable[i] & ~UINT64_C (511), cs);
  rc = cache_create (CACHE_REFCOUNT, cs, cache_entries (img->caches.refcount));
  if (!rc)
    return -ENOMEM;
  r = refcount_switch_table (img, area, tclusters + nblocks, start, table,
                             entries, tclusters, "rebuilt refcount structure");
  if (r < 0) {
    cache_destroy (rc);
    return r;
  }
  table = NULL;                 /* the image's now */
  cache_replace_refcount (img, rc);
  alloc_forget_hint (img);
  return 0;
}

/* qemu-img check, on the image as the engine holds it. */
struct check_refs {
  uint32_t *counts;             /* references per cluster */
  uint64_t n;
  struct qcow2_check_result *res;
};

static int
check_ref (struct qcow2_image *img, void *opaque, uint64_t offset,
           uint64_t len, const char *what)
{
  struct check_refs *cr = opaque;
  uint64_t file_size = img->file_size;

  if (len == 0)
    return 0;
  /* As QEMU: what starts a cluster or more past the end of the file
   * cannot be counted.
   */
  if (offset + len > file_size &&
      offset + len - file_size >= img->geo.cluster_size) {
    log_debug (img, "check: %s at %#" PRIx64 " lies beyond the end of the "
               "file", what, offset);
    cr->res->corruptions++;
    return 0;
  }
  for (uint64_t c = offset >> img->geo.cluster_bits;
       c <= (offset + len - 1) >> img->geo.cluster_bits; c++)
    if (c < cr->n && cr->counts[c] < UINT32_MAX)
      cr->counts[c]++;
  return 0;
}

/* Whether reftable entry idx names a block that can be read. */
static bool
check_block_ok (struct qcow2_image *img, uint64_t idx)
  TSA_REQUIRES (img->lock)
{
  uint64_t b = img->reftable[idx] & ~UINT64_C (511);

  return !(b & (img->geo.cluster_size - 1)) &&
    !range_exceeds (b, img->geo.cluster_size, img->file_size);
}

/* The engine's own uses of clusters that no table shows yet: the
 * reserve, and the frees that wait for a flush.
 */
static void
check_count_pending (struct qcow2_image *img, struct check_refs *cr)
  TSA_REQUIRES (img->lock)
{
  const struct alloc_runs *runs[2] = { &img->alloc.reserve_cur,
                                       &img->alloc.reserve_next };

  for (int i = 0; i < 2; i++)
    for (size_t j = runs[i]->head; j < runs[i]->len; j++)
      for (uint64_t c = runs[i]->v[j].first; c < runs[i]->v[j].end; c++)
        if (c < cr->n)
          cr->counts[c]++;
  for (size_t i = 0; i < img->alloc.pending_len; i++)
    if (img->alloc.pending_free[i] < cr->n)
      cr->counts[img->alloc.pending_free[i]]++;
}

/* Compare every refcount with the references; with fix, lower leaked
 * refcounts to what is referenced.
 */
static int
check_compare (struct qcow2_image *img, struct check_refs *cr, bool fix)
  TSA_REQUIRES (img->lock)
{
  uint64_t per_block_bits = img->geo.cluster_bits + 3 - img->h.refcount_order;
  uint64_t nidx = MAX (img->reftable_size,
                       ((cr->n + (UINT64_C (1) << per_block_bits) - 1)
                        >> per_block_bits));
  struct qcow2_check_result *res = cr->res;
  int r;

  for (uint64_t idx = 0; idx < nidx; idx++) {
    bool has = idx < img->reftable_size &&
      (img->reftable[idx] & ~UINT64_C (511));
    uint64_t lo = idx << per_block_bits;
    uint64_t hi = lo + (UINT64_C (1) << per_block_bits);

    if (has && !check_block_ok (img, idx)) {
      log_debug (img, "check: refcount block %" PRIu64 " at %#" PRIx64
                 " is misaligned or outside the file", idx,
                 img->reftable[idx]);
      res->corruptions++;
      continue;
    }
    if (!has)
      hi = MIN (hi, cr->n);
    /* From the block itself: a whole block is scanned. */
    uint8_t *block = NULL;
    for (uint64_t c = lo; c < hi; c++) {
      uint64_t rc = 0, refs = c < cr->n ? cr->counts[c] : 0;
      if (has && !block &&
          (r = cache_get (img, img->caches.refcount,
                          img->reftable[idx] & ~UINT64_C (511),
                          &block)) < 0)
        return r;
      if (has)
        rc = refcount_entry_get (block, img->h.refcount_order, c - lo);
      if (rc < refs) {
        log_debug (img, "check: cluster %#" PRIx64 " has refcount %" PRIu64
                   " but %" PRIu64 " references", c << img->geo.cluster_bits,
                   rc, refs);
        res->corruptions++;
      }
      else if (rc > refs && !fix)
        res->leaks++;
      else if (rc > refs) {
        if ((r = refcount_update (img, c, (int64_t) (refs - rc), NULL)) < 0)
          return r;
        block = NULL;           /* the cache may have moved it */
        if (refs == 0)
          alloc_released (img, c, 1);
        res->leaks_fixed++;
      }
    }
  }
  return 0;
}

/* The COPIED flags of the active tables must say whether the refcount
 * is exactly one; table and cluster offsets must be aligned.  With fix,
 * a flag missing where a leak repair left a refcount of one is set (as
 * qemu-img check -r does), once the refcount is durable.
 */
static int
check_copied (struct qcow2_image *img, bool fix,
              struct qcow2_check_result *res)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size;
  uint64_t slice_size = cache_entry_size (img->caches.l2);
  bool external = img->data_io != img->io;
  int r;

  for (uint32_t i = 0; i < img->l1_size; i++) {
    uint64_t l2 = img->l1[i] & QCOW2_OFFSET_MASK, rc;
    if (!l2)
      continue;
    if (l2 & (cs - 1) || range_exceeds (l2, cs, img->file_size)) {
      res->corruptions++;
      continue;
    }
    if ((r = refcount_read (img, l2 >> img->geo.cluster_bits, &rc)) < 0)
      return r;
    if (fix && rc == 1 && !(img->l1[i] & QCOW2_OFLAG_COPIED)) {
      img->l1[i] |= QCOW2_OFLAG_COPIED;
      flush_mark_l1_dirty (img, i);
      flush_mark_dependency (img);
    }
    if ((rc == 1) != !!(img->l1[i] & QCOW2_OFLAG_COPIED)) {
      log_debug (img, "check: L1 entry %" PRIu32 " %#" PRIx64 ": COPIED "
                 "but refcount %" PRIu64, i, img->l1[i], rc);
      res->corruptions++;
    }
    for (uint64_t off = 0; off < cs; off += slice_size)
      for (uint64_t e = 0; e < slice_size / img->geo.l2_entry_size; e++) {
        struct l2_state s;
        uint8_t *slice;
        if ((r = cache_get (img, img->caches.l2, l2 + off, &slice)) < 0)
          return r;
        l2_get (img, slice, e, &s);
        uint64_t entry = s.entry, host = s.host;
        if (s.compressed || !host || external)
          continue;
        if (host & (cs - 1)) {
          res->corruptions++;
          continue;
        }
        if ((r = refcount_read (img, host >> img->geo.cluster_bits, &rc)) < 0)
          return r;
        if (fix && rc == 1 && !(entry & QCOW2_OFLAG_COPIED)) {
          /* The read may have evicted the slice. */
          if ((r = cache_get (img, img->caches.l2, l2 + off,
                              &slice)) < 0)
            return r;
          entry |= QCOW2_OFLAG_COPIED;
          l2_set (img, slice, e, entry, s.bitmap);
          cache_mark_dirty (img, img->caches.l2, slice);
          flush_mark_dependency (img);
          flush_mark_changed (img);
        }
        if ((rc == 1) != !!(entry & QCOW2_OFLAG_COPIED)) {
          log_debug (img, "check: L2 entry %#" PRIx64 ": COPIED but "
                     "refcount %" PRIu64, entry, rc);
          res->corruptions++;
        }
      }
  }
  return 0;
}

/* Check every reference against the refcounts, with img->lock held
 * (and data_lock exclusively): image.c's qcow2_check, after a repair's
 * first-write preparation.
 */
int
check_run (struct qcow2_image *img, bool fix_leaks,
           struct qcow2_check_result *res)
{
  struct check_refs cr = { .res = res };
  CLEANUP_FREE uint32_t *counts = NULL;
  int r;

  ASSERT_LOCKED (img);
  if ((r = refcount_load_table (img)) < 0)
    return r;
  /* Written back first: evicting a dirty L2 slice during the walk may
   * count the reserve again (flush_l2_dependencies), past cr.n.
   */
  if (img->dirty.changed && (r = flush_locked (img)) < 0)
    return r;
  /* The reserve may lie past the end of the file. */
  cr.n = div_round_up (img->file_size, img->geo.cluster_size);
  cr.n = MAX (cr.n, alloc_reserve_end (img));
  cr.counts = counts = calloc (MAX (cr.n, 1), sizeof *cr.counts);
  if (!cr.counts)
    return -ENOMEM;
  if ((r = check_walk_refs (img, CHECK_WALK_ALL, check_ref, &cr)) < 0)
    return r;
  check_count_pending (img, &cr);
  if ((r = check_compare (img, &cr, fix_leaks)) < 0 ||
      (r = check_copied (img, fix_leaks, res)) < 0)
    return r;
  if (fix_leaks && img->dirty.changed) {
    if (res->leaks_fixed)
      log_notice (img, "%" PRIu64 " leaked clusters reclaimed",
                  res->leaks_fixed);
    return flush_locked (img);
  }
  return 0;
}
