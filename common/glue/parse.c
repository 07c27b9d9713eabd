/* SPDX-License-Identifier: BSD-3-Clause */
/* The glue's parsers of option values, each error naming the key. */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "boolword.h"
#include "errstr.h"
#include "glue.h"

/* Parses a size: a whole number with one of the suffixes nbdkit's sizes take
 * (b, s for 512 bytes, K, M, G, T, P, E, in any case), or with a
 * fraction and a unit as qemu-img takes it ("1.5G", the fraction's
 * bytes truncated).  Returns the bytes, -1 if value is not a size, or
 * -2 if it is more than INT64_MAX.  (Not nbdkit_parse_size: its error line
 * would come before the one naming the key.)
 */
static int64_t
glue_parse_bytes (const char *value)
{
  static const char units[] = "BKMGTPE";        /* powers of 1024 */
  const char *p = value, *u;
  size_t frac_digits = 0;
  uint64_t whole, scale = 1, bytes;
  long double frac = 0;
  char *end;

  if (!isdigit ((unsigned char) *p))
    return -1;
  errno = 0;
  whole = strtoull (p, &end, 10);
  if (errno == ERANGE)
    return -2;
  p = end;
  if (*p == '.') {
    /* Digits only: strtold would take an exponent too. */
    frac_digits = strspn (p + 1, "0123456789");
    if (frac_digits == 0)
      return -1;
    frac = strtold (p, &end);
    p += 1 + frac_digits;
  }
  if (*p) {
    if (p[1])
      return -1;
    if (toupper ((unsigned char) *p) == 'S')
      scale = 512;
    else if ((u = strchr (units, toupper ((unsigned char) *p))))
      for (ptrdiff_t i = 0; i < u - units; i++)
        scale *= 1024;
    else
      return -1;
  }
  if (frac_digits && scale < 1024)
    return -1;
  if (whole > INT64_MAX / scale)
    return -2;
  bytes = whole * scale + (uint64_t) (frac * scale);
  return bytes > INT64_MAX ? -2 : (int64_t) bytes;
}

int
glue_parse_size (const char *key, const char *value, bool zero_ok,
                 uint64_t *out)
{
  int64_t r = glue_parse_bytes (value);

  if (r == -1) {
    nbdkit_error ("%s: expected a size such as 512, 64K, 1G or 1.5G, not "
                  "\"%s\"",
                  key, value);
    return -1;
  }
  if (r == -2) {
    nbdkit_error ("%s: \"%s\" is too large (the limit is 2^63 - 1 bytes)", key, value);
    return -1;
  }
  if (r == 0 && !zero_ok) {
    nbdkit_error ("%s must not be zero", key);
    return -1;
  }
  *out = r;
  return 0;
}

/* nbdkit_parse_bool's words (not it: its error line would come before
 * the one naming the key).
 */
int
glue_parse_bool (const char *key, const char *value, bool *out)
{
  int b = bool_word (value);

  if (b >= 0) {
    *out = b;
    return 0;
  }
  nbdkit_error ("%s: expected true or false (on/off, yes/no, 1/0), not "
                "\"%s\"", key, value);
  return -1;
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
glue_parse_folder (const char *key, const char *value, char **dir)
{
  char *path = realpath (value, NULL);
  struct stat st;

  if (!path || stat (path, &st) == -1 || !S_ISDIR (st.st_mode)) {
    nbdkit_error ("%s: %s: %s", key, value,
                  path ? "not a folder" : errstr (errno));
    free (path);
    return -1;
  }
  free (*dir);
  *dir = path;
  return 0;
}

bool
glue_in_folder (const char *path, const char *folder)
{
  size_t n = strlen (folder);

  return n == 1 || (strncmp (path, folder, n) == 0 && path[n] == '/');
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
