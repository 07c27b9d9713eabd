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
#include "lock.h"

struct glue_stream glue_stream = { .detach = true };

/* -D qcow2.stream=1: a debug message per step of the job. */
NBDKIT_DLL_PUBLIC int qcow2_debug_stream = 0;

/* The job of one image.  Its engine job s is made at the image's open
 * (stream=true) or by the control socket (block-stream, and again
 * once one has ended), stopped by the control socket, and read by the
 * control socket and by the export's description: under lock.  A
 * client's first request starts an armed one.
 */
struct glue_stream_job {
  struct lock lock;
  struct qcow2_stream *s;       /* NULL: no job (none, or cancelled) */
  bool cancelled;               /* stopped by block-job-cancel */
  bool armed;                   /* atomic: the first request starts it */
  /* Requests in flight: the caller's count (the plugin's export), or
   * own (the filter's module job), which enter and leave keep.
   */
  const unsigned *busy;
  unsigned own_busy;
};

/* The module's one job (the filter's overlay). */
static struct glue_stream_job module_job = {
  .lock = LOCK_INITIALIZER, .busy = &module_job.own_busy,
};

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

/* The engine's job for img, as spec says, into j->s (left NULL when
 * there is nothing to stream).  Returns 0, or -1 after logging an
 * error.
 */
static int
stream_job_setup (struct glue_stream_job *j, struct qcow2_image *img,
                  const char *name, const char *key, bool readonly,
                  const struct glue_stream_spec *spec)
  TSA_REQUIRES (j->lock)
{
  struct qcow2_stream_options opts = {
    .base = spec->base, .rate = spec->rate,
    .keep_backing = !spec->detach, .debug = qcow2_debug_stream,
    .busy = j->busy,
  };

  if (readonly || !qcow2_can_write (img)) {
    nbdkit_error ("%s=true copies the backing chain into %s, which is "
                  "served read-only%s", key, name,
                  readonly ? " (nbdkit -r or readonly=true)" : "");
    return -1;
  }
  j->s = qcow2_stream_new (img, &opts);
  j->cancelled = false;
  /* Streamed and cut loose already: served, as asked, with a notice. */
  return j->s || errno == ENOENT ? 0 : -1;
}

/* What stream= and its keys say. */
static const struct glue_stream_spec *
stream_keys (struct glue_stream_spec *spec)
{
  /* The control socket may change the rate while images open. */
  *spec = (struct glue_stream_spec) {
    .base = glue_stream.base, .detach = glue_stream.detach,
    .rate = __atomic_load_n (&glue_stream.rate, __ATOMIC_RELAXED),
  };
  return spec;
}

static struct glue_stream_job *
stream_job_alloc (const unsigned *busy)
{
  struct glue_stream_job *j = calloc (1, sizeof *j);

  if (j) {
    lock_init (&j->lock);
    j->busy = busy ? busy : &j->own_busy;
  }
  return j;
}

int
glue_stream_job_new (struct qcow2_image *img, const char *name,
                     const char *key, bool readonly, const unsigned *busy,
                     struct glue_stream_job **jobp)
{
  struct glue_stream_spec spec;
  struct glue_stream_job *j;
  int r;

  *jobp = NULL;
  if (!glue_stream.on)
    return 0;
  j = stream_job_alloc (busy);
  if (!j) {
    nbdkit_error ("%s: %s=true: %s", name, key, errstr (errno));
    return -1;
  }
  lock_acquire (&j->lock);
  r = stream_job_setup (j, img, name, key, readonly, stream_keys (&spec));
  lock_release (&j->lock);
  if (r == -1) {
    glue_stream_job_free (j);
    return -1;
  }
  *jobp = j;
  return 0;
}

int
glue_stream_job_run (struct glue_stream_job **jobp, struct qcow2_image *img,
                     const char *name, const struct glue_stream_spec *spec,
                     const unsigned *busy)
{
  struct glue_stream_job *j = __atomic_load_n (jobp, __ATOMIC_ACQUIRE);
  struct qcow2_stream_progress p;

  if (!j) {
    if (!(j = stream_job_alloc (busy))) {
      nbdkit_error ("%s: block-stream: %s", name, errstr (errno));
      return -1;
    }
    __atomic_store_n (jobp, j, __ATOMIC_RELEASE);
  }
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&j->lock);
  if (j->s) {
    qcow2_stream_progress (j->s, &p);
    if (p.state == QCOW2_STREAM_STARTING ||
        p.state == QCOW2_STREAM_RUNNING || p.state == QCOW2_STREAM_WAITING) {
      errno = EBUSY;
      return -1;
    }
    qcow2_stream_free (j->s);
    j->s = NULL;
  }
  __atomic_store_n (&j->armed, false, __ATOMIC_RELAXED);
  if (stream_job_setup (j, img, name, "stream", false, spec) == -1)
    return -1;
  if (!j->s) {
    errno = ENOENT;
    return -1;
  }
  if (qcow2_stream_start (j->s) < 0) {
    qcow2_stream_free (j->s);
    j->s = NULL;
    errno = EIO;
    return -1;
  }
  return 0;
}

int
glue_stream_job_start (struct glue_stream_job *j)
{
  if (!j)
    return 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&j->lock);
  return j->s && qcow2_stream_start (j->s) < 0 ? -1 : 0;
}

void
glue_stream_job_free (struct glue_stream_job *j)
{
  if (!j)
    return;
  /* No request of its image in flight. */
  assert (__atomic_load_n (j->busy, __ATOMIC_RELAXED) == 0);
  qcow2_stream_free (j->s);
  lock_destroy (&j->lock);
  free (j);
}

void
glue_stream_job_arm (struct glue_stream_job *j)
{
  if (j)
    __atomic_store_n (&j->armed, true, __ATOMIC_RELEASE);
}

void
glue_stream_job_kick (struct glue_stream_job *j)
{
  if (j && __atomic_load_n (&j->armed, __ATOMIC_RELAXED) &&
      __atomic_exchange_n (&j->armed, false, __ATOMIC_ACQ_REL) &&
      glue_stream_job_start (j) == -1)
    nbdkit_error ("stream: the job did not start: the image is served "
                  "without it");
}

bool
glue_stream_job_progress (struct glue_stream_job *j,
                          struct qcow2_stream_progress *p,
                          bool *cancelled)
{
  if (!j)
    return false;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&j->lock);
  *cancelled = j->cancelled;
  if (!j->s)
    return false;
  qcow2_stream_progress (j->s, p);
  return true;
}

int
glue_stream_job_control (struct glue_stream_job *j, enum glue_stream_do what,
                         uint64_t rate)
{
  if (!j)
    return -1;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&j->lock);
  if (!j->s)
    return -1;
  switch (what) {
  case GLUE_STREAM_PAUSE:
  case GLUE_STREAM_RESUME:
    qcow2_stream_pause (j->s, what == GLUE_STREAM_PAUSE);
    break;
  case GLUE_STREAM_SET_RATE:
    qcow2_stream_set_rate (j->s, rate);
    break;
  case GLUE_STREAM_CANCEL:
    /* Stopped where it is: the image keeps what was copied. */
    qcow2_stream_free (j->s);
    j->s = NULL;
    j->cancelled = true;
    __atomic_store_n (&j->armed, false, __ATOMIC_RELAXED);
    break;
  }
  return 0;
}

/* The module job's requests in flight (the plugin counts its own). */
static void
stream_enter (struct glue_stream_job *j)
{
  __atomic_add_fetch (&j->own_busy, 1, __ATOMIC_RELAXED);
}

static void
stream_leave (struct glue_stream_job *j)
{
  unsigned before = __atomic_fetch_sub (&j->own_busy, 1, __ATOMIC_RELAXED);

  assert (before > 0);          /* each leave after its enter */
}

int
glue_stream_prepare (struct qcow2_image *img, const char *name,
                     const char *key, bool readonly)
{
  struct glue_stream_spec spec;

  if (!glue_stream.on)
    return 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&module_job.lock);
  assert (module_job.s == NULL);        /* one image, prepared once */
  return stream_job_setup (&module_job, img, name, key, readonly,
                           stream_keys (&spec));
}

int
glue_stream_start (void)
{
  return glue_stream_job_start (&module_job);
}

void
glue_stream_stop (void)
{
  lock_acquire (&module_job.lock);
  qcow2_stream_free (module_job.s);
  module_job.s = NULL;
  lock_release (&module_job.lock);
  free (glue_stream.base);
  glue_stream.base = NULL;
}

void
glue_stream_enter (void)
{
  stream_enter (&module_job);
}

void
glue_stream_leave (void)
{
  stream_leave (&module_job);
}

const char *
glue_stream_job_description (struct glue_stream_job *j, bool *settled)
{
  struct qcow2_stream_progress p;
  char d[HUMAN_SIZE_LEN], t[HUMAN_SIZE_LEN];

  bool cancelled = false;

  *settled = true;
  if (!glue_stream_job_progress (j, &p, &cancelled))
    return cancelled ? "streaming cancelled" : NULL;
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
