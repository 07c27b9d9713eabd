/* SPDX-License-Identifier: BSD-3-Clause */
/* What QEMU's BlockJobInfo and its job events say of a job, streams
 * (control-jobs.c) and commits (control-commit.c) alike.
 */
#include <stdbool.h>
#include <stdint.h>

#include <json-c/json.h>

#include "plugin.h"

struct json_object *
jobs_info_object (const struct job_info *j, bool events)
{
  struct json_object *o = json_object_new_object ();

  json_object_object_add (o, "type", json_object_new_string (j->type));
  json_object_object_add (o, "device", json_object_new_string (j->id));
  json_object_object_add (o, "len", json_object_new_int64 (j->len));
  json_object_object_add (o, "offset", json_object_new_int64 (j->offset));
  json_object_object_add (o, "speed", json_object_new_int64 (j->speed));
  if (events)
    return o;
  json_object_object_add (o, "busy", json_object_new_boolean (j->busy));
  json_object_object_add (o, "paused", json_object_new_boolean (j->paused));
  json_object_object_add (o, "ready", json_object_new_boolean (j->ready));
  json_object_object_add (o, "status", json_object_new_string (j->status));
  json_object_object_add (o, "io-status", json_object_new_string ("ok"));
  json_object_object_add (o, "auto-finalize", json_object_new_boolean (true));
  json_object_object_add (o, "auto-dismiss", json_object_new_boolean (true));
  return o;
}
