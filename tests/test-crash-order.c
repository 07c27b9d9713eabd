/* SPDX-License-Identifier: BSD-3-Clause */
/* The order of metadata writes, checked before every host write, punch
 * and flush rather than on sampled crash images: no L1 or L2 entry the
 * file shows (synced or not: a crash may keep any write) points at a
 * cluster whose refcount is not durable yet.  An L2 slice evicted
 * before the refcounts of what it points at were synced breaks it at
 * once.
 *
 *  - The crash simulator's workloads that evict dirty slices (small L2
 *    caches) and keep refcounts (not lazy), several seeds each.
 *  - Random allocating writes that outgrow the L2 cache with no client
 *    flush: the same order, with few host flushes (not one per evicted
 *    slice), then a clean close that leaves what was written
 *    (qemu-img check clean, every byte as the model says).
 *
 * The tables are read from the file as written, the refcounts from the
 * state at the last host flush, by this file's own decoding: the
 * engine's code is not trusted to check itself.
 * ORDER_SEEDS=N seeds per workload (default 4).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "crashcheck.h"

#define L2_OFFSET_MASK UINT64_C (0x00fffffffffffe00)
#define L2_COMPRESSED (UINT64_C (1) << 62)
#define INCOMPAT_DATA_FILE 4
#define INCOMPAT_EXTL2 16

/* The header fields the check needs. */
struct order_hdr {
  unsigned cluster_bits, refcount_order;
  uint32_t l1_size;
  uint64_t l1_offset, rt_offset, rt_entries;
  bool extl2, data_file;
};

struct order {
  const char *what;             /* workload, for messages */
  struct crashio *cio;
  uint64_t ops;                 /* host operations checked */
  uint64_t refs;                /* references checked */
  bool failed;
};

static bool
order_header (const uint8_t *b, size_t len, struct order_hdr *h)
{
  uint32_t version;
  uint64_t incompat = 0;

  if (len < 72)
    return false;
  version = be32_get (b + 4);
  h->cluster_bits = be32_get (b + 20);
  h->l1_size = be32_get (b + 36);
  h->l1_offset = be64_get (b + 40);
  h->rt_offset = be64_get (b + 48);
  h->rt_entries = (uint64_t) be32_get (b + 56) << (h->cluster_bits - 3);
  h->refcount_order = 4;
  if (version >= 3 && len >= 104) {
    incompat = be64_get (b + 72);
    h->refcount_order = be32_get (b + 96);
  }
  h->extl2 = incompat & INCOMPAT_EXTL2;
  h->data_file = incompat & INCOMPAT_DATA_FILE;
  return h->cluster_bits >= 9 && h->cluster_bits <= 21 &&
    h->refcount_order <= 6;
}

/* The refcount of cluster c in the file d (its state at the last host
 * flush); 0 where no durable block counts it.
 */
static uint64_t
order_refcount (const uint8_t *d, size_t len, const struct order_hdr *h,
                uint64_t c)
{
  unsigned per_block_bits = h->cluster_bits + 3 - h->refcount_order;
  uint64_t idx = c >> per_block_bits;
  uint64_t i = c & ((UINT64_C (1) << per_block_bits) - 1);
  uint64_t cs = UINT64_C (1) << h->cluster_bits, block;
  unsigned bits = 1u << h->refcount_order;
  const uint8_t *p;

  if (idx >= h->rt_entries || h->rt_offset + idx * 8 + 8 > len)
    return 0;
  block = be64_get (d + h->rt_offset + idx * 8) & ~UINT64_C (511);
  if (!block || block + cs > len)
    return 0;
  p = d + block;
  switch (h->refcount_order) {
  case 0: case 1: case 2:
    return (p[i * bits / 8] >> (i * bits % 8)) & ((1u << bits) - 1);
  case 3: return p[i];
  case 4: return be16_get (p + i * 2);
  case 5: return be32_get (p + i * 4);
  default: return be64_get (p + i * 8);
  }
}

/* The cluster at host offset off, pointed at by the entry at where
 * (in what), must have a durable refcount.
 */
static void
order_need (struct order *o, const uint8_t *d, size_t dlen,
            const struct order_hdr *dh, uint64_t off, const char *what,
            uint64_t where)
{
  o->refs++;
  if (o->failed || order_refcount (d, dlen, dh, off >> dh->cluster_bits))
    return;
  fprintf (stderr, "FAIL: %s: before host operation %" PRIu64 ", the %s "
           "entry at %#" PRIx64 " points at the cluster at %#" PRIx64
           ", whose refcount is not durable\n", o->what, o->ops, what,
           where, off);
  o->failed = true;
}

/* The entries of the L2 tables that file t's L1 table points at, as
 * they are in t and in d (the durable state).
 */
static void
order_tables (struct order *o, const uint8_t *t, size_t tlen,
              const uint8_t *d, size_t dlen, const struct order_hdr *dh)
{
  const uint8_t *src[2] = { t, d };
  size_t srclen[2] = { tlen, dlen };
  struct order_hdr th;
  uint64_t cs, esize;

  if (!order_header (t, tlen, &th))
    return;
  cs = UINT64_C (1) << th.cluster_bits;
  esize = th.extl2 ? 16 : 8;
  for (uint64_t i = 0; i < th.l1_size; i++) {
    uint64_t at = th.l1_offset + i * 8, l2;
    if (at + 8 > tlen)
      break;
    if (!(l2 = be64_get (t + at) & L2_OFFSET_MASK))
      continue;
    order_need (o, d, dlen, dh, l2, "L1", at);
    for (int s = 0; s < 2; s++) {
      if (l2 + cs > srclen[s])
        continue;
      for (uint64_t e = 0; e < cs; e += esize) {
        uint64_t entry = be64_get (src[s] + l2 + e);
        uint64_t host = entry & L2_OFFSET_MASK;
        /* Compressed clusters are written with their entry's slice
         * (their bytes counted by the same refcounts), and external
         * data has no refcounts.
         */
        if ((entry & L2_COMPRESSED) || !host || th.data_file)
          continue;
        order_need (o, d, dlen, dh, host, s ? "durable L2" : "L2",
                    l2 + e);
      }
    }
  }
}

static void
order_check (struct order *o)
{
  size_t llen, dlen;
  const uint8_t *live = crashio_data (o->cio, &llen);
  const uint8_t *d = crashio_durable (o->cio, &dlen);
  struct order_hdr dh;

  if (!order_header (d, dlen, &dh))
    return;
  order_tables (o, live, llen, d, dlen, &dh);
  order_tables (o, d, dlen, d, dlen, &dh);
}

static int
order_hook (void *opaque, enum crashio_op op, uint64_t offset,
            uint64_t count)
{
  struct order *o = opaque;

  if (op != CRASHIO_PREAD) {
    order_check (o);
    o->ops++;
  }
  return 0;
}

/* Start cfg's image over a crashio watched by o. */
static void
order_start (struct order *o, const struct wl_config *cfg, uint64_t seed,
             struct wl_setup *setup, struct wl_run *run)
{
  static struct wl_buf buf;
  struct qcow2_image *img;
  uint8_t *initial;

  wl_setup (cfg, seed, setup);
  img = wl_open_copy (setup, wl_setup_files (setup), true);
  if (!img || !(initial = wl_read_all (img, &buf))) {
    fprintf (stderr, "%s: the initial image does not open: %s\n", cfg->name,
             memenv_last_error (setup->me));
    exit (EXIT_FAILURE);
  }
  qcow2_close (img);
  if (wl_run_start (run, setup, wl_setup_files (setup), initial) < 0) {
    fprintf (stderr, "%s: cannot open the initial image: %s\n", cfg->name,
             memenv_last_error (setup->me));
    exit (EXIT_FAILURE);
  }
  *o = (struct order) { .what = cfg->name, .cio = run->cio };
  crashio_set_hook (run->cio, order_hook, o);
}

static bool
order_workload (const struct wl_config *cfg, uint64_t seed)
{
  struct wl_setup setup;
  struct wl_run run;
  struct order o;
  struct wl_op *ops;
  size_t n;
  int r = 0;

  order_start (&o, cfg, seed, &setup, &run);
  wl_generate (cfg, seed, &ops, &n);
  for (size_t i = 0; i < n && !o.failed; i++)
    /* A failed repair or check is the crash simulator's business. */
    if ((r = wl_exec (&run, &ops[i])) < 0 && r != -EUCLEAN) {
      fprintf (stderr, "FAIL: %s seed %" PRIu64 ": request %zu: %s\n",
               cfg->name, seed, i, errstr (-r));
      o.failed = true;
    }
  order_check (&o);
  printf ("%s seed %" PRIu64 ": %" PRIu64 " host operations, %" PRIu64
          " references checked\n", cfg->name, seed, o.ops, o.refs);
  crashio_set_hook (run.cio, NULL, NULL);
  free (ops);
  wl_run_end (&run);
  wl_setup_free (&setup);
  return !o.failed;
}

/* Random 512-byte writes to a 4 MiB disk of 512-byte clusters (128
 * slices of L2 table) through a cache of 16 slices, no client flush:
 * about 7 in 8 writes evict a dirty slice.
 */
static const struct wl_config random_cfg = {
  .name = "random-512-no-flush", .cluster_bits = 9, .size = 4 << 20,
  .l2_cache_size = 16 * 512, .l2_slice_size = 512,
};
#define RANDOM_WRITES 4000

static bool
order_random (void)
{
  static struct wl_buf buf;
  struct wl_setup setup;
  struct wl_run run;
  struct wl_rng rng = { 35 };
  struct order o;
  struct qcow2_image *img;
  struct wl_op op = { .kind = WL_WRITE, .len = 512 };
  uint64_t before, syncs;
  uint8_t *got;
  char out[4096];
  bool ok = true;
  int r;

  order_start (&o, &random_cfg, 1, &setup, &run);
  /* Every L2 table made and reachable from the durable L1 table. */
  for (op.offset = 0; op.offset < random_cfg.size; op.offset += 32768) {
    op.seed++;
    if (wl_exec (&run, &op) < 0)
      abort ();
  }
  if (wl_exec (&run, &(struct wl_op) { .kind = WL_FLUSH }) < 0)
    abort ();
  before = qcow2_host_flushes (run.img);
  for (unsigned i = 0; i < RANDOM_WRITES && !o.failed; i++) {
    op.offset = wl_below (&rng, random_cfg.size / 512) * 512;
    op.seed++;
    if ((r = wl_exec (&run, &op)) < 0) {
      fprintf (stderr, "FAIL: random write %u: %s\n", i, errstr (-r));
      return false;
    }
  }
  syncs = qcow2_host_flushes (run.img) - before;
  order_check (&o);
  printf ("%s: %" PRIu64 " host operations, %" PRIu64 " references "
          "checked; %u writes, %" PRIu64 " host flushes\n", random_cfg.name,
          o.ops, o.refs, RANDOM_WRITES, syncs);
  ok = !o.failed;
  /* A sync per evicted dirty slice was the old cost (about 0.9 per
   * write here); one per cache's worth of evictions is the new one.
   */
  if (syncs > RANDOM_WRITES / 8) {
    fprintf (stderr, "FAIL: %" PRIu64 " host flushes for %u writes\n",
             syncs, RANDOM_WRITES);
    ok = false;
  }

  crashio_set_hook (run.cio, NULL, NULL);
  r = qcow2_close (run.img);
  run.img = NULL;
  img = r == 0 ? wl_open_copy (&setup, wl_run_files (&run), true) : NULL;
  if (!img || !(got = wl_read_all (img, &buf))) {
    fprintf (stderr, "FAIL: close and open again: %s\n",
             memenv_last_error (setup.me));
    ok = false;
  }
  else if (memcmp (got, run.model.acked, random_cfg.size) != 0) {
    uint64_t i = crashcheck_first_difference (got, run.model.acked,
                                              random_cfg.size);
    fprintf (stderr, "FAIL: guest byte %#" PRIx64 " reads %#x, not %#x\n",
             i, got[i], run.model.acked[i]);
    ok = false;
  }
  else if ((r = crashcheck_qemu (wl_run_files (&run), out, sizeof out))) {
    fprintf (stderr, "FAIL: qemu-img check exit %d:\n%s\n", r, out);
    ok = false;
  }
  qcow2_close (img);
  wl_run_end (&run);
  wl_setup_free (&setup);
  return ok;
}

/* The workloads that evict dirty slices, with refcounts kept. */
static const char *const order_configs[] = {
  "alloc-4k-evict", "alloc-512-evict", "backing-qcow2-v2-4k-evict",
  "snapshot-compressed-64k-evict", "bitmaps-snapshot-512-evict",
  "datafile-backing-4k-evict", "fill-1k-rc32-evict", "cor-raw-4k-evict",
};

int
main (void)
{
  const char *e = getenv ("ORDER_SEEDS");
  unsigned seeds = e ? atoi (e) : 4;
  bool ok = true;

  crashcheck_init ();
  for (size_t i = 0; i < sizeof order_configs / sizeof *order_configs; i++) {
    const struct wl_config *cfg = wl_config_find (order_configs[i]);
    if (!cfg) {
      fprintf (stderr, "no configuration %s\n", order_configs[i]);
      return EXIT_FAILURE;
    }
    for (uint64_t seed = 1; seed <= seeds; seed++)
      ok &= order_workload (cfg, seed);
  }
  ok &= order_random ();
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
