/* SPDX-License-Identifier: BSD-3-Clause */
/* dir='s names: which are exports, which template= makes, and how a
 * message shows one (a name is a client's: untrusted).
 */
#include <stdbool.h>
#include <string.h>

#include "fleet.h"

/* Why dir= refuses an export name, or NULL: a name only ever names a
 * file directly in the folder, never one outside it, nor a hidden one
 * (template= makes new images under hidden names).
 */
const char *
fleet_name_refusal (const char *name)
{
  if (strlen (name) > 255)
    return "it is longer than 255 bytes";
  if (name[0] == '.')
    return "it starts with '.'";
  if (strchr (name, '/'))
    return "it holds a '/'";
  if (strstr (name, ".."))
    return "it holds \"..\"";
  for (const char *c = name; *c; c++)
    if ((unsigned char) *c < 0x20 || *c == 0x7f)
      return "it holds a control byte";
  return NULL;
}

/* The name shown in a message: control bytes as '?', cut at 64 bytes
 * (a name is untrusted: it must not forge log lines, nor flood them).
 */
const char *
fleet_shown (const char *name, char buf[72])
{
  size_t i;

  for (i = 0; name[i] && i < 64; i++)
    buf[i] = (unsigned char) name[i] < 0x20 || name[i] == 0x7f ? '?'
                                                                : name[i];
  strcpy (buf + i, name[i] ? "..." : "");
  return buf;
}

/* The names template= makes images of. */
bool
fleet_creatable (const char *name)
{
  static const char more[] = "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";

  return name[0] && strchr (more, name[0]) && !strchr ("._-", name[0]) &&
    strspn (name, more) == strlen (name);
}
