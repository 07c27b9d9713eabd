/* SPDX-License-Identifier: BSD-3-Clause */
/* The overlap guard's check (overlap_check, with its inline answers:
 * the high-water mark, the free run, the block index of long lists,
 * expanded windows) on a file that grows as a fill with small clusters
 * makes it, against the truth of what each cluster holds.  The map
 * itself is tested by test-unit-overlap-map.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"
#include "unit.h"

/* What a write of [first, last] may not touch, by the truth. */
static bool
truth_hits (const uint8_t *truth, uint64_t first, uint64_t last,
            uint32_t checked)
{
  for (uint64_t c = first; c <= last; c++)
    if (truth[c] && (checked & (UINT32_C (1) << (truth[c] - 1))))
      return true;
  return false;
}

/* A file that grows as a fill makes it: an L2 table, then its data;
 * a refcount block every 256 clusters, where the data would go; now
 * and then a table elsewhere freed, or the map compacted (so that the
 * old windows become long indexed lists).  Each write is checked
 * through overlap_check on a stand-in image with 1-byte clusters, so
 * that offsets are cluster numbers, as in the map.
 */
static void
test_growing (unsigned seed)
{
  const uint64_t clusters = 300000;
  const unsigned l2 = QCOW2_OL_ACTIVE_L2_BIT + 1;
  const unsigned rb = QCOW2_OL_REFCOUNT_BLOCK_BIT + 1;
  struct overlap_map *m = overlap_map_create (0);
  uint8_t *truth = calloc (clusters, 1);
  struct qcow2_env env = { 0 };
  struct qcow2_image img = { 0 };
  uint64_t state = 0x9e3779b97f4a7c15ULL * (seed + 7), next = 1;
  size_t checks = 0, hits = 0, mismatches = 0;

  CHECK (m && truth);
  img.env = &env;
  img.h.version = 2;            /* a hit marks it corrupt in memory only */
  img.overlap = m;
  img.overlap_mask = QCOW2_OL_ALL;
  lock_init (&img.lock);
  image_lock (&img);            /* as the engine's callers hold it */

  /* Check a write, compare with the truth. */
#define WRITE(first_, n_, ign_)                                         \
  do {                                                                  \
    uint64_t f_ = (first_), n__ = (n_);                                 \
    uint32_t ign__ = (ign_);                                            \
    bool want = truth_hits (truth, f_, f_ + n__ - 1,                    \
                            img.overlap_mask & ~ign__);                 \
    struct overlap_hit hit_;                                            \
    bool got = overlap_check (&img, f_, n__, ign__, &hit_) == -EIO;     \
    checks++;                                                           \
    hits += want;                                                       \
    if (want != got ||                                                  \
        (got && (hit_.at < f_ || hit_.at >= f_ + n__ ||                 \
                 truth[hit_.at] != hit_.bit + 1))) {                    \
      mismatches++;                                                     \
      fprintf (stderr, "write [%" PRIu64 ", +%" PRIu64 ") ign %#x: "   \
               "want %d got %d\n", f_, n__, ign__, want, got);          \
    }                                                                   \
  } while (0)
#define MARK(first_, n_, value_)                                        \
  do {                                                                  \
    CHECK_INT (overlap_map_set (m, (first_), (n_), (value_)), 0);       \
    memset (truth + (first_), (value_), (n_));                          \
  } while (0)

  while (next + 400 < clusters) {
    uint64_t table = next, data = table + 1, k = 64;

    /* The refcount block of each 256 clusters, first in its range. */
    if ((next & ~UINT64_C (255)) + 256 <= data + k) {
      uint64_t b = (next & ~UINT64_C (255)) + 256;
      WRITE (b, 1, OL (REFCOUNT_BLOCK));
      MARK (b, 1, rb);
    }
    WRITE (table, 1, OL (ACTIVE_L2));          /* zeros of a new table */
    if (truth[table] == 0)
      MARK (table, 1, l2);
    /* The data, around the refcount block. */
    for (uint64_t c = data; c < data + k; ) {
      uint64_t e = c;
      while (e < data + k && truth[e] == 0)
        e++;
      if (e > c)
        WRITE (c, e - c, 0);
      c = e + 1;
    }
    next = data + k;
    while (truth[next])
      next++;

    /* Writebacks of earlier tables and blocks, anywhere; writes of
     * data over old data; a write where it must not go.
     */
    for (int q = 0; q < 6; q++) {
      uint64_t c = unit_rnd (&state) % next;
      uint32_t ign = truth[c] ? UINT32_C (1) << (truth[c] - 1) : 0;
      if (unit_rnd (&state) % 4 == 0)
        ign = (uint32_t) unit_rnd (&state) & QCOW2_OL_ALL;
      WRITE (c, 1 + (unit_rnd (&state) % 8 == 0
                     ? unit_rnd (&state) % 300 : 0), ign);
    }
    if (unit_rnd (&state) % 200 == 0) {
      /* A table freed, and the map at rest (as after a build). */
      uint64_t c = unit_rnd (&state) % next;
      if (truth[c] == l2)
        MARK (c, 1, 0);
      CHECK_INT (overlap_map_compact (m), 0);
    }
  }
  /* Every cluster written back in host order, as a flush does. */
  CHECK_INT (overlap_map_compact (m), 0);
  for (uint64_t c = 0; c < next; c++)
    if (truth[c]) {
      WRITE (c, 1, UINT32_C (1) << (truth[c] - 1));
      if (c % 3 == 0)           /* the wrong structure: a hit */
        WRITE (c, 1, OL (INACTIVE_L2));
    }
    else if (c % 7 == 0)
      WRITE (c, 1, OL (ACTIVE_L2));
  printf ("growing file of %" PRIu64 " clusters: %zu checks (%zu hits), "
          "%zu mismatches\n", next, checks, hits, mismatches);
  CHECK_EQ (mismatches, 0);
#undef WRITE
#undef MARK
  image_unlock (&img);
  lock_destroy (&img.lock);
  overlap_map_destroy (m);
  free (truth);
}

int
main (void)
{
  test_growing (1);
  test_growing (2);
  return unit_finish ();
}
