/* SPDX-License-Identifier: BSD-3-Clause */
/* Extents (NBD block status): data, zero, or hole per (sub)cluster,
 * looking through unallocated ranges into the backing chain, with
 * adjacent extents of one type merged, as qemu-img map reports them.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "checked.h"
#include "errstr.h"
#include "internal.h"

#define EXTENT_HOLE_ZERO (QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO)

struct extent_merger {
  qcow2_extent_fn add;
  void *opaque;
  bool req_one;
  bool have;
  bool done;                    /* the caller wants no more */
  uint64_t start, length;
  uint32_t type;
};

static int
extent_flush (struct extent_merger *m)
{
  int r;

  if (!m->have)
    return 0;
  m->have = false;
  r = m->add (m->opaque, m->start, m->length, m->type);
  if (r < 0)
    return r;
  if (r > 0 || m->req_one)
    m->done = true;
  return 0;
}

static int
extent_emit (struct extent_merger *m, uint64_t offset, uint64_t length,
             uint32_t type)
{
  if (m->have && m->type == type && m->start + m->length == offset) {
    m->length += length;
    return 0;
  }
  int r = extent_flush (m);
  m->start = offset;
  m->length = length;
  m->type = type;
  m->have = true;
  return r;
}

static int extent_walk (struct qcow2_image *img, uint64_t offset,
                        uint64_t count, struct extent_merger *m);

/* Guest [offset, offset+count) stored at host_offset in io, as the
 * storage reports it: of a raw layer, what it says (as QEMU passes its
 * protocol's status through); of data clusters, data, known to be zero
 * where the storage says it reads as zeros (as QEMU looks at the file
 * under a data cluster).
 */
static int
extent_walk_file (struct qcow2_image *img, struct qcow2_io *io,
                  uint64_t host_offset, uint64_t offset, uint64_t count,
                  bool raw, struct extent_merger *m)
{
  if (!io->ops->status)
    return extent_emit (m, offset, count, 0);
  while (count > 0 && !m->done) {
    uint32_t type;
    uint64_t len;
    int r = io->ops->status (io, host_offset, count, &type, &len);
    if (r < 0) {
      log_error (img, "finding holes at %#" PRIx64 ": %s", host_offset,
                 errstr (-r));
      return io_errno (r);
    }
    len = MAX (MIN (len, count), 1);
    r = extent_emit (m, offset, len, raw ? type : type & QCOW2_EXTENT_ZERO);
    if (r < 0)
      return r;
    host_offset += len;
    offset += len;
    count -= len;
  }
  return 0;
}

/* Data clusters of a preallocation=metadata image may be holes in the
 * file: those read as zeros, and QEMU reports them as such (data that
 * is known to be zero), so we look at the file as it does.
 */
static int
extent_walk_data (struct qcow2_image *img, const struct qcow2_run *run,
                  uint64_t offset, struct extent_merger *m)
  TSA_EXCLUDES (img->lock)
{
  bool prealloc;
  int r = 0;

  image_lock (img);
  if (!img->prealloc_checked) {
    r = refcount_detect_metadata_prealloc (img, &img->metadata_prealloc);
    img->prealloc_checked = r == 0;
  }
  prealloc = img->metadata_prealloc;
  image_unlock (img);
  if (r < 0)
    return r;
  if (!prealloc)
    return extent_emit (m, offset, run->length, 0);
  return extent_walk_file (img, img->guest_io, run->host_offset, offset,
                           run->length, false, m);
}

/* Guest ranges not allocated in img show what its backing file has. */
static int
extent_walk_backing (struct qcow2_image *img, uint64_t offset,
                     uint64_t count, struct extent_merger *m)
{
  struct qcow2_image *b = img->backing;
  uint64_t n = 0;
  int r;

  if (b && offset < b->size) {
    n = MIN (count, b->size - offset);
    r = extent_walk (b, offset, n, m);
    if (r < 0)
      return r;
  }
  if (n < count)
    return extent_emit (m, offset + n, count - n, EXTENT_HOLE_ZERO);
  return 0;
}

static int
extent_walk (struct qcow2_image *img, uint64_t offset, uint64_t count,
             struct extent_merger *m)
  TSA_EXCLUDES (img->lock)
{
  if (img->raw)
    return extent_walk_file (img, img->io, offset, offset, count, true, m);

  while (count > 0 && !m->done) {
    struct qcow2_run run;
    int r;

    image_lock (img);
    r = cluster_map (img, offset, count, &run);
    image_unlock (img);
    if (r < 0)
      return r;

    switch (run.kind) {
    case RUN_UNALLOCATED:
      r = extent_walk_backing (img, offset, run.length, m);
      break;
    case RUN_ZERO:
      r = extent_emit (m, offset, run.length, EXTENT_HOLE_ZERO);
      break;
    case RUN_DATA:
      r = extent_walk_data (img, &run, offset, m);
      break;
    case RUN_COMPRESSED:
      r = extent_emit (m, offset, run.length, 0);
      break;
    }
    if (r < 0)
      return r;
    offset += run.length;
    count -= run.length;
  }
  return 0;
}

int
layer_extents (struct qcow2_image *img, uint64_t offset, uint64_t count,
               bool req_one, qcow2_extent_fn add, void *opaque)
{
  struct extent_merger m = { .add = add, .opaque = opaque,
                             .req_one = req_one };
  int r = extent_walk (img, offset, count, &m);

  if (r == 0 && !m.done)
    r = extent_flush (&m);
  return r;
}
