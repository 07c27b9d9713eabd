/* SPDX-License-Identifier: BSD-3-Clause */
/* Reading through the engine's public interface, over images built by
 * hand in memory and checked against the builder's model: every kind
 * of L2 entry at every cluster size (v2 and v3), extended L2 entries,
 * compressed clusters (deflate and zstd), internal snapshots; reads and
 * extents both.
 */
#include "unit-engine.h"

/* Read around each of points. */
static void
check_reads_around (struct qcow2_image *img, const struct model *m,
                    const uint64_t *points, size_t n, uint64_t w,
                    const char *what)
{
  uint64_t size = qcow2_get_size (img);

  for (size_t i = 0; i < n; i++) {
    uint64_t start = points[i] > w ? points[i] - w : 0;
    uint64_t end = MIN (points[i] + w, size);
    if (start < end)
      check_reads (img, m, start, end - start, what);
  }
}

/* Every kind of standard L2 entry, at the edges of L2 tables and of the
 * disk, for one version and cluster size.
 */
static void
test_basic (unsigned version, unsigned cb)
{
  struct memenv *me = memenv_new ();
  struct ib ib;
  struct qcow2_image *img;
  struct qcow2_io *io;
  uint64_t cs = UINT64_C (1) << cb, entries = cs / 8, span = cs * entries;
  uint64_t size = 3 * span + 2 * cs + 1536;
  char what[64], name[64];
  uint8_t buf[512];

  snprintf (what, sizeof what, "basic v%u cluster_bits %u", version, cb);
  ib_init (&ib, version, cb, size, false);
  ib_data (&ib, 0, 1);
  if (version >= 3)
    ib_zero (&ib, 1);
  else
    ib_data (&ib, 1, 2);
  ib_data (&ib, 2, 3);          /* 2 and 3 contiguous on the host */
  ib_data (&ib, 3, 4);
  ib_data (&ib, entries - 1, 5);        /* last of the first L2 table */
  ib_data (&ib, entries, 6);            /* first of the second */
  ib_data (&ib, entries + 2, 7);
  /* The third L2 table is absent; the fourth maps the partial end. */
  ib_data (&ib, 3 * entries + 2, 8);
  if (version >= 3)
    ib_zero (&ib, 3 * entries);
  ib_finish (&ib);
  snprintf (name, sizeof name, "basic-v%u-c%u.qcow2", version, cb);
  ib_dump (&ib, name);

  img = open_ib (me, &ib, "basic.qcow2", NULL, &io);
  if (!CHECKF (img != NULL, "%s: open: %s", what, memenv_last_error (me)))
    goto out;
  CHECK_EQ (qcow2_get_size (img), size);

  const uint64_t points[] = {
    0, 2 * cs, 4 * cs, span - cs, span, span + 2 * cs, 2 * span,
    3 * span, 3 * span + cs, size,
  };
  check_reads_around (img, &ib.model, points, sizeof points / sizeof *points,
                      MIN (2 * cs, 65536), what);
  if (size <= (8 << 20))
    check_reads (img, &ib.model, 0, size, what);
  check_extents (img, &ib.model, 0, size, what);
  check_extents (img, &ib.model, cs / 2 + 3, 3 * cs, what);
  check_extents (img, &ib.model, span - 1, 2, what);

  /* Outside the disk, or nothing at all. */
  CHECK_INT (qcow2_read (img, buf, 512, size - 511), -EINVAL);
  CHECK_INT (qcow2_read (img, buf, 1, UINT64_MAX), -EINVAL);
  CHECK_INT (qcow2_read (img, buf, 0, size), 0);
  CHECK_INT (qcow2_extents (img, size, 1, false, collect, NULL), -EINVAL);
  CHECK_INT (qcow2_check_writable (img), 0);
  check_no_writes (io, what);
  qcow2_close (img);
 out:
  io->ops->close (io);
  ib_free (&ib);
  memenv_free (me);
}

/* Extended L2 entries: subclusters allocated, zero or unallocated (on
 * a backing file), compressed clusters, and runs across them.
 */
static void
test_extended_l2 (void)
{
  struct memenv *me = memenv_new ();
  struct model base = { .size = 1 << 20 }, alone;
  uint8_t *raw = malloc (base.size);
  struct qcow2_options opts = { .no_backing = true };
  struct qcow2_image *img;
  struct ib ib;
  uint64_t host;
  const char *what = "extended L2";

  for (uint64_t i = 0; i < base.size; i++)
    raw[i] = model_pattern (false, 200, i);
  base.raw = raw;
  add_file (me, "extl2-base.raw", raw, base.size);
  ib_dump_bytes ("extl2-base.raw", raw, base.size);

  ib_init (&ib, 3, 16, 1 << 20, true);
  ib.backing = "extl2-base.raw";
  ib.backing_format = "raw";
  ib.model.backing = &base;
  ib_data (&ib, 0, 1);
  ib_ext (&ib, 1, 2, 0x0000ffff, 0xff000000);
  ib_ext (&ib, 2, 3, 0, 0x0f0f0f0f);            /* no host cluster */
  ib_ext (&ib, 3, 4, 0x80000001, 0x00010000);
  ib_zero (&ib, 4);
  /* Host cluster allocated, but no subcluster uses it. */
  host = ib_alloc (&ib, 1);
  ib_set (&ib, 5, host | UINT64_C (1) << 63, 0);
  model_set (&ib.model, 5, M_EXT, false, 0, 0, 0);
  ib_compressed (&ib, 6, 5, true, 0);
  ib_data (&ib, 7, 6);
  ib_data (&ib, 8, 7);
  ib_ext (&ib, 9, 8, 0xaaaaaaaa, 0x55555555);
  ib_finish (&ib);
  ib_dump (&ib, "extl2.qcow2");

  img = open_ib (me, &ib, "extl2.qcow2", NULL, NULL);
  if (CHECKF (img != NULL, "%s: open: %s", what, memenv_last_error (me))) {
    check_reads (img, &ib.model, 0, 1 << 20, what);
    check_extents (img, &ib.model, 0, 1 << 20, what);
    check_extents (img, &ib.model, 65536 + 3000, 65536, what);
    qcow2_close (img);
  }

  model_copy (&alone, &ib.model);
  alone.backing = NULL;
  img = open_ib (me, &ib, "extl2.qcow2", &opts, NULL);
  if (CHECK (img != NULL)) {
    check_reads (img, &alone, 0, 1 << 20, "extended L2, no backing");
    check_extents (img, &alone, 0, 1 << 20, "extended L2, no backing");
    qcow2_close (img);
  }
  model_free (&alone);
  ib_free (&ib);
  free (raw);
  memenv_free (me);
}

/* Compressed clusters at various places in the host file. */
static void
test_compressed (unsigned compression_type, unsigned cb)
{
  struct memenv *me = memenv_new ();
  struct qcow2_image *img;
  struct ib ib;
  uint64_t cs = UINT64_C (1) << cb;
  char what[64], name[64];

  snprintf (what, sizeof what, "compressed (%s) cluster_bits %u",
            compression_type ? "zstd" : "deflate", cb);
  /* A partial last cluster, but a whole number of sectors: QEMU rounds
   * the virtual size down to one, so a qemu-img oracle would differ.
   */
  ib_init (&ib, 3, cb, 8 * cs - (cb > 9 ? cs / 2 : 0), false);
  ib.compression_type = compression_type;
  ib_compressed (&ib, 0, 1, true, 0);
  ib_compressed (&ib, 1, 2, false, 100);        /* does not shrink */
  ib_data (&ib, 2, 3);
  ib_compressed (&ib, 3, 4, true, 511);
  ib_compressed (&ib, 4, 5, true, cs - 10);     /* crosses clusters */
  ib_zero (&ib, 5);
  ib_compressed (&ib, 7, 6, true, 1000 % cs);   /* the last one */
  ib_finish (&ib);
  snprintf (name, sizeof name, "compressed-%s-c%u.qcow2",
            compression_type ? "zstd" : "deflate", cb);
  ib_dump (&ib, name);

  img = open_ib (me, &ib, "compressed.qcow2", NULL, NULL);
  if (CHECKF (img != NULL, "%s: open: %s", what, memenv_last_error (me))) {
    check_reads (img, &ib.model, 0, ib.size, what);
    check_extents (img, &ib.model, 0, ib.size, what);
    qcow2_close (img);
  }
  ib_free (&ib);
  memenv_free (me);
}

static void
test_snapshots (void)
{
  struct memenv *me = memenv_new ();
  struct qcow2_options opts = { .snapshot = NULL };
  struct qcow2_image *img;
  struct ib ib;
  const uint64_t size = 1 << 20;
  static const struct {
    const char *which;
    int snap;                   /* -1 = none found */
  } cases[] = {
    { "1", 0 }, { "first", 0 }, { "2", 1 }, { "second", 1 },
    { "3", 2 }, { "third", -1 }, { "nope", -1 }, { "", -1 },
  };

  ib_init (&ib, 3, 12, size, false);
  ib_data (&ib, 0, 1);
  ib_data (&ib, 1, 2);
  ib_data (&ib, 200, 3);
  ib_snapshot (&ib, "1", "first", size / 2, true);
  ib_data (&ib, 0, 4);
  ib_zero (&ib, 1);
  ib_data (&ib, 5, 5);
  ib_snapshot (&ib, "2", "second", 0, true);
  ib_data (&ib, 5, 6);
  ib_data (&ib, 6, 7);
  ib_zero (&ib, 200);
  /* Named like the first's ID: IDs are looked up first. */
  ib_snapshot (&ib, "3", "1", 0, true);
  ib_data (&ib, 7, 8);
  ib_finish (&ib);
  ib_dump (&ib, "snapshots.qcow2");

  img = open_ib (me, &ib, "snap.qcow2", NULL, NULL);
  if (CHECK (img != NULL)) {
    check_reads (img, &ib.model, 0, size, "active");
    check_extents (img, &ib.model, 0, size, "active");
    CHECK_INT (qcow2_check_writable (img), 0);
    qcow2_close (img);
  }

  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char what[64];

    snprintf (what, sizeof what, "snapshot \"%s\"", cases[i].which);
    opts.snapshot = cases[i].which;
    memenv_clear_errors (me);
    img = open_ib (me, &ib, "snap.qcow2", &opts, NULL);
    if (cases[i].snap < 0) {
      CHECKF (img == NULL && errno == ENOENT, "%s: opened", what);
      CHECKF (strstr (memenv_last_error (me), "no snapshot"),
              "%s: message: %s", what, memenv_last_error (me));
      if (img)
        qcow2_close (img);
      continue;
    }
    const struct model *m = &ib.snaps[cases[i].snap].model;
    if (!CHECKF (img != NULL, "%s: open: %s", what, memenv_last_error (me)))
      continue;
    CHECK_EQ (qcow2_get_size (img), m->size);
    check_reads (img, m, 0, m->size, what);
    check_extents (img, m, 0, m->size, what);
    CHECK_INT (qcow2_check_writable (img), -EROFS);
    qcow2_close (img);
  }
  ib_free (&ib);

  /* Version 2: no extra data, so the snapshot has the image's size. */
  ib_init (&ib, 2, 16, 4 << 20, false);
  ib_data (&ib, 3, 1);
  ib_snapshot (&ib, "1", "old", 0, false);
  ib_data (&ib, 3, 2);
  ib_finish (&ib);
  ib_dump (&ib, "snapshot-v2.qcow2");
  opts.snapshot = "old";
  img = open_ib (me, &ib, "snap2.qcow2", &opts, NULL);
  if (CHECK (img != NULL)) {
    CHECK_EQ (qcow2_get_size (img), 4 << 20);
    check_reads (img, &ib.snaps[0].model, 0, 4 << 20, "v2 snapshot");
    qcow2_close (img);
  }
  ib_free (&ib);
  memenv_free (me);
}

int
main (void)
{
  for (unsigned cb = 9; cb <= 21; cb++) {
    test_basic (2, cb);
    test_basic (3, cb);
  }
  test_extended_l2 ();
  for (unsigned t = 0; t <= 1; t++) {
    static const unsigned cbs[] = { 9, 13, 16, 21 };
    for (size_t i = 0; i < sizeof cbs / sizeof cbs[0]; i++)
      test_compressed (t, cbs[i]);
  }
  test_snapshots ();
  return unit_finish ();
}
