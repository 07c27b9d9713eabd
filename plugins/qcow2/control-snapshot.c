/* SPDX-License-Identifier: BSD-3-Clause */
/* The control socket's live snapshot: export-snapshot {id, file}
 * freezes an export's data under the name file, the export going on
 * under its own name as an overlay of it (freeze.c).  Why not QEMU's
 * blockdev-snapshot-sync: there the new file receives the writes and
 * the management layer renames what the VM uses; an export's name here
 * is its file's, and a command line or a fleet cannot be rewritten, so
 * the name served stays the live disk and the frozen data moves.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include <json-c/json.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "control.h"
#include "glue.h"
#include "plugin.h"

static int
snapshot_export (struct control_call *call, struct json_object *args,
                 struct json_object **ret)
{
  const char *id, *file, *refused;
  struct plugin_export *served;
  struct freeze_spot f;
  uint64_t paused_ns = 0;
  char *why = NULL;
  int r;

  if (control_arg_string (call, args, "id", true, &id) == -1 ||
      control_arg_string (call, args, "file", true, &file) == -1 ||
      control_args_only (call, args,
                         (const char *const []) { "id", "file", NULL }) == -1)
    return -1;
  served = exports_hold (id);
  if (!served)
    return control_fail (call, CONTROL_GENERIC_ERROR, "Export '%s' is not "
                         "found", id);
  if (exports_freeze_spot (served, file, &f, &refused) == -1) {
    exports_unhold (served);
    return control_fail (call, CONTROL_GENERIC_ERROR, "file '%s' is "
                         "refused: %s", file, refused);
  }
  r = freeze_export (&f, &paused_ns, &why);
  exports_unhold (served);
  if (r == -1) {
    r = control_fail (call, CONTROL_GENERIC_ERROR, "%s",
                      why ? why : "the snapshot failed: see the server's "
                      "log");
    free (why);
    return r;
  }
  glue_noticef (f.folder, "export-snapshot: %s frozen as %s, clients held "
                "off %.3f ms", id, file, paused_ns / 1e6);
  *ret = json_object_new_object ();
  json_object_object_add (*ret, "paused-ns",
                          json_object_new_int64 ((int64_t) paused_ns));
  return 0;
}

static const struct control_command snapshot_commands[] = {
  { "export-snapshot", snapshot_export },
};

void
control_snapshot_register (void)
{
  control_add_commands (snapshot_commands,
                        sizeof snapshot_commands / sizeof *snapshot_commands);
}
