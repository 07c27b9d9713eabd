/* SPDX-License-Identifier: BSD-3-Clause */
/* A map from cluster numbers to small type codes (1 to 255; 0: none),
 * for the overlap guard (overlap.c), knowing nothing of qcow2.
 *
 * The clusters are cut into windows of 4096.  A window is held as a
 * short sorted list of fragments (start, length, type) or, while it is
 * being changed, expanded to one byte per cluster; a small LRU keeps
 * the expanded windows.  Each window costs one 8-byte slot, and a
 * window with a single fragment holds it in the slot itself, so memory
 * stays near four bytes per fragment.  A long list comes with an index
 * by blocks of 64 clusters.  A query is a slot lookup plus a search of
 * a short list, of one block's fragments, or one byte of a bitmap:
 * constant time, whatever the size of the map.
 *
 * The map has no lock: its owner serialises every call.  The types and
 * inline functions below are here for the guard's inline fast path;
 * everything else goes through the functions.
 */
#ifndef QCOW2_OVERLAP_MAP_H
#define QCOW2_OVERLAP_MAP_H

#include <stdbool.h>
#include <stdint.h>

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

/* Returns what a list slot points to: the allocation, the index (or
 * NULL), the list.
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

/* The map that is always empty (with end 0), never changed or freed:
 * for an image without the guard.
 */
extern struct overlap_map overlap_map_empty;

/* Returns NULL if out of memory.  bits: log2 of the cluster size, with which
 * end, free_lo and free_hi are kept in bytes.
 */
extern struct overlap_map *overlap_map_create (unsigned bits);
extern void overlap_map_destroy (struct overlap_map *m);
/* Gives clusters [first, first+n) type value (0: none).  Returns 0, or
 * -ENOMEM.
 */
extern int overlap_map_set (struct overlap_map *m, uint64_t first,
                            uint64_t n, unsigned value);
/* Returns the type at cluster c, 0 if none; never allocates. */
extern unsigned overlap_map_type (struct overlap_map *m, uint64_t c);
/* Returns the first cluster in [c, end) with a type, its type in
 * *type, or end if none.
 */
extern uint64_t overlap_map_next (const struct overlap_map *m, uint64_t c,
                                  uint64_t end, unsigned *type);
/* Returns the first cluster of [first, last] with a type in the mask checked
 * (bit type - 1), its type in *type; or UINT64_MAX if none.  Remembers
 * the free run around a range found free (free_lo, free_hi).
 */
extern uint64_t overlap_map_find (struct overlap_map *m, uint64_t first,
                                  uint64_t last, uint32_t checked,
                                  unsigned *type);
/* Fold expanded windows back into lists.  Returns 0, or -ENOMEM. */
extern int overlap_map_compact (struct overlap_map *m);

/* Returns the 1-based type of metadata at cluster c if it is one of the
 * structures in want (bit type - 1), else 0.  Inlined into
 * overlap_check, where it answers most metadata writes; there c lies
 * below end, which the slots cover (below_end).
 */
static inline __attribute__ ((always_inline)) unsigned
overlap_map_type_in (const struct overlap_map *m, uint64_t c, uint32_t want,
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

/* Returns the 1-based type of metadata at cluster c, 0 if none. */
static inline unsigned
overlap_map_type_at (const struct overlap_map *m, uint64_t c)
{
  return overlap_map_type_in (m, c, ~UINT32_C (0) >> 1, false);
}

#endif /* QCOW2_OVERLAP_MAP_H */
