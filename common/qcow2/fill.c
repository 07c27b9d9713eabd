/* SPDX-License-Identifier: BSD-3-Clause */
/* Copy-on-read (qcow2_fill, and reads with copy_on_read): clusters the
 * image allocates nothing of, filled with what the backing file holds
 * there, so that they are read from the image from then on.
 *
 * A fill never changes what the guest reads, so it may lose every race:
 * it claims a run of unallocated clusters as an allocating write does
 * (write-alloc.c's in-flight list, which writes, zeroes and trims wait
 * for), and leaves alone the clusters another request has claimed or
 * changed.  Per run:
 *  - under img->lock: the run found and claimed;
 *  - unlocked: the backing file read;
 *  - under the lock: new clusters for what is not all zeros, checked by
 *    the overlap guard;
 *  - unlocked: the data written there;
 *  - under the lock: the claim dropped and the L2 entries set, which
 *    the next flush writes only once the data is durable
 *    (flush_mark_dependency, as for every allocating write); all-zero
 *    clusters get zero flags, no data (version 3).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "checked.h"
#include "internal.h"
#include "iszero.h"

/* At most this much is read from the backing file and written at once,
 * and this many clusters looked at under one hold of the lock.
 */
#define FILL_RUN_BYTES (4u << 20)
#define FILL_SCAN_MAX 1024

/* Whether the cluster at guest offset cstart can be filled: nothing of
 * it allocated (no host cluster, no zero flag or bits), no request
 * working on it, and the backing file holds something there.
 */
static int
fill_wanted (struct qcow2_image *img, uint64_t cstart, bool *wanted)
  TSA_REQUIRES (img->lock)
{
  struct l2_state s;
  uint8_t *slice;
  uint64_t idx;
  int r;

  *wanted = false;
  if (cstart >= img->backing->size ||
      write_inflight_overlaps (img, cstart, cstart + img->geo.cluster_size))
    return 0;
  if ((r = cluster_l2_slice (img, cstart, &slice, &idx)) < 0)
    return r;
  if (slice) {
    l2_get (img, slice, idx, &s);
    if (s.entry != 0 || s.bitmap != 0)
      return 0;
  }
  *wanted = true;
  return 0;
}

/* The first run of clusters to fill in [*pos, end): *n clusters from
 * *start (0: none found yet); *pos is where the next search starts.
 * Allocated runs are skipped whole.
 */
static int
fill_find (struct qcow2_image *img, uint64_t *pos, uint64_t end,
           uint64_t *start, uint64_t *n)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size;
  unsigned scanned = 0;
  int r;

  ASSERT_LOCKED (img);
  *n = 0;
  while (*pos < end && scanned++ < FILL_SCAN_MAX &&
         *n * cs < FILL_RUN_BYTES) {
    struct qcow2_run run;
    bool wanted;

    if (*n == 0) {
      if ((r = cluster_map (img, *pos, end - *pos, &run)) < 0)
        return r;
      if (run.kind != RUN_UNALLOCATED) {
        *pos = (*pos + run.length + cs - 1) & ~(cs - 1);
        continue;
      }
    }
    if ((r = fill_wanted (img, *pos, &wanted)) < 0)
      return r;
    if (!wanted && *n > 0)
      break;
    if (wanted && (*n)++ == 0)
      *start = *pos;
    *pos += cs;
  }
  return 0;
}

/* New clusters for the n clusters in buf that are not all zeros (all
 * of them on version 2, which has no zero flag): host[i] (0: none).
 */
static int
fill_alloc (struct qcow2_image *img, const uint8_t *buf, uint64_t n,
            uint64_t *host)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size;
  bool zero_flags = img->h.version >= 3;
  int r;

  ASSERT_LOCKED (img);
  for (uint64_t i = 0; i < n; ) {
    uint64_t want = 0, got, target;
    bool zeroed;

    while (i + want < n && !(zero_flags && is_zero (buf + (i + want) * cs, cs)))
      want++;
    if (want == 0) {
      i++;
      continue;
    }
    if ((r = alloc_clusters_upto (img, 1, want, &target, &got,
                                  &zeroed)) < 0)
      return r;
    for (uint64_t k = 0; k < got; k++)
      host[i + k] = target + k * cs;
    io_note_end (img, target + got * cs);
    if ((r = io_check_data (img, got * cs, target)) < 0)
      return r;
    i += got;
  }
  return 0;
}

/* Write the data of the clusters given a host cluster, each run that
 * is together in both the guest and the file at once.
 */
static int
fill_write (struct qcow2_image *img, const uint8_t *buf, uint64_t n,
            const uint64_t *host)
{
  uint64_t cs = img->geo.cluster_size;
  int r;

  for (uint64_t i = 0, k; i < n; i = k) {
    for (k = i + 1; host[i] && k < n && host[k] == host[k - 1] + cs; k++)
      ;
    if (host[i] &&
        (r = io_write_checked (img, buf + i * cs, (k - i) * cs, host[i])) < 0)
      return r;
  }
  return 0;
}

/* Point the L2 entries of the n clusters from start at their data, or
 * make them zero clusters; *done: how many are.
 */
static int
fill_commit (struct qcow2_image *img, uint64_t start, uint64_t n,
             const uint64_t *host, uint64_t *done)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size;
  bool extl2 = img->geo.extended_l2, data = false;
  int r = 0;

  ASSERT_LOCKED (img);
  for (*done = 0; *done < n; ++*done) {
    uint64_t h = host[*done], idx, entry, bitmap;
    struct l2_state s;
    uint8_t *slice;

    if ((r = cluster_l2_slice_writable (img, start + *done * cs, &slice,
                                        &idx)) < 0)
      break;
    /* The claim kept every other request away from the entry. */
    l2_get (img, slice, idx, &s);
    assert (s.entry == 0 && s.bitmap == 0);
    if (h) {
      entry = h | QCOW2_OFLAG_COPIED;
      bitmap = extl2 ? L2_ALL_ALLOC : 0;
      io_note_written (img, h + cs);
      data = true;
    }
    else {
      entry = extl2 ? 0 : QCOW2_OFLAG_ZERO;
      bitmap = extl2 ? L2_ALL_ZERO : 0;
    }
    l2_set (img, slice, idx, entry, bitmap);
    cache_mark_dirty (img, img->caches.l2, slice);
  }
  if (*done)
    flush_mark_changed (img);
  if (data)
    flush_mark_dependency (img);
  return r;
}

/* The run of clusters a fill works on, claimed. */
struct fill_run {
  uint64_t start, n;
  uint8_t *buf;                 /* n clusters */
  uint64_t *host;               /* see fill_alloc */
};

/* What a fill does with the run claimed and img->lock released
 * (write_claim_may_unlock's io): the backing file read, new clusters
 * for the data (under the lock), the data written.
 */
static int
fill_data_unlocked (struct qcow2_image *img, void *opaque)
  TSA_EXCLUDES (img->lock)
{
  const struct fill_run *f = opaque;
  int r = read_backing (img, f->buf, f->n * img->geo.cluster_size,
                        f->start);

  if (r == 0) {
    image_lock (img);
    r = fill_alloc (img, f->buf, f->n, f->host);
    image_unlock (img);
  }
  if (r == 0)
    r = fill_write (img, f->buf, f->n, f->host);
  return r;
}

/* Fill the n clusters from start, which fill_find found.  Called with
 * img->lock held; returns with it released.
 */
static int
fill_run_unlocks (struct qcow2_image *img, uint64_t start, uint64_t n)
  TSA_RELEASE (img->lock)
{
  CLEANUP_FREE uint8_t *buf = malloc (n * img->geo.cluster_size);
  CLEANUP_FREE uint64_t *host = calloc (n, sizeof *host);
  struct fill_run f = { .start = start, .n = n, .buf = buf, .host = host };
  uint64_t done = 0;
  int r;

  if (!buf || !host)
    r = -ENOMEM;
  else
    r = state_begin_write (img);
  if (r < 0) {
    image_unlock (img);
    return r;
  }
  r = write_claim_may_unlock (img, start, start + n * img->geo.cluster_size,
                              fill_data_unlocked, &f);
  if (r == 0)
    r = fill_commit (img, start, n, host, &done);
  /* Clusters nothing points at go back (a full disk leaves no leak). */
  for (uint64_t i = done; r < 0 && i < n; i++)
    if (host[i])
      alloc_clusters_unused (img, host[i], 1);
  image_unlock (img);
  return r;
}

/* Fill what [offset, offset+count) touches.  Called holding data_lock
 * shared, not img->lock.
 */
int
fill_range (struct qcow2_image *img, uint64_t offset, uint64_t count)
  TSA_EXCLUDES (img->lock) TSA_REQUIRES_SHARED (img->data_lock)
{
  uint64_t pos, end;
  int r = 0;

  if (!img->backing || !qcow2_can_write (img) || count == 0)
    return 0;
  pos = offset & ~(img->geo.cluster_size - 1);
  end = MIN (offset + count, img->backing->size);
  while (r == 0 && pos < end) {
    uint64_t start = 0, n;

    image_lock (img);
    r = fill_find (img, &pos, end, &start, &n);
    if (r == 0 && n > 0)
      r = fill_run_unlocks (img, start, n);
    else
      image_unlock (img);
  }
  return r;
}

int
qcow2_fill (struct qcow2_image *img, uint64_t count, uint64_t offset)
{
  int r;

  if (range_exceeds (offset, count, img->size)) {
    log_error (img, "cache request of %" PRIu64 " bytes at %" PRIu64
               " is beyond the virtual size %" PRIu64, count, offset,
               img->size);
    return -EINVAL;
  }
  image_data_rdlock (img);
  r = fill_range (img, offset, count);
  image_data_unlock (img);
  return r;
}
