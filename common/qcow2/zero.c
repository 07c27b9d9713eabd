/* SPDX-License-Identifier: BSD-3-Clause */
/* Zeroes and trims: whole clusters through their L2 entries (zero
 * flags, or freed), whole subclusters through the bitmap of extended L2
 * entries, and what is left as zeros written through the write path.
 */
#include <errno.h>
#include <stdlib.h>

#include "checked.h"
#include "internal.h"

/* Guest data at [host, host+len) of an external data file is gone (the
 * entry now reads as zeros or the backing file).  Its space goes back
 * to the host, as QEMU passes discards down, unless keep (a zero that
 * keeps the allocation); and a raw data file, which must read as the
 * guest's disk, gets zeros: punched, else written.
 */
static int
zero_clear_external (struct qcow2_image *img, uint64_t host, uint64_t len,
                     bool keep)
{
  struct qcow2_io *io = img->data_io;
  uint8_t *zeros;
  int r;

  if (!keep && img->discard && io->ops->punch &&
      io->ops->punch (io, host, len) == 0)
    return 0;
  if (!img->data_file_raw || host >= img->size)
    return 0;
  /* A raw data file is as long as the disk. */
  len = MIN (len, img->size - host);
  if (!(zeros = calloc (1, len)))
    return -ENOMEM;
  r = io_write_checked (img, zeros, len, host);
  free (zeros);
  return r;
}

/* What zero_cluster does to a cluster. */
enum zero_cluster_how {
  ZERO_CLUSTER_KEEP,    /* reads as zeros, keeping its allocation */
  ZERO_CLUSTER_MAY_FREE, /* reads as zeros, freed or not (may_trim) */
  ZERO_CLUSTER_TRIM,    /* freed: reads as zeros, or the backing file */
};

/* Zero or trim one whole cluster through its L2 entry (ZERO_CLUSTER_TRIM
 * never frees on v2 over a backing file: qcow2_trim does nothing
 * there).  Returns 1 if the cluster needs zeros written as data instead
 * (v2 over a backing file).
 */
static int
zero_cluster (struct qcow2_image *img, uint64_t cstart,
              enum zero_cluster_how how)
  TSA_REQUIRES (img->lock)
{
  bool trim = how == ZERO_CLUSTER_TRIM;
  bool backing_shows = img->backing && cstart < img->backing->size;
  bool v3 = img->h.version >= 3;
  struct l2_state s;
  uint8_t *slice;
  uint64_t idx, entry, bitmap;
  bool keep;
  int r;

  ASSERT_LOCKED (img);
  if (!v3 && !trim && backing_shows)
    return 1;
  /* Nothing to do where there is no L2 table and nothing shows. */
  if ((r = cluster_l2_slice (img, cstart, &slice, &idx)) < 0)
    return r;
  if (!slice && (trim ? !v3 || !backing_shows : !backing_shows))
    return 0;
  if ((r = cluster_l2_slice_writable (img, cstart, &slice, &idx)) < 0)
    return r;
  l2_get (img, slice, idx, &s);

  keep = how == ZERO_CLUSTER_KEEP && s.normal && s.copied && v3;
  if (keep) {
    entry = s.host | QCOW2_OFLAG_COPIED
      | (img->geo.extended_l2 ? 0 : QCOW2_OFLAG_ZERO);
    bitmap = L2_ALL_ZERO;
  }
  else if (v3 && (!trim || backing_shows)) {
    entry = img->geo.extended_l2 ? 0 : QCOW2_OFLAG_ZERO;
    bitmap = L2_ALL_ZERO;
  }
  else
    entry = bitmap = 0;
  if (!img->geo.extended_l2)
    bitmap = 0;
  if (entry == s.entry && bitmap == s.bitmap)
    return 0;
  l2_set (img, slice, idx, entry, bitmap);
  cache_mark_dirty (img, img->caches.l2, slice);
  flush_mark_changed (img);
  if (img->data_io != img->io)
    return s.normal ? zero_clear_external (img, s.host, img->geo.cluster_size,
                                           keep) : 0;
  return keep ? 0 : write_release_old (img, &s, 0, 0);
}

/* Zero whole subclusters [offset, offset+len) of one cluster through
 * the bitmap.  Returns 1 if that cannot be done (compressed cluster).
 * keep: see zero_clear_external.
 */
static int
zero_units (struct qcow2_image *img, uint64_t offset, uint64_t len,
            bool keep)
  TSA_REQUIRES (img->lock)
{
  uint64_t in = offset & (img->geo.cluster_size - 1);
  uint64_t mask = write_unit_mask (img, in, in + len);
  struct l2_state s;
  uint8_t *slice;
  uint64_t idx, bitmap;
  int r;

  ASSERT_LOCKED (img);
  if ((r = cluster_l2_slice_writable (img, offset, &slice, &idx)) < 0)
    return r;
  l2_get (img, slice, idx, &s);
  if (s.compressed || (s.normal && !s.copied))
    return 1;
  bitmap = (s.bitmap & L2_ALL_ALLOC & ~mask) | ((s.bitmap >> 32) | mask) << 32;
  if (bitmap == s.bitmap)
    return 0;
  l2_set (img, slice, idx, s.entry, bitmap);
  cache_mark_dirty (img, img->caches.l2, slice);
  flush_mark_changed (img);
  if (img->data_io != img->io && s.normal && img->data_file_raw)
    return zero_clear_external (img, s.host + in, len, keep);
  return 0;
}

/* Returns the length of the next piece of a zero request at offset: up to the
 * cluster's end, and on an extended L2 image split at subcluster
 * boundaries, so that the whole subclusters get zero bits and only
 * partial ones at the ends are written as data (QEMU's block layer
 * splits the same way).
 */
static uint64_t
zero_piece (struct qcow2_image *img, uint64_t offset, uint64_t count)
{
  uint64_t cs = img->geo.cluster_size, sub = img->geo.subcluster_size;
  uint64_t n = MIN (count, cs - (offset & (cs - 1)));

  assert (count > 0);
  if (!img->geo.extended_l2 || n == cs)
    return n;
  if (offset & (sub - 1))
    return MIN (n, sub - (offset & (sub - 1)));
  if (n > sub)
    return n & ~(sub - 1);
  return n;
}

/* How one piece of a zero request is done (ZERO_WHOLE: a part of a
 * cluster, the whole made a zero cluster).
 */
enum zero_how { ZERO_NOTHING, ZERO_METADATA, ZERO_WHOLE, ZERO_UNITS,
                ZERO_DATA };

static int
zero_plan (struct qcow2_image *img, uint64_t offset, uint64_t n,
           enum zero_how *how)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size, in = offset & (cs - 1);
  bool zero;
  int r;

  if ((r = write_reads_zero (img, offset, n, &zero)) < 0)
    return r;
  if (zero)
    *how = ZERO_NOTHING;
  else if (n == cs)
    *how = img->h.version >= 3 || !img->backing ||
      offset >= img->backing->size ? ZERO_METADATA : ZERO_DATA;
  else if (img->geo.extended_l2 &&
           !((in | n) & (img->geo.subcluster_size - 1)))
    *how = ZERO_UNITS;
  else if (img->h.version >= 3 && !img->geo.extended_l2) {
    /* Over a backing file showing zeros, QEMU makes a zero cluster. */
    if ((r = write_shows_zero (img, offset - in,
                               MIN (cs, img->size - (offset - in)),
                               &zero)) < 0)
      return r;
    *how = zero ? ZERO_WHOLE : ZERO_DATA;
  }
  else
    *how = ZERO_DATA;
  return 0;
}

/* Zeros as data, through the write path. */
static int
zero_as_data (struct qcow2_image *img, uint64_t offset, uint64_t n)
  TSA_REQUIRES (img->lock)
{
  uint8_t *zeros = calloc (1, n);
  uint64_t host;
  int r;

  if (!zeros)
    return -ENOMEM;
  r = write_in_place_target (img, offset, n, &host);
  if (r == 1)
    r = io_write_data (img, zeros, n, host);
  else if (r == 0)
    r = write_allocating (img, zeros, offset, n);
  free (zeros);
  return r;
}

static uint64_t
zero_piece_len (struct qcow2_image *img, uint64_t offset, uint64_t count)
{
  return zero_piece (img, offset, count);
}

static int
zero_piece_unlocks (struct qcow2_image *img,
                    const struct write_request *req,
                    uint64_t offset, uint64_t count, uint64_t *n)
  TSA_RELEASE (img->lock)
{
  bool may_trim = *(const bool *) req->opaque;
  enum zero_how how;
  int r = zero_plan (img, offset, *n, &how);

  if (r == 0 && how == ZERO_METADATA)
    r = zero_cluster (img, offset, may_trim ? ZERO_CLUSTER_MAY_FREE
                                            : ZERO_CLUSTER_KEEP);
  else if (r == 0 && how == ZERO_WHOLE)
    r = zero_cluster (img, offset & ~(img->geo.cluster_size - 1),
                      ZERO_CLUSTER_KEEP);
  else if (r == 0 && how == ZERO_UNITS)
    r = zero_units (img, offset, *n, !may_trim);
  if (r == 1 || (r == 0 && how == ZERO_DATA))
    r = zero_as_data (img, offset, *n);
  image_unlock (img);
  return r;
}

int
qcow2_zero (struct qcow2_image *img, uint64_t count, uint64_t offset,
            bool may_trim, bool fast, bool fua)
{
  const struct write_request req = {
    .offset = offset, .count = count, .record = true, .fua = fua,
    .piece_len = zero_piece_len, .piece_unlocks = zero_piece_unlocks,
    .opaque = &may_trim,
  };
  int r;

  if ((r = write_check (img, count, offset)) < 0)
    return r;

  /* A fast zero fails at once if any piece would need data written. */
  if (fast) {
    image_lock (img);
    for (uint64_t off = offset, left = count; left > 0 && r == 0; ) {
      uint64_t n = zero_piece (img, off, left);
      enum zero_how how;
      r = zero_plan (img, off, n, &how);
      if (r == 0 && how == ZERO_DATA)
        r = -ENOTSUP;
      off += n;
      left -= n;
    }
    image_unlock (img);
    if (r < 0)
      return r;
  }
  return write_request (img, &req);
}

static uint64_t
zero_cluster_len (struct qcow2_image *img, uint64_t offset, uint64_t count)
{
  return img->geo.cluster_size;
}

static int
zero_trim_piece_unlocks (struct qcow2_image *img,
                         const struct write_request *req,
                         uint64_t offset, uint64_t count, uint64_t *n)
  TSA_RELEASE (img->lock)
{
  int r = zero_cluster (img, offset, ZERO_CLUSTER_TRIM);

  image_unlock (img);
  return r;
}

int
qcow2_trim (struct qcow2_image *img, uint64_t count, uint64_t offset,
            bool fua)
{
  uint64_t cs = img->geo.cluster_size;
  uint64_t first = (offset + cs - 1) & ~(cs - 1);
  uint64_t end = (offset + count) & ~(cs - 1);
  bool keep;
  int r;

  if ((r = write_check (img, count, offset)) < 0)
    return r;
  if (!img->discard)
    return 0;
  /* Recorded even where nothing changes, as QEMU records a discard. */
  bitmap_record (img, offset, count);
  /* A version 2 image has no zero flag: a discarded cluster would read
   * its backing file's stale data again, so, as QEMU (since 5.0), trim
   * keeps the data.  (The backing chain is read under the lock: a
   * stream's detach may change it.)
   */
  image_lock (img);
  keep = img->h.version < 3 && img->backing;
  image_unlock (img);
  if (keep)
    return 0;
  /* The last cluster of the disk may be partial: trimming to the end of
   * the disk covers it.
   */
  if (offset + count == img->size)
    end = (img->size + cs - 1) & ~(cs - 1);

  /* Whole clusters only. */
  const struct write_request req = {
    .offset = first, .count = end > first ? end - first : 0, .fua = fua,
    .piece_len = zero_cluster_len,
    .piece_unlocks = zero_trim_piece_unlocks,
  };
  return write_request (img, &req);
}
