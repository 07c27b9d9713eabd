/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests of the qcow2 engine through its public interface, over
 * images built by hand in memory (imgbuild.c) and checked against the
 * builder's model of them: reads and extents of every kind of cluster
 * at every cluster size, backing chains (raw and qcow2, shorter than
 * the overlay, as deep as allowed), external data files, snapshots,
 * what bad L2 entries and bad headers do, and qcow2_check.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "be.h"
#include "checked.h"
#include "qcow2.h"
#include "memio.h"
#include "imgbuild.h"
#include "crashio.h"
#include "unit.h"

static const struct qcow2_options no_opts;

/* Open the bytes of ib as path.  If iop, it gets a reference to the
 * image's storage, for checking what the engine did to it.
 */
static struct qcow2_image *
open_ib (struct memenv *me, const struct ib *ib, const char *path,
         const struct qcow2_options *opts, struct qcow2_io **iop)
{
  struct qcow2_io *io = memio_new (ib->buf, ib->len);

  if (!io) {
    perror ("memio_new");
    exit (EXIT_FAILURE);
  }
  if (iop)
    *iop = memio_ref (io);
  return qcow2_open (memenv_env (me), io, path, opts ? opts : &no_opts);
}

/* Register a copy of data in the environment as name. */
static void
add_file (struct memenv *me, const char *name, const void *data, size_t len)
{
  struct qcow2_io *io = memio_new (data, len);

  if (!io || memenv_add (me, name, io) < 0) {
    perror ("memenv_add");
    exit (EXIT_FAILURE);
  }
  io->ops->close (io);
}

/* Whether the engine reads [off, off+len) as the model says; only a
 * failure counts as a check, so that callers count many reads as one.
 */
static bool
read_matches (struct qcow2_image *img, const struct model *m, uint64_t off,
              uint64_t len, const char *what)
{
  uint8_t *got = malloc (len + 1), *want = malloc (len + 1);
  bool ok = true;
  int r;

  if (!got || !want)
    abort ();
  memset (got, 0xa5, len);
  model_fill (m, want, len, off);
  r = qcow2_read (img, got, len, off);
  if (r != 0)
    ok = CHECKF (false, "%s: read of %" PRIu64 " at %#" PRIx64 " failed: "
                 "%s", what, len, off, strerror (-r));
  else if (memcmp (got, want, len) != 0) {
    uint64_t i = 0;
    while (got[i] == want[i])
      i++;
    ok = CHECKF (false, "%s: read of %" PRIu64 " at %#" PRIx64 ": byte at %#"
                 PRIx64 " is %#x, expected %#x",
                 what, len, off, off + i, got[i], want[i]);
  }
  free (got);
  free (want);
  return ok;
}

static bool
check_read (struct qcow2_image *img, const struct model *m, uint64_t off,
            uint64_t len, const char *what)
{
  bool ok = read_matches (img, m, off, len, what);

  if (ok)
    CHECK (true);
  return ok;
}

/* Read [off, off+len) whole, in odd-sized pieces, and a byte at each
 * end, so runs that start and stop mid-cluster are covered.
 */
static void
check_reads (struct qcow2_image *img, const struct model *m, uint64_t off,
             uint64_t len, const char *what)
{
  /* Odd sizes, and not too many: each read of a compressed cluster
   * inflates all of it.
   */
  const uint64_t piece = MAX (1531, len / 512 | 1);
  bool ok = read_matches (img, m, off, len, what);

  for (uint64_t o = off; ok && o < off + len; o += piece)
    ok = read_matches (img, m, o, MIN (piece, off + len - o), what);
  if (ok && len)
    ok = read_matches (img, m, off, 1, what) &&
      read_matches (img, m, off + len - 1, 1, what);
  if (ok)
    CHECK (true);
}

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

struct extent {
  uint64_t offset, length;
  uint32_t type;
};

struct extents {
  struct extent v[512];
  size_t n;
  bool overflow;
  size_t stop_after;            /* return 1 after this many, if not 0 */
};

static int
collect (void *opaque, uint64_t offset, uint64_t length, uint32_t type)
{
  struct extents *e = opaque;

  if (e->n == sizeof e->v / sizeof e->v[0]) {
    e->overflow = true;
    return -1;
  }
  e->v[e->n++] = (struct extent) { offset, length, type };
  return e->stop_after && e->n >= e->stop_after;
}

static void
model_extents (const struct model *m, uint64_t off, uint64_t len,
               struct extents *e)
{
  e->n = 0;
  while (len > 0) {
    uint64_t run;
    uint32_t type = model_extent (m, off, &run);

    run = MIN (run, len);
    if (e->n && e->v[e->n - 1].type == type)
      e->v[e->n - 1].length += run;
    else if (e->n < sizeof e->v / sizeof e->v[0])
      e->v[e->n++] = (struct extent) { off, run, type };
    else
      abort ();
    off += run;
    len -= run;
  }
}

static void
print_extents (const char *title, const struct extents *e)
{
  fprintf (stderr, "  %s:\n", title);
  for (size_t i = 0; i < e->n; i++)
    fprintf (stderr, "    %#12" PRIx64 " +%#12" PRIx64 " type %" PRIu32 "\n",
             e->v[i].offset, e->v[i].length, e->v[i].type);
}

static bool
check_extents (struct qcow2_image *img, const struct model *m, uint64_t off,
               uint64_t len, const char *what)
{
  static struct extents got, want;
  bool ok;
  int r;

  memset (&got, 0, sizeof got);
  model_extents (m, off, len, &want);
  r = qcow2_extents (img, off, len, false, collect, &got);
  ok = CHECKF (r == 0 && !got.overflow, "%s: extents of %" PRIu64 " at %#"
               PRIx64 " failed: %d", what, len, off, r);
  ok = ok && CHECKF (got.n == want.n, "%s: %zu extents, expected %zu",
                     what, got.n, want.n);
  for (size_t i = 0; ok && i < got.n; i++)
    ok = CHECKF (got.v[i].offset == want.v[i].offset &&
                 got.v[i].length == want.v[i].length &&
                 got.v[i].type == want.v[i].type,
                 "%s: extent %zu differs", what, i);
  if (!ok) {
    print_extents ("got", &got);
    print_extents ("expected", &want);
    return false;
  }

  /* With req_one, or a callback that says stop, only the first. */
  memset (&got, 0, sizeof got);
  r = qcow2_extents (img, off, len, true, collect, &got);
  ok = CHECKF (r == 0 && got.n == 1 && got.v[0].offset == want.v[0].offset &&
               got.v[0].length == want.v[0].length &&
               got.v[0].type == want.v[0].type,
               "%s: extents with req_one", what);
  memset (&got, 0, sizeof got);
  got.stop_after = 1;
  r = qcow2_extents (img, off, len, false, collect, &got);
  ok = ok && CHECKF (r == 0 && got.n == 1 &&
                     got.v[0].length == want.v[0].length,
                     "%s: extents stopped by the callback", what);
  return ok;
}

static void
check_no_writes (struct qcow2_io *io, const char *what)
{
  struct memio_stats st;

  memio_stats (io, &st);
  CHECKF (st.writes == 0 && st.punches == 0 && st.flushes == 0,
          "%s: the engine changed a file it only reads (%" PRIu64
          " writes, %" PRIu64 " punches, %" PRIu64 " flushes)",
          what, st.writes, st.punches, st.flushes);
}

/* A read of [off, off+len) must fail with EIO and a message naming the
 * problem, and guest cluster 0 (good in every such image) must still
 * read.
 */
static void
check_bad_read (struct qcow2_image *img, struct memenv *me,
                const struct model *m, uint64_t off, uint64_t len,
                const char *what, const char *phrase)
{
  uint8_t *buf = malloc (len);

  memenv_clear_errors (me);
  CHECKF (qcow2_read (img, buf, len, off) == -EIO,
          "%s: read at %#" PRIx64 " did not fail with EIO", what, off);
  CHECKF (strstr (memenv_last_error (me), phrase),
          "%s: message \"%s\" lacks \"%s\"", what,
          memenv_last_error (me), phrase);
  free (buf);
  check_read (img, m, 0, 65536, what);
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

/* dir/top.qcow2 (v2) -> dir/mid.qcow2 (probed) -> dir/base.raw, each
 * shorter than the one above it.
 */
static void
test_backing (void)
{
  struct memenv *me = memenv_new ();
  struct ib mid, top;
  struct model base = { .size = 3 * 65536 + 1000 }, top_alone;
  uint8_t *raw = malloc (base.size);
  struct qcow2_options opts = { .no_backing = true };
  struct qcow2_image *img;
  struct qcow2_io *io, *mid_io = NULL, *base_io = NULL;
  const char *what = "backing chain";

  for (uint64_t i = 0; i < base.size; i++)
    raw[i] = model_pattern (false, 100, i);
  base.raw = raw;
  add_file (me, "dir/base.raw", raw, base.size);
  ib_dump_bytes ("base.raw", raw, base.size);

  /* Ends 2 KiB into cluster 510. */
  ib_init (&mid, 3, 12, (2 << 20) - 6144, false);
  mid.backing = "base.raw";
  mid.backing_format = "raw";
  mid.model.backing = &base;
  /* Mostly where top is unallocated: 16-31 and 48-63 and 128-511. */
  ib_data (&mid, 1, 11);        /* hidden by top */
  ib_data (&mid, 17, 12);
  ib_zero (&mid, 20);           /* zero over the base's data */
  ib_data (&mid, 47, 13);
  /* 48 is unallocated and straddles the end of the base. */
  ib_data (&mid, 50, 14);       /* past the end of the base */
  ib_zero (&mid, 60);           /* zero past the end of the base */
  ib_data (&mid, 510, 15);      /* the partial last cluster */
  ib_data (&mid, 511, 16);      /* mapped, but past the end: zeros */
  ib_finish (&mid);
  ib_dump (&mid, "mid.qcow2");
  add_file (me, "dir/mid.qcow2", mid.buf, mid.len);

  ib_init (&top, 2, 16, 4 << 20, false);
  top.backing = "mid.qcow2";    /* no format: probed */
  top.model.backing = &mid.model;
  ib_data (&top, 0, 21);
  ib_data (&top, 2, 22);
  ib_data (&top, 40, 23);       /* past the end of mid */
  ib_finish (&top);
  ib_dump (&top, "top.qcow2");

  img = open_ib (me, &top, "dir/top.qcow2", NULL, &io);
  if (CHECKF (img != NULL, "%s: open: %s", what, memenv_last_error (me))) {
    CHECK_EQ (qcow2_get_size (img), 4 << 20);
    check_reads (img, &top.model, 0, 4 << 20, what);
    check_extents (img, &top.model, 0, 4 << 20, what);
    check_extents (img, &top.model, 65536 + 100, 3 * 65536, what);
    check_extents (img, &top.model, (2 << 20) - 4096, 8192, what);
    qcow2_close (img);
  }
  check_no_writes (io, "top");
  io->ops->close (io);

  /* The engine's files are the environment's: see what it did. */
  struct memenv *me2 = memenv_new ();
  mid_io = memio_new (mid.buf, mid.len);
  base_io = memio_new (raw, base.size);
  CHECK_INT (memenv_add (me2, "dir/mid.qcow2", mid_io), 0);
  CHECK_INT (memenv_add (me2, "dir/base.raw", base_io), 0);
  img = open_ib (me2, &top, "dir/top.qcow2", NULL, NULL);
  if (CHECK (img != NULL)) {
    check_read (img, &top.model, 0, 4 << 20, what);
    qcow2_close (img);
    struct memio_stats st;
    memio_stats (base_io, &st);
    CHECKF (st.reads > 0, "the base was never read");
    check_no_writes (mid_io, "mid");
    check_no_writes (base_io, "base");
  }
  mid_io->ops->close (mid_io);
  base_io->ops->close (base_io);
  memenv_free (me2);

  /* no_backing: what is not allocated in top reads as zeros. */
  model_copy (&top_alone, &top.model);
  top_alone.backing = NULL;
  img = open_ib (me, &top, "dir/top.qcow2", &opts, NULL);
  if (CHECK (img != NULL)) {
    check_reads (img, &top_alone, 0, 4 << 20, "no_backing");
    check_extents (img, &top_alone, 0, 4 << 20, "no_backing");
    qcow2_close (img);
  }
  model_free (&top_alone);

  /* The middle layer alone, named by an absolute path this time. */
  memenv_clear_errors (me);
  img = open_ib (me, &mid, "/abs/mid.qcow2", NULL, NULL);
  CHECK (img == NULL && errno == ENOENT);
  CHECKF (strstr (memenv_last_error (me), "/abs/base.raw"),
          "message: %s", memenv_last_error (me));
  add_file (me, "/abs/base.raw", raw, base.size);
  img = open_ib (me, &mid, "/abs/mid.qcow2", NULL, NULL);
  if (CHECK (img != NULL)) {
    check_reads (img, &mid.model, 0, mid.size, "mid");
    check_extents (img, &mid.model, 0, mid.size, "mid");
    qcow2_close (img);
  }

  ib_free (&top);
  ib_free (&mid);
  free (raw);
  memenv_free (me);
}

/* Open a one-cluster image whose backing file is name (format fmt),
 * expecting failure with errno err and phrase in the message.
 */
static void
check_backing_error (struct memenv *me, const char *path, const char *name,
                     const char *fmt, int err, const char *phrase)
{
  struct ib ib;
  struct qcow2_image *img;

  ib_init (&ib, 3, 16, 65536, false);
  ib.backing = name;
  ib.backing_format = fmt;
  ib_finish (&ib);
  add_file (me, path, ib.buf, ib.len);  /* so it may name itself */
  memenv_clear_errors (me);
  img = open_ib (me, &ib, path, NULL, NULL);
  CHECKF (img == NULL, "backing \"%s\": opened", name);
  CHECKF (errno == err, "backing \"%s\": errno %d, expected %d", name,
          errno, err);
  CHECKF (strstr (memenv_last_error (me), phrase),
          "backing \"%s\": message \"%s\" lacks \"%s\"", name,
          memenv_last_error (me), phrase);
  if (img)
    qcow2_close (img);
  ib_free (&ib);
}

static void
test_backing_errors (void)
{
  struct memenv *me = memenv_new ();
  struct ib a, b;

  check_backing_error (me, "top.qcow2", "missing.qcow2", NULL, ENOENT,
                       "cannot open backing file \"missing.qcow2\"");
  check_backing_error (me, "top.qcow2", "top.qcow2", NULL, ELOOP,
                       "loops");
  check_backing_error (me, "top.qcow2", "json:{\"driver\":\"raw\"}", NULL,
                       ENOTSUP, "not a local file");
  check_backing_error (me, "top.qcow2", "nbd://host/x", NULL, ENOTSUP,
                       "not a local file");
  check_backing_error (me, "top.qcow2", "x.vmdk", "vmdk", ENOTSUP,
                       "only qcow2 and raw");

  /* a -> b -> a. */
  ib_init (&a, 3, 16, 65536, false);
  a.backing = "b.qcow2";
  ib_finish (&a);
  ib_init (&b, 3, 16, 65536, false);
  b.backing = "a.qcow2";
  ib_finish (&b);
  add_file (me, "a.qcow2", a.buf, a.len);
  add_file (me, "b.qcow2", b.buf, b.len);
  check_backing_error (me, "top.qcow2", "a.qcow2", NULL, ELOOP, "loops");

  /* A bad layer down the chain is named in the message. */
  uint8_t junk[100];
  memset (junk, 'x', sizeof junk);
  add_file (me, "junk.qcow2", junk, sizeof junk);
  check_backing_error (me, "top.qcow2", "junk.qcow2", "qcow2", EINVAL,
                       "junk.qcow2: not a qcow2 image");
  ib_free (&a);
  ib_free (&b);
  memenv_free (me);
}

/* The deepest chain allowed: 257 layers (the top and 256 below), each
 * a one cluster image with its own cluster of data; one more is too
 * deep.
 */
static void
test_deep_chain (void)
{
  enum { MAX_LAYERS = 257 };
  struct memenv *me = memenv_new ();
  struct ib top, ib;
  struct model models[MAX_LAYERS + 1];
  char names[MAX_LAYERS + 2][24];   /* "l" and any uint64_t */
  struct qcow2_image *img;
  const uint64_t layers[] = { MAX_LAYERS, MAX_LAYERS + 1 };

  for (size_t t = 0; t < 2; t++) {
    uint64_t n = layers[t];

    /* Layer i (0 = top) owns cluster i and backs onto layer i+1. */
    for (uint64_t i = 0; i < n; i++) {
      snprintf (names[i], sizeof names[i], "l%" PRIu64, i);
      snprintf (names[i + 1], sizeof names[i + 1], "l%" PRIu64, i + 1);
      ib_init (&ib, 3, 9, n * 512, false);
      if (i + 1 < n) {
        ib.backing = names[i + 1];
        ib.backing_format = "qcow2";
      }
      ib_data (&ib, i, i);
      ib_finish (&ib);
      add_file (me, names[i], ib.buf, ib.len);
      model_copy (&models[i], &ib.model);
      models[i].backing = i + 1 < n ? &models[i + 1] : NULL;
      if (i == 0)
        top = ib;
      else
        ib_free (&ib);
    }
    memenv_clear_errors (me);
    img = open_ib (me, &top, names[0], NULL, NULL);
    if (n <= MAX_LAYERS) {
      if (CHECKF (img != NULL, "%" PRIu64 " layers: %s", n,
                  memenv_last_error (me))) {
        check_reads (img, &models[0], 0, n * 512, "deep chain");
        check_extents (img, &models[0], 0, n * 512, "deep chain");
        qcow2_close (img);
      }
    }
    else {
      CHECKF (img == NULL && errno == ELOOP, "%" PRIu64 " layers opened",
              n);
      CHECKF (strstr (memenv_last_error (me), "deeper than 256"),
              "message: %s", memenv_last_error (me));
      if (img)
        qcow2_close (img);
    }
    ib_free (&top);
    for (uint64_t i = 0; i < n; i++)
      model_free (&models[i]);
  }
  memenv_free (me);
}

/* An external data file: guest clusters map to the same offsets in
 * data.raw (as QEMU insists since the fix for CVE-2024-4467), so guest
 * cluster 0 is at host offset 0, which only COPIED tells apart from
 * unallocated; and the data-file option.
 */
static void
test_data_file (void)
{
  struct memenv *me = memenv_new ();
  const uint64_t cs = 65536, size = 16 * cs;
  struct qcow2_options opts = { .data_file = "other.raw" };
  uint8_t *data = calloc (1, size);
  struct qcow2_image *img;
  struct ib ib;
  const char *what = "external data file";

  ib_init (&ib, 3, 16, size, false);
  ib.incompat |= UINT64_C (1) << 2;
  ib.extra_ext_type = 0x44415441;
  ib.extra_ext_data = "data.raw";
  ib.extra_ext_len = 8;
  static const uint64_t clusters[] = { 0, 1, 2, 5, 6 };
  for (size_t i = 0; i < sizeof clusters / sizeof clusters[0]; i++) {
    uint64_t c = clusters[i];
    for (uint64_t j = 0; j < cs; j++)
      data[c * cs + j] = model_pattern (false, i, c * cs + j);
    ib_set (&ib, c, UINT64_C (1) << 63 | c * cs, 0);
    model_set (&ib.model, c, M_DATA, false, i, 0, 0);
  }
  ib_zero (&ib, 3);
  ib_set (&ib, 8, UINT64_C (1) << 62 | 5 * cs, 0);     /* compressed */
  ib_finish (&ib);
  ib_dump (&ib, "data-file.qcow2");
  ib_dump_bytes ("data.raw", data, size);

  memenv_clear_errors (me);
  img = open_ib (me, &ib, "df.qcow2", NULL, NULL);
  CHECK (img == NULL && errno == ENOENT);
  CHECKF (strstr (memenv_last_error (me),
                  "cannot open external data file \"data.raw\""),
          "message: %s", memenv_last_error (me));

  add_file (me, "data.raw", data, size);
  img = open_ib (me, &ib, "df.qcow2", NULL, NULL);
  if (CHECKF (img != NULL, "%s: open: %s", what, memenv_last_error (me))) {
    check_reads (img, &ib.model, 0, 8 * cs, what);
    check_extents (img, &ib.model, 0, 8 * cs, what);
    check_bad_read (img, me, &ib.model, 8 * cs, 512, "compressed in a "
                    "data file", "compressed cluster in an image with an "
                    "external data file");
    qcow2_close (img);
  }

  /* data-file= names another file: the same data here. */
  add_file (me, "other.raw", data, size);
  img = open_ib (me, &ib, "df.qcow2", &opts, NULL);
  if (CHECK (img != NULL)) {
    check_reads (img, &ib.model, 0, 8 * cs, "data-file option");
    qcow2_close (img);
  }
  ib_free (&ib);

  /* data-file= for an image without one is an error. */
  ib_init (&ib, 3, 16, size, false);
  ib_finish (&ib);
  img = open_ib (me, &ib, "nodf.qcow2", &opts, NULL);
  CHECK (img == NULL && errno == EINVAL);
  CHECK (strstr (memenv_last_error (me), "no external data file"));
  ib_free (&ib);
  free (data);
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

static void
test_bad_entries (void)
{
  struct memenv *me = memenv_new ();
  struct qcow2_image *img;
  struct ib ib;
  const uint64_t cs = 65536, span = cs * 8192;
  uint64_t good, half, host;
  uint8_t buf[512];

  ib_init (&ib, 3, 16, 3 * span, false);
  ib_data (&ib, 0, 1);
  ib_set (&ib, 1, UINT64_C (1) << 63 | (100 * cs), 0);  /* past the end */
  good = ib_data (&ib, 9, 2);
  ib_set (&ib, 2, UINT64_C (1) << 63 | (good + 512), 0); /* unaligned */
  host = ib_alloc (&ib, 1);
  memset (ib.buf + host, 0xff, cs);                      /* not deflate */
  ib_set (&ib, 3, UINT64_C (1) << 62 | UINT64_C (3) << 54 | host, 0);
  ib_set (&ib, 4, UINT64_C (1) << 62 | 200 * cs, 0);     /* past the end */
  /* Deflate data of half a cluster only: make it, then break it. */
  half = ib_compressed (&ib, 6, 3, true, 0);
  ib_data (&ib, 5, 4);
  /* L2 tables past the end of the file, and unaligned. */
  be64_put (ib.buf + ib.l1_offset + 8, 1000 * cs);
  be64_put (ib.buf + ib.l1_offset + 16, ib.l1_offset + 512);
  ib_finish (&ib);
  {
    /* Recompress cluster 6 from half a cluster of input. */
    uint8_t *in = malloc (cs / 2);
    for (uint64_t i = 0; i < cs / 2; i++)
      in[i] = model_pattern (true, 3, 6 * cs + i);
    z_stream s;
    memset (&s, 0, sizeof s);
    deflateInit2 (&s, 6, Z_DEFLATED, -12, 9, Z_DEFAULT_STRATEGY);
    s.next_in = in;
    s.avail_in = cs / 2;
    s.next_out = ib.buf + half;
    s.avail_out = cs;
    CHECK (deflate (&s, Z_FINISH) == Z_STREAM_END);
    deflateEnd (&s);
    free (in);
  }
  ib_dump (&ib, "bad-entries.qcow2");

  img = open_ib (me, &ib, "bad.qcow2", NULL, NULL);
  if (!CHECKF (img != NULL, "open: %s", memenv_last_error (me)))
    goto out;
  check_read (img, &ib.model, 0, cs, "good cluster");
  check_read (img, &ib.model, 5 * cs, cs, "good cluster");
  check_bad_read (img, me, &ib.model, 1 * cs, 512, "data past the end",
                  "beyond the end of the file");
  check_bad_read (img, me, &ib.model, 2 * cs + 4096, 512,
                  "unaligned data", "unaligned data cluster offset");
  check_bad_read (img, me, &ib.model, 3 * cs, 512, "compressed garbage",
                  "does not decompress to one cluster");
  check_bad_read (img, me, &ib.model, 4 * cs, 512,
                  "compressed past the end", "beyond the end of the file");
  check_bad_read (img, me, &ib.model, 6 * cs + 100, 512,
                  "compressed short", "does not decompress to one cluster");
  check_bad_read (img, me, &ib.model, span + 5 * cs, 512,
                  "L2 table past the end", "L2 table beyond the end");
  check_bad_read (img, me, &ib.model, 2 * span, 512, "unaligned L2 table",
                  "unaligned L2 table offset");
  /* A request that touches a bad entry fails as a whole. */
  check_bad_read (img, me, &ib.model, 0, 2 * cs, "good then bad",
                  "beyond the end of the file");
  check_read (img, &ib.model, 5 * cs, cs, "good cluster after errors");
  check_read (img, &ib.model, 7 * cs, 2 * cs, "good cluster after errors");

  /* Extents need the L2 tables, and see unaligned data offsets. */
  CHECK_INT (qcow2_extents (img, span, 512, false, collect,
                            &(struct extents) { .n = 0 }), -EIO);
  CHECK_INT (qcow2_extents (img, 2 * span + cs, 512, false, collect,
                            &(struct extents) { .n = 0 }), -EIO);
  CHECK_INT (qcow2_extents (img, 2 * cs, 512, false, collect,
                            &(struct extents) { .n = 0 }), -EIO);
  CHECK_INT (qcow2_read (img, buf, 512, 9 * cs), 0);
  qcow2_close (img);
 out:
  ib_free (&ib);

  /* Invalid subcluster bitmaps. */
  ib_init (&ib, 3, 16, 16 * cs, true);
  ib_data (&ib, 0, 1);
  good = ib_data (&ib, 3, 2);
  ib_set (&ib, 1, UINT64_C (1) << 63 | good, 0x0000000100000001ULL);
  ib_set (&ib, 2, 0, 0x00000003);              /* allocated, no host */
  ib_finish (&ib);
  ib_dump (&ib, "bad-bitmaps.qcow2");
  img = open_ib (me, &ib, "badext.qcow2", NULL, NULL);
  if (CHECKF (img != NULL, "open: %s", memenv_last_error (me))) {
    check_bad_read (img, me, &ib.model, cs, 512, "allocated and zero",
                    "invalid subcluster bitmap");
    check_bad_read (img, me, &ib.model, 2 * cs + 4096, 512,
                    "allocated without a cluster",
                    "invalid subcluster bitmap");
    check_read (img, &ib.model, 3 * cs, cs, "good after bad bitmaps");
    qcow2_close (img);
  }
  ib_free (&ib);
  memenv_free (me);
}

/* One field of a header to overwrite. */
struct patch {
  uint32_t offset;
  uint8_t width;                /* 1, 4 or 8; 0 = no patch */
  uint64_t value;
};

struct bad_header {
  const char *name;
  struct patch p[2];
  int err;
  const char *phrase;
};

static void
patch_apply (uint8_t *buf, const struct patch *p)
{
  switch (p->width) {
  case 1: buf[p->offset] = p->value; break;
  case 4: be32_put (buf + p->offset, p->value); break;
  case 8: be64_put (buf + p->offset, p->value); break;
  }
}

static void
check_open_fails (struct memenv *me, const void *data, size_t len,
                  const char *name, int err, const char *phrase)
{
  struct qcow2_io *io = memio_new (data, len);
  struct qcow2_image *img;

  memenv_clear_errors (me);
  img = qcow2_open (memenv_env (me), io, "bad.qcow2", &no_opts);
  CHECKF (img == NULL, "%s: opened", name);
  CHECKF (errno == err, "%s: errno %d (%s), expected %d (%s)", name,
          errno, strerror (errno), err, strerror (err));
  CHECKF (strstr (memenv_last_error (me), phrase),
          "%s: message \"%s\" lacks \"%s\"", name,
          memenv_last_error (me), phrase);
  if (img)
    qcow2_close (img);
}

static void
test_bad_headers (void)
{
  struct memenv *me = memenv_new ();
  struct ib ib;
  const uint64_t cs = 65536;
  uint8_t *buf;
  struct qcow2_image *img;

  ib_init (&ib, 3, 16, 4 * cs, false);
  ib_data (&ib, 1, 1);
  ib_snapshot (&ib, "1", "snap", 0, true);
  ib_finish (&ib);
  ib_dump (&ib, "header-base.qcow2");

  const uint64_t eof = ib.len, l1 = ib.l1_offset;
  const uint64_t snaps = be64_get (ib.buf + 64);
  const struct bad_header cases[] = {
    { "magic", { { 0, 4, 0x514649fa } }, EMEDIUMTYPE,
      "not a qcow2 image" },
    { "version 1", { { 4, 4, 1 } }, ENOTSUP, "unsupported qcow2 version 1" },
    { "version 4", { { 4, 4, 4 } }, ENOTSUP, "unsupported qcow2 version 4" },
    { "cluster_bits 8", { { 20, 4, 8 } }, EINVAL, "cluster_bits 8" },
    { "cluster_bits 22", { { 20, 4, 22 } }, EINVAL, "cluster_bits 22" },
    { "aes", { { 32, 4, 1 } }, ENOTSUP, "encrypted" },
    { "luks", { { 32, 4, 2 } }, ENOTSUP, "encrypted" },
    { "l1_size 0", { { 36, 4, 0 } }, EINVAL, "L1 table is too small" },
    { "l1_size huge", { { 36, 4, 0x10000000 } }, EFBIG, "l1_size" },
    { "l1 unaligned", { { 40, 8, l1 + 512 } }, EINVAL, "not aligned" },
    { "l1 past the end", { { 40, 8, eof } }, EINVAL,
      "beyond the end of the file" },
    { "reftable unaligned", { { 48, 8, cs + 8 } }, EINVAL, "not aligned" },
    { "reftable past the end", { { 48, 8, eof } }, EINVAL,
      "beyond the end of the file" },
    { "reftable clusters 0", { { 56, 4, 0 } }, EINVAL,
      "refcount_table_clusters (header offset 56) is 0" },
    { "reftable clusters huge", { { 56, 4, 0x10000 } }, EFBIG,
      "refcount_table_clusters" },
    { "nb_snapshots huge", { { 60, 4, 65537 } }, EFBIG, "nb_snapshots" },
    { "snapshots past the end", { { 64, 8, eof } }, EINVAL,
      "snapshot table" },
    { "snapshot entries past the end", { { 60, 4, 60000 } }, EINVAL,
      "snapshot table entry" },
    { "snapshot extra data", { { snaps + 36, 4, 2000 } }, EINVAL,
      "extra data" },
    { "unknown incompatible bit", { { 72, 8, 1 << 5 } }, ENOTSUP,
      "bit 5" },
    { "data file without a name", { { 72, 8, 1 << 2 } }, EINVAL,
      "names none" },
    { "raw data without a data file", { { 88, 8, 1 << 1 } }, EINVAL,
      "raw external data" },
    { "compression type 2", { { 104, 1, 2 } }, ENOTSUP,
      "unknown compression type 2" },
    { "zstd without bit 3", { { 104, 1, 1 } }, EINVAL, "does not agree" },
    { "bit 3 with deflate", { { 72, 8, 1 << 3 } }, EINVAL,
      "does not agree" },
    { "header_length short", { { 100, 4, 100 } }, EINVAL,
      "shorter than the version 3 minimum" },
    { "header_length long", { { 100, 4, cs + 8 } }, EINVAL,
      "exceeds the cluster size" },
    { "refcount_order 7", { { 96, 4, 7 } }, EINVAL, "refcount_order 7" },
    { "extended L2, small clusters", { { 20, 4, 12 }, { 72, 8, 1 << 4 } },
      EINVAL, "at least 16 KiB" },
    { "backing name past the cluster", { { 8, 8, cs - 4 }, { 16, 4, 10 } },
      EINVAL, "does not fit" },
    { "backing name in the header", { { 8, 8, 40 }, { 16, 4, 10 } },
      EINVAL, "does not fit" },
    { "backing name too long", { { 8, 8, 512 }, { 16, 4, 2000 } },
      EINVAL, "does not fit" },
    { "extension too large", { { 112, 4, 0x12345678 }, { 116, 4, cs } },
      EINVAL, "too large" },
    { "bitmaps extension short", { { 112, 4, 0x23852875 }, { 116, 4, 8 } },
      EINVAL, "too short" },
    /* Not errors: an empty backing format without a backing file. */
    { "backing format", { { 112, 4, 0xe2792aca }, { 116, 4, 4 } }, 0, "" },
  };

  buf = malloc (ib.len);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const struct bad_header *c = &cases[i];

    memcpy (buf, ib.buf, ib.len);
    patch_apply (buf, &c->p[0]);
    patch_apply (buf, &c->p[1]);
    if (c->err == 0) {
      struct qcow2_io *io = memio_new (buf, ib.len);
      img = qcow2_open (memenv_env (me), io, "ok.qcow2", &no_opts);
      CHECKF (img != NULL, "%s: open: %s", c->name, memenv_last_error (me));
      if (img)
        qcow2_close (img);
      continue;
    }
    check_open_fails (me, buf, ib.len, c->name, c->err, c->phrase);
  }

  /* Truncated files. */
  check_open_fails (me, ib.buf, 0, "empty", ENODATA, "file is empty");
  check_open_fails (me, ib.buf, 71, "71 bytes", EINVAL, "too small");
  check_open_fails (me, ib.buf, 100, "100 bytes (v3)", EINVAL,
                    "too small (100 bytes) for a version 3 header");
  check_open_fails (me, ib.buf, 3 * cs, "cut short", EINVAL,
                    "beyond the end of the file");
  free (buf);
  ib_free (&ib);

  /* An unknown feature is named from the feature name table. */
  uint8_t table[48] = { 0, 9 };
  memcpy (table + 2, "frobnication", 12);
  ib_init (&ib, 3, 16, cs, false);
  ib.incompat = 1 << 9;
  ib.extra_ext_type = 0x6803f857;
  ib.extra_ext_data = table;
  ib.extra_ext_len = sizeof table;
  ib_finish (&ib);
  check_open_fails (me, ib.buf, ib.len, "feature table", ENOTSUP,
                    "bit 9 (frobnication)");
  ib_free (&ib);

  /* The corrupt bit: readable, but not writable. */
  ib_init (&ib, 3, 16, cs, false);
  ib.incompat = 1 << 1;
  ib_data (&ib, 0, 1);
  ib_finish (&ib);
  img = open_ib (me, &ib, "corrupt.qcow2", NULL, NULL);
  if (CHECK (img != NULL)) {
    check_read (img, &ib.model, 0, cs, "corrupt bit");
    memenv_clear_errors (me);
    CHECK_INT (qcow2_check_writable (img), -EPERM);
    CHECK (strstr (memenv_last_error (me), "corrupt"));
    qcow2_close (img);
  }
  ib_free (&ib);
  memenv_free (me);
}

/* Set the 16-bit refcount of the cluster at host offset in an image
 * ib_finish made (one refcount block, named by the table at cluster 1).
 */
static void
set_refcount (uint8_t *buf, uint64_t cs, uint64_t host, uint16_t value)
{
  uint64_t block = be64_get (buf + cs);

  be16_put (buf + block + host / cs * 2, value);
}

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

/* Once the overlap guard marks the image corrupt, nothing more reaches
 * the disk but the mark: metadata made dirty before (here a zeroed L2
 * entry) is not written by a later flush, which fails.
 */
static void
test_corrupt_mark (void)
{
  const uint64_t cs = 4096, size = 64 * cs;
  struct memenv *me = memenv_new ();
  struct qcow2_image *img;
  struct qcow2_io *io;
  uint8_t *buf = calloc (1, cs), entry[8];
  uint64_t l2;
  struct ib ib;

  ib_init (&ib, 3, 12, size, false);
  ib_data (&ib, 0, 1);
  ib_data (&ib, 1, 2);
  ib_finish (&ib);
  /* The refcount block calls the L2 table free: the next allocation
   * takes it for guest data, which the guard refuses.
   */
  l2 = be64_get (ib.buf + ib.l1_offset) & UINT64_C (0x00fffffffffffe00);
  set_refcount (ib.buf, cs, l2, 0);
  img = open_ib (me, &ib, "corrupt-mark.qcow2", NULL, &io);
  if (CHECK (img != NULL)) {
    CHECK_INT (qcow2_zero (img, cs, cs, false, false, false), 0);
    CHECK_INT (qcow2_write (img, buf, cs, 10 * cs, false), -EIO);
    CHECK (qcow2_is_corrupt (img));
    CHECK_INT (qcow2_flush (img), -EIO);
    CHECK_INT (qcow2_write (img, buf, 512, 0, false), -EPERM);
    CHECK_INT (io->ops->pread (io, entry, 8, l2 + 8), 0);
    CHECK_EQ (be64_get (entry), be64_get (ib.buf + l2 + 8));
    CHECK_INT (io->ops->pread (io, entry, 8, 72), 0);
    CHECK (be64_get (entry) & 2);
    qcow2_close (img);
    io->ops->close (io);
  }
  free (buf);
  ib_free (&ib);
  memenv_free (me);
}

/* The overlap guard keeps guest data off a bitmap's table: a guest
 * cluster whose L2 entry points at it is refused, the image marked
 * corrupt, the table unchanged.
 */
static void
test_bitmap_guard (void)
{
  const uint64_t cs = 4096, size = 64 * cs;
  struct memenv *me = memenv_new ();
  struct qcow2_image *img;
  struct qcow2_io *io;
  uint8_t *buf = malloc (cs), *table = malloc (cs);
  struct ib ib;

  memset (buf, 0x5a, cs);
  ib_init (&ib, 3, 12, size, false);
  ib_data (&ib, 0, 1);
  ib_bitmap (&ib, "b", 12, 2, 7);
  ib_set (&ib, 2, ib.bitmaps[0].table_offset | UINT64_C (1) << 63, 0);
  ib_finish (&ib);
  img = open_ib (me, &ib, "bitmap-guard.qcow2", NULL, &io);
  if (CHECK (img != NULL)) {
    CHECK_INT (qcow2_write (img, buf, cs, 0, false), 0);
    CHECK_INT (qcow2_write (img, buf, 512, 2 * cs + 512, false), -EIO);
    CHECK (qcow2_is_corrupt (img));
    CHECK_INT (io->ops->pread (io, table, cs, ib.bitmaps[0].table_offset), 0);
    CHECK (memcmp (table, ib.buf + ib.bitmaps[0].table_offset, cs) == 0);
    qcow2_close (img);
    io->ops->close (io);
  }
  free (buf);
  free (table);
  ib_free (&ib);
  memenv_free (me);
}

/* An image whose refcount table has no first block: an allocation must
 * fail (not loop making that block in the header's place, forever),
 * and the header stay as it was, whatever the overlap guard's mode.
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
      CHECK_INT (io->ops->pread (io, head, cs, 0), 0);
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

int
main (void)
{
  for (unsigned cb = 9; cb <= 21; cb++) {
    test_basic (2, cb);
    test_basic (3, cb);
  }
  test_backing ();
  test_backing_errors ();
  test_deep_chain ();
  test_data_file ();
  test_extended_l2 ();
  for (unsigned t = 0; t <= 1; t++) {
    static const unsigned cbs[] = { 9, 13, 16, 21 };
    for (size_t i = 0; i < sizeof cbs / sizeof cbs[0]; i++)
      test_compressed (t, cbs[i]);
  }
  test_snapshots ();
  test_bad_entries ();
  test_bad_headers ();
  test_check ();
  test_corrupt_mark ();
  test_bitmap_guard ();
  test_no_first_refblock ();
  test_churn_reuse ();
  test_pool_errors ();
  return unit_finish ();
}
