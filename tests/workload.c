/* SPDX-License-Identifier: BSD-3-Clause */
/* Random write workloads (see workload.h): the initial images, the
 * runner, and the model of what the requests leave.  The
 * configurations and the requests are in workload-gen.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "imgbuild.h"
#include "workload.h"
#include "xalloc.h"

#define TOP_NAME "top.qcow2"
#define BACKING_NAME "backing.img"
#define DATA_NAME "data.raw"
#define CHUNK 4096

static void *
wl_xmemdup (const void *p, size_t n)
{
  return memcpy (test_xrealloc (NULL, n), p, n);
}

/* The backing file: raw data over three quarters of the disk, or a
 * qcow2 image with data and zero clusters; buf gets what it reads as.
 */
static void
wl_setup_backing (const struct wl_config *cfg, struct wl_setup *s,
                  uint8_t *view)
{
  struct qcow2_io *io;

  memset (view, 0, cfg->size);
  if (cfg->backing == WL_RAW_BACKING) {
    uint64_t len = cfg->size / 4 * 3;
    for (uint64_t o = 0; o < len; o++)
      view[o] = model_pattern (false, 0xbac, o);
    io = memio_new (view, len);
  }
  else {
    struct ib ib;
    ib_init (&ib, 3, 12, cfg->size, false);
    for (uint64_t c = 0; c < cfg->size >> 12; c += 3)
      ib_data (&ib, c, 0xbac + c);
    for (uint64_t c = 1; c < cfg->size >> 12; c += 7)
      ib_zero (&ib, c);
    ib_finish (&ib);
    model_fill (&ib.model, view, cfg->size, 0);
    io = memio_new (ib.buf, ib.len);
    ib_free (&ib);
  }
  if (!io || memenv_add (s->me, BACKING_NAME, io) < 0)
    abort ();
  io->ops->close (io);
}

/* A top image with some of everything in it, built by hand. */
static void
wl_setup_built (const struct wl_config *cfg, uint64_t seed,
                struct wl_setup *s)
{
  struct wl_rng r = { seed };
  uint64_t clusters = cfg->size >> cfg->cluster_bits;
  uint8_t *used = calloc (1, clusters);
  struct ib ib;

  if (!used)
    abort ();
  ib_init (&ib, 3, cfg->cluster_bits, cfg->size, cfg->extl2);
  ib.refcount_order = cfg->refcount_order;
  ib.share_l2 = true;
  if (cfg->lazy)
    ib.compat |= 1;
  if (cfg->backing) {
    ib.backing = BACKING_NAME;
    ib.backing_format = cfg->backing == WL_RAW_BACKING ? "raw" : "qcow2";
  }
  if (cfg->data_file) {
    /* Empty, its data file too: the builder puts guest data in the
     * image itself.
     */
    ib.incompat |= UINT64_C (1) << 2;
    if (cfg->data_file_raw)
      ib.autoclear |= UINT64_C (1) << 1;
    ib.extra_ext_type = 0x44415441;
    ib.extra_ext_data = DATA_NAME;
    ib.extra_ext_len = strlen (DATA_NAME);
    clusters = 0;
  }
  /* Mostly in the first quarter, where the requests go. */
  for (uint64_t i = 0; i < clusters / 8; i++) {
    uint64_t c = wl_below (&r, 4) ? wl_below (&r, clusters / 4)
                                  : wl_below (&r, clusters);
    /* Each cluster once: a second one would leak the first. */
    if (used[c]++)
      continue;
    switch (wl_below (&r, 8)) {
    case 0:
      ib_zero (&ib, c);
      break;
    case 1: case 2:
      if (cfg->compressed) {
        ib_compressed (&ib, c, wl_rand (&r), wl_below (&r, 2),
                       wl_below (&r, 2) ? 0 : 512 * wl_below (&r, 8));
        break;
      }
      /* fall through */
    default:
      ib_data (&ib, c, wl_rand (&r));
      break;
    }
  }
  free (used);
  if (cfg->snapshot)
    ib_snapshot (&ib, "1", "before", 0, true);
  if (cfg->bitmaps) {
    ib_bitmap (&ib, "fine", 9, 2, wl_rand (&r));
    ib_bitmap (&ib, "coarse", 16, 2, wl_rand (&r));
    ib_bitmap (&ib, "off", 12, 0, wl_rand (&r));
  }
  ib_finish (&ib);
  s->image = wl_xmemdup (ib.buf, ib.len);
  s->len = ib.len;
  ib_free (&ib);
}

static void wl_setup_initial (struct wl_setup *s);

void
wl_setup (const struct wl_config *cfg, uint64_t seed, struct wl_setup *s)
{
  memset (s, 0, sizeof *s);
  s->cfg = cfg;
  s->me = memenv_new ();
  s->trimmed = calloc (1, cfg->size);
  if (!s->me || !s->trimmed)
    abort ();
  if (cfg->backing)
    wl_setup_backing (cfg, s, s->trimmed);
  /* A trim leaves zeros; on v2 over a backing file (no zero flag) it
   * changes nothing, as in QEMU: the backing file's stale data would
   * show.
   */
  memset (s->trimmed, 0, cfg->size);
  if (cfg->v2 && cfg->backing) {
    free (s->trimmed);
    s->trimmed = NULL;
  }

  if (cfg->built)
    wl_setup_built (cfg, seed, s);
  else {
    struct qcow2_create_options co = {
      .size = cfg->size,
      .cluster_size = UINT64_C (1) << cfg->cluster_bits,
      .compat_v2 = cfg->v2,
      .extended_l2 = cfg->extl2,
      .lazy_refcounts = cfg->lazy,
    };
    struct qcow2_io *io = memio_new (NULL, 0);
    const uint8_t *data;
    int r;

    if (cfg->backing) {
      co.backing = BACKING_NAME;
      co.backing_format = cfg->backing == WL_RAW_BACKING ? "raw" : "qcow2";
    }
    if (!io || (r = qcow2_create (memenv_env (s->me), io, &co)) < 0) {
      fprintf (stderr, "%s: qcow2_create failed: %s\n", cfg->name,
               memenv_last_error (s->me));
      abort ();
    }
    data = memio_data (io, &s->len);
    s->image = wl_xmemdup (data, s->len);
    io->ops->close (io);
  }
  if (cfg->bitmaps)
    wl_setup_initial (s);
}

void
wl_setup_free (struct wl_setup *s)
{
  memenv_free (s->me);
  free (s->image);
  free (s->trimmed);
  free (s->initial);
  memset (s, 0, sizeof *s);
}

static struct qcow2_image *
wl_open_io (const struct wl_setup *s, const struct qcow2_env *env,
            struct qcow2_io *io, bool readonly)
{
  struct qcow2_options opts = {
    .l2_cache_size = s->cfg->l2_cache_size,
    .l2_slice_size = s->cfg->l2_slice_size,
    .readonly = readonly,
    .copy_on_read = s->cfg->copy_on_read && !readonly,
  };

  return qcow2_open (env, io, TOP_NAME, &opts);
}

struct wl_files
wl_setup_files (const struct wl_setup *s)
{
  return (struct wl_files) { .image = s->image, .len = s->len };
}

struct qcow2_image *
wl_open_copy (const struct wl_setup *s, struct wl_files files, bool readonly)
{
  struct qcow2_io *io = memio_new (files.image, files.len);

  if (!io)
    abort ();
  if (s->cfg->data_file) {
    struct qcow2_io *dio = memio_new (files.data, files.dlen);

    if (!dio || memenv_add (s->me, DATA_NAME, dio) < 0)
      abort ();
    dio->ops->close (dio);
  }
  return wl_open_io (s, memenv_env (s->me), io, readonly);
}

/* The run's environment: the setup's files, but the data file from the
 * run's own crashio, so that its writes are recorded.
 */
static const struct qcow2_env *
wl_run_inner (void *opaque)
{
  return memenv_env (((struct wl_run *) opaque)->setup->me);
}

static struct qcow2_io *
wl_run_env_open (void *opaque, const char *path, bool readonly, char **id)
{
  struct wl_run *run = opaque;
  const struct qcow2_env *inner = wl_run_inner (opaque);

  if (run->dcio && strcmp (path, DATA_NAME) == 0) {
    if (!(*id = strdup (path)))
      return NULL;
    return crashio_io (run->dcio);
  }
  return inner->open (inner->opaque, path, readonly, id);
}

static void
wl_run_env_error (void *opaque, const char *msg)
{
  const struct qcow2_env *inner = wl_run_inner (opaque);

  inner->error (inner->opaque, msg);
}

static void
wl_run_env_debug (void *opaque, const char *msg)
{
  const struct qcow2_env *inner = wl_run_inner (opaque);

  inner->debug (inner->opaque, msg);
}

static void
wl_run_env_notice (void *opaque, const char *path, const char *msg)
{
  const struct qcow2_env *inner = wl_run_inner (opaque);

  if (inner->notice)
    inner->notice (inner->opaque, path, msg);
}

uint8_t *
wl_buf_get (struct wl_buf *b, size_t len)
{
  if (b->cap < len) {
    free (b->p);
    b->p = test_xrealloc (NULL, len);
    b->cap = len;
  }
  return b->p;
}

uint8_t *
wl_read_all (struct qcow2_image *img, struct wl_buf *b)
{
  uint64_t size = qcow2_get_size (img);
  uint8_t *buf = wl_buf_get (b, size);
  int r = qcow2_read (img, buf, size, 0);

  if (r < 0) {
    errno = -r;
    return NULL;
  }
  return buf;
}

/* The guest of the initial image, which the bitmaps' checks compare
 * crash images with.
 */
static void
wl_setup_initial (struct wl_setup *s)
{
  struct qcow2_image *img = wl_open_copy (s, wl_setup_files (s), true);
  struct wl_buf b = { NULL, 0 };

  if (!img || !(s->initial = wl_read_all (img, &b))) {
    fprintf (stderr, "%s: the initial image does not read: %s\n",
             s->cfg->name, memenv_last_error (s->me));
    abort ();
  }
  qcow2_close (img);
}

int
wl_run_start (struct wl_run *run, const struct wl_setup *s,
              struct wl_files files, const uint8_t *initial)
{
  struct wl_model *m = &run->model;
  struct qcow2_io *io;

  memset (run, 0, sizeof *run);
  run->setup = s;
  run->env = (struct qcow2_env) {
    .opaque = run, .open = wl_run_env_open, .error = wl_run_env_error,
    .debug = wl_run_env_debug, .notice = wl_run_env_notice,
  };
  run->cio = crashio_new (files.image, files.len);
  io = crashio_io (run->cio);   /* the image's reference */
  io->grows_by_writes = s->cfg->grows_by_writes;
  if (s->cfg->data_file)
    run->dcio = crashio_new (files.data, files.dlen);
  run->img = wl_open_io (s, &run->env, io, false);
  if (!run->img)
    return -errno;
  m->size = qcow2_get_size (run->img);
  m->cluster_size = UINT64_C (1) << s->cfg->cluster_bits;
  m->acked = wl_xmemdup (initial, m->size);
  m->durable = wl_xmemdup (initial, m->size);
  m->dirty = calloc (1, m->size);
  m->trimmed = s->trimmed;
  if (!m->dirty)
    abort ();
  return 0;
}

struct wl_files
wl_run_files (struct wl_run *run)
{
  struct wl_files f = { 0 };

  f.image = crashio_data (run->cio, &f.len);
  if (run->dcio)
    f.data = crashio_data (run->dcio, &f.dlen);
  return f;
}

void
wl_run_end (struct wl_run *run)
{
  if (run->img)
    qcow2_close (run->img);
  crashio_free (run->cio);
  if (run->dcio)
    crashio_free (run->dcio);
  free (run->model.acked);
  free (run->model.durable);
  free (run->model.dirty);
  free (run->model.since);
  memset (run, 0, sizeof *run);
}

/* The part of the disk a trim of [offset, offset+len) changes: whole
 * clusters only, but up to the end of the disk if it reaches it.
 */
static void
wl_trim_range (const struct wl_model *m, uint64_t offset, uint64_t len,
               uint64_t *start, uint64_t *end)
{
  uint64_t cs = m->cluster_size;

  *start = (offset + cs - 1) / cs * cs;
  *end = (offset + len) / cs * cs;
  if (offset + len == m->size)
    *end = m->size;
  if (*end < *start)
    *end = *start;
}

/* What op leaves in [o, o+len) (which it covers): fills buf where it
 * changes something and returns that part, [*from, *to) relative to o.
 */
static void
wl_op_fill (const struct wl_model *m, const struct wl_op *op, uint64_t o,
            uint64_t len, uint8_t *buf, uint64_t *from, uint64_t *to)
{
  uint64_t s, e;

  *from = 0;
  *to = len;
  switch (op->kind) {
  case WL_WRITE:
    model_pattern_fill (false, op->seed, o, buf, len);
    break;
  case WL_ZERO:
    memset (buf, 0, len);
    break;
  case WL_TRIM:
    wl_trim_range (m, op->offset, op->len, &s, &e);
    s = MAX (s, o);
    e = MIN (e, o + len);
    if (s >= e || !m->trimmed) {
      *to = 0;
      break;
    }
    *from = s - o;
    *to = e - o;
    memcpy (buf + *from, m->trimmed + s, e - s);
    break;
  default:
    *to = 0;
    break;
  }
}

static void
wl_model_begin (struct wl_model *m, const struct wl_op *op)
{
  if (op->kind != WL_WRITE && op->kind != WL_ZERO && op->kind != WL_TRIM)
    return;
  memset (m->dirty + op->offset, 1, op->len);
  m->since = test_grow (m->since, &m->capsince, m->nsince + 1,
                        sizeof *m->since);
  m->since[m->nsince++] = *op;
}

static void
wl_model_durable (struct wl_model *m, uint64_t offset, uint64_t len)
{
  memcpy (m->durable + offset, m->acked + offset, len);
  memset (m->dirty + offset, 0, len);
}

static void
wl_model_flushed (struct wl_model *m)
{
  wl_model_durable (m, 0, m->size);
  m->nsince = 0;
}

/* op completed: the guest reads what it wrote. */
static void
wl_model_done (struct wl_model *m, const struct wl_op *op)
{
  uint8_t *buf;
  uint64_t from, to;

  if (op->kind != WL_WRITE && op->kind != WL_ZERO && op->kind != WL_TRIM)
    return;
  buf = test_xrealloc (NULL, op->len);
  wl_op_fill (m, op, op->offset, op->len, buf, &from, &to);
  memcpy (m->acked + op->offset + from, buf + from, to - from);
  free (buf);
  if (op->fua)
    wl_model_durable (m, op->offset, op->len);
}

int
wl_exec (struct wl_run *run, const struct wl_op *op)
{
  struct wl_model *m = &run->model;
  uint8_t *buf;
  int r = 0;

  wl_model_begin (m, op);
  switch (op->kind) {
  case WL_WRITE:
    buf = test_xrealloc (NULL, op->len);
    model_pattern_fill (false, op->seed, op->offset, buf, op->len);
    r = qcow2_write (run->img, buf, op->len, op->offset, op->fua);
    free (buf);
    break;
  case WL_ZERO:
    r = qcow2_zero (run->img, op->len, op->offset, op->may_trim, false,
                    op->fua);
    break;
  case WL_TRIM:
    r = qcow2_trim (run->img, op->len, op->offset, op->fua);
    break;
  case WL_READ:
    buf = test_xrealloc (NULL, op->len);
    r = qcow2_read (run->img, buf, op->len, op->offset);
    if (r == 0 && memcmp (buf, m->acked + op->offset, op->len) != 0)
      r = -EILSEQ;
    free (buf);
    break;
  case WL_FILL:
    r = qcow2_fill (run->img, op->len, op->offset);
    break;
  case WL_FLUSH:
    r = qcow2_flush (run->img);
    break;
  case WL_REOPEN:
    r = qcow2_close (run->img);
    run->img = wl_open_io (run->setup, &run->env, crashio_io (run->cio),
                           false);
    if (!run->img)
      return -errno;
    break;
  case WL_REPAIR:
  case WL_CHECK:
    r = qcow2_check (run->img, op->kind == WL_REPAIR, &run->check);
    if (r == 0 && run->check.corruptions)
      r = -EUCLEAN;
    break;
  }
  if (r < 0)
    return r;
  if (op->kind == WL_FLUSH || op->kind == WL_REOPEN)
    wl_model_flushed (m);
  else
    wl_model_done (m, op);
  return 0;
}

static bool
wl_model_explain (const struct wl_model *m, uint64_t b, uint8_t v,
                  char *why, size_t whylen)
{
  if (!m->dirty[b])
    snprintf (why, whylen, "guest byte %#" PRIx64 " reads %#x: it was made "
              "durable as %#x", b, v, m->durable[b]);
  else
    snprintf (why, whylen, "guest byte %#" PRIx64 " reads %#x: neither its "
              "durable value %#x nor anything written since", b, v,
              m->durable[b]);
  return false;
}

/* Whether buf[0, len), guest bytes from o (one chunk at most), holds
 * what the model allows: its durable value, or where touched since,
 * what a request since wrote.  ok[] is scratch.
 */
static bool
wl_model_allows (const struct wl_model *m, const uint8_t *buf, uint64_t o,
                 uint64_t len, char *why, size_t whylen)
{
  uint8_t ok[CHUNK], val[CHUNK];
  uint64_t need = 0, from, to;

  for (uint64_t i = 0; i < len; i++) {
    ok[i] = buf[i] == m->durable[o + i];
    if (!ok[i] && !m->dirty[o + i])
      return wl_model_explain (m, o + i, buf[i], why, whylen);
    need += !ok[i];
  }
  for (size_t k = m->nsince; k-- > 0 && need; ) {
    const struct wl_op *op = &m->since[k];
    uint64_t s = MAX (o, op->offset), e = MIN (o + len, op->offset + op->len);
    if (s >= e)
      continue;
    wl_op_fill (m, op, s, e - s, val, &from, &to);
    for (uint64_t i = from; i < to; i++)
      if (!ok[s - o + i] && val[i] == buf[s - o + i]) {
        ok[s - o + i] = 1;
        need--;
      }
  }
  for (uint64_t i = 0; need && i < len; i++)
    if (!ok[i])
      return wl_model_explain (m, o + i, buf[i], why, whylen);
  return true;
}

bool
wl_model_check (const struct wl_model *m, const uint8_t *buf, char *why,
                size_t whylen)
{
  for (uint64_t o = 0; o < m->size; o += CHUNK) {
    uint64_t n = MIN (CHUNK, m->size - o);
    if (memcmp (buf + o, m->durable + o, n) != 0 &&
        !wl_model_allows (m, buf + o, o, n, why, whylen))
      return false;
  }
  return true;
}

bool
wl_model_adopt (struct wl_model *m, const uint8_t *buf, uint64_t offset,
                uint64_t len, char *why, size_t whylen)
{
  for (uint64_t o = offset; o < offset + len; o += CHUNK) {
    uint64_t n = MIN (CHUNK, offset + len - o);
    if (!wl_model_allows (m, buf + (o - offset), o, n, why, whylen))
      return false;
  }
  memcpy (m->acked + offset, buf, len);
  return true;
}
