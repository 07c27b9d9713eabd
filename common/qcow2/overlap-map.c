/* SPDX-License-Identifier: BSD-3-Clause */
/* The overlap map (see overlap-map.h): windows of clusters held as
 * fragment lists or expanded bytes, and the queries the guard makes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "overlap-map.h"

/* The map of an image without the guard (overlap-check=none, or read
 * only): empty and never changed.  With end 0, overlap_check answers at
 * its first comparison, and needs no test for a missing map.
 */
struct overlap_map overlap_map_empty;

struct overlap_map *
overlap_map_create (unsigned bits)
{
  struct overlap_map *m = calloc (1, sizeof *m);

  if (m)
    m->bits = bits;
  return m;
}

void
overlap_map_destroy (struct overlap_map *m)
{
  if (!m || m == &overlap_map_empty)
    return;
  for (uint64_t i = 0; i < m->nslots; i++)
    if (slot_is_list (m->slots[i]))
      free (slot_ptr (m->slots[i]));
  for (uint32_t i = 0; i < m->nexpanded; i++)
    free (m->expanded[i]);
  free (m->slots);
  free (m);
}

/* Returns the fragments of a window that is not expanded; *tmp holds an
 * inline one.
 */
static const frag_t *
overlap_map_frags (uint64_t slot, frag_t *tmp, uint32_t *n)
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

/* Returns the first fragment that ends after cluster in (index: the
 * list's, or NULL).
 */
static uint32_t
overlap_map_search (const frag_t *f, uint32_t n, const uint32_t *index,
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
overlap_map_summarize (struct overlap_expanded *e, uint32_t in, uint32_t k,
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

/* Returns the first nonzero byte of type[in, end), end within in's block of
 * 64, or end: eight bytes at a time.
 */
static uint32_t
overlap_map_block_next (const uint8_t *type, uint32_t in, uint32_t end)
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

/* Returns one past the last nonzero byte of type[start, in], start within
 * in's block of 64, or start.
 */
static uint32_t
overlap_map_block_prev (const uint8_t *type, uint32_t in, uint32_t start)
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

/* Returns the first cluster at or after in with metadata in an expanded
 * window, or WINDOW_CLUSTERS.
 */
static uint32_t
overlap_map_bytes_next (const struct overlap_expanded *e, uint32_t in)
{
  while (in < WINDOW_CLUSTERS) {
    uint64_t blocks = e->summary & (~UINT64_C (0) << (in >> 6));
    if (!blocks)
      break;
    uint32_t b = __builtin_ctzll (blocks);
    uint32_t end = (b + 1) << 6;
    in = overlap_map_block_next (e->type, MAX (in, b << 6), end);
    if (in < end)
      return in;
  }
  return WINDOW_CLUSTERS;
}

/* Returns one past the last cluster at or before in with metadata in an
 * expanded window, or 0.
 */
static uint32_t
overlap_map_bytes_prev (const struct overlap_expanded *e, uint32_t in)
{
  for (;;) {
    uint64_t blocks = e->summary & ((UINT64_C (2) << (in >> 6)) - 1);
    if (!blocks)
      return 0;
    uint32_t b = 63 - __builtin_clzll (blocks);
    uint32_t c = overlap_map_block_prev (e->type, MIN (in, (b << 6) + 63),
                                         b << 6);
    if (c > b << 6 || b == 0)
      return c;
    in = (b << 6) - 1;
  }
}

/* Fold an expanded window back into fragments. */
static int
overlap_map_collapse (struct overlap_map *m, uint32_t i)
{
  struct overlap_expanded *e = m->expanded[i];
  frag_t f[WINDOW_CLUSTERS];    /* two types may alternate */
  uint32_t n = 0;
  uint64_t slot = 0;

  for (uint32_t c = overlap_map_bytes_next (e, 0); c < WINDOW_CLUSTERS;
       c = overlap_map_bytes_next (e, c)) {
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
overlap_map_compact (struct overlap_map *m)
{
  uint64_t n = m->nslots;
  int r;

  while (m->nexpanded)
    if ((r = overlap_map_collapse (m, 0)) < 0)
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

/* Returns window wi, expanded (evicting the least recently used expanded
 * window if need be).
 */
static struct overlap_expanded *
overlap_map_expand (struct overlap_map *m, uint64_t wi)
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
    if (overlap_map_collapse (m, oldest) < 0)
      return NULL;
  }
  if (!(e = malloc (sizeof *e)))
    return NULL;
  e->window = wi;
  e->last_use = ++m->clock;
  e->summary = 0;
  memset (e->type, 0, sizeof e->type);
  f = overlap_map_frags (slot, &tmp, &n);
  for (uint32_t i = 0; i < n; i++) {
    memset (e->type + frag_start (f[i]), frag_type (f[i]),
            frag_end (f[i]) - frag_start (f[i]));
    overlap_map_summarize (e, frag_start (f[i]),
                           frag_end (f[i]) - frag_start (f[i]),
                           frag_type (f[i]));
  }
  if (slot_is_list (slot))
    free (slot_ptr (slot));
  m->slots[wi] = (uint64_t) m->nexpanded << 2 | SLOT_EXPANDED;
  m->expanded[m->nexpanded++] = e;
  return e;
}

static int
overlap_map_grow (struct overlap_map *m, uint64_t wi)
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
overlap_map_set (struct overlap_map *m, uint64_t first, uint64_t n,
                 unsigned value)
{
  if (n == 0)
    return 0;
  if (value) {
    uint64_t lo = first << m->bits, hi = (first + n) << m->bits;
    uint64_t last_wi = (first + n - 1) >> WINDOW_BITS;
    int r;

    /* The slots cover end, so that overlap_check need not test it. */
    if (last_wi >= m->nslots && (r = overlap_map_grow (m, last_wi)) < 0)
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
      if (!(e = overlap_map_expand (m, wi)))
        return -ENOMEM;
      memset (e->type + in, value, k);
      overlap_map_summarize (e, in, k, value);
    }
    first += k;
    n -= k;
  }
  return 0;
}

/* Returns the first metadata cluster of window wi at or after in (or
 * WINDOW_CLUSTERS), its type in *type.
 */
static uint32_t
overlap_map_window_next (const struct overlap_map *m, uint64_t wi,
                         uint32_t in, unsigned *type)
{
  uint64_t slot = m->slots[wi];

  if ((slot & 3) == SLOT_EXPANDED) {
    const struct overlap_expanded *e = m->expanded[slot >> 2];
    in = overlap_map_bytes_next (e, in);
    if (in < WINDOW_CLUSTERS)
      *type = e->type[in];
    return in;
  }
  frag_t tmp;
  uint32_t n;
  const frag_t *f = overlap_map_frags (slot, &tmp, &n);
  uint32_t i = overlap_map_search (f, n, slot_index (slot), in);
  if (i == n)
    return WINDOW_CLUSTERS;
  *type = frag_type (f[i]);
  return MAX (in, frag_start (f[i]));
}

/* Returns one past the last metadata cluster of window wi at or before in (0
 * if none).
 */
static uint32_t
overlap_map_window_prev (const struct overlap_map *m, uint64_t wi,
                         uint32_t in)
{
  uint64_t slot = m->slots[wi];

  if ((slot & 3) == SLOT_EXPANDED) {
    return overlap_map_bytes_prev (m->expanded[slot >> 2], in);
  }
  frag_t tmp;
  uint32_t n;
  const frag_t *f = overlap_map_frags (slot, &tmp, &n);
  uint32_t i = overlap_map_search (f, n, slot_index (slot), in);
  if (i < n && frag_start (f[i]) <= in)
    return in + 1;
  return i > 0 ? frag_end (f[i - 1]) : 0;
}

/* Returns the first metadata cluster in [c, end), or end. */
uint64_t
overlap_map_next (const struct overlap_map *m, uint64_t c, uint64_t end,
                  unsigned *type)
{
  while (c < end) {
    uint64_t wi = c >> WINDOW_BITS;
    if (wi >= m->nslots)
      return end;
    uint32_t hit = overlap_map_window_next (m, wi, c & WINDOW_MASK, type);
    uint64_t base = wi << WINDOW_BITS;
    if (hit < WINDOW_CLUSTERS)
      return MIN (base + hit, end);
    c = base + WINDOW_CLUSTERS;
  }
  return end;
}

/* Returns the start of the metadata-free run that ends at c (inclusive),
 * looking no further back than floor.
 */
static uint64_t
overlap_map_free_start (const struct overlap_map *m, uint64_t c,
                        uint64_t floor)
{
  for (;;) {
    uint64_t wi = c >> WINDOW_BITS;
    uint64_t base = wi << WINDOW_BITS;
    uint32_t after = wi < m->nslots ?
      overlap_map_window_prev (m, wi, c & WINDOW_MASK) : 0;
    if (after > 0 || base <= floor)
      return MAX (base + after, floor);
    c = base - 1;
  }
}

/* The same for callers outside.  A query never expands a window, so it
 * never allocates.
 */
unsigned
overlap_map_type (struct overlap_map *m, uint64_t c)
{
  return overlap_map_type_at (m, c);
}

/* Whether [first, last] holds no metadata, known without a lookup: the
 * common cases, guest data and the new clusters of a growing file.
 */
static inline bool
overlap_map_known_clear (const struct overlap_map *m, uint64_t first,
                         uint64_t last)
{
  uint64_t lo = first << m->bits, hi = (last + 1) << m->bits;

  return lo >= m->end || (lo >= m->free_lo && hi <= m->free_hi);
}

/* Returns the first cluster of [first, last] holding a structure in the mask
 * checked, its 1-based type in *type; or UINT64_MAX if none.  Remembers
 * the metadata-free run around a range that holds no metadata at all,
 * so that the next data write there costs two comparisons.
 */
uint64_t
overlap_map_find (struct overlap_map *m, uint64_t first, uint64_t last,
                  uint32_t checked, unsigned *type)
{
  uint64_t window_end = ((last >> WINDOW_BITS) + 1) << WINDOW_BITS;
  uint64_t c;

  if (overlap_map_known_clear (m, first, last))
    return UINT64_MAX;
  /* A metadata write is mostly one cluster of its own structure. */
  if (first == last && (*type = overlap_map_type_at (m, first)) != 0)
    return checked & (UINT32_C (1) << (*type - 1)) ? first : UINT64_MAX;

  c = overlap_map_next (m, first, window_end, type);
  if (c > last) {
    /* Clear: remember the run, as far as first's and last's windows
     * tell, at no extra cost.
     */
    m->free_lo = overlap_map_free_start (m, first,
                                         first & ~(uint64_t) WINDOW_MASK)
      << m->bits;
    m->free_hi = c << m->bits;
    return UINT64_MAX;
  }
  for (; c <= last; c = overlap_map_next (m, c + 1, last + 1, type))
    if (checked & (UINT32_C (1) << (*type - 1)))
      return c;
  return UINT64_MAX;
}
