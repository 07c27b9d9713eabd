/* SPDX-License-Identifier: BSD-3-Clause */
/* Committing (QEMU's active block-commit, a mirror job with a dirty
 * bitmap): the image's data copied into its backing file, the base,
 * while clients read and write the image (qcow2.h says what it does).
 *
 * The base is opened again read-write in place (image_reopen_below,
 * with the image's data_lock held exclusively: no request reads the
 * base while its file changes), and a map of the image's clusters is
 * hung on the image (img->commit_map), which every write, zero and
 * trim marks once done.  The job marks first every cluster the image
 * allocates, then, one run of marked clusters at a time: clears the
 * marks, maps the run in the image, reads what the image holds there
 * and writes it into the base (qcow2_write, qcow2_zero: the base's
 * ordinary write path, its metadata ordered as every write's).  A
 * client's write that ends after the marks were cleared marks them
 * again; one that ended before is read.  Ready once nothing is marked.
 *
 * Reads through the image go on reading the base where the image
 * allocates nothing, which the job never writes.  But a write into
 * the base may move a cluster of it (copy on write: a cluster larger
 * than the image's, shared with a snapshot, compressed) and free the
 * old one at the next flush, while such a read still reads it at the
 * place it found: so the base does not punch what it frees, and after
 * each flush of the base the job waits for every request on the image
 * to end (taking its data_lock exclusively, for an instant) before it
 * or a writer copies again, and with it before a freed cluster can be
 * reused.
 *
 * A client's write, once done, copies what it marked itself (as
 * QEMU's write-blocking mirror does): writers random over the disk
 * would otherwise mark clusters faster than the job copies them, and
 * it would never be in sync.  The job and the writers copy one at a
 * time (copy_lock), each clearing marks before it reads, so that no
 * older copy lands after a newer one.
 *
 * One step (at most COMMIT_STEP bytes) at a time; before each the job
 * waits while clients have requests in flight, at most as long as its
 * last step took, and keeps to the rate asked.  A step failing for
 * want of space ends the job; other failures are retried, waiting
 * longer each time.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"
#include "errstr.h"
#include "humansize.h"
#include "internal.h"
#include "monotonic.h"

#define COMMIT_STEP (1u << 20)
/* While clients have requests in flight, the job looks this often
 * whether they are done.
 */
#define COMMIT_YIELD_POLL_NS (500 * 1000LL)
/* In sync, how often the job looks for what clients wrote. */
#define COMMIT_IDLE_NS (10 * 1000000LL)
/* What is copied is flushed this often. */
#define COMMIT_FLUSH_NS (1000 * 1000000LL)
/* Retries of a failed step: the wait doubles from 1 s up to 30 s, and
 * the job gives up after this many failures in a row.
 */
#define COMMIT_RETRY_MAX_S 30
#define COMMIT_RETRIES 25
/* Mapped under one hold of the image's lock, when the job starts. */
#define COMMIT_SCAN_BYTES (UINT64_C (64) << 20)

struct qcow2_commit {
  struct qcow2_image *img, *base;
  struct commit_map map;
  const unsigned *busy;
  void (*changed) (void);
  bool debug;
  /* Held by whoever copies (the job, a client's write): a step's
   * marks taken and copied, through buf.
   */
  struct lock copy_lock;
  uint8_t *buf;                 /* a step's data */
  unsigned helpers;             /* atomic: writers about to copy */
  pthread_t thread;
  bool started;                 /* the thread runs (till joined) */
  /* The base open for writing by the job (undone by qcow2_commit_free),
   * and whether env->layers shared it before.
   */
  bool base_writable, base_shared;
  /* Guards what follows but done; cond signals stop, pause, rate.
   * Taken with none of the images' locks held.
   */
  struct lock lock;
  pthread_cond_t cond;
  bool stop, paused, ready;
  enum qcow2_commit_state state;
  int error;
  uint64_t rate;
  unsigned pokes;               /* changes of pause or rate */
  uint64_t done;                /* atomic: bytes copied */
  /* The job's own: the next cluster looked at, and the rate's window. */
  uint64_t pos;
  int64_t window_start;
  uint64_t window_bytes;
  unsigned window_pokes;
};

static void
commit_set_state (struct qcow2_commit *c, enum qcow2_commit_state state,
                  int error)
  TSA_EXCLUDES (c->lock)
{
  lock_acquire (&c->lock);
  c->state = state;
  c->error = error;
  if (state == QCOW2_COMMIT_READY)
    c->ready = true;
  lock_release (&c->lock);
}

/* Sleep ns, or less if the job is told to stop, or its pause or rate
 * change.  Returns whether it is to stop.
 */
static bool
commit_sleep (struct qcow2_commit *c, int64_t ns)
  TSA_EXCLUDES (c->lock)
{
  uint64_t at = monotonic_ns () + MAX (ns, 0);
  struct timespec ts = {
    .tv_sec = at / 1000000000, .tv_nsec = at % 1000000000,
  };
  unsigned pokes;
  bool stop;

  lock_acquire (&c->lock);
  pokes = c->pokes;
  while (!c->stop && c->pokes == pokes &&
         !lock_wait_until (&c->lock, &c->cond, &ts))
    ;
  stop = c->stop;
  lock_release (&c->lock);
  return stop;
}

/* Mark every cluster the image allocates (data, zeros or compressed):
 * the first pass's work.
 */
static int
commit_scan (struct qcow2_commit *c)
  TSA_EXCLUDES (c->img->lock)
{
  struct qcow2_image *img = c->img;
  unsigned bits = c->map.bits;
  uint64_t off = 0;
  int r = 0;

  while (off < img->size && r == 0) {
    uint64_t end = MIN (img->size, off + COMMIT_SCAN_BYTES);

    if (c->started && commit_sleep (c, 0))
      return -ECANCELED;
    image_lock (img);
    while (off < end && r == 0) {
      struct qcow2_run run;

      if ((r = cluster_map (img, off, end - off, &run)) < 0)
        break;
      if (run.kind != RUN_UNALLOCATED)
        commit_map_change (&c->map, off >> bits,
                           ((off + run.length - 1) >> bits) + 1, true);
      off += run.length;
    }
    image_unlock (img);
  }
  return r;
}

/* The image's data at [off, off+len), read as a client reads it, into
 * the base.
 */
static int
commit_copy_data (struct qcow2_commit *c, uint64_t off, uint64_t len)
  TSA_EXCLUDES (c->img->lock, c->img->data_lock)
{
  int r;

  image_data_rdlock (c->img);
  r = layer_read (c->img, c->buf, len, off);
  image_data_unlock (c->img);
  return r < 0 ? r : qcow2_write (c->base, c->buf, len, off, false);
}

/* Copy what the image holds of clusters [first, first+n), run by run,
 * into the base: *copied bytes.  On failure they are marked again.
 */
static int
commit_copy (struct qcow2_commit *c, uint64_t first, uint64_t n,
             uint64_t *copied)
  TSA_REQUIRES (c->copy_lock) TSA_EXCLUDES (c->img->lock, c->img->data_lock)
{
  struct qcow2_image *img = c->img;
  uint64_t off = first << c->map.bits;
  uint64_t end = MIN (img->size, (first + n) << c->map.bits);
  int r = 0;

  *copied = 0;
  while (off < end && r == 0) {
    struct qcow2_run run;

    image_lock (img);
    r = cluster_map (img, off, end - off, &run);
    image_unlock (img);
    if (r < 0)
      break;
    /* What the image does not allocate reads from the base already. */
    if (run.kind == RUN_ZERO)
      r = qcow2_zero (c->base, run.length, off, true, false, false);
    else if (run.kind != RUN_UNALLOCATED)
      r = commit_copy_data (c, off, run.length);
    if (r == 0 && run.kind != RUN_UNALLOCATED)
      *copied += run.length;
    off += run.length;
  }
  if (r < 0)
    commit_map_change (&c->map, first, first + n, true);
  return r;
}

/* The next run of marked clusters from c->pos on (then from the
 * start), copied: *found says if there was one.
 */
static int
commit_step (struct qcow2_commit *c, uint64_t *copied, bool *found)
  TSA_EXCLUDES (c->img->lock, c->img->data_lock)
{
  uint64_t max = MAX (COMMIT_STEP >> c->map.bits, 1), first, n;
  int r;

  *copied = 0;
  lock_acquire (&c->copy_lock);
  *found = commit_map_take (&c->map, c->pos, UINT64_MAX, max, &first, &n) ||
    (c->pos > 0 &&
     commit_map_take (&c->map, 0, UINT64_MAX, max, &first, &n));
  r = *found ? commit_copy (c, first, n, copied) : 0;
  lock_release (&c->copy_lock);
  if (!*found) {
    c->pos = 0;
    return 0;
  }
  c->pos = first + n;
  if (r < 0)
    c->pos = first;             /* retried from there */
  else {
    __atomic_add_fetch (&c->done, *copied, __ATOMIC_RELAXED);
    if (c->debug)
      log_debug (c->img, "commit: copied %" PRIu64 " bytes of clusters "
                 "%" PRIu64 "-%" PRIu64, *copied, first, first + n - 1);
  }
  return r;
}

void
commit_help (struct qcow2_image *img, uint64_t offset, uint64_t count)
{
  struct commit_map *m = __atomic_load_n (&img->commit_map,
                                          __ATOMIC_ACQUIRE);
  struct qcow2_commit *c;
  uint64_t at, end, n, copied;

  if (!m || count == 0)
    return;
  /* Taken up under data_lock: the job waits for its writers before it
   * goes (commit_unprepare).
   */
  image_data_rdlock (img);
  m = img->commit_map;
  c = m ? m->job : NULL;
  if (c)
    __atomic_add_fetch (&c->helpers, 1, __ATOMIC_ACQ_REL);
  image_data_unlock (img);
  if (!c)
    return;
  at = offset >> m->bits;
  end = ((offset + count - 1) >> m->bits) + 1;
  /* What the job copied meanwhile is no longer marked.  A failure
   * leaves the marks, for the job: the write itself stands.
   */
  lock_acquire (&c->copy_lock);
  while (commit_map_take (m, at, end, MAX (COMMIT_STEP >> m->bits, 1),
                          &at, &n) &&
         commit_copy (c, at, n, &copied) == 0) {
    __atomic_add_fetch (&c->done, copied, __ATOMIC_RELAXED);
    at += n;
  }
  lock_release (&c->copy_lock);
  lock_acquire (&c->lock);
  if (__atomic_sub_fetch (&c->helpers, 1, __ATOMIC_ACQ_REL) == 0)
    pthread_cond_broadcast (&c->cond);
  lock_release (&c->lock);
}

/* Make what was copied durable.  The flush releases the clusters the
 * base freed: no request still reading one of them as it found it
 * before (see the top of the file) may outlive it.
 */
static int
commit_flush_base (struct qcow2_commit *c)
  TSA_EXCLUDES (c->copy_lock, c->img->data_lock)
{
  int r;

  /* No writer copies in between either (copy_lock). */
  lock_acquire (&c->copy_lock);
  r = qcow2_flush (c->base);
  image_data_wrlock (c->img);
  image_data_unlock (c->img);
  lock_release (&c->copy_lock);
  return r;
}

/* Before a step (after one of copied bytes that took step_ns): clients
 * first (a wait as long as the step at most: the job keeps half the
 * time), a pause, then the rate (a pause or a new rate during its wait
 * is heeded at once).  Returns whether the job is to stop.
 */
static bool
commit_pace (struct qcow2_commit *c, uint64_t copied, int64_t step_ns)
  TSA_EXCLUDES (c->lock)
{
  int64_t until = (int64_t) monotonic_ns () + step_ns, now, due;
  uint64_t rate;
  bool stop;

  while (c->busy && __atomic_load_n (c->busy, __ATOMIC_RELAXED) &&
         (int64_t) monotonic_ns () < until)
    if (commit_sleep (c, COMMIT_YIELD_POLL_NS))
      return true;
  c->window_bytes += copied;
  for (;;) {
    lock_acquire (&c->lock);
    while (c->paused && !c->stop)
      lock_wait (&c->lock, &c->cond);
    stop = c->stop;
    rate = c->rate;
    /* The window starts again after a pause or a new rate. */
    if (c->pokes != c->window_pokes) {
      c->window_pokes = c->pokes;
      c->window_start = 0;
    }
    lock_release (&c->lock);
    if (stop)
      return true;
    now = (int64_t) monotonic_ns ();
    if (!rate || !c->window_start) {
      c->window_start = now;
      c->window_bytes = 0;
      return false;
    }
    due = c->window_start + (int64_t) (c->window_bytes * 1e9 / rate);
    if (due <= now)
      return false;
    if (commit_sleep (c, due - now))
      return true;
  }
}

/* A step that failed with r (what says which, for the notice).
 * Returns 0 to retry it, after a wait logged (1 s, doubling up to
 * 30 s), else what the job ends with (-ECANCELED: told to stop
 * meanwhile).
 */
static int
commit_retry (struct qcow2_commit *c, const char *what, int r,
              unsigned *failures)
{
  enum qcow2_commit_state was;
  bool last;
  int64_t end;
  unsigned s;

  if (r == -ECANCELED)
    return r;
  if (r == -ENOSPC || r == -EDQUOT || r == -EFBIG) {
    log_notice (c->img, "commit: no space left in \"%s\" for the copy: "
                "the job stops\n"
                "the chain is as it was: start the job again once there "
                "is room", c->base->path);
    return r;
  }
  last = ++*failures > COMMIT_RETRIES;
  if (last || !qcow2_can_write (c->base) || !qcow2_can_write (c->img)) {
    log_notice (c->img, "commit: %s failed (%s)%s: the job stops", what,
                errstr (-r), last ? ", too many times" : "");
    return r;
  }
  s = *failures > 5 ? COMMIT_RETRY_MAX_S
                    : MIN (COMMIT_RETRY_MAX_S, 1u << (*failures - 1));
  log_notice (c->img, "commit: %s failed (%s): retrying in %u s (attempt "
              "%u of %u)", what, errstr (-r), s, *failures, COMMIT_RETRIES);
  lock_acquire (&c->lock);
  was = c->state;
  c->state = QCOW2_COMMIT_WAITING;
  lock_release (&c->lock);
  /* A pause or a new rate does not end the wait. */
  end = (int64_t) monotonic_ns () + s * 1000000000LL;
  for (int64_t now; (now = (int64_t) monotonic_ns ()) < end; )
    if (commit_sleep (c, end - now))
      return -ECANCELED;
  commit_set_state (c, was, 0);
  return 0;
}

/* In sync, the first time: said. */
static void
commit_note_ready (struct qcow2_commit *c)
  TSA_EXCLUDES (c->lock)
{
  char h[HUMAN_SIZE_LEN];
  bool was;

  lock_acquire (&c->lock);
  was = c->ready;
  if (c->state == QCOW2_COMMIT_RUNNING)
    c->state = QCOW2_COMMIT_READY;
  c->ready = true;
  lock_release (&c->lock);
  if (was)
    return;
  log_notice (c->img, "commit: ready: \"%s\" is in sync (%s copied); "
              "complete the job to switch to it", c->base->path,
              human_size (h, __atomic_load_n (&c->done, __ATOMIC_RELAXED)));
  if (c->changed)
    c->changed ();
}

/* The job's loop: copy what is marked, flush now and then, and once
 * nothing is, be ready and look again soon.  Returns only when told to
 * stop (-ECANCELED) or failing.
 */
static int
commit_sync (struct qcow2_commit *c)
{
  int64_t flushed = (int64_t) monotonic_ns (), step_ns = 0, t;
  uint64_t copied = 0;
  unsigned failures = 0;
  bool unflushed = false, found;
  char what[64];
  int r;

  for (;;) {
    if (commit_pace (c, copied, step_ns))
      return -ECANCELED;
    t = (int64_t) monotonic_ns ();
    r = commit_step (c, &copied, &found);
    step_ns = (int64_t) monotonic_ns () - t;
    if (r < 0) {
      snprintf (what, sizeof what, "copying at offset %" PRIu64,
                c->pos << c->map.bits);
      if ((r = commit_retry (c, what, r, &failures)) < 0)
        return r;
      continue;
    }
    failures = 0;
    unflushed |= found;
    if (unflushed && (!found || (int64_t) monotonic_ns () - flushed >
                      COMMIT_FLUSH_NS)) {
      if ((r = commit_flush_base (c)) < 0) {
        if ((r = commit_retry (c, "flushing the base", r, &failures)) < 0)
          return r;
        continue;
      }
      unflushed = false;
      flushed = (int64_t) monotonic_ns ();
    }
    if (!found) {
      commit_note_ready (c);
      if (commit_sleep (c, COMMIT_IDLE_NS))
        return -ECANCELED;
    }
  }
}

/* The first pass's marks, retried as a step is. */
static int
commit_scan_retrying (struct qcow2_commit *c)
{
  unsigned failures = 0;
  int r;

  while ((r = commit_scan (c)) < 0)
    if ((r = commit_retry (c, "mapping the image", r, &failures)) < 0)
      return r;
  return 0;
}

static void
commit_note_start (struct qcow2_commit *c)
{
  uint64_t bytes = commit_map_count (&c->map) << c->map.bits;
  char h[HUMAN_SIZE_LEN];

  log_notice (c->img, "commit: started: up to %s to copy into \"%s\"",
              human_size (h, MIN (bytes, c->img->size)), c->base->path);
}

static void *
commit_thread (void *arg)
{
  struct qcow2_commit *c = arg;
  int r = commit_scan_retrying (c);

  if (r == 0) {
    commit_note_start (c);
    r = commit_sync (c);
  }
  if (r == -ECANCELED)
    log_debug (c->img, "commit: stopped");
  else {
    commit_set_state (c, QCOW2_COMMIT_FAILED, r);
    if (c->changed)
      c->changed ();
  }
  return NULL;
}

/* The base opened for writing, and the map hung on the image. */
static int
commit_prepare (struct qcow2_commit *c)
  TSA_EXCLUDES (c->img->data_lock)
{
  struct qcow2_image *img = c->img, *base = c->base;
  int r = layers_write_begin (base, &c->base_shared);

  if (r == -EBUSY)
    log_error (img, "commit: \"%s\" is the backing file of another image "
               "open: it cannot change under it", base->path);
  if (r < 0)
    return r;
  image_data_wrlock (img);
  r = image_reopen_below (img, true);
  if (r == 0 && !qcow2_can_write (base)) {
    r = qcow2_check_writable (base) ? : -EROFS;
    image_reopen_below (img, false);
  }
  /* Every write from now on marks what it changed. */
  if (r == 0)
    __atomic_store_n (&img->commit_map, &c->map, __ATOMIC_RELEASE);
  image_data_unlock (img);
  if (r < 0) {
    layers_write_end (base, c->base_shared);
    log_error (img, "commit: \"%s\" cannot be written: %s", base->path,
               errstr (-r));
    return r;
  }
  c->base_writable = true;
  return 0;
}

/* Undo commit_prepare: the map taken off the image (no write holds
 * data_lock, so none still marks it), the base read-only again.
 */
static void
commit_unprepare (struct qcow2_commit *c)
  TSA_EXCLUDES (c->img->data_lock)
{
  struct qcow2_image *img = c->img;

  if (!c->base_writable)
    return;
  image_data_wrlock (img);
  __atomic_store_n (&img->commit_map, NULL, __ATOMIC_RELEASE);
  image_data_unlock (img);
  /* No writer takes the job up now; those that did are done before the
   * base is flushed (so that clients are not held off meanwhile) and
   * made read-only again.
   */
  lock_acquire (&c->lock);
  while (__atomic_load_n (&c->helpers, __ATOMIC_ACQUIRE))
    lock_wait (&c->lock, &c->cond);
  lock_release (&c->lock);
  image_close_writes (c->base);
  image_data_wrlock (img);
  image_reopen_below (img, false);
  image_data_unlock (img);
  layers_write_end (c->base, c->base_shared);
  c->base_writable = false;
}

/* Stop the thread, if it runs. */
static void
commit_join (struct qcow2_commit *c)
  TSA_EXCLUDES (c->lock)
{
  if (!c->started)
    return;
  lock_acquire (&c->lock);
  c->stop = true;
  pthread_cond_broadcast (&c->cond);
  lock_release (&c->lock);
  pthread_join (c->thread, NULL);
  c->started = false;
  lock_acquire (&c->lock);
  c->stop = false;
  lock_release (&c->lock);
}

/* Why img cannot be committed into its backing file, logged: 0 if it
 * can, else -errno.
 */
static int
commit_refused (struct qcow2_image *img)
{
  const struct qcow2_image *base = img->backing;
  int r;

  if ((r = qcow2_check_writable (img)) < 0)
    return r;
  if (!base) {
    log_error (img, "commit: the image has no backing file: nothing to "
               "commit into");
    return -ENOENT;
  }
  if (base->raw || base->luks || base->data_io != base->io ||
      !backing_is_local (base)) {
    log_error (img, "commit: \"%s\" is %s: only a local qcow2 file is "
               "written\n"
               "qemu-img commit writes it offline", base->path,
               base->raw ? "a raw image" : base->luks ? "encrypted"
               : base->data_io != base->io ? "an image with an external "
               "data file" : "remote storage, or a window of a file");
    return -ENOTSUP;
  }
  if (base->size != img->size) {
    log_error (img, "commit: \"%s\" has a virtual size of %" PRIu64
               " bytes, the image %" PRIu64 "\n"
               "qemu-img resize gives them the same size", base->path,
               base->size, img->size);
    return -EINVAL;
  }
  if (__atomic_load_n (&base->users, __ATOMIC_ACQUIRE) > 1) {
    log_error (img, "commit: \"%s\" is the backing file of another image "
               "open: it cannot change under it", base->path);
    return -EBUSY;
  }
  return 0;
}

struct qcow2_commit *
qcow2_commit_new (struct qcow2_image *img,
                  const struct qcow2_commit_options *opts)
{
  struct qcow2_commit *c;
  uint64_t clusters;
  bool mine;
  int r;

  if ((r = commit_refused (img)) < 0) {
    errno = -r;
    return NULL;
  }
  clusters = div_round_up (img->size, img->geo.cluster_size);
  c = calloc (1, sizeof *c);
  if (!c ||
      !(c->map.words = calloc (MAX ((clusters + 63) / 64, 1), 8)) ||
      !(c->buf = malloc (MAX (COMMIT_STEP, img->geo.cluster_size)))) {
    r = -errno;
    log_error (img, "commit: setting up the job: %s", errstr (-r));
    goto err;
  }
  image_lock (img);
  mine = !img->commit;
  if (mine)
    img->commit = c;
  image_unlock (img);
  if (!mine) {
    log_error (img, "commit: a commit job runs on the image already");
    r = -EBUSY;
    goto err;
  }
  c->img = img;
  c->base = img->backing;
  c->map.clusters = clusters;
  c->map.bits = img->geo.cluster_bits;
  c->map.job = c;
  c->busy = opts->busy;
  c->changed = opts->changed;
  c->debug = opts->debug;
  c->rate = opts->rate;
  c->state = QCOW2_COMMIT_CREATED;
  lock_init (&c->lock);
  lock_init (&c->copy_lock);
  lock_cond_init (&c->cond);
  return c;

 err:
  if (c) {
    free (c->map.words);
    free (c->buf);
  }
  free (c);
  errno = -r;
  return NULL;
}

int
qcow2_commit_start (struct qcow2_commit *c)
{
  int r;

  assert (c->state == QCOW2_COMMIT_CREATED);
  if ((r = commit_prepare (c)) < 0) {
    commit_set_state (c, QCOW2_COMMIT_FAILED, r);
    return r;
  }
  commit_set_state (c, QCOW2_COMMIT_RUNNING, 0);
  c->started = true;
  r = pthread_create (&c->thread, NULL, commit_thread, c);
  if (r != 0) {
    c->started = false;
    log_error (c->img, "commit: starting its thread: %s", errstr (r));
    commit_set_state (c, QCOW2_COMMIT_FAILED, -r);
    return -r;
  }
  return 0;
}

/* Copy all that is marked, at once: 0 once nothing is. */
static int
commit_drain (struct qcow2_commit *c)
{
  uint64_t copied;
  bool found = true;
  int r = 0;

  while (found && r == 0)
    r = commit_step (c, &copied, &found);
  return r;
}

int
qcow2_commit_run (struct qcow2_commit *c)
{
  int r;

  assert (c->state == QCOW2_COMMIT_CREATED);
  if ((r = commit_prepare (c)) == 0) {
    commit_set_state (c, QCOW2_COMMIT_RUNNING, 0);
    r = commit_scan (c);
  }
  if (r == 0) {
    commit_note_start (c);
    r = commit_drain (c);
  }
  if (r == 0)
    r = commit_flush_base (c);
  if (r < 0) {
    commit_set_state (c, QCOW2_COMMIT_FAILED, r);
    return r;
  }
  commit_note_ready (c);
  return 0;
}

void
qcow2_commit_progress (struct qcow2_commit *c,
                       struct qcow2_commit_progress *p)
{
  uint64_t left = commit_map_count (&c->map) << c->map.bits;

  lock_acquire (&c->lock);
  p->state = c->state;
  p->ready = c->ready;
  p->paused = c->paused;
  p->rate = c->rate;
  p->error = c->error;
  lock_release (&c->lock);
  p->offset = __atomic_load_n (&c->done, __ATOMIC_RELAXED);
  p->len = p->offset + (p->state == QCOW2_COMMIT_COMPLETED ? 0
                        : MIN (left, c->img->size));
  p->base = c->base->path;
}

/* A new rate (rate set) or pause (else): the job told at once. */
static void
commit_poke (struct qcow2_commit *c, bool rate_set, uint64_t rate,
             bool pause)
  TSA_EXCLUDES (c->lock)
{
  lock_acquire (&c->lock);
  if (rate_set)
    c->rate = rate;
  else
    c->paused = pause;
  c->pokes++;
  pthread_cond_broadcast (&c->cond);
  lock_release (&c->lock);
}

void
qcow2_commit_set_rate (struct qcow2_commit *c, uint64_t rate)
{
  commit_poke (c, true, rate, false);
}

void
qcow2_commit_pause (struct qcow2_commit *c, bool pause)
{
  commit_poke (c, false, 0, pause);
}

int
qcow2_commit_complete (struct qcow2_commit *c)
{
  enum qcow2_commit_state state;
  char h[HUMAN_SIZE_LEN];
  bool ready;
  int r;

  lock_acquire (&c->lock);
  state = c->state;
  ready = c->ready;
  r = c->error;
  lock_release (&c->lock);
  if (state == QCOW2_COMMIT_COMPLETED)
    return 0;
  if (state == QCOW2_COMMIT_FAILED) {
    log_error (c->img, "commit: the job failed (%s): it cannot be "
               "completed", errstr (-r));
    return r;
  }
  if (!ready) {
    log_error (c->img, "commit: the job is not ready yet: it cannot be "
               "completed");
    return -EBUSY;
  }
  if (c->busy && __atomic_load_n (c->busy, __ATOMIC_ACQUIRE)) {
    log_error (c->img, "commit: client requests are in flight: hold them "
               "off before the job is completed");
    return -EBUSY;
  }
  commit_join (c);
  r = commit_drain (c);
  if (r == 0)
    r = image_close_writes (c->base);
  if (r < 0) {
    log_error (c->img, "commit: completing the job: %s: it fails; the "
               "chain stays as it was", errstr (-r));
    commit_set_state (c, QCOW2_COMMIT_FAILED, r);
    return r;
  }
  commit_set_state (c, QCOW2_COMMIT_COMPLETED, 0);
  log_notice (c->img, "commit: complete: \"%s\" holds the whole disk "
              "(%s copied)", c->base->path,
              human_size (h, __atomic_load_n (&c->done, __ATOMIC_RELAXED)));
  return 0;
}

void
qcow2_commit_free (struct qcow2_commit *c)
{
  struct qcow2_image *img;

  if (!c)
    return;
  img = c->img;
  commit_join (c);
  if (c->base_writable && c->state != QCOW2_COMMIT_COMPLETED)
    log_notice (img, "commit: stopped before its end: the chain stays as "
                "it was (\"%s\" holds copies of ranges the image covers)",
                c->base->path);
  commit_unprepare (c);
  image_lock (img);
  img->commit = NULL;
  image_unlock (img);
  lock_destroy (&c->lock);
  lock_destroy (&c->copy_lock);
  pthread_cond_destroy (&c->cond);
  free (c->map.words);
  free (c->buf);
  free (c);
}
