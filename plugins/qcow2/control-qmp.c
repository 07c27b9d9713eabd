/* SPDX-License-Identifier: BSD-3-Clause */
/* QMP as QEMU 7.2 speaks it (docs/interop/qmp-spec.rst), one client's
 * session: the greeting, capabilities negotiation, the framing of
 * messages in a byte stream (json-c's incremental parser), the checks
 * of a message and the wording of their errors (those of QEMU's
 * qmp-dispatch.c and qobject input visitor, compared in
 * tests/test-control-qemu.sh), the command table, the argument
 * helpers, and the built-in commands.  The input is untrusted: a
 * message is bounded in size and depth, and every reply is valid JSON
 * in ASCII (fuzz/fuzz-control.c checks both).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "control.h"
#include "control-qmp.h"

struct control_call {
  struct qmp_session *session;
  bool failed;
  enum control_class cls;
  char *desc;                   /* NULL if failed: out of memory */
};

static const char *const qmp_class_names[] = {
  [CONTROL_GENERIC_ERROR] = "GenericError",
  [CONTROL_COMMAND_NOT_FOUND] = "CommandNotFound",
  [CONTROL_DEVICE_NOT_ACTIVE] = "DeviceNotActive",
  [CONTROL_DEVICE_NOT_FOUND] = "DeviceNotFound",
};

/* What a reply says when not even its error could be built. */
static const char qmp_no_memory[] =
  "{\"error\": {\"class\": \"GenericError\", \"desc\": \"out of memory\"}}\r\n";

int
control_fail (struct control_call *call, enum control_class cls,
              const char *fmt, ...)
{
  va_list ap;
  char *desc;

  va_start (ap, fmt);
  if (vasprintf (&desc, fmt, ap) == -1)
    desc = NULL;
  va_end (ap);
  /* The first failure is the one the client hears of. */
  if (call->failed)
    free (desc);
  else {
    call->failed = true;
    call->cls = cls;
    call->desc = desc;
  }
  return -1;
}

/* Adds v (a new reference) to o as key; false (v dropped) if either is
 * NULL (out of memory) or the add fails.
 */
static bool
qmp_put (struct json_object *o, const char *key, struct json_object *v)
{
  if (!o || !v || json_object_object_add (o, key, v) == -1) {
    json_object_put (v);
    return false;
  }
  return true;
}

/* The helpers' common start: 1 with *v the key's value (NULL: JSON
 * null), 0 if absent and optional, -1 if absent and required.
 */
static int
qmp_arg (struct control_call *call, struct json_object *args,
         const char *key, bool required, struct json_object **v)
{
  if (json_object_object_get_ex (args, key, v))
    return 1;
  if (required)
    return control_fail (call, CONTROL_GENERIC_ERROR,
                         "Parameter '%s' is missing", key);
  return 0;
}

static int
qmp_arg_type_error (struct control_call *call, const char *key,
                    const char *type)
{
  return control_fail (call, CONTROL_GENERIC_ERROR,
                       "Invalid parameter type for '%s', expected: %s",
                       key, type);
}

int
control_arg_string (struct control_call *call, struct json_object *args,
                    const char *key, bool required, const char **out)
{
  struct json_object *v;
  int r = qmp_arg (call, args, key, required, &v);

  if (r <= 0)
    return r;
  if (!json_object_is_type (v, json_type_string))
    return qmp_arg_type_error (call, key, "string");
  if (strlen (json_object_get_string (v)) !=
      (size_t) json_object_get_string_len (v))
    return control_fail (call, CONTROL_GENERIC_ERROR,
                         "Parameter '%s' must not contain a NUL character",
                         key);
  *out = json_object_get_string (v);
  return 1;
}

int
control_arg_int (struct control_call *call, struct json_object *args,
                 const char *key, bool required, int64_t *out)
{
  struct json_object *v;
  int r = qmp_arg (call, args, key, required, &v);

  if (r <= 0)
    return r;
  /* json-c holds a number past INT64_MAX as a uint64_t, which
   * json_object_get_int64 would clamp.
   */
  if (!json_object_is_type (v, json_type_int) ||
      (json_object_get_int64 (v) == INT64_MAX &&
       json_object_get_uint64 (v) != INT64_MAX))
    return qmp_arg_type_error (call, key, "integer");
  *out = json_object_get_int64 (v);
  return 1;
}

int
control_arg_bool (struct control_call *call, struct json_object *args,
                  const char *key, bool required, bool *out)
{
  struct json_object *v;
  int r = qmp_arg (call, args, key, required, &v);

  if (r <= 0)
    return r;
  if (!json_object_is_type (v, json_type_boolean))
    return qmp_arg_type_error (call, key, "boolean");
  *out = json_object_get_boolean (v);
  return 1;
}

/* word among words (NULL-terminated): its index, or -1. */
static int
qmp_word (const char *word, const char *const *words)
{
  for (int i = 0; words[i]; i++)
    if (strcmp (word, words[i]) == 0)
      return i;
  return -1;
}

int
control_arg_enum (struct control_call *call, struct json_object *args,
                  const char *key, bool required, const char *const *words,
                  unsigned *out)
{
  const char *value;
  int i, r = control_arg_string (call, args, key, required, &value);

  if (r <= 0)
    return r;
  i = qmp_word (value, words);
  if (i == -1)
    return control_fail (call, CONTROL_GENERIC_ERROR,
                         "Parameter '%s' does not accept value '%s'",
                         key, value);
  *out = i;
  return 1;
}

int
control_args_only (struct control_call *call, struct json_object *args,
                   const char *const *keys)
{
  json_object_object_foreach (args, key, value) {
    (void) value;
    if (!keys || qmp_word (key, keys) == -1)
      return control_fail (call, CONTROL_GENERIC_ERROR,
                           "Parameter '%s' is unexpected", key);
  }
  return 0;
}

/* The built-in commands (at the end), then the tables registered, in
 * order.
 */
static int qmp_cmd_capabilities (struct control_call *call,
                                 struct json_object *args,
                                 struct json_object **ret);
static int qmp_cmd_query_version (struct control_call *call,
                                  struct json_object *args,
                                  struct json_object **ret);
static int qmp_cmd_query_commands (struct control_call *call,
                                   struct json_object *args,
                                   struct json_object **ret);
static const struct control_command qmp_builtins[] = {
  { "qmp_capabilities", qmp_cmd_capabilities },
  { "query-version", qmp_cmd_query_version },
  { "query-commands", qmp_cmd_query_commands },
};
#define QMP_BUILTINS (sizeof qmp_builtins / sizeof *qmp_builtins)
#define QMP_TABLES_MAX 16
static struct {
  const struct control_command *rows;
  size_t n;
} qmp_tables[QMP_TABLES_MAX];
static size_t qmp_tables_len;

static const struct control_command *
qmp_find_in (const struct control_command *rows, size_t n, const char *name)
{
  for (size_t i = 0; i < n; i++)
    if (strcmp (rows[i].name, name) == 0)
      return &rows[i];
  return NULL;
}

static const struct control_command *
qmp_find (const char *name)
{
  const struct control_command *c;

  c = qmp_find_in (qmp_builtins, QMP_BUILTINS, name);
  for (size_t t = 0; !c && t < qmp_tables_len; t++)
    c = qmp_find_in (qmp_tables[t].rows, qmp_tables[t].n, name);
  return c;
}

int
control_add_commands (const struct control_command *table, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (qmp_find (table[i].name) || qmp_find_in (table, i, table[i].name)) {
      errno = EEXIST;
      return -1;
    }
  if (qmp_tables_len == QMP_TABLES_MAX) {
    errno = ENOSPC;
    return -1;
  }
  qmp_tables[qmp_tables_len].rows = table;
  qmp_tables[qmp_tables_len++].n = n;
  return 0;
}

/* Our version, in query-version's shape: QEMU's numbers are ours. */
static struct json_object *
qmp_version (void)
{
  unsigned v[3] = { 0, 0, 0 };
  struct json_object *o = json_object_new_object ();
  struct json_object *qemu = json_object_new_object ();

  if (sscanf (PACKAGE_VERSION, "%u.%u.%u", &v[0], &v[1], &v[2]) < 1)
    v[0] = 0;
  if (!qmp_put (o, "qemu", qemu) ||
      !qmp_put (qemu, "major", json_object_new_int64 (v[0])) ||
      !qmp_put (qemu, "minor", json_object_new_int64 (v[1])) ||
      !qmp_put (qemu, "micro", json_object_new_int64 (v[2])) ||
      !qmp_put (o, "package",
                json_object_new_string (PACKAGE_NAME " " PACKAGE_VERSION))) {
    json_object_put (o);
    return NULL;
  }
  return o;
}

/* Sends o; false if out of memory (nothing sent). */
static bool
qmp_send (struct qmp_session *s, struct json_object *o)
{
  size_t len;
  char *line = qmp_line (o, true, &len);

  if (!line)
    return false;
  s->send (s->opaque, line, len);
  free (line);
  return true;
}

/* One UTF-8 character at s (n bytes left): its length, with *cp its
 * code point, or 0 if the bytes are not one (overlong, a surrogate,
 * past U+10FFFF, cut).
 */
static size_t
qmp_utf8 (const unsigned char *s, size_t n, uint32_t *cp)
{
  size_t len;
  uint32_t min;

  if (s[0] >= 0xc2 && s[0] <= 0xdf)
    len = 2, min = 0x80, *cp = s[0] & 0x1f;
  else if ((s[0] & 0xf0) == 0xe0)
    len = 3, min = 0x800, *cp = s[0] & 0x0f;
  else if (s[0] >= 0xf0 && s[0] <= 0xf4)
    len = 4, min = 0x10000, *cp = s[0] & 0x07;
  else
    return 0;
  if (n < len)
    return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    *cp = *cp << 6 | (s[i] & 0x3f);
  }
  if (*cp < min || *cp > 0x10ffff || (*cp >= 0xd800 && *cp <= 0xdfff))
    return 0;
  return len;
}

/* QMP's output is ASCII.  json-c writes a string's other characters as
 * they are (and lets invalid UTF-8 through: a string it read, or one a
 * command made of a file name), and every byte past 0x7f it writes is
 * in a string: each becomes an escape.
 */
char *
qmp_line (struct json_object *o, bool crlf, size_t *len)
{
  size_t n;
  const char *json = json_object_to_json_string_length (
    o, JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE, &n);
  char *line, *p;

  /* An escape is at most 6 bytes a byte ("\uFFFD" for one byte; 12
   * for the four of a character past U+FFFF).
   */
  if (!json || n > (SIZE_MAX - 3) / 6 || !(line = malloc (n * 6 + 3)))
    return NULL;
  p = line;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t k;

    if ((unsigned char) json[i] < 0x80) {
      *p++ = json[i++];
      continue;
    }
    k = qmp_utf8 ((const unsigned char *) json + i, n - i, &cp);
    if (k == 0)
      cp = 0xfffd, k = 1;
    i += k;
    if (cp >= 0x10000)
      p += sprintf (p, "\\u%04X\\u%04X", 0xd800 + ((cp - 0x10000) >> 10),
                    0xdc00 + ((cp - 0x10000) & 0x3ff));
    else
      p += sprintf (p, "\\u%04X", (unsigned) cp);
  }
  if (crlf)
    *p++ = '\r', *p++ = '\n';
  *p = '\0';
  *len = p - line;
  return line;
}

/* json-c reads NaN and Infinity, which JSON has not, and a number
 * too large for a double as infinite; it keeps the text of each
 * fraction it read to write it back, even "1.".  The first are refused
 * (false); the others are written back as json-c writes a double, as
 * QEMU too writes back what it read, not the text.
 */
static bool
qmp_numbers (struct json_object *o)
{
  switch (json_object_get_type (o)) {
  case json_type_double:
    if (!isfinite (json_object_get_double (o)))
      return false;
    json_object_set_serializer (o, NULL, NULL, NULL);
    return true;
  case json_type_array:
    for (size_t i = 0; i < json_object_array_length (o); i++)
      if (!qmp_numbers (json_object_array_get_idx (o, i)))
        return false;
    return true;
  case json_type_object: {
    json_object_object_foreach (o, key, value) {
      (void) key;
      if (!qmp_numbers (value))
        return false;
    }
    return true;
  }
  default:
    return true;
  }
}

/* The reply to a message: the call's error, or ret (taken; NULL: {}),
 * with the message's id if it had one (NULL: JSON null).
 */
static void
qmp_reply (struct qmp_session *s, struct control_call *call, bool has_id,
           struct json_object *id, struct json_object *ret)
{
  struct json_object *r = json_object_new_object (), *e;
  bool ok;

  if (call->failed) {
    e = json_object_new_object ();
    ok = qmp_put (r, "error", e) &&
      qmp_put (e, "class", json_object_new_string (qmp_class_names[call->cls]))
      && call->desc &&
      qmp_put (e, "desc", json_object_new_string (call->desc));
    json_object_put (ret);
  }
  else
    ok = qmp_put (r, "return", ret ? ret : json_object_new_object ());
  if (ok && has_id)
    ok = json_object_object_add (r, "id", json_object_get (id)) == 0;
  if (!ok || !qmp_send (s, r))
    s->send (s->opaque, qmp_no_memory, sizeof qmp_no_memory - 1);
  json_object_put (r);
  free (call->desc);
}

/* A message's members, checked as QEMU's qmp_dispatch_check_obj
 * checks them: *name the command, *args its arguments (NULL: none).
 * No out-of-band capability is offered, so exec-oob is not a member.
 */
static int
qmp_check_message (struct control_call *call, struct json_object *msg,
                   struct json_object **name, struct json_object **args)
{
  json_object_object_foreach (msg, key, value) {
    if (strcmp (key, "execute") == 0) {
      if (!json_object_is_type (value, json_type_string))
        return control_fail (call, CONTROL_GENERIC_ERROR,
                             "QMP input member 'execute' must be a string");
      *name = value;
    }
    else if (strcmp (key, "arguments") == 0) {
      if (!json_object_is_type (value, json_type_object))
        return control_fail (call, CONTROL_GENERIC_ERROR,
                             "QMP input member 'arguments' must be an "
                             "object");
      *args = value;
    }
    else if (strcmp (key, "id") != 0)
      return control_fail (call, CONTROL_GENERIC_ERROR,
                           "QMP input member '%s' is unexpected", key);
  }
  if (!*name)
    return control_fail (call, CONTROL_GENERIC_ERROR,
                         "QMP input lacks member 'execute'");
  return 0;
}

/* Runs the command named by name_obj; *ret its return. */
static void
qmp_run (struct control_call *call, struct json_object *name_obj,
         struct json_object *args, struct json_object **ret)
{
  const char *name = json_object_get_string (name_obj);
  const struct control_command *cmd = NULL;
  struct json_object *none = NULL;

  if (!call->session->negotiated && strcmp (name, "qmp_capabilities") != 0) {
    control_fail (call, CONTROL_COMMAND_NOT_FOUND,
                  "Expecting capabilities negotiation with "
                  "'qmp_capabilities'");
    return;
  }
  /* A name with a NUL in it names no command (not the one it cut). */
  if (strlen (name) == (size_t) json_object_get_string_len (name_obj))
    cmd = qmp_find (name);
  if (!cmd) {
    control_fail (call, CONTROL_COMMAND_NOT_FOUND,
                  "The command %s has not been found", name);
    return;
  }
  if (!args && !(args = none = json_object_new_object ())) {
    control_fail (call, CONTROL_GENERIC_ERROR, "out of memory");
    return;
  }
  if (cmd->fn (call, args, ret) == -1 && !call->failed)
    control_fail (call, CONTROL_GENERIC_ERROR, "Command failed");
  json_object_put (none);
}

/* One whole message (msg: NULL is JSON null), answered. */
static void
qmp_message (struct qmp_session *s, struct json_object *msg)
{
  struct control_call call = { .session = s };
  struct json_object *id = NULL, *name = NULL, *args = NULL, *ret = NULL;
  bool has_id = false;

  if (!qmp_numbers (msg))
    control_fail (&call, CONTROL_GENERIC_ERROR,
                  "JSON parse error, a number that is not finite");
  else if (!json_object_is_type (msg, json_type_object))
    control_fail (&call, CONTROL_GENERIC_ERROR,
                  "QMP input must be a JSON object");
  else {
    has_id = json_object_object_get_ex (msg, "id", &id);
    if (qmp_check_message (&call, msg, &name, &args) == 0)
      qmp_run (&call, name, args, &ret);
  }
  qmp_reply (s, &call, has_id, id, ret);
}

/* A JSON error, as QEMU words it where it has the case. */
static void
qmp_parse_error (struct qmp_session *s, enum json_tokener_error e)
{
  struct control_call call = { .session = s };

  if (e == json_tokener_error_depth)
    control_fail (&call, CONTROL_GENERIC_ERROR,
                  "JSON nesting depth limit exceeded");
  else
    control_fail (&call, CONTROL_GENERIC_ERROR, "JSON parse error, %s",
                  json_tokener_error_desc (e));
  qmp_reply (s, &call, false, NULL, NULL);
}

/* Feeds the tokener the message's next bytes (at most n): how many it
 * took, *done set when the message ended; or -1 after a JSON error
 * (answered), with *resume where the input goes on.
 */
static int
qmp_feed (struct qmp_session *s, const char *buf, size_t n, bool *done,
          size_t *resume)
{
  struct json_object *o = json_tokener_parse_ex (s->tok, buf, (int) n);
  enum json_tokener_error e = json_tokener_get_error (s->tok);
  size_t end = json_tokener_get_parse_end (s->tok);

  *done = false;
  if (e == json_tokener_continue)
    return n;
  if (e == json_tokener_success) {
    json_tokener_reset (s->tok);
    *done = true;
    qmp_message (s, o);
    json_object_put (o);
    return end;
  }
  json_tokener_reset (s->tok);
  qmp_parse_error (s, e);
  if (end >= n)
    end = n - 1;
  /* At a '{' a message may start; past anything else, at the next
   * line or '{'.
   */
  *resume = buf[end] == '{' ? end : end + 1;
  s->state = buf[end] == '{' ? QMP_BETWEEN : QMP_SKIPPING;
  return -1;
}

int
qmp_session_input (struct qmp_session *s, const char *buf, size_t len)
{
  while (len > 0) {
    size_t n, resume = 0;
    bool done;
    int r;

    switch (s->state) {
    case QMP_SKIPPING:
      /* To the next line or '{', whichever comes first. */
      for (n = 0; n < len && buf[n] != '\n' && buf[n] != '{'; n++)
        ;
      if (n == len)
        return 0;
      buf += n, len -= n;
      s->state = QMP_BETWEEN;
      /* fallthrough */
    case QMP_BETWEEN:
      while (len > 0 &&
             (*buf == ' ' || *buf == '\t' || *buf == '\r' || *buf == '\n'))
        buf++, len--;
      if (len == 0)
        return 0;
      s->state = QMP_IN_MESSAGE;
      s->taken = 0;
      /* fallthrough */
    case QMP_IN_MESSAGE:
      n = len < QMP_MESSAGE_MAX - s->taken ? len : QMP_MESSAGE_MAX - s->taken;
      r = qmp_feed (s, buf, n, &done, &resume);
      if (r == -1) {
        buf += resume, len -= resume;
        break;
      }
      buf += r, len -= r;
      if (done)
        s->state = QMP_BETWEEN;
      else if ((s->taken += r) == QMP_MESSAGE_MAX) {
        struct control_call call = { .session = s };

        control_fail (&call, CONTROL_GENERIC_ERROR,
                      "QMP input over %d bytes: the connection is closed",
                      QMP_MESSAGE_MAX);
        qmp_reply (s, &call, false, NULL, NULL);
        return -1;
      }
      break;
    }
  }
  return 0;
}

void
qmp_refuse (void (*send) (void *opaque, const char *line, size_t len),
            void *opaque, const char *desc)
{
  struct qmp_session s = { .send = send, .opaque = opaque };
  struct control_call call = { .session = &s };

  control_fail (&call, CONTROL_GENERIC_ERROR, "%s", desc);
  qmp_reply (&s, &call, false, NULL, NULL);
}

int
qmp_session_init (struct qmp_session *s,
                  void (*send) (void *opaque, const char *line, size_t len),
                  void *opaque)
{
  struct json_object *greeting = json_object_new_object ();
  struct json_object *qmp = json_object_new_object ();
  bool ok;

  *s = (struct qmp_session) { .send = send, .opaque = opaque };
  s->tok = json_tokener_new_ex (QMP_DEPTH_MAX);
  /* Strict: no comments, trailing commas or TRUE.  Single quotes are
   * read still, as QEMU reads them.
   */
  if (s->tok)
    json_tokener_set_flags (s->tok, JSON_TOKENER_STRICT |
                            JSON_TOKENER_ALLOW_TRAILING_CHARS |
                            JSON_TOKENER_VALIDATE_UTF8);
  ok = s->tok && qmp_put (greeting, "QMP", qmp) &&
    qmp_put (qmp, "version", qmp_version ()) &&
    qmp_put (qmp, "capabilities", json_object_new_array ()) &&
    qmp_send (s, greeting);
  json_object_put (greeting);
  if (!ok) {
    qmp_session_fini (s);
    errno = ENOMEM;
    return -1;
  }
  return 0;
}

void
qmp_session_fini (struct qmp_session *s)
{
  if (s->tok)
    json_tokener_free (s->tok);
  s->tok = NULL;
}

/* The built-in commands. */

static int
qmp_cmd_capabilities (struct control_call *call, struct json_object *args,
                      struct json_object **ret)
{
  struct json_object *enable;
  int r = qmp_arg (call, args, "enable", false, &enable);

  if (r == 1 && !json_object_is_type (enable, json_type_array))
    return qmp_arg_type_error (call, "enable", "array");
  /* No capability is offered: any asked for is refused, the first. */
  if (r == 1 && json_object_array_length (enable) > 0) {
    struct json_object *cap = json_object_array_get_idx (enable, 0);

    if (!json_object_is_type (cap, json_type_string))
      return qmp_arg_type_error (call, "enable[0]", "string");
    /* QEMU's one capability. */
    if (strcmp (json_object_get_string (cap), "oob") == 0)
      return control_fail (call, CONTROL_GENERIC_ERROR,
                           "Capability oob not available");
    return control_fail (call, CONTROL_GENERIC_ERROR,
                         "Parameter 'enable[0]' does not accept value '%s'",
                         json_object_get_string (cap));
  }
  if (r == -1 ||
      control_args_only (call, args, (const char *[]) { "enable", NULL }) == -1)
    return -1;
  if (call->session->negotiated)
    return control_fail (call, CONTROL_COMMAND_NOT_FOUND,
                         "Capabilities negotiation is already complete, "
                         "command ignored");
  call->session->negotiated = true;
  return 0;
}

static int
qmp_cmd_query_version (struct control_call *call, struct json_object *args,
                       struct json_object **ret)
{
  if (control_args_only (call, args, NULL) == -1)
    return -1;
  *ret = qmp_version ();
  return *ret ? 0 : control_fail (call, CONTROL_GENERIC_ERROR,
                                  "out of memory");
}

/* Adds {"name": each row's name} to list. */
static bool
qmp_list_names (struct json_object *list, const struct control_command *rows,
                size_t n)
{
  for (size_t i = 0; i < n; i++) {
    struct json_object *c = json_object_new_object ();

    if (!qmp_put (c, "name", json_object_new_string (rows[i].name)) ||
        json_object_array_add (list, c) == -1) {
      json_object_put (c);
      return false;
    }
  }
  return true;
}

static int
qmp_cmd_query_commands (struct control_call *call, struct json_object *args,
                        struct json_object **ret)
{
  bool ok;

  if (control_args_only (call, args, NULL) == -1)
    return -1;
  *ret = json_object_new_array ();
  ok = *ret && qmp_list_names (*ret, qmp_builtins, QMP_BUILTINS);
  for (size_t t = 0; ok && t < qmp_tables_len; t++)
    ok = qmp_list_names (*ret, qmp_tables[t].rows, qmp_tables[t].n);
  return ok ? 0 : control_fail (call, CONTROL_GENERIC_ERROR, "out of memory");
}
