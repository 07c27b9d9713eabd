/* SPDX-License-Identifier: BSD-3-Clause */
/* The exports the control socket's commands work on, whatever the
 * mode: dir='s table (fleet-control.c) or file='s one image (image.c).
 */
#include <stdbool.h>

#include "plugin.h"

int
exports_each (plugin_view_fn fn, void *opaque)
{
  return fleet_on () ? fleet_each (fn, opaque) : image_each (fn, opaque);
}

struct plugin_export *
exports_hold (const char *name)
{
  return fleet_on () ? fleet_hold (name) : image_hold (name);
}

void
exports_unhold (struct plugin_export *served)
{
  if (fleet_on ())
    fleet_unhold (served);
}

int
exports_delete (const char *name, bool hard, unsigned *clients)
{
  return fleet_on () ? fleet_delete (name, hard, clients)
    : image_delete (name, hard, clients);
}

int
exports_freeze_spot (struct plugin_export *served, const char *frozen,
                     struct freeze_spot *f, const char **why)
{
  return fleet_on () ? fleet_freeze_spot (served, frozen, f, why)
    : image_freeze_spot (frozen, f, why);
}
