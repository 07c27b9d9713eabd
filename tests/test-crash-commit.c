/* SPDX-License-Identifier: BSD-3-Clause */
/* A crash at every host write, punch and flush of a commit (its copy,
 * the guest's writes after ready, the completion, the base made
 * read-only again): the base's file is recorded (crashio.h), and at
 * each of those points the images a crash could leave (what was
 * flushed, plus none, all, or random torn subsets of the writes since)
 * are checked:
 *
 *  - the chain (the top as flushed over the crashed base) reads every
 *    byte the model of the guest says;
 *  - the base has no corruption, by our check (leaks allowed: a crash
 *    leaks what was allocated and not yet pointed at) and, on a
 *    sample, by qemu-img check;
 *  - a commit started again over them finishes, and the base alone
 *    then reads the model, with no corruption.
 *
 * The job runs in this thread (qcow2_commit_run), so that every point
 * is the same from one run to the next.  COMMIT_CRASH_QEMU_EVERY=N
 * runs qemu-img check on every Nth image (default 10; 0: never).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "errstr.h"
#include "qcow2.h"
#include "memio.h"
#include "crashio.h"
#include "crashcheck.h"
#include "imgbuild.h"

#define SIZE (UINT64_C (1) << 20)

/* What a chain is made of. */
struct config {
  const char *name;
  unsigned base_bits, top_bits;
  bool base_lazy, base_snapshot, base_ext_l2;
};

/* The run: the files, the guest's model, what was found. */
struct run {
  const struct config *cfg;
  struct crashio *base, *top;
  uint8_t *model;
  uint64_t rng;
  uint64_t points, images, restarts, qemu;
  bool failed;
  char why[1024];
};

static unsigned qemu_every = 10;
static uint8_t *image_buf;
static size_t image_cap;

static uint64_t
rnd (uint64_t *s)
{
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void __attribute__ ((format (printf, 2, 3)))
run_fail (struct run *run, const char *fmt, ...)
{
  va_list ap;

  if (run->failed)
    return;
  run->failed = true;
  va_start (ap, fmt);
  vsnprintf (run->why, sizeof run->why, fmt, ap);
  va_end (ap);
}

/* The live run's environment: the two recorded files by name. */
static struct run *env_run;
static char env_error[1024];

static struct qcow2_io *
env_open (void *opaque, const char *path, bool readonly, char **id)
{
  struct crashio *c = strcmp (path, "base.qcow2") == 0 ? env_run->base
                      : strcmp (path, "top.qcow2") == 0 ? env_run->top
                      : NULL;

  *id = NULL;
  if (!c) {
    errno = ENOENT;
    return NULL;
  }
  *id = strdup (path);
  return crashio_io (c);
}

static void
env_err (void *opaque, const char *msg)
{
  snprintf (env_error, sizeof env_error, "%s", msg);
}

static const struct qcow2_env live_env = {
  .open = env_open, .error = env_err,
};
static const struct qcow2_options rw_opts;

/* A copy of the files in a fresh in-memory environment. */
static struct memenv *
files_env (const uint8_t *base, size_t blen, const uint8_t *top, size_t tlen)
{
  struct memenv *me = memenv_new ();
  struct qcow2_io *b = memio_new (base, blen), *t = memio_new (top, tlen);

  if (!me || !b || !t || memenv_add (me, "base.qcow2", b) < 0 ||
      memenv_add (me, "top.qcow2", t) < 0)
    abort ();
  b->ops->close (b);
  t->ops->close (t);
  return me;
}

static struct qcow2_image *
open_in (struct memenv *me, const char *name, bool readonly)
{
  const struct qcow2_env *env = memenv_env (me);
  const struct qcow2_options opts = { .readonly = readonly };
  char *id = NULL;
  struct qcow2_io *io = env->open (env->opaque, name, readonly, &id);

  free (id);
  return io ? qcow2_open (env, io, name, &opts) : NULL;
}

/* Whether img reads as the model, else why in the run. */
static bool
reads_model (struct run *run, struct qcow2_image *img, const char *what)
{
  static uint8_t got[SIZE];
  uint64_t i = 0;
  int r = qcow2_read (img, got, SIZE, 0);

  if (r < 0) {
    run_fail (run, "%s: read failed: %s", what, errstr (-r));
    return false;
  }
  if (memcmp (got, run->model, SIZE) == 0)
    return true;
  while (got[i] == run->model[i])
    i++;
  run_fail (run, "%s: guest byte %#" PRIx64 " reads %#x, not %#x", what, i,
            got[i], run->model[i]);
  return false;
}

/* No corruption in the base (an image left dirty by lazy refcounts has
 * its refcounts rebuilt first, as its next read-write open would).
 */
static bool
base_sound (struct run *run, struct memenv *me, bool dirty, const char *what)
{
  struct qcow2_check_result res;
  struct qcow2_image *img = open_in (me, "base.qcow2", !dirty);
  int r;

  if (!img) {
    run_fail (run, "%s: the base does not open: %s", what,
              memenv_last_error (me));
    return false;
  }
  r = qcow2_check (img, dirty, &res);
  qcow2_close (img);
  if (r < 0 || res.corruptions) {
    run_fail (run, "%s: check of the base: %d, %" PRIu64 " corruptions: %s",
              what, r, res.corruptions, memenv_last_error (me));
    return false;
  }
  return true;
}

/* A commit started again over the files in me finishes: the base alone
 * then reads the model.
 */
static bool
restart (struct run *run, struct memenv *me, const char *what)
{
  struct qcow2_image *img = open_in (me, "top.qcow2", false);
  struct qcow2_commit *c;
  int r = -EIO;

  run->restarts++;
  if (img && (c = qcow2_commit_new (img, &(struct qcow2_commit_options) {
                                            0 }))) {
    r = qcow2_commit_run (c);
    if (r == 0)
      r = qcow2_commit_complete (c);
    qcow2_commit_free (c);
  }
  if (img && qcow2_close (img) < 0)
    r = -EIO;
  if (r < 0) {
    run_fail (run, "%s: the commit started again fails: %s", what,
              memenv_last_error (me));
    return false;
  }
  img = open_in (me, "base.qcow2", true);
  if (!img) {
    run_fail (run, "%s: the base does not open after the commit: %s", what,
              memenv_last_error (me));
    return false;
  }
  bool ok = reads_model (run, img, what);
  qcow2_close (img);
  return ok && base_sound (run, me, false, what);
}

/* The images a crash now could leave, kept as keep says, checked. */
static void
try_image (struct run *run, const uint8_t *keep, const char *how)
{
  size_t blen, tlen;
  const uint8_t *top = crashio_durable (run->top, &tlen);
  struct qcow2_image *img;
  struct memenv *me;
  char what[128];

  crashio_crash_image (run->base, keep, &image_buf, &image_cap, &blen);
  snprintf (what, sizeof what, "%s, crash at host op %" PRIu64 " (%s)",
            run->cfg->name, run->points, how);
  run->images++;
  me = files_env (image_buf, blen, top, tlen);
  if (!(img = open_in (me, "top.qcow2", true)))
    run_fail (run, "%s: the chain does not open: %s", what,
              memenv_last_error (me));
  else {
    reads_model (run, img, what);
    qcow2_close (img);
  }
  if (!run->failed && qemu_every && run->images % qemu_every == 0 &&
      !crashcheck_dirty (image_buf, blen)) {
    char out[4096];
    int st = crashcheck_qemu ((struct wl_files) { .image = image_buf,
                                                   .len = blen }, out,
                              sizeof out);

    run->qemu++;
    /* 0: clean; 3: leaks only. */
    if (st != 0 && st != 3)
      run_fail (run, "%s: qemu-img check of the base: exit %d:\n%s", what,
                st, out);
  }
  if (!run->failed)
    base_sound (run, me, crashcheck_dirty (image_buf, blen), what);
  if (!run->failed && run->images % 4 == 0)
    restart (run, me, what);
  memenv_free (me);
}

/* Before each host write, punch and flush of the base: the images of a
 * crash there.
 */
static int
crash_hook (void *opaque, enum crashio_op op, uint64_t offset,
            uint64_t count)
{
  struct run *run = opaque;
  size_t n = crashio_nr_pieces (run->base);
  uint8_t *keep;

  if (op == CRASHIO_PREAD || run->failed)
    return 0;
  keep = calloc (1, n / 8 + 1);
  if (!keep)
    abort ();
  try_image (run, keep, "none of the writes since the flush");
  if (n > 0 && !run->failed) {
    memset (keep, 0xff, n / 8 + 1);
    try_image (run, keep, "all of them");
  }
  for (int k = 0; k < 2 && n > 1 && !run->failed; k++) {
    for (size_t i = 0; i < n; i++)
      crashio_set_bit (keep, i, rnd (&run->rng) & 1);
    try_image (run, keep, "torn: a random subset of the sectors");
  }
  free (keep);
  run->points++;
  return 0;
}

/* One random request of the guest within the disk, kept in the model
 * (a write's as it starts, see there; the others' once done); writes
 * flushed (fua) when fua, so that the top's flushed state holds every
 * one.
 */
static int
guest_op (struct run *run, struct qcow2_image *img, uint64_t cs, bool fua)
{
  static uint8_t buf[3 << 14];
  uint64_t kind = rnd (&run->rng) % 8;
  uint64_t off = rnd (&run->rng) % SIZE;
  uint64_t len = 1 + rnd (&run->rng) % MIN (sizeof buf, SIZE - off);
  uint64_t first = (off + cs - 1) & ~(cs - 1), end = (off + len) & ~(cs - 1);
  int r;

  if (kind < 5) {
    for (uint64_t i = 0; i < len; i++)
      buf[i] = rnd (&run->rng) >> 24;
    /* The model first: during a commit the write, once in the top
     * (flushed when fua), is copied into the base, and a crash there
     * must find it.  A write that fails ends the run.
     */
    memcpy (run->model + off, buf, len);
    r = qcow2_write (img, buf, len, off, fua);
  }
  else if (kind < 7 || end <= first) {
    if ((r = qcow2_zero (img, len, off, kind == 6, false, fua)) == 0)
      memset (run->model + off, 0, len);
  }
  else if ((r = qcow2_trim (img, end - first, first, fua)) == 0)
    memset (run->model + first, 0, end - first);
  return r;
}

/* The image made by create options co in a memio, then written by n
 * requests (the model follows): its bytes.  Over base, if given.
 */
static uint8_t *
build (struct run *run, const struct qcow2_create_options *co,
       const uint8_t *base, size_t blen, unsigned n, size_t *len)
{
  struct memenv *me = files_env (base ? base : (const uint8_t *) "", blen,
                                 (const uint8_t *) "", 0);
  struct qcow2_io *io = memio_new (NULL, 0), *ref = memio_ref (io);
  struct qcow2_image *img = NULL;
  const void *data;
  uint8_t *copy;

  if (qcow2_create (memenv_env (me), io, co) < 0 ||
      !(img = qcow2_open (memenv_env (me), io, co->backing ? "top.qcow2"
                                                            : "base.qcow2",
                          &rw_opts))) {
    fprintf (stderr, "%s: building: %s\n", run->cfg->name,
             memenv_last_error (me));
    exit (EXIT_FAILURE);
  }
  for (unsigned i = 0; i < n; i++)
    if (guest_op (run, img, co->cluster_size, false) < 0)
      abort ();
  if (qcow2_close (img) < 0)
    abort ();
  data = memio_data (ref, len);
  if (!(copy = malloc (*len)))
    abort ();
  memcpy (copy, data, *len);
  ref->ops->close (ref);
  memenv_free (me);
  return copy;
}

/* A base with an internal snapshot sharing its L2 tables (as qemu-img
 * snapshot leaves them), and data in every third cluster.
 */
static uint8_t *
build_snapshot_base (struct run *run, size_t *len)
{
  struct ib ib;
  uint8_t *copy;

  ib_init (&ib, 3, run->cfg->base_bits, SIZE, false);
  for (uint64_t k = 0; k < SIZE >> run->cfg->base_bits; k += 3)
    ib_data (&ib, k, 500 + k);
  ib.share_l2 = true;
  ib_snapshot (&ib, "1", "before", 0, true);
  ib_finish (&ib);
  model_fill (&ib.model, run->model, SIZE, 0);
  if (!(copy = malloc (ib.len)))
    abort ();
  memcpy (copy, ib.buf, ib.len);
  *len = ib.len;
  ib_free (&ib);
  return copy;
}

/* The commit of cfg's chain, crashed at every host operation on the
 * base.  Returns whether all held.
 */
static bool
run_config (const struct config *cfg, uint64_t seed)
{
  struct run run = { .cfg = cfg, .rng = seed | 1 };
  const struct qcow2_create_options bco = {
    .size = SIZE, .cluster_size = UINT64_C (1) << cfg->base_bits,
    .lazy_refcounts = cfg->base_lazy, .extended_l2 = cfg->base_ext_l2,
  };
  const struct qcow2_create_options tco = {
    .size = SIZE, .cluster_size = UINT64_C (1) << cfg->top_bits,
    .backing = "base.qcow2", .backing_format = "qcow2",
  };
  struct qcow2_image *img = NULL;
  struct qcow2_commit *c = NULL;
  uint8_t *base, *top;
  size_t blen, tlen;
  int r = 0;

  if (!(run.model = calloc (1, SIZE)))
    abort ();
  base = cfg->base_snapshot ? build_snapshot_base (&run, &blen)
    : build (&run, &bco, NULL, 0, 60, &blen);
  /* The top leaves much to the base: ranges to keep as they are. */
  top = build (&run, &tco, base, blen, 30, &tlen);
  run.base = crashio_new (base, blen);
  run.top = crashio_new (top, tlen);
  env_run = &run;
  img = qcow2_open (&live_env, crashio_io (run.top), "top.qcow2", &rw_opts);
  if (!img || !(c = qcow2_commit_new (img, &(struct qcow2_commit_options) {
                                              0 }))) {
    fprintf (stderr, "%s: %s\n", cfg->name, env_error);
    exit (EXIT_FAILURE);
  }
  crashio_set_hook (run.base, crash_hook, &run);
  r = qcow2_commit_run (c);
  /* Ready: the guest writes more, each flushed; then the end. */
  for (unsigned i = 0; i < 40 && r == 0 && !run.failed; i++)
    r = guest_op (&run, img, tco.cluster_size, true);
  if (r == 0 && !run.failed)
    r = qcow2_commit_complete (c);
  qcow2_commit_free (c);
  if (qcow2_close (img) < 0 && r == 0)
    r = -EIO;
  crashio_set_hook (run.base, NULL, NULL);
  if (r < 0)
    run_fail (&run, "%s: the commit failed: %s: %s", cfg->name, errstr (-r),
              env_error);
  if (!run.failed) {
    /* No crash: the base alone holds the disk, clean. */
    const uint8_t *b = crashio_data (run.base, &blen);
    const uint8_t *t = crashio_data (run.top, &tlen);
    struct memenv *me = files_env (b, blen, t, tlen);

    if ((img = open_in (me, "base.qcow2", true))) {
      reads_model (&run, img, "the base at the end");
      qcow2_close (img);
    }
    else
      run_fail (&run, "the base does not open at the end");
    base_sound (&run, me, false, "the base at the end");
    memenv_free (me);
  }
  printf ("%s: %" PRIu64 " crash points, %" PRIu64 " images, %" PRIu64
          " commits started again, %" PRIu64 " qemu-img checks: %s\n",
          cfg->name, run.points, run.images, run.restarts, run.qemu,
          run.failed ? "FAILED" : "all held");
  if (run.failed)
    fprintf (stderr, "%s\n", run.why);
  crashio_free (run.base);
  crashio_free (run.top);
  free (base);
  free (top);
  free (run.model);
  return !run.failed;
}

int
main (void)
{
  static const struct config configs[] = {
    { "same clusters", 12, 12, false, false, false },
    { "base clusters larger", 14, 12, false, false, false },
    { "base lazy refcounts", 12, 13, true, false, false },
    { "base with a snapshot", 13, 12, false, true, false },
    { "base extended L2", 15, 12, false, false, true },
  };
  const char *e = getenv ("COMMIT_CRASH_QEMU_EVERY");
  bool ok = true;

  if (e)
    qemu_every = strtoul (e, NULL, 10);
  crashcheck_init ();
  for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
    ok &= run_config (&configs[i], 0x5eed + i);
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
