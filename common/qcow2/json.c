/* SPDX-License-Identifier: BSD-3-Clause */
/* "json:{...}" pseudo-filenames: the JSON parsed into flattened keys,
 * and the options of the drivers we open (raw and qcow2 over file, nbd,
 * http, https, ssh) read from them into a name_spec, as QEMU reads
 * them.  A "filename" option, and the URLs the drivers' options make,
 * are read as names.c reads a name.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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

/* Parses a string at d->p (the opening quote) into *out (malloc'd). */
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

/* Parses the value of key (its full dotted name) at d->p. */
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

/* Parses an object at d->p (the opening brace), its keys under prefix. */
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

/* Returns the entry of the key prefix + name (prefix "" or ending in
 * '.'), now used, or NULL.
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

/* Sets *out to a string (or number: QEMU takes ports either way)
 * option, or NULL.  Returns 0, or -EINVAL with *why if it has another
 * type.
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

/* Reads a boolean option (true/false, or QEMU's "on"/"off" strings). */
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

/* Reads a non-negative integer option (a number or a string of
 * digits).
 */
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

/* json: the nbd driver's options under p. */
static int
json_nbd (struct json_doc *d, const char *p, struct name_spec *spec,
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
json_curl (struct json_doc *d, const char *p, const char *driver,
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
  spec->url = name_url_dup (url);
  if (spec->remote.cookie &&
      !(spec->remote.cookie = spec->cookie = strdup (spec->remote.cookie)))
    return -ENOMEM;
  return spec->url ? 0 : -ENOMEM;
}

/* json: the ssh driver's options under p, as the URL QEMU reads
 * (split again by name_parse_ssh, as a URL in an image is).
 */
static int
json_ssh (struct json_doc *d, const char *p, struct name_spec *spec,
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
json_protocol (struct json_doc *d, const char *p,
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
    return json_nbd (d, p, spec, why);
  if (strcmp (driver, "http") == 0 || strcmp (driver, "https") == 0)
    return json_curl (d, p, driver, spec, why);
  if (strcmp (driver, "ssh") == 0)
    return json_ssh (d, p, spec, why);
  return name_fail (why, -ENOTSUP, "json: driver \"%s\" is not supported: "
                    "raw or qcow2 over file, nbd, http, https or ssh are",
                    driver);
}

/* json: a format node (raw, qcow2) over its "file", or a protocol node. */
int
json_parse_name (const char *name, struct name_spec *spec, char **why)
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
    r = json_protocol (&d, "", spec, why);
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
  r = json_protocol (&d, "file.", spec, why);

 out:
  for (size_t i = 0; r == 0 && i < d.n; i++)
    if (!d.kv[i].used)
      r = name_fail (why, -ENOTSUP, "json: option \"%s\" is not supported",
                     d.kv[i].key);
  json_free (&d);
  return r;
}
