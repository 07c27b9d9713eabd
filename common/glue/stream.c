/* SPDX-License-Identifier: BSD-3-Clause */
/* Streaming (the engine's qcow2_stream) for the plugin and the qcow2
 * filter's overlay: the options as parsed, the job checked once the
 * image is open, started after nbdkit forks, its progress in the
 * export description, the clients' requests in flight counted so that
 * the job yields to them, and the job stopped before the image closes.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "glue.h"
#include "humansize.h"

struct glue_stream glue_stream = { .detach = true };

/* -D qcow2.stream=1: a debug message per step of the job. */
NBDKIT_DLL_PUBLIC int qcow2_debug_stream = 0;

static struct qcow2_stream *job;
static unsigned busy;           /* client requests in flight (atomic) */

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

int
glue_stream_prepare (struct qcow2_image *img, const char *name,
                     const char *key, bool readonly)
{
  struct qcow2_stream_options opts = {
    .base = glue_stream.base, .rate = glue_stream.rate,
    .keep_backing = !glue_stream.detach, .debug = qcow2_debug_stream,
    .busy = &busy,
  };

  if (!glue_stream.on)
    return 0;
  assert (job == NULL);         /* one image, prepared once */
  if (readonly || !qcow2_can_write (img)) {
    nbdkit_error ("%s=true copies the backing chain into %s, which is "
                  "served read-only%s", key, name,
                  readonly ? " (nbdkit -r or readonly=true)" : "");
    return -1;
  }
  job = qcow2_stream_new (img, &opts);
  /* Streamed and cut loose already: served, as asked, with a notice. */
  return job || errno == ENOENT ? 0 : -1;
}

int
glue_stream_start (void)
{
  return job && qcow2_stream_start (job) < 0 ? -1 : 0;
}

void
glue_stream_stop (void)
{
  qcow2_stream_free (job);
  job = NULL;
  free (glue_stream.base);
  glue_stream.base = NULL;
}

void
glue_stream_enter (void)
{
  __atomic_add_fetch (&busy, 1, __ATOMIC_RELAXED);
}

void
glue_stream_leave (void)
{
  unsigned before = __atomic_fetch_sub (&busy, 1, __ATOMIC_RELAXED);

  assert (before > 0);          /* each leave after its enter */
}

const char *
glue_stream_description (void)
{
  struct qcow2_stream_progress p;
  char d[HUMAN_SIZE_LEN], t[HUMAN_SIZE_LEN];

  if (!job)
    return NULL;
  qcow2_stream_progress (job, &p);
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
