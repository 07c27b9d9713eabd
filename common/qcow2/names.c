/* SPDX-License-Identifier: BSD-3-Clause */
/* The names QEMU gives the other files of an image (backing files,
 * external data files): local paths, file:PATH, URLs of remote storage
 * (nbd, nbds, nbd+unix, nbds+unix, http, https, ssh) and QEMU's legacy
 * "nbd:HOST:PORT" syntax; json: names are json.c's, and relative names
 * resolve in resolve.c.  Pure string work: what a name is opened with
 * is the environment's business (qcow2_env).
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

/* Set *why to a malloc'd message (or leave it NULL when out of memory:
 * the caller then says that) and return err.
 */
int
name_fail (char **why, int err, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  if (vasprintf (why, fmt, ap) < 0)
    *why = NULL;
  va_end (ap);
  return err;
}

/* A name of a protocol we know (QEMU's: json:, file:, nbd: and URLs),
 * used as it is.  QEMU refuses other "PREFIX:" names as unknown
 * protocols; they are read as local file names, as they always were
 * here.
 */
bool
name_is_protocol (const char *name)
{
  size_t n = strcspn (name, ":/");

  return name[n] == ':' &&
    (strncmp (name, "json:", 5) == 0 || strncmp (name, "file:", 5) == 0 ||
     strncmp (name, "nbd:", 4) == 0 || strncmp (name + n, "://", 3) == 0);
}

/* Percent-encode s for a URL's path or query: everything but the
 * unreserved characters and '/' (and ':' and '@' outside queries).
 */
char *
name_url_escape (const char *s, bool query)
{
  char *r = malloc (strlen (s) * 3 + 1), *q = r;

  if (!r)
    return NULL;
  for (; *s; s++) {
    unsigned char c = *s;
    if (isalnum (c) || strchr ("-._~/", c) || (!query && strchr (":@", c)))
      *q++ = c;
    else
      q += sprintf (q, "%%%02X", c);
  }
  *q = '\0';
  return r;
}

/* Percent-decodes [s, s+len) into dst, NUL-terminated.  Returns the
 * end.
 */
static char *
name_url_unescape (char *dst, const char *s, size_t len)
{
  for (size_t i = 0; i < len; i++) {
    if (s[i] == '%' && i + 2 < len && isxdigit ((unsigned char) s[i + 1]) &&
        isxdigit ((unsigned char) s[i + 2])) {
      char hex[3] = { s[i + 1], s[i + 2], '\0' };
      *dst++ = strtoul (hex, NULL, 16);
      i += 2;
    }
    else
      *dst++ = s[i];
  }
  *dst++ = '\0';
  return dst;
}

/* spec->url, ssh://[USER@]HOST[:PORT]/PATH[?host_key_check=no|yes] as
 * QEMU reads it, split into spec->remote.ssh (strings in spec->ssh):
 * HOST in brackets (an IPv6 address) and PORT as they are, the rest
 * percent-decoded.
 */
int
name_parse_ssh (struct name_spec *spec, char **why)
{
  const char *url = spec->url;
  const char *auth = url + 6, *path = auth + strcspn (auth, "/?");
  const char *at = memchr (auth, '@', path - auth), *host = at ? at + 1 : auth;
  const char *port = NULL, *query = strchr (path, '?');
  const char *hend = path;
  size_t plen = query ? (size_t) (query - path) : strlen (path);
  struct qcow2_remote *rs = &spec->remote;
  char *q;

  if (*host == '[') {
    const char *close = memchr (host, ']', path - host);
    /* An address in brackets, then nothing but the port. */
    hend = host;
    if (close && (close + 1 == path || close[1] == ':')) {
      port = close[1] == ':' ? close + 2 : NULL;
      hend = close + 1;
    }
  }
  else if ((port = memchr (host, ':', path - host)))
    hend = port++;
  if (*path != '/' || hend == host || (*host == '[' && hend == host + 2))
    return name_fail (why, -EINVAL, "\"%s\" is not an ssh URL QEMU reads: "
                      "ssh://[USER@]HOST[:PORT]/PATH", url);
  if (query && strcmp (query, "?host_key_check=no") != 0 &&
      strcmp (query, "?host_key_check=yes") != 0)
    return name_fail (why, -ENOTSUP, "%s: only host_key_check=no or yes are "
                      "supported (nbdkit's ssh plugin checks known_hosts or "
                      "nothing)", url);
  /* Decoding only shortens: the parts fit in the URL's length. */
  if (!(spec->ssh = q = malloc (path - auth + plen + 4)))
    return -ENOMEM;
  rs->ssh.host = q;
  if (*host == '[') {
    memcpy (q, host + 1, hend - host - 2);
    q += hend - host - 2;
    *q++ = '\0';
  }
  else
    q = name_url_unescape (q, host, hend - host);
  if (port) {
    rs->ssh.port = q;
    memcpy (q, port, path - port);
    q += path - port;
    *q++ = '\0';
  }
  if (at) {
    rs->ssh.user = q;
    q = name_url_unescape (q, auth, at - auth);
  }
  rs->ssh.path = q;
  name_url_unescape (q, path, plen);
  rs->ssh.verify_host = !query || strcmp (query, "?host_key_check=no") != 0;
  return 0;
}

/* The URL libnbd opens for an NBD server: over TCP (host, port) or a
 * Unix socket (path), and an export name.
 */
int
name_nbd_url (struct name_spec *spec, const char *host, const char *port,
              const char *path, const char *export, char **why)
{
  char *exp = name_url_escape (export ? export : "", false);
  char *sock = path ? name_url_escape (path, true) : NULL;
  int r;

  if (!exp || (path && !sock))
    r = -1;
  else if (path)
    r = asprintf (&spec->url, "nbd+unix:///%s?socket=%s", exp, sock);
  else
    r = asprintf (&spec->url, strchr (host, ':') ? "nbd://[%s]:%s/%s"
                  : "nbd://%s:%s/%s", host, port ? port : "10809", exp);
  free (exp);
  free (sock);
  if (r < 0) {
    spec->url = NULL;
    return -ENOMEM;
  }
  return 0;
}

/* QEMU's legacy NBD names: nbd:unix:PATH[:exportname=E] and
 * nbd:HOST:PORT[:exportname=E], HOST an IPv6 address in brackets: as
 * QEMU's inet_parse, the host ends at the first colon otherwise, and
 * the rest is the port.
 */
static int
name_parse_nbd_legacy (const char *name, struct name_spec *spec, char **why)
{
  const char *rest = name + 4, *exp = strstr (rest, ":exportname=");
  size_t len = exp ? (size_t) (exp - rest) : strlen (rest);
  char *addr = strndup (rest, len), *colon;
  int r;

  if (!addr)
    return -ENOMEM;
  if (exp)
    exp += strlen (":exportname=");
  if (addr[0] == '[')
    colon = strchr (addr, ']');
  else
    colon = addr;
  if (colon)
    colon = strchr (colon, ':');
  if (strncmp (addr, "unix:", 5) == 0)
    r = name_nbd_url (spec, NULL, NULL, addr + 5, exp, why);
  else if (colon && colon > addr && colon[1] && !strchr (colon + 1, ':') &&
           (addr[0] != '[' || colon[-1] == ']')) {
    bool v6 = addr[0] == '[';
    colon[v6 ? -1 : 0] = '\0';
    r = name_nbd_url (spec, addr + v6, colon + 1, NULL, exp, why);
  }
  else
    r = name_fail (why, -EINVAL, "\"%s\" is not an NBD name QEMU knows: "
                   "nbd:HOST:PORT[:exportname=NAME], "
                   "nbd:unix:SOCKET[:exportname=NAME], or a URL such as "
                   "nbd://HOST:PORT/NAME", name);
  free (addr);
  return r;
}

static const char *const name_url_schemes[] = {
  "nbd://", "nbds://", "nbd+unix://", "nbds+unix://", "http://", "https://",
  "ssh://", NULL
};

/* Returns the QEMU driver of a URL we take: nbd, http, https or ssh. */
const char *
name_url_driver (const char *url)
{
  return strncasecmp (url, "nbd", 3) == 0 ? "nbd"
    : strncasecmp (url, "https:", 6) == 0 ? "https"
    : strncasecmp (url, "http:", 5) == 0 ? "http" : "ssh";
}

/* Returns a copy of url with its scheme in lower case: schemes are compared
 * without case (RFC 3986), and everything past the parse (the admin's
 * backing-protocols=, libnbd, nbdkit's helpers) sees the one spelling.
 */
char *
name_url_dup (const char *url)
{
  char *r = strdup (url);
  size_t n = strcspn (url, ":");

  for (size_t i = 0; r && i < n; i++)
    r[i] = tolower ((unsigned char) r[i]);
  return r;
}

/* A name that is not json: a URL, a legacy NBD name, file:PATH, or a
 * local path.
 */
int
name_parse_plain (const char *name, struct name_spec *spec, char **why)
{
  size_t n = strcspn (name, ":/");
  bool url = strncmp (name + n, "://", 3) == 0;

  if (url) {
    for (size_t i = 0; name_url_schemes[i]; i++)
      if (strncasecmp (name, name_url_schemes[i],
                       strlen (name_url_schemes[i])) == 0) {
        spec->url = name_url_dup (name);
        return spec->url ? 0 : -ENOMEM;
      }
    /* QEMU spells TCP both ways. */
    if (strncasecmp (name, "nbd+tcp://", 10) == 0) {
      if (asprintf (&spec->url, "nbd://%s", name + 10) < 0) {
        spec->url = NULL;
        return -ENOMEM;
      }
      return 0;
    }
    return name_fail (why, -ENOTSUP, "protocol \"%.*s\" is not supported "
                      "(nbd, nbds, nbd+unix, nbds+unix, http, https and ssh "
                      "are)", (int) n, name);
  }
  if (strncmp (name, "file:", 5) == 0) {
    spec->path = strdup (name + 5);
    return spec->path ? 0 : -ENOMEM;
  }
  if (strncmp (name, "nbd:", 4) == 0)
    return name_parse_nbd_legacy (name, spec, why);
  spec->path = strdup (name);
  return spec->path ? 0 : -ENOMEM;
}

void
name_spec_free (struct name_spec *spec)
{
  free (spec->path);
  free (spec->url);
  free (spec->cookie);
  free (spec->ssh);
  spec->path = spec->url = spec->cookie = spec->ssh = NULL;
}
