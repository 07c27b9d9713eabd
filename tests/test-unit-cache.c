/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests of the L2 slice cache, seen through the public interface:
 * its size and slice size as options give them or as defaulted, and
 * its hits, misses and LRU evictions as guest reads touch slices.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "qcow2.h"
#include "memio.h"
#include "imgbuild.h"
#include "unit.h"

static struct memenv *me;

static struct qcow2_image *
open_ib (const struct ib *ib, const struct qcow2_options *opts)
{
  struct qcow2_io *io = memio_new (ib->buf, ib->len);

  if (!io)
    abort ();
  memenv_clear_errors (me);
  return qcow2_open (memenv_env (me), io, "cache.qcow2", opts);
}

static bool
read_ok (struct qcow2_image *img, const struct model *m, uint64_t off,
         uint64_t len)
{
  uint8_t *got = malloc (len), *want = malloc (len);
  bool ok;

  model_fill (m, want, len, off);
  ok = qcow2_read (img, got, len, off) == 0 && memcmp (got, want, len) == 0;
  free (got);
  free (want);
  return CHECKF (ok, "read of %" PRIu64 " at %#" PRIx64, len, off);
}

static int
ignore_extent (void *opaque, uint64_t offset, uint64_t length, uint32_t type)
{
  return 0;
}

/* Two slices of 512 bytes (64 entries, 4 MiB of guest each), and reads
 * of one cluster in slices A, B, C and D of one L2 table.
 */
static void
test_lru (void)
{
  const uint64_t cs = 65536, slice_guest = 64 * cs, span = 8192 * cs;
  struct qcow2_options opts = { .l2_cache_size = 1024, .l2_slice_size = 512 };
  struct qcow2_cache_stats st, before;
  struct qcow2_image *img;
  struct ib ib;
  static const struct {
    char slice;
    char result;                /* Hit, Miss, or Evict (a miss too) */
  } steps[] = {
    { 'A', 'M' }, { 'B', 'M' }, { 'A', 'H' }, { 'C', 'E' },   /* B out */
    { 'A', 'H' }, { 'B', 'E' }, { 'C', 'E' }, { 'B', 'H' },   /* C, A */
    { 'C', 'H' }, { 'A', 'E' }, { 'D', 'E' }, { 'D', 'H' },   /* B, C */
  };
  uint64_t hits = 0, misses = 0, evictions = 0;

  /* Two L2 tables' worth, the second absent. */
  ib_init (&ib, 3, 16, 2 * span, false);
  for (uint64_t s = 0; s < 4; s++) {
    ib_data (&ib, s * 64, s + 1);
    ib_data (&ib, s * 64 + 63, s + 11);
  }
  ib_finish (&ib);
  ib_dump (&ib, "cache.qcow2");

  img = open_ib (&ib, &opts);
  if (!CHECKF (img != NULL, "open: %s", memenv_last_error (me)))
    goto out;
  qcow2_cache_stats (img, &st);
  CHECK_EQ (st.slice_size, 512);
  CHECK_EQ (st.slices, 2);
  CHECK (st.hits == 0 && st.misses == 0 && st.evictions == 0);

  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    uint64_t s = steps[i].slice - 'A';

    /* The first cluster of the slice, or its last, for variety. */
    read_ok (img, &ib.model, s * slice_guest + (i & 1) * 63 * cs + 100, 4096);
    hits += steps[i].result == 'H';
    misses += steps[i].result != 'H';
    evictions += steps[i].result == 'E';
    qcow2_cache_stats (img, &st);
    CHECKF (st.hits == hits && st.misses == misses &&
            st.evictions == evictions,
            "step %zu (slice %c): hits %" PRIu64 " misses %" PRIu64
            " evictions %" PRIu64 ", expected %" PRIu64 " %" PRIu64 " %"
            PRIu64, i, steps[i].slice, st.hits, st.misses, st.evictions,
            hits, misses, evictions);
  }
  /* Now D (most recent), then A. */

  /* Across the end of D into the next slice, E: a hit, then a miss
   * that evicts A.
   */
  before = st;
  read_ok (img, &ib.model, 4 * slice_guest - cs, 2 * cs);
  qcow2_cache_stats (img, &st);
  CHECK_EQ (st.hits, before.hits + 1);
  CHECK_EQ (st.misses, before.misses + 1);
  CHECK_EQ (st.evictions, before.evictions + 1);

  /* Guest ranges with no L2 table never touch the cache. */
  before = st;
  read_ok (img, &ib.model, span + 12345, 3 * cs);
  qcow2_cache_stats (img, &st);
  CHECK (st.hits == before.hits && st.misses == before.misses);

  /* A read across the A/B boundary needs both slices: with E and D
   * cached, two misses and two evictions.
   */
  before = st;
  read_ok (img, &ib.model, slice_guest - 100, 200);
  qcow2_cache_stats (img, &st);
  CHECK_EQ (st.misses, before.misses + 2);
  CHECK_EQ (st.evictions, before.evictions + 2);
  CHECK_EQ (st.hits, before.hits);

  /* Extents use the same cache: B is cached, C is not (and evicts A).
   * How many hits depends on how the walk goes, so only more.
   */
  before = st;
  CHECK_INT (qcow2_extents (img, slice_guest, 2 * slice_guest, false,
                            ignore_extent, NULL), 0);
  qcow2_cache_stats (img, &st);
  CHECK (st.hits > before.hits);
  CHECK_EQ (st.misses, before.misses + 1);
  CHECK_EQ (st.evictions, before.evictions + 1);

  /* And everything still reads right after all that eviction. */
  read_ok (img, &ib.model, 0, 4 * slice_guest);
  qcow2_close (img);
 out:
  ib_free (&ib);
}

/* Extended L2 entries are 16 bytes: a 512 byte slice maps 32 clusters. */
static void
test_extended_l2_slices (void)
{
  const uint64_t cs = 65536;
  struct qcow2_options opts = { .l2_cache_size = 1024, .l2_slice_size = 512 };
  struct qcow2_cache_stats st;
  struct qcow2_image *img;
  struct ib ib;

  ib_init (&ib, 3, 16, 128 * cs, true);
  ib_data (&ib, 31, 1);
  ib_data (&ib, 32, 2);
  ib_ext (&ib, 64, 3, 0xffff0000, 0x0000ff00);
  ib_finish (&ib);
  img = open_ib (&ib, &opts);
  if (!CHECKF (img != NULL, "open: %s", memenv_last_error (me)))
    goto out;
  read_ok (img, &ib.model, 31 * cs, 2 * cs);
  qcow2_cache_stats (img, &st);
  CHECK_EQ (st.misses, 2);
  CHECK_EQ (st.hits, 0);
  read_ok (img, &ib.model, 64 * cs, 2048);      /* one subcluster */
  read_ok (img, &ib.model, 32 * cs, 1);
  qcow2_cache_stats (img, &st);
  CHECK_EQ (st.misses, 3);
  CHECK_EQ (st.evictions, 1);
  CHECK_EQ (st.hits, 1);
  qcow2_close (img);
 out:
  ib_free (&ib);
}

/* How many slices of what size the cache gets, for an image of size
 * with the options given.
 */
static void
check_geometry (unsigned cb, uint64_t size, uint64_t cache_size,
                uint64_t slice_size, uint64_t want_slice,
                uint64_t want_slices)
{
  struct qcow2_options opts = {
    .l2_cache_size = cache_size, .l2_slice_size = slice_size,
  };
  struct qcow2_cache_stats st;
  struct qcow2_image *img;
  struct ib ib;

  ib_init (&ib, 3, cb, size, false);
  ib_finish (&ib);
  img = open_ib (&ib, &opts);
  if (CHECKF (img != NULL, "open: %s", memenv_last_error (me))) {
    qcow2_cache_stats (img, &st);
    CHECKF (st.slice_size == want_slice && st.slices == want_slices,
            "cluster_bits %u, size %" PRIu64 ", l2_cache_size %" PRIu64
            ", l2_slice_size %" PRIu64 ": %" PRIu64 " slices of %" PRIu64
            ", expected %" PRIu64 " of %" PRIu64, cb, size, cache_size,
            slice_size, st.slices, st.slice_size, want_slices, want_slice);
    qcow2_close (img);
  }
  ib_free (&ib);
}

static void
check_bad_slice_size (uint64_t slice_size)
{
  struct qcow2_options opts = { .l2_slice_size = slice_size };
  struct qcow2_image *img;
  struct ib ib;

  ib_init (&ib, 3, 16, 1 << 20, false);
  ib_finish (&ib);
  img = open_ib (&ib, &opts);
  CHECKF (img == NULL && errno == EINVAL,
          "l2_slice_size %" PRIu64 " accepted", slice_size);
  CHECKF (strstr (memenv_last_error (me), "l2-slice-size"),
          "l2_slice_size %" PRIu64 ": message: %s", slice_size,
          memenv_last_error (me));
  if (img)
    qcow2_close (img);
  ib_free (&ib);
}

static void
test_geometry (void)
{
  const uint64_t GiB = UINT64_C (1) << 30;

  /* By default the cache covers the whole disk, in whole clusters,
   * with slices of a cluster: 1 GiB of 64 KiB clusters needs 128 KiB.
   */
  check_geometry (16, GiB, 0, 0, 65536, 2);
  check_geometry (12, 64 << 20, 0, 0, 4096, 32);
  /* Up to 32 MiB (4 Mi clusters of 64 KiB), then 4 KiB slices. */
  check_geometry (16, 256 * GiB, 0, 0, 65536, 512);
  check_geometry (16, 512 * GiB, 0, 0, 4096, 8192);
  /* The size asked for, but never more than the disk needs. */
  check_geometry (16, 16 << 20, 1 << 20, 512, 512, 128);
  check_geometry (16, 16 << 20, 1 << 20, 0, 65536, 2);
  check_geometry (16, 256 * GiB, 1 << 20, 0, 4096, 256);
  check_geometry (16, 256 * GiB, 1 << 20, 8192, 8192, 128);
  /* At least two slices, whatever was asked. */
  check_geometry (16, GiB, 512, 512, 512, 2);
  check_geometry (16, GiB, 1, 0, 4096, 2);
  check_geometry (9, 512, 0, 0, 512, 2);

  check_bad_slice_size (256);
  check_bad_slice_size (768);
  check_bad_slice_size (131072);        /* bigger than a cluster */
}

int
main (void)
{
  me = memenv_new ();
  test_lru ();
  test_extended_l2_slices ();
  test_geometry ();
  memenv_free (me);
  return unit_finish ();
}
