/* SPDX-License-Identifier: BSD-3-Clause */
/* Host I/O of the image: every metadata write, guest data write, file
 * extension and host flush, each checked by the overlap guard first,
 * the file's ends they move (file_size, written_end, durable_end), and
 * the header's feature bits, written when a failure marks the image
 * dirty or corrupt.
 *
 * Called with img->lock held, but io_write_checked.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

void
io_note_end (struct qcow2_image *img, uint64_t end)
{
  /* Read without the lock by the data paths, see image_file_size. */
  if (end > img->file_size)
    __atomic_store_n (&img->file_size, end, __ATOMIC_RELAXED);
}

/* Called with the lock held: in-place data writes, which run without
 * it, do not say where they end, so written_end may fall short, which
 * is safe.
 */
void
io_note_written (struct qcow2_image *img, uint64_t end)
{
  img->host.written_end = MAX (img->host.written_end, end);
}

/* Write the corrupt bit, set in memory, to the header (v3: v2 has no
 * feature bits, so the mark lasts as long as the image is open), so
 * that QEMU does not write the image either, and flush it, before the
 * mark is announced: the words that follow "; " in the announcement.
 * Best effort: the write that found the corruption is refused anyway.
 */
static const char *
io_write_corrupt (struct qcow2_image *img)
  TSA_REQUIRES (img->lock)
{
  int r = 0;

  if (img->h.version < 3)
    return "the image is marked corrupt until it is closed (a version 2 "
      "header has no corrupt bit)\n"
      "qemu-img check -r all repairs it";
  if (img->host.writing_corrupt)
    r = -EIO;                   /* the guard refused the mark's own write */
  else {
    img->host.writing_corrupt = true;
    if ((r = io_write_features (img)) == 0)
      r = io_flush (img);
    img->host.writing_corrupt = false;
  }
  if (r < 0)
    return "the image is marked corrupt until it is closed (writing the "
      "mark failed)\n"
      "qemu-img check -r all repairs it";
  return "the image is marked corrupt\n"
    "it will not be written until qemu-img check -r all repairs it";
}

/* Checks a write against the guard.  A hit marks the image corrupt,
 * and the mark goes to the header at once, then the hit is logged.
 */
static int
io_guard (struct qcow2_image *img, uint64_t offset, uint64_t len,
          uint32_t may_touch)
  TSA_REQUIRES (img->lock)
{
  struct overlap_hit hit;
  int r = overlap_check (img, offset, len, may_touch, &hit);

  if (r == -EIO)
    log_error (img, "overlap guard: a write of %" PRIu64 " bytes at host "
               "offset %#" PRIx64 " would overwrite the %s at %#" PRIx64
               ": refused; %s", len, offset, overlap_name (hit.bit), hit.at,
               io_write_corrupt (img));
  return r;
}

int
io_corrupt (struct qcow2_image *img, const char *fmt, ...)
{
  char msg[512];
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (msg, sizeof msg, fmt, ap);
  va_end (ap);
  /* A backing file, or an image served read-only, is only reported
   * on, as QEMU's non-fatal corruption events.
   */
  if (img->writable && !(image_set_incompat (img, QCOW2_INCOMPAT_CORRUPT)
                         & QCOW2_INCOMPAT_CORRUPT))
    log_error (img, "corrupt image: %s; %s", msg, io_write_corrupt (img));
  else
    log_error (img, "corrupt image: %s", msg);
  return -EIO;
}

/* Also on an image marked corrupt: for the header's feature bits. */
static int
io_write_meta_unchecked (struct qcow2_image *img, const void *buf,
                         uint64_t len, uint64_t offset, const char *what,
                         uint32_t may_touch)
  TSA_REQUIRES (img->lock)
{
  int r;

  ASSERT_LOCKED (img);
  assert (len > 0);
  r = io_guard (img, offset, len, may_touch);
  if (r < 0)
    return r;                   /* the guard logged why */
  r = img->io->ops->pwrite (img->io, buf, len, offset);
  if (r < 0) {
    log_error (img, "writing %s at %#" PRIx64 ": %s", what, offset,
               errstr (-r));
    return io_errno (r);
  }
  io_note_end (img, offset + len);
  io_note_written (img, offset + len);
  return 0;
}

/* Every metadata write to the image file goes through the overlap
 * guard: it may touch only the structures in may_touch.  Once the
 * image is marked corrupt (by the guard, perhaps while this request
 * was under way), no metadata is written but the header's feature
 * bits.
 */
int
io_write_meta (struct qcow2_image *img, const void *buf, uint64_t len,
               uint64_t offset, const char *what, uint32_t may_touch)
{
  if (image_is_corrupt (img)) {
    log_error (img, "not writing %s at %#" PRIx64 ": the image is marked "
               "corrupt", what, offset);
    return -EIO;
  }
  return io_write_meta_unchecked (img, buf, len, offset, what, may_touch);
}

/* Make the file at least end bytes long (a hole), so that the next
 * flush makes clusters below end part of the file even if their data
 * never reaches the disk.  The hole still counts as never written: new
 * clusters there read as zeros (file_size does not move).  Only saves
 * flushes (see write_allocating), so a failure (a full disk) is not an
 * error; and not done where writes into that hole would each cost more
 * than the flush saved (grows_by_writes, io.h).
 */
void
io_extend (struct qcow2_image *img, uint64_t end)
{
  int r;

  ASSERT_LOCKED (img);
  if (img->io->grows_by_writes || end <= img->host.written_end)
    return;
  r = io_guard (img, end - 1, 1, 0);
  if (r == 0)
    r = img->io->ops->pwrite (img->io, "", 1, end - 1);
  if (r < 0)
    log_debug (img, "extending the file to %" PRIu64 " bytes: %s", end,
               errstr (-r));
  else
    io_note_written (img, end);
}

/* Guest data never lands on metadata.  With the lock held. */
int
io_check_data (struct qcow2_image *img, uint64_t len, uint64_t offset)
{
  ASSERT_LOCKED (img);
  return img->data_io == img->io ? io_guard (img, offset, len, 0) : 0;
}

/* Report a failed write of guest data; returns what the client is
 * told.
 */
int
io_data_error (struct qcow2_image *img, uint64_t len, uint64_t offset, int r)
{
  log_error (img, "writing %" PRIu64 " bytes of data at host offset %#"
             PRIx64 ": %s", len, offset, errstr (-r));
  return io_errno (r);
}

/* Write guest data that io_check_data passed; needs no lock. */
int
io_write_checked (struct qcow2_image *img, const void *buf, uint64_t len,
                  uint64_t offset)
{
  int r = img->guest_io->ops->pwrite (img->guest_io, buf, len, offset);

  return r < 0 ? io_data_error (img, len, offset, r) : 0;
}

int
io_write_data (struct qcow2_image *img, const void *buf, uint64_t len,
               uint64_t offset)
{
  int r = io_check_data (img, len, offset);

  return r ? r : io_write_checked (img, buf, len, offset);
}

/* Metadata could not be written: mark the image dirty (v3), so that
 * the next read-write open rebuilds its refcounts and reclaims what
 * was leaked.  Best effort: if this write is lost too, the image has
 * leaks at worst, since nothing was ever written out of order.
 */
void
io_mark_dirty (struct qcow2_image *img)
{
  struct qcow2_header *h = &img->h;

  ASSERT_LOCKED (img);
  if (h->version < 3 || (h->incompatible_features & QCOW2_INCOMPAT_DIRTY))
    return;
  image_set_incompat (img, QCOW2_INCOMPAT_DIRTY);
  if (io_write_features (img) == 0 && !img->host.flush_failed)
    io_flush (img);
}

/* Patch the feature bit fields of a v3 header in place (also on an
 * image marked corrupt: that is how the mark is written).
 */
int
io_write_features (struct qcow2_image *img)
{
  uint8_t buf[8];
  int r;

  be64_put (buf, img->h.incompatible_features);
  r = io_write_meta_unchecked (img, buf, 8, HDR_INCOMPAT, "header",
                               OL (MAIN_HEADER));
  if (r < 0)
    return r;
  be64_put (buf, img->h.autoclear_features);
  return io_write_meta_unchecked (img, buf, 8, HDR_AUTOCLEAR, "header",
                                  OL (MAIN_HEADER));
}

/* A failed host flush cannot be taken back: the writes before it may
 * be lost while the file still shows them (Linux marks the pages
 * clean), and a later flush would succeed without them, breaking the
 * order that every write relies on.  So, as QEMU does, every later
 * flush fails too (reopening the image recovers), and the image is
 * marked dirty.
 */
static void
io_flush_failed (struct qcow2_image *img)
  TSA_REQUIRES (img->lock)
{
  img->host.flush_failed = true;
  io_mark_dirty (img);
}

int
io_flush (struct qcow2_image *img)
{
  uint64_t end = img->host.written_end;
  int r;

  ASSERT_LOCKED (img);
  if (img->host.flush_failed) {
    log_error (img, "flush refused: an earlier flush failed, so what was "
               "written since may be lost\n"
               "open the image again");
    return -EIO;
  }
  if (img->data_io != img->io &&
      (r = img->data_io->ops->flush (img->data_io)) < 0) {
    log_error (img, "flushing the external data file: %s", errstr (-r));
    io_flush_failed (img);
    return io_errno (r);
  }
  r = img->io->ops->flush (img->io);
  if (r < 0) {
    log_error (img, "flushing: %s", errstr (-r));
    io_flush_failed (img);
    return io_errno (r);
  }
  img->host.flushes++;
  img->host.durable_end = end;
  assert (img->host.durable_end <= img->host.written_end);
  return 0;
}

int
qcow2_writeback (struct qcow2_image *img)
  TSA_EXCLUDES (img->lock)
{
  int r = 0;

  /* The storage of an open image does not change (only a base's, which
   * its top's data_lock guards); its flush may run beside writes.
   */
  if (img->data_io != img->io)
    r = img->data_io->ops->flush (img->data_io);
  if (r == 0)
    r = img->io->ops->flush (img->io);
  if (r == 0)
    return 0;
  /* The kernel reports a failed write-back once: no later flush may
   * succeed as if the data were safe.
   */
  image_lock (img);
  log_error (img, "flushing: %s", errstr (-r));
  io_flush_failed (img);
  image_unlock (img);
  return io_errno (r);
}
