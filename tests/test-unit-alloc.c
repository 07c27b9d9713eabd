/* SPDX-License-Identifier: BSD-3-Clause */
/* Allocation and refcounts through the engine's public interface:
 * qcow2_check and its repair, an image without a first refcount block,
 * freed clusters reused under churn, the I/O pool's pieces failing
 * as their request, and a write-back ahead of a flush.
 */
#include "crashio.h"
#include "unit-engine.h"

/* qcow2_check counts what qemu-img check counts, and repairs leaks
 * (rebuilding the refcounts of a dirty image) without changing data.
 */
static void
test_check (void)
{
  const uint64_t cs = 4096, size = 64 * cs;
  struct qcow2_options rw = { .readonly = false };
  struct memenv *me = memenv_new ();
  struct qcow2_check_result res;
  struct qcow2_image *img;
  uint64_t host;
  uint8_t *buf;
  struct ib ib;

  ib_init (&ib, 3, 12, size, false);
  ib_data (&ib, 0, 1);
  ib_data (&ib, 5, 2);
  ib_zero (&ib, 7);
  ib_snapshot (&ib, "1", "s", 0, true);
  host = ib_data (&ib, 9, 3);
  ib_alloc (&ib, 2);                    /* nothing references these */
  ib_finish (&ib);

  img = open_ib (me, &ib, "check.qcow2", &rw, NULL);
  if (CHECK (img != NULL)) {
    CHECK_INT (qcow2_check (img, false, &res), 0);
    CHECK_EQ (res.corruptions, 0);
    CHECK_EQ (res.leaks, 2);
    CHECK_INT (qcow2_check (img, true, &res), 0);
    CHECK_EQ (res.leaks_fixed, 2);
    CHECK_INT (qcow2_check (img, false, &res), 0);
    CHECK_EQ (res.corruptions + res.leaks, 0);
    check_reads (img, &ib.model, 0, size, "after reclaiming leaks");
    /* The reclaimed clusters are used again, and nothing breaks. */
    buf = malloc (3 * cs);
    memset (buf, 0x5a, 3 * cs);
    CHECK_INT (qcow2_write (img, buf, 3 * cs, 20 * cs, true), 0);
    CHECK_INT (qcow2_check (img, false, &res), 0);
    CHECK_EQ (res.corruptions + res.leaks, 0);
    free (buf);
    qcow2_close (img);
  }

  /* A referenced cluster counted zero times: a corruption (its COPIED
   * flag disagrees too).
   */
  set_refcount (ib.buf, cs, host, 0);
  ib_dump_bytes ("check-corrupt.qcow2", ib.buf, ib.len);
  img = open_ib (me, &ib, "check.qcow2", NULL, NULL);
  if (CHECK (img != NULL)) {
    CHECK_INT (qcow2_check (img, false, &res), 0);
    CHECK_EQ (res.corruptions, 2);
    CHECK_EQ (res.leaks, 2);
    qcow2_close (img);
  }

  /* Left dirty by lazy refcounts: the repair rebuilds the refcounts. */
  ib.buf[72 + 7] |= 1;                  /* incompatible: dirty */
  ib.buf[80 + 7] |= 1;                  /* compatible: lazy refcounts */
  img = open_ib (me, &ib, "check.qcow2", &rw, NULL);
  if (CHECK (img != NULL)) {
    CHECK_INT (qcow2_check (img, true, &res), 0);
    CHECK_INT (qcow2_check (img, false, &res), 0);
    CHECK_EQ (res.corruptions + res.leaks, 0);
    check_reads (img, &ib.model, 0, size, "after rebuilding refcounts");
    qcow2_close (img);
  }
  ib_free (&ib);
  memenv_free (me);
}

/* An image whose refcount table has no first block: an allocation must
 * fail (not loop making that block in the header's place, forever),
 * and mark the image corrupt, as QEMU does ("Preventing invalid
 * allocation of refcount block at offset 0"), the header otherwise
 * as it was, whatever the overlap guard's mode.
 */
static void
test_no_first_refblock (void)
{
  const uint64_t cs = 512, size = 64 * cs;
  const char *const modes[] = { NULL, "none" };

  for (size_t m = 0; m < 2; m++) {
    struct memenv *me = memenv_new ();
    struct qcow2_options opts = { 0 };
    struct qcow2_image *img;
    struct qcow2_io *io;
    uint8_t *buf = calloc (1, cs), head[512];
    struct ib ib;

    ib_init (&ib, 3, 9, size, false);
    ib_data (&ib, 0, 1);
    ib_finish (&ib);
    be64_put (ib.buf + cs, 0);
    if (modes[m]) {
      opts.overlap_set = true;
      opts.overlap_mask = qcow2_overlap_mode (modes[m]);
    }
    img = open_ib (me, &ib, "no-first-refblock.qcow2", &opts, &io);
    if (CHECK (img != NULL)) {
      CHECK_INT (qcow2_write (img, buf, cs, 20 * cs, false), -EIO);
      CHECK (strstr (memenv_last_error (me), "refcount table entry 0"));
      CHECK (strstr (memenv_last_error (me), "marked corrupt"));
      CHECK (qcow2_is_corrupt (img));
      CHECK_INT (qcow2_write (img, buf, cs, 30 * cs, false), -EPERM);
      CHECK_INT (io->ops->pread (io, head, cs, 0), 0);
      CHECK_EQ (head[72 + 7], ib.buf[72 + 7] | 2);     /* corrupt bit */
      head[72 + 7] = ib.buf[72 + 7];
      CHECK (memcmp (head, ib.buf, cs) == 0);
      qcow2_close (img);
      io->ops->close (io);
    }
    free (buf);
    ib_free (&ib);
    memenv_free (me);
  }
}

/* An image whose header's cluster has refcount 0 (its block is there):
 * the allocator must not hand the header out, for an L2 table or for
 * data, even with the overlap guard off; the image is marked corrupt,
 * the header otherwise as it was.
 */
static void
test_header_refcount_0 (void)
{
  const uint64_t cs = 512, size = 256 * cs;
  const char *const modes[] = { NULL, "none" };

  for (size_t m = 0; m < 2; m++) {
    struct memenv *me = memenv_new ();
    struct qcow2_options opts = { 0 };
    struct qcow2_image *img;
    struct qcow2_io *io;
    uint8_t *buf = calloc (1, cs), head[512];
    struct ib ib;

    ib_init (&ib, 3, 9, size, false);
    ib_data (&ib, 0, 1);
    ib_finish (&ib);
    be16_put (ib.buf + be64_get (ib.buf + cs), 0);
    if (modes[m]) {
      opts.overlap_set = true;
      opts.overlap_mask = qcow2_overlap_mode (modes[m]);
    }
    img = open_ib (me, &ib, "header-refcount-0.qcow2", &opts, &io);
    if (CHECK (img != NULL)) {
      /* Past the first L2 table's reach: a new table is needed. */
      CHECK_INT (qcow2_write (img, buf, cs, 200 * cs, false), -EIO);
      CHECK (strstr (memenv_last_error (me), "the header's cluster has "
                     "refcount 0"));
      CHECK (qcow2_is_corrupt (img));
      CHECK_INT (io->ops->pread (io, head, cs, 0), 0);
      CHECK_EQ (head[72 + 7], ib.buf[72 + 7] | 2);     /* corrupt bit */
      head[72 + 7] = ib.buf[72 + 7];
      CHECK (memcmp (head, ib.buf, cs) == 0);
      qcow2_close (img);
      io->ops->close (io);
    }
    free (buf);
    ib_free (&ib);
    memenv_free (me);
  }
}

/* Churn: fill, then trim a scattered half and write it again, cycle
 * after cycle.  Freed clusters are reused, so the file stops growing
 * after the first cycle and stays within the data, the metadata and
 * the reserve (4 MiB); the data reads back, and a clean close leaves
 * no leak.
 */
static void
test_churn_reuse (void)
{
  const uint64_t cs = 65536, n = 256, size = n * cs;
  struct memenv *me = memenv_new ();
  struct qcow2_check_result res;
  struct qcow2_image *img;
  struct qcow2_io *io;
  uint8_t *model = calloc (n, cs), *got = malloc (size);
  uint64_t seed = 7;
  size_t end1 = 0, len;
  struct ib ib;

  ib_init (&ib, 3, 16, size, false);
  ib_finish (&ib);
  img = open_ib (me, &ib, "churn.qcow2", NULL, &io);
  if (!CHECK (img != NULL && model && got))
    goto out;
  for (uint64_t c = 0; c < n; c++)
    memset (model + c * cs, (int) (c % 250) + 1, cs);
  CHECK_INT (qcow2_write (img, model, size, 0, false), 0);
  CHECK_INT (qcow2_flush (img), 0);
  for (int cycle = 1; cycle <= 6; cycle++) {
    bool trimmed[256] = { false };
    for (uint64_t i = 0; i < n / 2; i++) {
      seed = seed * 6364136223846793005u + 1442695040888963407u;
      uint64_t c = (seed >> 33) % n;
      if (!trimmed[c]) {
        trimmed[c] = true;
        CHECK_INT (qcow2_trim (img, cs, c * cs, false), 0);
      }
    }
    CHECK_INT (qcow2_flush (img), 0);
    for (uint64_t c = 0; c < n; c++) {
      if (!trimmed[c])
        continue;
      memset (model + c * cs, (int) ((c + cycle) % 250) + 1, cs);
      CHECK_INT (qcow2_write (img, model + c * cs, cs, c * cs, false), 0);
    }
    CHECK_INT (qcow2_flush (img), 0);
    memio_data (io, &len);
    if (cycle == 1)
      end1 = len;
    else if (!CHECK (len == end1))
      fprintf (stderr, "cycle %d: the file grew from %zu to %zu bytes\n",
               cycle, end1, len);
  }
  CHECK (end1 <= size + 8 * cs + (4 << 20));
  CHECK_INT (qcow2_read (img, got, size, 0), 0);
  CHECK (memcmp (got, model, size) == 0);
  CHECK_INT (qcow2_close (img), 0);
  img = open_ib (me, &(struct ib) { .buf = (uint8_t *) memio_data (io, &len),
                                    .len = len }, "churn.qcow2", NULL, NULL);
  if (CHECK (img != NULL)) {
    CHECK_INT (qcow2_check (img, false, &res), 0);
    CHECK (res.corruptions == 0 && res.leaks == 0);
    qcow2_close (img);
  }
 out:
  io->ops->close (io);
  free (model);
  free (got);
  ib_free (&ib);
  memenv_free (me);
}

/* While armed, every read or write of exactly len bytes fails: the
 * data pieces of a fragmented request, which the engine's I/O pool does
 * on several threads at once.
 */
struct pool_fault {
  size_t len;
  bool reads, writes;
};

static int
pool_fault_hook (void *opaque, enum crashio_op op, uint64_t offset,
                 uint64_t count)
{
  const struct pool_fault *f = opaque;

  (void) offset;
  if (count != f->len)
    return 0;
  return (op == CRASHIO_PREAD && f->reads) ||
    (op == CRASHIO_PWRITE && f->writes) ? EIO : 0;
}

/* The I/O pool's pieces fail and succeed as the request's: a failed
 * piece fails the whole read or write with its error, the others'
 * results stand, and the image serves again once the fault clears.
 */
static void
test_pool_errors (void)
{
  const uint64_t cs = 4096, n = 64;
  struct memenv *me = memenv_new ();
  struct crashio *c = crashio_new (NULL, 0);
  struct qcow2_io *io = crashio_io (c);
  struct pool_fault f = { .len = cs };
  struct qcow2_create_options co = { .size = 1 << 20, .cluster_size = cs };
  struct qcow2_options opts = { .io_threads = 3 };
  struct qcow2_image *img;
  uint8_t *want = malloc (n * cs), *got = malloc (n * cs);

  if (!me || !want || !got) {
    perror ("test_pool_errors");
    exit (EXIT_FAILURE);
  }
  crashio_set_hook (c, pool_fault_hook, &f);
  CHECK_EQ (qcow2_create (memenv_env (me), io, &co), 0);
  img = qcow2_open (memenv_env (me), io, "pool.qcow2", &opts);
  if (!CHECK (img != NULL))
    goto out;
  /* Clusters allocated last to first: the range lies backwards in the
   * file, one piece per cluster.
   */
  for (uint64_t i = n; i-- > 0; ) {
    memset (want + i * cs, (int) i + 1, cs);
    CHECK_EQ (qcow2_write (img, want + i * cs, cs, i * cs, false), 0);
  }
  CHECK_EQ (qcow2_read (img, got, n * cs, 0), 0);
  CHECK (memcmp (got, want, n * cs) == 0);

  f.reads = true;
  CHECK_EQ ((uint64_t) -qcow2_read (img, got, n * cs, 0), EIO);
  f.reads = false;
  memset (got, 0, n * cs);
  CHECK_EQ (qcow2_read (img, got, n * cs, 0), 0);
  CHECK (memcmp (got, want, n * cs) == 0);

  /* An overwrite in place whose pieces fail leaves each cluster old or
   * new; once the fault clears it goes through.
   */
  for (uint64_t i = 0; i < n; i++)
    memset (want + i * cs, 0xa0 + (int) (i & 15), cs);
  f.writes = true;
  CHECK_EQ ((uint64_t) -qcow2_write (img, want, n * cs, 0, false), EIO);
  f.writes = false;
  CHECK_EQ (qcow2_read (img, got, n * cs, 0), 0);
  for (uint64_t i = 0; i < n; i++)
    CHECKF (got[i * cs] == i + 1 || got[i * cs] == want[i * cs],
            "cluster %" PRIu64 " reads %#x after a failed write", i,
            got[i * cs]);
  CHECK_EQ (qcow2_write (img, want, n * cs, 0, false), 0);
  CHECK_EQ (qcow2_read (img, got, n * cs, 0), 0);
  CHECK (memcmp (got, want, n * cs) == 0);
  CHECK_EQ (qcow2_close (img), 0);

  /* What reached the storage is a sound image holding the same. */
  img = qcow2_open (memenv_env (me), crashio_io (c), "pool.qcow2",
                    &no_opts);
  if (CHECK (img != NULL)) {
    CHECK_EQ (qcow2_read (img, got, n * cs, 0), 0);
    CHECK (memcmp (got, want, n * cs) == 0);
    qcow2_close (img);
  }
 out:
  crashio_free (c);
  memenv_free (me);
  free (want);
  free (got);
}

/* Flushes of the file fail while *failing. */
static int
flush_fault_hook (void *opaque, enum crashio_op op, uint64_t offset,
                  uint64_t count)
{
  const bool *failing = opaque;

  (void) offset, (void) count;
  return op == CRASHIO_FLUSH && *failing ? EIO : 0;
}

/* qcow2_writeback makes the data written durable in the file (not yet
 * in the image's accounting: the flush after it still syncs), and a
 * write-back that failed is a failed flush: no flush succeeds after
 * it, as the kernel reports a lost write-back only once.
 */
static void
test_writeback (void)
{
  const uint64_t cs = 4096;
  struct memenv *me = memenv_new ();
  struct crashio *c = crashio_new (NULL, 0);
  struct qcow2_io *io = crashio_io (c);
  struct qcow2_create_options co = { .size = 1 << 20, .cluster_size = cs };
  struct qcow2_image *img;
  uint8_t buf[4096];
  const uint8_t *durable;
  bool failing = false;
  size_t len;

  if (!me) {
    perror ("test_writeback");
    exit (EXIT_FAILURE);
  }
  crashio_set_hook (c, flush_fault_hook, &failing);
  CHECK_EQ (qcow2_create (memenv_env (me), io, &co), 0);
  img = qcow2_open (memenv_env (me), io, "wb.qcow2", &no_opts);
  if (!CHECK (img != NULL))
    goto out;
  memset (buf, 0x5a, sizeof buf);
  CHECK_EQ (qcow2_write (img, buf, sizeof buf, 0, false), 0);
  CHECK_EQ (qcow2_writeback (img), 0);
  CHECK_EQ (crashio_nr_entries (c), 0);
  durable = crashio_durable (c, &len);
  CHECK (memmem (durable, len, buf, sizeof buf) != NULL);
  CHECK_EQ (qcow2_flush (img), 0);

  CHECK_EQ (qcow2_write (img, buf, sizeof buf, cs, false), 0);
  failing = true;
  CHECK_EQ ((uint64_t) -qcow2_writeback (img), EIO);
  failing = false;
  CHECK_EQ ((uint64_t) -qcow2_flush (img), EIO);
  qcow2_close (img);
 out:
  crashio_free (c);
  memenv_free (me);
}

int
main (void)
{
  test_check ();
  test_no_first_refblock ();
  test_header_refcount_0 ();
  test_churn_reuse ();
  test_pool_errors ();
  test_writeback ();
  return unit_finish ();
}
