/* SPDX-License-Identifier: BSD-3-Clause */
/* What the control socket sees of dir='s table of open exports, and
 * does to it: each export shown, one held open for a job, one deleted
 * (block-export-del).  Called on the control socket's thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
    struct plugin_view v;

    /* Only an open one: an opener or closer changes the others. */
    if (e->state != EXPORT_OPEN)
      continue;
    v = (struct plugin_view) {
      .name = e->name, .path = e->path, .served = &e->served,
      .clients = e->users - e->served.job_held,
      .readonly = !qcow2_can_write (e->served.image),
    };
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

/* stream-rate=: the rate of the jobs stream=true starts from now on,
 * and of those it started that run (block-stream's keep their own).
 */
static int
fleet_set_stream_rate (const char *value)
  TSA_EXCLUDES (&fleet_lock)
{
  uint64_t rate;

  if (glue_parse_size ("stream-rate", value, true, &rate) == -1)
    return -1;
  __atomic_store_n (&glue_stream.rate, rate, __ATOMIC_RELAXED);
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  for (struct fleet_export *e = fleet_exports; e; e = e->next)
    if (e->state == EXPORT_OPEN && !e->served.job_held)
      glue_stream_job_control (e->served.job, GLUE_STREAM_SET_RATE, rate);
  return 0;
}

/* A string key set (value "": none), what it was in *was. */
static void
fleet_swap (char **key, char *value, char **was)
  TSA_REQUIRES (&fleet_lock)
{
  *was = *key;
  *key = value;
}

int
fleet_set (const char *key, const char *value)
  TSA_EXCLUDES (&fleet_lock)
{
  struct fleet_live l = { 0 };
  char *path = NULL, *was = NULL, *was_path = NULL;

  if (strcmp (key, "stream-rate") == 0) {
    if (fleet_set_stream_rate (value) == -1)
      return -1;
  }
  else if (strcmp (key, "template") == 0 && *value &&
           fleet_check_template (value, &path) == -1)
    return -1;
  else if (strcmp (key, "template") == 0 ||
           strcmp (key, "template-match") == 0) {
    char *v = *value ? strdup (value) : NULL;

    if (*value && !v)
      return -1;
    lock_acquire (&fleet_lock);
    if (strcmp (key, "template") == 0) {
      fleet_swap (&fleet_live.template, v, &was);
      fleet_swap (&fleet_live.template_path, path, &was_path);
    }
    else
      fleet_swap (&fleet_live.template_match, v, &was);
    lock_release (&fleet_lock);
  }
  else {
    if (fleet_parse_live (&l, key, value) == -1)
      return -1;
    lock_acquire (&fleet_lock);
    if (strcmp (key, "idle-close") == 0)
      fleet_live.idle_close = l.idle_close;
    else if (strcmp (key, "max-exports") == 0)
      fleet_live.max_exports = l.max_exports;
    else if (strcmp (key, "max-images") == 0)
      fleet_live.max_images = l.max_images;
    else
      fleet_live.min_free = l.min_free;
    lock_release (&fleet_lock);
  }
  glue_noticef (fleet.dir, "control: %s=%s from now on%s%s%s", key,
                *value ? value : "(none)", was ? " (it was " : "",
                was ? was : "", was ? ")" : "");
  free (was);
  free (was_path);
  return 0;
}

void
fleet_get (struct fleet_live *l)
  TSA_EXCLUDES (&fleet_lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  *l = fleet_live;
  l->template = l->template ? strdup (l->template) : NULL;
  l->template_match = l->template_match ? strdup (l->template_match) : NULL;
  l->template_path = NULL;
}

int
fleet_freeze_spot (struct plugin_export *served, const char *frozen,
                   struct freeze_spot *f, const char **why)
  TSA_EXCLUDES (&fleet_lock)
{
  struct fleet_export *e = fleet_entry (served);
  struct stat st;

  if (frozen && (*why = fleet_name_refusal (frozen)))
    return -1;
  if (frozen && (fstatat (fleet.dirfd, frozen, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
                 errno != ENOENT)) {
    *why = "a file of that name is in dir= already";
    return -1;
  }
  if (frozen && !fleet_images_room ()) {
    *why = "it would pass max-images=";
    return -1;
  }
  /* The export's own file, not a link to it: a link would be frozen. */
  if (fstatat (fleet.dirfd, e->name, &st, AT_SYMLINK_NOFOLLOW) == -1 ||
      !S_ISREG (st.st_mode) || st.st_dev != e->dev || st.st_ino != e->ino) {
    *why = "its name is a link (or another file now): freeze the file by "
      "its own name";
    return -1;
  }
  *f = (struct freeze_spot) {
    .folder = fleet.dir, .dirfd = fleet.dirfd, .name = e->name,
    .frozen = frozen, .files = &fleet.files, .env = &e->env,
    .served = served, .reopen = fleet_reopen,
  };
  return 0;
}

bool
fleet_base_is_template (const struct stat *st)
{
  return fleet_is_template (st);
}
