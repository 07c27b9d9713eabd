/* SPDX-License-Identifier: BSD-3-Clause */
/* Big-endian access to on-disk structures: the one set of helpers used
 * for every qcow2 field, so unaligned access and byte order are handled
 * in a single place.
 */
#ifndef QCOW2_BE_H
#define QCOW2_BE_H

#include <endian.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t
be16_get (const void *p)
{
  const uint8_t *b = p;
  return (uint16_t) (b[0] << 8 | b[1]);
}

static inline uint32_t
be32_get (const void *p)
{
  const uint8_t *b = p;
  return (uint32_t) b[0] << 24 | (uint32_t) b[1] << 16 |
         (uint32_t) b[2] << 8 | b[3];
}

static inline uint64_t
be64_get (const void *p)
{
  const uint8_t *b = p;
  return (uint64_t) be32_get (b) << 32 | be32_get (b + 4);
}

/* A table (or a piece of one) of n big-endian 64-bit entries, read
 * from the file, put in host order in place: a load and a byte swap
 * an entry, not eight byte loads.
 */
static inline void
be64_table_to_host (uint64_t *t, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    uint64_t v;

    memcpy (&v, &t[i], sizeof v);
    t[i] = be64toh (v);
  }
}

static inline void
be16_put (void *p, uint16_t v)
{
  uint8_t *b = p;
  b[0] = v >> 8;
  b[1] = v;
}

static inline void
be32_put (void *p, uint32_t v)
{
  uint8_t *b = p;
  b[0] = v >> 24;
  b[1] = v >> 16;
  b[2] = v >> 8;
  b[3] = v;
}

static inline void
be64_put (void *p, uint64_t v)
{
  be32_put (p, v >> 32);
  be32_put ((uint8_t *) p + 4, (uint32_t) v);
}

#endif /* QCOW2_BE_H */
