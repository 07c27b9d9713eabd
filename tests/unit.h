/* SPDX-License-Identifier: BSD-3-Clause */
/* A minimal harness for the C unit tests: each CHECK counts as one
 * passed or failed check, failures say where and why, and unit_finish
 * prints the final tally and gives the exit status.
 */
#ifndef QCOW2_UNIT_H
#define QCOW2_UNIT_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned unit_passed, unit_failed;

static bool __attribute__ ((format (printf, 4, 5)))
unit_check (bool ok, const char *file, int line, const char *fmt, ...)
{
  va_list ap;

  if (ok) {
    unit_passed++;
    return true;
  }
  unit_failed++;
  fprintf (stderr, "%s:%d: FAIL: ", file, line);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  return false;
}

/* Each is true if the check passed. */
#define CHECK(cond) \
  unit_check ((cond), __FILE__, __LINE__, "%s", #cond)
#define CHECKF(cond, ...) \
  unit_check ((cond), __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_EQ(a, b) \
  ({ uint64_t a_ = (a), b_ = (b); \
     unit_check (a_ == b_, __FILE__, __LINE__, \
                 "%s == %s: %" PRIu64 " (%#" PRIx64 ") != %" PRIu64 \
                 " (%#" PRIx64 ")", #a, #b, a_, a_, b_, b_); })
#define CHECK_INT(a, b) \
  ({ long long a_ = (a), b_ = (b); \
     unit_check (a_ == b_, __FILE__, __LINE__, "%s == %s: %lld != %lld", \
                 #a, #b, a_, b_); })

/* A xorshift generator: repeatable pseudo-random numbers for tests. */
static inline uint64_t
unit_rnd (uint64_t *state)
{
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

static int
unit_finish (void)
{
  printf ("%u passed, %u failed\n", unit_passed, unit_failed);
  return unit_failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif /* QCOW2_UNIT_H */
