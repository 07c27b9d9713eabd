/* SPDX-License-Identifier: BSD-3-Clause */
/* Text from outside (a client's export name, a name read from an
 * image) made safe to log or to show a client: every byte outside
 * printable ASCII, and '\', as \xHH.  Such text must not forge a log
 * line, carry a terminal's control sequence, nor be taken for UTF-8 it
 * may not be.
 */
#ifndef QCOW2_ESCAPE_H
#define QCOW2_ESCAPE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What escape_text writes for max bytes of text, at most. */
#define ESCAPE_SIZE(max) ((max) * 4 + 4)

/* s escaped into out (ESCAPE_SIZE (max) bytes), cut after max bytes of
 * s (then "..." follows).  Returns out.
 */
static inline char *
escape_text (const char *s, size_t max, char *out)
{
  size_t i, n = 0;

  for (i = 0; s[i] && i < max; i++) {
    unsigned char c = s[i];

    if (c >= 0x20 && c < 0x7f && c != '\\')
      out[n++] = c;
    else
      n += sprintf (out + n, "\\x%02x", c);
  }
  strcpy (out + n, s[i] ? "..." : "");
  return out;
}

/* s escaped whole, malloc'd (NULL: out of memory). */
static inline char *
escape_dup (const char *s)
{
  size_t len = strlen (s);
  char *out = malloc (ESCAPE_SIZE (len));

  return out ? escape_text (s, len, out) : NULL;
}

#endif /* QCOW2_ESCAPE_H */
