/* SPDX-License-Identifier: BSD-3-Clause */
/* Streaming (QEMU's block-stream job): a thread that copies into the
 * top image every range it allocates nothing of and that a layer of
 * the backing chain above the base holds, while clients are served;
 * once all is copied, the header's backing name is rewritten (to none,
 * or to the base) and the layers dropped are closed (stream-detach.c).
 *
 * The copy is copy-on-read's (fill.c): a run of clusters is claimed as
 * an allocating write claims it, read from the backing chain, written,
 * and committed only where nothing else changed it, so that a client's
 * write always wins.  A cluster of extended L2 entries that the top
 * allocates part of gets its other subclusters through the allocating
 * write path, under a claim taken before the backing chain is read.
 * Ranges no layer above the base holds stay unallocated (they read
 * the same from the base, or as zeros); those that read as zeros
 * become zero clusters.  What is allocated is done: a job started again
 * goes on from where the image stands.
 *
 * One step (at most STREAM_STEP bytes) is in flight at a time; before
 * each the job waits, for a bounded time, while clients have requests
 * in flight, and keeps to the rate asked.  A step that fails for want
 * of space ends the job; other failures of a step or of a count of
 * what is left (a remote layer down) are retried, waiting longer each
 * time up to a bound.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"
#include "errstr.h"
#include "internal.h"
#include "humansize.h"
#include "monotonic.h"

#define STREAM_STEP (1u << 20)
/* While clients have requests in flight, the job waits this long at
 * most before a step (so that it still ends under a steady load).
 */
#define STREAM_YIELD_NS (100 * 1000000LL)
#define STREAM_YIELD_POLL_NS (500 * 1000LL)
/* Retries of a failed step: the wait doubles from 1 s up to 30 s, and
 * the job gives up after this many failures in a row (some 10 minutes).
 */
#define STREAM_RETRY_MAX_S 30
#define STREAM_RETRIES 25
/* What is copied is flushed this often. */
#define STREAM_FLUSH_NS (1000 * 1000000LL)
/* The total is counted again at most this often (see stream_copy). */
#define STREAM_RECOUNT_NS (1000 * 1000000LL)
/* Passes that find work left but copy nothing before the job stops. */
#define STREAM_IDLE_PASSES 5

struct qcow2_stream {
  struct qcow2_image *img;
  struct qcow2_image *base;     /* the first layer kept, or NULL */
  struct qcow2_stream_options opts;
  pthread_t thread;
  bool started;
  char *base_name;              /* stream-base= as given, or NULL */
  /* Guards stop, state and counted; cond signals stop.  Taken with
   * none of the image's locks held.
   */
  struct lock lock;
  pthread_cond_t cond;
  bool stop;
  /* Paused (block-job-pause): no step is started until resumed.  The
   * rate, which may change while the job runs (set is its epoch: the
   * pacing starts again from then).
   */
  bool paused;
  uint64_t rate;
  unsigned rate_set;
  enum qcow2_stream_state state;
  bool counted;                 /* total known */
  uint64_t total, done;         /* atomic */
  /* The job's own: where the pass is, when the last count ended and
   * how long it took.
   */
  uint64_t pos;
  int64_t counted_at, count_ns;
};

static void
stream_set_state (struct qcow2_stream *s, enum qcow2_stream_state state)
  TSA_EXCLUDES (s->lock)
{
  lock_acquire (&s->lock);
  s->state = state;
  lock_release (&s->lock);
}

/* Sleep ns, or less if the job is told to stop.  Returns whether it is.
 * On the monotonic clock, as the pacing (lock_cond_init).
 */
static bool
stream_sleep (struct qcow2_stream *s, int64_t ns)
  TSA_EXCLUDES (s->lock)
{
  uint64_t at = monotonic_ns () + ns;
  struct timespec ts = {
    .tv_sec = at / 1000000000, .tv_nsec = at % 1000000000,
  };
  bool stop;

  lock_acquire (&s->lock);
  while (!s->stop && !lock_wait_until (&s->lock, &s->cond, &ts))
    ;
  stop = s->stop;
  lock_release (&s->lock);
  return stop;
}

static bool
stream_stopping (struct qcow2_stream *s)
  TSA_EXCLUDES (s->lock)
{
  return stream_sleep (s, 0);
}

/* The subclusters of the cluster at c that the top allocates nothing
 * of: bit i for subcluster i (bit 0 alone without extended L2).
 */
static int
stream_top_gap (struct qcow2_image *img, uint64_t c, uint64_t *mask)
  TSA_REQUIRES (img->lock)
{
  struct l2_state st;
  uint8_t *slice;
  uint64_t idx;
  int r;

  if ((r = cluster_l2_slice (img, c, &slice, &idx)) < 0)
    return r;
  if (!slice) {
    /* The whole cluster, as fill.c fills it. */
    *mask = img->geo.extended_l2 ? L2_ALL_ALLOC : 1;
    return 0;
  }
  l2_get (img, slice, idx, &st);
  if (st.compressed)
    *mask = 0;
  else if (!img->geo.extended_l2)
    *mask = st.entry == 0;
  else
    *mask = ~(st.bitmap | st.bitmap >> 32) & L2_ALL_ALLOC;
  /* Subclusters past the end of the disk are never written. */
  if (img->geo.extended_l2 && img->size - c < img->geo.cluster_size) {
    uint64_t n = (img->size - c + img->geo.subcluster_size - 1)
                 >> img->geo.subcluster_bits;
    *mask &= (UINT64_C (1) << n) - 1;
  }
  return 0;
}

/* Whether a layer above the base holds something of [offset,
 * offset+len): *n, how far the answer holds.  A layer shorter than
 * offset reads as zeros there, so holds it.  A raw layer holds all it
 * covers, its holes included: what its storage reports as zeros is
 * not taken on trust (a server may claim zeros over data), but read
 * and compared, as QEMU's copy-on-read does: the copy (fill.c) makes
 * zero clusters of what reads as zeros.
 */
static int
stream_held_below (struct qcow2_stream *s, uint64_t offset, uint64_t len,
                   bool *held, uint64_t *n)
{
  *held = false;
  *n = len;
  for (struct qcow2_image *l = s->img->backing; l && l != s->base;
       l = l->backing) {
    struct qcow2_run run;
    int r;

    if (offset >= l->size || l->raw) {
      *held = true;
      return 0;
    }
    *n = MIN (*n, l->size - offset);
    image_lock (l);
    r = cluster_map (l, offset, *n, &run);
    image_unlock (l);
    if (r < 0)
      return r;
    *n = MIN (*n, run.length);
    if (run.kind != RUN_UNALLOCATED) {
      *held = true;
      return 0;
    }
  }
  return 0;
}

/* What the job must copy of the cluster at c: the subclusters (mask)
 * the top lacks, if a layer above the base holds any part of the
 * cluster, else none.  Past the top's backing file the top reads
 * zeros, whatever the layers below hold: nothing to copy.
 */
static int
stream_wanted (struct qcow2_stream *s, uint64_t c, uint64_t *mask)
  TSA_EXCLUDES (s->img->lock)
{
  struct qcow2_image *img = s->img;
  uint64_t cs = img->geo.cluster_size, end, pos;
  bool held = false;
  int r;

  *mask = 0;
  if (c >= img->backing->size)
    return 0;
  image_lock (img);
  r = stream_top_gap (img, c, mask);
  image_unlock (img);
  if (r < 0 || *mask == 0)
    return r;
  end = MIN (c + cs, img->size);
  for (pos = c; pos < end && !held; ) {
    uint64_t n;

    if ((r = stream_held_below (s, pos, end - pos, &held, &n)) < 0)
      return r;
    pos += n;
  }
  if (!held)
    *mask = 0;
  return 0;
}

static uint64_t
stream_mask_bytes (const struct qcow2_image *img, uint64_t mask)
{
  if (!img->geo.extended_l2)
    return mask ? img->geo.cluster_size : 0;
  return (uint64_t) __builtin_popcountll (mask) * img->geo.subcluster_size;
}

/* The bytes left to copy. */
static int
stream_count (struct qcow2_stream *s, uint64_t *left)
{
  uint64_t cs = s->img->geo.cluster_size;

  *left = 0;
  for (uint64_t c = 0; c < s->img->size; c += cs) {
    uint64_t mask;
    int r;

    if ((c & ((UINT64_C (256) << 20) - 1)) == 0 && stream_stopping (s))
      return -ECANCELED;
    if ((r = stream_wanted (s, c, &mask)) < 0)
      return r;
    *left += stream_mask_bytes (s->img, mask);
  }
  return 0;
}

/* A read of the chain below (write_claim_may_unlock's io). */
struct stream_read {
  uint8_t *buf;
  uint64_t len, offset;
};

static int
stream_read_unlocked (struct qcow2_image *img, void *opaque)
{
  const struct stream_read *rd = opaque;

  return read_backing (img, rd->buf, rd->len, rd->offset);
}

/* The subclusters of a cluster the top allocates part of, one run of
 * them at a time: claimed, read from the chain, then written through
 * the allocating write path, which the claim is handed to with the
 * lock held throughout (so no client write comes between).
 */
static int
stream_partial (struct qcow2_image *img, uint64_t c)
  TSA_EXCLUDES (img->lock) TSA_REQUIRES_SHARED (img->data_lock)
{
  uint64_t scs = img->geo.subcluster_size;
  CLEANUP_FREE uint8_t *buf = malloc (img->geo.cluster_size);
  int r = 0;

  if (!buf)
    return -errno;
  /* Each round fills a run of subclusters: at most as many rounds. */
  for (unsigned round = 0; round < QCOW2_SUBCLUSTERS; round++) {
    uint64_t mask, start, end, len;

    image_lock (img);
    r = stream_top_gap (img, c, &mask);
    if (r < 0 || mask == 0 ||
        write_inflight_overlaps (img, c, c + img->geo.cluster_size)) {
      image_unlock (img);
      return r;
    }
    start = __builtin_ctzll (mask);
    for (end = start; end < QCOW2_SUBCLUSTERS && (mask >> end & 1); end++)
      ;
    if ((r = state_begin_write (img)) < 0) {
      image_unlock (img);
      return r;
    }
    len = MIN ((end - start) * scs, img->size - (c + start * scs));
    r = write_claim_may_unlock (img, c, c + img->geo.cluster_size,
                                stream_read_unlocked,
                                &(struct stream_read) {
                                  .buf = buf, .len = len,
                                  .offset = c + start * scs });
    if (r == 0)
      r = write_allocating_may_unlock (img, buf, c + start * scs, len);
    image_unlock (img);
    if (r < 0)
      return r;
  }
  return 0;
}

/* The next step from s->pos: the clusters to copy (a run of clusters
 * the top allocates nothing of, or one that it allocates part of),
 * copied.  *found: bytes copied (0: nothing left after s->pos).
 */
static int
stream_step (struct qcow2_stream *s, uint64_t *found)
  TSA_EXCLUDES (s->img->lock, s->img->data_lock)
{
  struct qcow2_image *img = s->img;
  uint64_t cs = img->geo.cluster_size;
  uint64_t full = img->geo.extended_l2 ? L2_ALL_ALLOC : 1;
  uint64_t start, len = 0, mask = 0;
  int r = 0;

  *found = 0;
  /* What needs nothing is passed over without pausing. */
  while (s->pos < img->size && mask == 0) {
    if ((r = stream_wanted (s, s->pos, &mask)) < 0)
      return r;
    if (mask == 0)
      s->pos += cs;
  }
  start = s->pos;
  while (mask != 0) {
    len += cs;
    *found += stream_mask_bytes (img, mask);
    if (mask != full || len >= STREAM_STEP || start + len >= img->size)
      break;
    if ((r = stream_wanted (s, start + len, &mask)) < 0)
      return r;
    if (mask != full)
      break;
  }
  if (len == 0)
    return 0;
  image_data_rdlock (img);
  if (len == cs && *found < stream_mask_bytes (img, full))
    r = stream_partial (img, start);
  else
    r = fill_range (img, start, len);
  image_data_unlock (img);
  if (r == 0)
    s->pos = start + len;
  return r;
}

/* The rate pacing from *started, *copied bytes since: begun again now
 * if the rate changed (the epoch *seen) or the job was paused.  Returns
 * the rate.  While paused, waits for a resume (or a stop).
 */
static uint64_t
stream_paced_from (struct qcow2_stream *s, int64_t *started,
                   uint64_t *copied, unsigned *seen)
  TSA_EXCLUDES (s->lock)
{
  uint64_t rate;
  bool was_paused = false;

  lock_acquire (&s->lock);
  while (s->paused && !s->stop) {
    was_paused = true;
    lock_wait (&s->lock, &s->cond);
  }
  rate = s->rate;
  if (was_paused || *seen != s->rate_set) {
    *seen = s->rate_set;
    *started = (int64_t) monotonic_ns ();
    *copied = 0;
  }
  lock_release (&s->lock);
  return rate;
}

static bool
stream_paused (struct qcow2_stream *s)
  TSA_EXCLUDES (s->lock)
{
  bool paused;

  lock_acquire (&s->lock);
  paused = s->paused;
  lock_release (&s->lock);
  return paused;
}

/* Before a step: a pause, clients (a bounded wait), then the rate; and
 * a pause asked meanwhile again (no step is begun once it is).
 * Returns whether the job is told to stop.
 */
static bool
stream_pace (struct qcow2_stream *s, int64_t *started, uint64_t *copied,
             unsigned *seen)
{
  do {
    int64_t until = (int64_t) monotonic_ns () + STREAM_YIELD_NS;
    uint64_t rate = stream_paced_from (s, started, copied, seen);

    while (s->opts.busy &&
           __atomic_load_n (s->opts.busy, __ATOMIC_RELAXED) &&
           (int64_t) monotonic_ns () < until)
      if (stream_sleep (s, STREAM_YIELD_POLL_NS))
        return true;
    if (rate) {
      int64_t due = *started + (int64_t) (*copied * 1e9 / rate);
      int64_t now = (int64_t) monotonic_ns ();

      if (due > now && stream_sleep (s, due - now))
        return true;
    }
    if (stream_stopping (s))
      return true;
  } while (stream_paused (s));
  return false;
}

/* A remote step failed with r (what says which, for the notice).  Returns
 * 0 to retry it, after a wait logged, else what the job ends with
 * (-ECANCELED: told to stop meanwhile).
 */
static int
stream_retry (struct qcow2_stream *s, const char *what, int r,
              unsigned *failures)
{
  unsigned wait = 1;
  enum qcow2_stream_state was;

  if (r == -ECANCELED)
    return r;
  if (r == -ENOSPC || r == -EDQUOT || r == -EFBIG) {
    log_notice (s->img, "stream: no space left for the copy at offset "
                "%" PRIu64 ": the job stops\n"
                "the image is consistent: start the job again with "
                "stream=true once there is room", s->pos);
    return r;
  }
  if (!qcow2_can_write (s->img) || ++*failures > STREAM_RETRIES) {
    log_notice (s->img, "stream: %s failed (%s)%s: the job stops", what,
                errstr (-r),
                *failures > STREAM_RETRIES ? ", too many times" : "");
    return r;
  }
  for (unsigned i = 1; i < *failures && wait < STREAM_RETRY_MAX_S; i++)
    wait *= 2;
  wait = MIN (wait, STREAM_RETRY_MAX_S);
  log_notice (s->img, "stream: %s failed (%s): retrying in %u s (attempt "
              "%u of %u)", what, errstr (-r), wait, *failures,
              STREAM_RETRIES);
  lock_acquire (&s->lock);
  was = s->state;
  s->state = QCOW2_STREAM_WAITING;
  lock_release (&s->lock);
  if (stream_sleep (s, wait * 1000000000LL))
    return -ECANCELED;
  stream_set_state (s, was);
  return 0;
}

/* Count the bytes left to copy, retried as a step is (a remote layer's
 * L2 tables are read), and make the total what is copied and what is
 * left: clients' writes and trims take ranges over, so it shrinks.
 */
static int
stream_recount (struct qcow2_stream *s, unsigned *failures, uint64_t *left)
{
  int64_t t0 = (int64_t) monotonic_ns ();
  int r;

  while ((r = stream_count (s, left)) < 0)
    if ((r = stream_retry (s, "counting what to copy", r, failures)) < 0)
      return r;
  *failures = 0;
  __atomic_store_n (&s->total, __atomic_load_n (&s->done, __ATOMIC_RELAXED)
                    + *left, __ATOMIC_RELAXED);
  s->counted_at = (int64_t) monotonic_ns ();
  s->count_ns = s->counted_at - t0;
  lock_acquire (&s->lock);
  s->counted = true;
  lock_release (&s->lock);
  return 0;
}

/* After a step that copied found bytes: the notice of a tenth passed
 * (one a step at most, the true percentage; the last is the end's).
 */
static void
stream_progress_notice (struct qcow2_stream *s, uint64_t found,
                        unsigned *tenth)
{
  uint64_t done = __atomic_add_fetch (&s->done, found, __ATOMIC_RELAXED);
  uint64_t total = __atomic_load_n (&s->total, __ATOMIC_RELAXED);
  char d[HUMAN_SIZE_LEN], t[HUMAN_SIZE_LEN];

  if (s->opts.debug)
    log_debug (s->img, "stream: copied %" PRIu64 " bytes up to offset "
               "%" PRIu64 " (%" PRIu64 " of %" PRIu64 ")", found, s->pos,
               done, total);
  if (done < total && done * 10 >= (*tenth + 1) * total) {
    *tenth = done * 10 / total;
    log_notice (s->img, "stream: %u%% copied (%s of %s)",
                (unsigned) (done * 100 / total), human_size (d, done),
                human_size (t, total));
  }
}

/* Copy all there is.  Returns 0 when nothing is left, else -errno. */
static int
stream_copy (struct qcow2_stream *s, int64_t started)
{
  uint64_t copied = 0, left;
  unsigned failures = 0, idle = 0, tenth = 0, seen = 0;
  int64_t flushed = (int64_t) monotonic_ns ();
  char what[64];
  int r;

  for (;;) {
    uint64_t pass_copied = 0;

    s->pos = 0;
    for (;;) {
      uint64_t found;
      int64_t now;

      if (stream_pace (s, &started, &copied, &seen))
        return -ECANCELED;
      r = stream_step (s, &found);
      if (r < 0) {
        snprintf (what, sizeof what, "copying at offset %" PRIu64, s->pos);
        if ((r = stream_retry (s, what, r, &failures)) < 0)
          return r;
        continue;
      }
      failures = 0;
      /* What is copied is kept, for a start after a crash to go on. */
      now = (int64_t) monotonic_ns ();
      if (now - flushed > STREAM_FLUSH_NS || found == 0) {
        if ((r = qcow2_flush (s->img)) < 0 &&
            (r = stream_retry (s, "flushing the copy", r, &failures)) < 0)
          return r;
        flushed = (int64_t) monotonic_ns ();
      }
      if (found == 0)
        break;
      copied += found;
      pass_copied += found;
      /* Counted again now and then (a twentieth of the time at most),
       * for the total to follow what clients took over.
       */
      if (now - s->counted_at > MAX (STREAM_RECOUNT_NS, 20 * s->count_ns) &&
          (r = stream_recount (s, &failures, &left)) < 0)
        return r;
      stream_progress_notice (s, found, &tenth);
    }
    if ((r = stream_recount (s, &failures, &left)) < 0)
      return r;
    if (left == 0)
      return 0;
    /* Clusters claimed by clients, or written meanwhile: again. */
    idle = pass_copied ? 0 : idle + 1;
    if (idle >= STREAM_IDLE_PASSES) {
      log_notice (s->img, "stream: %" PRIu64 " bytes cannot be copied (the "
                  "clusters are shared with internal snapshots, or "
                  "compressed): the job stops", left);
      return -ENOTSUP;
    }
    if (stream_sleep (s, 100 * 1000000LL))
      return -ECANCELED;
  }
}

static void *
stream_thread (void *arg)
{
  struct qcow2_stream *s = arg;
  int64_t started = (int64_t) monotonic_ns ();
  uint64_t first, done;
  unsigned failures = 0;
  char h[HUMAN_SIZE_LEN], rest[128] = "";
  int r;

  if ((r = stream_recount (s, &failures, &first)) < 0)
    goto out;
  log_notice (s->img, "stream: started: %" PRIu64 " bytes to copy (%s%s%s%s)",
              first, human_size (h, first),
              s->base ? ", down to the base \"" : "",
              s->base ? s->base->path : "", s->base ? "\"" : "");
  if ((r = stream_copy (s, started)) < 0)
    goto out;
  double secs = ((int64_t) monotonic_ns () - started) / 1e9;
  done = __atomic_load_n (&s->done, __ATOMIC_RELAXED);
  /* The start's count, less what clients took over, is what was
   * copied: both logged.
   */
  if (done < first)
    snprintf (rest, sizeof rest, "; clients' writes and trims took over "
              "the other %" PRIu64 " bytes counted at the start",
              first - done);
  log_notice (s->img, "stream: done: %" PRIu64 " bytes copied (%s) in "
              "%.1f s (%.1f MiB/s)%s", done, human_size (h, done), secs,
              secs > 0 ? done / secs / (1 << 20) : 0.0, rest);
  if (s->opts.keep_backing)
    log_notice (s->img, "stream: stream-detach=false: the backing link "
                "is kept");
  stream_set_state (s, !s->opts.keep_backing &&
                       stream_detach (s->img, s->base) == 0
                       ? QCOW2_STREAM_DETACHED : QCOW2_STREAM_DONE);
  return NULL;

 out:
  stream_set_state (s, r == -ECANCELED ? QCOW2_STREAM_STOPPED
                                       : QCOW2_STREAM_FAILED);
  if (r == -ECANCELED)
    log_debug (s->img, "stream: stopped at offset %" PRIu64, s->pos);
  return NULL;
}

/* Whether the layer l is the one name names: by the name the layer
 * above records, its path, or, resolved as the image's names are, its
 * identity.
 */
static bool
stream_is_layer (struct qcow2_image *img, const struct qcow2_image *above,
                 const struct qcow2_image *l, const char *name)
{
  CLEANUP_FREE char *resolved = NULL, *why = NULL, *id = NULL;

  if ((above->h.backing_file && strcmp (above->h.backing_file, name) == 0) ||
      strcmp (l->path, name) == 0)
    return true;
  resolved = name_resolve (img->path, name, &why);
  if (!resolved)
    return false;
  if (strcmp (resolved, l->path) == 0)
    return true;
  if (img->env->identity && l->id &&
      (id = img->env->identity (img->env->opaque, resolved)))
    return strcmp (id, l->id) == 0;
  return false;
}

struct qcow2_stream *
qcow2_stream_new (struct qcow2_image *img,
                  const struct qcow2_stream_options *opts)
{
  struct qcow2_stream *s;
  struct qcow2_image *base = NULL;

  if (!img->writable || img->raw) {
    log_error (img, "stream: the image must be opened read-write to "
               "stream into it");
    errno = EINVAL;
    return NULL;
  }
  if (!img->backing) {
    log_notice (img, "stream: the image has no backing file: nothing to "
                "stream");
    errno = ENOENT;
    return NULL;
  }
  if (img->data_io != img->io) {
    log_error (img, "stream: the guest data is in an external data file: "
               "streaming into it is not supported");
    errno = ENOTSUP;
    return NULL;
  }
  if (opts->base) {
    const struct qcow2_image *above = img;

    for (base = img->backing; base; above = base, base = base->backing)
      if (stream_is_layer (img, above, base, opts->base))
        break;
    if (!base || base == img->backing) {
      log_error (img, "stream: stream-base=%s is %s", opts->base,
                 base ? "the image's own backing file: nothing to stream"
                      : "no layer of the backing chain below the image's "
                        "backing file");
      errno = EINVAL;
      return NULL;
    }
  }
  s = calloc (1, sizeof *s);
  if (s && opts->base && !(s->base_name = strdup (opts->base))) {
    free (s);
    s = NULL;
  }
  if (!s) {
    int e = errno;

    log_error (img, "stream: setting up the job: %s", errstr (e));
    errno = e;
    return NULL;
  }
  s->img = img;
  s->base = base;
  s->opts = *opts;
  s->opts.base = NULL;
  s->rate = opts->rate;
  s->state = QCOW2_STREAM_STARTING;
  lock_init (&s->lock);
  lock_cond_init (&s->cond);
  return s;
}

int
qcow2_stream_start (struct qcow2_stream *s)
{
  int r;

  assert (!s->started);
  stream_set_state (s, QCOW2_STREAM_RUNNING);
  r = pthread_create (&s->thread, NULL, stream_thread, s);
  if (r != 0) {
    log_error (s->img, "stream: starting its thread: %s", errstr (r));
    stream_set_state (s, QCOW2_STREAM_FAILED);
    return -r;
  }
  s->started = true;
  return 0;
}

void
qcow2_stream_progress (struct qcow2_stream *s,
                       struct qcow2_stream_progress *p)
{
  lock_acquire (&s->lock);
  p->state = s->state;
  p->counted = s->counted;
  p->paused = s->paused;
  p->rate = s->rate;
  lock_release (&s->lock);
  p->base = s->base_name;
  p->total = __atomic_load_n (&s->total, __ATOMIC_RELAXED);
  p->done = MIN (__atomic_load_n (&s->done, __ATOMIC_RELAXED), p->total);
}

void
qcow2_stream_set_rate (struct qcow2_stream *s, uint64_t rate)
{
  lock_acquire (&s->lock);
  s->rate = rate;
  s->rate_set++;
  pthread_cond_broadcast (&s->cond);
  lock_release (&s->lock);
}

void
qcow2_stream_pause (struct qcow2_stream *s, bool pause)
{
  lock_acquire (&s->lock);
  s->paused = pause;
  pthread_cond_broadcast (&s->cond);
  lock_release (&s->lock);
}

void
qcow2_stream_free (struct qcow2_stream *s)
{
  if (!s)
    return;
  if (s->started) {
    lock_acquire (&s->lock);
    s->stop = true;
    pthread_cond_broadcast (&s->cond);
    lock_release (&s->lock);
    pthread_join (s->thread, NULL);
  }
  lock_destroy (&s->lock);
  pthread_cond_destroy (&s->cond);
  free (s->base_name);
  free (s);
}

