/* SPDX-License-Identifier: BSD-3-Clause */
/* Backing layers on remote storage (in-memory storage with pread_many,
 * which counts round trips): what sequential reads, random reads and
 * several threads reading at once read, through the read-ahead of a
 * raw and of a qcow2 layer, to the last unaligned byte; that
 * sequential reads cost a round trip a window, not one a request; and
 * that what was read is kept a while: read again, it costs none.
 */
#include <pthread.h>

#include "unit-engine.h"

#define MIB (UINT64_C (1) << 20)

/* The raw base: size bytes, on "nbd://h/raw". */
static uint8_t *
make_raw_sized (struct memenv *me, struct model *m, struct qcow2_io **io,
                uint64_t size)
{
  uint8_t *raw = malloc (size);

  if (!raw)
    abort ();
  model_pattern_fill (false, 41, 0, raw, size);
  *m = (struct model) { .size = size, .raw = raw };
  *io = memio_new_remote (raw, size);
  if (!*io || memenv_add (me, "nbd://h/raw", *io) < 0)
    abort ();
  return raw;
}

/* The raw base of 12 MiB and 1000 bytes. */
static uint8_t *
make_raw (struct memenv *me, struct model *m, struct qcow2_io **io)
{
  return make_raw_sized (me, m, io, 12 * MIB + 1000);
}

struct reader {
  struct qcow2_image *img;
  const struct model *m;
  unsigned id, n;
  bool ok;
};

/* Thread id of n reads 256 KiB chunks id, id + n, ... in order. */
static void *
reader (void *arg)
{
  struct reader *r = arg;

  r->ok = true;
  for (uint64_t o = r->id * 262144; o < r->m->size; o += r->n * 262144)
    r->ok &= read_matches (r->img, r->m, o, MIN (262144, r->m->size - o),
                           "threads");
  return NULL;
}

static void
check_threads (struct qcow2_image *img, const struct model *m)
{
  struct reader r[4];
  pthread_t t[4];

  for (unsigned i = 0; i < 4; i++) {
    r[i] = (struct reader) { img, m, i, 4, false };
    pthread_create (&t[i], NULL, reader, &r[i]);
  }
  for (unsigned i = 0; i < 4; i++) {
    pthread_join (t[i], NULL);
    CHECKF (r[i].ok, "reader %u read other data", i);
  }
}

/* top (local, a few clusters its own) over the raw base. */
static void
test_raw (void)
{
  struct memenv *me = memenv_new ();
  struct model base;
  struct qcow2_io *base_io;
  uint8_t *raw = make_raw (me, &base, &base_io);
  struct memio_stats st;
  struct qcow2_image *img;
  struct ib top;
  uint64_t before;

  ib_init (&top, 3, 16, 13 * MIB, false);
  top.backing = "nbd://h/raw";
  top.backing_format = "raw";
  top.model.backing = &base;
  ib_data (&top, 3, 1);
  ib_data (&top, 100, 2);
  ib_finish (&top);
  img = open_ib (me, &top, "/d/top.qcow2", NULL, NULL);
  if (!CHECKF (img != NULL, "open: %s", memenv_last_error (me)))
    goto out;

  /* Sequential 1 MiB reads: a round trip per window of 5 MiB, and one
   * for each read that top's own clusters split (13 without).
   */
  memio_stats (base_io, &st);
  before = st.round_trips;
  for (uint64_t o = 0; o < 13 * MIB; o += MIB)
    check_read (img, &top.model, o, MIB, "sequential");
  memio_stats (base_io, &st);
  CHECKF (st.round_trips - before <= 5, "13 sequential reads of 1 MiB took "
          "%" PRIu64 " round trips", st.round_trips - before);
  /* Again from the start, and random reads, and unaligned ones. */
  check_reads (img, &top.model, 0, 13 * MIB, "reads");
  for (uint64_t i = 0, s = 7; i < 200; i++) {
    uint64_t o = unit_rnd (&s) % (13 * MIB), len = 1 + unit_rnd (&s) % 300000;
    check_read (img, &top.model, o, MIN (len, 13 * MIB - o), "random");
  }
  check_threads (img, &top.model);
  qcow2_close (img);
 out:
  ib_free (&top);
  base_io->ops->close (base_io);
  free (raw);
  memenv_free (me);
}

/* top (empty) over a remote qcow2 base whose clusters lie in reverse,
 * over the raw base.
 */
static void
test_qcow2 (void)
{
  struct memenv *me = memenv_new ();
  struct model base;
  struct qcow2_io *base_io, *mid_io;
  uint8_t *raw = make_raw (me, &base, &base_io);
  struct memio_stats st;
  struct qcow2_image *img;
  struct ib mid, top;

  ib_init (&mid, 3, 16, 12 * MIB + 1024, false);
  mid.backing = "nbd://h/raw";
  mid.backing_format = "raw";
  mid.model.backing = &base;
  for (uint64_t c = 160; c-- > 20;)
    ib_data (&mid, c, (uint32_t) c);
  ib_zero (&mid, 170);
  ib_finish (&mid);
  mid_io = memio_new_remote (mid.buf, mid.len);
  if (!mid_io || memenv_add (me, "http://h/mid.qcow2", mid_io) < 0)
    abort ();
  ib_init (&top, 3, 16, 12 * MIB + 1024, false);
  top.backing = "http://h/mid.qcow2";
  top.backing_format = "qcow2";
  top.model.backing = &mid.model;
  ib_finish (&top);
  img = open_ib (me, &top, "/d/top.qcow2", NULL, NULL);
  if (!CHECKF (img != NULL, "open: %s", memenv_last_error (me)))
    goto out;
  memio_stats (mid_io, &st);
  uint64_t before = st.round_trips;
  for (uint64_t o = 0; o < mid.model.size; o += MIB)
    check_read (img, &top.model, o, MIN (MIB, mid.model.size - o),
                "sequential");
  memio_stats (mid_io, &st);
  /* 140 clusters in reverse, 16 a read: windows of 5 MiB, each read in
   * batches of 32 runs (10 round trips without).
   */
  CHECKF (st.round_trips - before <= 7, "13 sequential reads of 1 MiB of "
          "a fragmented remote base took %" PRIu64 " round trips",
          st.round_trips - before);
  check_reads (img, &top.model, 0, mid.model.size, "reads");
  check_threads (img, &top.model);
  check_extents (img, &top.model, 0, mid.model.size, "extents");
  qcow2_close (img);
 out:
  ib_free (&top);
  ib_free (&mid);
  mid_io->ops->close (mid_io);
  base_io->ops->close (base_io);
  free (raw);
  memenv_free (me);
}

/* Round trips to the base for reads of count bytes at n scattered
 * places (one every 20 KiB, from first, so that no two make a run),
 * checked against the base.
 */
static uint64_t
scattered_trips (struct qcow2_image *img, const struct model *m,
                 struct qcow2_io *base_io, unsigned first, unsigned n,
                 uint64_t count, const char *what)
{
  struct memio_stats st;
  uint64_t before;

  memio_stats (base_io, &st);
  before = st.round_trips;
  for (unsigned i = first; i < first + n; i++)
    check_read (img, m, i * 20480 + 4096, count, what);
  memio_stats (base_io, &st);
  return st.round_trips - before;
}

/* Round trips for n reads of 1 MiB, 1.25 MiB apart, from piece first
 * by step.
 */
static uint64_t
large_trips (struct qcow2_image *img, const struct model *m,
             struct qcow2_io *base_io, int first, int n, int step)
{
  struct memio_stats st;
  uint64_t before;

  memio_stats (base_io, &st);
  before = st.round_trips;
  for (int i = 0, p = first; i < n; i++, p += step)
    check_read (img, m, (uint64_t) p * 1310720, MIB, "large");
  memio_stats (base_io, &st);
  return st.round_trips - before;
}

/* top (empty) over a raw base of 48 MiB: what was read, read again, is
 * not fetched again, nor anything inside it, until 512 other pieces or
 * 32 MiB were read since.
 */
static void
test_kept (void)
{
  struct memenv *me = memenv_new ();
  struct model base;
  struct qcow2_io *base_io;
  uint8_t *raw = make_raw_sized (me, &base, &base_io, 48 * MIB);
  struct qcow2_image *img;
  struct ib top;
  uint64_t trips;

  ib_init (&top, 3, 16, 48 * MIB, false);
  top.backing = "nbd://h/raw";
  top.backing_format = "raw";
  top.model.backing = &base;
  ib_finish (&top);
  img = open_ib (me, &top, "/d/top.qcow2", NULL, NULL);
  if (!CHECKF (img != NULL, "open: %s", memenv_last_error (me)))
    goto out;
  trips = scattered_trips (img, &top.model, base_io, 0, 100, 8192, "first");
  CHECKF (trips == 100, "100 scattered reads took %" PRIu64 " round trips",
          trips);
  trips = scattered_trips (img, &top.model, base_io, 0, 100, 8192, "again");
  CHECKF (trips == 0, "100 reads of what was read took %" PRIu64
          " round trips", trips);
  trips = scattered_trips (img, &top.model, base_io, 50, 10, 100, "inside");
  CHECKF (trips == 0, "10 reads inside what was read took %" PRIu64
          " round trips", trips);
  /* 512 pieces more: the first 100 let go, the last ones kept. */
  trips = scattered_trips (img, &top.model, base_io, 100, 512, 4096, "more");
  CHECKF (trips == 512, "512 scattered reads took %" PRIu64 " round trips",
          trips);
  trips = scattered_trips (img, &top.model, base_io, 0, 10, 8192, "let go");
  CHECKF (trips == 10, "10 reads of what was let go took %" PRIu64
          " round trips", trips);
  trips = scattered_trips (img, &top.model, base_io, 600, 12, 4096, "kept");
  CHECKF (trips == 0, "12 reads of the last read took %" PRIu64
          " round trips", trips);
  /* 1 MiB pieces, 1.25 MiB apart, 36 of them: the first 4 let go (the
   * last 32 read again from the last, so that none is let go).
   */
  trips = large_trips (img, &top.model, base_io, 0, 36, 1);
  CHECKF (trips == 36, "36 reads of 1 MiB took %" PRIu64 " round trips",
          trips);
  trips = large_trips (img, &top.model, base_io, 35, 32, -1);
  CHECKF (trips == 0, "32 reads of the last 1 MiB pieces took %" PRIu64
          " round trips", trips);
  trips = large_trips (img, &top.model, base_io, 0, 4, 1);
  CHECKF (trips == 4, "4 reads of 1 MiB let go took %" PRIu64
          " round trips", trips);
  qcow2_close (img);
 out:
  ib_free (&top);
  base_io->ops->close (base_io);
  free (raw);
  memenv_free (me);
}

int
main (void)
{
  test_kept ();
  test_raw ();
  test_qcow2 ();
  return unit_finish ();
}
