/* SPDX-License-Identifier: BSD-3-Clause */
/* Backing layers on remote storage (in-memory storage with pread_many,
 * which counts round trips): what sequential reads, random reads and
 * several threads reading at once read, through the read-ahead of a
 * raw and of a qcow2 layer, to the last unaligned byte; that
 * sequential reads cost a round trip a window, not one a request; that
 * what was read is kept a while: read again, it costs none; and that
 * the read-ahead fetches no more than its reader asks for once runs
 * end short, until the reader streams; and that a deep reader that
 * streams costs no copies.
 */
#include <pthread.h>

#include "internal.h"
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

/* Round trips to the base for n reads of count bytes, the i-th at
 * place first + i * step of places spacing bytes apart (from 4 KiB
 * in), checked against the base.
 */
static uint64_t
read_trips (struct qcow2_image *img, const struct model *m,
            struct qcow2_io *base_io, int first, int n, int step,
            uint64_t count, uint64_t spacing, const char *what)
{
  struct memio_stats st;
  uint64_t before;

  memio_stats (base_io, &st);
  before = st.round_trips;
  for (int i = 0, p = first; i < n; i++, p += step)
    check_read (img, m, (uint64_t) p * spacing + 4096, count, what);
  memio_stats (base_io, &st);
  return st.round_trips - before;
}

/* Reads in turn, and the round trips each group takes: places 20 KiB
 * apart make no run.
 */
static const struct {
  int first, n, step;
  uint64_t count, spacing, trips;
  const char *what;
} kept_steps[] = {
  { 0, 100, 1, 8192, 20480, 100, "scattered reads" },
  { 0, 100, 1, 8192, 20480, 0, "reads of what was read" },
  { 50, 10, 1, 100, 20480, 0, "reads inside what was read" },
  /* KEPT_PIECES pieces more: the first 100 let go, the last ones
   * kept.
   */
  { 300, KEPT_PIECES, 1, 4096, 8192, KEPT_PIECES, "more scattered reads" },
  { 0, 10, 1, 8192, 20480, 10, "reads of what was let go" },
  { 300 + KEPT_PIECES - 12, 12, 1, 4096, 8192, 0, "reads of the last read" },
  /* 36 MiB in pieces of 1 MiB: the first 4 let go (the last 32 read
   * again from the last, so that none is let go).
   */
  { 0, 36, 1, MIB, 1310720, 36, "reads of 1 MiB" },
  { 35, 32, -1, MIB, 1310720, 0, "reads of the last 1 MiB pieces" },
  { 0, 4, 1, MIB, 1310720, 4, "reads of 1 MiB let go" },
};

/* top (empty) over a raw base of 48 MiB: what was read, read again, is
 * not fetched again, nor anything inside it, until KEPT_PIECES other
 * pieces or 32 MiB were read since (kept_steps).
 */
static void
test_kept (void)
{
  struct memenv *me = memenv_new ();
  struct model base;
  struct qcow2_io *base_io;
  uint8_t *raw = make_raw_sized (me, &base, &base_io, 48 * MIB);
  const struct qcow2_options small_keep = { .remote_keep = 65536 };
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
  for (size_t i = 0; i < sizeof kept_steps / sizeof kept_steps[0]; i++) {
    trips = read_trips (img, &top.model, base_io, kept_steps[i].first,
                        kept_steps[i].n, kept_steps[i].step,
                        kept_steps[i].count, kept_steps[i].spacing,
                        kept_steps[i].what);

    CHECKF (trips == kept_steps[i].trips, "%d %s took %" PRIu64
            " round trips, not %" PRIu64, kept_steps[i].n,
            kept_steps[i].what, trips, kept_steps[i].trips);
  }
  qcow2_close (img);

  /* With remote_keep, as many bytes at most: of 8 reads of 16 KiB, the
   * last 4 kept.
   */
  img = open_ib (me, &top, "/d/top.qcow2", &small_keep, NULL);
  if (!CHECKF (img != NULL, "open: %s", memenv_last_error (me)))
    goto out;
  trips = read_trips (img, &top.model, base_io, 0, 8, 1, 16384, 20480,
                      "reads of 16 KiB");
  trips += read_trips (img, &top.model, base_io, 4, 4, 1, 16384, 20480,
                       "reads of the last 4 again");
  CHECKF (trips == 8, "8 reads of 16 KiB and the last 4 again, 64 KiB "
          "kept, took %" PRIu64 " round trips, not 8", trips);
  trips = read_trips (img, &top.model, base_io, 0, 1, 1, 16384, 20480,
                      "the first read again");
  CHECKF (trips == 1, "the first of them read again, let go, took %"
          PRIu64 " round trips", trips);
  qcow2_close (img);
 out:
  ib_free (&top);
  base_io->ops->close (base_io);
  free (raw);
  memenv_free (me);
}

/* The read-ahead alone, over a layer of 1 GiB whose byte at o is
 * layer_byte (o): the bytes fetched, the fetches, and the bytes read.
 */
static struct {
  uint64_t bytes, calls, asked;
} paid;

/* Armed, the first fetch waits for a second one to start: that second
 * read comes while the first is under way (a deep reader's).
 */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool armed;
  unsigned fetches;
} gate = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static uint8_t
layer_byte (uint64_t o)
{
  return (uint8_t) (o ^ (o >> 9) ^ (o >> 17));
}

static int
paid_fetch (struct qcow2_image *layer, uint8_t *buf, uint64_t count,
            uint64_t offset)
{
  (void) layer;
  for (uint64_t i = 0; i < count; i++)
    buf[i] = layer_byte (offset + i);
  pthread_mutex_lock (&gate.lock);
  paid.bytes += count;
  paid.calls++;
  if (gate.armed) {
    gate.fetches++;
    pthread_cond_broadcast (&gate.cond);
    while (gate.fetches < 2)
      pthread_cond_wait (&gate.cond, &gate.lock);
  }
  pthread_mutex_unlock (&gate.lock);
  return 0;
}

/* Read [offset, offset+count) through ra, checked.  Returns true if it
 * fetched more than that (a window).
 */
static bool
paid_read (struct readahead *ra, uint64_t offset, uint64_t count)
{
  uint8_t *buf = malloc (count);
  uint64_t before = paid.bytes;
  bool ok;

  if (!buf)
    abort ();
  ok = readahead_read (ra, buf, count, offset) == 0;
  for (uint64_t i = 0; ok && i < count; i++)
    ok = buf[i] == layer_byte (offset + i);
  CHECKF (ok, "reading %" PRIu64 " bytes at %" PRIu64 " through the "
          "read-ahead", count, offset);
  paid.asked += count;
  free (buf);
  return paid.bytes - before > count;
}

/* A read-ahead over a layer of size bytes whose byte at o is
 * layer_byte (o), the counts zeroed.
 */
static struct readahead *
paid_new (uint64_t size, struct qcow2_image **layer)
{
  struct readahead *ra;

  *layer = calloc (1, sizeof **layer);
  if (!*layer)
    abort ();
  (*layer)->size = size;
  ra = readahead_new (*layer, paid_fetch, 0);
  if (!ra)
    abort ();
  memset (&paid, 0, sizeof paid);
  return ra;
}

static void
paid_free (struct readahead *ra, struct qcow2_image *layer)
{
  readahead_free (ra);
  free (layer);
}

/* Returns the bytes fetched beyond those read. */
static int64_t
paid_excess (void)
{
  return (int64_t) paid.bytes - (int64_t) paid.asked;
}

/* Short runs (a file's first 32 KiB, then 128 KiB, every third run
 * 128 KiB more) at the next n of 1000 places 1 MiB apart, in scattered
 * order (*k: how many were read); the first 128 KiB of each into places
 * if given.  Returns the windows fetched.
 */
static unsigned
paid_runs (struct readahead *ra, unsigned *k, unsigned n, uint64_t *places)
{
  unsigned windows = 0;

  for (unsigned i = 0; i < n; i++, ++*k) {
    uint64_t o = (*k * 337 % 1000) * MIB;

    if (places)
      places[i] = o + 32768;
    windows += paid_read (ra, o, 32768);
    windows += paid_read (ra, o + 32768, 131072);
    if (i % 3 == 0)
      windows += paid_read (ra, o + 163840, 131072);
  }
  return windows;
}

/* A reader whose runs end short (a guest's boot) makes the layer send
 * no more than it asked for but the window of its first short run;
 * reads of what it read before fund windows again, never past what
 * they saved; a run of more than 32 MiB (a stream) gets its windows
 * back.
 */
static void
test_paid (void)
{
  struct qcow2_image *layer;
  struct readahead *ra;
  uint64_t places[60], calls;
  int64_t first;
  unsigned k = 0, windows;

  ra = paid_new (1100 * MIB, &layer);

  /* The first run's window is fetched and left unread: the read-ahead
   * is trusted no more.
   */
  paid_runs (ra, &k, 2, NULL);
  first = paid_excess ();
  CHECKF (first > 0 && first <= 131072, "the first short runs fetched "
          "%" PRId64 " bytes more than read, not one window of 128 KiB",
          first);
  windows = paid_runs (ra, &k, 300, NULL);
  CHECKF (windows == 0 && paid_excess () == first, "300 short runs more "
          "fetched %u windows, %" PRId64 " bytes more than read in all "
          "(%" PRId64 " after the first)", windows, paid_excess (), first);

  /* Reads of what was read: kept, they fetch nothing, and what they
   * saved funds windows, never more.
   */
  paid_runs (ra, &k, 60, places);
  for (unsigned i = 0; i < 60; i++)
    paid_read (ra, places[i], 131072);
  CHECKF (paid_excess () < 0, "60 reads again of 128 KiB left %" PRId64
          " bytes fetched beyond those read", paid_excess ());
  windows = paid_runs (ra, &k, 300, NULL);
  CHECKF (windows > 0 && paid_excess () <= 0, "300 short runs after "
          "reads again fetched %u windows and %" PRId64 " bytes more than "
          "read in all", windows, paid_excess ());

  /* A stream of 40 MiB (past the short runs' places: a window ends
   * where a kept piece begins): its first 32 MiB a fetch a read or so,
   * its last 8 in windows.
   */
  for (uint64_t o = 0; o < 32 * MIB; o += MIB)
    paid_read (ra, 1040 * MIB + o, MIB);
  calls = paid.calls;
  for (uint64_t o = 32 * MIB; o < 40 * MIB; o += MIB)
    paid_read (ra, 1040 * MIB + o, MIB);
  CHECKF (paid.calls - calls <= 3, "the last 8 MiB of a stream of 40 MiB "
          "took %" PRIu64 " fetches", paid.calls - calls);

  paid_free (ra, layer);
}

/* A run of small reads (a file system's metadata) fetches no more
 * ahead than it has read, and still grows its windows as it goes on.
 */
static void
test_small_runs (void)
{
  struct qcow2_image *layer;
  struct readahead *ra;
  uint64_t calls, bytes;

  ra = paid_new (1024 * MIB, &layer);
  paid_read (ra, 100 * MIB, 4096);
  paid_read (ra, 100 * MIB + 4096, 4096);
  CHECKF (paid_excess () <= 8192, "two adjacent reads of 4 KiB fetched "
          "%" PRId64 " bytes more than they read", paid_excess ());
  calls = paid.calls;
  for (uint64_t o = 8192; o < MIB; o += 4096)
    paid_read (ra, 100 * MIB + o, 4096);
  CHECKF (paid.calls - calls <= 12, "the run's next 1016 KiB in reads of "
          "4 KiB took %" PRIu64 " fetches", paid.calls - calls);

  /* A run whose reads grow (the reader's own read-ahead) gets no
   * window.
   */
  bytes = paid.bytes;
  for (uint64_t o = 0, n = 16384; n <= 262144; o += n, n *= 2)
    paid_read (ra, 200 * MIB + o, n);
  CHECKF (paid.bytes - bytes == 507904, "reads of 16 to 256 KiB, each "
          "twice the last, fetched %" PRIu64 " bytes for 496 KiB",
          paid.bytes - bytes);
  paid_free (ra, layer);
}

struct deep_read {
  struct readahead *ra;
  uint64_t offset, count;
  bool ok;
};

/* A read through the read-ahead, checked (not counted in paid.asked:
 * two run at once).
 */
static void *
deep_read_thread (void *arg)
{
  struct deep_read *d = arg;
  uint8_t *buf = malloc (d->count);

  if (!buf)
    abort ();
  d->ok = readahead_read (d->ra, buf, d->count, d->offset) == 0;
  for (uint64_t i = 0; d->ok && i < d->count; i++)
    d->ok = buf[i] == layer_byte (d->offset + i);
  free (buf);
  return NULL;
}

/* A read made while another is under way (a deep reader's) is kept
 * when small: read again, it costs no fetch.
 */
static void
test_deep_kept (void)
{
  struct qcow2_image *layer;
  struct deep_read first, second;
  struct readahead *ra;
  pthread_t t1, t2;
  uint64_t calls;

  ra = paid_new (1024 * MIB, &layer);
  gate.armed = true;
  gate.fetches = 0;
  first = (struct deep_read) { ra, 10 * MIB, 65536, false };
  second = (struct deep_read) { ra, 20 * MIB, 262144, false };
  if (pthread_create (&t1, NULL, deep_read_thread, &first) != 0)
    abort ();
  /* The second read starts once the first is fetching. */
  pthread_mutex_lock (&gate.lock);
  while (gate.fetches < 1)
    pthread_cond_wait (&gate.cond, &gate.lock);
  pthread_mutex_unlock (&gate.lock);
  if (pthread_create (&t2, NULL, deep_read_thread, &second) != 0)
    abort ();
  pthread_join (t1, NULL);
  pthread_join (t2, NULL);
  CHECKF (first.ok && second.ok, "two reads at once read other data");
  gate.armed = false;
  calls = paid.calls;
  paid_read (ra, 20 * MIB, 262144);
  paid_read (ra, 20 * MIB + 4096, 8192);
  CHECKF (paid.calls == calls, "reading again 256 KiB read while another "
          "read was under way took %" PRIu64 " fetches", paid.calls - calls);
  paid_free (ra, layer);
}

/* Reads [offset, offset+count) and [offset+count, offset+2*count) in two
 * threads, the first read's fetch under way when the second starts (or
 * the second's when the first starts, if reversed): a deep reader's two
 * reads in flight, in order or not.
 */
static void
deep_pair (struct readahead *ra, uint64_t offset, uint64_t count,
           bool reversed)
{
  struct deep_read first = { ra, offset, count, false };
  struct deep_read second = { ra, offset + count, count, false };
  pthread_t t1, t2;

  gate.armed = true;
  gate.fetches = 0;
  if (pthread_create (&t1, NULL, deep_read_thread,
                      reversed ? &second : &first) != 0)
    abort ();
  pthread_mutex_lock (&gate.lock);
  while (gate.fetches < 1)
    pthread_cond_wait (&gate.cond, &gate.lock);
  pthread_mutex_unlock (&gate.lock);
  if (pthread_create (&t2, NULL, deep_read_thread,
                      reversed ? &first : &second) != 0)
    abort ();
  pthread_join (t1, NULL);
  pthread_join (t2, NULL);
  gate.armed = false;
  CHECKF (first.ok && second.ok, "two reads at once at %" PRIu64 " read "
          "other data", offset);
}

/* A deep reader streaming (nbdcopy, a guest's sequential reads at
 * QD16) copies none of its large reads into the kept pieces: not on its
 * first pass, not on a second pass from the start once the first has
 * reached the layer's end, and not when two of its reads come out of
 * order.  A read kept would be read again without a fetch.
 */
static void
test_deep_streams (void)
{
  const uint64_t count = 262144;
  struct qcow2_image *layer;
  struct readahead *ra;
  uint64_t calls;

  /* The second pass past the first read, which came alone and was
   * kept.
   */
  ra = paid_new (8 * MIB, &layer);
  for (int pass = 0; pass < 2; pass++)
    for (uint64_t o = pass * 2 * count; o < 8 * MIB; o += 2 * count)
      deep_pair (ra, o, count, pass == 1 && o == 4 * MIB);
  calls = paid.calls;
  paid_read (ra, 2 * MIB + count, count);
  CHECKF (paid.calls - calls == 1, "a second streaming pass's read of "
          "256 KiB, read again, took %" PRIu64 " fetches, not 1: it was "
          "copied and kept", paid.calls - calls);
  calls = paid.calls;
  paid_read (ra, 4 * MIB + count, count);
  paid_read (ra, 4 * MIB, count);
  CHECKF (paid.calls - calls == 2, "two streaming reads of 256 KiB that "
          "came out of order, read again, took %" PRIu64 " fetches, not 2",
          paid.calls - calls);
  paid_free (ra, layer);
}

/* A window ends where a kept piece begins. */
static void
test_window_ends_at_kept (void)
{
  struct qcow2_image *layer;
  struct readahead *ra;
  uint64_t bytes;

  ra = paid_new (1024 * MIB, &layer);
  paid_read (ra, 400 * MIB + 40960, 4096);
  paid_read (ra, 400 * MIB, 16384);
  bytes = paid.bytes;
  paid_read (ra, 400 * MIB + 16384, 16384);
  CHECKF (paid.bytes - bytes == 24576, "a run's second read of 16 KiB, "
          "a piece kept 8 KiB past it, fetched %" PRIu64 " bytes, not 24 KiB",
          paid.bytes - bytes);
  paid_free (ra, layer);
}

/* A read that kept pieces hold in part fetches only the span they do
 * not, and is kept whole.
 */
static void
test_partly_kept (void)
{
  struct qcow2_image *layer;
  struct readahead *ra;
  uint64_t bytes;

  ra = paid_new (1024 * MIB, &layer);
  paid_read (ra, 300 * MIB, 4096);
  paid_read (ra, 300 * MIB + 32768, 4096);
  bytes = paid.bytes;
  paid_read (ra, 300 * MIB, 65536);
  CHECKF (paid.bytes - bytes == 61440, "a read of 64 KiB of which two "
          "pieces of 4 KiB were kept fetched %" PRIu64 " bytes, not 60 KiB",
          paid.bytes - bytes);
  bytes = paid.bytes;
  paid_read (ra, 300 * MIB + 8192, 8192);
  paid_read (ra, 300 * MIB + 30000, 10000);
  CHECKF (paid.bytes == bytes, "reads inside that read fetched %" PRIu64
          " bytes", paid.bytes - bytes);
  paid_free (ra, layer);
}

/* The kept pieces against a model: random pieces kept over each other
 * and random reads of them, the pieces sorted, apart, and counted.
 */
static void
test_kept_set (void)
{
  const uint64_t span = 1 * MIB;
  struct kept_set k = { .limit = KEPT_BYTES };
  uint8_t *buf = malloc (span);
  bool *have = calloc (span, 1);
  uint32_t seed = 7;

  if (!buf || !have)
    abort ();
  for (int step = 0; step < 3000; step++) {
    uint64_t start, len, gs, ge, covered = 0, want = 0, allocated = 0;
    bool ok = true;

    seed = seed * 1103515245 + 12345;
    start = (seed >> 8) % span;
    seed = seed * 1103515245 + 12345;
    len = 1 + (seed >> 8) % MIN (span - start, 65536);
    if (step % 2 == 0) {
      uint8_t *piece = malloc (len);

      if (!piece)
        abort ();
      for (uint64_t i = 0; i < len; i++)
        piece[i] = layer_byte (start + i);
      kept_add (&k, piece, start, len);
      continue;
    }
    /* What the model says the pieces hold: bytes of the pieces now. */
    memset (have, 0, span);
    for (size_t i = 0; i < k.n; i++)
      allocated += k.p[i].alloc;
    ok &= allocated == k.bytes && k.bytes <= KEPT_BYTES;
    for (size_t i = 0; i < k.n; i++) {
      ok &= k.p[i].len > 0 && k.p[i].alloc >= k.p[i].len;
      ok &= i == 0 || k.p[i - 1].start + k.p[i - 1].len <= k.p[i].start;
      for (uint64_t b = 0; b < k.p[i].len; b++)
        have[k.p[i].start + b] = true;
    }
    for (uint64_t i = start; i < start + len; i++)
      want += have[i];
    memset (buf, 0, len);
    covered = kept_copy (&k, buf, start, start + len, &gs, &ge);
    ok &= covered == want;
    for (uint64_t i = 0; i < len; i++) {
      ok &= !have[start + i] || buf[i] == layer_byte (start + i);
      ok &= have[start + i] || (start + i >= gs && start + i < ge);
    }
    if (!CHECKF (ok, "kept pieces at step %d: read of %" PRIu64 " at %"
                 PRIu64 " found %" PRIu64 " bytes, the pieces %" PRIu64,
                 step, len, start, covered, want))
      break;
  }
  kept_free (&k);
  free (buf);
  free (have);
}

int
main (void)
{
  test_paid ();
  test_small_runs ();
  test_deep_kept ();
  test_deep_streams ();
  test_partly_kept ();
  test_window_ends_at_kept ();
  test_kept_set ();
  test_kept ();
  test_raw ();
  test_qcow2 ();
  return unit_finish ();
}
