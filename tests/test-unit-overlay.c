/* SPDX-License-Identifier: BSD-3-Clause */
/* A backing file handed to the engine open (qcow2_options.backing_io). */
#include "unit-engine.h"

#define CS 65536
#define SIZE (16 * CS)

/* A raw backing file over an in-memory file, whose hole op says that
 * [hole_start, hole_end) is a hole; it counts its closes and any write.
 */
struct holeio {
  struct qcow2_io io;
  struct qcow2_io *inner;
  uint64_t hole_start, hole_end;
  unsigned *closes, *writes;
};



static int
holeio_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  struct qcow2_io *in = ((struct holeio *) io)->inner;
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
holeio_hole (struct qcow2_io *io, uint64_t offset, uint64_t count,
             bool *is_hole, uint64_t *len)
{
  struct holeio *h = (struct holeio *) io;

  *is_hole = offset >= h->hole_start && offset < h->hole_end;
  if (*is_hole)
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
  .punch = holeio_punch, .size = holeio_size, .hole = holeio_hole,
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
static uint8_t disk[SIZE];

static void
make_disk (void)
{
  for (uint64_t o = 0; o < SIZE; o++)
    disk[o] = o >= 6 * CS && o < 10 * CS ? 0 : model_pattern (false, 7, o);
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
open_over (struct memenv *me, struct qcow2_io *io, const uint8_t *data)
{
  struct qcow2_options o = {
    .backing_io = holeio_new (data, SIZE, 6 * CS, 10 * CS),
    .backing_io_name = "the plugin's disk",
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
  img = open_over (me, io, disk);
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

int
main (void)
{
  make_disk ();
  test_backing_io ();
  return unit_finish ();
}
