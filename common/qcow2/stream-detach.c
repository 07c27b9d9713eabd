/* SPDX-License-Identifier: BSD-3-Clause */
/* The end of a stream (stream.c): the image cut loose from the layers
 * it no longer needs.  The header's backing name is rewritten in one
 * crash-safe step, to none or to the base, with the backing format
 * extension as QEMU's block-stream leaves it (gone, or the base's
 * format), and the layers dropped are released (closed unless other
 * images share them).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

/* The header's backing name and format, as they become: none, or the
 * base (its name resolved as the image names it, its format).  Both
 * allocated, so that nothing can fail once the header is written.
 */
static int
stream_detach_base_name (struct qcow2_image *img, struct qcow2_image *base,
                         char **name, char **format)
{
  struct qcow2_image *above = img;

  *name = NULL;
  *format = NULL;
  if (!base)
    return 0;
  while (above->backing != base)
    above = above->backing;
  /* A relative name is relative to the image that records it: kept
   * when that image is in the top's folder.
   */
  const char *a = strrchr (above->path, '/'), *t = strrchr (img->path, '/');
  size_t alen = a ? a - above->path : 0, tlen = t ? t - img->path : 0;
  if (above == img || !qcow2_name_is_relative (above->h.backing_file) ||
      (alen == tlen && strncmp (above->path, img->path, alen) == 0))
    *name = strdup (above->h.backing_file);
  else
    *name = strdup (base->path);
  if (!*name || !(*format = strdup (base->raw ? "raw" : "qcow2"))) {
    free (*name);
    *name = NULL;
    return -errno;
  }
  return 0;
}

/* The header's first bytes, as read and as they become. */
#define DETACH_HEAD 4096
#define DETACH_SECTOR 512

/* Where the header's extensions go once rewritten. */
struct stream_detach_exts {
  uint64_t end;                 /* what must be written: a sector at most */
  uint64_t new_end;             /* the new list's, with its end mark */
  uint64_t format_at, bitmaps_at;       /* 0: none */
};

/* The header extensions of head (size bytes) rebuilt with the backing
 * format extension set to format (in its place, or added last), or
 * gone (NULL); the others keep their order.  What follows the new end
 * mark is never read, so only the bytes before it that change must be
 * written: -ENOTSUP unless they all lie in the first sector, and the
 * new list ends before limit.
 */
static int
stream_detach_exts (const struct qcow2_header *h, uint8_t *head,
                    size_t size, const char *format, uint64_t limit,
                    struct stream_detach_exts *x)
{
  CLEANUP_FREE uint8_t *out = calloc (1, size);
  uint64_t off = h->header_length, o = off, changed = 0;
  size_t flen = format ? strlen (format) : 0;
  uint64_t fpad = (flen + 7) & ~UINT64_C (7);

  if (!out)
    return -errno;
  x->format_at = x->bitmaps_at = 0;
  for (;;) {
    if (off > size || size - off < 8)
      return -ENOTSUP;
    uint32_t type = be32_get (head + off);
    uint64_t padded = ((uint64_t) be32_get (head + off + 4) + 7)
                      & ~UINT64_C (7);

    if (type == QCOW2_EXT_END)
      break;
    if (padded > size - off - 8)
      return -ENOTSUP;
    if (type == QCOW2_EXT_BACKING_FORMAT) {
      off += 8 + padded;
      if (!format || x->format_at)
        continue;
      /* The new format can be longer than the old one (an image's
       * empty one): the list grows, and must still fit with its end.
       */
      if (o + 8 + fpad > size - 8)
        return -ENOTSUP;
      x->format_at = o;
      padded = fpad;
      be32_put (out + o, QCOW2_EXT_BACKING_FORMAT);
      be32_put (out + o + 4, flen);
      memcpy (out + o + 8, format, flen);
    }
    else {
      if (o + 8 + padded > size - 8)
        return -ENOTSUP;
      if (type == QCOW2_EXT_BITMAPS)
        x->bitmaps_at = o;
      memcpy (out + o, head + off, 8 + padded);
      off += 8 + padded;
    }
    o += 8 + padded;
  }
  if (format && !x->format_at) {
    if (o + 8 + fpad > size - 8)
      return -ENOTSUP;
    x->format_at = o;
    be32_put (out + o, QCOW2_EXT_BACKING_FORMAT);
    be32_put (out + o + 4, flen);
    memcpy (out + o + 8, format, flen);
    o += 8 + fpad;
  }
  o += 8;                       /* the end mark: zeros */
  for (uint64_t i = h->header_length; i < o; i++)
    if (out[i] != head[i])
      changed = i + 1;
  if (o > limit || changed > DETACH_SECTOR)
    return -ENOTSUP;
  /* What the old list held past the new one, cleared in the sector. */
  x->end = MAX (changed, MIN (off + 8, DETACH_SECTOR));
  memcpy (head + h->header_length, out + h->header_length,
          x->end - h->header_length);
  x->new_end = o;
  return 0;
}

/* Rewrite the header's backing name in one crash-safe step: the new
 * name (if any) is written past everything the header cluster holds,
 * and made durable; then the fields that point at it, and the
 * extensions when the backing format changes, are written in one write
 * within the first sector.  Before the second write the image opens
 * with its old chain, after it with the new one.
 */
static int
stream_detach_write_header (struct qcow2_image *img, const char *name,
                            const char *format)
  TSA_REQUIRES (img->lock)
{
  struct qcow2_header *h = &img->h;
  struct stream_detach_exts x = { 0 };
  size_t size = MIN (DETACH_HEAD, img->geo.cluster_size);
  CLEANUP_FREE uint8_t *head = malloc (size);
  uint64_t at = 0, len = name ? strlen (name) : 0, first = HDR_BACKING_OFFSET;
  uint64_t last = HDR_BACKING_SIZE + 4;
  bool exts = format ? !h->backing_format ||
                       strcmp (format, h->backing_format) != 0
                     : h->backing_format != NULL;
  int r;

  if (!head)
    return -errno;
  /* The guard's map, if no write made it (a stream that copied nothing). */
  if ((r = state_prepare_writes (img)) < 0)
    return r;
  r = img->io->ops->pread (img->io, head, size, 0);
  if (r < 0) {
    log_error (img, "reading the header: %s", errstr (-r));
    return r;
  }
  if (name) {
    /* Past the format extension the list may gain (16 bytes). */
    at = (h->names_end + (exts ? 16 : 0) + 7) & ~UINT64_C (7);
    if (len > QCOW2_MAX_BACKING_NAME || at < h->names_end ||
        range_exceeds (at, len, img->geo.cluster_size)) {
      log_notice (img, "stream: no room in the header cluster for the name "
                  "of the base \"%s\": the backing link is kept", name);
      return -ENOSPC;
    }
  }
  if (exts &&
      (r = stream_detach_exts (h, head, size, format, name ? at : size,
                               &x)) < 0) {
    if (r != -ENOTSUP)
      return r;
    /* The old format stays with no backing file (QEMU ignores it), or
     * none is recorded for the base (QEMU probes it).
     */
    if (!format || !h->backing_format) {
      log_debug (img, "stream: the header extensions cannot be rewritten "
                 "in one sector: the backing format extension is left as "
                 "it is");
      exts = false;
    }
    else {
      log_notice (img, "stream: the backing format extension cannot be "
                  "rewritten in one step: the backing link is kept");
      return -ENOTSUP;
    }
  }
  if (name &&
      ((r = io_write_meta (img, name, len, at, "backing file name",
                           OL (MAIN_HEADER))) < 0 ||
       (r = io_flush (img)) < 0))
    return r;
  be64_put (head + HDR_BACKING_OFFSET, at);
  be32_put (head + HDR_BACKING_SIZE, len);
  if (exts)
    last = MAX (last, x.end);
  if ((r = io_write_meta (img, head + first, last - first, first,
                          "header", OL (MAIN_HEADER))) < 0 ||
      (r = io_flush (img)) < 0)
    return r;
  h->backing_file_offset = at;
  h->backing_file_size = len;
  h->names_end = MAX (h->names_end, at + len);
  if (exts) {
    h->backing_format_ext = x.format_at;
    if (h->has_bitmaps_ext && x.bitmaps_at)
      h->bitmaps_field_offset = x.bitmaps_at + 8 + 16;
    h->names_end = MAX (h->names_end, x.new_end);
  }
  return 0;
}

/* Whether dropping the layers above the base keeps what every guest
 * byte reads: a dropped layer shorter than the base hides the base's
 * bytes past its end (zeros), which the top would then show.
 */
static bool
stream_detach_sizes_agree (struct qcow2_image *img, struct qcow2_image *base)
{
  uint64_t limit = base ? MIN (base->size, img->size) : 0;

  for (struct qcow2_image *l = img->backing; l != base; l = l->backing)
    if (l->size < limit)
      return false;
  return true;
}

/* The chain in memory as the header now says: base below img (one
 * more user of it counted), the layers above it cut out (returned, to
 * be released: they may be shared, and stand on the base for their
 * other users, so none of them is changed), and the header's backing
 * name and format swapped with *name and *format.  The only change to
 * the backing chain once open (internal.h's lock contract).
 */
static struct qcow2_image *
stream_detach_swap (struct qcow2_image *img, struct qcow2_image *base,
                    char **name, char **format)
  TSA_REQUIRES (img->data_lock, img->lock)
{
  struct qcow2_image *dropped = img->backing;
  char *old;

  if (base)
    layers_hold (base);
  img->backing = base;
  old = img->h.backing_file;
  img->h.backing_file = *name;
  *name = old;
  old = img->h.backing_format;
  img->h.backing_format = *format;
  *format = old;
  return dropped;
}

/* Cut loose: the header names the base (or nothing), and the layers
 * above it are released.
 */
int
stream_detach (struct qcow2_image *img, struct qcow2_image *base)
{
  struct qcow2_image *dropped = NULL;
  CLEANUP_FREE char *name = NULL, *format = NULL;
  int r;

  if (!stream_detach_sizes_agree (img, base)) {
    log_notice (img, "stream: a layer above the base is shorter than the "
                "base: the backing link is kept");
    return -ENOTSUP;
  }
  if ((r = stream_detach_base_name (img, base, &name, &format)) < 0)
    return r;
  image_data_wrlock (img);
  image_lock (img);
  r = flush_locked (img);
  if (r == 0)
    r = stream_detach_write_header (img, name, format);
  if (r == 0)
    dropped = stream_detach_swap (img, base, &name, &format);
  image_unlock (img);
  image_data_unlock (img);
  if (r < 0)
    return r;
  if (dropped && layers_release (dropped))
    image_free (dropped);
  log_notice (img, "stream: the image no longer depends on \"%s\": its "
              "backing file is now %s%s%s", name ? name : "",
              img->h.backing_file ? "\"" : "",
              img->h.backing_file ? img->h.backing_file : "none",
              img->h.backing_file ? "\"" : "");
  return 0;
}
