/* SPDX-License-Identifier: BSD-3-Clause */
/* Refcounts: the refcount table, and reading a cluster's refcount at
 * any width from 1 to 64 bits.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

#define REFTABLE_OFFSET_MASK 0xfffffffffffffe00ULL

/* The refcount table is read through a page on the stack, and only
 * its entries that are not zero are stored in the table (allocated
 * zeroed, so untouched): most of a small image's table is zeros, whose
 * pages then never fault in.  An open then takes one page fault for it,
 * not sixteen (at 64 KiB clusters); in a fleet of images opened at
 * once by new threads, each fault waited for the process's memory map
 * lock behind their stacks and arenas being mapped.
 */
#define REFTABLE_PIECE 512

/* The refcount table, read and put in host order: at open for an image
 * that may be written, at the first need (a check, the preallocation
 * probe) for a read-only one, so that a backing layer never pays for
 * it.  Then a no-op.
 */
int
refcount_load_table (struct qcow2_image *img)
{
  uint64_t n = (uint64_t) img->h.refcount_table_clusters
    * img->geo.cluster_size / 8;
  uint64_t piece[REFTABLE_PIECE];
  uint64_t *table;
  int r;

  ASSERT_LOCKED (img);
  if (img->reftable)
    return 0;
  if ((r = cache_setup_refcount (img)) < 0)
    return r;
  if (!(table = calloc (MAX (n, 1), sizeof *table)))
    return -ENOMEM;
  for (uint64_t i = 0; i < n; i += REFTABLE_PIECE) {
    uint64_t k = MIN (n - i, REFTABLE_PIECE);

    r = img->io->ops->pread (img->io, piece, k * 8,
                             img->h.refcount_table_offset + i * 8);
    if (r < 0) {
      log_error (img, "reading the refcount table (at %#" PRIx64 ") at "
                 "offset %#" PRIx64 ": %s", img->h.refcount_table_offset,
                 img->h.refcount_table_offset + i * 8, errstr (-r));
      free (table);
      return r;
    }
    be64_table_to_host (piece, k);
    for (uint64_t j = 0; j < k; j++)
      if (piece[j])
        table[i + j] = piece[j];
  }
  img->reftable = table;
  img->reftable_size = n;
  return 0;
}

/* Returns the entry index of a refcount block, at width 1 << order
 * bits.
 */
uint64_t
refcount_entry_get (const uint8_t *block, uint32_t order, uint64_t index)
{
  switch (order) {
  case 0: case 1: case 2: {
    unsigned bits = 1u << order;
    unsigned per_byte = 8 / bits;
    return (block[index / per_byte] >> (bits * (index % per_byte)))
      & ((1u << bits) - 1);
  }
  case 3: return block[index];
  case 4: return be16_get (block + index * 2);
  case 5: return be32_get (block + index * 4);
  default: return be64_get (block + index * 8);
  }
}

void
refcount_entry_set (uint8_t *block, uint32_t order, uint64_t index,
                    uint64_t value)
{
  switch (order) {
  case 0: case 1: case 2: {
    unsigned bits = 1u << order;
    unsigned per_byte = 8 / bits;
    unsigned shift = bits * (index % per_byte);
    uint8_t mask = ((1u << bits) - 1) << shift;
    block[index / per_byte] = (block[index / per_byte] & ~mask)
      | (uint8_t) (value << shift);
    break;
  }
  case 3: block[index] = value; break;
  case 4: be16_put (block + index * 2, value); break;
  case 5: be32_put (block + index * 4, value); break;
  default: be64_put (block + index * 8, value); break;
  }
}

/* The refcount block of reftable entry idx (which must be set), from
 * the cache.
 */
static int
refcount_block (struct qcow2_image *img, uint64_t idx, uint8_t **data)
  TSA_REQUIRES (img->lock)
{
  uint64_t offset = img->reftable[idx] & REFTABLE_OFFSET_MASK;

  if (offset & (img->geo.cluster_size - 1) ||
      range_exceeds (offset, img->geo.cluster_size, img->file_size))
    return io_corrupt (img, "refcount block offset %#" PRIx64 " (refcount "
                       "table entry %" PRIu64 ") is misaligned or beyond "
                       "the end of the file", offset, idx);
  return cache_get (img, img->caches.refcount, offset, data);
}

/* Make the refcount block for reftable entry idx.  No cluster in its
 * range is in use (none has a refcount), so the block goes in the first
 * one and describes itself.  Its table entry reaches the disk at flush,
 * after the block itself (see flush.c).
 */
int
refcount_new_block (struct qcow2_image *img, uint64_t idx)
{
  uint64_t per_block_bits = img->geo.cluster_bits + 3 - img->h.refcount_order;
  uint64_t offset = (idx << per_block_bits) << img->geo.cluster_bits;
  uint8_t *block;
  int r;

  ASSERT_LOCKED (img);
  if (idx >= img->reftable_size &&
      (r = alloc_grow_reftable (img, idx + 1)) < 0)
    return r;
  assert (idx < img->reftable_size);
  if (img->reftable[idx] & REFTABLE_OFFSET_MASK)
    return 0;                   /* made while growing the table */
  /* The first block's place is the header's: its refcount block cannot
   * be missing in an image that is not corrupt (QEMU refuses too).
   */
  if (offset == 0)
    return io_corrupt (img, "refcount table entry 0 is empty (the header's "
                       "cluster has no refcount): allocation refused");

  r = cache_get_new (img, img->caches.refcount, offset, &block);
  if (r < 0)
    return r;
  refcount_entry_set (block, img->h.refcount_order, 0, 1);
  r = io_write_meta (img, block, img->geo.cluster_size, offset,
                     "new refcount block", OL (REFCOUNT_BLOCK));
  if (r == 0)
    r = overlap_add (img, offset, img->geo.cluster_size,
                     QCOW2_OL_REFCOUNT_BLOCK_BIT);
  if (r < 0)
    return r;
  img->reftable[idx] = offset;
  flush_mark_reftable_dirty (img, idx);
  flush_mark_dependency (img);
  flush_mark_changed (img);
  return 0;
}

/* Add delta to the refcount of cluster, allocating the refcount block
 * if needed.  Leaving the range 0 to the width's maximum is corruption.
 */
int
refcount_update (struct qcow2_image *img, uint64_t cluster, int64_t delta,
                 uint64_t *result)
{
  uint64_t per_block_bits = img->geo.cluster_bits + 3 - img->h.refcount_order;
  uint64_t idx = cluster >> per_block_bits;
  uint64_t index = cluster & ((UINT64_C (1) << per_block_bits) - 1);
  uint64_t max = refcount_max (img);
  uint64_t value;
  uint8_t *block;
  int r;

  ASSERT_LOCKED (img);
  assert (delta != 0);
  if (idx >= img->reftable_size ||
      (img->reftable[idx] & REFTABLE_OFFSET_MASK) == 0) {
    if (delta < 0)
      return io_corrupt (img, "freeing cluster %#" PRIx64 " which has no "
                         "refcount block",
                         cluster << img->geo.cluster_bits);
    if ((r = refcount_new_block (img, idx)) < 0)
      return r;
  }
  if ((r = refcount_block (img, idx, &block)) < 0)
    return r;
  value = refcount_entry_get (block, img->h.refcount_order, index);
  if ((delta < 0 && value < (uint64_t) -delta) ||
      (delta > 0 && max - value < (uint64_t) delta))
    return io_corrupt (img, "refcount of cluster %#" PRIx64 " would go "
                       "from %" PRIu64 " out of range by %" PRId64,
                       cluster << img->geo.cluster_bits, value, delta);
  value += delta;
  assert (value <= max);
  refcount_entry_set (block, img->h.refcount_order, index, value);
  cache_mark_dirty (img, img->caches.refcount, block);
  flush_mark_changed (img);
  if (result)
    *result = value;
  return 0;
}

/* Read the refcount of cluster through the refcount cache. */
int
refcount_read (struct qcow2_image *img, uint64_t cluster, uint64_t *refcount)
{
  uint64_t per_block_bits = img->geo.cluster_bits + 3 - img->h.refcount_order;
  uint64_t idx = cluster >> per_block_bits;
  uint8_t *data;
  int r;

  if ((r = refcount_load_table (img)) < 0)
    return r;
  if (idx >= img->reftable_size ||
      (img->reftable[idx] & REFTABLE_OFFSET_MASK) == 0) {
    *refcount = 0;
    return 0;
  }
  if ((r = refcount_block (img, idx, &data)) < 0)
    return r;
  *refcount = refcount_entry_get (data, img->h.refcount_order,
                                  cluster & ((UINT64_C (1) << per_block_bits)
                                             - 1));
  return 0;
}

/* Switch to a new refcount structure: area (clusters long, at cluster
 * start) holds the new table and any new blocks; it is made durable,
 * then the header points at it.  On success the image owns table.
 */
int
refcount_switch_table (struct qcow2_image *img, const uint8_t *area,
                       uint64_t clusters, uint64_t start, uint64_t *table,
                       uint64_t entries, uint64_t table_clusters,
                       const char *what)
{
  uint64_t offset = start << img->geo.cluster_bits;
  uint8_t hdr[12];
  int r;

  if ((r = io_write_meta (img, area, clusters << img->geo.cluster_bits, offset,
                          what, 0)) < 0 ||
      (r = io_flush (img)) < 0)
    return r;
  /* The table's offset and size are adjacent fields: one write. */
  be64_put (hdr, offset);
  be32_put (hdr + (HDR_REFTABLE_CLUSTERS - HDR_REFTABLE_OFFSET), table_clusters);
  if ((r = io_write_meta (img, hdr, sizeof hdr, HDR_REFTABLE_OFFSET, "header",
                          OL (MAIN_HEADER))) < 0 ||
      (r = io_flush (img)) < 0)
    return r;
  /* The map learns of the new blocks (the table is found from the
   * header); the old structure's clusters leave it as they are freed.
   */
  for (uint64_t i = 0; i < entries; i++) {
    uint64_t b = table[i] & ~UINT64_C (511);
    if (b >= offset && b < offset + (clusters << img->geo.cluster_bits) &&
        (r = overlap_add (img, b, img->geo.cluster_size,
                          QCOW2_OL_REFCOUNT_BLOCK_BIT)) < 0)
      return r;
  }
  uint64_t old_offset = img->h.refcount_table_offset;
  uint64_t old_clusters = img->h.refcount_table_clusters;
  free (img->reftable);
  img->reftable = table;
  img->reftable_size = entries;
  img->h.refcount_table_offset = offset;
  img->h.refcount_table_clusters = table_clusters;
  flush_forget_reftable (img);
  return overlap_move_reftable (img, old_offset, old_clusters);
}

/* Whether the image was made with preallocation=metadata, decided as
 * QEMU decides it (qcow2_detect_metadata_preallocation): many more
 * clusters have a refcount than the file has space allocated.  QEMU
 * then reports holes in such data clusters as zeros, and so do we.
 */
int
refcount_detect_metadata_prealloc (struct qcow2_image *img, bool *prealloc)
{
  uint64_t real_clusters, threshold, end, count = 0;
  int64_t allocated;
  int r = 0;

  *prealloc = false;
  if (!img->io->ops->allocated)
    return 0;
  allocated = img->io->ops->allocated (img->io);
  if (allocated < 0)
    return 0;
  real_clusters = allocated / img->geo.cluster_size;
  threshold = MAX (real_clusters * 10 / 9, real_clusters + 2);
  end = div_round_up (img->file_size, img->geo.cluster_size);

  for (uint64_t i = 0; i < end && count < threshold; i++) {
    uint64_t rc;
    if ((r = refcount_read (img, i, &rc)) < 0)
      break;
    count += rc != 0;
  }
  if (r == 0)
    *prealloc = count >= threshold;
  return r;
}
