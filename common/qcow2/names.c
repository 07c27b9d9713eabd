/* SPDX-License-Identifier: BSD-3-Clause */
/* The names QEMU gives the other files of an image (backing files,
 * external data files): local paths, URLs of remote storage (nbd,
 * nbds, nbd+unix, nbds+unix, http, https, ssh), QEMU's legacy
 * "nbd:HOST:PORT" syntax, and "json:{...}" pseudo-filenames; and how a
 * relative name resolves against the name of the image naming it, as
 * QEMU's bdrv_dirname and path_combine do.  Pure string work: what a
 * name is opened with is the environment's business (qcow2_env).
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errstr.h"
#include "internal.h"

/* Set *why to a malloc'd message (or leave it NULL when out of memory:
 * the caller then says that) and return err.
 */
static int __attribute__ ((format (printf, 3, 4)))
name_fail (char **why, int err, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  if (vasprintf (why, fmt, ap) < 0)
    *why = NULL;
  va_end (ap);
  return err;
}

/* QEMU's path_has_protocol: a colon before any slash. */
static bool
name_has_protocol (const char *name)
{
  return name[strcspn (name, ":/")] == ':';
}

/* A name of a protocol we know (QEMU's: json:, file:, nbd: and URLs),
 * used as it is.  QEMU refuses other "PREFIX:" names as unknown
 * protocols; they are read as local file names, as they always were
 * here.
 */
static bool
name_is_protocol (const char *name)
{
  size_t n = strcspn (name, ":/");

  return name[n] == ':' &&
    (strncmp (name, "json:", 5) == 0 || strncmp (name, "file:", 5) == 0 ||
     strncmp (name, "nbd:", 4) == 0 || strncmp (name + n, "://", 3) == 0);
}

bool
qcow2_name_is_relative (const char *name)
{
  return name[0] != '/' && !name_is_protocol (name);
}

/* "json:{...}", flattened as QEMU's qdict_flatten does: nested objects
 * become dotted keys ("file": {"server": {"type": ...}} is
 * "file.server.type"), so that every spelling QEMU accepts reads the
 * same.
 */
enum json_type { JSON_STRING, JSON_NUMBER, JSON_BOOL, JSON_NULL };

struct json_kv {
  char *key;
  char *value;                  /* strings, numbers, "true", "false" */
  enum json_type type;
  bool used;                    /* looked up: every key must be */
};

struct json_doc {
  struct json_kv *kv;
  size_t n;
  const char *p;                /* parse position */
  char **why;
};

static void
json_free (struct json_doc *d)
{
  for (size_t i = 0; i < d->n; i++) {
    free (d->kv[i].key);
    free (d->kv[i].value);
  }
  free (d->kv);
  d->kv = NULL;
  d->n = 0;
}

static void
json_space (struct json_doc *d)
{
  while (*d->p == ' ' || *d->p == '\t' || *d->p == '\n' || *d->p == '\r')
    d->p++;
}

static int
json_error (struct json_doc *d, const char *what)
{
  return name_fail (d->why, -EINVAL, "json: %s at \"%.20s\"", what, d->p);
}

/* Append the UTF-8 encoding of code point c to s at *len. */
static void
json_utf8 (char *s, size_t *len, uint32_t c)
{
  if (c < 0x80)
    s[(*len)++] = c;
  else if (c < 0x800) {
    s[(*len)++] = 0xc0 | c >> 6;
    s[(*len)++] = 0x80 | (c & 0x3f);
  }
  else if (c < 0x10000) {
    s[(*len)++] = 0xe0 | c >> 12;
    s[(*len)++] = 0x80 | ((c >> 6) & 0x3f);
    s[(*len)++] = 0x80 | (c & 0x3f);
  }
  else {
    s[(*len)++] = 0xf0 | c >> 18;
    s[(*len)++] = 0x80 | ((c >> 12) & 0x3f);
    s[(*len)++] = 0x80 | ((c >> 6) & 0x3f);
    s[(*len)++] = 0x80 | (c & 0x3f);
  }
}

static int
json_hex4 (const char *p, uint32_t *c)
{
  *c = 0;
  for (int i = 0; i < 4; i++) {
    if (!isxdigit ((unsigned char) p[i]))
      return -1;
    *c = *c << 4 | (isdigit ((unsigned char) p[i]) ? p[i] - '0'
                    : (tolower ((unsigned char) p[i]) - 'a' + 10));
  }
  return 0;
}

/* A string at d->p (the opening quote), into *out (malloc'd). */
static int
json_string (struct json_doc *d, char **out)
{
  const char *end;
  size_t len = 0;
  char *s;

  d->p++;
  /* The decoded string is never longer than the encoded one. */
  for (end = d->p; *end && *end != '"'; end++)
    if (*end == '\\' && end[1])
      end++;
  if (*end != '"')
    return json_error (d, "unterminated string");
  s = malloc (end - d->p + 1);
  if (!s)
    return -ENOMEM;
  while (d->p < end) {
    uint32_t c, lo;
    char e;

    if (*d->p != '\\') {
      s[len++] = *d->p++;
      continue;
    }
    e = d->p[1];
    d->p += 2;
    switch (e) {
    case '"': case '\\': case '/': s[len++] = e; break;
    case 'b': s[len++] = '\b'; break;
    case 'f': s[len++] = '\f'; break;
    case 'n': s[len++] = '\n'; break;
    case 'r': s[len++] = '\r'; break;
    case 't': s[len++] = '\t'; break;
    case 'u':
      if (end - d->p < 4 || json_hex4 (d->p, &c) < 0)
        goto bad;
      d->p += 4;
      /* A surrogate pair is one code point. */
      if (c >= 0xd800 && c < 0xdc00 && end - d->p >= 6 && d->p[0] == '\\'
          && d->p[1] == 'u' && json_hex4 (d->p + 2, &lo) == 0
          && lo >= 0xdc00 && lo < 0xe000) {
        c = 0x10000 + ((c - 0xd800) << 10) + (lo - 0xdc00);
        d->p += 6;
      }
      if (c == 0 || (c >= 0xd800 && c < 0xe000))
        goto bad;
      json_utf8 (s, &len, c);
      break;
    default:
      goto bad;
    }
  }
  s[len] = '\0';
  d->p = end + 1;
  *out = s;
  return 0;

 bad:
  free (s);
  return json_error (d, "bad escape in a string");
}

static int
json_add (struct json_doc *d, char *key, char *value, enum json_type type)
{
  struct json_kv *kv;

  for (size_t i = 0; i < d->n; i++)
    if (strcmp (d->kv[i].key, key) == 0) {
      int r = name_fail (d->why, -EINVAL, "json: key \"%s\" is given "
                         "twice", key);
      free (key);
      free (value);
      return r;
    }
  kv = realloc (d->kv, (d->n + 1) * sizeof *kv);
  if (!kv) {
    free (key);
    free (value);
    return -ENOMEM;
  }
  d->kv = kv;
  d->kv[d->n++] = (struct json_kv) { .key = key, .value = value,
                                     .type = type };
  return 0;
}

static int json_object (struct json_doc *d, const char *prefix);

/* The value of key (its full dotted name) at d->p. */
static int
json_value (struct json_doc *d, char *key)
{
  static const struct { const char *word; enum json_type type; } words[] = {
    { "true", JSON_BOOL }, { "false", JSON_BOOL }, { "null", JSON_NULL },
  };
  char *value = NULL;
  int r;

  json_space (d);
  if (*d->p == '{') {
    r = json_object (d, key);
    free (key);
    return r;
  }
  if (*d->p == '"') {
    if ((r = json_string (d, &value)) < 0) {
      free (key);
      return r;
    }
    return json_add (d, key, value, JSON_STRING);
  }
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
    size_t n = strlen (words[i].word);
    if (strncmp (d->p, words[i].word, n) == 0) {
      d->p += n;
      value = strdup (words[i].word);
      if (!value) {
        free (key);
        return -ENOMEM;
      }
      return json_add (d, key, value, words[i].type);
    }
  }
  if (*d->p == '-' || isdigit ((unsigned char) *d->p)) {
    size_t n = strspn (d->p + 1, "0123456789.eE+-") + 1;
    value = strndup (d->p, n);
    if (!value) {
      free (key);
      return -ENOMEM;
    }
    d->p += n;
    return json_add (d, key, value, JSON_NUMBER);
  }
  free (key);
  return json_error (d, *d->p == '[' ? "arrays are not supported"
                     : "expected a value");
}

/* An object at d->p (the opening brace), its keys under prefix. */
static int
json_object (struct json_doc *d, const char *prefix)
{
  d->p++;
  json_space (d);
  if (*d->p == '}') {
    d->p++;
    return 0;
  }
  for (;;) {
    char *name, *key;
    int r;

    json_space (d);
    if (*d->p != '"')
      return json_error (d, "expected a key");
    if ((r = json_string (d, &name)) < 0)
      return r;
    if (prefix[0] == '\0')
      key = name;
    else {
      r = asprintf (&key, "%s.%s", prefix, name);
      free (name);
      if (r < 0)
        return -ENOMEM;
    }
    json_space (d);
    if (*d->p != ':') {
      free (key);
      return json_error (d, "expected ':'");
    }
    d->p++;
    if ((r = json_value (d, key)) < 0)
      return r;
    json_space (d);
    if (*d->p == '}') {
      d->p++;
      return 0;
    }
    if (*d->p != ',')
      return json_error (d, "expected ',' or '}'");
    d->p++;
  }
}

static int
json_parse (const char *text, struct json_doc *d, char **why)
{
  int r;

  *d = (struct json_doc) { .p = text, .why = why };
  json_space (d);
  if (*d->p != '{')
    return json_error (d, "expected an object");
  r = json_object (d, "");
  if (r == 0) {
    json_space (d);
    if (*d->p)
      r = json_error (d, "text after the object");
  }
  if (r < 0)
    json_free (d);
  return r;
}

/* The entry of the key prefix + name (prefix "" or ending in '.'), now
 * used, or NULL.
 */
static struct json_kv *
json_get (struct json_doc *d, const char *prefix, const char *name)
{
  size_t pl = strlen (prefix);

  for (size_t i = 0; i < d->n; i++) {
    struct json_kv *kv = &d->kv[i];
    if (strncmp (kv->key, prefix, pl) == 0 && strcmp (kv->key + pl, name) == 0) {
      kv->used = true;
      return kv;
    }
  }
  return NULL;
}

/* Whether some key starts with prefix + name + ".". */
static bool
json_has_object (const struct json_doc *d, const char *prefix,
                 const char *name)
{
  size_t pl = strlen (prefix), nl = strlen (name);

  for (size_t i = 0; i < d->n; i++) {
    const char *k = d->kv[i].key;
    if (strncmp (k, prefix, pl) == 0 && strncmp (k + pl, name, nl) == 0 &&
        k[pl + nl] == '.')
      return true;
  }
  return false;
}

/* A string (or number: QEMU takes ports either way) option, or NULL;
 * -EINVAL said if it has another type.
 */
static int
json_get_string (struct json_doc *d, const char *prefix, const char *name,
                 const char **out, char **why)
{
  struct json_kv *kv = json_get (d, prefix, name);

  *out = NULL;
  if (!kv)
    return 0;
  if (kv->type != JSON_STRING && kv->type != JSON_NUMBER)
    return name_fail (why, -EINVAL, "json: \"%s%s\" must be a string",
                      prefix, name);
  *out = kv->value;
  return 0;
}

/* A boolean option (true/false, or QEMU's "on"/"off" strings). */
static int
json_get_bool (struct json_doc *d, const char *prefix, const char *name,
               bool *out, char **why)
{
  struct json_kv *kv = json_get (d, prefix, name);

  if (!kv)
    return 0;
  if (strcmp (kv->value, "true") == 0 || strcmp (kv->value, "on") == 0)
    *out = true;
  else if (strcmp (kv->value, "false") == 0 || strcmp (kv->value, "off") == 0)
    *out = false;
  else
    return name_fail (why, -EINVAL, "json: \"%s%s\" must be true or false, "
                      "not \"%s\"", prefix, name, kv->value);
  return 0;
}

/* A non-negative integer option (a number or a string of digits). */
static int
json_get_u64 (struct json_doc *d, const char *prefix, const char *name,
              uint64_t *out, bool *set, char **why)
{
  struct json_kv *kv = json_get (d, prefix, name);
  char *end;

  if (!kv)
    return 0;
  errno = 0;
  *out = strtoull (kv->value, &end, 10);
  if (kv->type == JSON_BOOL || kv->type == JSON_NULL ||
      !isdigit ((unsigned char) kv->value[0]) || *end || errno)
    return name_fail (why, -EINVAL, "json: \"%s%s\" must be a non-negative "
                      "integer, not \"%s\"", prefix, name, kv->value);
  if (set)
    *set = true;
  return 0;
}

/* Percent-encode s for a URL's path or query: everything but the
 * unreserved characters and '/' (and ':' and '@' outside queries).
 */
static char *
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

/* [s, s+len) percent-decoded into dst, NUL-terminated: the end. */
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
static int
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
static int
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

/* The QEMU driver of a URL we take: nbd, http, https or ssh. */
static const char *
name_url_driver (const char *url)
{
  return strncmp (url, "nbd", 3) == 0 ? "nbd"
    : strncmp (url, "https:", 6) == 0 ? "https"
    : strncmp (url, "http:", 5) == 0 ? "http" : "ssh";
}

/* A name that is not json: a URL, a legacy NBD name, file:PATH, or a
 * local path.
 */
static int
name_parse_plain (const char *name, struct name_spec *spec, char **why)
{
  size_t n = strcspn (name, ":/");
  bool url = strncmp (name + n, "://", 3) == 0;

  if (url) {
    for (size_t i = 0; name_url_schemes[i]; i++)
      if (strncmp (name, name_url_schemes[i],
                   strlen (name_url_schemes[i])) == 0) {
        spec->url = strdup (name);
        return spec->url ? 0 : -ENOMEM;
      }
    /* QEMU spells TCP both ways. */
    if (strncmp (name, "nbd+tcp://", 10) == 0) {
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

/* json: the nbd driver's options under p. */
static int
name_json_nbd (struct json_doc *d, const char *p, struct name_spec *spec,
               char **why)
{
  const char *type, *host, *port, *path, *export, *lhost, *lport, *lpath;
  const char *ignored;
  int r = 0;

  if ((r = json_get_string (d, p, "server.type", &type, why)) < 0 ||
      (r = json_get_string (d, p, "server.host", &host, why)) < 0 ||
      (r = json_get_string (d, p, "server.port", &port, why)) < 0 ||
      (r = json_get_string (d, p, "server.path", &path, why)) < 0 ||
      (r = json_get_string (d, p, "host", &lhost, why)) < 0 ||
      (r = json_get_string (d, p, "port", &lport, why)) < 0 ||
      (r = json_get_string (d, p, "path", &lpath, why)) < 0 ||
      (r = json_get_string (d, p, "export", &export, why)) < 0 ||
      /* QEMU's tuning of its own reconnection: remote-timeout= is ours. */
      (r = json_get_string (d, p, "reconnect-delay", &ignored, why)) < 0 ||
      (r = json_get_string (d, p, "open-timeout", &ignored, why)) < 0)
    return r;
  if (json_get (d, p, "tls-creds"))
    return name_fail (why, -ENOTSUP, "json: \"%stls-creds\" names a QEMU "
                      "object: for NBD over TLS use an nbds:// or "
                      "nbds+unix:// URL (libnbd's TLS settings)", p);
  /* QEMU's legacy keys, as it translates them. */
  if (!type && (lhost || lpath)) {
    type = lpath ? "unix" : "inet";
    host = lhost;
    port = lport;
    path = lpath;
  }
  if (type && strcmp (type, "unix") == 0 && path)
    return name_nbd_url (spec, NULL, NULL, path, export, why);
  if (type && strcmp (type, "inet") == 0 && host)
    return name_nbd_url (spec, host, port, NULL, export, why);
  return name_fail (why, -EINVAL, "json: the nbd driver needs "
                    "\"%sserver\": {\"type\": \"unix\", \"path\": SOCKET} "
                    "or {\"type\": \"inet\", \"host\": HOST, \"port\": "
                    "PORT}", p);
}

/* json: the curl drivers' options under p (http, https). */
static int
name_json_curl (struct json_doc *d, const char *p, const char *driver,
                struct name_spec *spec, char **why)
{
  static const char *const secrets[] = {
    "username", "password-secret", "proxy-username",
    "proxy-password-secret", "cookie-secret", NULL
  };
  const char *url, *readahead;
  uint64_t t = 0;
  int r;

  spec->remote.sslverify = true;
  if ((r = json_get_string (d, p, "url", &url, why)) < 0 ||
      (r = json_get_bool (d, p, "sslverify", &spec->remote.sslverify,
                          why)) < 0 ||
      (r = json_get_string (d, p, "cookie", &spec->remote.cookie, why)) < 0 ||
      /* QEMU's read-ahead only tunes QEMU's own reads. */
      (r = json_get_string (d, p, "readahead", &readahead, why)) < 0 ||
      (r = json_get_u64 (d, p, "timeout", &t, NULL, why)) < 0)
    return r;
  for (size_t i = 0; secrets[i]; i++)
    if (json_get (d, p, secrets[i]))
      return name_fail (why, -ENOTSUP, "json: \"%s%s\" is not supported "
                        "(QEMU secrets are QEMU objects): put the user in "
                        "the URL", p, secrets[i]);
  if (t > 3600)
    return name_fail (why, -EINVAL, "json: \"%stimeout\" is at most 3600 "
                      "seconds, as in QEMU", p);
  spec->remote.timeout = t;
  if (!url)
    return name_fail (why, -EINVAL, "json: the %s driver needs \"%surl\"",
                      driver, p);
  if (strcmp (name_url_driver (url), driver) != 0)
    return name_fail (why, -EINVAL, "json: the %s driver's URL \"%s\" is "
                      "not an %s:// URL", driver, url, driver);
  spec->url = strdup (url);
  if (spec->remote.cookie &&
      !(spec->remote.cookie = spec->cookie = strdup (spec->remote.cookie)))
    return -ENOMEM;
  return spec->url ? 0 : -ENOMEM;
}

/* json: the ssh driver's options under p, as the URL QEMU reads
 * (split again by name_parse_ssh, as a URL in an image is).
 */
static int
name_json_ssh (struct json_doc *d, const char *p, struct name_spec *spec,
               char **why)
{
  const char *host, *port, *path, *user, *mode, *lhost, *lport, *check;
  char *epath = NULL, *euser = NULL;
  int r;

  if ((r = json_get_string (d, p, "server.host", &host, why)) < 0 ||
      (r = json_get_string (d, p, "server.port", &port, why)) < 0 ||
      (r = json_get_string (d, p, "host", &lhost, why)) < 0 ||
      (r = json_get_string (d, p, "port", &lport, why)) < 0 ||
      (r = json_get_string (d, p, "path", &path, why)) < 0 ||
      (r = json_get_string (d, p, "user", &user, why)) < 0 ||
      (r = json_get_string (d, p, "host-key-check.mode", &mode, why)) < 0 ||
      (r = json_get_string (d, p, "host_key_check", &check, why)) < 0)
    return r;
  if (!host) {
    host = lhost;
    port = lport;
  }
  if (!host || !path)
    return name_fail (why, -EINVAL, "json: the ssh driver needs "
                      "\"%sserver\": {\"host\": HOST} and \"%spath\"", p, p);
  if (mode && strcmp (mode, "none") == 0)
    check = "no";
  else if (mode && strcmp (mode, "known_hosts") == 0)
    check = NULL;
  else if (mode || (check && strcmp (check, "no") != 0 &&
                    strcmp (check, "yes") != 0))
    return name_fail (why, -ENOTSUP, "json: host key check \"%s\" is not "
                      "supported: nbdkit's ssh plugin checks known_hosts, "
                      "or nothing (\"none\")", mode ? mode : check);
  epath = name_url_escape (path, false);
  euser = user ? name_url_escape (user, true) : NULL;
  if (!epath || (user && !euser))
    r = -1;
  else
    r = asprintf (&spec->url, "ssh://%s%s%s%s%s%s%s%s", euser ? euser : "",
                  euser ? "@" : "", strchr (host, ':') ? "[" : "", host,
                  strchr (host, ':') ? "]" : "", port ? ":" : "",
                  port ? port : "", epath);
  free (epath);
  free (euser);
  if (r < 0) {
    spec->url = NULL;
    return -ENOMEM;
  }
  if (check && strcmp (check, "no") == 0) {
    char *u;
    if (asprintf (&u, "%s?host_key_check=no", spec->url) < 0)
      return -ENOMEM;
    free (spec->url);
    spec->url = u;
  }
  return 0;
}

/* json: the protocol node under p ("" or "file."). */
static int
name_json_protocol (struct json_doc *d, const char *p,
                    struct name_spec *spec, char **why)
{
  const char *driver, *filename;
  int r;

  if ((r = json_get_string (d, p, "driver", &driver, why)) < 0 ||
      (r = json_get_string (d, p, "filename", &filename, why)) < 0)
    return r;
  /* A filename QEMU parses by its own rules (a URL, a path). */
  if (filename) {
    if ((r = name_parse_plain (filename, spec, why)) < 0)
      return r;
    if (driver && strcmp (driver, spec->path ? "file"
                          : name_url_driver (spec->url)) != 0)
      return name_fail (why, -EINVAL, "json: \"%sfilename\" \"%s\" is not "
                        "a name for the %s driver", p, filename, driver);
    return 0;
  }
  if (!driver)
    return name_fail (why, -EINVAL, "json: \"%sdriver\" is missing", p);
  if (strcmp (driver, "file") == 0)
    return name_fail (why, -EINVAL, "json: the file driver needs "
                      "\"%sfilename\"", p);
  if (strcmp (driver, "nbd") == 0)
    return name_json_nbd (d, p, spec, why);
  if (strcmp (driver, "http") == 0 || strcmp (driver, "https") == 0)
    return name_json_curl (d, p, driver, spec, why);
  if (strcmp (driver, "ssh") == 0)
    return name_json_ssh (d, p, spec, why);
  return name_fail (why, -ENOTSUP, "json: driver \"%s\" is not supported: "
                    "raw or qcow2 over file, nbd, http, https or ssh are",
                    driver);
}

/* json: a format node (raw, qcow2) over its "file", or a protocol node. */
static int
name_parse_json (const char *name, struct name_spec *spec, char **why)
{
  struct json_doc d;
  struct json_kv *kv;
  const char *driver;
  int r;

  if ((r = json_parse (name + 5, &d, why)) < 0)
    return r;
  if ((r = json_get_string (&d, "", "driver", &driver, why)) < 0)
    goto out;
  if (driver && strcmp (driver, "raw") != 0 && strcmp (driver, "qcow2") != 0) {
    /* A protocol node at the top: the storage itself. */
    r = name_json_protocol (&d, "", spec, why);
    goto out;
  }
  spec->format = driver ? (strcmp (driver, "raw") == 0 ? "raw" : "qcow2")
                        : NULL;
  if ((kv = json_get (&d, "", "file")) != NULL) {
    r = name_fail (why, -EINVAL, "json: \"file\": \"%s\" names a block node, "
                   "which exists only inside QEMU: give the node's options "
                   "as an object, {\"driver\": ...}", kv->value);
    goto out;
  }
  if (!json_has_object (&d, "", "file")) {
    r = name_fail (why, -EINVAL, "json: \"file\" is missing: the storage "
                   "the %s image is in", driver ? driver : "");
    goto out;
  }
  if ((r = json_get_u64 (&d, "", "offset", &spec->raw_offset,
                         &spec->raw_window, why)) < 0 ||
      (r = json_get_u64 (&d, "", "size", &spec->raw_size,
                         &spec->raw_size_set, why)) < 0)
    goto out;
  spec->raw_window |= spec->raw_size_set;
  if ((kv = json_get (&d, "", "backing")) != NULL) {
    if (kv->type != JSON_NULL) {
      r = name_fail (why, -ENOTSUP, "json: only \"backing\": null is "
                     "supported (no backing file)");
      goto out;
    }
    spec->no_backing = true;
  }
  r = name_json_protocol (&d, "file.", spec, why);

 out:
  for (size_t i = 0; r == 0 && i < d.n; i++)
    if (!d.kv[i].used)
      r = name_fail (why, -ENOTSUP, "json: option \"%s\" is not supported",
                     d.kv[i].key);
  json_free (&d);
  return r;
}

int
name_parse (const char *name, struct name_spec *spec, char **why)
{
  int r;

  *spec = (struct name_spec) { .remote.sslverify = true };
  *why = NULL;
  r = strncmp (name, "json:", 5) == 0 ? name_parse_json (name, spec, why)
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

void
name_spec_free (struct name_spec *spec)
{
  free (spec->path);
  free (spec->url);
  free (spec->cookie);
  free (spec->ssh);
  spec->path = spec->url = spec->cookie = spec->ssh = NULL;
}

/* QEMU's path_combine (base, ""): base up to its last '/', or up to
 * the protocol's colon.
 */
static char *
name_dirname (const char *base)
{
  const char *p = base, *slash = strrchr (base, '/');

  if (name_has_protocol (base))
    p = strchr (base, ':') + 1;
  if (slash && slash + 1 > p)
    p = slash + 1;
  return strndup (base, p - base);
}

/* Where the relative names of the image named naming resolve: the
 * prefix they are appended to, as QEMU's bdrv_dirname makes it.
 */
static int
name_dir (const char *naming, char **dir, char **why)
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
    *dir = name_dirname (spec.url);
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
  if ((e = name_dir (naming, &dir, why)) < 0) {
    if (!*why)
      name_fail (why, e, "%s", errstr (-e));
    return NULL;
  }
  if (asprintf (&r, "%s%s", dir, name) < 0)
    r = NULL;
  free (dir);
  return r;
}
