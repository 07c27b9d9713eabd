/* The overlap guard: a map of where the image's metadata lives in the
 * host file, consulted before every write, so that a bug or a corrupt
 * image can never make a write land on metadata it is not meant to
 * touch.
 *
 * The file is cut into windows of 4096 clusters.  A window is held as a
 * short sorted list of fragments (start, length, type) or, while in use,
 * expanded to one byte per cluster; a small LRU keeps the expanded
 * windows.  A query is then a window lookup and, in an expanded window,
 * one byte per cluster: constant time, whatever the size of the image.
 * Memory stays near a pointer per window plus the fragments.
 *
 * Called with img->lock held.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

#define WINDOW_BITS 12
#define WINDOW_CLUSTERS (1u << WINDOW_BITS)
#define EXPANDED_MAX 16

struct overlap_fragment {
  uint16_t start;               /* cluster within the window */
  uint16_t len_minus_1;
  uint8_t type;                 /* index into overlap_names, 1-based */
};

struct overlap_window {
  struct overlap_fragment *frags;
  uint32_t nfrags, cap;
  uint8_t *bitmap;              /* expanded: a type per cluster, or NULL */
  uint64_t last_use;
};

struct overlap_map {
  struct overlap_window **windows;
  uint64_t nwindows;
  /* The expanded windows, so that finding the least recently used one
   * costs EXPANDED_MAX steps, not a walk over every window.
   */
  struct overlap_window *expanded[EXPANDED_MAX];
  uint32_t nexpanded;
  uint64_t clock;
};

/* Each structure's name in messages, and in overlap-check.NAME. */
static const struct {
  const char *name, *option;
} overlap_names[] = {
  [QCOW2_OL_MAIN_HEADER_BIT] = { "main header", "main-header" },
  [QCOW2_OL_ACTIVE_L1_BIT] = { "active L1 table", "active-l1" },
  [QCOW2_OL_ACTIVE_L2_BIT] = { "active L2 table", "active-l2" },
  [QCOW2_OL_REFCOUNT_TABLE_BIT] = { "refcount table", "refcount-table" },
  [QCOW2_OL_REFCOUNT_BLOCK_BIT] = { "refcount block", "refcount-block" },
  [QCOW2_OL_SNAPSHOT_TABLE_BIT] = { "snapshot table", "snapshot-table" },
  [QCOW2_OL_INACTIVE_L1_BIT] = { "inactive L1 table", "inactive-l1" },
  [QCOW2_OL_INACTIVE_L2_BIT] = { "inactive L2 table", "inactive-l2" },
  [QCOW2_OL_BITMAP_DIRECTORY_BIT] = { "bitmap directory",
                                      "bitmap-directory" },
};

const char *
overlap_name (unsigned bit)
{
  return bit < QCOW2_OL_MAX_BITS ? overlap_names[bit].name : "?";
}

struct overlap_map *
overlap_create (void)
{
  return calloc (1, sizeof (struct overlap_map));
}

void
overlap_destroy (struct overlap_map *m)
{
  if (!m)
    return;
  for (uint64_t i = 0; i < m->nwindows; i++) {
    if (m->windows[i]) {
      free (m->windows[i]->frags);
      free (m->windows[i]->bitmap);
      free (m->windows[i]);
    }
  }
  free (m->windows);
  free (m);
}

/* Fold an expanded window back into fragments and drop the bitmap. */
static int
overlap_collapse (struct overlap_map *m, struct overlap_window *w)
{
  uint32_t n = 0;

  for (uint32_t c = 0; c < WINDOW_CLUSTERS; ) {
    uint32_t e = c + 1;
    if (!w->bitmap[c]) {
      c++;
      continue;
    }
    while (e < WINDOW_CLUSTERS && w->bitmap[e] == w->bitmap[c])
      e++;
    if (n == w->cap) {
      uint32_t cap = w->cap ? w->cap * 2 : 4;
      struct overlap_fragment *f = realloc (w->frags, cap * sizeof *f);
      if (!f)
        return -ENOMEM;
      w->frags = f;
      w->cap = cap;
    }
    w->frags[n].start = c;
    w->frags[n].len_minus_1 = e - c - 1;
    w->frags[n].type = w->bitmap[c];
    n++;
    c = e;
  }
  w->nfrags = n;
  free (w->bitmap);
  w->bitmap = NULL;
  for (uint32_t i = 0; i < m->nexpanded; i++)
    if (m->expanded[i] == w) {
      m->expanded[i] = m->expanded[--m->nexpanded];
      break;
    }
  return 0;
}

/* Make room in the LRU of expanded windows. */
static int
overlap_evict (struct overlap_map *m)
{
  struct overlap_window *oldest = NULL;

  for (uint32_t i = 0; i < m->nexpanded; i++)
    if (!oldest || m->expanded[i]->last_use < oldest->last_use)
      oldest = m->expanded[i];
  return oldest ? overlap_collapse (m, oldest) : 0;
}

static int
overlap_expand (struct overlap_map *m, struct overlap_window *w)
{
  int r;

  w->last_use = ++m->clock;
  if (w->bitmap)
    return 0;
  if (m->nexpanded >= EXPANDED_MAX && (r = overlap_evict (m)) < 0)
    return r;
  w->bitmap = calloc (1, WINDOW_CLUSTERS);
  if (!w->bitmap)
    return -ENOMEM;
  for (uint32_t i = 0; i < w->nfrags; i++)
    memset (w->bitmap + w->frags[i].start, w->frags[i].type,
            w->frags[i].len_minus_1 + 1u);
  w->nfrags = 0;
  m->expanded[m->nexpanded++] = w;
  return 0;
}

static struct overlap_window *
overlap_window (struct overlap_map *m, uint64_t index, bool create)
{
  if (index >= m->nwindows) {
    if (!create)
      return NULL;
    uint64_t n = MAX (index + 1, m->nwindows * 2);
    struct overlap_window **p = realloc (m->windows, n * sizeof *p);
    if (!p)
      return NULL;
    memset (p + m->nwindows, 0, (n - m->nwindows) * sizeof *p);
    m->windows = p;
    m->nwindows = n;
  }
  if (!m->windows[index] && create)
    m->windows[index] = calloc (1, sizeof (struct overlap_window));
  return m->windows[index];
}

/* Mark clusters [first, first+n) as holding metadata of the 1-based
 * type value (0: none).
 */
int
overlap_set (struct overlap_map *m, uint64_t first, uint64_t n,
             unsigned value)
{
  while (n > 0) {
    uint64_t wi = first >> WINDOW_BITS;
    uint32_t in = first & (WINDOW_CLUSTERS - 1);
    uint32_t k = MIN (n, WINDOW_CLUSTERS - in);
    struct overlap_window *w = overlap_window (m, wi, value != 0);
    int r;

    if (value && !w)
      return -ENOMEM;
    if (w) {
      if ((r = overlap_expand (m, w)) < 0)
        return r;
      memset (w->bitmap + in, value, k);
    }
    first += k;
    n -= k;
  }
  return 0;
}

/* The 1-based type of metadata at cluster c, 0 if none.  Fragment
 * lists are searched without expanding, so a query never allocates.
 */
unsigned
overlap_type (struct overlap_map *m, uint64_t c)
{
  uint64_t wi = c >> WINDOW_BITS;
  uint32_t in = c & (WINDOW_CLUSTERS - 1);
  struct overlap_window *w;
  uint32_t lo, hi;

  if (wi >= m->nwindows || !(w = m->windows[wi]))
    return 0;
  if (w->bitmap) {
    w->last_use = ++m->clock;
    return w->bitmap[in];
  }
  for (lo = 0, hi = w->nfrags; lo < hi; ) {
    uint32_t mid = (lo + hi) / 2;
    const struct overlap_fragment *f = &w->frags[mid];
    if (in < f->start)
      hi = mid;
    else if (in > f->start + f->len_minus_1)
      lo = mid + 1;
    else
      return f->type;
  }
  return 0;
}

static int
overlap_set_range (struct qcow2_image *img, uint64_t offset, uint64_t len,
                   unsigned value)
{
  if (!img->overlap || len == 0)
    return 0;
  return overlap_set (img->overlap, offset >> img->cluster_bits,
                      ((offset + len - 1) >> img->cluster_bits)
                      - (offset >> img->cluster_bits) + 1, value);
}

/* Record that [offset, offset+len) holds metadata of type bit. */
int
overlap_add (struct qcow2_image *img, uint64_t offset, uint64_t len,
             unsigned bit)
{
  return overlap_set_range (img, offset, len, bit + 1);
}

/* Clusters freed: whatever metadata they held is gone. */
int
overlap_remove (struct qcow2_image *img, uint64_t offset, uint64_t len)
{
  return overlap_set_range (img, offset, len, 0);
}

/* The structures found from the header alone, checked directly. */
static int
overlap_fixed_type (const struct qcow2_image *img, uint64_t at)
{
  const struct qcow2_header *h = &img->h;
  uint64_t end = at + img->cluster_size;

  if (at == 0)
    return QCOW2_OL_MAIN_HEADER_BIT;
  if (h->l1_size && at < h->l1_table_offset + (uint64_t) h->l1_size * 8 &&
      end > h->l1_table_offset)
    return QCOW2_OL_ACTIVE_L1_BIT;
  if (at < h->refcount_table_offset
      + ((uint64_t) h->refcount_table_clusters << img->cluster_bits) &&
      end > h->refcount_table_offset)
    return QCOW2_OL_REFCOUNT_TABLE_BIT;
  if (img->nb_snapshots &&
      at < h->snapshots_offset + img->snapshot_table_bytes &&
      end > h->snapshots_offset)
    return QCOW2_OL_SNAPSHOT_TABLE_BIT;
  return -1;
}

/* A write must not happen: say what it would have destroyed, and mark
 * the image corrupt so that neither we nor QEMU write it again before
 * it is checked (reads keep working).
 */
static void
overlap_hit (struct qcow2_image *img, unsigned bit, uint64_t at,
             uint64_t offset, uint64_t len)
{
  qcow2_err (img, "overlap guard: a write of %" PRIu64 " bytes at host "
             "offset %#" PRIx64 " would overwrite the %s at %#" PRIx64 ": "
             "refused, and the image is marked corrupt",
             len, offset, overlap_name (bit), at);
  img->h.incompatible_features |= QCOW2_INCOMPAT_CORRUPT;
  if (img->h.version >= 3 && header_write_features (img) == 0)
    io_flush (img);
}

/* Before a write of [offset, offset+len) that may touch only the
 * structures in the mask ign: 0, or -EIO after marking the image
 * corrupt (the write must not happen).
 */
int
overlap_check (struct qcow2_image *img, uint64_t offset, uint64_t len,
               uint32_t ign)
{
  uint32_t checked = img->overlap_mask & ~ign;

  if (!checked || len == 0)
    return 0;
  for (uint64_t c = offset >> img->cluster_bits;
       c <= (offset + len - 1) >> img->cluster_bits; c++) {
    uint64_t at = c << img->cluster_bits;
    int bit = overlap_fixed_type (img, at);
    if (bit < 0 && img->overlap)
      bit = (int) overlap_type (img->overlap, c) - 1;
    if (bit >= 0 && (checked & (UINT32_C (1) << bit))) {
      overlap_hit (img, bit, at, offset, len);
      return -EIO;
    }
  }
  return 0;
}

int64_t
qcow2_overlap_mode (const char *mode)
{
  if (strcmp (mode, "none") == 0)
    return 0;
  if (strcmp (mode, "constant") == 0)
    return QCOW2_OL_CONSTANT;
  if (strcmp (mode, "cached") == 0)
    return QCOW2_OL_CACHED;
  if (strcmp (mode, "all") == 0)
    return QCOW2_OL_ALL;
  return -1;
}

int
qcow2_overlap_structure (const char *name)
{
  for (int i = 0; i < QCOW2_OL_MAX_BITS; i++)
    if (strcmp (name, overlap_names[i].option) == 0)
      return i;
  return -1;
}

/* At open, tables found in the image are mapped only where they lie in
 * the file: a corrupt entry pointing far away is reported when it is
 * used, not mapped at any cost.
 */
static int
overlap_add_found (struct qcow2_image *img, uint64_t offset, uint64_t len,
                   unsigned bit)
{
  if (range_exceeds (offset, len, img->file_size))
    return 0;
  /* Two structures in one cluster: writing either would destroy the
   * other, so the image is not written at all.  (A table used by the
   * active L1 and by snapshots is legitimately both.)
   */
  for (uint64_t c = offset >> img->cluster_bits;
       c <= (offset + len - 1) >> img->cluster_bits && !img->overlap_conflict;
       c++) {
    int other = overlap_fixed_type (img, c << img->cluster_bits);
    if (other < 0)
      other = (int) overlap_type (img->overlap, c) - 1;
    bool l2s = (other == QCOW2_OL_ACTIVE_L2_BIT ||
                other == QCOW2_OL_INACTIVE_L2_BIT) &&
               (bit == QCOW2_OL_ACTIVE_L2_BIT ||
                bit == QCOW2_OL_INACTIVE_L2_BIT);
    if (other >= 0 && other != (int) bit && !l2s) {
      snprintf (img->overlap_conflict_msg, sizeof img->overlap_conflict_msg,
                "metadata structures overlap at %#" PRIx64 ": %s and %s",
                c << img->cluster_bits, overlap_name (bit),
                overlap_name (other));
      img->overlap_conflict = true;
    }
  }
  return overlap_add (img, offset, len, bit);
}

static int
overlap_add_l1 (struct qcow2_image *img, const uint64_t *l1, uint32_t n,
                unsigned bit)
{
  int r = 0;

  for (uint32_t i = 0; i < n && r == 0; i++)
    if (l1[i] & QCOW2_OFFSET_MASK)
      r = overlap_add_found (img, l1[i] & QCOW2_OFFSET_MASK,
                             img->cluster_size, bit);
  return r;
}

/* Map the metadata of a writable image at open.  Inactive L2 tables
 * need every snapshot's L1 table read, so only when they are checked.
 */
int
overlap_build (struct qcow2_image *img)
{
  const uint32_t mapped = OL (ACTIVE_L2) | OL (REFCOUNT_BLOCK) |
    OL (INACTIVE_L1) | OL (INACTIVE_L2) | OL (BITMAP_DIRECTORY);
  const struct qcow2_header *h = &img->h;
  int r;

  if (!(img->overlap_mask & mapped))
    return 0;
  if (!(img->overlap = overlap_create ()))
    return -ENOMEM;
  for (uint64_t i = 0; i < img->reftable_size; i++) {
    uint64_t b = img->reftable[i] & ~UINT64_C (511);
    if (b && (r = overlap_add_found (img, b, img->cluster_size,
                                     QCOW2_OL_REFCOUNT_BLOCK_BIT)) < 0)
      return r;
  }
  for (uint32_t s = 0; s < img->nb_snapshots; s++) {
    const struct qcow2_snapshot *sn = &img->snapshots[s];
    uint64_t bytes = (uint64_t) sn->l1_size * 8;
    if ((r = overlap_add_found (img, sn->l1_table_offset, bytes,
                                QCOW2_OL_INACTIVE_L1_BIT)) < 0)
      return r;
    if (!(img->overlap_mask & OL (INACTIVE_L2)) || !bytes ||
        bytes > QCOW2_MAX_L1_BYTES ||
        range_exceeds (sn->l1_table_offset, bytes, img->file_size))
      continue;
    uint8_t *buf = malloc (bytes);
    uint64_t *l1 = malloc (bytes);
    r = buf && l1 ? img->io->ops->pread (img->io, buf, bytes,
                                         sn->l1_table_offset) : -ENOMEM;
    for (uint32_t i = 0; r == 0 && i < sn->l1_size; i++)
      l1[i] = be64_get (buf + (uint64_t) i * 8);
    if (r == 0)
      r = overlap_add_l1 (img, l1, sn->l1_size, QCOW2_OL_INACTIVE_L2_BIT);
    free (buf);
    free (l1);
    if (r < 0)
      return r;
  }
  /* Active after inactive: a table both use is active. */
  if ((r = overlap_add_l1 (img, img->l1, img->l1_size,
                           QCOW2_OL_ACTIVE_L2_BIT)) < 0)
    return r;
  if (h->has_bitmaps_ext && h->nb_bitmaps &&
      (h->autoclear_features & QCOW2_AUTOCLEAR_BITMAPS))
    return overlap_add_found (img, h->bitmap_directory_offset,
                              h->bitmap_directory_size,
                              QCOW2_OL_BITMAP_DIRECTORY_BIT);
  return 0;
}
