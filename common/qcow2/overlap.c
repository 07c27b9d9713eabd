/* SPDX-License-Identifier: BSD-3-Clause */
/* The overlap guard: a map of where the image's metadata lives in the
 * host file, consulted before every write, so that a bug or a corrupt
 * image can never make a write land on metadata it is not meant to
 * touch.
 *
 * The file is cut into windows of 4096 clusters.  A window is held as a
 * short sorted list of fragments (start, length, type) or, while it is
 * being changed, expanded to one byte per cluster; a small LRU keeps
 * the expanded windows.  Each window costs one 8-byte slot, and a
 * window with a single fragment (the common case with 64 KiB clusters)
 * holds it in the slot itself, so memory stays near four bytes per
 * metadata fragment.  A long list (small clusters) comes with an index
 * by blocks of 64 clusters.
 *
 * A query is a slot lookup plus a search of a short list, of one
 * block's fragments, or one byte of a bitmap: constant time, whatever
 * the size of the image.  A write is checked once for its whole range.
 * Most writes need no lookup: those past the highest metadata ever
 * mapped (a growing file's), and those in the run of clusters known to
 * hold no metadata that the last range check or the growth left.
 *
 * Called with img->lock held.
 */
#include <endian.h>
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
#define WINDOW_MASK (WINDOW_CLUSTERS - 1)
#define EXPANDED_MAX 16

/* A fragment in 32 bits, laid out so that comparing two fragments as
 * integers compares their starts: start (12 bits), length - 1 (12
 * bits), type (8 bits, 1-based).
 */
typedef uint32_t frag_t;

static inline frag_t
frag_make (uint32_t start, uint32_t len, unsigned type)
{
  return start << 20 | (len - 1) << 8 | type;
}

static inline uint32_t
frag_start (frag_t f)
{
  return f >> 20;
}

static inline uint32_t
frag_end (frag_t f)
{
  return (f >> 20) + ((f >> 8) & 0xfff) + 1;
}

static inline unsigned
frag_type (frag_t f)
{
  return f & 0xff;
}

/* A window's slot:
 *   0                          no metadata
 *   frag << 2 | SLOT_INLINE    one fragment, held in the slot
 *   i << 2 | SLOT_EXPANDED     expanded, in map->expanded[i]
 *   a pointer (low bits 00)    a struct overlap_list
 *   a pointer | SLOT_INDEXED   an index, then a struct overlap_list
 */
#define SLOT_INLINE 1
#define SLOT_EXPANDED 2
#define SLOT_INDEXED 3

/* A list of more than INDEX_MIN fragments comes after an index: for
 * each block of 64 clusters, the first fragment that ends after the
 * block's start (low 16 bits) and the structures found in the block
 * (high 16 bits, bit type - 1), and n at the end.  A lookup then
 * searches only the fragments of one block, and a structure written
 * back in a block that holds no other needs no search at all.  (With
 * 512-byte clusters, a window of a growing file holds about 80
 * fragments.)
 */
#define INDEX_MIN 8
#define INDEX_BLOCKS (WINDOW_CLUSTERS / 64)
#define INDEX_BYTES ((INDEX_BLOCKS + 1) * sizeof (uint32_t))

struct overlap_list {
  uint32_t n;
  frag_t f[];
};

/* What a list slot points to: the allocation, the index (or NULL), the
 * list.
 */
static inline void *
slot_ptr (uint64_t slot)
{
  return (void *) (uintptr_t) (slot & ~UINT64_C (3));
}

static inline const uint32_t *
slot_index (uint64_t slot)
{
  return (slot & 3) == SLOT_INDEXED ? slot_ptr (slot) : NULL;
}

static inline const struct overlap_list *
slot_list (uint64_t slot)
{
  return (const void *) ((const char *) slot_ptr (slot) +
                         ((slot & 3) == SLOT_INDEXED ? INDEX_BYTES : 0));
}

static inline bool
slot_is_list (uint64_t slot)
{
  return slot && ((slot & 3) == 0 || (slot & 3) == SLOT_INDEXED);
}

/* An expanded window: a type per cluster, and a bit per 64 clusters
 * saying whether any of them holds metadata, so that finding the next
 * or previous metadata cluster skips empty stretches at once.
 */
struct overlap_expanded {
  uint64_t window;
  uint64_t last_use;
  uint64_t summary;
  uint8_t type[WINDOW_CLUSTERS];
};

struct overlap_map {
  uint64_t *slots;
  uint64_t nslots;
  struct overlap_expanded *expanded[EXPANDED_MAX];
  uint32_t nexpanded;
  unsigned bits;                /* log2 of the cluster size */
  uint64_t clock;
  /* Bytes [free_lo, free_hi) hold no metadata of any kind, nor do bytes
   * at or after end (a high-water mark: it never comes down), where a
   * growing file allocates.  In bytes, so that overlap_check compares
   * them with a write as it comes.
   */
  uint64_t free_lo, free_hi, end;
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

/* The map of an image without the guard (overlap-check=none, or read
 * only): empty and never changed.  With end 0, overlap_check answers at
 * its first comparison, and needs no test for a missing map.
 */
struct overlap_map overlap_off;

struct overlap_map *
overlap_create (void)
{
  return calloc (1, sizeof (struct overlap_map));
}

void
overlap_destroy (struct overlap_map *m)
{
  if (!m || m == &overlap_off)
    return;
  for (uint64_t i = 0; i < m->nslots; i++)
    if (slot_is_list (m->slots[i]))
      free (slot_ptr (m->slots[i]));
  for (uint32_t i = 0; i < m->nexpanded; i++)
    free (m->expanded[i]);
  free (m->slots);
  free (m);
}

/* The fragments of a window that is not expanded; *tmp holds an inline
 * one.
 */
static const frag_t *
overlap_frags (uint64_t slot, frag_t *tmp, uint32_t *n)
{
  if (slot == 0) {
    *n = 0;
    return NULL;
  }
  if ((slot & 3) == SLOT_INLINE) {
    *tmp = slot >> 2;
    *n = 1;
    return tmp;
  }
  *n = slot_list (slot)->n;
  return slot_list (slot)->f;
}

/* The first fragment that ends after cluster in (index: the list's, or
 * NULL).
 */
static uint32_t
overlap_search (const frag_t *f, uint32_t n, const uint32_t *index,
                uint32_t in)
{
  uint32_t lo = 0, hi = n;

  if (index) {
    lo = index[in >> 6] & 0xffff;
    hi = index[(in >> 6) + 1] & 0xffff;
  }
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (frag_end (f[mid]) <= in)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Update the summary bits of the blocks of [in, in+k), just set to
 * value: metadata sets them at once; clearing must look at the rest of
 * each block.
 */
static void
overlap_summarize (struct overlap_expanded *e, uint32_t in, uint32_t k,
                   unsigned value)
{
  if (value) {
    e->summary |= (~UINT64_C (0) << (in >> 6)) &
                  (~UINT64_C (0) >> (63 - ((in + k - 1) >> 6)));
    return;
  }
  for (uint32_t b = in >> 6; b <= (in + k - 1) >> 6; b++) {
    uint64_t any = 0, word;
    for (uint32_t i = 0; i < 64; i += 8) {
      memcpy (&word, e->type + (b << 6) + i, 8);
      any |= word;
    }
    if (any)
      e->summary |= UINT64_C (1) << b;
    else
      e->summary &= ~(UINT64_C (1) << b);
  }
}

/* The first nonzero byte of type[in, end), end within in's block of
 * 64, or end: eight bytes at a time.
 */
static uint32_t
overlap_block_next (const uint8_t *type, uint32_t in, uint32_t end)
{
  while (in < end) {
    uint64_t word;
    uint32_t at = in & ~7u;
    memcpy (&word, type + at, 8);
    word = le64toh (word) & (~UINT64_C (0) << (in - at) * 8);
    if (word) {
      uint32_t c = at + __builtin_ctzll (word) / 8;
      return MIN (c, end);
    }
    in = at + 8;
  }
  return end;
}

/* One past the last nonzero byte of type[start, in], start within in's
 * block of 64, or start.
 */
static uint32_t
overlap_block_prev (const uint8_t *type, uint32_t in, uint32_t start)
{
  for (;;) {
    uint64_t word;
    uint32_t at = in & ~7u;
    memcpy (&word, type + at, 8);
    word = le64toh (word) & (~UINT64_C (0) >> (7 - (in - at)) * 8);
    if (word) {
      uint32_t c = at + (63 - __builtin_clzll (word)) / 8 + 1;
      return MAX (c, start);
    }
    if (at <= start)
      return start;
    in = at - 1;
  }
}

/* The first cluster at or after in with metadata in an expanded
 * window, or WINDOW_CLUSTERS.
 */
static uint32_t
overlap_bytes_next (const struct overlap_expanded *e, uint32_t in)
{
  while (in < WINDOW_CLUSTERS) {
    uint64_t blocks = e->summary & (~UINT64_C (0) << (in >> 6));
    if (!blocks)
      break;
    uint32_t b = __builtin_ctzll (blocks);
    uint32_t end = (b + 1) << 6;
    in = overlap_block_next (e->type, MAX (in, b << 6), end);
    if (in < end)
      return in;
  }
  return WINDOW_CLUSTERS;
}

/* One past the last cluster at or before in with metadata in an
 * expanded window, or 0.
 */
static uint32_t
overlap_bytes_prev (const struct overlap_expanded *e, uint32_t in)
{
  for (;;) {
    uint64_t blocks = e->summary & ((UINT64_C (2) << (in >> 6)) - 1);
    if (!blocks)
      return 0;
    uint32_t b = 63 - __builtin_clzll (blocks);
    uint32_t c = overlap_block_prev (e->type, MIN (in, (b << 6) + 63),
                                     b << 6);
    if (c > b << 6 || b == 0)
      return c;
    in = (b << 6) - 1;
  }
}

/* Fold an expanded window back into fragments. */
static int
overlap_collapse (struct overlap_map *m, uint32_t i)
{
  struct overlap_expanded *e = m->expanded[i];
  frag_t f[WINDOW_CLUSTERS];    /* two types may alternate */
  uint32_t n = 0;
  uint64_t slot = 0;

  for (uint32_t c = overlap_bytes_next (e, 0); c < WINDOW_CLUSTERS;
       c = overlap_bytes_next (e, c)) {
    uint32_t end = c + 1;
    while (end < WINDOW_CLUSTERS && e->type[end] == e->type[c])
      end++;
    f[n++] = frag_make (c, end - c, e->type[c]);
    c = end;
  }
  if (n == 1)
    slot = (uint64_t) f[0] << 2 | SLOT_INLINE;
  else if (n > 1) {
    size_t index_size = n > INDEX_MIN ? INDEX_BYTES : 0;
    char *p = malloc (index_size + sizeof (struct overlap_list)
                      + n * sizeof (frag_t));
    struct overlap_list *l = (struct overlap_list *) (p + index_size);
    if (!p)
      return -ENOMEM;
    l->n = n;
    memcpy (l->f, f, n * sizeof (frag_t));
    slot = (uintptr_t) p;
    if (index_size) {
      uint32_t *index = (uint32_t *) p;
      uint32_t k = 0;
      for (uint32_t b = 0; b < INDEX_BLOCKS; b++) {
        uint32_t types = 0;
        while (k < n && frag_end (f[k]) <= b << 6)
          k++;
        for (uint32_t j = k; j < n && frag_start (f[j]) < (b + 1) << 6; j++)
          types |= UINT32_C (1) << (frag_type (f[j]) - 1);
        index[b] = types << 16 | k;
      }
      index[INDEX_BLOCKS] = n;
      slot |= SLOT_INDEXED;
    }
  }
  m->slots[e->window] = slot;
  free (e);
  m->expanded[i] = m->expanded[--m->nexpanded];
  if (i < m->nexpanded)
    m->slots[m->expanded[i]->window] = (uint64_t) i << 2 | SLOT_EXPANDED;
  return 0;
}

/* Collapse every expanded window and drop the slack of the slot
 * array: the map at rest.
 */
int
overlap_compact (struct overlap_map *m)
{
  uint64_t n = m->nslots;
  int r;

  while (m->nexpanded)
    if ((r = overlap_collapse (m, 0)) < 0)
      return r;
  while (n > 0 && m->slots[n - 1] == 0)
    n--;
  if (n < m->nslots) {
    uint64_t *p = n ? realloc (m->slots, n * sizeof *p) : NULL;
    if (n && !p)
      return 0;                 /* keep the larger array */
    if (!n)
      free (m->slots);
    m->slots = p;
    m->nslots = n;
    m->end = MIN (m->end, (n << WINDOW_BITS) << m->bits);
  }
  return 0;
}

/* Window wi, expanded (evicting the least recently used expanded
 * window if need be).
 */
static struct overlap_expanded *
overlap_expand (struct overlap_map *m, uint64_t wi)
{
  uint64_t slot = m->slots[wi];
  struct overlap_expanded *e;
  const frag_t *f;
  frag_t tmp;
  uint32_t n;

  if ((slot & 3) == SLOT_EXPANDED) {
    e = m->expanded[slot >> 2];
    e->last_use = ++m->clock;
    return e;
  }
  if (m->nexpanded == EXPANDED_MAX) {
    uint32_t oldest = 0;
    for (uint32_t i = 1; i < m->nexpanded; i++)
      if (m->expanded[i]->last_use < m->expanded[oldest]->last_use)
        oldest = i;
    if (overlap_collapse (m, oldest) < 0)
      return NULL;
  }
  if (!(e = malloc (sizeof *e)))
    return NULL;
  e->window = wi;
  e->last_use = ++m->clock;
  e->summary = 0;
  memset (e->type, 0, sizeof e->type);
  f = overlap_frags (slot, &tmp, &n);
  for (uint32_t i = 0; i < n; i++) {
    memset (e->type + frag_start (f[i]), frag_type (f[i]),
            frag_end (f[i]) - frag_start (f[i]));
    overlap_summarize (e, frag_start (f[i]),
                       frag_end (f[i]) - frag_start (f[i]), frag_type (f[i]));
  }
  if (slot_is_list (slot))
    free (slot_ptr (slot));
  m->slots[wi] = (uint64_t) m->nexpanded << 2 | SLOT_EXPANDED;
  m->expanded[m->nexpanded++] = e;
  return e;
}

static int
overlap_grow (struct overlap_map *m, uint64_t wi)
{
  uint64_t n = MAX (wi + 1, m->nslots + m->nslots / 4);
  uint64_t *p = realloc (m->slots, n * sizeof *p);

  if (!p)
    return -ENOMEM;
  memset (p + m->nslots, 0, (n - m->nslots) * sizeof *p);
  m->slots = p;
  m->nslots = n;
  return 0;
}

/* Mark clusters [first, first+n) as holding metadata of the 1-based
 * type value (0: none).
 */
int
overlap_set (struct overlap_map *m, uint64_t first, uint64_t n,
             unsigned value)
{
  if (n == 0)
    return 0;
  if (value) {
    uint64_t lo = first << m->bits, hi = (first + n) << m->bits;
    uint64_t last_wi = (first + n - 1) >> WINDOW_BITS;
    int r;

    /* The slots cover end, so that overlap_check need not test it. */
    if (last_wi >= m->nslots && (r = overlap_grow (m, last_wi)) < 0)
      return r;
    if (lo >= m->end) {
      /* The file grows: what it skips holds no metadata. */
      m->free_lo = m->end;
      m->free_hi = lo;
    }
    else if (lo < m->free_hi && hi > m->free_lo)
      m->free_lo = m->free_hi = 0;
    m->end = MAX (m->end, hi);
  }
  while (n > 0) {
    uint64_t wi = first >> WINDOW_BITS;
    uint32_t in = first & WINDOW_MASK;
    uint32_t k = MIN (n, WINDOW_CLUSTERS - in);
    struct overlap_expanded *e;

    if (wi >= m->nslots)
      return 0;                 /* clearing: nothing there */
    if (value || m->slots[wi]) {
      if (!(e = overlap_expand (m, wi)))
        return -ENOMEM;
      memset (e->type + in, value, k);
      overlap_summarize (e, in, k, value);
    }
    first += k;
    n -= k;
  }
  return 0;
}

/* The first metadata cluster of window wi at or after in (or
 * WINDOW_CLUSTERS), its type in *type.
 */
static uint32_t
overlap_window_next (const struct overlap_map *m, uint64_t wi, uint32_t in,
                     unsigned *type)
{
  uint64_t slot = m->slots[wi];

  if ((slot & 3) == SLOT_EXPANDED) {
    const struct overlap_expanded *e = m->expanded[slot >> 2];
    in = overlap_bytes_next (e, in);
    if (in < WINDOW_CLUSTERS)
      *type = e->type[in];
    return in;
  }
  frag_t tmp;
  uint32_t n;
  const frag_t *f = overlap_frags (slot, &tmp, &n);
  uint32_t i = overlap_search (f, n, slot_index (slot), in);
  if (i == n)
    return WINDOW_CLUSTERS;
  *type = frag_type (f[i]);
  return MAX (in, frag_start (f[i]));
}

/* One past the last metadata cluster of window wi at or before in (0
 * if none).
 */
static uint32_t
overlap_window_prev (const struct overlap_map *m, uint64_t wi, uint32_t in)
{
  uint64_t slot = m->slots[wi];

  if ((slot & 3) == SLOT_EXPANDED) {
    return overlap_bytes_prev (m->expanded[slot >> 2], in);
  }
  frag_t tmp;
  uint32_t n;
  const frag_t *f = overlap_frags (slot, &tmp, &n);
  uint32_t i = overlap_search (f, n, slot_index (slot), in);
  if (i < n && frag_start (f[i]) <= in)
    return in + 1;
  return i > 0 ? frag_end (f[i - 1]) : 0;
}

/* The first metadata cluster in [c, end), or end. */
static uint64_t
overlap_next (const struct overlap_map *m, uint64_t c, uint64_t end,
              unsigned *type)
{
  while (c < end) {
    uint64_t wi = c >> WINDOW_BITS;
    if (wi >= m->nslots)
      return end;
    uint32_t hit = overlap_window_next (m, wi, c & WINDOW_MASK, type);
    uint64_t base = wi << WINDOW_BITS;
    if (hit < WINDOW_CLUSTERS)
      return MIN (base + hit, end);
    c = base + WINDOW_CLUSTERS;
  }
  return end;
}

/* The start of the metadata-free run that ends at c (inclusive),
 * looking no further back than floor.
 */
static uint64_t
overlap_free_start (const struct overlap_map *m, uint64_t c, uint64_t floor)
{
  for (;;) {
    uint64_t wi = c >> WINDOW_BITS;
    uint64_t base = wi << WINDOW_BITS;
    uint32_t after = wi < m->nslots ?
      overlap_window_prev (m, wi, c & WINDOW_MASK) : 0;
    if (after > 0 || base <= floor)
      return MAX (base + after, floor);
    c = base - 1;
  }
}

/* The 1-based type of metadata at cluster c if it is one of the
 * structures in want (bit type - 1), else 0.  Inlined into
 * overlap_check, where it answers most metadata writes; there c lies
 * below end, which the slots cover (below_end).
 */
static inline __attribute__ ((always_inline)) unsigned
overlap_type_in (const struct overlap_map *m, uint64_t c, uint32_t want,
                 bool below_end)
{
  uint64_t wi = c >> WINDOW_BITS;
  uint32_t in = c & WINDOW_MASK;
  const struct overlap_list *l;
  const frag_t *f, *end;
  uint64_t slot;
  unsigned type = 0;
  uint32_t e;

  if (!below_end && wi >= m->nslots)
    return 0;
  slot = m->slots[wi];
  switch (slot & 3) {
  case SLOT_INDEXED:
    /* The few fragments of in's block, if it holds a structure wanted
     * (the common case with small clusters).
     */
    e = ((const uint32_t *) (uintptr_t) (slot - SLOT_INDEXED))[in >> 6];
    if (!(e >> 16 & want))
      return 0;
    l = (const void *) (uintptr_t) (slot - SLOT_INDEXED + INDEX_BYTES);
    f = l->f + (e & 0xffff);
    break;
  case SLOT_EXPANDED:
    type = m->expanded[slot >> 2]->type[in];
    return type & -((want << 1) >> type & 1);
  case SLOT_INLINE:
    if (in >= frag_start (slot >> 2) && in < frag_end (slot >> 2))
      type = frag_type (slot >> 2);
    return type & -((want << 1) >> type & 1);
  default:
    if (!slot)
      return 0;
    l = slot_list (slot);
    f = l->f;
  }
  for (end = l->f + l->n; f < end && in >= frag_start (*f); f++)
    if (in < frag_end (*f)) {
      type = frag_type (*f);
      break;
    }
  return type & -((want << 1) >> type & 1);
}

/* The 1-based type of metadata at cluster c, 0 if none. */
static inline unsigned
overlap_type_at (const struct overlap_map *m, uint64_t c)
{
  return overlap_type_in (m, c, ~UINT32_C (0) >> 1, false);
}

/* The same for callers outside.  A query never expands a window, so it
 * never allocates.
 */
unsigned
overlap_type (struct overlap_map *m, uint64_t c)
{
  return overlap_type_at (m, c);
}

static int
overlap_set_range (struct qcow2_image *img, uint64_t offset, uint64_t len,
                   unsigned value)
{
  if (img->overlap == &overlap_off || len == 0)
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

/* The structures the header locates: they stay where the header says,
 * whatever the refcounts say.
 */
#define OVERLAP_FIXED (OL (MAIN_HEADER) | OL (ACTIVE_L1) | \
                       OL (REFCOUNT_TABLE) | OL (SNAPSHOT_TABLE))

/* Clusters freed: whatever metadata they held is gone, except for the
 * structures the header locates.  (In a corrupt image a cluster of the
 * L1 table may also be counted as data, and freed as such; unmapping it
 * would let the next allocation land on the table.)
 */
int
overlap_remove (struct qcow2_image *img, uint64_t offset, uint64_t len)
{
  struct overlap_map *m = img->overlap;
  uint64_t first, last, c;
  unsigned type;
  int r;

  if (m == &overlap_off || len == 0)
    return 0;
  first = offset >> img->cluster_bits;
  last = (offset + len - 1) >> img->cluster_bits;
  for (c = overlap_next (m, first, last + 1, &type); c <= last;
       c = overlap_next (m, c + 1, last + 1, &type))
    if (!(OVERLAP_FIXED & (UINT32_C (1) << (type - 1))) &&
        (r = overlap_set (m, c, 1, 0)) < 0)
      return r;
  return 0;
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
  image_set_incompat (img, QCOW2_INCOMPAT_CORRUPT);
  if (img->h.version >= 3 && io_write_features (img) == 0)
    io_flush (img);
}

/* Whether [first, last] holds no metadata, known without a lookup: the
 * common cases, guest data and the new clusters of a growing file.
 */
static inline bool
overlap_known_clear (const struct overlap_map *m, uint64_t first,
                     uint64_t last)
{
  uint64_t lo = first << m->bits, hi = (last + 1) << m->bits;

  return lo >= m->end || (lo >= m->free_lo && hi <= m->free_hi);
}

/* The first cluster of [first, last] holding a structure in the mask
 * checked, its 1-based type in *type; or UINT64_MAX if none.  Remembers
 * the metadata-free run around a range that holds no metadata at all,
 * so that the next data write there costs two comparisons.
 */
static inline uint64_t
overlap_lookup (struct overlap_map *m, uint64_t first, uint64_t last,
                uint32_t checked, unsigned *type)
{
  uint64_t window_end = ((last >> WINDOW_BITS) + 1) << WINDOW_BITS;
  uint64_t c;

  if (overlap_known_clear (m, first, last))
    return UINT64_MAX;
  /* A metadata write is mostly one cluster of its own structure. */
  if (first == last && (*type = overlap_type_at (m, first)) != 0)
    return checked & (UINT32_C (1) << (*type - 1)) ? first : UINT64_MAX;

  c = overlap_next (m, first, window_end, type);
  if (c > last) {
    /* Clear: remember the run, as far as first's and last's windows
     * tell, at no extra cost.
     */
    m->free_lo = overlap_free_start (m, first, first & ~(uint64_t) WINDOW_MASK)
      << m->bits;
    m->free_hi = c << m->bits;
    return UINT64_MAX;
  }
  for (; c <= last; c = overlap_next (m, c + 1, last + 1, type))
    if (checked & (UINT32_C (1) << (*type - 1)))
      return c;
  return UINT64_MAX;
}

uint64_t
overlap_find (struct overlap_map *m, uint64_t first, uint64_t last,
              uint32_t checked, unsigned *type)
{
  return overlap_lookup (m, first, last, checked, type);
}

/* The lookup of overlap_check, out of line so that the common cases
 * need no stack frame.
 */
static int __attribute__ ((noinline))
overlap_check_map (struct qcow2_image *img, uint64_t offset, uint64_t len,
                   uint32_t checked)
{
  unsigned type;
  uint64_t c;

  if (!checked || len == 0)
    return 0;
  c = overlap_lookup (img->overlap, offset >> img->cluster_bits,
                               (offset + len - 1) >> img->cluster_bits,
                               checked, &type);

  if (c == UINT64_MAX)
    return 0;
  overlap_hit (img, type - 1, c << img->cluster_bits, offset, len);
  return -EIO;
}

/* Before a write of [offset, offset+len) that may touch only the
 * structures in the mask ign: 0, or -EIO after marking the image
 * corrupt (the write must not happen).
 */
int
overlap_check (struct qcow2_image *img, uint64_t offset, uint64_t len,
               uint32_t ign)
{
  const struct overlap_map *m = img->overlap;
  uint64_t first;
  uint32_t checked;

  /* The common cases are answered here, with no call.  New clusters of
   * a growing file first: they lie past all metadata (and with no
   * guard, end is 0).
   */
  if (offset >= m->end)
    return 0;
  checked = img->overlap_mask & ~ign;
  if (!ign) {
    /* Guest data, in a run known free. */
    if (offset >= m->free_lo && offset + len <= m->free_hi)
      return 0;
  }
  else if ((first = offset >> img->cluster_bits) ==
           (offset + len - 1) >> img->cluster_bits) {
    /* A cluster of a structure written back where it is (len 0 ends
     * in overlap_check_map).
     */
    if (!overlap_type_in (m, first, checked, true))
      return 0;
  }
  return overlap_check_map (img, offset, len, checked);
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
int
overlap_add_found (struct qcow2_image *img, uint64_t offset, uint64_t len,
                   unsigned bit)
{
  if (len == 0 || range_exceeds (offset, len, img->file_size))
    return 0;
  /* Two structures in one cluster: writing either would destroy the
   * other, so the image is not written at all.  (A table used by the
   * active L1 and by snapshots is legitimately both.)
   */
  for (uint64_t c = offset >> img->cluster_bits;
       c <= (offset + len - 1) >> img->cluster_bits && !img->overlap_conflict;
       c++) {
    int other = (int) overlap_type_at (img->overlap, c) - 1;
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

/* The refcount table moved (refcount_switch_table). */
int
overlap_move_reftable (struct qcow2_image *img, uint64_t old_offset,
                       uint64_t old_clusters)
{
  int r = overlap_set_range (img, old_offset,
                             old_clusters << img->cluster_bits, 0);

  return r ? r : overlap_add (img, img->h.refcount_table_offset,
                              (uint64_t) img->h.refcount_table_clusters
                              << img->cluster_bits,
                              QCOW2_OL_REFCOUNT_TABLE_BIT);
}

/* Map the metadata of a writable image at open: every structure, so
 * that one lookup answers for all; the mask decides which are checked.
 * Inactive L2 tables need every snapshot's L1 table read, so only when
 * they are checked.
 */
int
overlap_build (struct qcow2_image *img)
{
  const struct qcow2_header *h = &img->h;
  struct overlap_map *m;
  int r;

  if (!img->overlap_mask)
    return 0;
  if (!(m = overlap_create ()))
    return -ENOMEM;
  m->bits = img->cluster_bits;
  img->overlap = m;
  if ((r = overlap_add_found (img, 0, img->cluster_size,
                              QCOW2_OL_MAIN_HEADER_BIT)) < 0 ||
      (r = overlap_add_found (img, h->l1_table_offset,
                              (uint64_t) h->l1_size * 8,
                              QCOW2_OL_ACTIVE_L1_BIT)) < 0 ||
      (r = overlap_add_found (img, h->refcount_table_offset,
                              (uint64_t) h->refcount_table_clusters
                              << img->cluster_bits,
                              QCOW2_OL_REFCOUNT_TABLE_BIT)) < 0 ||
      (img->nb_snapshots &&
       (r = overlap_add_found (img, h->snapshots_offset,
                               img->snapshot_table_bytes,
                               QCOW2_OL_SNAPSHOT_TABLE_BIT)) < 0))
    return r;
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
      (h->autoclear_features & QCOW2_AUTOCLEAR_BITMAPS) &&
      (r = overlap_add_found (img, h->bitmap_directory_offset,
                              h->bitmap_directory_size,
                              QCOW2_OL_BITMAP_DIRECTORY_BIT)) < 0)
    return r;
  return overlap_compact (img->overlap);
}
