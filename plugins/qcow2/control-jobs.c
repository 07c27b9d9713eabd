/* SPDX-License-Identifier: BSD-3-Clause */
/* The control socket's commands on exports and their jobs, with QEMU's
 * names and arguments where they mean the same (block-stream,
 * query-block-jobs, block-job-set-speed, -pause, -resume, -cancel,
 * query-block-exports, block-export-del), and the events of jobs that
 * end (BLOCK_JOB_COMPLETED, BLOCK_JOB_CANCELLED) and of exports
 * deleted (BLOCK_EXPORT_DELETED).  A job's device is its export's name,
 * and its id too unless job-id is given.  Run on the control thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "control.h"
#include "errstr.h"
#include "glue.h"
#include "plugin.h"
#include "qcow2.h"

/* A job's id: given, or its export's name. */
static const char *
jobs_id (const struct plugin_view *v)
{
  return v->served->job_id ? v->served->job_id : v->name;
}

/* QEMU's status of a job (qapi JobStatus), and whether it runs. */
static const char *
jobs_status (const struct qcow2_stream_progress *p, bool *running)
{
  *running = p->state == QCOW2_STREAM_STARTING ||
    p->state == QCOW2_STREAM_RUNNING || p->state == QCOW2_STREAM_WAITING;
  if (p->state == QCOW2_STREAM_STARTING)
    return "created";
  if (*running)
    return p->paused ? "paused" : "running";
  return "concluded";
}

/* What QEMU's BlockJobInfo and the job events say of a stream job. */
static struct json_object *
jobs_info (const char *id, const struct qcow2_stream_progress *p,
           bool events)
{
  bool running;
  const char *status = jobs_status (p, &running);
  const struct job_info j = {
    .type = "stream", .id = id, .len = p->total, .offset = p->done,
    .speed = p->rate, .paused = p->paused, .status = status,
    .busy = running && !p->paused && p->state != QCOW2_STREAM_WAITING,
  };

  return jobs_info_object (&j, events);
}

static int
jobs_query_one (const struct plugin_view *v, void *opaque)
{
  struct qcow2_stream_progress p;
  bool cancelled, running;

  if (glue_stream_job_progress (v->served->job, &p, &cancelled) &&
      (jobs_status (&p, &running), running))
    json_object_array_add (opaque, jobs_info (jobs_id (v), &p, false));
  if (v->served->commit)
    json_object_array_add (opaque, commit_query (v->served, jobs_id (v)));
  return 0;
}

static int
jobs_query (struct control_call *call, struct json_object *args,
            struct json_object **ret)
{
  if (control_args_only (call, args, NULL) == -1)
    return -1;
  *ret = json_object_new_array ();
  exports_each (jobs_query_one, *ret);
  return 0;
}

/* The export (or job) a command names, found: its view's served and
 * name copied into *found.
 */
struct jobs_found {
  const char *want;
  bool by_job;                  /* want is a job's id, not a device */
  struct plugin_export *served;
  char *name;
  /* Its job then: running, and how far it got (its id copied). */
  bool running;
  struct qcow2_stream_progress p;
  char *id;
};

static int
jobs_find_one (const struct plugin_view *v, void *opaque)
{
  struct jobs_found *f = opaque;
  bool cancelled;

  if (strcmp (f->by_job ? jobs_id (v) : v->name, f->want) != 0)
    return 0;
  f->served = v->served;
  f->name = strdup (v->name);
  f->id = strdup (jobs_id (v));
  if (glue_stream_job_progress (v->served->job, &f->p, &cancelled))
    jobs_status (&f->p, &f->running);
  return 1;
}

/* The running job named id: its export held into f (released with
 * exports_unhold, f->name freed), or -1 after the error QEMU gives
 * (DeviceNotFound).
 */
static int
jobs_find_job (struct control_call *call, const char *id,
               struct jobs_found *f)
{
  struct qcow2_stream_progress p;
  bool cancelled, running = false;

  *f = (struct jobs_found) { .want = id, .by_job = true };
  if (exports_each (jobs_find_one, f) == 1 && f->name &&
      (f->served = exports_hold (f->name)) &&
      glue_stream_job_progress (f->served->job, &p, &cancelled))
    jobs_status (&p, &running);
  if (f->served && f->served->commit)
    running = true;
  free (f->id);
  if (!running) {
    if (f->served)
      exports_unhold (f->served);
    free (f->name);
    return control_fail (call, CONTROL_DEVICE_NOT_ACTIVE,
                         "Block job '%s' not found", id);
  }
  return 0;
}

/* The end of v's job told (event, with error if it failed), once. */
static void
jobs_tell (const struct plugin_view *v, const char *event,
           const struct qcow2_stream_progress *p, const char *error)
{
  struct json_object *data = jobs_info (jobs_id (v), p, true);

  if (error)
    json_object_object_add (data, "error", json_object_new_string (error));
  v->served->job_told = true;
  control_event (event, data);
}

/* The exports whose jobs held them open and have ended, to release
 * once the table's lock is let go.
 */
struct jobs_ended {
  struct plugin_export **held;
  size_t n, cap;
};

/* A hold to release once the table's lock is let go. */
static void
jobs_ended_add (struct jobs_ended *ended, struct plugin_export *served)
{
  struct plugin_export **more = ended->n < ended->cap ? ended->held
    : realloc (ended->held, (ended->cap = ended->cap * 2 + 4)
               * sizeof *more);

  if (!more)
    return;                     /* held to the end, then */
  ended->held = more;
  ended->held[ended->n++] = served;
}

static int
jobs_poll_one (const struct plugin_view *v, void *opaque)
{
  struct jobs_ended *ended = opaque;
  struct qcow2_stream_progress p;
  struct plugin_export *failed;
  bool cancelled, running;

  if (commit_poll_one (v, &failed)) {
    if (failed)
      jobs_ended_add (ended, failed);
    return 0;
  }
  if (v->served->job_told ||
      !glue_stream_job_progress (v->served->job, &p, &cancelled))
    return 0;
  jobs_status (&p, &running);
  if (running)
    return 0;
  jobs_tell (v, "BLOCK_JOB_COMPLETED", &p,
             p.state == QCOW2_STREAM_FAILED ? "the job failed: see the "
             "server's log" : p.state == QCOW2_STREAM_STOPPED
             ? "the job was stopped" : NULL);
  if (v->served->job_held) {
    v->served->job_held = false;
    jobs_ended_add (ended, v->served);
  }
  return 0;
}

/* The control thread's tick: jobs that ended told, their holds gone. */
static void
jobs_poll (void)
{
  struct jobs_ended ended = { .n = 0 };

  exports_each (jobs_poll_one, &ended);
  for (size_t i = 0; i < ended.n; i++)
    exports_unhold (ended.held[i]);
  free (ended.held);
}

/* A job cancelled: told, and its job's hold released (f names it, and
 * holds it for the command).
 */
static void
jobs_cancelled (struct jobs_found *f, const struct qcow2_stream_progress *p)
{
  struct plugin_view v = { .name = f->name, .served = f->served };

  jobs_tell (&v, "BLOCK_JOB_CANCELLED", p, NULL);
  if (f->served->job_held) {
    f->served->job_held = false;
    exports_unhold (f->served);
  }
}

/* block-job-set-speed, -pause, -resume, -cancel: the job's device. */
static int
jobs_control (struct control_call *call, struct json_object *args,
              enum glue_stream_do what)
{
  struct qcow2_stream_progress p;
  const char *device;
  int64_t speed = 0;
  struct jobs_found f;
  bool cancelled, force;
  int r;

  if (control_arg_string (call, args, "device", true, &device) == -1 ||
      (what == GLUE_STREAM_SET_RATE &&
       control_arg_int (call, args, "speed", true, &speed) == -1) ||
      (what == GLUE_STREAM_CANCEL &&
       control_arg_bool (call, args, "force", false, &force) == -1) ||
      control_args_only (call, args, what == GLUE_STREAM_SET_RATE
                         ? (const char *const []) { "device", "speed", NULL }
                         : what == GLUE_STREAM_CANCEL
                         ? (const char *const []) { "device", "force", NULL }
                         : (const char *const []) { "device", NULL }) == -1)
    return -1;
  if (speed < 0)
    return control_fail (call, CONTROL_GENERIC_ERROR, "Invalid parameter "
                         "'speed'");
  if (jobs_find_job (call, device, &f) == -1)
    return -1;
  if (f.served->commit)
    r = commit_control (f.served, device, what, speed);
  else {
    glue_stream_job_progress (f.served->job, &p, &cancelled);
    r = glue_stream_job_control (f.served->job, what, speed);
    if (r == 0 && what == GLUE_STREAM_CANCEL)
      jobs_cancelled (&f, &p);
  }
  exports_unhold (f.served);
  free (f.name);
  if (r == -1)
    return control_fail (call, CONTROL_DEVICE_NOT_ACTIVE,
                         "Block job '%s' not found", device);
  return 0;
}

static int
jobs_set_speed (struct control_call *call, struct json_object *args,
                struct json_object **ret)
{
  return jobs_control (call, args, GLUE_STREAM_SET_RATE);
}

static int
jobs_pause (struct control_call *call, struct json_object *args,
            struct json_object **ret)
{
  return jobs_control (call, args, GLUE_STREAM_PAUSE);
}

static int
jobs_resume (struct control_call *call, struct json_object *args,
             struct json_object **ret)
{
  return jobs_control (call, args, GLUE_STREAM_RESUME);
}

static int
jobs_cancel (struct control_call *call, struct json_object *args,
             struct json_object **ret)
{
  return jobs_control (call, args, GLUE_STREAM_CANCEL);
}

/* block-stream's arguments: QEMU's that mean the same here. */
static const char *const jobs_stream_args[] = {
  "device", "job-id", "base", "speed", NULL
};

static int
jobs_stream (struct control_call *call, struct json_object *args,
             struct json_object **ret)
{
  const char *device, *job_id = NULL, *base = NULL;
  int64_t speed = 0;
  struct glue_stream_spec spec = { .detach = true };
  struct plugin_export *served;
  int r;

  if (control_arg_string (call, args, "job-id", false, &job_id) == -1 ||
      control_arg_string (call, args, "device", true, &device) == -1 ||
      control_arg_string (call, args, "base", false, &base) == -1 ||
      control_arg_int (call, args, "speed", false, &speed) == -1 ||
      control_args_only (call, args, jobs_stream_args) == -1)
    return -1;
  if (speed < 0)
    return control_fail (call, CONTROL_GENERIC_ERROR, "Invalid parameter "
                         "'speed'");
  served = exports_hold (device);
  if (!served)
    return control_fail (call, CONTROL_DEVICE_NOT_FOUND, "Cannot find "
                         "device='%s' nor node-name='%s'", device, device);
  if (!qcow2_can_write (served->image)) {
    exports_unhold (served);
    return control_fail (call, CONTROL_GENERIC_ERROR, "Block node is "
                         "read-only: %s is served read-only", device);
  }
  spec.base = base;
  spec.rate = speed;
  r = glue_stream_job_run (&served->job, served->image, device, &spec,
                           &served->inflight);
  if (r == -1) {
    int e = errno;

    exports_unhold (served);
    return control_fail (call, CONTROL_GENERIC_ERROR, "%s", e == EBUSY
                         ? "Node is busy: block device is in use by block "
                           "job: stream"
                         : e == ENOENT ? "the image has no backing file: "
                           "nothing to stream"
                         : "the job cannot start: see the server's log");
  }
  free (served->job_id);
  served->job_id = job_id ? strdup (job_id) : NULL;
  served->job_told = false;
  /* Held open until the job ends, as QEMU's node is by its job. */
  if (served->job_held)
    exports_unhold (served);
  served->job_held = true;
  return 0;
}

static int
jobs_export_one (const struct plugin_view *v, void *opaque)
{
  struct json_object *o = json_object_new_object ();

  json_object_object_add (o, "id", json_object_new_string (v->name));
  json_object_object_add (o, "type", json_object_new_string ("nbd"));
  json_object_object_add (o, "node-name", json_object_new_string (v->path));
  json_object_object_add (o, "shutting-down", json_object_new_boolean (false));
  json_object_object_add (o, "clients", json_object_new_int (v->clients));
  json_object_object_add (o, "read-only",
                          json_object_new_boolean (v->readonly));
  json_object_array_add (opaque, o);
  return 0;
}

static int
jobs_query_exports (struct control_call *call, struct json_object *args,
                    struct json_object **ret)
{
  if (control_args_only (call, args, NULL) == -1)
    return -1;
  *ret = json_object_new_array ();
  exports_each (jobs_export_one, *ret);
  return 0;
}

/* block-export-del: safe refuses while clients are connected, hard
 * closes the image all the same (nbdkit 1.32 gives a plugin no way to
 * drop a connection: their requests then fail with ESHUTDOWN).
 */
static int
jobs_export_del (struct control_call *call, struct json_object *args,
                 struct json_object **ret)
{
  static const char *const modes[] = { "safe", "hard", NULL };
  const char *id;
  unsigned mode = 0;
  struct json_object *data;
  struct jobs_found f;
  unsigned clients;
  bool hard;
  int r;

  if (control_arg_string (call, args, "id", true, &id) == -1 ||
      control_arg_enum (call, args, "mode", false, modes, &mode) == -1 ||
      control_args_only (call, args,
                         (const char *const []) { "id", "mode", NULL }) == -1)
    return -1;
  hard = mode == 1;
  /* Its running job stops with the image: told then. */
  f = (struct jobs_found) { .want = id };
  exports_each (jobs_find_one, &f);
  r = exports_delete (id, hard, &clients);
  if (r == 0 && f.running)
    control_event ("BLOCK_JOB_CANCELLED", jobs_info (f.id, &f.p, true));
  free (f.name);
  free (f.id);
  if (r == -1 && errno == EBUSY)
    return control_fail (call, CONTROL_GENERIC_ERROR, "export '%s' still in "
                         "use (%u client(s)): mode 'hard' closes it all the "
                         "same", id, clients);
  if (r == -1)
    return control_fail (call, CONTROL_GENERIC_ERROR, "Export '%s' is not "
                         "found", id);
  data = json_object_new_object ();
  json_object_object_add (data, "id", json_object_new_string (id));
  control_event ("BLOCK_EXPORT_DELETED", data);
  return 0;
}

static const struct control_command jobs_commands[] = {
  { "block-stream", jobs_stream },
  { "query-block-jobs", jobs_query },
  { "block-job-set-speed", jobs_set_speed },
  { "block-job-pause", jobs_pause },
  { "block-job-resume", jobs_resume },
  { "block-job-cancel", jobs_cancel },
  { "query-block-exports", jobs_query_exports },
  { "block-export-del", jobs_export_del },
};

void
control_jobs_register (void)
{
  control_add_commands (jobs_commands,
                        sizeof jobs_commands / sizeof *jobs_commands);
  control_set_tick (jobs_poll);
}
