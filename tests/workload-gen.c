/* SPDX-License-Identifier: BSD-3-Clause */
/* Random write workloads (see workload.h): the configurations, the
 * seeded generator of their requests, and a request's text form, which
 * reproducers are written in.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "workload.h"
#include "xalloc.h"

#define KiB 1024
#define MiB (1024 * 1024)

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
  { .name = "alloc-64k-direct", .cluster_bits = 16, .size = 2 * MiB,
    .grows_by_writes = true, .ops = 120 },
  { .name = "alloc-4k-evict-direct", .cluster_bits = 12, .size = 2 * MiB,
    .l2_cache_size = 1024, .l2_slice_size = 512, .grows_by_writes = true,
    .ops = 120 },
  { .name = "lazy-4k-direct", .cluster_bits = 12, .size = 2 * MiB,
    .lazy = true, .grows_by_writes = true, .ops = 120 },
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
  *ops = test_grow (*ops, cap, *n + 1, sizeof **ops);
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
