/* SPDX-License-Identifier: BSD-3-Clause */
/* "json:{...}" pseudo-filenames: the JSON read by json-c and flattened
 * into dotted keys, and the options of the drivers we open (raw and
 * qcow2 over file, nbd, http, https, ssh) read from them into a
 * name_spec, as QEMU reads them.  A "filename" option, and the URLs the
 * drivers' options make, are read as names.c reads a name.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json.h>

#include "internal.h"

/* A name is untrusted (an image's backing file name is whatever its
 * maker wrote): its size and the depth of its objects are bounded.  A
 * header holds at most 1023 bytes of name, and the deepest name we
 * read nests three objects ({"file": {"server": {...}}}).
 */
#define JSON_MAX_SIZE 65536
#define JSON_MAX_DEPTH 16

#define JSON_SPACE " \t\n\r"
#define JSON_DIGITS "0123456789"
#define JSON_HEX JSON_DIGITS "abcdefABCDEF"
#define JSON_SINGLE_QUOTES "single quotes (QEMU's extension of JSON) are " \
  "not supported: use double quotes"

/* "json:{...}", flattened as QEMU's qdict_flatten does: nested objects
 * become dotted keys ("file": {"server": {"type": ...}} is
 * "file.server.type"), so that the spellings QEMU accepts read the
 * same, but for two refused: single quotes (QEMU's extension) and a
 * key given both nested and dotted (QEMU takes the last).  An empty
 * object stays a value, as in QEMU.
 */
enum json_kind { JSON_STRING, JSON_NUMBER, JSON_BOOL, JSON_NULL, JSON_OBJECT };

struct json_kv {
  char *key;
  char *value;                  /* strings, numbers as written, "true"... */
  enum json_kind type;
  bool used;                    /* looked up: every key must be */
};

struct json_doc {
  struct json_kv *kv;
  size_t n;
  size_t members;               /* of every object json-c made */
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

/* A refusal at p in the text, which is quoted up to a control
 * character: a message is one line.
 */
static int
json_fail_at (struct json_doc *d, const char *p, const char *what)
{
  int n = 0;

  while (n < 20 && (unsigned char) p[n] >= 0x20)
    n++;
  return name_fail (d->why, -EINVAL, "json: %s at \"%.*s\"", what, n, p);
}

/* json-c's refusal at p, in the words of the reader json-c replaced
 * (which tests and users know).
 */
static int
json_parse_error (struct json_doc *d, enum json_tokener_error e,
                  const char *p)
{
  const char *what = *p == '\'' ? JSON_SINGLE_QUOTES : "expected a value";
  char deep[64];

  switch (e) {
  case json_tokener_continue:   /* still, after the byte of a string */
    what = "unterminated string";
    break;
  case json_tokener_error_depth:
    snprintf (deep, sizeof deep, "objects nest more than %d deep",
              JSON_MAX_DEPTH);
    what = deep;
    break;
  case json_tokener_error_parse_object_key_name:
    what = *p == '\'' ? JSON_SINGLE_QUOTES : "expected a key";
    break;
  case json_tokener_error_parse_object_key_sep:
    what = "expected ':'";
    break;
  case json_tokener_error_parse_object_value_sep:
    what = "expected ',' or '}'";
    break;
  case json_tokener_error_parse_array:
    what = "arrays are not supported";
    break;
  case json_tokener_error_parse_string:
    what = "bad escape in a string";
    break;
  case json_tokener_error_parse_utf8_string:
    what = "invalid UTF-8";
    break;
  default:                      /* a bad value, or a stray character */
    break;
  }
  return json_fail_at (d, p, what);
}

/* The length of the UTF-8 sequence at p, or 0 if RFC 3629 does not
 * allow it: json-c's check lets overlong ones, surrogates and code
 * points past U+10FFFF through, which QEMU refuses.
 */
static size_t
json_utf8_len (const unsigned char *p)
{
  unsigned char lo = 0x80, hi = 0xbf;
  size_t n;

  if (p[0] < 0x80)
    return 1;
  if (p[0] >= 0xc2 && p[0] <= 0xdf)
    n = 2;
  else if (p[0] >= 0xe0 && p[0] <= 0xef)
    n = 3;
  else if (p[0] >= 0xf0 && p[0] <= 0xf4)
    n = 4;
  else
    return 0;
  /* The second byte's range is what rules those out. */
  if (p[0] == 0xe0)
    lo = 0xa0;
  else if (p[0] == 0xed)
    hi = 0x9f;
  else if (p[0] == 0xf0)
    lo = 0x90;
  else if (p[0] == 0xf4)
    hi = 0x8f;
  if (p[1] < lo || p[1] > hi)
    return 0;
  for (size_t i = 2; i < n; i++)
    if ((p[i] & 0xc0) != 0x80)
      return 0;
  return n;
}

static unsigned long
json_hex4 (const char *p)
{
  char s[5] = { p[0], p[1], p[2], p[3], '\0' };

  return strtoul (s, NULL, 16);
}

/* The length of the escape \uXXXX (or a surrogate pair of them) at p,
 * or 0 if QEMU refuses it: \u0000 (json-c cuts a key there) and half a
 * surrogate pair (json-c makes U+FFFD of it).
 */
static size_t
json_escape_len (const char *p)
{
  unsigned long c, lo;

  if (strspn (p + 2, JSON_HEX) < 4)
    return 0;
  c = json_hex4 (p + 2);
  if (c == 0 || (c >= 0xdc00 && c < 0xe000))
    return 0;
  if (c < 0xd800 || c >= 0xe000)
    return 6;
  if (p[6] != '\\' || p[7] != 'u' || strspn (p + 8, JSON_HEX) < 4)
    return 0;
  lo = json_hex4 (p + 8);
  return lo >= 0xdc00 && lo < 0xe000 ? 12 : 0;
}

/* The length of the JSON number at p (RFC 8259), or 0: json-c also
 * takes "1.", "00" and "-01", which QEMU refuses.
 */
static size_t
json_number_len (const char *p)
{
  const char *q = p + (*p == '-');
  size_t digits = strspn (q, JSON_DIGITS);

  if (digits == 0 || (*q == '0' && digits > 1))
    return 0;
  q += digits;
  if (*q == '.') {
    if (!(digits = strspn (q + 1, JSON_DIGITS)))
      return 0;
    q += 1 + digits;
  }
  if (*q == 'e' || *q == 'E') {
    q++;
    q += *q == '+' || *q == '-';
    if (!(digits = strspn (q, JSON_DIGITS)))
      return 0;
    q += digits;
  }
  return q - p;
}

/* What json-c lets through and QEMU refuses, found in the text json-c
 * read (so its strings are whole): numbers json_number_len refuses; in
 * strings, control characters, UTF-8 json_utf8_len refuses and escapes
 * json_escape_len refuses; keys in single quotes (json-c takes them,
 * but not such values).  And
 * the members counted (the colons outside strings): json-c keeps the
 * last of a key given twice in an object, which QEMU refuses, and
 * then its objects hold fewer.
 */
static int
json_scan (struct json_doc *d, const char *text, size_t *members)
{
  bool in = false;
  char what[64];

  *members = 0;
  for (const char *p = text; *p; ) {
    unsigned char c = *p;
    size_t n = 1;

    if (!in) {
      if (c == '\'')
        return json_fail_at (d, p, JSON_SINGLE_QUOTES);
      if ((c == '-' || isdigit (c)) && !(n = json_number_len (p)))
        return json_fail_at (d, p, "bad number");
      in = c == '"';
      *members += c == ':';
    }
    else if (c == '"')
      in = false;
    else if (c < 0x20) {
      snprintf (what, sizeof what, "control character 0x%02x in a string "
                "(escape it)", c);
      return json_fail_at (d, p + 1, what);
    }
    else if (c == '\\' && p[1] == 'u') {
      if (!(n = json_escape_len (p)))
        return json_fail_at (d, p, "\\u0000 or half a surrogate pair in "
                             "a string");
    }
    else if (c == '\\')
      n = p[1] ? 2 : 1;
    else if (!(n = json_utf8_len ((const unsigned char *) p)))
      return json_fail_at (d, p, "invalid UTF-8 in a string");
    p += n;
  }
  return 0;
}

static int
json_add (struct json_doc *d, char *key, char *value, enum json_kind type)
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

static int json_flatten (struct json_doc *d, struct json_object *obj,
                         const char *prefix);

/* Adds the value v (NULL: null) of key, its full dotted name (freed). */
static int
json_flatten_value (struct json_doc *d, char *key, struct json_object *v)
{
  enum json_kind type = JSON_NULL;
  const char *text = "null", *bad = NULL;
  char *value;
  int r;

  switch (json_object_get_type (v)) {
  case json_type_object:
    if (json_object_object_length (v) > 0) {
      r = json_flatten (d, v, key);
      free (key);
      return r;
    }
    type = JSON_OBJECT;
    text = "{}";
    break;
  case json_type_array:
    bad = "arrays are not supported";
    break;
  case json_type_string:
    type = JSON_STRING;
    break;
  case json_type_int:
    /* Where json-c holds an integer past 64 bits, which QEMU reads as
     * a double, as no option here takes.
     */
    if (json_object_get_int64 (v) == INT64_MIN ||
        json_object_get_uint64 (v) == UINT64_MAX)
      bad = "the number is out of range";
    type = JSON_NUMBER;
    break;
  case json_type_double:
    /* json-c reads NaN and Infinity, which are not JSON. */
    if (!isfinite (json_object_get_double (v)))
      bad = "expected a number";
    type = JSON_NUMBER;
    break;
  case json_type_boolean:
    type = JSON_BOOL;
    break;
  case json_type_null:
    break;
  }
  if (bad) {
    r = name_fail (d->why, -EINVAL, "json: \"%s\": %s", key, bad);
    free (key);
    return r;
  }
  /* A number as written (an integer in decimal). */
  if (type == JSON_STRING || type == JSON_NUMBER || type == JSON_BOOL)
    text = json_object_get_string (v);
  if (!(value = strdup (text))) {
    free (key);
    return -ENOMEM;
  }
  return json_add (d, key, value, type);
}

/* Adds the members of obj, their keys under prefix ("" at the top). */
static int
json_flatten (struct json_doc *d, struct json_object *obj, const char *prefix)
{
  d->members += json_object_object_length (obj);
  json_object_object_foreach (obj, name, v) {
    char *key = NULL;
    int r;

    if (prefix[0] == '\0')
      key = strdup (name);
    else if (asprintf (&key, "%s.%s", prefix, name) < 0)
      key = NULL;
    if (!key)
      return -ENOMEM;
    if ((r = json_flatten_value (d, key, v)) < 0)
      return r;
  }
  return 0;
}

static int
json_parse (const char *text, struct json_doc *d, char **why)
{
  const int flags = JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8 |
    JSON_TOKENER_ALLOW_TRAILING_CHARS; /* found below, to be named */
  size_t len = strlen (text), members;
  const char *start = text + strspn (text, JSON_SPACE), *end;
  struct json_tokener *tok;
  struct json_object *obj;
  enum json_tokener_error e;
  int r;

  *d = (struct json_doc) { .why = why };
  if (len > JSON_MAX_SIZE)
    return name_fail (why, -EINVAL, "json: the name is longer than %d "
                      "bytes", JSON_MAX_SIZE);
  if (*start != '{')
    return json_fail_at (d, start, "expected an object");
  if (!(tok = json_tokener_new_ex (JSON_MAX_DEPTH)))
    return -ENOMEM;
  /* Strict: none of json-c's extensions (comments, trailing commas). */
  json_tokener_set_flags (tok, flags);
  obj = json_tokener_parse_ex (tok, text, len);
  e = json_tokener_get_error (tok);
  end = text + json_tokener_get_parse_end (tok);
  if (e == json_tokener_continue) {
    /* The text ends early: what json-c wanted next shows when it is
     * fed a space (ending a number or a word) and a byte that JSON
     * holds only in a string.
     */
    json_tokener_parse_ex (tok, " \x01", 2);
    e = json_tokener_get_error (tok);
    end = text + len;
  }
  json_tokener_free (tok);
  end += strspn (end, JSON_SPACE);
  if (!obj)
    r = json_parse_error (d, e, end);
  else if (*end)
    r = json_fail_at (d, end, "text after the object");
  else if ((r = json_scan (d, text, &members)) == 0 &&
           (r = json_flatten (d, obj, "")) == 0 && members != d->members)
    r = name_fail (why, -EINVAL, "json: a key is given twice in one "
                   "object");
  json_object_put (obj);
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
  if ((kv->type != JSON_STRING && kv->type != JSON_NUMBER) ||
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
    r = kv->type == JSON_STRING
      ? name_fail (why, -EINVAL, "json: \"file\": \"%s\" names a block "
                   "node, which exists only inside QEMU: give the node's "
                   "options as an object, {\"driver\": ...}", kv->value)
      : name_fail (why, -EINVAL, "json: \"file\" must be the options of "
                   "the storage the image is in, {\"driver\": ...}, not %s",
                   kv->value);
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
