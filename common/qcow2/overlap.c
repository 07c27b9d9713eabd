/* SPDX-License-Identifier: BSD-3-Clause */
/* The overlap guard: before every write, a check against a map of where
 * the image's metadata lives in the host file (overlap-map.h), so that
 * a bug or a corrupt image can never make a write land on metadata it
 * is not meant to touch; a hit refuses the write and marks the image
 * corrupt.  A write is checked once for its whole range.  Most writes
 * need no lookup: those past the highest metadata ever mapped (a
 * growing file's), and those in the run of clusters known to hold no
 * metadata that the last range check or the growth left.
 *
 * Called with img->lock held.
 */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

/* Each structure's name in messages, and in overlap-check.NAME. */
static const struct {
  const char *name, *option;
} overlap_names[] = {
  [QCOW2_OL_MAIN_HEADER_BIT] = { "main header", "main-header" },
  [QCOW2_OL_ACTIVE_L1_BIT] = { "active L1 table", "active-l1" },
  [QCOW2_OL_ACTIVE_L2_BIT] = { "active L2 table", "active-l2" },
  [QCOW2_OL_REFCOUNT_TABLE_BIT] = { "refcount table", "refcount-table" },
  [QCOW2_OL_REFCOUNT_BLOCK_BIT] = { "refcount block", "refcount-block" },
  [QCOW2_OL_SNAPSHOT_TABLE_BIT] = { "snapshot table", "snapshot-table" },
  [QCOW2_OL_INACTIVE_L1_BIT] = { "inactive L1 table", "inactive-l1" },
  [QCOW2_OL_INACTIVE_L2_BIT] = { "inactive L2 table", "inactive-l2" },
  [QCOW2_OL_BITMAP_DIRECTORY_BIT] = { "bitmap directory",
                                      "bitmap-directory" },
  [QCOW2_OL_CRYPTO_HEADER_BIT] = { "encryption header (LUKS)",
                                   "crypto-header" },
};

const char *
overlap_name (unsigned bit)
{
  return bit < QCOW2_OL_MAX_BITS ? overlap_names[bit].name : "?";
}

static int
overlap_set_range (struct qcow2_image *img, uint64_t offset, uint64_t len,
                   unsigned value)
  TSA_REQUIRES (img->lock)
{
  if (img->overlap == &overlap_map_empty || len == 0)
    return 0;
  return overlap_map_set (img->overlap, offset >> img->geo.cluster_bits,
                          ((offset + len - 1) >> img->geo.cluster_bits)
                          - (offset >> img->geo.cluster_bits) + 1, value);
}

/* Record that [offset, offset+len) holds metadata of type bit. */
int
overlap_add (struct qcow2_image *img, uint64_t offset, uint64_t len,
             unsigned bit)
{
  assert (bit < QCOW2_OL_MAX_BITS);
  return overlap_set_range (img, offset, len, bit + 1);
}

/* The structures the header locates: they stay where the header says,
 * whatever the refcounts say.
 */
#define OVERLAP_FIXED (OL (MAIN_HEADER) | OL (ACTIVE_L1) | \
                       OL (REFCOUNT_TABLE) | OL (SNAPSHOT_TABLE) | \
                       OL (CRYPTO_HEADER))

/* Clusters freed: whatever metadata they held is gone, except for the
 * structures the header locates.  (In a corrupt image a cluster of the
 * L1 table may also be counted as data, and freed as such; unmapping it
 * would let the next allocation land on the table.)
 */
int
overlap_remove (struct qcow2_image *img, uint64_t offset, uint64_t len)
{
  struct overlap_map *m = img->overlap;
  uint64_t first, last, c;
  unsigned type;
  int r;

  if (m == &overlap_map_empty || len == 0)
    return 0;
  first = offset >> img->geo.cluster_bits;
  last = (offset + len - 1) >> img->geo.cluster_bits;
  for (c = overlap_map_next (m, first, last + 1, &type); c <= last;
       c = overlap_map_next (m, c + 1, last + 1, &type))
    if (!(OVERLAP_FIXED & (UINT32_C (1) << (type - 1))) &&
        (r = overlap_map_set (m, c, 1, 0)) < 0)
      return r;
  return 0;
}

/* The lookup of overlap_check, out of line so that the common cases
 * need no stack frame.
 */
static int __attribute__ ((noinline))
overlap_check_map (struct qcow2_image *img, uint64_t offset, uint64_t len,
                   uint32_t checked, struct overlap_hit *hit)
  TSA_REQUIRES (img->lock)
{
  unsigned type;
  uint64_t c;

  if (!checked || len == 0)
    return 0;
  c = overlap_map_find (img->overlap, offset >> img->geo.cluster_bits,
                        (offset + len - 1) >> img->geo.cluster_bits,
                        checked, &type);

  if (c == UINT64_MAX)
    return 0;
  /* Nothing but the mark is written again; hostio.c writes the mark to
   * the header, then says what the write would have destroyed.
   */
  image_set_incompat (img, QCOW2_INCOMPAT_CORRUPT);
  *hit = (struct overlap_hit) { type - 1, c << img->geo.cluster_bits };
  return -EIO;
}

/* Before a write of [offset, offset+len) that may touch only the
 * structures in the mask ign.  Returns 0, or -EIO after marking the image
 * corrupt in memory (the write must not happen), what it would have
 * overwritten in *hit.
 */
int
overlap_check (struct qcow2_image *img, uint64_t offset, uint64_t len,
               uint32_t ign, struct overlap_hit *hit)
{
  const struct overlap_map *m = img->overlap;
  uint64_t first;
  uint32_t checked;

  /* The common cases are answered here, with no call.  New clusters of
   * a growing file first: they lie past all metadata (and with no
   * guard, end is 0).
   */
  if (offset >= m->end)
    return 0;
  checked = img->overlap_mask & ~ign;
  if (!ign) {
    /* Guest data, in a run known free. */
    if (offset >= m->free_lo && offset + len <= m->free_hi)
      return 0;
  }
  else if ((first = offset >> img->geo.cluster_bits) ==
           (offset + len - 1) >> img->geo.cluster_bits) {
    /* A cluster of a structure written back where it is (len 0 ends
     * in overlap_check_map).
     */
    if (!overlap_map_type_in (m, first, checked, true))
      return 0;
  }
  return overlap_check_map (img, offset, len, checked, hit);
}

int64_t
qcow2_overlap_mode (const char *mode)
{
  if (strcmp (mode, "none") == 0)
    return 0;
  if (strcmp (mode, "constant") == 0)
    return QCOW2_OL_CONSTANT;
  if (strcmp (mode, "cached") == 0)
    return QCOW2_OL_CACHED;
  if (strcmp (mode, "all") == 0)
    return QCOW2_OL_ALL;
  return -1;
}

int
qcow2_overlap_structure (const char *name)
{
  for (int i = 0; i < QCOW2_OL_MAX_BITS; i++)
    if (strcmp (name, overlap_names[i].option) == 0)
      return i;
  return -1;
}

/* At open, tables found in the image are mapped only where they lie in
 * the file: a corrupt entry pointing far away is reported when it is
 * used, not mapped at any cost.
 */
int
overlap_add_found (struct qcow2_image *img, uint64_t offset, uint64_t len,
                   unsigned bit)
{
  if (len == 0 || range_exceeds (offset, len, img->file_size))
    return 0;
  /* Two structures in one cluster: writing either would destroy the
   * other, so the image is not written at all.  (A table used by the
   * active L1 and by snapshots is legitimately both.)
   */
  for (uint64_t c = offset >> img->geo.cluster_bits;
       c <= (offset + len - 1) >> img->geo.cluster_bits &&
         !img->overlap_conflict;
       c++) {
    int other = (int) overlap_map_type_at (img->overlap, c) - 1;
    bool l2s = (other == QCOW2_OL_ACTIVE_L2_BIT ||
                other == QCOW2_OL_INACTIVE_L2_BIT) &&
               (bit == QCOW2_OL_ACTIVE_L2_BIT ||
                bit == QCOW2_OL_INACTIVE_L2_BIT);
    if (other >= 0 && other != (int) bit && !l2s) {
      snprintf (img->overlap_conflict_msg, sizeof img->overlap_conflict_msg,
                "metadata structures overlap at %#" PRIx64 ": %s and %s",
                c << img->geo.cluster_bits, overlap_name (bit),
                overlap_name (other));
      img->overlap_conflict = true;
    }
  }
  return overlap_add (img, offset, len, bit);
}

static int
overlap_add_l1 (struct qcow2_image *img, const uint64_t *l1, uint32_t n,
                unsigned bit)
  TSA_REQUIRES (img->lock)
{
  int r = 0;

  for (uint32_t i = 0; i < n && r == 0; i++)
    if (l1[i] & QCOW2_OFFSET_MASK)
      r = overlap_add_found (img, l1[i] & QCOW2_OFFSET_MASK,
                             img->geo.cluster_size, bit);
  return r;
}

/* The refcount table moved (refcount_switch_table). */
int
overlap_move_reftable (struct qcow2_image *img, uint64_t old_offset,
                       uint64_t old_clusters)
{
  int r = overlap_set_range (img, old_offset,
                             old_clusters << img->geo.cluster_bits, 0);

  return r ? r : overlap_add (img, img->h.refcount_table_offset,
                              (uint64_t) img->h.refcount_table_clusters
                              << img->geo.cluster_bits,
                              QCOW2_OL_REFCOUNT_TABLE_BIT);
}

/* The map of every structure of img, in img->overlap (made there). */
static int
overlap_build_map (struct qcow2_image *img)
  TSA_REQUIRES (img->lock)
{
  const struct qcow2_header *h = &img->h;
  int r;

  if ((r = overlap_add_found (img, 0, img->geo.cluster_size,
                              QCOW2_OL_MAIN_HEADER_BIT)) < 0 ||
      (r = overlap_add_found (img, h->l1_table_offset,
                              (uint64_t) h->l1_size * 8,
                              QCOW2_OL_ACTIVE_L1_BIT)) < 0 ||
      (r = overlap_add_found (img, h->refcount_table_offset,
                              (uint64_t) h->refcount_table_clusters
                              << img->geo.cluster_bits,
                              QCOW2_OL_REFCOUNT_TABLE_BIT)) < 0 ||
      (img->nb_snapshots &&
       (r = overlap_add_found (img, h->snapshots_offset,
                               img->snapshot_table_bytes,
                               QCOW2_OL_SNAPSHOT_TABLE_BIT)) < 0) ||
      (h->crypt_method == QCOW2_CRYPT_LUKS &&
       (r = overlap_add_found (img, h->crypto_offset, h->crypto_length,
                               QCOW2_OL_CRYPTO_HEADER_BIT)) < 0))
    return r;
  for (uint64_t i = 0; i < img->reftable_size; i++) {
    uint64_t b = img->reftable[i] & ~UINT64_C (511);
    if (b && (r = overlap_add_found (img, b, img->geo.cluster_size,
                                     QCOW2_OL_REFCOUNT_BLOCK_BIT)) < 0)
      return r;
  }
  for (uint32_t s = 0; s < img->nb_snapshots; s++) {
    const struct qcow2_snapshot *sn = &img->snapshots[s];
    uint64_t bytes = (uint64_t) sn->l1_size * 8;
    if ((r = overlap_add_found (img, sn->l1_table_offset, bytes,
                                QCOW2_OL_INACTIVE_L1_BIT)) < 0)
      return r;
    if (!(img->overlap_mask & OL (INACTIVE_L2)) || !bytes ||
        bytes > QCOW2_MAX_L1_BYTES ||
        range_exceeds (sn->l1_table_offset, bytes, img->file_size))
      continue;
    uint8_t *buf = malloc (bytes);
    uint64_t *l1 = malloc (bytes);
    r = buf && l1 ? img->io->ops->pread (img->io, buf, bytes,
                                         sn->l1_table_offset) : -ENOMEM;
    for (uint32_t i = 0; r == 0 && i < sn->l1_size; i++)
      l1[i] = be64_get (buf + (uint64_t) i * 8);
    if (r == 0)
      r = overlap_add_l1 (img, l1, sn->l1_size, QCOW2_OL_INACTIVE_L2_BIT);
    free (buf);
    free (l1);
    if (r < 0)
      return r;
  }
  /* Active after inactive: a table both use is active. */
  if ((r = overlap_add_l1 (img, img->l1, img->l1_size,
                           QCOW2_OL_ACTIVE_L2_BIT)) < 0)
    return r;
  if (h->has_bitmaps_ext && h->nb_bitmaps &&
      (h->autoclear_features & QCOW2_AUTOCLEAR_BITMAPS) &&
      (r = overlap_add_found (img, h->bitmap_directory_offset,
                              h->bitmap_directory_size,
                              QCOW2_OL_BITMAP_DIRECTORY_BIT)) < 0)
    return r;
  return overlap_map_compact (img->overlap);
}

/* Map the metadata of a writable image before its first write (see
 * state_prepare_writes): every structure, so that one lookup answers
 * for all; the mask decides which are checked.  Inactive L2 tables
 * need every snapshot's L1 table read, so only when they are checked.
 * Once made, a no-op; a failure leaves no map.
 */
int
overlap_build (struct qcow2_image *img)
{
  int r;

  if (!img->overlap_mask || img->overlap != &overlap_map_empty)
    return 0;
  if (!(img->overlap = overlap_map_create (img->geo.cluster_bits))) {
    img->overlap = &overlap_map_empty;
    return -ENOMEM;
  }
  if ((r = overlap_build_map (img)) < 0) {
    overlap_map_destroy (img->overlap);
    img->overlap = &overlap_map_empty;
  }
  return r;
}
