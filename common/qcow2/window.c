/* SPDX-License-Identifier: BSD-3-Clause */
/* A window [offset, offset + size) of storage, as QEMU's raw driver
 * serves it with offset= and size= (json: backing file names): a
 * read-only struct qcow2_io over the storage below, which it owns.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct window_io {
  struct qcow2_io io;
  struct qcow2_io *below;
  uint64_t offset, size;
};

static struct window_io *
window_of (struct qcow2_io *io)
{
  return (struct window_io *) io;
}

/* [offset, offset+count) clipped to the window: bytes past it read as
 * zeros, as past the end of any storage.
 */
static size_t
window_clip (struct window_io *w, size_t count, uint64_t offset)
{
  return offset >= w->size ? 0 : MIN (count, w->size - offset);
}

static int
window_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  struct window_io *w = window_of (io);
  size_t n = window_clip (w, count, offset);

  memset ((uint8_t *) buf + n, 0, count - n);
  return n ? w->below->ops->pread (w->below, buf, n, w->offset + offset) : 0;
}

static int
window_pwrite (struct qcow2_io *io, const void *buf, size_t count,
               uint64_t offset)
{
  return -EROFS;
}

static int
window_flush (struct qcow2_io *io)
{
  return 0;
}

static int
window_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  return -EOPNOTSUPP;
}

static int64_t
window_size (struct qcow2_io *io)
{
  return window_of (io)->size;
}

static int
window_status (struct qcow2_io *io, uint64_t offset, uint64_t count,
               uint32_t *type, uint64_t *len)
{
  struct window_io *w = window_of (io);
  size_t n = window_clip (w, count, offset);

  if (n == 0) {
    *type = QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO;
    *len = count;
    return 0;
  }
  if (!w->below->ops->status) {
    *type = 0;
    *len = n;
    return 0;
  }
  return w->below->ops->status (w->below, w->offset + offset, n, type, len);
}

static void
window_close (struct qcow2_io *io)
{
  struct window_io *w = window_of (io);

  w->below->ops->close (w->below);
  free (w);
}

static const struct qcow2_io_ops window_ops = {
  .pread = window_pread,
  .pwrite = window_pwrite,
  .flush = window_flush,
  .punch = window_punch,
  .size = window_size,
  .status = window_status,
  .close = window_close,
};

struct qcow2_io *
window_io_new (struct qcow2_io *below, uint64_t offset, uint64_t size)
{
  struct window_io *w = calloc (1, sizeof *w);

  if (!w)
    return NULL;
  w->io.ops = &window_ops;
  w->below = below;
  w->offset = offset;
  w->size = size;
  return &w->io;
}
