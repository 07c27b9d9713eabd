/* SPDX-License-Identifier: BSD-3-Clause */
/* A name QEMU gives a file, parsed (name_parse: json: names by json.c,
 * the others by names.c), and how a relative name resolves against the
 * name of the image naming it, as QEMU's bdrv_dirname and path_combine
 * do.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errstr.h"
#include "internal.h"

/* QEMU's path_has_protocol: a colon before any slash. */
static bool
resolve_has_protocol (const char *name)
{
  return name[strcspn (name, ":/")] == ':';
}

bool
qcow2_name_is_relative (const char *name)
{
  return name[0] != '/' && !name_is_protocol (name);
}

int
name_parse (const char *name, struct name_spec *spec, char **why)
{
  int r;

  *spec = (struct name_spec) { .remote.sslverify = true };
  *why = NULL;
  r = strncmp (name, "json:", 5) == 0 ? json_parse_name (name, spec, why)
                                      : name_parse_plain (name, spec, why);
  if (r == 0 && spec->url)
    spec->remote.url = spec->url;
  if (r == 0 && spec->url && strncmp (spec->url, "ssh://", 6) == 0)
    r = name_parse_ssh (spec, why);
  if (r == 0 && spec->path && spec->path[0] == '\0')
    r = name_fail (why, -EINVAL, "empty file name");
  if (r < 0)
    name_spec_free (spec);
  return r;
}

/* QEMU's path_combine (base, ""): base up to its last '/', or up to
 * the protocol's colon.
 */
static char *
resolve_dirname (const char *base)
{
  const char *p = base, *slash = strrchr (base, '/');

  if (resolve_has_protocol (base))
    p = strchr (base, ':') + 1;
  if (slash && slash + 1 > p)
    p = slash + 1;
  return strndup (base, p - base);
}

/* Where the relative names of the image named naming resolve: the
 * prefix they are appended to, as QEMU's bdrv_dirname makes it.
 */
static int
resolve_dir (const char *naming, char **dir, char **why)
{
  struct name_spec spec;
  int r;

  *dir = NULL;
  if (!name_is_protocol (naming) || strncmp (naming, "file:", 5) == 0) {
    /* A local name: its folder, or none at all (the current one). */
    const char *slash = strrchr (naming, '/');
    *dir = slash ? strndup (naming, slash + 1 - naming) : strdup ("");
    return *dir ? 0 : -ENOMEM;
  }
  if ((r = name_parse (naming, &spec, why)) < 0)
    return r;
  if (spec.path) {
    const char *slash = strrchr (spec.path, '/');
    *dir = slash ? strndup (spec.path, slash + 1 - spec.path) : strdup ("");
  }
  else if (strncmp (spec.url, "nbd", 3) == 0)
    r = name_fail (why, -EINVAL, "an NBD export has no folder to resolve a "
                   "relative name in (QEMU refuses it too): name the file "
                   "by an absolute name or a URL (qemu-img rebase -u)");
  else if (spec.remote.ssh.host && strchr (spec.url, '?'))
    r = name_fail (why, -EINVAL, "the name of an ssh image with "
                   "host_key_check set has no folder to resolve a relative "
                   "name in (QEMU refuses it too): name the file by an "
                   "absolute name or a URL (qemu-img rebase -u)");
  else
    *dir = resolve_dirname (spec.url);
  name_spec_free (&spec);
  if (r == 0 && !*dir)
    r = -ENOMEM;
  return r;
}

char *
name_resolve (const char *naming, const char *name, char **why)
{
  char *dir, *r = NULL;
  int e;

  *why = NULL;
  if (!qcow2_name_is_relative (name))
    return strdup (name);
  if ((e = resolve_dir (naming, &dir, why)) < 0) {
    if (!*why)
      name_fail (why, e, "%s", errstr (-e));
    return NULL;
  }
  if (asprintf (&r, "%s%s", dir, name) < 0)
    r = NULL;
  free (dir);
  return r;
}
