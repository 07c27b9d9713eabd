/* SPDX-License-Identifier: BSD-3-Clause */
/* The monotonic clock, for intervals: in nanoseconds. */
#ifndef QCOW2_MONOTONIC_H
#define QCOW2_MONOTONIC_H

#include <stdint.h>
#include <time.h>

static inline uint64_t
monotonic_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif /* QCOW2_MONOTONIC_H */
