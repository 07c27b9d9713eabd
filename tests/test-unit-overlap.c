/* The overlap map against a plain linear-scan oracle: random marks and
 * removals of cluster ranges over layouts from small to huge, with more
 * windows in use than the map keeps expanded, and every query compared.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

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
  size_t nmarks = 0, mismatches = 0, queries = 0;

  CHECK (m && marks);
  for (int op = 0; op < 4000; op++) {
    struct mark mk;
    /* Mostly small runs near earlier ones (metadata clusters bunch),
     * sometimes far away, sometimes removals.
     */
    mk.first = rnd (&state) % clusters;
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
  }
  printf ("layout of %" PRIu64 " clusters: %zu queries, %zu mismatches\n",
          clusters, queries, mismatches);
  CHECK_EQ (mismatches, 0);
  overlap_destroy (m);
  free (marks);
}

int
main (void)
{
  /* From a few windows to a layout of 100 TB in 64 KiB clusters. */
  test_layout (5000, 1);
  test_layout (1 << 20, 2);
  test_layout (UINT64_C (100) << 24, 3);
  return unit_finish ();
}
