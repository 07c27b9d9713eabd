/* SPDX-License-Identifier: BSD-3-Clause */
/* Allocating writes: what write.c's loop does to a cluster it cannot
 * write in place, and what zero.c, fill.c and stream.c share of it.
 *
 * One read of what the guest sees around the new data (head and tail
 * together when they are close) and one write of head + data + tail
 * (COW in two operations), or just the data when the new cluster reads
 * as zeros and nothing needs copying.  With extended L2 entries the
 * unit is the subcluster, so aligned writes copy nothing.  Whole
 * clusters are allocated in runs, or stored compressed (compress=).
 * The I/O is done with img->lock released, the guest range claimed
 * meanwhile (write_claim_may_unlock).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

/* Head and tail closer than this are read in one request. */
#define COW_MERGE_GAP (256u << 10)

/* Returns the subcluster bits of [start, end) within a cluster. */
uint64_t
write_unit_mask (const struct qcow2_image *img, uint64_t start, uint64_t end)
{
  unsigned first = start >> img->geo.subcluster_bits;
  unsigned last = (end - 1) >> img->geo.subcluster_bits;

  assert (start < end && end <= img->geo.cluster_size);
  uint64_t n = last - first + 1;
  return (n >= 32 ? L2_ALL_ALLOC : ((UINT64_C (1) << n) - 1)) << first;
}

/* Stops at the first extent that does not read as zeros. */
static int
write_alloc_extent_zero (void *opaque, uint64_t offset, uint64_t length,
                         uint32_t type)
{
  bool *zero = opaque;

  if (type & QCOW2_EXTENT_ZERO)
    return 0;
  *zero = false;
  return 1;
}

/* Whether the guest reads zeros from [offset, offset+len) now: where the
 * backing file shows, by its block status if ask_backing (as QEMU's
 * is_zero asks), else taken as not zero.
 */
static int
write_alloc_zero_runs (struct qcow2_image *img, uint64_t offset, uint64_t len,
                       bool ask_backing, bool *zero)
  TSA_REQUIRES (img->lock)
{
  *zero = true;
  while (len > 0 && *zero) {
    struct qcow2_run run;
    int r = cluster_map (img, offset, len, &run);
    if (r < 0)
      return r;
    if (run.kind == RUN_DATA || run.kind == RUN_COMPRESSED)
      *zero = false;
    else if (run.kind == RUN_UNALLOCATED && img->backing &&
             offset < img->backing->size) {
      if (!ask_backing)
        *zero = false;
      else if ((r = layer_extents (img->backing, offset,
                                   MIN (run.length,
                                        img->backing->size - offset),
                                   false, write_alloc_extent_zero, zero)) < 0)
        return r;
    }
    offset += run.length;
    len -= run.length;
  }
  return 0;
}

int
write_reads_zero (struct qcow2_image *img, uint64_t offset, uint64_t len,
                  bool *zero)
{
  return write_alloc_zero_runs (img, offset, len, false, zero);
}

int
write_shows_zero (struct qcow2_image *img, uint64_t offset, uint64_t len,
                  bool *zero)
{
  return write_alloc_zero_runs (img, offset, len, true, zero);
}

/* A cluster written in place must be one a sound image could have:
 * aligned, and starting inside the file.
 */
int
write_alloc_check_host (struct qcow2_image *img, uint64_t host,
                        uint64_t guest)
  TSA_REQUIRES (img->lock)
{
  if (host & (img->geo.cluster_size - 1))
    return io_corrupt (img, "unaligned data cluster offset %#" PRIx64
                       " (guest offset %#" PRIx64 ")", host, guest);
  return cluster_check_data_offset (img, host, img->geo.cluster_size);
}

/* Drop this image's reference to the old data of an entry, at
 * [host, host+len) in the image file, after the entry was pointed at
 * newly allocated clusters [fresh, fresh+fresh_len).  Data never lies on
 * metadata nor starts past the end of the file, and its clusters were
 * not free to allocate: if an entry says otherwise (a corrupt image),
 * the reference is left alone, since dropping it could free a table
 * still in use, a cluster the allocator has counted ahead, or the new
 * data itself.
 */
static int
write_alloc_release_data (struct qcow2_image *img, uint64_t host,
                          uint64_t len, uint64_t fresh, uint64_t fresh_len)
  TSA_REQUIRES (img->lock)
{
  if (host >= image_file_size (img)) {
    log_error (img, "corrupt image: guest data at host offset %#" PRIx64
               " lies beyond the end of the file: reference left as is",
               host);
    return 0;
  }
  if (host < fresh + fresh_len && fresh < host + len) {
    log_error (img, "corrupt image: guest data at host offset %#" PRIx64
               " lies in a cluster whose refcount said it was free: "
               "reference left as is", host);
    return 0;
  }
  for (uint64_t c = host >> img->geo.cluster_bits;
       c <= (host + len - 1) >> img->geo.cluster_bits; c++) {
    unsigned type = overlap_map_type (img->overlap, c);
    if (type) {
      log_error (img, "corrupt image: guest data at host offset %#" PRIx64
                 " lies on the %s: its reference is left as is", host,
                 overlap_name (type - 1));
      return 0;
    }
  }
  return alloc_free_later (img, host, len);
}

/* fresh, fresh_len: see write_alloc_release_data (0, 0 if none). */
int
write_release_old (struct qcow2_image *img, const struct l2_state *s,
                   uint64_t fresh, uint64_t fresh_len)
{
  if (s->compressed) {
    uint64_t off, len;
    l2_compressed_range (&img->geo, s->entry, &off, &len);
    /* Whole sectors, as the entry counts them. */
    return write_alloc_release_data (img, off & ~UINT64_C (511),
                                     (off & 511) + len, fresh, fresh_len);
  }
  if (s->normal && img->data_io == img->io)
    return write_alloc_release_data (img, s->host, img->geo.cluster_size,
                                     fresh, fresh_len);
  return 0;
}

/* A guest range an allocating write works on with img->lock released,
 * so that concurrent requests' copy-on-write reads and data writes
 * overlap.
 *
 * What each request excludes, and how (requests in flight never touch
 * the same bytes: NBD leaves that undefined):
 *  - Writes, zeroes and trims change L2 entries only under img->lock,
 *    and only of clusters no claim covers: they wait for claims over
 *    the cluster they start in (write_inflight_wait), and stop before
 *    any other claimed cluster.
 *  - An allocating write claims its clusters before it releases the
 *    lock to copy and write, and updates their entries once it holds
 *    the lock again; meanwhile no one else changes those entries, so
 *    what it decoded stays true.  Reads see the old contents until then.
 *  - In-place writes take no claim: they write only their client's
 *    bytes, into (sub)clusters already mapped, and change no entry.
 *    So an allocating write never writes back a copy of an allocated
 *    (sub)cluster's bytes, which an in-place write may be changing:
 *    there it writes only its own client's bytes (write_allocating).
 *    What it copies comes from the backing file, a compressed cluster
 *    or a cluster shared with a snapshot, which no one writes in place.
 *    In-place runs mapped after a claim stop at its cluster.
 *  - On an O_DIRECT file, two writes to different bytes of one block
 *    are kept apart by the file backend (its read-modify-write ranges).
 *  - Copy-on-read fills (fill.c) claim the clusters they fill, as
 *    allocating writes do, and commit only clusters still unallocated.
 *  - Clusters are freed holding data_lock exclusively: no request
 *    still uses a host offset it mapped.
 */
bool
write_inflight_overlaps (struct qcow2_image *img, uint64_t start,
                         uint64_t end)
  TSA_REQUIRES (img->lock)
{
  for (const struct write_inflight *w = img->inflight; w; w = w->next)
    if (w->start < end && start < w->end)
      return true;
  return false;
}

/* Run io (img, opaque) with img->lock released, guest [start, end)
 * claimed meanwhile: every allocating write, fill and compressed write
 * does its I/O so.  The claim keeps the clusters' L2 entries as they
 * were, but the caller looks their slice up again (it may have been
 * evicted) and re-checks anything else it looked up before.
 */
int
write_claim_may_unlock (struct qcow2_image *img, uint64_t start, uint64_t end,
                        int (*io) (struct qcow2_image *img, void *opaque),
                        void *opaque)
{
  struct write_inflight w = { .start = start, .end = end,
                              .next = img->inflight };
  struct write_inflight **p;
  int r;

  ASSERT_LOCKED (img);
  assert (start < end);
  img->inflight = &w;
  image_unlock (img);
  r = io (img, opaque);
  image_lock (img);
  for (p = &img->inflight; *p != &w; p = &(*p)->next)
    assert (*p);
  *p = w.next;
  pthread_cond_broadcast (&img->inflight_done);
  return r;
}

/* An allocating write of [offset, offset+len) within one cluster, as
 * planned under the lock (write_alloc_plan).
 */
struct write_alloc {
  const uint8_t *data;          /* the client's */
  uint64_t offset, len;
  uint64_t cstart, in;          /* the cluster, and offset within it */
  struct l2_state old;          /* its entry before */
  bool reuse;                   /* written into its own cluster */
  bool external;                /* an external data file, mapped 1:1 */
  uint64_t target;              /* the host cluster written */
  bool counted;                 /* target newly allocated */
  bool zeroed;                  /* target is new and reads as zeros */
  /* The part of the cluster the new entry makes valid, and whether the
   * guest's data before and after the client's needs copying.
   */
  uint64_t start, end;
  bool need_head, need_tail;
  bool old_zero;                /* the client's range read as zeros */
  /* Only the client's data is written: nothing around it needs it. */
  bool simple;
  uint64_t wstart, wend;        /* what is written, within the cluster */
};

/* Plan phase, under the lock: where the data goes, which part of the
 * cluster is written, what must be copied, checked by the guard.  The
 * cluster's L2 table must be writable.  A new cluster is counted (and
 * given back by write_alloc_commit if the write fails).
 */
static int
write_alloc_plan (struct qcow2_image *img, const uint8_t *data,
                  uint64_t offset, uint64_t len, struct write_alloc *a)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size;
  uint8_t *slice;
  uint64_t idx;
  bool head_zero, tail_zero;
  int r;

  ASSERT_LOCKED (img);
  assert (len > 0 && (offset & (cs - 1)) + len <= cs);
  *a = (struct write_alloc) {
    .data = data, .offset = offset, .len = len,
    .cstart = offset & ~(cs - 1), .in = offset & (cs - 1),
    .external = img->data_io != img->io,
  };
  if ((r = cluster_l2_slice_writable (img, offset, &slice, &idx)) < 0)
    return r;
  l2_get (img, slice, idx, &a->old);

  a->reuse = a->old.normal && a->old.copied;
  if (a->reuse && (r = write_alloc_check_host (img, a->old.host, offset)) < 0)
    return r;
  if (a->reuse)
    a->target = a->old.host;
  else if (a->external)
    a->target = a->cstart;      /* external data files map 1:1 */
  else if ((r = alloc_clusters (img, 1, &a->target, &a->zeroed)) < 0)
    return r;
  else
    a->counted = true;
  if (img->geo.extended_l2 &&
      (a->reuse || (!a->old.normal && !a->old.compressed))) {
    uint64_t sub = img->geo.subcluster_size;
    a->start = a->in & ~(sub - 1);
    a->end = MIN (cs, (a->in + len + sub - 1) & ~(sub - 1));
    /* An allocated subcluster holds the guest's data, which in-place
     * writes may be changing now: only the client's bytes go there.
     */
    if (a->reuse && (a->old.bitmap >> (a->in >> img->geo.subcluster_bits) & 1))
      a->start = a->in;
    if (a->reuse &&
        (a->old.bitmap >> ((a->in + len - 1) >> img->geo.subcluster_bits)
         & 1))
      a->end = a->in + len;
  }
  else {
    a->start = 0;
    a->end = cs;
  }
  /* An external data file holds nothing past the end of the disk (a
   * raw one is as long as the disk).
   */
  if (a->external)
    a->end = MIN (a->end, img->size - a->cstart);
  assert (a->start <= a->in && a->in + len <= a->end);

  head_zero = tail_zero = true;
  if (a->start < a->in &&
      (r = write_reads_zero (img, a->cstart + a->start, a->in - a->start,
                             &head_zero)) < 0)
    return r;
  if (a->in + len < a->end &&
      (r = write_reads_zero (img, offset + len, a->end - a->in - len,
                             &tail_zero)) < 0)
    return r;
  a->need_head = !head_zero;
  a->need_tail = !tail_zero;
  if ((r = write_reads_zero (img, offset, len, &a->old_zero)) < 0)
    return r;

  /* The whole new cluster counts as part of the file from now on, even
   * where it is not written yet (it reads as zeros).
   */
  if (a->zeroed)
    io_note_end (img, a->target + cs);
  /* But not in an encrypted image, where zeros decrypt to noise. */
  a->zeroed = a->zeroed && !img->luks;
  /* Only the client's data where nothing around it needs writing: no
   * head or tail, or zeros over a new cluster that reads as zeros.
   */
  a->simple = (a->start == a->in || (a->zeroed && !a->need_head)) &&
    (a->end == a->in + len || (a->zeroed && !a->need_tail));
  a->wstart = a->simple ? a->in : a->start;
  a->wend = a->simple ? a->in + len : a->end;
  return io_check_data (img, a->wend - a->wstart, a->target + a->wstart);
}

/* Data phase: write the client's data with what the guest sees around
 * it (read by read, as the caller holds the lock or not: read_locked,
 * layer_read).  Touches nothing the lock guards, so that it may run
 * without it.
 */
static int
write_alloc_data (struct qcow2_image *img, const struct write_alloc *a,
                  int (*read) (struct qcow2_image *, uint8_t *, uint64_t,
                               uint64_t))
{
  uint64_t gap = a->len;        /* between head and tail */
  uint8_t *buf;
  int r = 0;

  if (a->simple)
    return io_write_checked (img, a->data, a->len, a->target + a->in);
  if (!(buf = malloc (a->end - a->start)))
    return -ENOMEM;
  if (a->need_head && a->need_tail && gap <= COW_MERGE_GAP)
    r = read (img, buf, a->end - a->start, a->cstart + a->start);
  else {
    if (a->need_head)
      r = read (img, buf, a->in - a->start, a->cstart + a->start);
    else
      memset (buf, 0, a->in - a->start);
    if (r == 0 && a->need_tail)
      r = read (img, buf + (a->in + a->len - a->start),
                a->end - a->in - a->len, a->offset + a->len);
    else if (r == 0)
      memset (buf + (a->in + a->len - a->start), 0,
              a->end - a->in - a->len);
  }
  if (r == 0) {
    memcpy (buf + a->in - a->start, a->data, a->len);
    r = io_write_checked (img, buf, a->end - a->start,
                          a->target + a->start);
  }
  free (buf);
  return r;
}

/* Commit phase, under the lock: point the entry at the data written
 * (r, the data phase's result, is 0), or give a new cluster back.
 */
static int
write_alloc_commit (struct qcow2_image *img, const struct write_alloc *a,
                    int r)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size;
  uint8_t *slice;
  uint64_t idx, bitmap;

  ASSERT_LOCKED (img);
  if (r == 0 && !a->external)
    io_note_written (img, a->target + a->wend);
  if (r < 0) {
    /* Nothing points at the new cluster yet: give it back (a full
     * disk must not leave a leak behind).
     */
    if (a->counted)
      alloc_clusters_unused (img, a->target, 1);
    return r;
  }

  /* Reading the old contents (or others, while the lock was released)
   * may have evicted the slice: look again.
   */
  if ((r = cluster_l2_slice_writable (img, a->offset, &slice, &idx)) < 0)
    return r;
  if (!img->geo.extended_l2)
    bitmap = 0;
  else if (a->reuse || (!a->old.normal && !a->old.compressed)) {
    uint64_t mask = write_unit_mask (img, a->start, a->end);
    bitmap = ((a->old.bitmap & L2_ALL_ALLOC) | mask) |
      ((a->old.bitmap >> 32) & ~mask) << 32;
  }
  else
    bitmap = L2_ALL_ALLOC;
  l2_set (img, slice, idx, a->target | QCOW2_OFLAG_COPIED, bitmap);
  cache_mark_dirty (img, img->caches.l2, slice);
  flush_mark_changed (img);
  /* The data must be durable before the entry that makes it visible,
   * unless a crash between the two could only show zeros where zeros
   * were: a new cluster past the end of the file, over a range and a
   * head and tail that all read as zeros before -- and a cluster the
   * file durably covers, since an entry pointing past the end of the
   * file is corruption (the reserve and alloc_clusters extend the file
   * ahead, so that this rarely costs a flush).
   */
  if (a->reuse || !a->zeroed || a->need_head || a->need_tail ||
      !a->old_zero || a->target >= img->host.durable_end)
    flush_mark_dependency (img);
  if (a->reuse)
    return 0;
  return write_release_old (img, &a->old, a->external ? 0 : a->target,
                            a->external ? 0 : cs);
}

/* Write [offset, offset+len) within one cluster, allocating, with the
 * lock held throughout.  The cluster's L2 table must be writable.
 */
int
write_allocating (struct qcow2_image *img, const uint8_t *data,
                  uint64_t offset, uint64_t len)
{
  struct write_alloc a;
  int r = write_alloc_plan (img, data, offset, len, &a);

  if (r == 0)
    r = write_alloc_data (img, &a, read_locked);
  return write_alloc_commit (img, &a, r);
}

/* write_alloc_data without the lock (write_claim_may_unlock's io). */
static int
write_alloc_data_unlocked (struct qcow2_image *img, void *a)
{
  return write_alloc_data (img, a, layer_read);
}

/* As write_allocating, but the lock is released while the data is read
 * (COW) and written, the cluster claimed meanwhile: the caller
 * re-checks what it looked up before.
 */
int
write_allocating_may_unlock (struct qcow2_image *img, const uint8_t *data,
                             uint64_t offset, uint64_t len)
{
  struct write_alloc a;
  int r = write_alloc_plan (img, data, offset, len, &a);

  if (r == 0)
    r = write_claim_may_unlock (img, a.cstart,
                                a.cstart + img->geo.cluster_size,
                                write_alloc_data_unlocked, &a);
  return write_alloc_commit (img, &a, r);
}

/* A host write of data already checked (write_claim_may_unlock's io). */
struct write_host {
  const uint8_t *buf;
  uint64_t len, offset;
};

static int
write_alloc_host_unlocked (struct qcow2_image *img, void *opaque)
{
  const struct write_host *h = opaque;

  return io_write_checked (img, h->buf, h->len, h->offset);
}

/* At most this many clusters are allocated and written together. */
#define WRITE_RUN_MAX 256

/* Write whole clusters from offset (count bytes, at least one cluster,
 * offset aligned) into newly allocated clusters, as many as lie in one
 * L2 slice, need a new cluster and find free clusters together, with
 * one allocation and one write; *done is the number of bytes written,
 * 0 if the first cluster is not such a cluster.  Nothing needs
 * copying, since every cluster is overwritten whole.  The lock is
 * released while the data is written, the clusters claimed meanwhile.
 */
int
write_alloc_run_may_unlock (struct qcow2_image *img, const uint8_t *data,
                            uint64_t offset, uint64_t count, uint64_t *done)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size;
  uint64_t slice_entries =
    cache_entry_size (img->caches.l2) / img->geo.l2_entry_size;
  CLEANUP_FREE struct l2_state *old = NULL;
  uint64_t idx, k, max, target;
  uint8_t *slice;
  bool zeroed, old_zero;
  int r;

  *done = 0;
  if (img->data_io != img->io)
    return 0;                   /* external data files map 1:1 */
  if ((r = cluster_l2_slice_writable (img, offset, &slice, &idx)) < 0)
    return r;
  /* On the heap: this runs on each of nbdkit's many worker threads,
   * where a large frame would cost its pages in every one.
   */
  max = MIN (MIN (WRITE_RUN_MAX, count / cs), slice_entries - idx);
  assert (max >= 1);
  if ((old = malloc (max * sizeof *old)) == NULL)
    return -errno;
  for (k = 0; k < max; k++) {
    if (write_inflight_overlaps (img, offset + k * cs, offset + (k + 1) * cs))
      break;                    /* another request allocates it */
    l2_get (img, slice, idx + k, &old[k]);
    if (old[k].normal && old[k].copied)
      break;                    /* written in place */
  }
  if (k == 0)
    return 0;

  /* As many as lie free together where the allocator looks: a
   * fragmented file must not be searched for a long run.
   */
  if ((r = write_reads_zero (img, offset, k * cs, &old_zero)) < 0 ||
      (r = alloc_clusters_upto (img, 1, k, &target, &k, &zeroed)) < 0)
    return r;
  /* Not only when zeroed: a run may start in a free gap inside the
   * file and end past it.
   */
  io_note_end (img, target + k * cs);
  if ((r = io_check_data (img, k * cs, target)) == 0)
    r = write_claim_may_unlock (img, offset, offset + k * cs,
                                write_alloc_host_unlocked,
                                &(struct write_host) {
                                  .buf = data, .len = k * cs,
                                  .offset = target });
  if (r < 0) {
    alloc_clusters_unused (img, target, k);
    return r;
  }
  io_note_written (img, target + k * cs);

  /* Others, while the lock was released, may have evicted the slice. */
  if ((r = cluster_l2_slice_writable (img, offset, &slice, &idx)) < 0)
    return r;
  for (uint64_t i = 0; i < k; i++)
    l2_set (img, slice, idx + i, (target + i * cs) | QCOW2_OFLAG_COPIED,
            img->geo.extended_l2 ? L2_ALL_ALLOC : 0);
  cache_mark_dirty (img, img->caches.l2, slice);
  flush_mark_changed (img);
  /* As in write_allocating: zeros over zeros need no ordering, in
   * clusters the file durably covers (and not encrypted).
   */
  if (!zeroed || img->luks || !old_zero ||
      target + (k - 1) * cs >= img->host.durable_end)
    flush_mark_dependency (img);
  *done = k * cs;
  for (uint64_t i = 0; i < k; i++)
    if ((r = write_release_old (img, &old[i], target, k * cs)) < 0)
      return r;
  return 0;
}

/* A cluster compressed (write_claim_may_unlock's io): out, len as
 * compress_cluster gives them.
 */
struct write_compress {
  const uint8_t *data, *out;
  ssize_t len;
};

static int
write_alloc_compress_unlocked (struct qcow2_image *img, void *opaque)
{
  struct write_compress *c = opaque;

  c->len = compress_cluster (img, c->data, &c->out);
  return c->len < 0 ? c->len : 0;
}

/* Store the whole cluster at offset compressed, if it is not allocated
 * (QEMU's compress driver never overwrites) and compresses to less
 * than a cluster: *done is then the cluster's size, else 0 and nothing
 * changed.  The lock is released while the cluster is compressed, the
 * cluster claimed meanwhile.
 */
int
write_alloc_compressed_may_unlock (struct qcow2_image *img,
                                   const uint8_t *data, uint64_t offset,
                                   uint64_t *done)
  TSA_REQUIRES (img->lock)
{
  uint64_t cs = img->geo.cluster_size, idx, host;
  struct write_compress c = { .data = data };
  struct l2_state s;
  uint8_t *slice;
  uint64_t len;
  int r;

  *done = 0;
  if ((r = cluster_l2_slice_writable (img, offset, &slice, &idx)) < 0)
    return r;
  l2_get (img, slice, idx, &s);
  if (s.normal || s.compressed || (s.bitmap & L2_ALL_ALLOC) ||
      write_inflight_overlaps (img, offset, offset + cs))
    return 0;

  r = write_claim_may_unlock (img, offset, offset + cs,
                              write_alloc_compress_unlocked, &c);
  if (r == -ENOSPC)
    return 0;                   /* stored as it is */
  if (r < 0)
    return r;
  len = c.len;

  /* The claim kept the entry as it was; the slice may be gone. */
  if ((r = cluster_l2_slice_writable (img, offset, &slice, &idx)) < 0 ||
      (r = alloc_bytes (img, len, &host)) < 0)
    return r;
  if (!l2_compressed_fits (&img->geo, host)) {
    log_error (img, "cannot store a compressed cluster at host offset %#"
               PRIx64 ": its L2 entry holds offsets below %#" PRIx64, host,
               UINT64_C (1) << img->geo.compressed_offset_bits);
    r = -EFBIG;
  }
  else if ((r = io_check_data (img, len, host)) == 0)
    r = io_write_checked (img, c.out, len, host);
  if (r < 0) {
    alloc_bytes_unused (img, host, len);
    return r;
  }
  io_note_end (img, host + len);
  io_note_written (img, host + len);
  if ((r = cluster_l2_slice_writable (img, offset, &slice, &idx)) < 0)
    return r;
  l2_set (img, slice, idx, l2_compressed_entry (&img->geo, host, len), 0);
  cache_mark_dirty (img, img->caches.l2, slice);
  flush_mark_changed (img);
  flush_mark_dependency (img);
  *done = cs;
  return write_release_old (img, &s, 0, 0);
}
