/* SPDX-License-Identifier: BSD-3-Clause */
/* Streaming (the engine's qcow2_stream) for the plugin and the qcow2
 * filter's overlay: the options as parsed, the job checked once the
 * image is open, started after nbdkit forks, its progress in the
 * export description, the clients' requests in flight counted so that
 * the job yields to them, and the job stopped before the image closes.
 * A job for each image the plugin opens (dir= serves many), and the
 * module's one for the filter's overlay.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "errstr.h"
#include "glue.h"
#include "humansize.h"

struct glue_stream glue_stream = { .detach = true };

/* -D qcow2.stream=1: a debug message per step of the job. */
NBDKIT_DLL_PUBLIC int qcow2_debug_stream = 0;

/* The job of one image, and its clients' requests in flight (atomic). */
struct glue_stream_job {
  struct qcow2_stream *s;       /* NULL: nothing to stream */
  unsigned busy;
  /* Armed: started by the first request that enters (atomic). */
  bool armed;
};

/* The module's one job (the filter's overlay). */
static struct glue_stream_job module_job;

int
glue_stream_config_complete (const char *key)
{
  const char *companion = glue_stream.base ? "base" :
    glue_stream.rate_given ? "rate" : glue_stream.detach_given ? "detach" :
    NULL;

  if (glue_stream.on || !companion)
    return 0;
  nbdkit_error ("%s-%s= needs %s=true", key,
                companion, key);
  return -1;
}

/* The engine's job for img into j->s (left NULL when there is nothing
 * to stream).  Returns 0, or -1 after logging an error.
 */
static int
stream_job_setup (struct glue_stream_job *j, struct qcow2_image *img,
                  const char *name, const char *key, bool readonly)
{
  struct qcow2_stream_options opts = {
    .base = glue_stream.base, .rate = glue_stream.rate,
    .keep_backing = !glue_stream.detach, .debug = qcow2_debug_stream,
    .busy = &j->busy,
  };

  if (readonly || !qcow2_can_write (img)) {
    nbdkit_error ("%s=true copies the backing chain into %s, which is "
                  "served read-only%s", key, name,
                  readonly ? " (nbdkit -r or readonly=true)" : "");
    return -1;
  }
  j->s = qcow2_stream_new (img, &opts);
  /* Streamed and cut loose already: served, as asked, with a notice. */
  return j->s || errno == ENOENT ? 0 : -1;
}

int
glue_stream_job_new (struct qcow2_image *img, const char *name,
                     const char *key, bool readonly,
                     struct glue_stream_job **jobp)
{
  struct glue_stream_job *j;

  *jobp = NULL;
  if (!glue_stream.on)
    return 0;
  j = calloc (1, sizeof *j);
  if (!j) {
    nbdkit_error ("%s: %s=true: %s", name, key, errstr (errno));
    return -1;
  }
  if (stream_job_setup (j, img, name, key, readonly) == -1) {
    free (j);
    return -1;
  }
  *jobp = j;
  return 0;
}

int
glue_stream_job_start (struct glue_stream_job *j)
{
  return j && j->s && qcow2_stream_start (j->s) < 0 ? -1 : 0;
}

void
glue_stream_job_free (struct glue_stream_job *j)
{
  if (!j)
    return;
  /* No request of its image in flight. */
  assert (__atomic_load_n (&j->busy, __ATOMIC_RELAXED) == 0);
  qcow2_stream_free (j->s);
  free (j);
}

void
glue_stream_job_arm (struct glue_stream_job *j)
{
  if (j)
    __atomic_store_n (&j->armed, true, __ATOMIC_RELEASE);
}

void
glue_stream_job_enter (struct glue_stream_job *j)
{
  if (!j)
    return;
  __atomic_add_fetch (&j->busy, 1, __ATOMIC_RELAXED);
  if (__atomic_load_n (&j->armed, __ATOMIC_RELAXED) &&
      __atomic_exchange_n (&j->armed, false, __ATOMIC_ACQ_REL) &&
      glue_stream_job_start (j) == -1)
    nbdkit_error ("stream: the job did not start: the image is served "
                  "without it");
}

void
glue_stream_job_leave (struct glue_stream_job *j)
{
  unsigned before;

  if (!j)
    return;
  before = __atomic_fetch_sub (&j->busy, 1, __ATOMIC_RELAXED);
  assert (before > 0);          /* each leave after its enter */
}

int
glue_stream_prepare (struct qcow2_image *img, const char *name,
                     const char *key, bool readonly)
{
  if (!glue_stream.on)
    return 0;
  assert (module_job.s == NULL);        /* one image, prepared once */
  return stream_job_setup (&module_job, img, name, key, readonly);
}

int
glue_stream_start (void)
{
  return glue_stream_job_start (&module_job);
}

void
glue_stream_stop (void)
{
  qcow2_stream_free (module_job.s);
  module_job.s = NULL;
  free (glue_stream.base);
  glue_stream.base = NULL;
}

void
glue_stream_enter (void)
{
  glue_stream_job_enter (&module_job);
}

void
glue_stream_leave (void)
{
  glue_stream_job_leave (&module_job);
}

const char *
glue_stream_job_description (struct glue_stream_job *j, bool *settled)
{
  struct qcow2_stream_progress p;
  char d[HUMAN_SIZE_LEN], t[HUMAN_SIZE_LEN];

  *settled = true;
  if (!j || !j->s)
    return NULL;
  qcow2_stream_progress (j->s, &p);
  *settled = p.state != QCOW2_STREAM_STARTING &&
    p.state != QCOW2_STREAM_RUNNING && p.state != QCOW2_STREAM_WAITING;
  switch (p.state) {
  case QCOW2_STREAM_STARTING:
    return "streaming: starting";
  case QCOW2_STREAM_RUNNING:
  case QCOW2_STREAM_WAITING:
    if (!p.counted)
      return p.state == QCOW2_STREAM_WAITING
        ? "streaming: counting what to copy (waiting for the backing chain)"
        : "streaming: counting what to copy";
    return nbdkit_printf_intern ("streaming: %" PRIu64 "%%, %s of %s%s",
                                 p.total ? p.done * 100 / p.total : 0,
                                 human_size (d, p.done),
                                 human_size (t, p.total),
                                 p.state == QCOW2_STREAM_WAITING
                                 ? " (waiting for the backing chain)" : "");
  case QCOW2_STREAM_DONE:
    return "streamed: the backing chain is copied (the link kept)";
  case QCOW2_STREAM_DETACHED:
    if (p.base)
      return nbdkit_printf_intern ("streamed: now backed by %s", p.base);
    return "streamed: no longer depends on its backing chain";
  case QCOW2_STREAM_FAILED:
    if (!p.counted)
      return "streaming stopped while counting what to copy (see the "
        "server's log)";
    return nbdkit_printf_intern ("streaming stopped at %" PRIu64 "%% (see "
                                 "the server's log)",
                                 p.total ? p.done * 100 / p.total : 0);
  case QCOW2_STREAM_STOPPED:
    return "streaming stopped";
  }
  return NULL;
}

const char *
glue_stream_description (void)
{
  bool settled;

  return glue_stream_job_description (&module_job, &settled);
}
