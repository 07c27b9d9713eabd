/* SPDX-License-Identifier: BSD-3-Clause */
/* The words nbdkit_parse_bool accepts, without its error line: a
 * module that names the key in its own message gives one error line
 * for a bad value, not nbdkit's and then its own.
 */
#ifndef QCOW2_BOOLWORD_H
#define QCOW2_BOOLWORD_H

#include <stddef.h>
#include <strings.h>

/* Returns 1 or 0 for a word nbdkit_parse_bool takes, or -1. */
static inline int
bool_word (const char *value)
{
  static const char *const words[2][6] = {
    { "0", "false", "f", "no", "n", "off" },
    { "1", "true", "t", "yes", "y", "on" },
  };

  for (int b = 0; b < 2; b++)
    for (size_t i = 0; i < sizeof words[b] / sizeof words[b][0]; i++)
      if (strcasecmp (value, words[b][i]) == 0)
        return b;
  return -1;
}

#endif /* QCOW2_BOOLWORD_H */
