/* SPDX-License-Identifier: BSD-3-Clause */
/* The overlap map (overlap-map.h, nothing of qcow2) against a plain
 * linear-scan oracle: random marks and removals of cluster ranges over
 * layouts from small to huge, with more windows in use than the map
 * keeps expanded, and every query compared: single clusters, and range
 * checks with random masks of types (which also exercise the
 * remembered free run, since marks land inside runs found free
 * earlier); and a window of the most fragments it can hold.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "overlap-map.h"
#include "unit.h"

/* Type values 1 to TYPES, as the guard uses nine structures. */
#define TYPES 9

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

static void
test_layout (uint64_t clusters, unsigned seed)
{
  struct overlap_map *m = overlap_map_create (0);
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
    mk.first = unit_rnd (&state) % 4 == 0 ? last_clear + unit_rnd (&state) % 64
                                          : unit_rnd (&state) % clusters;
    if (mk.first >= clusters)
      mk.first = clusters - 1;
    mk.n = 1 + unit_rnd (&state) % (unit_rnd (&state) % 8 == 0 ? 9000 : 20);
    if (mk.first + mk.n > clusters)
      mk.n = clusters - mk.first;
    mk.value = unit_rnd (&state) % 4 == 0 ? 0 : 1 + unit_rnd (&state) % TYPES;
    CHECK_INT (overlap_map_set (m, mk.first, mk.n, mk.value), 0);
    marks[nmarks++] = mk;

    for (int q = 0; q < 20; q++) {
      uint64_t c = unit_rnd (&state) % 2
        ? mk.first + unit_rnd (&state) % (mk.n + 40)
        : unit_rnd (&state) % clusters;
      if (c >= clusters)
        continue;
      queries++;
      if (overlap_map_type (m, c) != oracle_type (marks, nmarks, c))
        mismatches++;
    }

    for (int q = 0; q < 10; q++) {
      uint64_t first = unit_rnd (&state) % 2
        ? mk.first + unit_rnd (&state) % (mk.n + 40)
        : unit_rnd (&state) % clusters;
      uint64_t len = 1 + unit_rnd (&state) %
        (unit_rnd (&state) % 16 == 0 ? 10000 : 300);
      uint32_t checked = unit_rnd (&state) % 3 == 0
        ? (uint32_t) unit_rnd (&state) & ((1u << TYPES) - 1)
        : (1u << TYPES) - 1;
      unsigned t1 = 0, t2 = 0;
      if (first >= clusters)
        continue;
      uint64_t last = MIN (first + len, clusters) - 1;
      uint64_t want = oracle_find (marks, nmarks, first, last, checked, &t1);
      uint64_t got = overlap_map_find (m, first, last, checked, &t2);
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
  overlap_map_destroy (m);
  free (marks);
}

/* Two structures alternating cluster by cluster over a whole window
 * (as a hostile image can lay them out): 4096 fragments when the
 * window is folded, the most a window can hold.
 */
static void
test_alternating (void)
{
  struct overlap_map *m = overlap_map_create (0);
  size_t mismatches = 0;
  unsigned type;

  CHECK (m);
  for (uint64_t c = 4096; c < 8192; c++)
    CHECK_INT (overlap_map_set (m, c, 1, 3 + (c & 1) * 2), 0);
  CHECK_INT (overlap_map_compact (m), 0);
  for (uint64_t c = 0; c < 12288; c++) {
    unsigned want = c >= 4096 && c < 8192 ? 3 + (c & 1) * 2 : 0;
    mismatches += overlap_map_type (m, c) != want;
    if (want)
      mismatches += overlap_map_find (m, c, c, UINT32_C (1) << (want - 1),
                                  &type) != c || type != want;
  }
  printf ("alternating window: %zu mismatches\n", mismatches);
  CHECK_EQ (mismatches, 0);
  overlap_map_destroy (m);
}

int
main (void)
{
  /* From a few windows to a layout of 100 TB in 64 KiB clusters. */
  test_layout (5000, 1);
  test_layout (1 << 20, 2);
  test_layout (UINT64_C (100) << 24, 3);
  test_alternating ();
  return unit_finish ();
}
