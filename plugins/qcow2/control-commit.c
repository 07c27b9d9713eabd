/* SPDX-License-Identifier: BSD-3-Clause */
/* The control socket's live commit: block-commit {device, base?,
 * speed?, job-id?} copies an export's image (the top) into the file
 * directly below it while clients write (the engine's qcow2_commit),
 * BLOCK_JOB_READY once in sync, and block-job-complete switches the
 * export to the merged image under its own name: with requests held
 * off, what is left copied and the base made durable, then the base's
 * file renamed to the export's (the old top gone with it), and opened
 * there.  A crash before the rename leaves the chain as it was (it
 * reads the same); after it, the merged image.  block-job-cancel
 * before that leaves the chain as it was.
 *
 * The default base is the file directly below the top (QEMU's is the
 * deepest): in a fleet the deepest is a golden image every VM stands
 * on; the one below is what export-snapshot froze.  Only that one can
 * be the base here.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "control.h"
#include "errstr.h"
#include "glue.h"
#include "plugin.h"
#include "qcow2.h"

/* QEMU's status of a commit job. */
static const char *
commit_status (const struct qcow2_commit_progress *p, bool *running)
{
  *running = p->state == QCOW2_COMMIT_CREATED ||
    p->state == QCOW2_COMMIT_RUNNING || p->state == QCOW2_COMMIT_WAITING ||
    p->state == QCOW2_COMMIT_READY;
  if (!*running)
    return "concluded";
  if (p->paused)
    return "paused";
  return p->state == QCOW2_COMMIT_READY ? "ready" : "running";
}

static struct json_object *
commit_info (const char *id, const struct qcow2_commit_progress *p,
             bool events)
{
  bool running;
  const char *status = commit_status (p, &running);
  const struct job_info j = {
    .type = "commit", .id = id, .len = p->len, .offset = p->offset,
    .speed = p->rate, .paused = p->paused, .ready = p->ready,
    .status = status,
    .busy = running && !p->paused && p->state != QCOW2_COMMIT_WAITING,
  };

  return jobs_info_object (&j, events);
}

/* Why the job c's base (the file directly below the image) cannot be
 * committed into as asked (asked: the base given, or NULL), or NULL.
 */
static const char *
commit_base_refusal (struct qcow2_commit *c, const char *asked,
                     const struct freeze_spot *f)
{
  struct qcow2_commit_progress p;
  const char *slash;

  qcow2_commit_progress (c, &p);
  slash = p.base ? strrchr (p.base, '/') : NULL;
  if (asked && (!p.base || (strcmp (asked, p.base) != 0 &&
                            strcmp (asked, slash ? slash + 1 : p.base))))
    return "only the backing file directly below the image can be the "
      "base here";
  if (!slash || (size_t) (slash - p.base) != strlen (f->folder) ||
      strncmp (p.base, f->folder, slash - p.base) != 0)
    return "the base must be in the export's folder (it takes the "
      "export's name when the commit completes)";
  return NULL;
}

/* Why the job's base cannot take the export's name when the commit
 * completes, though the engine would commit into it: it is the
 * template, or other images of the fleet stand on it (their backing
 * name would then name nothing, or the wrong data).
 */
static const char *
commit_shared_base (struct plugin_export *served, const struct freeze_spot *f)
{
  static __thread char why[320];
  struct qcow2_commit_progress p;
  struct stat st;
  char who[256];

  qcow2_commit_progress (served->commit, &p);
  if (!fleet_on ())
    return NULL;
  if (stat (p.base, &st) == -1)
    return "the base cannot be found";
  if (fleet_base_is_template (&st))
    return "the base is the template= of new exports";
  if (fleet_backed_by (&st, f->name, who, sizeof who)) {
    snprintf (why, sizeof why, "the base is the backing file of %s too: it "
              "cannot become %s's", who, f->name);
    return why;
  }
  return NULL;
}

/* block-commit's checks of the export held: its place in *f, and the
 * job made (not started) into served->commit.  0, or -1 after
 * control_fail.
 */
static int
commit_make (struct control_call *call, struct plugin_export *served,
             const char *device, const char *base, int64_t speed,
             struct freeze_spot *f)
{
  struct qcow2_commit_options opts = {
    .rate = speed, .busy = &served->inflight, .changed = control_ask_tick,
  };
  struct qcow2_stream_progress sp;
  const char *why;
  bool cancelled;
  int e;

  if (exports_freeze_spot (served, NULL, f, &why) == -1)
    return control_fail (call, CONTROL_GENERIC_ERROR, "%s: %s", device,
                         why);
  if (served->commit ||
      glue_stream_job_progress (served->job, &sp, &cancelled))
    return control_fail (call, CONTROL_GENERIC_ERROR, "Node '%s' is busy: "
                         "block device is in use by block job", device);
  if (!qcow2_can_write (served->image))
    return control_fail (call, CONTROL_GENERIC_ERROR, "%s is served "
                         "read-only: nothing to commit", device);
  served->commit = qcow2_commit_new (served->image, &opts);
  if (!served->commit) {
    e = errno;
    return control_fail (call, CONTROL_GENERIC_ERROR, "%s", e == ENOENT
                         ? "the image has no backing file: nothing to "
                           "commit"
                         : e == EBUSY ? "the base is the backing file of "
                           "another image open here, or in a job"
                         : "the base cannot be committed into (see the "
                           "server's log)");
  }
  if ((why = commit_base_refusal (served->commit, base, f)) ||
      (why = commit_shared_base (served, f))) {
    qcow2_commit_free (served->commit);
    served->commit = NULL;
    return control_fail (call, CONTROL_GENERIC_ERROR, "%s", why);
  }
  return 0;
}

static int
commit_start (struct control_call *call, struct json_object *args,
              struct json_object **ret)
{
  const char *device, *base = NULL, *job_id = NULL;
  struct plugin_export *served;
  struct freeze_spot f;
  int64_t speed = 0;
  int r;

  if (control_arg_string (call, args, "job-id", false, &job_id) == -1 ||
      control_arg_string (call, args, "device", true, &device) == -1 ||
      control_arg_string (call, args, "base", false, &base) == -1 ||
      control_arg_int (call, args, "speed", false, &speed) == -1 ||
      control_args_only (call, args, (const char *const []) {
          "job-id", "device", "base", "speed", NULL }) == -1)
    return -1;
  if (speed < 0)
    return control_fail (call, CONTROL_GENERIC_ERROR, "Invalid parameter "
                         "'speed'");
  served = exports_hold (device);
  if (!served)
    return control_fail (call, CONTROL_DEVICE_NOT_FOUND, "Cannot find "
                         "device='%s' nor node-name='%s'", device, device);
  if (commit_make (call, served, device, base, speed, &f) == -1) {
    exports_unhold (served);
    return -1;
  }
  r = qcow2_commit_start (served->commit);
  if (r < 0) {
    qcow2_commit_free (served->commit);
    served->commit = NULL;
    exports_unhold (served);
    return control_fail (call, CONTROL_GENERIC_ERROR, "the base cannot be "
                         "opened for writing: %s", errstr (-r));
  }
  free (served->job_id);
  served->job_id = job_id ? strdup (job_id) : NULL;
  served->commit_ready_told = false;
  /* Held open until the job ends; a stream's hold is gone by now. */
  served->job_held = true;
  return 0;
}

/* The switch, with requests held off: the merged base renamed to the
 * export's file and opened in its place.  0, or -errno (the chain as
 * it was, opened again).  *old_top (-1 if none) pins the old top's
 * file across the rename: freeing it (its pages, its blocks: a tenth
 * of a second for 512 MiB) is its close's, after clients are let in
 * and the event is sent.
 */
static int
commit_switch (struct plugin_export *served, const struct freeze_spot *f,
               const char *base, int *old_top)
{
  const char *name = strrchr (base, '/') + 1;
  int r = qcow2_commit_complete (served->commit);

  if (r < 0)
    return r;
  qcow2_commit_free (served->commit);
  served->commit = NULL;
  if (qcow2_close (served->image) < 0)
    nbdkit_error ("%s: closing the committed image failed: the base holds "
                  "its data", f->name);
  served->image = NULL;
  *old_top = openat (f->dirfd, f->name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (renameat (f->dirfd, name, f->dirfd, f->name) == -1 ||
      fsync (f->dirfd) == -1)
    r = -errno;
  if (f->reopen (served) == -1 && r == 0)
    r = -EIO;
  return r;
}

/* The export whose commit job is named id (its job id, or its name),
 * found under the table's lock: its name copied.
 */
struct commit_found {
  const char *want;
  char *name;
};

static int
commit_find_one (const struct plugin_view *v, void *opaque)
{
  struct commit_found *c = opaque;
  const char *id = v->served->job_id ? v->served->job_id : v->name;

  if (!v->served->commit || strcmp (id, c->want) != 0)
    return 0;
  c->name = strdup (v->name);
  return 1;
}

/* The export of the commit job id, held (exports_unhold), or NULL. */
static struct plugin_export *
commit_hold (const char *id)
{
  struct commit_found c = { .want = id };
  struct plugin_export *served = NULL;

  if (exports_each (commit_find_one, &c) == 1 && c.name)
    served = exports_hold (c.name);
  free (c.name);
  if (served && !served->commit) {
    exports_unhold (served);
    served = NULL;
  }
  return served;
}

/* The end of the commit job of served told (error: NULL if it
 * succeeded), and its hold on the export released.
 */
static void
commit_told (struct plugin_export *served, const char *id,
             const char *event, const struct qcow2_commit_progress *p,
             const char *error)
{
  struct json_object *data = commit_info (id, p, true);

  if (error)
    json_object_object_add (data, "error", json_object_new_string (error));
  control_event (event, data);
  if (served->job_held) {
    served->job_held = false;
    exports_unhold (served);
  }
}

static int
commit_complete (struct control_call *call, struct json_object *args,
                 struct json_object **ret)
{
  struct qcow2_commit_progress p;
  struct plugin_export *served;
  struct freeze_spot f;
  const char *device, *why;
  char *base, *id;
  int r, old_top = -1;

  if (control_arg_string (call, args, "device", true, &device) == -1 ||
      control_args_only (call, args,
                         (const char *const []) { "device", NULL }) == -1)
    return -1;
  if (!(served = commit_hold (device)))
    return control_fail (call, CONTROL_DEVICE_NOT_ACTIVE, "Block job '%s' "
                         "not found", device);
  qcow2_commit_progress (served->commit, &p);
  if (!p.ready || exports_freeze_spot (served, NULL, &f, &why) == -1) {
    exports_unhold (served);
    return control_fail (call, CONTROL_GENERIC_ERROR, "Job '%s' in state "
                         "'%s' cannot accept command verb 'complete'",
                         device, p.ready ? "ready" : "running");
  }
  base = strdup (p.base);
  id = strdup (device);
  gate_shut (served, GATE_HELD);
  r = base ? commit_switch (served, &f, base, &old_top) : -ENOMEM;
  gate_open (served);
  if (r == 0)
    glue_noticef (f.folder, "block-commit: %s is the merged image now",
                  f.name);
  commit_told (served, id, "BLOCK_JOB_COMPLETED", &p,
               r < 0 ? errstr (-r) : NULL);
  if (old_top >= 0)
    control_close_later (old_top);
  free (base);
  free (id);
  /* The last hold: the export may be freed (f's strings with it). */
  exports_unhold (served);
  if (r < 0)
    return control_fail (call, CONTROL_GENERIC_ERROR, "the commit did not "
                         "complete (%s): the chain is as it was",
                         errstr (-r));
  return 0;
}

struct json_object *
commit_query (struct plugin_export *served, const char *id)
{
  struct qcow2_commit_progress p;

  qcow2_commit_progress (served->commit, &p);
  return commit_info (id, &p, false);
}

bool
commit_poll_one (const struct plugin_view *v, struct plugin_export **ended)
{
  const char *id = v->served->job_id ? v->served->job_id : v->name;
  struct qcow2_commit_progress p;

  *ended = NULL;
  if (!v->served->commit)
    return false;
  qcow2_commit_progress (v->served->commit, &p);
  if (p.ready && !v->served->commit_ready_told) {
    v->served->commit_ready_told = true;
    control_event ("BLOCK_JOB_READY", commit_info (id, &p, true));
  }
  if (p.state == QCOW2_COMMIT_FAILED && v->served->job_held) {
    struct json_object *data = commit_info (id, &p, true);

    json_object_object_add (data, "error",
                            json_object_new_string (errstr (-p.error)));
    control_event ("BLOCK_JOB_COMPLETED", data);
    v->served->job_held = false;
    *ended = v->served;
  }
  return true;
}

int
commit_control (struct plugin_export *served, const char *id, int what,
                uint64_t rate)
{
  struct qcow2_commit_progress p;

  qcow2_commit_progress (served->commit, &p);
  switch (what) {
  case GLUE_STREAM_PAUSE:
  case GLUE_STREAM_RESUME:
    qcow2_commit_pause (served->commit, what == GLUE_STREAM_PAUSE);
    break;
  case GLUE_STREAM_SET_RATE:
    qcow2_commit_set_rate (served->commit, rate);
    break;
  case GLUE_STREAM_CANCEL:
    /* The chain as it was: what the base got, the top covers. */
    qcow2_commit_free (served->commit);
    served->commit = NULL;
    commit_told (served, id, "BLOCK_JOB_CANCELLED", &p, NULL);
    break;
  }
  return 0;
}

static const struct control_command commit_commands[] = {
  { "block-commit", commit_start },
  { "block-job-complete", commit_complete },
};

void
control_commit_register (void)
{
  control_add_commands (commit_commands,
                        sizeof commit_commands / sizeof *commit_commands);
}
