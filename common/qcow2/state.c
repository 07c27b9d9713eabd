/* SPDX-License-Identifier: BSD-3-Clause */
/* The image's on-disk state over its life: what the first write does
 * (a dirty image's refcounts rebuilt, unknown autoclear bits cleared,
 * bitmaps marked in use, the dirty bit of lazy refcounts), the dirty
 * bit after a failed metadata write, the clean close, and whether the
 * image may be written at all (the corrupt bit, a snapshot export).
 *
 * Called with img->lock held, but the qcow2_* questions, which read
 * only what is fixed at open and the atomic feature bits.
 */
#include <errno.h>
#include <stdint.h>

#include "be.h"
#include "errstr.h"
#include "internal.h"

bool
qcow2_can_write (const struct qcow2_image *img)
{
  return img->writable && !qcow2_is_corrupt (img) && !img->overlap_conflict;
}

const char *
qcow2_readonly_reason (const struct qcow2_image *img)
{
  if (img->served_snapshot)
    return "a snapshot is served";
  if (qcow2_is_corrupt (img))
    return "the image is marked corrupt";
  if (!img->writable)
    return "the image was opened read-only";
  if (img->overlap_conflict)
    return img->overlap_conflict_msg;
  return NULL;
}

int
qcow2_check_writable (struct qcow2_image *img)
{
  if (img->served_snapshot) {
    log_error (img, "snapshot \"%s\" is served read-only",
               img->served_snapshot->name);
    return -EROFS;
  }
  if (qcow2_is_corrupt (img)) {
    log_error (img, "image is marked corrupt (incompatible feature bit 1): "
               "refusing write access\n"
               "qemu-img check -r all repairs it; nbdkit -r serves it "
               "read-only");
    return -EPERM;
  }
  if (!img->writable) {
    log_error (img, "image is opened read-only");
    return -EROFS;
  }
  if (img->overlap_conflict) {
    log_error (img, "corrupt image: %s: refusing write access",
               img->overlap_conflict_msg);
    return -EPERM;
  }
  return 0;
}

bool
qcow2_is_corrupt (const struct qcow2_image *img)
{
  return image_is_corrupt (img);
}

int
state_prepare_writes (struct qcow2_image *img)
{
  int r;

  ASSERT_LOCKED (img);
  if ((r = refcount_load_table (img)) < 0)
    return r;
  if ((r = overlap_build (img)) < 0)
    log_error (img, "cannot map the metadata for the overlap guard: %s",
               errstr (-r));
  return r;
}

/* Before the first change:
 *  - an image left dirty by a crash under lazy refcounts gets its
 *    refcounts rebuilt (its refcounts cannot be trusted for allocation);
 *  - autoclear features we do not know are cleared, as the spec
 *    requires of an editor that does not know them;
 *  - the persistent bitmaps kept up to date are marked in use;
 *  - with lazy refcounts, the dirty bit is set and made durable before
 *    any metadata changes.
 */
int
state_begin_write (struct qcow2_image *img)
{
  struct qcow2_header *h = &img->h;
  uint64_t known;
  bool dirty;
  int r;

  ASSERT_LOCKED (img);
  /* Every write, zero and trim passes here under img->lock, cluster by
   * cluster: one the overlap guard (or any corruption found) marked
   * corrupt since the request began goes no further.
   */
  if (qcow2_is_corrupt (img))
    return qcow2_check_writable (img);
  if (img->write_started)
    return 0;
  /* Structures that overlap are found as the guard's map is made: no
   * write then, the first one included.
   */
  if ((r = state_prepare_writes (img)) < 0 ||
      (r = qcow2_check_writable (img)) < 0)
    return r;
  if (h->incompatible_features & QCOW2_INCOMPAT_DIRTY) {
    if ((r = check_rebuild_refcounts (img)) < 0)
      return r;
    image_clear_incompat (img, QCOW2_INCOMPAT_DIRTY);
    if ((r = io_write_features (img)) < 0 || (r = io_flush (img)) < 0)
      return r;
    log_notice (img, "the image was not closed cleanly (dirty bit set): "
                "refcounts rebuilt");
  }
  known = QCOW2_AUTOCLEAR_DATA_RAW |
    (h->has_bitmaps_ext ? QCOW2_AUTOCLEAR_BITMAPS : 0);
  if (h->version >= 3 && (h->autoclear_features & ~known)) {
    h->autoclear_features &= known;
    if ((r = io_write_features (img)) < 0 || (r = io_flush (img)) < 0)
      return r;
  }
  if ((r = bitmap_begin_write (img)) < 0)
    return r;
  dirty = img->lazy_refcounts && h->version >= 3;
  if (dirty) {
    image_set_incompat (img, QCOW2_INCOMPAT_DIRTY);
    if ((r = io_write_features (img)) < 0 || (r = io_flush (img)) < 0)
      return r;
  }
  img->write_started = true;
  return 0;
}

/* Clean close: everything durable, frees released, dirty bit cleared. */
int
state_close (struct qcow2_image *img)
{
  int r;

  ASSERT_LOCKED (img);
  if (!img->write_started)
    return 0;
  alloc_begin_close (img);
  /* The refcount blocks that lazy refcounts left unwritten are owed
   * before the dirty bit goes, even if nothing else changed since the
   * last flush.
   */
  if (img->lazy_refcounts)
    flush_mark_changed (img);
  if ((r = bitmap_store (img)) < 0 ||
      (r = flush_locked (img)) < 0 ||
      (r = alloc_apply_frees (img, img->alloc.pending_len)) < 0 ||
      (r = alloc_release_reserve (img)) < 0 ||
      (r = flush_locked (img)) < 0)
    return r;
  /* New clusters written only in part leave the file short of them:
   * make it cover every cluster, as QEMU's images do.
   */
  int64_t size = img->io->ops->size (img->io);
  if (size >= 0 && (uint64_t) size < img->file_size &&
      ((r = io_write_meta (img, "", 1, img->file_size - 1,
                           "end of file", 0)) < 0 ||
       (r = io_flush (img)) < 0))
    return r;
  if (img->h.incompatible_features & QCOW2_INCOMPAT_DIRTY) {
    image_clear_incompat (img, QCOW2_INCOMPAT_DIRTY);
    if ((r = io_write_features (img)) < 0 || (r = io_flush (img)) < 0)
      return r;
  }
  return 0;
}
