/* SPDX-License-Identifier: BSD-3-Clause */
/* Cluster mapping: from a guest offset, through the L1 table and the
 * cached L2 slices, to what the guest range is stored as.
 *
 * Called with img->lock held (cluster_map_may_unlock may release it for a
 * while).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

/* Load an L1 table (the active one or a snapshot's) into memory: read
 * into place and byte-swapped there, so that the largest tables (32
 * MiB) cost one copy at open, as in QEMU.
 */
int
l1_load (struct qcow2_image *img, uint64_t offset, uint32_t size,
         const char *what)
{
  uint64_t bytes = (uint64_t) size * 8;
  int r;

  free (img->l1);
  img->l1 = NULL;
  img->l1_size = size;
  if (size == 0)
    return 0;
  if (offset & (img->geo.cluster_size - 1) ||
      range_exceeds (offset, bytes, img->file_size)) {
    log_error (img, "%s at %#" PRIx64 " (%" PRIu32 " entries) is misaligned "
               "or beyond the end of the file", what, offset, size);
    return -EINVAL;
  }
  if (!(img->l1 = malloc (bytes)))
    return -ENOMEM;
  r = img->io->ops->pread (img->io, img->l1, bytes, offset);
  if (r < 0) {
    log_error (img, "reading %s at %#" PRIx64 ": %s", what, offset,
               errstr (-r));
    return r;
  }
  be64_table_to_host (img->l1, size);
  return 0;
}

static int
cluster_corrupt (struct qcow2_image *img, const char *what, uint64_t value,
                 uint64_t guest)
  TSA_REQUIRES (img->lock)
{
  return io_corrupt (img, "%s %#" PRIx64 " (mapping guest offset %#" PRIx64
                     ")", what, value, guest);
}

/* Classify the (sub)cluster at guest offset pos from its L2 entry. */
static int
cluster_classify (struct qcow2_image *img, const struct l2_state *s,
                  uint64_t pos, struct qcow2_run *piece)
  TSA_REQUIRES (img->lock)
{
  uint64_t in_cluster = pos & (img->geo.cluster_size - 1);
  uint64_t host = s->host;

  if (s->compressed) {
    if (img->data_io != img->io)
      return cluster_corrupt (img, "compressed cluster in an image with an "
                              "external data file, L2 entry", s->entry, pos);
    piece->kind = RUN_COMPRESSED;
    l2_compressed_range (&img->geo, s->entry, &piece->comp_offset,
                         &piece->comp_size);
    return 0;
  }

  if (!img->geo.extended_l2) {
    if (s->zero_flag)
      piece->kind = RUN_ZERO;
    else
      piece->kind = s->normal ? RUN_DATA : RUN_UNALLOCATED;
  }
  else {
    unsigned sc = in_cluster >> img->geo.subcluster_bits;
    uint64_t alloc = s->bitmap & L2_ALL_ALLOC, zero = s->bitmap >> 32;

    if ((s->normal && (alloc & zero)) || (!s->normal && alloc))
      return cluster_corrupt (img, "invalid subcluster bitmap", s->bitmap,
                              pos);
    if (zero & (UINT64_C (1) << sc))
      piece->kind = RUN_ZERO;
    else if (alloc & (UINT64_C (1) << sc))
      piece->kind = RUN_DATA;
    else
      piece->kind = RUN_UNALLOCATED;
  }

  /* As QEMU, an unaligned host offset is corruption even where the
   * (sub)cluster reads as zeros.
   */
  if (host & (img->geo.cluster_size - 1))
    return cluster_corrupt (img, "unaligned data cluster offset", host, pos);
  if (piece->kind == RUN_DATA) {
    piece->host_offset = host + in_cluster;
    piece->copied = s->copied;
  }
  return 0;
}

/* Map guest [offset, offset+max_len) as far as the first change of
 * kind (or host discontinuity), never past the end of the L2 slice
 * that holds offset.  run->length is at least 1.  With unlocked, a
 * slice missing from the cache is read with img->lock released.
 */
static int
cluster_map_common (struct qcow2_image *img, uint64_t offset,
                    uint64_t max_len, struct qcow2_run *run, bool unlocked)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size;
  uint64_t l2_span_bits = img->geo.cluster_bits + img->geo.l2_bits;
  uint64_t l1_index = offset >> l2_span_bits;
  uint64_t slice_entries =
    cache_entry_size (img->caches.l2) / img->geo.l2_entry_size;
  uint64_t cluster = offset >> img->geo.cluster_bits;
  uint64_t l2_index = cluster & ((UINT64_C (1) << img->geo.l2_bits) - 1);
  uint64_t first = l2_index & ~(slice_entries - 1);
  uint64_t slice_end = (cluster - (l2_index - first) + slice_entries)
    << img->geo.cluster_bits;
  uint64_t end = offset + MIN (max_len, slice_end - offset);
  uint64_t l2_offset, pos;
  uint8_t *slice;
  int r;

  ASSERT_LOCKED (img);
 again:
  memset (run, 0, sizeof *run);
  l2_offset = l1_index < img->l1_size ? img->l1[l1_index] & QCOW2_OFFSET_MASK
    : 0;
  if (l2_offset & (cs - 1))
    return cluster_corrupt (img, "unaligned L2 table offset", l2_offset,
                            offset);
  /* No L2 table: the whole span of the table is unallocated.  So is a
   * table past the end of a file cut short, which reads as zeros in
   * QEMU (a write there is refused: see cluster_l2_table); one cut in
   * the middle reads as zeros where it is cut.
   */
  if (l2_offset == 0 || l2_offset >= img->file_size) {
    uint64_t span_end = (l1_index + 1) << l2_span_bits;
    run->kind = RUN_UNALLOCATED;
    run->length = MIN (max_len, span_end - offset);
    return 0;
  }

  if (unlocked) {
    bool released;
    r = cache_get_may_unlock (img, img->caches.l2,
                              l2_offset + first * img->geo.l2_entry_size,
                              &slice, &released);
    /* While the lock was released, the L1 entry may have changed. */
    if (r == 0 && released &&
        (l1_index >= img->l1_size ||
         (img->l1[l1_index] & QCOW2_OFFSET_MASK) != l2_offset))
      goto again;
  }
  else
    r = cache_get (img, img->caches.l2,
                   l2_offset + first * img->geo.l2_entry_size, &slice);
  if (r < 0)
    return r;

  for (pos = offset; pos < end; ) {
    uint64_t idx = (pos >> img->geo.cluster_bits)
      - (cluster - (l2_index - first));
    struct qcow2_run piece = { .length = 0 };
    struct l2_state s;
    uint64_t piece_end;

    l2_get (img, slice, idx, &s);
    r = cluster_classify (img, &s, pos, &piece);
    if (r < 0)
      return r;
    if (piece.kind == RUN_COMPRESSED || !img->geo.extended_l2)
      piece_end = (pos | (cs - 1)) + 1;
    else
      piece_end = (pos | (img->geo.subcluster_size - 1)) + 1;
    piece_end = MIN (piece_end, end);

    if (pos == offset)
      *run = piece;
    else if (piece.kind != run->kind || piece.kind == RUN_COMPRESSED ||
             (piece.kind == RUN_DATA &&
              (piece.host_offset != run->host_offset + run->length ||
               piece.copied != run->copied)))
      break;
    run->length += piece_end - pos;
    pos = piece_end;
    if (run->kind == RUN_COMPRESSED)
      break;
  }
  return 0;
}

int
cluster_map (struct qcow2_image *img, uint64_t offset, uint64_t max_len,
             struct qcow2_run *run)
{
  return cluster_map_common (img, offset, max_len, run, false);
}

/* For reads: the lock may be released while a slice is read, so that
 * concurrent requests go on (see cache_get_may_unlock).
 */
int
cluster_map_may_unlock (struct qcow2_image *img, uint64_t offset,
                        uint64_t max_len, struct qcow2_run *run)
{
  return cluster_map_common (img, offset, max_len, run, true);
}

/* A data cluster in the image file itself written in place must start
 * inside the file.  (Reads need not ask: past the end of the file
 * reads as zeros, as in QEMU, for a file cut short.)
 */
int
cluster_check_data_offset (struct qcow2_image *img, uint64_t host_offset,
                           uint64_t len)
{
  uint64_t cluster = host_offset & ~(img->geo.cluster_size - 1);

  if (img->data_io == img->io && cluster >= img->file_size)
    return io_corrupt (img, "data at host offset %#" PRIx64 " (%" PRIu64
                       " bytes) lies beyond the end of the file (the file "
                       "ends at %#" PRIx64 ")", host_offset, len,
                       img->file_size);
  return 0;
}

/* Copy the L2 table at old (shared with a snapshot) into the new
 * cluster at new, through the cache so that unwritten changes come too.
 */
static int
cluster_copy_l2 (struct qcow2_image *img, uint64_t old, uint64_t new)
  TSA_REQUIRES (img->lock)
{
  uint64_t slice_size = cache_entry_size (img->caches.l2);
  uint8_t *buf = malloc (img->geo.cluster_size);
  uint8_t *slice;
  int r = 0;

  if (!buf)
    return -ENOMEM;
  for (uint64_t off = 0; off < img->geo.cluster_size && r == 0;
       off += slice_size) {
    r = cache_get (img, img->caches.l2, old + off, &slice);
    if (r == 0)
      memcpy (buf + off, slice, slice_size);
  }
  if (r == 0)
    r = io_write_meta (img, buf, img->geo.cluster_size, new, "copied L2 table",
                       OL (ACTIVE_L2));
  free (buf);
  return r;
}

/* The L1 index of guest offset and the L2 table it points at (0: none),
 * checked to be aligned and inside the file.
 */
static inline __attribute__ ((always_inline)) int
cluster_l2_table (struct qcow2_image *img, uint64_t offset,
                  uint64_t *l1_index, uint64_t *l2_offset)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size;

  *l1_index = offset >> (img->geo.cluster_bits + img->geo.l2_bits);
  *l2_offset = 0;
  if (*l1_index >= img->l1_size)
    return cluster_corrupt (img, "guest offset beyond the L1 table at",
                            offset, offset);
  *l2_offset = img->l1[*l1_index] & QCOW2_OFFSET_MASK;
  if (*l2_offset & (cs - 1))
    return cluster_corrupt (img, "unaligned L2 table offset", *l2_offset,
                            offset);
  if (*l2_offset && range_exceeds (*l2_offset, cs, img->file_size))
    return cluster_corrupt (img, "L2 table beyond the end of the file at",
                            *l2_offset, offset);
  return 0;
}

/* The slice of the L2 table at l2_offset that holds guest offset's
 * entry, and the entry's index in it; zeros if fresh (a new table).
 */
static inline __attribute__ ((always_inline)) int
cluster_l2_get (struct qcow2_image *img, uint64_t l2_offset,
                uint64_t offset, bool fresh, uint8_t **slice,
                uint64_t *index)
  TSA_REQUIRES (img->lock)
{
  uint64_t slice_size = cache_entry_size (img->caches.l2);
  uint64_t l2_index = (offset >> img->geo.cluster_bits)
    & ((UINT64_C (1) << img->geo.l2_bits) - 1);
  uint64_t in_table = l2_index * img->geo.l2_entry_size;
  uint64_t at = l2_offset + (in_table & ~(slice_size - 1));
  int r;

  /* Checked by cluster_l2_table, or a cluster just allocated (even
   * cluster 0, which a corrupt image's refcounts may say is free: the
   * overlap guard refuses the write).
   */
  assert (!(l2_offset & (img->geo.cluster_size - 1)));
  r = fresh ? cache_get_new (img, img->caches.l2, at, slice)
            : cache_get (img, img->caches.l2, at, slice);
  if (r < 0)
    return r;
  *index = (in_table & (slice_size - 1)) / img->geo.l2_entry_size;
  return 0;
}

/* The L2 slice mapping guest offset, and the index of its entry in the
 * slice; *slice is NULL if there is no L2 table.
 */
int
cluster_l2_slice (struct qcow2_image *img, uint64_t offset,
                  uint8_t **slice, uint64_t *index)
{
  uint64_t l1_index, l2_offset;
  int r;

  ASSERT_LOCKED (img);
  if ((r = cluster_l2_table (img, offset, &l1_index, &l2_offset)) < 0)
    return r;
  if (l2_offset == 0) {
    *slice = NULL;
    return 0;
  }
  return cluster_l2_get (img, l2_offset, offset, false, slice, index);
}

/* As cluster_l2_slice, for a write: an L2 table is allocated where there
 * is none, and a table shared with a snapshot is copied first (COW of
 * metadata).
 */
int
cluster_l2_slice_writable (struct qcow2_image *img, uint64_t offset,
                           uint8_t **slice, uint64_t *index)
{
  uint64_t cs = img->geo.cluster_size;
  uint64_t l1_index, l2_offset, new_offset;
  bool fresh = false, zeroed;
  int r;

  ASSERT_LOCKED (img);
  if ((r = cluster_l2_table (img, offset, &l1_index, &l2_offset)) < 0)
    return r;
  if (l2_offset && (img->l1[l1_index] & QCOW2_OFLAG_COPIED))
    return cluster_l2_get (img, l2_offset, offset, false, slice, index);

  r = alloc_clusters (img, 1, &new_offset, &zeroed);
  if (r < 0)
    return r;
  if (l2_offset == 0) {
    /* The table must read as zeros on disk before L1 points at it. */
    uint8_t *zeros = calloc (1, cs);
    r = zeros ? io_write_meta (img, zeros, cs, new_offset, "new L2 table",
                               OL (ACTIVE_L2))
              : -ENOMEM;
    free (zeros);
    fresh = true;
  }
  else {
    r = cluster_copy_l2 (img, l2_offset, new_offset);
    if (r == 0)
      r = alloc_free_later (img, l2_offset, cs);
  }
  if (r < 0) {
    alloc_clusters_unused (img, new_offset, 1);
    return r;
  }
  /* The map learns of the new table; a copied one stays in use by a
   * snapshot.
   */
  if ((r = overlap_add (img, new_offset, cs, QCOW2_OL_ACTIVE_L2_BIT)) < 0 ||
      (!fresh && (r = overlap_add (img, l2_offset, cs,
                                   QCOW2_OL_INACTIVE_L2_BIT)) < 0))
    return r;
  img->l1[l1_index] = new_offset | QCOW2_OFLAG_COPIED;
  flush_mark_l1_dirty (img, l1_index);
  flush_mark_dependency (img);
  return cluster_l2_get (img, new_offset, offset, fresh, slice, index);
}
