/* SPDX-License-Identifier: BSD-3-Clause */
/* The overlap map against a linear scan: for image layouts
 * from 1 GB to 100 TB in 64 KiB clusters, map the metadata clusters a
 * fully written image has (an L2 table per 512 MiB of data, a refcount
 * block per 2 GiB of file, interleaved with the data as a sequential
 * fill leaves them), then time random queries against the map and
 * against a plain array of the same ranges scanned from the start for
 * each query, as QEMU's overlap check walks the L1 table and the
 * refcount table on every write.
 *
 * Build and run from the top of a built tree:
 *   make -C bench overlap-micro && bench/overlap-micro [LAYOUT...]
 * LAYOUT: 1G, 10G, 100G, 1T, 10T or 100T (default: all).
 *
 * Random queries over the whole file miss the CPU caches once the map
 * outgrows them; queries within a few windows (as the writes of one
 * client mostly are) show the cost of the code alone.
 */
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"
#include "overlap-map.h"

#define CLUSTER_BITS 16
/* The types the guard gives them (QCOW2_OL_*_BIT + 1). */
#define TYPE_L2 3
#define TYPE_REFCOUNT_BLOCK 5
#define L2_SPAN (UINT64_C (512) << 20)          /* data one L2 table maps */
#define REFBLOCK_SPAN (UINT64_C (2) << 30)      /* file one block counts */
#define NQUERIES (1u << 20)                     /* power of two */
#define HOT_WINDOWS 64
#define REPEATS 5
#define MIN_BATCH_NS 50000000.0                 /* 50 ms */

struct range {
  uint64_t first, n;
  unsigned type;                /* 1-based, as overlap_set takes it */
};

struct layout {
  struct range *r;              /* sorted by first */
  size_t n, cap;
  uint64_t clusters;            /* host file size in clusters */
};

static uint64_t
rnd (uint64_t *state)
{
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

static double
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Bytes the allocator holds for us: what the map costs is the
 * difference before and after building it.
 */
static size_t
heap_in_use (void)
{
  struct mallinfo2 mi = mallinfo2 ();

  return mi.uordblks + mi.hblkhd;
}

static void
layout_push (struct layout *l, uint64_t c, unsigned type)
{
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 1024;
    l->r = realloc (l->r, l->cap * sizeof *l->r);
    if (!l->r) {
      perror ("realloc");
      exit (EXIT_FAILURE);
    }
  }
  l->r[l->n++] = (struct range) { c, 1, type };
}

/* The file a sequential fill of a disk of size bytes leaves: header,
 * L1 and refcount table first, then each L2 table just before the
 * data it maps, and a refcount block at the start of each 2 GiB of
 * file it counts.
 */
static void
layout_make (struct layout *l, uint64_t size)
{
  const uint64_t per_l2 = L2_SPAN >> CLUSTER_BITS;
  const uint64_t per_block = REFBLOCK_SPAN >> CLUSTER_BITS;
  uint64_t l1_clusters = ((size / L2_SPAN) * 8 + 65535) >> CLUSTER_BITS;
  uint64_t c = 1 + l1_clusters + 16;  /* header, L1, refcount table */
  uint64_t next_block = 0, mapped = 0;

  memset (l, 0, sizeof *l);
  for (uint64_t data = 0; data < size >> CLUSTER_BITS; ) {
    if (c >= next_block) {
      layout_push (l, c++, TYPE_REFCOUNT_BLOCK);
      next_block += per_block;
    }
    else if (data == mapped) {
      layout_push (l, c++, TYPE_L2);
      mapped += per_l2;
    }
    else {
      uint64_t n = MIN (mapped - data, next_block - c);
      data += n;
      c += n;
    }
  }
  l->clusters = c;
}

/* Build the map as overlap_build does at open: refcount blocks, then
 * L2 tables, each in file order, then every window collapsed.
 */
static struct overlap_map *
map_build (const struct layout *l, double *ns_per_set)
{
  struct overlap_map *m = overlap_map_create (CLUSTER_BITS);
  double t = now_ns ();

  if (!m)
    abort ();
  for (int pass = 0; pass < 2; pass++) {
    unsigned want = pass == 0 ? TYPE_REFCOUNT_BLOCK : TYPE_L2;
    for (size_t i = 0; i < l->n; i++)
      if (l->r[i].type == want &&
          overlap_map_set (m, l->r[i].first, l->r[i].n, want) < 0)
        abort ();
  }
  if (overlap_map_compact (m) < 0)
    abort ();
  *ns_per_set = (now_ns () - t) / l->n;
  return m;
}

static unsigned __attribute__ ((noinline))
linear_type (const struct range *r, size_t n, uint64_t c)
{
  for (size_t i = 0; i < n; i++)
    if (c - r[i].first < r[i].n)
      return r[i].type;
  return 0;
}

/* Where query answers go, so that no loop is optimized away. */
static volatile unsigned sink;

struct checker {
  struct overlap_map *m;
  const struct layout *l;
};

static unsigned
check_one (const struct checker *k, uint64_t c)
{
  return k->m ? overlap_map_type (k->m, c) : linear_type (k->l->r, k->l->n, c);
}

/* ns per query: batches grown until one takes MIN_BATCH_NS, then the
 * median of REPEATS batches of that size.
 */
static double
time_queries (const struct checker *k, const uint64_t *q)
{
  double t[REPEATS];
  uint64_t batch = 64;
  unsigned acc = 0;
  size_t i = 0;

  for (;;) {
    double t0 = now_ns ();
    for (uint64_t j = 0; j < batch; j++)
      acc += check_one (k, q[i++ & (NQUERIES - 1)]);
    if (now_ns () - t0 >= MIN_BATCH_NS)
      break;
    batch *= 2;
  }
  for (int r = 0; r < REPEATS; r++) {
    double t0 = now_ns ();
    for (uint64_t j = 0; j < batch; j++)
      acc += check_one (k, q[i++ & (NQUERIES - 1)]);
    t[r] = (now_ns () - t0) / batch;
  }
  sink = acc;
  for (int a = 0; a < REPEATS; a++)       /* insertion sort */
    for (int b = a; b > 0 && t[b] < t[b - 1]; b--) {
      double x = t[b];
      t[b] = t[b - 1];
      t[b - 1] = x;
    }
  return t[REPEATS / 2];
}

static void
human (char *buf, size_t len, double bytes)
{
  const char *unit = "B";

  if (bytes >= 1 << 20) {
    bytes /= 1 << 20;
    unit = "MiB";
  }
  else if (bytes >= 1 << 10) {
    bytes /= 1 << 10;
    unit = "KiB";
  }
  snprintf (buf, len, "%.1f %s", bytes, unit);
}

int
main (int argc, char *argv[])
{
  static const struct {
    const char *name, *arg;
    uint64_t size;
  } sizes[] = {
    { "1 GB", "1G", UINT64_C (1) << 30 },
    { "10 GB", "10G", UINT64_C (10) << 30 },
    { "100 GB", "100G", UINT64_C (100) << 30 },
    { "1 TB", "1T", UINT64_C (1) << 40 },
    { "10 TB", "10T", UINT64_C (10) << 40 },
    { "100 TB", "100T", UINT64_C (100) << 40 },
  };
  const size_t nsizes = sizeof sizes / sizeof sizes[0];
  bool run[sizeof sizes / sizeof sizes[0]];
  uint64_t *q = malloc (NQUERIES * sizeof *q);
  uint64_t *hot = malloc (NQUERIES * sizeof *hot);
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  int bad = 0;

  for (size_t s = 0; s < nsizes; s++)
    run[s] = argc == 1;
  for (int i = 1; i < argc; i++) {
    size_t s;
    for (s = 0; s < nsizes && strcmp (argv[i], sizes[s].arg) != 0; s++)
      ;
    if (s == nsizes) {
      fprintf (stderr, "usage: %s [1G|10G|100G|1T|10T|100T]...\n", argv[0]);
      return EXIT_FAILURE;
    }
    run[s] = true;
  }
  if (!q || !hot)
    abort ();
  printf ("| layout | file clusters | metadata clusters | windows "
          "| map memory | map build | build per set "
          "| map ns/check | map ns/check, hot | linear ns/check |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: | ---: | ---: |\n");
  for (size_t s = 0; s < nsizes; s++) {
    struct layout l;
    struct overlap_map *m;
    double build, tmap, thot, tlin;
    uint64_t hotw[HOT_WINDOWS];
    size_t before;
    char mem[32], btime[32];

    if (!run[s])
      continue;
    layout_make (&l, sizes[s].size);
    for (uint32_t i = 0; i < NQUERIES; i++)
      q[i] = rnd (&state) % l.clusters;
    for (int i = 0; i < HOT_WINDOWS; i++)
      hotw[i] = rnd (&state) % ((l.clusters + WINDOW_CLUSTERS - 1)
                                / WINDOW_CLUSTERS);
    for (uint32_t i = 0; i < NQUERIES; i++)
      hot[i] = MIN (l.clusters - 1,
                    hotw[rnd (&state) % HOT_WINDOWS] * WINDOW_CLUSTERS
                    + rnd (&state) % WINDOW_CLUSTERS);

    before = heap_in_use ();
    m = map_build (&l, &build);
    human (mem, sizeof mem, heap_in_use () - before);

    /* Both must agree, on misses and on every metadata cluster. */
    for (uint32_t i = 0; i < 1000; i++)
      bad += overlap_map_type (m, q[i]) != linear_type (l.r, l.n, q[i]);
    for (size_t i = 0; i < l.n; i++)
      bad += overlap_map_type (m, l.r[i].first) != l.r[i].type;

    tmap = time_queries (&(struct checker) { .m = m }, q);
    thot = time_queries (&(struct checker) { .m = m }, hot);
    tlin = time_queries (&(struct checker) { .l = &l }, q);
    if (build * l.n < 1e9)
      snprintf (btime, sizeof btime, "%.2f ms", build * l.n / 1e6);
    else
      snprintf (btime, sizeof btime, "%.1f s", build * l.n / 1e9);
    printf ("| %s | %" PRIu64 " | %zu | %" PRIu64 " | %s | %s "
            "| %.1f us | %.1f | %.1f | %.1f |\n",
            sizes[s].name, l.clusters, l.n,
            (l.clusters + WINDOW_CLUSTERS - 1) / WINDOW_CLUSTERS,
            mem, btime, build / 1e3, tmap, thot, tlin);
    fflush (stdout);
    overlap_map_destroy (m);
    free (l.r);
  }
  free (q);
  free (hot);
  if (bad) {
    fprintf (stderr, "overlap-micro: %d answers differ between the map "
             "and the linear scan\n", bad);
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}
