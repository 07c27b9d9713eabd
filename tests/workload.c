/* SPDX-License-Identifier: BSD-3-Clause */
/* Random write workloads and the model of what they leave (see
 * workload.h).
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

#define KiB 1024
#define MiB (1024 * 1024)
#define TOP_NAME "top.qcow2"
#define BACKING_NAME "backing.img"
#define DATA_NAME "data.raw"
#define CHUNK 4096

/* The configurations: each workload of the issue (allocation, COW over
 * a backing file, refcount table growth, trims, lazy refcounts, shared
 * clusters of snapshots) at cluster sizes from 512 bytes to 64K, some
 * with an L2 cache of two slices so that dirty slices are evicted in
 * the middle of requests.  The refcount table of grow-512-rc64 (one
 * cluster: 2 MB of file) grows as the disk fills.
 */
const struct wl_config wl_configs[] = {
  { .name = "alloc-64k", .cluster_bits = 16, .size = 2 * MiB, .ops = 120 },
  { .name = "alloc-4k-evict", .cluster_bits = 12, .size = 2 * MiB,
    .l2_cache_size = 1024, .l2_slice_size = 512, .ops = 120 },
  { .name = "alloc-512-evict", .cluster_bits = 9, .size = 1 * MiB,
    .l2_cache_size = 1024, .l2_slice_size = 512, .ops = 100 },
  { .name = "v2-4k", .cluster_bits = 12, .size = 2 * MiB, .v2 = true,
    .ops = 120 },
  { .name = "backing-raw-4k", .cluster_bits = 12, .size = 2 * MiB,
    .backing = WL_RAW_BACKING, .ops = 120 },
  { .name = "backing-qcow2-v2-4k-evict", .cluster_bits = 12,
    .size = 2 * MiB, .v2 = true, .backing = WL_QCOW2_BACKING,
    .l2_cache_size = 1024, .l2_slice_size = 512, .ops = 120 },
  { .name = "extl2-32k-backing", .cluster_bits = 15, .size = 2 * MiB,
    .extl2 = true, .backing = WL_RAW_BACKING, .ops = 120 },
  { .name = "lazy-4k", .cluster_bits = 12, .size = 2 * MiB, .lazy = true,
    .ops = 120 },
  { .name = "lazy-backing-64k", .cluster_bits = 16, .size = 2 * MiB,
    .lazy = true, .backing = WL_RAW_BACKING, .ops = 120 },
  { .name = "snapshot-4k", .cluster_bits = 12, .size = 2 * MiB,
    .built = true, .snapshot = true, .ops = 120 },
  { .name = "snapshot-compressed-64k-evict", .cluster_bits = 16,
    .size = 2 * MiB, .built = true, .snapshot = true, .compressed = true,
    .l2_cache_size = 1024, .l2_slice_size = 512, .ops = 120 },
  { .name = "snapshot-lazy-backing-1k", .cluster_bits = 10, .size = 1 * MiB,
    .built = true, .snapshot = true, .lazy = true,
    .backing = WL_QCOW2_BACKING, .refcount_order = 3, .ops = 120 },
  { .name = "blocks-512-rc64", .cluster_bits = 9, .size = 1 * MiB,
    .built = true, .refcount_order = 6, .ops = 100 },
  { .name = "grow-512-rc64", .cluster_bits = 9, .size = 4 * MiB,
    .built = true, .refcount_order = 6, .gen = WL_GEN_FILL, .ops = 120 },
  { .name = "bitmaps-4k", .cluster_bits = 12, .size = 2 * MiB,
    .built = true, .bitmaps = true, .ops = 120 },
  { .name = "bitmaps-snapshot-512-evict", .cluster_bits = 9,
    .size = 1 * MiB, .built = true, .bitmaps = true, .snapshot = true,
    .l2_cache_size = 1024, .l2_slice_size = 512, .ops = 100 },
  { .name = "datafile-backing-4k-evict", .cluster_bits = 12,
    .size = 2 * MiB, .built = true, .data_file = true,
    .backing = WL_RAW_BACKING, .l2_cache_size = 1024, .l2_slice_size = 512,
    .ops = 120 },
  { .name = "datafile-raw-64k", .cluster_bits = 16, .size = 2 * MiB,
    .built = true, .data_file = true, .data_file_raw = true, .ops = 120 },
  { .name = "fill-1k-rc32-evict", .cluster_bits = 10, .size = 8 * MiB,
    .built = true, .refcount_order = 5, .gen = WL_GEN_FILL,
    .l2_cache_size = 1024, .l2_slice_size = 512, .ops = 120 },
  { .name = "cor-raw-4k-evict", .cluster_bits = 12, .size = 2 * MiB,
    .backing = WL_RAW_BACKING, .copy_on_read = true,
    .l2_cache_size = 1024, .l2_slice_size = 512, .ops = 120 },
  { .name = "cor-extl2-32k-qcow2", .cluster_bits = 15, .size = 2 * MiB,
    .extl2 = true, .backing = WL_QCOW2_BACKING, .copy_on_read = true,
    .ops = 120 },
};
const size_t wl_nr_configs = sizeof wl_configs / sizeof wl_configs[0];

const struct wl_config *
wl_config_find (const char *name)
{
  for (size_t i = 0; i < wl_nr_configs; i++)
    if (strcmp (wl_configs[i].name, name) == 0)
      return &wl_configs[i];
  return NULL;
}

/* Tests have no use for running out of memory. */
static void *
wl_xmalloc (size_t n)
{
  void *p = malloc (n ? n : 1);
  if (!p) {
    fprintf (stderr, "malloc: %s\n", errstr (errno));
    abort ();
  }
  return p;
}

static void *
wl_xmemdup (const void *p, size_t n)
{
  return memcpy (wl_xmalloc (n), p, n);
}

uint64_t
wl_rand (struct wl_rng *r)
{
  uint64_t z = (r->s += UINT64_C (0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C (0x94d049bb133111eb);
  return z ^ (z >> 31);
}

uint64_t
wl_below (struct wl_rng *r, uint64_t n)
{
  return n ? wl_rand (r) % n : 0;
}

/* A request's range: mostly in the first quarter of the disk, so that
 * requests overwrite, copy and free each other's clusters.
 */
static void
wl_pick_range (struct wl_rng *r, uint64_t cs, uint64_t size, bool aligned,
               uint64_t *offset, uint64_t *len)
{
  uint64_t span = wl_below (r, 10) < 7 ? size / 4 : size;
  uint64_t o, l;

  switch (aligned ? 0 : wl_below (r, 10)) {
  case 0: case 1: case 2: case 3: o = wl_below (r, span / cs) * cs; break;
  case 4: case 5: case 6: o = wl_below (r, span / 512) * 512; break;
  default: o = wl_below (r, span); break;
  }
  switch (wl_below (r, 10)) {
  case 0: case 1: case 2: l = 1 + wl_below (r, MIN (4096, cs)); break;
  case 3: case 4: l = 512 * (1 + wl_below (r, 2 * cs / 512)); break;
  case 5: case 6: case 7: case 8: l = cs * (1 + wl_below (r, 4)); break;
  default: l = cs * (1 + wl_below (r, 16)); break;
  }
  if (aligned)
    l = (l + cs - 1) / cs * cs;
  l = MIN (l, MiB);
  if (o >= size)
    o = size - 1;
  *offset = o;
  *len = MIN (l, size - o);
}

static void
wl_push (struct wl_op **ops, size_t *n, size_t *cap, struct wl_op op)
{
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 64;
    *ops = realloc (*ops, *cap * sizeof **ops);
    if (!*ops)
      abort ();
  }
  (*ops)[(*n)++] = op;
}

void
wl_generate (const struct wl_config *cfg, uint64_t seed, struct wl_op **ops,
             size_t *n)
{
  struct wl_rng r = { seed * UINT64_C (0x2545f4914f6cdd1d) + 1 };
  uint64_t cs = UINT64_C (1) << cfg->cluster_bits, pos = 0;
  size_t cap = 0;

  *ops = NULL;
  *n = 0;
  for (unsigned i = 0; i < cfg->ops; i++) {
    struct wl_op op = { .seed = wl_rand (&r) };
    unsigned k;

    /* Drawn only here, so that the other configurations' workloads
     * stay as they were (the regression reproducers name them).
     */
    if (cfg->copy_on_read && wl_below (&r, 4) == 0) {
      op.kind = wl_below (&r, 3) ? WL_READ : WL_FILL;
      wl_pick_range (&r, cs, cfg->size, false, &op.offset, &op.len);
      wl_push (ops, n, &cap, op);
      continue;
    }
    k = wl_below (&r, 100);

    if (cfg->gen == WL_GEN_FILL && k < 70) {
      /* Fill the disk from the start, so the file outgrows what one
       * refcount table cluster counts.
       */
      op.kind = WL_WRITE;
      op.len = wl_below (&r, 4) ? cs * (8 + wl_below (&r, 248))
                                : 1 + wl_below (&r, 64 * KiB);
      if (pos >= cfg->size)
        pos = 0;
      op.offset = pos;
      op.len = MIN (op.len, cfg->size - pos);
      pos += op.len;
      op.fua = wl_below (&r, 20) == 0;
      wl_push (ops, n, &cap, op);
      continue;
    }
    if (cfg->gen == WL_GEN_FILL)
      k = wl_below (&r, 100);
    if (k < 52) {
      op.kind = WL_WRITE;
      op.fua = k >= 46;
      wl_pick_range (&r, cs, cfg->size, false, &op.offset, &op.len);
    }
    else if (k < 60) {
      op.kind = WL_ZERO;
      op.may_trim = wl_below (&r, 2);
      op.fua = wl_below (&r, 10) == 0;
      wl_pick_range (&r, cs, cfg->size, wl_below (&r, 2), &op.offset,
                     &op.len);
    }
    else if (k < 70) {
      op.kind = WL_TRIM;
      op.fua = wl_below (&r, 10) == 0;
      wl_pick_range (&r, cs, cfg->size, wl_below (&r, 4), &op.offset,
                     &op.len);
    }
    else if (k < 88)
      op.kind = WL_FLUSH;
    else if (k < 92)
      op.kind = WL_REOPEN;
    else if (k < 95)
      op.kind = WL_REPAIR;
    else
      op.kind = WL_CHECK;
    wl_push (ops, n, &cap, op);
  }
}

static const char *const kind_names[] = {
  [WL_WRITE] = "write", [WL_ZERO] = "zero", [WL_TRIM] = "trim",
  [WL_FLUSH] = "flush", [WL_REOPEN] = "reopen", [WL_REPAIR] = "repair",
  [WL_CHECK] = "check", [WL_READ] = "read", [WL_FILL] = "fill",
};

void
wl_format_op (const struct wl_op *op, char *buf, size_t len)
{
  switch (op->kind) {
  case WL_WRITE:
    snprintf (buf, len, "write %" PRIu64 " %" PRIu64 " seed=%" PRIu32
              " fua=%d", op->offset, op->len, op->seed, op->fua);
    break;
  case WL_ZERO:
    snprintf (buf, len, "zero %" PRIu64 " %" PRIu64 " may_trim=%d fua=%d",
              op->offset, op->len, op->may_trim, op->fua);
    break;
  case WL_TRIM:
    snprintf (buf, len, "trim %" PRIu64 " %" PRIu64 " fua=%d", op->offset,
              op->len, op->fua);
    break;
  case WL_READ:
  case WL_FILL:
    snprintf (buf, len, "%s %" PRIu64 " %" PRIu64, kind_names[op->kind],
              op->offset, op->len);
    break;
  default:
    snprintf (buf, len, "%s", kind_names[op->kind]);
    break;
  }
}

int
wl_parse_op (const char *line, struct wl_op *op)
{
  char name[16];
  int fua = 0, may_trim = 0;

  memset (op, 0, sizeof *op);
  if (sscanf (line, "%15s", name) != 1)
    return -1;
  for (size_t k = 0; k < sizeof kind_names / sizeof kind_names[0]; k++)
    if (strcmp (name, kind_names[k]) == 0)
      op->kind = k;
  if (strcmp (name, kind_names[op->kind]) != 0)
    return -1;
  switch (op->kind) {
  case WL_WRITE:
    if (sscanf (line, "write %" SCNu64 " %" SCNu64 " seed=%" SCNu32 " fua=%d",
                &op->offset, &op->len, &op->seed, &fua) != 4)
      return -1;
    break;
  case WL_ZERO:
    if (sscanf (line, "zero %" SCNu64 " %" SCNu64 " may_trim=%d fua=%d",
                &op->offset, &op->len, &may_trim, &fua) != 4)
      return -1;
    break;
  case WL_TRIM:
    if (sscanf (line, "trim %" SCNu64 " %" SCNu64 " fua=%d", &op->offset,
                &op->len, &fua) != 3)
      return -1;
    break;
  case WL_READ:
  case WL_FILL:
    if (sscanf (line, "%*s %" SCNu64 " %" SCNu64, &op->offset,
                &op->len) != 2)
      return -1;
    break;
  default:
    break;
  }
  op->fua = fua;
  op->may_trim = may_trim;
  return 0;
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
    b->p = wl_xmalloc (len);
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

  memset (run, 0, sizeof *run);
  run->setup = s;
  run->env = (struct qcow2_env) {
    .opaque = run, .open = wl_run_env_open, .error = wl_run_env_error,
    .debug = wl_run_env_debug, .notice = wl_run_env_notice,
  };
  run->cio = crashio_new (files.image, files.len);
  if (s->cfg->data_file)
    run->dcio = crashio_new (files.data, files.dlen);
  run->img = wl_open_io (s, &run->env, crashio_io (run->cio), false);
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
  if (m->nsince == m->capsince) {
    m->capsince = m->capsince ? m->capsince * 2 : 64;
    m->since = realloc (m->since, m->capsince * sizeof *m->since);
    if (!m->since)
      abort ();
  }
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
  buf = wl_xmalloc (op->len);
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
    buf = wl_xmalloc (op->len);
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
    buf = wl_xmalloc (op->len);
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
