/* SPDX-License-Identifier: BSD-3-Clause */
/* Persistent dirty bitmaps (the qcow2 bitmaps extension), kept up to
 * date as QEMU keeps them, so that backup tools that export them
 * (qemu-nbd -B) still copy exactly what changed.
 *
 * An enabled bitmap (flag "auto") that is consistent at open is loaded
 * into memory; every write, zero and trim sets its bits.  Before the
 * first change reaches the disk it is marked in use on disk, so that a
 * crash leaves it marked inconsistent, never silently stale.  A clean
 * close writes its data back and clears the mark.  Disabled bitmaps,
 * and bitmaps already in use at open, are left as they are.
 *
 * The data goes back in place: while the bitmap is marked in use no
 * reader trusts its clusters, so rewriting them is as safe as writing
 * new ones, and costs no allocation or free but for clusters that were
 * all zeros (table entry 0) and now have bits set.
 */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

#define BME_FLAG_IN_USE 1u
#define BME_FLAG_AUTO 2u
#define BME_RESERVED_FLAGS 0xfffffffcu
#define BME_TYPE_DIRTY 1
#define BME_MIN_GRANULARITY_BITS 9
#define BME_MAX_GRANULARITY_BITS 31
#define BME_MAX_NAME_SIZE 1023
#define BME_MAX_TABLE_SIZE 0x8000000u
#define BME_MAX_PHYS_SIZE 0x20000000u   /* bytes of bitmap data */
#define BME_TABLE_RESERVED 0xff000000000001feULL
#define BME_TABLE_ALL_ONES 1ULL
#define BME_FLAGS_FIELD 12              /* in a directory entry */

/* One bitmap kept up to date. */
struct bitmap_tracked {
  const struct bitmap_entry *e;
  uint64_t *table;              /* its table, in host order */
  uint64_t *bits;               /* one bit per granule, QEMU's order */
};

struct qcow2_bitmaps {
  uint8_t *dir;                 /* the directory as on disk */
  struct bitmap_entry *entries;
  uint32_t n;
  struct bitmap_tracked *t;
  uint32_t nt;
  bool marked;                  /* the tracked ones are in use on disk */
};

static int
bitmap_read (struct qcow2_image *img, void *buf, uint64_t len, uint64_t off,
             const char *what)
{
  int r;

  if (range_exceeds (off, len, image_file_size (img))) {
    log_error (img, "corrupt image: %s at %#" PRIx64 " (%" PRIu64 " bytes) "
               "lies beyond the end of the file", what, off, len);
    return -EIO;
  }
  r = img->io->ops->pread (img->io, buf, len, off);
  if (r < 0) {
    log_error (img, "reading %s at %#" PRIx64 ": %s", what, off,
               errstr (-r));
    return io_errno (r);
  }
  return 0;
}

int
bitmap_read_directory (struct qcow2_image *img, uint8_t **dirp,
                       struct bitmap_entry **entriesp)
{
  const struct qcow2_header *h = &img->h;
  uint64_t size = h->bitmap_directory_size, off = 0;
  struct bitmap_entry *entries;
  uint8_t *dir;
  int r;

  *dirp = NULL;
  *entriesp = NULL;
  if (size > BITMAP_MAX_DIR) {
    log_error (img, "corrupt image: bitmap directory of %" PRIu64 " bytes",
               size);
    return -EIO;
  }
  /* Each entry takes at least BITMAP_ENTRY_FIXED bytes of the
   * directory (and QEMU allows 65535 bitmaps): more cannot fit.
   */
  if (h->nb_bitmaps > BITMAP_MAX_COUNT ||
      (uint64_t) h->nb_bitmaps * BITMAP_ENTRY_FIXED > size) {
    log_error (img, "corrupt image: %" PRIu32 " bitmaps in a bitmap "
               "directory of %" PRIu64 " bytes (bitmaps extension, header "
               "extension field nb_bitmaps)", h->nb_bitmaps, size);
    return -EIO;
  }
  dir = malloc (size ? size : 1);
  entries = calloc (h->nb_bitmaps, sizeof *entries);
  if (!dir || !entries) {
    free (dir);
    free (entries);
    return -ENOMEM;
  }
  r = bitmap_read (img, dir, size, h->bitmap_directory_offset,
                   "bitmap directory");
  for (uint32_t i = 0; r == 0 && i < h->nb_bitmaps; i++) {
    struct bitmap_entry *e = &entries[i];

    if (range_exceeds (off, BITMAP_ENTRY_FIXED, size)) {
      r = -EIO;
      break;
    }
    e->pos = off;
    e->table_offset = be64_get (dir + off);
    e->table_size = be32_get (dir + off + 8);
    e->flags = be32_get (dir + off + BME_FLAGS_FIELD);
    e->type = dir[off + 16];
    e->granularity_bits = dir[off + 17];
    e->name_size = be16_get (dir + off + 18);
    e->extra_size = be32_get (dir + off + 20);
    off += BITMAP_ENTRY_FIXED + (uint64_t) e->extra_size + e->name_size;
    if (off > size) {
      r = -EIO;
      break;
    }
    e->name = (const char *) dir + off - e->name_size;
    off = (off + 7) & ~UINT64_C (7);
  }
  if (r == -EIO)
    log_error (img, "corrupt image: bad bitmap directory");
  if (r < 0) {
    free (dir);
    free (entries);
    return r;
  }
  *dirp = dir;
  *entriesp = entries;
  return 0;
}

/* Whether QEMU would load the bitmap (check_dir_entry in QEMU's
 * qcow2-bitmap.c): else it cannot be kept, and the image is not
 * opened for writing.
 */
static int
bitmap_check_entry (struct qcow2_image *img, const struct bitmap_entry *e)
{
  uint64_t phys = (uint64_t) e->table_size * img->geo.cluster_size;
  const char *why = NULL;

  if (e->type != BME_TYPE_DIRTY)
    why = "is not a dirty tracking bitmap";
  else if (e->extra_size)
    why = "has extra data";
  else if (e->flags & BME_RESERVED_FLAGS)
    why = "has reserved flags set";
  else if (e->granularity_bits < BME_MIN_GRANULARITY_BITS ||
           e->granularity_bits > BME_MAX_GRANULARITY_BITS)
    why = "has an invalid granularity";
  else if (e->name_size > BME_MAX_NAME_SIZE)
    why = "has too long a name";
  else if (!e->table_size || e->table_size > BME_MAX_TABLE_SIZE ||
           !e->table_offset ||
           (e->table_offset & (img->geo.cluster_size - 1)) ||
           phys > BME_MAX_PHYS_SIZE ||
           img->h.size > (phys * 8) << e->granularity_bits)
    why = "has an invalid table";
  if (!why)
    return 0;
  log_error (img, "bitmap \"%.*s\" %s: it cannot be kept up to date, so the "
             "image cannot be written (as in QEMU)\n"
             "serve it read-only", e->name_size, e->name, why);
  return -ENOTSUP;
}

/* Read the table of a tracked bitmap, and its data into bits. */
static int
bitmap_load (struct qcow2_image *img, struct bitmap_tracked *t)
{
  const struct bitmap_entry *e = t->e;
  uint64_t cs = img->geo.cluster_size;
  uint8_t *buf = malloc ((uint64_t) e->table_size * 8);
  int r;

  t->table = malloc ((uint64_t) e->table_size * 8);
  /* Whole clusters, so that each is read and written in one piece
   * (bitmap_check_entry made sure they hold a bit per granule).
   */
  t->bits = calloc (1, (uint64_t) e->table_size * cs);
  if (!buf || !t->table || !t->bits) {
    free (buf);
    return -ENOMEM;
  }
  r = bitmap_read (img, buf, (uint64_t) e->table_size * 8, e->table_offset,
                   "bitmap table");
  for (uint32_t i = 0; r == 0 && i < e->table_size; i++) {
    uint64_t entry = be64_get (buf + (uint64_t) i * 8);
    uint64_t off = entry & QCOW2_OFFSET_MASK;
    uint8_t *chunk = (uint8_t *) t->bits + (uint64_t) i * cs;

    t->table[i] = entry;
    if ((entry & BME_TABLE_RESERVED) || (off && (entry & BME_TABLE_ALL_ONES)) ||
        (off & (cs - 1))) {
      log_error (img, "corrupt image: bitmap \"%.*s\": bad table entry %"
                 PRIu32 " (%#" PRIx64 ")", e->name_size, e->name, i, entry);
      r = -EIO;
    }
    else if (off)
      r = bitmap_read (img, chunk, cs, off, "bitmap data");
    else if (entry & BME_TABLE_ALL_ONES)
      memset (chunk, 0xff, cs);
  }
  free (buf);
  return r;
}

void
bitmap_free (struct qcow2_image *img)
{
  struct qcow2_bitmaps *b = img->bitmaps;

  if (!b)
    return;
  for (uint32_t i = 0; i < b->nt; i++) {
    free (b->t[i].table);
    free (b->t[i].bits);
  }
  free (b->t);
  free (b->entries);
  free (b->dir);
  free (b);
  img->bitmaps = NULL;
}

int
bitmap_open (struct qcow2_image *img)
{
  const struct qcow2_header *h = &img->h;
  struct qcow2_bitmaps *b;
  int r;

  if (!h->has_bitmaps_ext || !h->nb_bitmaps ||
      !(h->autoclear_features & QCOW2_AUTOCLEAR_BITMAPS))
    return 0;
  if (!(b = calloc (1, sizeof *b)))
    return -ENOMEM;
  img->bitmaps = b;
  if ((r = bitmap_read_directory (img, &b->dir, &b->entries)) < 0)
    return r;
  b->n = h->nb_bitmaps;
  if (!(b->t = calloc (b->n, sizeof *b->t)))
    return -ENOMEM;
  for (uint32_t i = 0; i < b->n; i++) {
    const struct bitmap_entry *e = &b->entries[i];

    if ((r = bitmap_check_entry (img, e)) < 0 ||
        (r = overlap_add_found (img, e->table_offset,
                                (uint64_t) e->table_size * 8,
                                QCOW2_OL_BITMAP_DIRECTORY_BIT)) < 0)
      return r;
    /* The user's next incremental backup would miss changes. */
    if ((e->flags & BME_FLAG_IN_USE) && !img->below)
      log_notice (img, "bitmap \"%.*s\" is in use (qemu-img info: "
                  "in-use): inconsistent, left as it is\n"
                  "the image was not closed cleanly while the bitmap "
                  "tracked changes: the next backup must be a full one "
                  "(qemu-img bitmap --remove, then --add, starts a new "
                  "bitmap)", (int) e->name_size, e->name);
    if ((e->flags & (BME_FLAG_AUTO | BME_FLAG_IN_USE)) != BME_FLAG_AUTO)
      continue;
    b->t[b->nt].e = e;
    if ((r = bitmap_load (img, &b->t[b->nt++])) < 0)
      return r;
  }
  if (b->nt == 0)
    bitmap_free (img);
  return 0;
}

/* A change of guest [offset, offset+len): its granules are dirty in
 * every tracked bitmap.  Needs no lock: bits are only ever set.
 */
void
bitmap_record (struct qcow2_image *img, uint64_t offset, uint64_t len)
{
  struct qcow2_bitmaps *b = img->bitmaps;

  if (!b || len == 0)
    return;
  for (uint32_t i = 0; i < b->nt; i++) {
    struct bitmap_tracked *t = &b->t[i];
    unsigned g = t->e->granularity_bits;
    uint64_t first = offset >> g, last = (offset + len - 1) >> g;

    for (uint64_t w = first / 64; w <= last / 64; w++) {
      uint64_t lo = w == first / 64 ? first % 64 : 0;
      uint64_t hi = w == last / 64 ? last % 64 : 63;
      uint64_t mask = (hi == 63 ? ~UINT64_C (0) : (UINT64_C (1) << (hi + 1)) - 1)
        & ~((UINT64_C (1) << lo) - 1);
      /* QEMU's serialized order: little-endian 64-bit words. */
      __atomic_fetch_or (&t->bits[w], htole64 (mask), __ATOMIC_RELAXED);
    }
  }
}

/* Write the flags of the tracked bitmaps' directory entries, set or
 * clear in use, in place.
 */
static int
bitmap_write_flags (struct qcow2_image *img, uint32_t set)
  TSA_REQUIRES (img->lock)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  int r;

  for (uint32_t i = 0; i < b->nt; i++) {
    const struct bitmap_entry *e = b->t[i].e;
    uint32_t flags = e->flags | set;
    uint8_t *field = b->dir + e->pos + BME_FLAGS_FIELD;

    be32_put (field, flags);
    r = io_write_meta (img, field, 4,
                       img->h.bitmap_directory_offset + e->pos +
                       BME_FLAGS_FIELD, "bitmap directory",
                       OL (BITMAP_DIRECTORY));
    if (r < 0)
      return r;
  }
  return io_flush (img);
}

/* Before the first change reaches the disk (state_begin_write). */
int
bitmap_begin_write (struct qcow2_image *img)
{
  int r;

  if (!img->bitmaps || img->bitmaps->marked)
    return 0;
  if ((r = bitmap_write_flags (img, BME_FLAG_IN_USE)) < 0)
    return r;
  img->bitmaps->marked = true;
  return 0;
}

/* Write a tracked bitmap's data back: clusters that have bits in place,
 * new clusters for those that were all zeros, and the table if it
 * changed.  Their refcounts are flushed before the mark is cleared.
 */
static int
bitmap_store_one (struct qcow2_image *img, struct bitmap_tracked *t)
  TSA_REQUIRES (img->lock)
{
  const struct bitmap_entry *e = t->e;
  uint64_t cs = img->geo.cluster_size;
  bool table_changed = false;
  uint8_t *buf;
  int r = 0;

  for (uint32_t i = 0; i < e->table_size && r == 0; i++) {
    const uint8_t *chunk = (const uint8_t *) t->bits + (uint64_t) i * cs;
    uint64_t off = t->table[i] & QCOW2_OFFSET_MASK;
    bool zeros;

    if (t->table[i] & BME_TABLE_ALL_ONES)
      continue;                 /* bits are only ever set */
    zeros = chunk[0] == 0 && memcmp (chunk, chunk + 1, cs - 1) == 0;
    if (!off && zeros)
      continue;
    if (!off) {
      bool zeroed;
      if ((r = alloc_clusters (img, 1, &off, &zeroed)) < 0)
        break;
      t->table[i] = off;
      table_changed = true;
    }
    r = io_write_meta (img, chunk, cs, off, "bitmap data", 0);
  }
  if (r < 0 || !table_changed)
    return r;
  if (!(buf = malloc ((uint64_t) e->table_size * 8)))
    return -ENOMEM;
  for (uint32_t i = 0; i < e->table_size; i++)
    be64_put (buf + (uint64_t) i * 8, t->table[i]);
  /* New data clusters' refcounts and contents before the table that
   * points at them.
   */
  flush_mark_dependency (img);
  if ((r = flush_l2_dependencies (img)) == 0)
    r = io_write_meta (img, buf, (uint64_t) e->table_size * 8,
                       e->table_offset, "bitmap table",
                       OL (BITMAP_DIRECTORY));
  free (buf);
  return r;
}

/* Clean close: every tracked bitmap's data written and durable, then
 * its in-use mark cleared.
 */
int
bitmap_store (struct qcow2_image *img)
{
  struct qcow2_bitmaps *b = img->bitmaps;
  int r;

  if (!b || !b->marked)
    return 0;
  for (uint32_t i = 0; i < b->nt; i++)
    if ((r = bitmap_store_one (img, &b->t[i])) < 0)
      return r;
  if ((r = flush_locked (img)) < 0 || (r = io_flush (img)) < 0 ||
      (r = bitmap_write_flags (img, 0)) < 0)
    return r;
  b->marked = false;
  return 0;
}
