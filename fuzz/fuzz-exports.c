/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: dir='s rules for export names, a client's input
 * (plugins/qcow2/fleet-names.c).  An input is a name (a NUL ends it, as
 * nbdkit refuses one).
 *
 * Checked, besides no crash or sanitizer error: a name accepted names
 * a file directly in the folder and no hidden one (no '/', no "..", no
 * leading '.', at most 255 bytes, no control byte, UTF-8); a name
 * template= makes is accepted; and a name as messages show it is
 * printable ASCII alone, fits its buffer, and reads back as the name
 * (its first 64 bytes).
 */
#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fleet.h"

/* What fleet_shown wrote, read back: \xHH as its byte (cut: the name
 * was cut, and "..." ends it).
 */
static size_t
fuzz_unescape (const char *s, bool cut, char *out)
{
  size_t n = 0;

  while (*s && !(cut && strcmp (s, "...") == 0)) {
    if (s[0] == '\\') {
      assert (s[1] == 'x');
      out[n++] = (char) strtoul ((char []) { s[2], s[3], 0 }, NULL, 16);
      s += 4;
    }
    else
      out[n++] = *s++;
  }
  return n;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  char *name = strndup ((const char *) data, size);
  char shown[FLEET_SHOWN_MAX], back[64];
  size_t len, n;

  if (!name)
    return 0;
  len = strlen (name);
  if (!fleet_name_refusal (name) && len > 0) {
    assert (len <= 255 && name[0] != '.');
    assert (!strchr (name, '/') && !strstr (name, ".."));
    for (size_t i = 0; i < len; i++)
      assert ((unsigned char) name[i] >= 0x20 && name[i] != 0x7f);
  }
  if (fleet_creatable (name))
    assert (!fleet_name_refusal (name));
  fleet_shown (name, shown);
  assert (strlen (shown) < sizeof shown);
  for (const char *c = shown; *c; c++)
    assert (*c >= 0x20 && *c < 0x7f);
  n = fuzz_unescape (shown, len > 64, back);
  assert (n == (len < 64 ? len : 64) && memcmp (back, name, n) == 0);
  free (name);
  return 0;
}
