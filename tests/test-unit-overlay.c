/* SPDX-License-Identifier: BSD-3-Clause */
/* A backing file handed to the engine open (qcow2_options.backing_io),
 * and copy-on-read (qcow2_fill, copy_on_read): what is filled, what is
 * not (clusters a client wrote, partly allocated ones), zero flags for
 * zeros, and fills racing writes from other threads.
 *
 * What a fill left in the image is seen by opening the image again
 * over a backing file of other bytes (0xee): a filled cluster still
 * reads as the first backing file, an unfilled one as 0xee.
 */
#include <pthread.h>
#include <unistd.h>

#include "unit-engine.h"

#define CS 65536
#define SIZE (16 * CS)
#define OTHER 0xee

/* A raw backing file over an in-memory file, whose status op says that
 * [hole_start, hole_end) is a hole; it counts its closes and any write.
 */
struct holeio {
  struct qcow2_io io;
  struct qcow2_io *inner;
  uint64_t hole_start, hole_end;
  unsigned *closes, *writes;
};

/* Each read of a backing file takes this long (a slow remote disk), so
 * that others' requests come between a fill's read and its commit.
 */
static unsigned read_delay_us;

static int
holeio_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  struct qcow2_io *in = ((struct holeio *) io)->inner;

  if (read_delay_us)
    usleep (read_delay_us);
  return in->ops->pread (in, buf, count, offset);
}

static int
holeio_pwrite (struct qcow2_io *io, const void *buf, size_t count,
               uint64_t offset)
{
  ++*((struct holeio *) io)->writes;
  return -EROFS;
}

static int
holeio_flush (struct qcow2_io *io)
{
  ++*((struct holeio *) io)->writes;
  return 0;
}

static int
holeio_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  ++*((struct holeio *) io)->writes;
  return -EOPNOTSUPP;
}

static int64_t
holeio_size (struct qcow2_io *io)
{
  struct qcow2_io *in = ((struct holeio *) io)->inner;
  return in->ops->size (in);
}

static int
holeio_status (struct qcow2_io *io, uint64_t offset, uint64_t count,
               uint32_t *type, uint64_t *len)
{
  struct holeio *h = (struct holeio *) io;
  bool hole = offset >= h->hole_start && offset < h->hole_end;

  *type = hole ? QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO : 0;
  if (hole)
    *len = h->hole_end - offset;
  else if (offset < h->hole_start)
    *len = h->hole_start - offset;
  else
    *len = count;
  *len = MIN (*len, count);
  return 0;
}

static void
holeio_close (struct qcow2_io *io)
{
  struct holeio *h = (struct holeio *) io;

  ++*h->closes;
  h->inner->ops->close (h->inner);
  free (h);
}

static const struct qcow2_io_ops holeio_ops = {
  .pread = holeio_pread, .pwrite = holeio_pwrite, .flush = holeio_flush,
  .punch = holeio_punch, .size = holeio_size, .status = holeio_status,
  .close = holeio_close,
};

static unsigned closes, writes;

static struct qcow2_io *
holeio_new (const uint8_t *data, uint64_t len, uint64_t hole_start,
            uint64_t hole_end)
{
  struct holeio *h = calloc (1, sizeof *h);

  if (!h || !(h->inner = memio_new (data, len)))
    abort ();
  h->io.ops = &holeio_ops;
  h->hole_start = hole_start;
  h->hole_end = hole_end;
  h->closes = &closes;
  h->writes = &writes;
  return &h->io;
}

/* The disk: clusters 6 to 9 zeros (a hole), the rest data. */
static uint8_t disk[SIZE], other[SIZE];

static void
make_disk (void)
{
  for (uint64_t o = 0; o < SIZE; o++)
    disk[o] = o >= 6 * CS && o < 10 * CS ? 0 : model_pattern (false, 7, o);
  memset (other, OTHER, SIZE);
}

/* A new empty image of SIZE (cluster size cs), its header naming a
 * backing file the environment does not have.
 */
static struct qcow2_io *
new_image (struct memenv *me, uint64_t cs, bool v2, bool extl2)
{
  struct qcow2_create_options co = {
    .size = SIZE, .cluster_size = cs, .compat_v2 = v2, .extended_l2 = extl2,
    .backing = "not-there.raw", .backing_format = "raw",
  };
  struct qcow2_io *io = memio_new (NULL, 0);

  if (!io || qcow2_create (memenv_env (me), io, &co) < 0)
    abort ();
  return io;
}

/* Open the image in io (a reference is taken) over a backing file of
 * data (a hole where the disk has one).
 */
static struct qcow2_image *
open_over (struct memenv *me, struct qcow2_io *io, const uint8_t *data,
           bool cor)
{
  struct qcow2_options o = {
    .backing_io = holeio_new (data, SIZE, 6 * CS, 10 * CS),
    .backing_io_name = "the plugin's disk", .copy_on_read = cor,
  };

  return qcow2_open (memenv_env (me), memio_ref (io), "overlay.qcow2", &o);
}

static uint64_t
first_diff (const uint8_t *a, const uint8_t *b, uint64_t len)
{
  uint64_t i = 0;
  while (i < len && a[i] == b[i])
    i++;
  return i;
}

/* Whether img reads [off, off+len) as want. */
static bool
reads_as (struct qcow2_image *img, const uint8_t *want, uint64_t off,
          uint64_t len, const char *what)
{
  uint8_t *got = malloc (len);
  int r = qcow2_read (img, got, len, off);
  bool ok = CHECKF (r == 0, "%s: read failed: %d", what, r) &&
    CHECKF (memcmp (got, want + off, len) == 0, "%s: read of %" PRIu64
            " at %#" PRIx64 " differs at %#" PRIx64, what, len, off,
            off + first_diff (got, want + off, len));
  free (got);
  return ok;
}

/* Which clusters of the image in io are filled (or written): those
 * that read as guest, not as OTHER, over a backing file of OTHER.
 * want[c]: '1' filled, '0' not; NULL: all filled.
 */
static void
check_filled (struct memenv *me, struct qcow2_io *io, const uint8_t *guest,
              uint64_t cs, const char *want, const char *what)
{
  struct qcow2_image *img = open_over (me, io, other, false);
  uint8_t *buf = malloc (cs), *expect = malloc (cs);

  if (!CHECKF (img != NULL, "%s: reopen: %s", what, memenv_last_error (me)))
    return;
  for (uint64_t c = 0; c < SIZE / cs; c++) {
    bool filled = !want || want[c] == '1';

    memcpy (expect, filled ? guest + c * cs : other, cs);
    CHECK_INT (qcow2_read (img, buf, cs, c * cs), 0);
    CHECKF (memcmp (buf, expect, cs) == 0, "%s: cluster %" PRIu64
            " is %sfilled", what, c, filled ? "not " : "");
  }
  qcow2_close (img);
  free (buf);
  free (expect);
}

/* Block status of the whole disk is exactly want[0, n). */
static void
check_extents_list (struct qcow2_image *img, const struct extent *want,
                    size_t n, const char *what)
{
  static struct extents got;
  bool ok;

  memset (&got, 0, sizeof got);
  ok = CHECK_INT (qcow2_extents (img, 0, SIZE, false, collect, &got), 0) &&
    CHECKF (got.n == n, "%s: %zu extents, expected %zu", what, got.n, n);
  for (size_t i = 0; ok && i < n; i++)
    ok = CHECKF (got.v[i].offset == want[i].offset &&
                 got.v[i].length == want[i].length &&
                 got.v[i].type == want[i].type, "%s: extent %zu differs",
                 what, i);
  if (!ok)
    print_extents ("got", &got);
}

/* The backing file handed in: served in place of the one the header
 * names, its holes in block status, never written, closed with the
 * image and when opening fails.
 */
static void
test_backing_io (void)
{
  struct memenv *me = memenv_new ();
  struct qcow2_io *io = new_image (me, CS, false, false);
  struct qcow2_image *img;
  uint8_t guest[SIZE], buf[4096];
  const struct extent want[] = {
    { 0, 6 * CS, 0 }, { 6 * CS, 4 * CS, 3 }, { 10 * CS, 6 * CS, 0 },
  };

  closes = writes = 0;
  memcpy (guest, disk, SIZE);
  img = open_over (me, io, disk, false);
  if (CHECKF (img != NULL, "open: %s", memenv_last_error (me))) {
    reads_as (img, guest, 0, SIZE, "backing_io");
    check_extents_list (img, want, 3, "backing_io holes");
    memset (buf, 0x5a, sizeof buf);
    CHECK_INT (qcow2_write (img, buf, sizeof buf, 8 * CS + 100, false), 0);
    memcpy (guest + 8 * CS + 100, buf, sizeof buf);
    reads_as (img, guest, 0, SIZE, "backing_io after a write");
    CHECK_INT (qcow2_close (img), 0);
  }
  CHECK_INT (closes, 1);
  CHECK_INT (writes, 0);

  /* Not a qcow2 image: the backing file handed in is closed too. */
  struct qcow2_io *bad = memio_new ("not an image", 12);
  struct qcow2_options o = { .backing_io = holeio_new (disk, SIZE, 0, 0) };
  CHECK (qcow2_open (memenv_env (me), bad, "bad.qcow2", &o) == NULL);
  CHECK_INT (closes, 2);
  io->ops->close (io);
  memenv_free (me);
}

/* qcow2_fill and copy_on_read on one image. */
static void
test_fill (void)
{
  struct memenv *me = memenv_new ();
  struct qcow2_io *io = new_image (me, CS, false, false);
  struct qcow2_image *img;
  uint8_t guest[SIZE], buf[8192];
  size_t len_before, len_after;

  memcpy (guest, disk, SIZE);
  img = open_over (me, io, disk, false);
  if (!CHECKF (img != NULL, "open: %s", memenv_last_error (me)))
    return;
  /* A client's write in cluster 2 is never overwritten by a fill. */
  memset (buf, 0x77, sizeof buf);
  CHECK_INT (qcow2_write (img, buf, sizeof buf, 2 * CS + 8192, false), 0);
  memcpy (guest + 2 * CS + 8192, buf, sizeof buf);
  /* Whole clusters: [100, 5 CS + 5) touches clusters 0 to 5. */
  CHECK_INT (qcow2_fill (img, 5 * CS + 5 - 100, 100), 0);
  reads_as (img, guest, 0, SIZE, "after a fill");
  CHECK_INT (qcow2_flush (img), 0);
  memio_data (io, &len_before);
  /* The zeros of the disk become zero clusters, not data. */
  CHECK_INT (qcow2_fill (img, 4 * CS, 6 * CS), 0);
  CHECK_INT (qcow2_flush (img), 0);
  memio_data (io, &len_after);
  CHECK_EQ (len_after, len_before);
  CHECK_INT (qcow2_fill (img, 0, 0), 0);
  CHECK_INT (qcow2_fill (img, 1, SIZE), -EINVAL);
  CHECK_INT (qcow2_close (img), 0);
  check_filled (me, io, guest, CS, "1111111111000000", "qcow2_fill");

  /* Copy-on-read: a read fills what it touches, whole clusters. */
  img = open_over (me, io, disk, true);
  if (CHECKF (img != NULL, "open: %s", memenv_last_error (me))) {
    reads_as (img, guest, 11 * CS + 5, 100, "copy-on-read");
    reads_as (img, guest, 13 * CS - 10, 20, "copy-on-read");
    CHECK_INT (qcow2_close (img), 0);
  }
  check_filled (me, io, guest, CS, "1111111111011100", "copy-on-read");

  /* Not on an image opened read-only. */
  struct qcow2_options ro = {
    .backing_io = holeio_new (disk, SIZE, 0, 0), .copy_on_read = true,
    .readonly = true,
  };
  memenv_clear_errors (me);
  CHECK (qcow2_open (memenv_env (me), memio_ref (io), "o.qcow2", &ro) == NULL);
  CHECKF (strstr (memenv_last_error (me), "copy-on-read needs an image "
                  "opened read-write"), "message: %s", memenv_last_error (me));
  io->ops->close (io);
  memenv_free (me);
}

/* Version 2 has no zero flag: zeros are filled as data.  With
 * extended L2 entries, a cluster partly allocated is not filled.
 */
static void
test_fill_v2_extl2 (void)
{
  struct memenv *me = memenv_new ();
  struct qcow2_io *io = new_image (me, CS, true, false);
  struct qcow2_image *img;
  uint8_t guest[SIZE], buf[4096];

  img = open_over (me, io, disk, false);
  if (CHECK (img != NULL)) {
    CHECK_INT (qcow2_fill (img, 2 * CS, 6 * CS), 0);
    CHECK_INT (qcow2_close (img), 0);
    check_filled (me, io, disk, CS, "0000001100000000", "v2 zeros");
  }
  io->ops->close (io);

  io = new_image (me, CS, false, true);
  memcpy (guest, disk, SIZE);
  img = open_over (me, io, disk, false);
  if (CHECK (img != NULL)) {
    memset (buf, 0x66, sizeof buf);
    CHECK_INT (qcow2_write (img, buf, sizeof buf, 3 * CS, false), 0);
    memcpy (guest + 3 * CS, buf, sizeof buf);
    CHECK_INT (qcow2_fill (img, SIZE, 0), 0);
    reads_as (img, guest, 0, SIZE, "extended L2 after a fill");
    CHECK_INT (qcow2_close (img), 0);
    /* Cluster 3: only the subcluster written is the image's. */
    memcpy (guest + 3 * CS + sizeof buf, other, CS - sizeof buf);
    check_filled (me, io, guest, CS, NULL, "extended L2");
  }
  io->ops->close (io);
  memenv_free (me);
}

/* Two writers, a reader with copy-on-read and a filler at once, on 4 KiB
 * clusters: reads see only the disk or what was written, and nothing a
 * writer wrote is lost to a fill.  Writer k writes only in clusters
 * c with c % 3 == k, bytes ~disk (so that every byte shows which).
 */
#define RCS 4096
#define ROUNDS 1500

struct race {
  struct qcow2_image *img;
  uint8_t written[SIZE];        /* 1 where a writer wrote */
  unsigned bad_reads, errors;
};

struct racer {
  struct race *race;
  int k;                        /* writer 0 or 1, 2 reader, 3 filler */
  uint64_t seed;
};

static void *
race_thread (void *arg)
{
  struct racer *t = arg;
  struct race *race = t->race;
  uint8_t *buf = malloc (4 * RCS);

  for (int i = 0; i < ROUNDS; i++) {
    uint64_t c = unit_rnd (&t->seed) % (SIZE / RCS), off, len;
    int r = 0;

    switch (t->k) {
    case 0: case 1:
      c = c - c % 3 + t->k;
      if (c >= SIZE / RCS)
        continue;
      off = c * RCS + unit_rnd (&t->seed) % RCS;
      len = 1 + unit_rnd (&t->seed) % (c * RCS + RCS - off);
      for (uint64_t j = 0; j < len; j++)
        buf[j] = disk[off + j] ^ 0xff;
      r = qcow2_write (race->img, buf, len, off, false);
      if (r == 0)
        memset (race->written + off, 1, len);
      break;
    case 2:
      off = unit_rnd (&t->seed) % (SIZE - 1);
      len = 1 + unit_rnd (&t->seed) % MIN (4 * RCS, SIZE - off);
      r = qcow2_read (race->img, buf, len, off);
      for (uint64_t j = 0; r == 0 && j < len; j++) {
        uint8_t d = disk[off + j], flipped = d ^ 0xff;
        if (buf[j] != d && buf[j] != flipped)
          __atomic_fetch_add (&race->bad_reads, 1, __ATOMIC_RELAXED);
      }
      break;
    case 3:
      off = c * RCS;
      r = qcow2_fill (race->img, MIN (3 * RCS, SIZE - off), off);
      break;
    }
    if (r < 0)
      __atomic_fetch_add (&race->errors, 1, __ATOMIC_RELAXED);
  }
  free (buf);
  return NULL;
}

static void
test_fill_race (void)
{
  static struct race race;
  struct memenv *me = memenv_new ();
  struct qcow2_io *io = new_image (me, RCS, false, false);
  struct racer t[4];
  pthread_t th[4];
  struct qcow2_check_result res;
  uint8_t *guest = malloc (SIZE);

  race.img = open_over (me, io, disk, true);
  if (!CHECK (race.img != NULL))
    return;
  read_delay_us = 20;
  for (int k = 0; k < 4; k++) {
    t[k] = (struct racer) { &race, k, 0x9e3779b97f4a7c15ULL * (k + 1) };
    pthread_create (&th[k], NULL, race_thread, &t[k]);
  }
  for (int k = 0; k < 4; k++)
    pthread_join (th[k], NULL);
  read_delay_us = 0;
  CHECK_INT (race.errors, 0);
  CHECK_INT (race.bad_reads, 0);
  for (uint64_t o = 0; o < SIZE; o++)
    guest[o] = race.written[o] ? (uint8_t) (disk[o] ^ 0xff) : disk[o];
  reads_as (race.img, guest, 0, SIZE, "after the race");
  CHECK_INT (qcow2_check (race.img, false, &res), 0);
  CHECK_EQ (res.corruptions + res.leaks, 0);
  /* Filled whole, the image alone holds the guest. */
  CHECK_INT (qcow2_fill (race.img, SIZE, 0), 0);
  CHECK_INT (qcow2_close (race.img), 0);
  check_filled (me, io, guest, RCS, NULL, "after the race");
  free (guest);
  io->ops->close (io);
  memenv_free (me);
}

int
main (void)
{
  make_disk ();
  test_backing_io ();
  test_fill ();
  test_fill_v2_extl2 ();
  test_fill_race ();
  return unit_finish ();
}
