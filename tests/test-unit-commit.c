/* SPDX-License-Identifier: BSD-3-Clause */
/* The commit job (qcow2_commit_*, common/qcow2/commit.c) over the
 * in-memory backend: the top's data copied into its base while a
 * client writes the top, checked byte for byte against a model of the
 * guest kept here; ready and complete; a cancel leaving the chain as
 * it read; a job stopped part-way and started again; refusals (a
 * shared base, a raw one, a size that differs, no base); a base with
 * an internal snapshot and a bitmap, which stay.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checked.h"
#include "qcow2.h"
#include "memio.h"
#include "imgbuild.h"
#include "crashio.h"
#include "unit.h"

#define SIZE (UINT64_C (6) << 20)

static const struct qcow2_options rw_opts;

/* A chain: base.qcow2 below top.qcow2 (or top1.qcow2), in me. */
struct chain {
  struct memenv *me;
  struct qcow2_env env;         /* memenv's, perhaps with a layers table */
  struct qcow2_layers *layers;
  uint8_t *model;               /* what the top's guest reads */
  uint64_t size;
  uint64_t top_cs;
  uint64_t rng;
  bool trim_zeroes;             /* a trim of the top reads zeros */
};

/* memenv's names are its files' identities. */
static char *
chain_identity (void *opaque, const char *path)
{
  return strdup (path);
}

static void
chain_init (struct chain *ch, uint64_t seed, bool layers)
{
  memset (ch, 0, sizeof *ch);
  ch->me = memenv_new ();
  ch->env = *memenv_env (ch->me);
  ch->env.identity = chain_identity;
  if (layers) {
    ch->layers = qcow2_layers_new (&ch->env);
    ch->env.layers = ch->layers;
  }
  ch->size = SIZE;
  ch->model = calloc (1, SIZE);
  ch->rng = seed | 1;
  ch->trim_zeroes = true;
  if (!ch->me || !ch->model || (layers && !ch->layers))
    abort ();
}

static void
chain_free (struct chain *ch)
{
  qcow2_layers_free (ch->layers);
  memenv_free (ch->me);
  free (ch->model);
}

/* A new empty image name in ch (over backing, if given). */
static void
make_image (struct chain *ch, const char *name,
            const struct qcow2_create_options *co)
{
  struct qcow2_io *io = memio_new (NULL, 0);

  if (!io || qcow2_create (&ch->env, io, co) < 0 ||
      memenv_add (ch->me, name, io) < 0) {
    fprintf (stderr, "making %s: %s\n", name, memenv_last_error (ch->me));
    exit (EXIT_FAILURE);
  }
  io->ops->close (io);
}

static struct qcow2_image *
open_image (struct chain *ch, const char *name,
            const struct qcow2_options *opts)
{
  char *id = NULL;
  struct qcow2_io *io = ch->env.open (ch->env.opaque, name, false, &id);

  free (id);
  if (!io)
    return NULL;
  return qcow2_open (&ch->env, io, name, opts ? opts : &rw_opts);
}

/* One random request within [lo, hi) of img, kept in the model:
 * mostly writes, some zeroes, some trims of whole clusters of the top.
 */
static int
random_op (struct chain *ch, struct qcow2_image *img, uint64_t lo,
           uint64_t hi, bool trims)
{
  static __thread uint8_t buf[3 << 16];
  uint64_t kind = unit_rnd (&ch->rng) % 10;
  uint64_t off = lo + unit_rnd (&ch->rng) % (hi - lo);
  uint64_t len = 1 + unit_rnd (&ch->rng) % MIN (sizeof buf, hi - off);
  uint64_t cs = ch->top_cs, first, end;
  int r;

  if (kind < 6) {
    for (uint64_t i = 0; i < len; i++)
      buf[i] = unit_rnd (&ch->rng) >> 24;
    if ((r = qcow2_write (img, buf, len, off, false)) == 0)
      memcpy (ch->model + off, buf, len);
    return r;
  }
  if (kind < 9 || !trims) {
    if ((r = qcow2_zero (img, len, off, kind == 8, false, false)) == 0)
      memset (ch->model + off, 0, len);
    return r;
  }
  first = (off + cs - 1) & ~(cs - 1);
  end = (off + len) & ~(cs - 1);
  if (end <= first)
    return 0;
  if ((r = qcow2_trim (img, end - first, first, false)) == 0 &&
      ch->trim_zeroes)
    memset (ch->model + first, 0, end - first);
  return r;
}

static void
random_ops (struct chain *ch, struct qcow2_image *img, unsigned n,
            uint64_t lo, uint64_t hi, bool trims)
{
  for (unsigned i = 0; i < n; i++)
    if (!CHECKF (random_op (ch, img, lo, hi, trims) == 0, "request %u: %s",
                 i, memenv_last_error (ch->me)))
      return;
}

/* Whether [off, off+len) of img reads as the model; only a failure
 * counts as a check.
 */
static bool
reads_model (struct chain *ch, struct qcow2_image *img, uint64_t off,
             uint64_t len, const char *what)
{
  uint8_t *got = malloc (len);
  bool ok = true;
  int r;

  if (!got)
    abort ();
  if ((r = qcow2_read (img, got, len, off)) < 0)
    ok = CHECKF (false, "%s: read failed: %s", what,
                 memenv_last_error (ch->me));
  else if (memcmp (got, ch->model + off, len) != 0) {
    uint64_t i = 0;
    while (got[i] == ch->model[off + i])
      i++;
    ok = CHECKF (false, "%s: byte %#" PRIx64 " reads %#x, the model %#x",
                 what, off + i, got[i], ch->model[off + i]);
  }
  free (got);
  return ok;
}

static void
check_model (struct chain *ch, struct qcow2_image *img, const char *what)
{
  if (reads_model (ch, img, 0, ch->size, what))
    CHECK (true);
}

/* No corruption, no leak. */
static void
check_clean (struct chain *ch, const char *name, const char *what)
{
  struct qcow2_image *img = open_image (ch, name, NULL);
  struct qcow2_check_result res;

  if (!CHECKF (img, "%s: %s opens: %s", what, name,
               memenv_last_error (ch->me)))
    return;
  CHECKF (qcow2_check (img, false, &res) == 0 && res.corruptions == 0 &&
          res.leaks == 0, "%s: %s: %" PRIu64 " corruptions, %" PRIu64
          " leaks", what, name, res.corruptions, res.leaks);
  CHECK_INT (qcow2_close (img), 0);
}

/* What a test's chain is made of. */
struct shape {
  const char *name;
  unsigned base_bits, top_bits;
  bool top_ext_l2, top_compress, base_v2, base_lazy;
};

/* base.qcow2 written by random requests (the model follows), then an
 * empty top.qcow2 over it, opened with opts.
 */
static struct qcow2_image *
chain_make (struct chain *ch, const struct shape *s,
            const struct qcow2_options *opts)
{
  struct qcow2_create_options base = {
    .size = ch->size, .cluster_size = UINT64_C (1) << s->base_bits,
    .compat_v2 = s->base_v2, .lazy_refcounts = s->base_lazy,
  };
  struct qcow2_create_options top = {
    .size = ch->size, .cluster_size = UINT64_C (1) << s->top_bits,
    .extended_l2 = s->top_ext_l2, .backing = "base.qcow2",
    .backing_format = "qcow2",
  };
  struct qcow2_image *img;

  make_image (ch, "base.qcow2", &base);
  ch->top_cs = base.cluster_size;
  if ((img = open_image (ch, "base.qcow2", NULL))) {
    random_ops (ch, img, 150, 0, ch->size, true);
    CHECK_INT (qcow2_close (img), 0);
  }
  make_image (ch, "top.qcow2", &top);
  ch->top_cs = top.cluster_size;
  img = open_image (ch, "top.qcow2", opts);
  CHECKF (img, "%s: top opens: %s", s->name, memenv_last_error (ch->me));
  return img;
}

/* A client writing the first half of the top while the job runs. */
struct writer {
  struct chain *ch;
  struct qcow2_image *img;
  unsigned busy, n;
  int r;
};

static void *
writer_thread (void *arg)
{
  struct writer *w = arg;

  for (unsigned i = 0; i < w->n && w->r == 0; i++) {
    __atomic_add_fetch (&w->busy, 1, __ATOMIC_RELAXED);
    w->r = random_op (w->ch, w->img, 0, w->ch->size / 2, true);
    __atomic_sub_fetch (&w->busy, 1, __ATOMIC_RELAXED);
    if (i % 16 == 0)
      usleep (1000);
  }
  return NULL;
}

static void
sleep_ms (unsigned ms)
{
  struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000 };

  nanosleep (&ts, NULL);
}

/* Wait (some seconds at most) until the job is ready. */
static bool
wait_ready (struct qcow2_commit *c, struct qcow2_commit_progress *p)
{
  for (unsigned i = 0; i < 30000; i++) {
    qcow2_commit_progress (c, p);
    if (p->ready || p->state == QCOW2_COMMIT_FAILED)
      break;
    sleep_ms (1);
  }
  return p->ready;
}

/* The commit of a chain of shape s while a client writes: the top's
 * first half written meanwhile, the second half read (it reads the
 * base where the top has nothing, through the base opened again).
 */
static void
test_live (const struct shape *s, uint64_t seed)
{
  struct qcow2_options opts = { .compress = s->top_compress,
                                .compress_type = -1 };
  struct qcow2_commit_progress p;
  struct qcow2_commit *c;
  struct qcow2_image *img, *base;
  struct chain ch;
  struct writer w;
  pthread_t t;

  chain_init (&ch, seed, false);
  if (!(img = chain_make (&ch, s, &opts)))
    goto out;
  random_ops (&ch, img, 200, 0, ch.size, true);
  w = (struct writer) { .ch = &ch, .img = img, .n = 400 };
  c = qcow2_commit_new (img, &(struct qcow2_commit_options) {
                                .busy = &w.busy });
  if (!CHECKF (c, "%s: job: %s", s->name, memenv_last_error (ch.me)))
    goto close;
  qcow2_commit_progress (c, &p);
  CHECK_INT (p.state, QCOW2_COMMIT_CREATED);
  CHECK_INT (qcow2_commit_complete (c), -EBUSY);        /* not ready */
  CHECKF (qcow2_commit_start (c) == 0, "%s: start: %s", s->name,
          memenv_last_error (ch.me));
  pthread_create (&t, NULL, writer_thread, &w);
  for (unsigned i = 0; i < 20; i++)
    if (!reads_model (&ch, img, ch.size / 2, ch.size / 2, "second half"))
      break;
  pthread_join (t, NULL);
  CHECKF (w.r == 0, "%s: the client's requests: %s", s->name,
          memenv_last_error (ch.me));
  CHECK (true);
  CHECKF (wait_ready (c, &p), "%s: ready: state %d, %s", s->name, p.state,
          memenv_last_error (ch.me));
  CHECK (p.offset > 0 && p.len >= p.offset);
  /* Ready stays so while clients write more. */
  random_ops (&ch, img, 50, 0, ch.size, true);
  qcow2_commit_progress (c, &p);
  CHECK (p.ready);
  check_model (&ch, img, "the chain, ready");
  CHECKF (qcow2_commit_complete (c) == 0, "%s: complete: %s", s->name,
          memenv_last_error (ch.me));
  qcow2_commit_progress (c, &p);
  CHECK_INT (p.state, QCOW2_COMMIT_COMPLETED);
  CHECK_EQ (p.len, p.offset);
  qcow2_commit_free (c);
 close:
  CHECK_INT (qcow2_close (img), 0);
  /* The base alone holds the disk; the old top over it reads the same. */
  if ((base = open_image (&ch, "base.qcow2", NULL))) {
    check_model (&ch, base, s->name);
    qcow2_close (base);
  }
  check_clean (&ch, "base.qcow2", s->name);
  if ((img = open_image (&ch, "top.qcow2", NULL))) {
    check_model (&ch, img, "the old chain");
    qcow2_close (img);
  }
 out:
  chain_free (&ch);
}

/* A job stopped before its end (a cancel) leaves the chain reading as
 * it did; started again, a job finishes.
 */
static void
test_cancel_restart (void)
{
  const struct shape s = { "cancel", 14, 16, false, false, false, false };
  struct qcow2_commit_progress p;
  struct qcow2_commit *c;
  struct qcow2_image *img, *base;
  struct chain ch;

  chain_init (&ch, 77, false);
  if (!(img = chain_make (&ch, &s, NULL)))
    goto out;
  random_ops (&ch, img, 300, 0, ch.size, true);
  /* Slow: 1 MiB/s, so that it is stopped part-way. */
  c = qcow2_commit_new (img, &(struct qcow2_commit_options) {
                                .rate = 1 << 20 });
  if (c && CHECK (qcow2_commit_start (c) == 0)) {
    for (unsigned i = 0; i < 2000; i++) {
      qcow2_commit_progress (c, &p);
      if (p.offset > 0)
        break;
      sleep_ms (1);
    }
    CHECK (p.offset > 0 && !p.ready);
    random_ops (&ch, img, 30, 0, ch.size, true);
    /* Paused, it copies nothing. */
    qcow2_commit_pause (c, true);
    sleep_ms (200);             /* a step in flight ends */
    qcow2_commit_progress (c, &p);
    uint64_t at = p.offset;
    sleep_ms (200);
    qcow2_commit_progress (c, &p);
    CHECKF (p.paused && p.offset == at, "paused %d offset %" PRIu64 " then %" PRIu64 " state %d", p.paused, at, p.offset, p.state);
    qcow2_commit_pause (c, false);
  }
  qcow2_commit_free (c);
  check_model (&ch, img, "the chain after a cancel");
  CHECK_INT (qcow2_close (img), 0);
  check_clean (&ch, "base.qcow2", "after a cancel");
  if (!(img = open_image (&ch, "top.qcow2", NULL)))
    goto out;
  check_model (&ch, img, "the chain opened again after a cancel");

  /* Again, faster, to the end: run in this thread this time. */
  c = qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 });
  CHECKF (c && qcow2_commit_run (c) == 0, "run: %s",
          memenv_last_error (ch.me));
  /* In sync, with no job thread: a client's writes copy what they
   * change into the base themselves, and leave the job nothing.
   */
  if (c) {
    static uint8_t buf[100000];

    for (unsigned i = 0; i < 20; i++) {
      uint64_t off = unit_rnd (&ch.rng) % (ch.size - sizeof buf);

      memset (buf, 0x40 + i, sizeof buf);
      if (!CHECK_INT (qcow2_write (img, buf, sizeof buf, off, false), 0))
        break;
      memcpy (ch.model + off, buf, sizeof buf);
    }
    qcow2_commit_progress (c, &p);
    CHECKF (p.len == p.offset, "after writes in sync, %" PRIu64 " bytes "
            "left to copy", p.len - p.offset);
  }
  random_ops (&ch, img, 40, 0, ch.size, true);
  CHECK_INT (qcow2_commit_complete (c), 0);
  qcow2_commit_free (c);
  CHECK_INT (qcow2_close (img), 0);
  if ((base = open_image (&ch, "base.qcow2", NULL))) {
    check_model (&ch, base, "the base after a restart");
    qcow2_close (base);
  }
  check_clean (&ch, "base.qcow2", "after a restart");
 out:
  chain_free (&ch);
}

/* A top opened over base.qcow2 as name (made first if make). */
static struct qcow2_image *
open_top (struct chain *ch, const char *name, bool make)
{
  const struct qcow2_create_options co = {
    .size = ch->size, .backing = "base.qcow2", .backing_format = "qcow2",
  };

  if (make)
    make_image (ch, name, &co);
  return open_image (ch, name, NULL);
}

/* A base that another open image stands on is refused, and while the
 * job runs no image may stand on it; after the job it is shared again.
 */
static void
test_shared (void)
{
  const struct qcow2_create_options bco = { .size = SIZE };
  struct qcow2_image *img, *other;
  struct qcow2_commit *c;
  struct chain ch;

  chain_init (&ch, 5, true);
  make_image (&ch, "base.qcow2", &bco);
  img = open_top (&ch, "top.qcow2", true);
  other = open_top (&ch, "top1.qcow2", true);
  if (!CHECKF (img && other, "open: %s", memenv_last_error (ch.me)))
    goto out;
  memenv_clear_errors (ch.me);
  c = qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 });
  CHECK (c == NULL && errno == EBUSY);
  CHECKF (strstr (memenv_last_error (ch.me), "backing file of another "
                  "image"), "message: %s", memenv_last_error (ch.me));

  /* Made while alone, but another came before the start. */
  qcow2_close (other);
  c = qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 });
  CHECK (c != NULL);
  other = open_top (&ch, "top1.qcow2", false);
  CHECK (other != NULL);
  if (c)
    CHECK_INT (qcow2_commit_start (c), -EBUSY);
  qcow2_commit_free (c);
  qcow2_close (other);

  /* Alone: the job runs, and the base is no one's layer meanwhile. */
  c = qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 });
  CHECKF (c && qcow2_commit_run (c) == 0, "run: %s",
          memenv_last_error (ch.me));
  CHECK (!qcow2_layers_has (ch.layers, "base.qcow2"));
  memenv_clear_errors (ch.me);
  other = open_top (&ch, "top1.qcow2", false);
  CHECK (other == NULL && errno == EBUSY);
  CHECKF (strstr (memenv_last_error (ch.me), "open here for writing"),
          "message: %s", memenv_last_error (ch.me));
  /* A second job on the same image is refused. */
  CHECK (qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 })
         == NULL && errno == EBUSY);
  qcow2_commit_free (c);
  CHECK (qcow2_layers_has (ch.layers, "base.qcow2"));
  other = open_top (&ch, "top1.qcow2", false);
  CHECKF (other != NULL, "shared again: %s", memenv_last_error (ch.me));
  qcow2_close (other);
  qcow2_close (img);
  /* And once no image stands on it, it may be written. */
  other = open_image (&ch, "base.qcow2", NULL);
  CHECK (other != NULL);
  qcow2_close (other);
 out:
  chain_free (&ch);
}

/* What cannot be committed: no base, a raw base, a base of another
 * size, a read-only top.
 */
static void
test_refused (void)
{
  const uint8_t raw[4096] = { 1 };
  struct qcow2_create_options co = { .size = SIZE };
  struct qcow2_options ro = { .readonly = true };
  struct qcow2_image *img;
  struct chain ch;

  chain_init (&ch, 9, false);
  make_image (&ch, "alone.qcow2", &co);
  if ((img = open_image (&ch, "alone.qcow2", NULL))) {
    CHECK (!qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 }) &&
           errno == ENOENT);
    qcow2_close (img);
  }

  {
    struct qcow2_io *io = memio_new (raw, sizeof raw);
    memenv_add (ch.me, "base.raw", io);
    io->ops->close (io);
  }
  co = (struct qcow2_create_options) { .size = sizeof raw,
    .backing = "base.raw", .backing_format = "raw" };
  make_image (&ch, "over-raw.qcow2", &co);
  if ((img = open_image (&ch, "over-raw.qcow2", NULL))) {
    memenv_clear_errors (ch.me);
    CHECK (!qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 }) &&
           errno == ENOTSUP);
    CHECKF (strstr (memenv_last_error (ch.me), "a raw image"),
            "message: %s", memenv_last_error (ch.me));
    qcow2_close (img);
  }

  co = (struct qcow2_create_options) { .size = SIZE / 2 };
  make_image (&ch, "base.qcow2", &co);
  if ((img = open_top (&ch, "top.qcow2", true))) {
    CHECK (!qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 }) &&
           errno == EINVAL);
    qcow2_close (img);
  }
  if ((img = open_image (&ch, "top.qcow2", &ro))) {
    CHECK (!qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 }) &&
           errno == EROFS);
    qcow2_close (img);
  }
  chain_free (&ch);
}

/* A base with an internal snapshot (its L2 tables shared, as qemu-img
 * snapshot leaves them) and a persistent bitmap: the commit copies on
 * write what the snapshot shares, which reads as before.
 */
static void
test_snapshot_base (void)
{
  const struct shape s = { "snapshot", 16, 16, false, false, false, false };
  struct qcow2_options snap = { .snapshot = "snap1", .readonly = true };
  struct qcow2_image *img;
  struct qcow2_commit *c;
  struct model before;
  struct chain ch;
  struct ib ib;

  chain_init (&ch, 31, false);
  ib_init (&ib, 3, s.base_bits, ch.size, false);
  for (uint64_t k = 0; k < ch.size >> s.base_bits; k += 3)
    ib_data (&ib, k, 100 + k);
  ib.share_l2 = true;
  ib_snapshot (&ib, "1", "snap1", 0, true);
  ib_bitmap (&ib, "b0", 16, 2, 7);
  ib_finish (&ib);
  model_fill (&ib.model, ch.model, ch.size, 0);
  model_copy (&before, &ib.model);
  {
    struct qcow2_io *io = memio_new (ib.buf, ib.len);
    memenv_add (ch.me, "base.qcow2", io);
    io->ops->close (io);
  }
  ch.top_cs = 1 << s.top_bits;
  if (!(img = open_top (&ch, "top.qcow2", true)))
    goto out;
  random_ops (&ch, img, 300, 0, ch.size, true);
  c = qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 });
  CHECKF (c && qcow2_commit_run (c) == 0 && qcow2_commit_complete (c) == 0,
          "commit: %s", memenv_last_error (ch.me));
  qcow2_commit_free (c);
  qcow2_close (img);
  if ((img = open_image (&ch, "base.qcow2", NULL))) {
    check_model (&ch, img, "a base with a snapshot");
    qcow2_close (img);
  }
  check_clean (&ch, "base.qcow2", "a base with a snapshot");
  if ((img = open_image (&ch, "base.qcow2", &snap))) {
    uint8_t *want = malloc (ch.size);
    model_fill (&before, want, ch.size, 0);
    memcpy (ch.model, want, ch.size);
    check_model (&ch, img, "the snapshot, after the commit");
    free (want);
    qcow2_close (img);
  }
 out:
  model_free (&before);
  ib_free (&ib);
  chain_free (&ch);
}

/* The base as a crashio, whose hook may fail the base's host writes,
 * and whose opens fail while fail_opens says (of writers only, if
 * fail_rw_only).
 */
static struct crashio *hooked_base;
static unsigned fail_opens, fail_writes;
static int fail_errno;
static bool fail_rw_only;
static struct qcow2_io *(*hooked_real_open) (void *opaque, const char *path,
                                             bool readonly, char **id);

static struct qcow2_io *
hooked_open (void *opaque, const char *path, bool readonly, char **id)
{
  if (strcmp (path, "base.qcow2") != 0)
    return hooked_real_open (opaque, path, readonly, id);
  if (fail_opens && (!readonly || !fail_rw_only)) {
    fail_opens--;
    *id = strdup ("refused by the test");
    errno = EACCES;
    return NULL;
  }
  *id = strdup (path);
  return crashio_io (hooked_base);
}

static int
hooked_hook (void *opaque, enum crashio_op op, uint64_t offset,
             uint64_t count)
{
  if (op != CRASHIO_PWRITE || !fail_writes)
    return 0;
  fail_writes--;
  return fail_errno;
}

/* The job's state, once it is one of the two (some seconds at most). */
static enum qcow2_commit_state
wait_state (struct qcow2_commit *c, enum qcow2_commit_state a, bool ready,
            struct qcow2_commit_progress *p)
{
  for (unsigned i = 0; i < 30000; i++) {
    qcow2_commit_progress (c, p);
    if (p->state == a || (ready && p->ready))
      break;
    sleep_ms (1);
  }
  return p->state;
}

/* The base cannot be opened for writing, or not even again; the base's
 * writes fail for want of space, or once: the job fails or retries,
 * and the chain reads as it did.
 */
static void
test_failures (void)
{
  const struct shape s = { "failures", 16, 16, false, false, false, false };
  struct qcow2_commit_progress p;
  struct qcow2_commit *c;
  struct qcow2_image *img;
  struct chain ch;
  size_t len;
  char *id;
  struct qcow2_io *io;
  uint8_t *bytes;

  chain_init (&ch, 55, false);
  if (!(img = chain_make (&ch, &s, NULL)))
    goto out;
  random_ops (&ch, img, 200, 0, ch.size, true);
  qcow2_close (img);
  io = ch.env.open (ch.env.opaque, "base.qcow2", true, &id);
  free (id);
  len = io->ops->size (io);
  bytes = malloc (len);
  io->ops->pread (io, bytes, len, 0);
  io->ops->close (io);
  hooked_base = crashio_new (bytes, len);
  free (bytes);
  crashio_set_hook (hooked_base, hooked_hook, NULL);
  hooked_real_open = ch.env.open;
  ch.env.open = hooked_open;
  if (!(img = open_image (&ch, "top.qcow2", NULL)))
    goto out;

  /* Not for writing: the job fails, the base read-only as before. */
  fail_opens = 1;
  fail_rw_only = true;
  memenv_clear_errors (ch.me);
  c = qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 });
  CHECK (c && qcow2_commit_start (c) == -EACCES);
  CHECKF (strstr (memenv_last_error (ch.me), "cannot be written"),
          "message: %s", memenv_last_error (ch.me));
  qcow2_commit_progress (c, &p);
  CHECK (p.state == QCOW2_COMMIT_FAILED && p.error == -EACCES);
  CHECK_INT (qcow2_commit_complete (c), -EACCES);
  qcow2_commit_free (c);
  check_model (&ch, img, "after a base refused for writing");

  /* No space: the job stops; started again with room, it finishes. */
  fail_writes = 1000000;
  fail_errno = ENOSPC;
  c = qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 });
  CHECK (c && qcow2_commit_start (c) == 0);
  CHECK_INT (wait_state (c, QCOW2_COMMIT_FAILED, false, &p),
             QCOW2_COMMIT_FAILED);
  CHECK_INT (p.error, -ENOSPC);
  qcow2_commit_free (c);
  check_model (&ch, img, "after no space in the base");
  /* A write failing once: retried (after a second), the job ends. */
  fail_writes = 1;
  fail_errno = EIO;
  c = qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 });
  CHECK (c && qcow2_commit_start (c) == 0);
  CHECK_INT (wait_state (c, QCOW2_COMMIT_WAITING, false, &p),
             QCOW2_COMMIT_WAITING);
  CHECKF (wait_ready (c, &p), "ready after a retry: state %d", p.state);
  CHECK_INT (qcow2_commit_complete (c), 0);
  qcow2_commit_free (c);
  check_model (&ch, img, "after a retried write");

  /* Not even read-only again: reads of the base fail, clearly (a top
   * with nothing of its own reads all from it).
   */
  qcow2_close (img);
  if (!(img = open_top (&ch, "top1.qcow2", true)))
    goto out;
  fail_opens = 2;
  fail_rw_only = false;
  c = qcow2_commit_new (img, &(struct qcow2_commit_options) { 0 });
  CHECK (c && qcow2_commit_start (c) == -EACCES);
  qcow2_commit_free (c);
  {
    uint8_t b[512];

    memenv_clear_errors (ch.me);
    CHECK_INT (qcow2_read (img, b, sizeof b, 0), -EIO);
    CHECKF (strstr (memenv_last_error (ch.me), "reading"), "message: %s",
            memenv_last_error (ch.me));
  }
  qcow2_close (img);
 out:
  crashio_free (hooked_base);
  hooked_base = NULL;
  chain_free (&ch);
}

int
main (void)
{
  static const struct shape shapes[] = {
    { "same clusters", 16, 16, false, false, false, false },
    { "base clusters larger", 17, 13, false, false, false, false },
    { "base clusters smaller", 12, 16, false, false, false, false },
    { "top extended L2", 16, 17, true, false, false, false },
    { "top compressed", 15, 16, false, true, false, false },
    { "base v2", 16, 16, false, false, true, false },
    { "base lazy refcounts", 16, 15, false, false, false, true },
  };

  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    test_live (&shapes[i], 1000 + i);
  test_cancel_restart ();
  test_shared ();
  test_refused ();
  test_snapshot_base ();
  test_failures ();
  return unit_finish ();
}
