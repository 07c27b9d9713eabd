/* SPDX-License-Identifier: BSD-3-Clause */
/* The glue's parsers of option values, each error naming the key. */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "glue.h"

/* A size with a fraction and a unit, as qemu-img takes it ("1.5G"):
 * the bytes (the fraction's truncated), or -1 if value is not one.
 */
static int64_t
glue_parse_fraction (const char *value)
{
  static const char units[] = "KMGTPE";
  const char *dot = strchr (value, '.'), *u;
  uint64_t whole, mul = 1024;
  long double frac;
  char *end;

  if (!dot || !isdigit ((unsigned char) value[0]) ||
      !isdigit ((unsigned char) dot[1]))
    return -1;
  errno = 0;
  whole = strtoull (value, &end, 10);
  if (errno || end != dot)
    return -1;
  frac = strtold (dot, &end);   /* ".5" */
  if (!end[0] || end[1] || !(u = strchr (units, toupper ((unsigned char) *end))))
    return -1;
  for (ptrdiff_t i = 0; i < u - units; i++)
    mul *= 1024;
  if (whole >= INT64_MAX / mul)
    return -1;
  return whole * mul + (uint64_t) (frac * mul);
}

int
glue_parse_size (const char *key, const char *value, bool zero_ok,
                 uint64_t *out)
{
  int64_t r = strchr (value, '.') ? glue_parse_fraction (value)
                                   : nbdkit_parse_size (value);

  if (r == -1) {
    nbdkit_error ("%s: expected a size such as 512, 64K, 1G or 1.5G, not "
                  "\"%s\"",
                  key, value);
    return -1;
  }
  if (r == 0 && !zero_ok) {
    nbdkit_error ("%s must not be zero", key);
    return -1;
  }
  *out = r;
  return 0;
}

int
glue_parse_bool (const char *key, const char *value, bool *out)
{
  int r = nbdkit_parse_bool (value);

  if (r == -1) {
    nbdkit_error ("%s: expected true or false (on/off, yes/no, 1/0), not "
                  "\"%s\"", key, value);
    return -1;
  }
  *out = r;
  return 0;
}

int
glue_parse_range (const char *key, const char *value, const char *what,
                  uint64_t min, uint64_t max, uint64_t *out)
{
  char *end;
  uint64_t n;

  errno = 0;
  n = strtoull (value, &end, 10);
  if (!isdigit ((unsigned char) value[0]) || *end || errno == ERANGE ||
      n < min || n > max) {
    if (min == 0 && max == UINT64_MAX)
      nbdkit_error ("%s: expected %s (a whole number), not \"%s\"",
                    key, what, value);
    else
      nbdkit_error ("%s: expected %s (a whole number from %" PRIu64
                    " to %" PRIu64 "), not \"%s\"", key, what, min, max,
                    value);
    return -1;
  }
  *out = n;
  return 0;
}

int
glue_parse_number (const char *key, const char *value, const char *what,
                   uint64_t max, uint64_t *out)
{
  return glue_parse_range (key, value, what, 0, max, out);
}

int
glue_parse_word (const char *key, const char *value,
                 const char *const *words)
{
  char list[256] = "";
  size_t n = 0;

  for (size_t i = 0; words[i]; i++) {
    if (strcmp (value, words[i]) == 0)
      return i;
    n = i + 1;
  }
  assert (n > 0);               /* a row offers at least one word */
  for (size_t i = 0; i < n; i++)
    snprintf (list + strlen (list), sizeof list - strlen (list), "%s%s",
              i == 0 ? "" : i + 1 < n ? ", " : " or ", words[i]);
  nbdkit_error ("%s: expected %s, not \"%s\"", key, list, value);
  return -1;
}
