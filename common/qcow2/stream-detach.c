/* SPDX-License-Identifier: BSD-3-Clause */
/* The end of a stream (stream.c): the image cut loose from the layers
 * it no longer needs.  The header's backing name is rewritten in one
 * crash-safe step, to none or to the base, and the layers dropped are
 * closed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

/* The header's backing name and format, as they become: none, or the
 * base (its name resolved as the image names it, its format).
 */
static int
stream_detach_base_name (struct qcow2_image *img, struct qcow2_image *base,
                         char **name, const char **format)
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
  if (!*name)
    return -errno;
  *format = base->raw ? "raw" : "qcow2";
  return 0;
}

/* Rewrite the header's backing name in one crash-safe step: the new
 * name (if any) is written past everything the header cluster holds,
 * and made durable; then the fields that point at it, and the backing
 * format extension when it changes, are written in one write within
 * the first sector.  Before the second write the image opens with its
 * old chain, after it with the new one.
 */
static int
stream_detach_write_header (struct qcow2_image *img, const char *name,
                            const char *format)
  TSA_REQUIRES (img->lock)
{
  struct qcow2_header *h = &img->h;
  uint8_t sector[512];
  uint64_t at = 0, len = name ? strlen (name) : 0, first = HDR_BACKING_OFFSET;
  uint64_t last = HDR_BACKING_SIZE + 4;
  int r;

  if (name) {
    at = (h->names_end + 7) & ~UINT64_C (7);
    if (len > QCOW2_MAX_BACKING_NAME || at < h->names_end ||
        range_exceeds (at, len, img->geo.cluster_size)) {
      log_notice (img, "stream: no room in the header cluster for the name "
                  "of the base \"%s\": the backing link is kept", name);
      return -ENOSPC;
    }
    if ((r = io_write_meta (img, name, len, at, "backing file name",
                            OL (MAIN_HEADER))) < 0 ||
        (r = io_flush (img)) < 0)
      return r;
  }
  r = img->io->ops->pread (img->io, sector, sizeof sector, 0);
  if (r < 0) {
    log_error (img, "reading the header: %s", errstr (-r));
    return r;
  }
  be64_put (sector + HDR_BACKING_OFFSET, at);
  be32_put (sector + HDR_BACKING_SIZE, len);
  if (format && h->backing_format &&
      strcmp (format, h->backing_format) != 0) {
    uint64_t ext = h->backing_format_ext;
    size_t flen = strlen (format);

    /* "raw" and "qcow2" both pad to 8 bytes: the extension keeps its
     * size, so what follows it stays in place.
     */
    if (ext == 0 || ext + 16 > sizeof sector ||
        ((strlen (h->backing_format) + 7) & ~7u) != 8) {
      log_notice (img, "stream: the backing format extension cannot be "
                  "rewritten in one step: the backing link is kept");
      return -ENOTSUP;
    }
    be32_put (sector + ext + 4, flen);
    memset (sector + ext + 8, 0, 8);
    memcpy (sector + ext + 8, format, flen);
    last = MAX (last, ext + 16);
  }
  if ((r = io_write_meta (img, sector + first, last - first, first,
                          "header", OL (MAIN_HEADER))) < 0 ||
      (r = io_flush (img)) < 0)
    return r;
  h->backing_file_offset = at;
  h->backing_file_size = len;
  h->names_end = MAX (h->names_end, at + len);
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

/* Cut loose: the header names the base (or nothing), and the layers
 * above it are closed.
 */
int
stream_detach (struct qcow2_image *img, struct qcow2_image *base)
{
  struct qcow2_image *dropped = NULL;
  CLEANUP_FREE char *name = NULL;
  const char *format;
  char *old_name;
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
  if (r == 0) {
    struct qcow2_image *above = img;

    while (above->backing != base)
      above = above->backing;
    dropped = img->backing;
    above->backing = NULL;
    img->backing = base;
    old_name = img->h.backing_file;
    img->h.backing_file = name;
    name = old_name;
    if (format) {
      char *f = strdup (format);

      if (f) {
        free (img->h.backing_format);
        img->h.backing_format = f;
      }
    }
  }
  image_unlock (img);
  image_data_unlock (img);
  if (r < 0)
    return r;
  image_free (dropped);
  log_notice (img, "stream: the image no longer depends on \"%s\": its "
              "backing file is now %s%s%s", name ? name : "",
              img->h.backing_file ? "\"" : "",
              img->h.backing_file ? img->h.backing_file : "none",
              img->h.backing_file ? "\"" : "");
  return 0;
}
