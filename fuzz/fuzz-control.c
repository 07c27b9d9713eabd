/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: control=SOCKET's input, a client's bytes, through
 * the protocol (plugins/qcow2/control-qmp.c): framing, JSON, the
 * message checks, negotiation, the built-in commands, and a command
 * registered here that takes arguments through every helper.  The
 * input is cut into reads of sizes its first byte picks, as a socket
 * may cut it.
 *
 * Checked, besides no crash, leak, hang or sanitizer error: every line
 * sent is one JSON object in ASCII, CRLF at its end; an error reply has
 * a class and a desc, both strings.
 */
#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "control.h"
#include "control-qmp.h"

static struct json_tokener *tok;   /* the checker's own, kept */

static void
fuzz_check_line (void *opaque, const char *line, size_t len)
{
  struct json_object *o, *e, *v;

  assert (len >= 2 && line[len - 2] == '\r' && line[len - 1] == '\n');
  assert (!memchr (line, '\n', len - 1));
  for (size_t i = 0; i < len; i++)
    assert ((unsigned char) line[i] < 0x80);
  json_tokener_reset (tok);
  o = json_tokener_parse_ex (tok, line, (int) len - 2);
  assert (o && json_object_is_type (o, json_type_object));
  assert (json_tokener_get_parse_end (tok) == len - 2);
  if (json_object_object_get_ex (o, "error", &e)) {
    assert (json_object_object_get_ex (e, "class", &v) &&
            json_object_is_type (v, json_type_string));
    assert (json_object_object_get_ex (e, "desc", &v) &&
            json_object_is_type (v, json_type_string));
  }
  json_object_put (o);
}

static int
fuzz_cmd (struct control_call *call, struct json_object *args,
          struct json_object **ret)
{
  static const char *const modes[] = { "safe", "hard", NULL };
  const char *device = "none";
  int64_t speed = 0;
  bool force = false;
  unsigned mode = 0;

  if (control_arg_string (call, args, "device", false, &device) == -1 ||
      control_arg_int (call, args, "speed", false, &speed) == -1 ||
      control_arg_bool (call, args, "force", false, &force) == -1 ||
      control_arg_enum (call, args, "mode", false, modes, &mode) == -1 ||
      control_args_only (call, args, (const char *[]) {
          "device", "speed", "force", "mode", NULL }) == -1)
    return -1;
  if (force)
    return control_fail (call, (enum control_class) (speed & 3),
                         "device %s: %s", device, modes[mode]);
  *ret = json_object_new_string (device);
  return 0;
}

static const struct control_command fuzz_commands[] = {
  { "x-fuzz", fuzz_cmd },
};

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  static bool registered;
  struct qmp_session s;
  size_t cut;

  if (!registered) {
    assert (control_add_commands (fuzz_commands, 1) == 0);
    tok = json_tokener_new_ex (2 * QMP_DEPTH_MAX);
    assert (tok);
    json_tokener_set_flags (tok, JSON_TOKENER_STRICT);
    registered = true;
  }
  if (size == 0)
    return 0;
  cut = data[0] ? data[0] : size;
  assert (qmp_session_init (&s, fuzz_check_line, NULL) == 0);
  for (size_t off = 1; off < size; off += cut) {
    size_t n = size - off < cut ? size - off : cut;

    if (qmp_session_input (&s, (const char *) data + off, n) == -1)
      break;
  }
  qmp_session_fini (&s);
  return 0;
}
