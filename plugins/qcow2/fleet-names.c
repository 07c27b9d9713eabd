/* SPDX-License-Identifier: BSD-3-Clause */
/* dir='s names: which are exports, which template= makes, and how a
 * message shows one (a name is a client's: untrusted).
 */
#include <stdbool.h>
#include <string.h>

#include "escape.h"
#include "fleet.h"

/* Whether s is UTF-8 (RFC 3629: no overlong forms, no surrogates,
 * nothing past U+10FFFF).
 */
static bool
fleet_utf8 (const char *s)
{
  const unsigned char *p = (const unsigned char *) s;

  while (*p) {
    unsigned c = *p++, n, min, cp;

    if (c < 0x80)
      continue;
    n = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    min = n == 3 ? 0x10000 : n == 2 ? 0x800 : 0x80;
    if (n == 0 || c >= 0xf5)
      return false;
    cp = c & (0x3f >> n);
    for (unsigned i = 0; i < n; i++, p++) {
      if ((*p & 0xc0) != 0x80)
        return false;
      cp = cp << 6 | (*p & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
  }
  return true;
}

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
  if (!fleet_utf8 (name))
    return "it is not UTF-8 (as NBD's export names are)";
  return NULL;
}

const char *
fleet_shown (const char *name, char buf[FLEET_SHOWN_MAX])
{
  return escape_text (name, 64, buf);
}

/* The names template= makes images of: export names (no "..") of
 * these bytes alone.
 */
bool
fleet_creatable (const char *name)
{
  static const char more[] = "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";

  return name[0] && strchr (more, name[0]) && !strchr ("._-", name[0]) &&
    strspn (name, more) == strlen (name) && !fleet_name_refusal (name);
}
