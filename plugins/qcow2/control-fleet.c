/* SPDX-License-Identifier: BSD-3-Clause */
/* The control socket's commands of ours (QEMU has none like them):
 * nbdkit-query-fleet says what dir='s live keys are, nbdkit-fleet-set
 * changes them while the fleet runs.  All checked before any is
 * changed: a refused command changes nothing.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "control.h"
#include "fleet.h"
#include "glue.h"
#include "plugin.h"

/* The keys that take numbers, and their bounds (as the command line's). */
static const struct {
  const char *key;
  int64_t min, max;
} fleet_numbers[] = {
  { "idle-close", 0, 86400 },
  { "max-exports", 0, 1000000 },        /* 0: no bound */
  { "max-images", 1, 10000000 },
  { "min-free", 0, INT64_MAX },
  { "stream-rate", 0, INT64_MAX },      /* bytes a second; 0: no limit */
};

static const char *const fleet_strings[] = { "template", "template-match" };

/* What the live keys are now. */
static struct json_object *
fleet_live_object (void)
{
  struct json_object *o = json_object_new_object ();
  struct fleet_live l;

  fleet_get (&l);
  json_object_object_add (o, "template",
                          l.template ? json_object_new_string (l.template)
                          : NULL);
  json_object_object_add (o, "template-match", l.template_match
                          ? json_object_new_string (l.template_match) : NULL);
  json_object_object_add (o, "idle-close",
                          json_object_new_int64 (l.idle_close));
  json_object_object_add (o, "max-exports",
                          json_object_new_int64 (l.max_exports));
  json_object_object_add (o, "max-images",
                          json_object_new_int64 (l.max_images));
  json_object_object_add (o, "min-free",
                          json_object_new_int64 (l.min_free));
  json_object_object_add (o, "stream-rate", json_object_new_int64
                          (__atomic_load_n (&glue_stream.rate,
                                            __ATOMIC_RELAXED)));
  free (l.template);
  free (l.template_match);
  return o;
}

static int
fleet_query (struct control_call *call, struct json_object *args,
             struct json_object **ret)
{
  if (control_args_only (call, args, NULL) == -1)
    return -1;
  if (!fleet_on ())
    return control_fail (call, CONTROL_GENERIC_ERROR, "the server serves "
                         "one image (file=): it has no fleet");
  *ret = fleet_live_object ();
  return 0;
}

/* The arguments of nbdkit-fleet-set, checked, as the values fleet_set
 * takes (n of them; values[i] for keys[i]).
 */
struct fleet_changes {
  const char *keys[7];
  char values[7][32];
  const char *strings[7];       /* the string keys' values */
  size_t n;
};

static int
fleet_set_args (struct control_call *call, struct json_object *args,
                struct fleet_changes *c)
{
  for (size_t i = 0; i < sizeof fleet_strings / sizeof *fleet_strings; i++) {
    const char *v;
    int r = control_arg_string (call, args, fleet_strings[i], false, &v);

    if (r == -1)
      return -1;
    if (r == 1) {
      c->keys[c->n] = fleet_strings[i];
      c->strings[c->n++] = v;
    }
  }
  for (size_t i = 0; i < sizeof fleet_numbers / sizeof *fleet_numbers; i++) {
    int64_t v;
    int r = control_arg_int (call, args, fleet_numbers[i].key, false, &v);

    if (r == -1)
      return -1;
    if (r == 1 && (v < fleet_numbers[i].min || v > fleet_numbers[i].max))
      return control_fail (call, CONTROL_GENERIC_ERROR, "Parameter '%s' "
                           "expects a value from %" PRId64 " to %" PRId64,
                           fleet_numbers[i].key, fleet_numbers[i].min,
                           fleet_numbers[i].max);
    if (r == 1) {
      snprintf (c->values[c->n], sizeof c->values[c->n], "%" PRId64, v);
      c->keys[c->n] = fleet_numbers[i].key;
      c->strings[c->n] = c->values[c->n];
      c->n++;
    }
  }
  return control_args_only (call, args, (const char *const []) {
      "template", "template-match", "idle-close", "max-exports",
      "max-images", "min-free", "stream-rate", NULL });
}

static int
fleet_set_cmd (struct control_call *call, struct json_object *args,
               struct json_object **ret)
{
  struct fleet_changes c = { .n = 0 };

  if (fleet_set_args (call, args, &c) == -1)
    return -1;
  if (!fleet_on ())
    return control_fail (call, CONTROL_GENERIC_ERROR, "the server serves "
                         "one image (file=): it has no fleet");
  /* template= first: the one key whose value may yet be refused (the
   * file checked as at start), before anything changed.
   */
  for (size_t i = 0; i < c.n; i++)
    if (strcmp (c.keys[i], "template") == 0 &&
        fleet_set ("template", c.strings[i]) == -1)
      return control_fail (call, CONTROL_GENERIC_ERROR, "template=%s is "
                           "refused (the server's log says why): nothing "
                           "was changed", c.strings[i]);
  for (size_t i = 0; i < c.n; i++)
    if (strcmp (c.keys[i], "template") != 0 &&
        fleet_set (c.keys[i], c.strings[i]) == -1)
      return control_fail (call, CONTROL_GENERIC_ERROR, "%s=%s is refused "
                           "(the server's log says why)", c.keys[i],
                           c.strings[i]);
  *ret = fleet_live_object ();
  return 0;
}

static const struct control_command fleet_commands[] = {
  { "nbdkit-query-fleet", fleet_query },
  { "nbdkit-fleet-set", fleet_set_cmd },
};

void
control_fleet_register (void)
{
  control_add_commands (fleet_commands,
                        sizeof fleet_commands / sizeof *fleet_commands);
}
