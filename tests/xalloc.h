/* SPDX-License-Identifier: BSD-3-Clause */
/* Memory for the tests' helper library: tests have no use for running
 * out of memory, and buffers grown a piece at a time double, since a
 * sanitizer's realloc always copies (growing by exactly what is needed
 * made building an image of small clusters quadratic under ASan).
 */
#ifndef TESTS_XALLOC_H
#define TESTS_XALLOC_H

#include <stdio.h>
#include <stdlib.h>

#include "checked.h"

static inline void *
test_xrealloc (void *p, size_t n)
{
  p = realloc (p, n ? n : 1);
  if (!p) {
    perror ("realloc");
    abort ();
  }
  return p;
}

/* p (of *cap elements of elem bytes) with room for need elements. */
static inline void *
test_grow (void *p, size_t *cap, size_t need, size_t elem)
{
  if (need > *cap) {
    *cap = MAX (need, 2 * *cap);
    p = test_xrealloc (p, *cap * elem);
  }
  return p;
}

#endif /* TESTS_XALLOC_H */
