/* SPDX-License-Identifier: BSD-3-Clause */
/* Whether a buffer is all zeros. */
#ifndef QCOW2_ISZERO_H
#define QCOW2_ISZERO_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* The first 16 bytes one by one, then each byte against the one 16
 * before it, which memcmp does fast.
 */
static inline bool
is_zero (const void *buf, size_t size)
{
  const unsigned char *p = buf;
  size_t i, head = size < 16 ? size : 16;

  for (i = 0; i < head; i++)
    if (p[i] != 0)
      return false;
  return size <= 16 || memcmp (p, p + 16, size - 16) == 0;
}

#endif /* QCOW2_ISZERO_H */
