/* SPDX-License-Identifier: BSD-3-Clause */
/* Checked arithmetic for sizes computed from untrusted image data.
 * Each returns true on overflow, like the GCC builtins they wrap.
 */
#ifndef QCOW2_CHECKED_H
#define QCOW2_CHECKED_H

#include <stdbool.h>
#include <stdint.h>

static inline bool
add_overflow_u64 (uint64_t a, uint64_t b, uint64_t *r)
{
  return __builtin_add_overflow (a, b, r);
}

static inline bool
mul_overflow_u64 (uint64_t a, uint64_t b, uint64_t *r)
{
  return __builtin_mul_overflow (a, b, r);
}

/* Returns true if [off, off+len) does not fit below limit (or
 * overflows).
 */
static inline bool
range_exceeds (uint64_t off, uint64_t len, uint64_t limit)
{
  uint64_t end;
  return add_overflow_u64 (off, len, &end) || end > limit;
}

static inline bool
is_power_of_2 (uint64_t v)
{
  return v != 0 && (v & (v - 1)) == 0;
}

static inline uint64_t
div_round_up (uint64_t a, uint64_t b)
{
  return a / b + (a % b != 0);
}

#ifndef MIN
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#endif
#ifndef MAX
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#endif

#endif /* QCOW2_CHECKED_H */
