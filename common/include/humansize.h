/* SPDX-License-Identifier: BSD-3-Clause */
/* A size for people: "256 MiB", "2.1 GiB", "512 bytes" (one decimal,
 * dropped when it is 0).
 */
#ifndef QCOW2_HUMANSIZE_H
#define QCOW2_HUMANSIZE_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define HUMAN_SIZE_LEN 24

static inline const char *
human_size (char buf[HUMAN_SIZE_LEN], uint64_t bytes)
{
  static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB",
                                       "EiB" };
  double v = bytes;
  int i = -1;
  size_t n;

  if (bytes < 1024) {
    snprintf (buf, HUMAN_SIZE_LEN, "%" PRIu64 " bytes", bytes);
    return buf;
  }
  while (v >= 1024 && i < 5) {
    v /= 1024;
    i++;
  }
  snprintf (buf, HUMAN_SIZE_LEN, "%.1f", v);
  n = strlen (buf);
  if (n > 2 && strcmp (buf + n - 2, ".0") == 0)
    buf[n -= 2] = '\0';
  snprintf (buf + n, HUMAN_SIZE_LEN - n, " %s", units[i]);
  return buf;
}

#endif /* QCOW2_HUMANSIZE_H */
