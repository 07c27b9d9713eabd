/* SPDX-License-Identifier: BSD-3-Clause */
/* The map of what a commit job has to copy (modules.h, struct
 * commit_map): marked by writers, taken by whoever copies.
 */
#include "internal.h"

/* The first marked cluster in [from, end), and the marked ones
 * following it there, at most max in all: [*first, *first + *n),
 * cleared.  false if none is marked there.
 */
bool
commit_map_take (struct commit_map *m, uint64_t from, uint64_t end,
                 uint64_t max, uint64_t *first, uint64_t *n)
{
  uint64_t c = from;

  end = MIN (end, m->clusters);
  while (c < end) {
    uint64_t w = __atomic_load_n (&m->words[c / 64], __ATOMIC_RELAXED)
                 >> (c % 64);

    if (w) {
      c += __builtin_ctzll (w);
      break;
    }
    c = (c / 64 + 1) * 64;
  }
  if (c >= end)
    return false;
  *first = c;
  for (*n = 0; c < end && *n < max &&
               (__atomic_load_n (&m->words[c / 64], __ATOMIC_RELAXED)
                >> (c % 64) & 1); c++)
    ++*n;
  commit_map_change (m, *first, *first + *n, false);
  return true;
}

uint64_t
commit_map_count (struct commit_map *m)
{
  uint64_t n = 0;

  for (uint64_t w = 0; w < (m->clusters + 63) / 64; w++)
    n += __builtin_popcountll (__atomic_load_n (&m->words[w],
                                                __ATOMIC_RELAXED));
  return n;
}
