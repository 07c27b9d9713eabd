/* SPDX-License-Identifier: BSD-3-Clause */
/* The overlap map against a plain linear-scan oracle: random marks and
 * removals of cluster ranges over layouts from small to huge, with more
 * windows in use than the map keeps expanded, and every query compared:
 * single clusters, and range checks with random masks of structures
 * (which also exercise the remembered metadata-free run, since marks
 * land inside runs found free earlier).  Then a growing file, as a fill
 * with small clusters makes it, checked through overlap_check itself
 * (its inline answers: the high-water mark, the free run, the block
 * index of long lists, expanded windows).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"
#include "unit.h"

struct mark {
  uint64_t first, n;
  unsigned value;
};

/* The oracle: the last mark covering a cluster wins. */
static unsigned
oracle_type (const struct mark *marks, size_t nmarks, uint64_t c)
{
  for (size_t i = nmarks; i-- > 0; )
    if (c >= marks[i].first && c < marks[i].first + marks[i].n)
      return marks[i].value;
  return 0;
}

/* The oracle's range check: the first cluster of [first, last] whose
 * type is in the mask, or UINT64_MAX.
 */
static uint64_t
oracle_find (const struct mark *marks, size_t nmarks, uint64_t first,
             uint64_t last, uint32_t checked, unsigned *type)
{
  uint64_t len = last - first + 1, found = UINT64_MAX;
  /* The last mark covering a cluster wins: walk the marks newest first
   * and keep the first value seen for each cluster (0xff: none yet).
   */
  uint8_t *t = malloc (len);

  CHECK (t);
  memset (t, 0xff, len);
  for (size_t i = nmarks; i-- > 0; ) {
    uint64_t lo = MAX (first, marks[i].first);
    uint64_t hi = MIN (last + 1, marks[i].first + marks[i].n);
    for (uint64_t c = lo; c < hi; c++)
      if (t[c - first] == 0xff)
        t[c - first] = marks[i].value;
  }
  for (uint64_t c = 0; c < len; c++)
    if (t[c] != 0xff && t[c] && (checked & (UINT32_C (1) << (t[c] - 1)))) {
      *type = t[c];
      found = first + c;
      break;
    }
  free (t);
  return found;
}

static uint64_t
rnd (uint64_t *state)
{
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

static void
test_layout (uint64_t clusters, unsigned seed)
{
  struct overlap_map *m = overlap_create ();
  struct mark *marks = calloc (4000, sizeof *marks);
  uint64_t state = 0x9e3779b97f4a7c15ULL * (seed + 1);
  size_t nmarks = 0, mismatches = 0, queries = 0, ranges = 0, hits = 0;
  uint64_t last_clear = 0;

  CHECK (m && marks);
  for (int op = 0; op < 4000; op++) {
    struct mark mk;
    /* Mostly small runs near earlier ones (metadata clusters bunch),
     * sometimes far away, sometimes removals.
     */
    /* Sometimes just past a range found clear: inside the run the map
     * remembers as free, which the mark must end.
     */
    mk.first = rnd (&state) % 4 == 0 ? last_clear + rnd (&state) % 64
                                     : rnd (&state) % clusters;
    if (mk.first >= clusters)
      mk.first = clusters - 1;
    mk.n = 1 + rnd (&state) % (rnd (&state) % 8 == 0 ? 9000 : 20);
    if (mk.first + mk.n > clusters)
      mk.n = clusters - mk.first;
    mk.value = rnd (&state) % 4 == 0 ? 0 : 1 + rnd (&state) % QCOW2_OL_MAX_BITS;
    CHECK_INT (overlap_set (m, mk.first, mk.n, mk.value), 0);
    marks[nmarks++] = mk;

    for (int q = 0; q < 20; q++) {
      uint64_t c = rnd (&state) % 2 ? mk.first + rnd (&state) % (mk.n + 40)
                                    : rnd (&state) % clusters;
      if (c >= clusters)
        continue;
      queries++;
      if (overlap_type (m, c) != oracle_type (marks, nmarks, c))
        mismatches++;
    }

    for (int q = 0; q < 10; q++) {
      uint64_t first = rnd (&state) % 2 ? mk.first + rnd (&state) % (mk.n + 40)
                                        : rnd (&state) % clusters;
      uint64_t len = 1 + rnd (&state) % (rnd (&state) % 16 == 0 ? 10000 : 300);
      uint32_t checked = rnd (&state) % 3 == 0
        ? (uint32_t) rnd (&state) & ((1u << QCOW2_OL_MAX_BITS) - 1)
        : (1u << QCOW2_OL_MAX_BITS) - 1;
      unsigned t1 = 0, t2 = 0;
      if (first >= clusters)
        continue;
      uint64_t last = MIN (first + len, clusters) - 1;
      uint64_t want = oracle_find (marks, nmarks, first, last, checked, &t1);
      uint64_t got = overlap_find (m, first, last, checked, &t2);
      ranges++;
      hits += want != UINT64_MAX;
      if (want == UINT64_MAX)
        last_clear = last + 1;
      if (got != want || (want != UINT64_MAX && t1 != t2))
        mismatches++;
    }
  }
  printf ("layout of %" PRIu64 " clusters: %zu queries, %zu range checks "
          "(%zu hits), %zu mismatches\n", clusters, queries, ranges, hits,
          mismatches);
  CHECK_EQ (mismatches, 0);
  overlap_destroy (m);
  free (marks);
}

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
  struct overlap_map *m = overlap_create ();
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

  /* Check a write, compare with the truth. */
#define WRITE(first_, n_, ign_)                                         \
  do {                                                                  \
    uint64_t f_ = (first_), n__ = (n_);                                 \
    uint32_t ign__ = (ign_);                                            \
    bool want = truth_hits (truth, f_, f_ + n__ - 1,                    \
                            img.overlap_mask & ~ign__);                 \
    bool got = overlap_check (&img, f_, n__, ign__) == -EIO;            \
    checks++;                                                           \
    hits += want;                                                       \
    if (want != got) {                                                  \
      mismatches++;                                                     \
      fprintf (stderr, "write [%" PRIu64 ", +%" PRIu64 ") ign %#x: "   \
               "want %d got %d\n", f_, n__, ign__, want, got);          \
    }                                                                   \
  } while (0)
#define MARK(first_, n_, value_)                                        \
  do {                                                                  \
    CHECK_INT (overlap_set (m, (first_), (n_), (value_)), 0);           \
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
      uint64_t c = rnd (&state) % next;
      uint32_t ign = truth[c] ? UINT32_C (1) << (truth[c] - 1) : 0;
      if (rnd (&state) % 4 == 0)
        ign = (uint32_t) rnd (&state) & QCOW2_OL_ALL;
      WRITE (c, 1 + (rnd (&state) % 8 == 0 ? rnd (&state) % 300 : 0), ign);
    }
    if (rnd (&state) % 200 == 0) {
      /* A table freed, and the map at rest (as after a build). */
      uint64_t c = rnd (&state) % next;
      if (truth[c] == l2)
        MARK (c, 1, 0);
      CHECK_INT (overlap_compact (m), 0);
    }
  }
  /* Every cluster written back in host order, as a flush does. */
  CHECK_INT (overlap_compact (m), 0);
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
  overlap_destroy (m);
  free (truth);
}

/* Two structures alternating cluster by cluster over a whole window
 * (as a hostile image can lay them out): 4096 fragments when the
 * window is folded, the most a window can hold.
 */
static void
test_alternating (void)
{
  struct overlap_map *m = overlap_create ();
  size_t mismatches = 0;
  unsigned type;

  CHECK (m);
  for (uint64_t c = 4096; c < 8192; c++)
    CHECK_INT (overlap_set (m, c, 1, 3 + (c & 1) * 2), 0);
  CHECK_INT (overlap_compact (m), 0);
  for (uint64_t c = 0; c < 12288; c++) {
    unsigned want = c >= 4096 && c < 8192 ? 3 + (c & 1) * 2 : 0;
    mismatches += overlap_type (m, c) != want;
    if (want)
      mismatches += overlap_find (m, c, c, UINT32_C (1) << (want - 1),
                                  &type) != c || type != want;
  }
  printf ("alternating window: %zu mismatches\n", mismatches);
  CHECK_EQ (mismatches, 0);
  overlap_destroy (m);
}

int
main (void)
{
  /* From a few windows to a layout of 100 TB in 64 KiB clusters. */
  test_layout (5000, 1);
  test_layout (1 << 20, 2);
  test_layout (UINT64_C (100) << 24, 3);
  test_growing (1);
  test_growing (2);
  test_alternating ();
  return unit_finish ();
}
