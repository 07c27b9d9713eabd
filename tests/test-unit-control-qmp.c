/* SPDX-License-Identifier: BSD-3-Clause */
/* control=SOCKET's protocol (plugins/qcow2/control-qmp.c), one session
 * driven with bytes and its lines read back, with commands registered
 * here as the plugin's will be: the greeting, negotiation, ids echoed,
 * every error class, the argument helpers' checks and words (QEMU's,
 * as tests/test-control-qemu.sh compares them with
 * qemu-storage-daemon), the framing (split, joined, broken messages,
 * the ways back after a JSON error), the bounds (size, depth), and the
 * output: one line of ASCII JSON for each reply, whatever went in.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "control.h"
#include "control-qmp.h"
#include "unit.h"

/* The lines a session sent, parsed. */
#define LINES_MAX 4096
static struct json_object *lines[LINES_MAX];
static size_t lines_len;

static void
capture (void *opaque, const char *line, size_t len)
{
  struct json_tokener *tok = json_tokener_new_ex (2 * QMP_DEPTH_MAX);
  struct json_object *o;
  bool ascii = true;

  for (size_t i = 0; i < len; i++)
    ascii &= (unsigned char) line[i] < 0x80;
  CHECKF (ascii, "a line not ASCII: %.*s", (int) len, line);
  CHECKF (len >= 2 && line[len - 2] == '\r' && line[len - 1] == '\n' &&
          !memchr (line, '\n', len - 1), "not one CRLF line: %.*s",
          (int) len, line);
  json_tokener_set_flags (tok, JSON_TOKENER_STRICT);
  o = json_tokener_parse_ex (tok, line, (int) len - 2);
  CHECKF (o && json_object_is_type (o, json_type_object) &&
          json_tokener_get_parse_end (tok) == len - 2,
          "not one JSON object: %.*s", (int) len, line);
  json_tokener_free (tok);
  if (lines_len < LINES_MAX)
    lines[lines_len++] = o;
  else
    json_object_put (o);
}

static void
lines_clear (void)
{
  for (size_t i = 0; i < lines_len; i++)
    json_object_put (lines[i]);
  lines_len = 0;
}

/* The path's string in o ("error.desc"), or "". */
static const char *
get (struct json_object *o, const char *path)
{
  char key[64];
  const char *dot;

  while (o && (dot = strchr (path, '.'))) {
    snprintf (key, sizeof key, "%.*s", (int) (dot - path), path);
    if (!json_object_object_get_ex (o, key, &o))
      return "";
    path = dot + 1;
  }
  if (!o || !json_object_object_get_ex (o, path, &o))
    return "";
  return json_object_get_string (o);
}

static int
input (struct qmp_session *s, const char *text)
{
  return qmp_session_input (s, text, strlen (text));
}

/* Feeds text; exactly one line back, its class and desc (or "return"
 * and the return's JSON) as expected.
 */
#define EXPECT(s, text, cls, desc)                                      \
  do {                                                                  \
    lines_clear ();                                                     \
    input ((s), (text));                                                \
    if (CHECKF (lines_len == 1, "%s: %zu lines", (text), lines_len)) {  \
      const char *c_ = get (lines[0], "error.class");                  \
      const char *d_ = *c_ ? get (lines[0], "error.desc")               \
        : get (lines[0], "return");                                     \
      CHECKF (strcmp (*c_ ? c_ : "return", (cls)) == 0 &&               \
              strcmp (d_, (desc)) == 0, "%s: got %s: %s", (text),       \
              *c_ ? c_ : "return", d_);                                 \
    }                                                                   \
  } while (0)

/* The commands a plugin registers, here to drive the helpers. */
static int
cmd_args (struct control_call *call, struct json_object *args,
          struct json_object **ret)
{
  static const char *const modes[] = { "safe", "hard", NULL };
  const char *device;
  int64_t speed = -1;
  bool force = false;
  unsigned mode = 0;

  if (control_arg_string (call, args, "device", true, &device) == -1 ||
      control_arg_int (call, args, "speed", false, &speed) == -1 ||
      control_arg_bool (call, args, "force", false, &force) == -1 ||
      control_arg_enum (call, args, "mode", false, modes, &mode) == -1 ||
      control_args_only (call, args, (const char *[]) {
          "device", "speed", "force", "mode", NULL }) == -1)
    return -1;
  *ret = json_object_new_string (device);
  if (speed == INT64_MAX || speed == INT64_MIN)
    json_object_set_string (*ret, speed == INT64_MAX ? "max" : "min");
  else if (force || mode)
    json_object_set_string (*ret, force ? "forced" : modes[mode]);
  return 0;
}

static int
cmd_fail (struct control_call *call, struct json_object *args,
          struct json_object **ret)
{
  static const char *const classes[] = {
    "GenericError", "CommandNotFound", "DeviceNotActive", "DeviceNotFound",
    NULL
  };
  unsigned cls;

  if (control_arg_enum (call, args, "class", true, classes, &cls) == -1)
    return -1;
  return control_fail (call, cls, "failed as %s", classes[cls]);
}

static int
cmd_silent_failure (struct control_call *call, struct json_object *args,
                    struct json_object **ret)
{
  *ret = json_object_new_object ();   /* dropped: the call failed */
  return -1;
}

static int
cmd_bytes (struct control_call *call, struct json_object *args,
           struct json_object **ret)
{
  /* é, a byte that is not UTF-8, U+1F4BE, an encoded surrogate. */
  *ret = json_object_new_string ("\xc3\xa9\xff\xf0\x9f\x92\xbe\xed\xa0\x80");
  return 0;
}

static const struct control_command commands[] = {
  { "x-args", cmd_args },
  { "x-fail", cmd_fail },
  { "x-silent-failure", cmd_silent_failure },
};
static const struct control_command more_commands[] = {
  { "x-bytes", cmd_bytes },
};

static void
check_registration (void)
{
  static const struct control_command taken[] = {
    { "x-new", cmd_bytes }, { "query-version", cmd_bytes },
  };
  static const struct control_command twice[] = {
    { "x-twice", cmd_bytes }, { "x-twice", cmd_bytes },
  };

  CHECK (control_add_commands (commands, 3) == 0);
  CHECK (control_add_commands (more_commands, 1) == 0);
  errno = 0;
  CHECK (control_add_commands (taken, 2) == -1 && errno == EEXIST);
  errno = 0;
  CHECK (control_add_commands (twice, 2) == -1 && errno == EEXIST);
  errno = 0;
  CHECK (control_add_commands (commands, 1) == -1 && errno == EEXIST);
}

static void
check_greeting_and_negotiation (void)
{
  struct qmp_session s;
  struct json_object *v;
  char package[64];

  lines_clear ();
  CHECK (qmp_session_init (&s, capture, NULL) == 0);
  if (CHECK (lines_len == 1)) {
    snprintf (package, sizeof package, "%s %s", PACKAGE_NAME,
              PACKAGE_VERSION);
    CHECK (strcmp (get (lines[0], "QMP.version.package"), package) == 0);
    CHECK (json_object_object_get_ex (lines[0], "QMP", &v) &&
           json_object_object_get_ex (v, "capabilities", &v) &&
           json_object_is_type (v, json_type_array) &&
           json_object_array_length (v) == 0);
    CHECK (json_object_object_get_ex (lines[0], "QMP", &v) &&
           json_object_object_get_ex (v, "version", &v) &&
           json_object_object_get_ex (v, "qemu", &v) &&
           json_object_object_length (v) == 3 &&
           json_object_is_type (json_object_object_get (v, "major"),
                                json_type_int) &&
           json_object_is_type (json_object_object_get (v, "minor"),
                                json_type_int) &&
           json_object_is_type (json_object_object_get (v, "micro"),
                                json_type_int));
  }
  /* Before negotiation, any command but qmp_capabilities. */
  EXPECT (&s, "{\"execute\": \"query-version\"}", "CommandNotFound",
          "Expecting capabilities negotiation with 'qmp_capabilities'");
  CHECK (!json_object_object_get_ex (lines[0], "id", NULL));
  EXPECT (&s, "{\"execute\": \"x-nothing\", \"id\": 1}", "CommandNotFound",
          "Expecting capabilities negotiation with 'qmp_capabilities'");
  CHECK (strcmp (get (lines[0], "id"), "1") == 0);
  EXPECT (&s, "{\"execute\": \"qmp_capabilities\", \"arguments\": "
          "{\"enable\": [\"oob\"]}}", "GenericError",
          "Capability oob not available");
  EXPECT (&s, "{\"execute\": \"qmp_capabilities\", \"arguments\": "
          "{\"enable\": [\"x\"]}}", "GenericError",
          "Parameter 'enable[0]' does not accept value 'x'");
  EXPECT (&s, "{\"execute\": \"qmp_capabilities\", \"arguments\": "
          "{\"enable\": [1]}}", "GenericError",
          "Invalid parameter type for 'enable[0]', expected: string");
  EXPECT (&s, "{\"execute\": \"qmp_capabilities\", \"arguments\": "
          "{\"enable\": \"oob\"}}", "GenericError",
          "Invalid parameter type for 'enable', expected: array");
  EXPECT (&s, "{\"execute\": \"qmp_capabilities\", \"arguments\": "
          "{\"x\": 1}}", "GenericError", "Parameter 'x' is unexpected");
  CHECK (!s.negotiated);
  EXPECT (&s, "{\"execute\": \"qmp_capabilities\", \"arguments\": "
          "{\"enable\": []}}", "return", "{ }");
  CHECK (s.negotiated);
  EXPECT (&s, "{\"execute\": \"qmp_capabilities\"}", "CommandNotFound",
          "Capabilities negotiation is already complete, command ignored");
  EXPECT (&s, "{\"execute\": \"x-nothing\"}", "CommandNotFound",
          "The command x-nothing has not been found");
  EXPECT (&s, "{\"execute\": \"query-version\\u0000x\"}", "CommandNotFound",
          "The command query-version has not been found");
  EXPECT (&s, "{\"execute\": \"query-commands\"}", "return",
          "[ { \"name\": \"qmp_capabilities\" }, "
          "{ \"name\": \"query-version\" }, "
          "{ \"name\": \"query-commands\" }, { \"name\": \"x-args\" }, "
          "{ \"name\": \"x-fail\" }, { \"name\": \"x-silent-failure\" }, "
          "{ \"name\": \"x-bytes\" } ]");
  EXPECT (&s, "{\"execute\": \"query-version\", \"arguments\": {\"a\": 1}}",
          "GenericError", "Parameter 'a' is unexpected");
  qmp_session_fini (&s);
}

/* A session past negotiation, its lines cleared. */
static void
session (struct qmp_session *s)
{
  qmp_session_init (s, capture, NULL);
  input (s, "{\"execute\": \"qmp_capabilities\"}");
  lines_clear ();
}

static void
check_ids (void)
{
  static const char *const ids[] = {
    "7", "-3", "\"s\"", "\"\"", "null", "true", "1.5", "-0.0", "1e-300",
    "{\"a\": [1, {\"b\": null}], \"c\": \"\\u00e9\"}", "[]", "{}",
    "18446744073709551615", "-9223372036854775808", "\"\\u0000\\n\\\"\"",
    "\"\\ud83d\\udcbe\"",
  };
  struct qmp_session s;
  char msg[256];

  session (&s);
  for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
    struct json_object *want = json_tokener_parse (ids[i]), *got;

    snprintf (msg, sizeof msg, "{\"execute\": \"query-version\", "
              "\"id\": %s}", ids[i]);
    lines_clear ();
    input (&s, msg);
    CHECKF (lines_len == 1 &&
            json_object_object_get_ex (lines[0], "return", NULL) &&
            json_object_object_get_ex (lines[0], "id", &got) &&
            json_object_equal (got, want), "id %s: not echoed", ids[i]);
    json_object_put (want);
  }
  /* "1." is not JSON: written back as JSON (the capture checks). */
  lines_clear ();
  input (&s, "{\"execute\": \"query-version\", \"id\": 1.}");
  CHECK (lines_len == 1 && strcmp (get (lines[0], "id"), "1.0") == 0);
  /* Numbers JSON has not, and one past a double. */
  EXPECT (&s, "{\"execute\": \"query-version\", \"id\": NaN}",
          "GenericError", "JSON parse error, a number that is not finite");
  EXPECT (&s, "{\"execute\": \"query-version\", \"id\": [-Infinity]}",
          "GenericError", "JSON parse error, a number that is not finite");
  EXPECT (&s, "{\"execute\": \"query-version\", \"id\": 1e400}",
          "GenericError", "JSON parse error, a number that is not finite");
  qmp_session_fini (&s);
}

static void
check_errors (void)
{
  struct qmp_session s;

  session (&s);
  EXPECT (&s, "{\"execute\": \"x-fail\", \"arguments\": "
          "{\"class\": \"GenericError\"}}", "GenericError",
          "failed as GenericError");
  EXPECT (&s, "{\"execute\": \"x-fail\", \"arguments\": "
          "{\"class\": \"CommandNotFound\"}}", "CommandNotFound",
          "failed as CommandNotFound");
  EXPECT (&s, "{\"execute\": \"x-fail\", \"arguments\": "
          "{\"class\": \"DeviceNotActive\"}}", "DeviceNotActive",
          "failed as DeviceNotActive");
  EXPECT (&s, "{\"execute\": \"x-fail\", \"arguments\": "
          "{\"class\": \"DeviceNotFound\"}}", "DeviceNotFound",
          "failed as DeviceNotFound");
  EXPECT (&s, "{\"execute\": \"x-silent-failure\"}", "GenericError",
          "Command failed");
  /* The message's own checks, QEMU's words. */
  EXPECT (&s, "[1, 2]", "GenericError", "QMP input must be a JSON object");
  EXPECT (&s, "null ", "GenericError", "QMP input must be a JSON object");
  EXPECT (&s, "\"x\"", "GenericError", "QMP input must be a JSON object");
  EXPECT (&s, "{}", "GenericError", "QMP input lacks member 'execute'");
  EXPECT (&s, "{\"id\": 1, \"arguments\": {}}", "GenericError",
          "QMP input lacks member 'execute'");
  EXPECT (&s, "{\"execute\": 1}", "GenericError",
          "QMP input member 'execute' must be a string");
  EXPECT (&s, "{\"execute\": \"query-version\", \"arguments\": []}",
          "GenericError", "QMP input member 'arguments' must be an object");
  EXPECT (&s, "{\"execute\": \"query-version\", \"control\": {}}",
          "GenericError", "QMP input member 'control' is unexpected");
  EXPECT (&s, "{\"exec-oob\": \"query-version\", \"id\": 2}", "GenericError",
          "QMP input member 'exec-oob' is unexpected");
  CHECK (strcmp (get (lines[0], "id"), "2") == 0);
  qmp_session_fini (&s);
}

static void
check_arguments (void)
{
  struct qmp_session s;

#define ARGS(a) "{\"execute\": \"x-args\", \"arguments\": " a "}"
  session (&s);
  EXPECT (&s, ARGS ("{\"device\": \"vm1\"}"), "return", "vm1");
  EXPECT (&s, "{\"execute\": \"x-args\"}", "GenericError",
          "Parameter 'device' is missing");
  EXPECT (&s, ARGS ("{\"x\": 1}"), "GenericError",
          "Parameter 'device' is missing");
  EXPECT (&s, ARGS ("{\"device\": null}"), "GenericError",
          "Invalid parameter type for 'device', expected: string");
  EXPECT (&s, ARGS ("{\"device\": 1}"), "GenericError",
          "Invalid parameter type for 'device', expected: string");
  EXPECT (&s, ARGS ("{\"device\": \"vm1\\u0000x\"}"), "GenericError",
          "Parameter 'device' must not contain a NUL character");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"speed\": 9223372036854775807}"),
          "return", "max");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"speed\": -9223372036854775808}"),
          "return", "min");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"speed\": 9223372036854775808}"),
          "GenericError",
          "Invalid parameter type for 'speed', expected: integer");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"speed\": 2.0}"), "GenericError",
          "Invalid parameter type for 'speed', expected: integer");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"speed\": 1e3}"), "GenericError",
          "Invalid parameter type for 'speed', expected: integer");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"speed\": \"1\"}"), "GenericError",
          "Invalid parameter type for 'speed', expected: integer");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"force\": true}"), "return",
          "forced");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"force\": 1}"), "GenericError",
          "Invalid parameter type for 'force', expected: boolean");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"mode\": \"hard\"}"), "return",
          "hard");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"mode\": \"soft\"}"),
          "GenericError", "Parameter 'mode' does not accept value 'soft'");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"mode\": 3}"), "GenericError",
          "Invalid parameter type for 'mode', expected: string");
  EXPECT (&s, ARGS ("{\"device\": \"d\", \"zz\": 1}"), "GenericError",
          "Parameter 'zz' is unexpected");
  EXPECT (&s, ARGS ("{\"device\": 1, \"zz\": 1}"), "GenericError",
          "Invalid parameter type for 'device', expected: string");
#undef ARGS
  qmp_session_fini (&s);
}

static void
check_framing (void)
{
  static const char msg[] = "{\"execute\": \"query-version\", \"id\": 5}";
  struct qmp_session s;

  session (&s);
  /* A byte at a time, then several in one. */
  for (size_t i = 0; i < sizeof msg - 1; i++)
    qmp_session_input (&s, msg + i, 1);
  CHECK (lines_len == 1 && strcmp (get (lines[0], "id"), "5") == 0);
  lines_clear ();
  input (&s, " \r\n\t{\"execute\": \"query-version\", \"id\": 1}"
         "{\"execute\": \"query-version\", \"id\": 2}\r\n"
         "  {\"execute\": \"query-version\", \"id\": 3}\n");
  CHECK (lines_len == 3 && strcmp (get (lines[0], "id"), "1") == 0 &&
         strcmp (get (lines[1], "id"), "2") == 0 &&
         strcmp (get (lines[2], "id"), "3") == 0);
  /* A JSON error, then the rest of the line skipped (one error), up
   * to a '{': the next message is answered.
   */
  EXPECT (&s, "{\"execute\": }\n", "GenericError",
          "JSON parse error, unexpected character");
  EXPECT (&s, "{\"execute\": \"query-version\" /* c */}\n", "GenericError",
          "JSON parse error, object value separator ',' expected");
  EXPECT (&s, "{\"a\": TRUE, \"b\": [1,]}\n", "GenericError",
          "JSON parse error, boolean expected");
  lines_clear ();
  input (&s, "xxxx yyyy\n[1]\n");
  CHECK (lines_len == 2 &&
         strcmp (get (lines[1], "error.desc"),
                 "QMP input must be a JSON object") == 0);
  lines_clear ();
  input (&s, "{\"execute\": \"query-version\", \"id\": 1");
  CHECK (lines_len == 0);
  /* QEMU's way back: an ASCII control character. */
  input (&s, "\x01{\"execute\": \"query-version\", \"id\": 2}");
  CHECK (lines_len == 2 && *get (lines[0], "error.class") &&
         strcmp (get (lines[1], "id"), "2") == 0);
  lines_clear ();
  input (&s, "{\"execute\": \"x\"{\"execute\": \"query-version\", \"id\": 3}");
  CHECK (lines_len == 2 && strcmp (get (lines[1], "id"), "3") == 0);
  /* Bytes that are not UTF-8, in a string and out of one. */
  EXPECT (&s, "{\"execute\": \"query-version\", \"id\": \"\xc3\"}\n",
          "GenericError", "JSON parse error, invalid utf-8 string");
  EXPECT (&s, "\xff\xfe\n", "GenericError",
          "JSON parse error, invalid utf-8 string");
  EXPECT (&s, "{\"execute\": \"x-bytes\"}", "return",
          "\xc3\xa9\xef\xbf\xbd\xf0\x9f\x92\xbe\xef\xbf\xbd\xef\xbf\xbd"
          "\xef\xbf\xbd");
  qmp_session_fini (&s);
}

static void
check_bounds (void)
{
  struct qmp_session s;
  size_t big = QMP_MESSAGE_MAX + 100;
  char *buf = malloc (big + 1);
  int depth;

  session (&s);
  /* Just under the bound: answered. */
  depth = snprintf (buf, big, "{\"execute\": \"query-version\", \"id\": \"");
  memset (buf + depth, 'a', QMP_MESSAGE_MAX - depth - 2);
  memcpy (buf + QMP_MESSAGE_MAX - 2, "\"}", 3);
  CHECK (input (&s, buf) == 0 && lines_len == 1 &&
         strlen (get (lines[0], "id")) == (size_t) (QMP_MESSAGE_MAX - depth - 2));
  /* Deep, but not too deep. */
  lines_clear ();
  depth = snprintf (buf, big, "{\"execute\": \"query-version\", \"id\": ");
  for (int i = 0; i < QMP_DEPTH_MAX - 1; i++)
    buf[depth + i] = '[', buf[depth + QMP_DEPTH_MAX - 1 + i] = ']';
  strcpy (buf + depth + 2 * (QMP_DEPTH_MAX - 1), "}");
  CHECK (input (&s, buf) == 0 && lines_len == 1 &&
         json_object_object_get_ex (lines[0], "return", NULL));
  memset (buf, '[', 2000);
  memset (buf + 2000, ']', 2000);
  buf[4000] = '\0';
  EXPECT (&s, buf, "GenericError", "JSON nesting depth limit exceeded");
  /* Over the bound: an error, and the session ends, even split. */
  lines_clear ();
  memset (buf, ' ', big);
  buf[0] = '{';
  CHECK (qmp_session_input (&s, buf, big / 2) == 0 && lines_len == 0);
  CHECK (qmp_session_input (&s, buf + big / 2, big - big / 2) == -1 &&
         lines_len == 1 &&
         strcmp (get (lines[0], "error.desc"),
                 "QMP input over 1048576 bytes: the connection is closed")
         == 0);
  qmp_session_fini (&s);
  free (buf);
}

int
main (void)
{
  check_registration ();
  check_greeting_and_negotiation ();
  check_ids ();
  check_errors ();
  check_arguments ();
  check_framing ();
  check_bounds ();
  lines_clear ();
  return unit_finish ();
}
