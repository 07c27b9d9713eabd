/* SPDX-License-Identifier: BSD-3-Clause */
/* What the control socket sees of dir='s table of open exports, and
 * does to it: each export shown, one held open for a job, one deleted
 * (block-export-del).  Called on the control socket's thread.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "fleet.h"
#include "glue.h"
#include "plugin.h"

int
fleet_each (plugin_view_fn fn, void *opaque)
  TSA_EXCLUDES (&fleet_lock)
{
  int r = 0;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  for (struct fleet_export *e = fleet_exports; e && r == 0; e = e->next) {
    struct plugin_view v = {
      .name = e->name, .path = e->path, .served = &e->served,
      .clients = e->users - e->served.job_held,
      .readonly = e->served.image && !qcow2_can_write (e->served.image),
    };

    if (e->state == EXPORT_OPEN)
      r = fn (&v, opaque);
  }
  return r;
}

struct plugin_export *
fleet_hold (const char *name)
  TSA_EXCLUDES (&fleet_lock)
{
  char shown[FLEET_SHOWN_MAX];
  struct fleet_export *e;

  if (fleet_name_refusal (name)) {
    errno = ENOENT;
    return NULL;
  }
  e = fleet_open (name, fleet_shown (name, shown));
  return e ? &e->served : NULL;
}

void
fleet_unhold (struct plugin_export *served)
  TSA_EXCLUDES (&fleet_lock)
{
  fleet_release (served);
}

int
fleet_delete (const char *name, bool hard, unsigned *clients)
  TSA_EXCLUDES (&fleet_lock)
{
  struct fleet_export *e;

  lock_acquire (&fleet_lock);
  e = fleet_find (name);
  *clients = e ? e->users - e->served.job_held : 0;
  if (!e || e->state != EXPORT_OPEN || (*clients > 0 && !hard)) {
    int err = e && e->state == EXPORT_OPEN ? EBUSY : ENOENT;

    lock_release (&fleet_lock);
    errno = err;
    return -1;
  }
  /* A job's hold goes with its job, stopped as the image closes. */
  e->users -= e->served.job_held;
  e->served.job_held = false;
  e->state = EXPORT_CLOSING;
  lock_release (&fleet_lock);
  /* No request in flight, none to come. */
  gate_shut (&e->served, GATE_CLOSED);
  lock_acquire (&fleet_lock);
  fleet_close_image (e);
  fleet_drop (e);
  lock_release (&fleet_lock);
  return 0;
}
