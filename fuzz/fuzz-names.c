/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: the parsers of the names QEMU gives backing and
 * data files (common/qcow2/names.c, json.c, resolve.c): URLs, QEMU's
 * legacy nbd: syntax, and json: names (JSON read by json-c, then
 * checked and flattened by json.c).
 *
 * An input is a name, or (with a newline) the name of a naming image,
 * a newline and a name it holds: then the name is also resolved
 * against the naming one, as a relative backing file name is.  A NUL
 * ends the input early, as it ends a name in an image.
 *
 * Checked: no crash, leak or sanitizer error, and what a parse returns
 * holds together (a local path or a URL, never both nor neither; an
 * error with a message, except out of memory).
 */
#include <assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void
fuzz_parse (const char *name)
{
  struct name_spec spec;
  char *why = NULL;
  int r = name_parse (name, &spec, &why);

  if (r == 0) {
    assert (!spec.path != !spec.url);
    assert (!spec.url || spec.remote.url == spec.url);
    assert (!spec.remote.cookie || spec.remote.cookie == spec.cookie);
    assert (!spec.remote.ssh.host ||
            (spec.remote.ssh.host == spec.ssh && spec.remote.ssh.path &&
             strncmp (spec.url, "ssh://", 6) == 0));
    assert (!why);
    name_spec_free (&spec);
  }
  else
    assert (r == -EINVAL || r == -ENOTSUP || r == -ENOMEM);
  free (why);
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  char *text = strndup ((const char *) data, size);
  char *name, *why = NULL, *resolved;

  if (!text)
    return 0;
  name = strchr (text, '\n');
  if (name) {
    *name++ = '\0';
    resolved = name_resolve (text, name, &why);
    assert (resolved || why || errno == ENOMEM);
    if (resolved)
      fuzz_parse (resolved);
    free (resolved);
    free (why);
    fuzz_parse (text);
  }
  else
    name = text;
  qcow2_name_is_relative (name);
  fuzz_parse (name);
  free (text);
  return 0;
}
