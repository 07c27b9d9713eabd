/* SPDX-License-Identifier: BSD-3-Clause */
/* The files an image names, through the engine's public interface:
 * backing chains (raw and qcow2, shorter than the overlay, as deep as
 * allowed), what a bad or looping chain says, external data files,
 * and backing layers shared through a table of layers.
 */
#include <unistd.h>

#include "unit-engine.h"

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
                       EINVAL, "\"file\" is missing");
  check_backing_error (me, "top.qcow2", "nbd://host/x", NULL, ENOENT,
                       "cannot open backing file \"nbd://host/x\"");
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

/* Deep chains, each layer a small image with its own cluster of data:
 * 1,001 layers (the top and 1,000 below), read whole; the deepest
 * allowed, 2,049 (the top and 2,048 below), read at both ends; one
 * more is too deep.
 */
#define MAX_BACKING 2048
static void
test_deep_chain (void)
{
  struct memenv *me = memenv_new ();
  const uint64_t layers[] = { 1001, MAX_BACKING + 1, MAX_BACKING + 2 };
  struct model *models = calloc (MAX_BACKING + 2, sizeof *models);
  char (*names)[48] = calloc (MAX_BACKING + 3, sizeof *names);
  struct ib top, ib;
  struct qcow2_image *img;

  if (!me || !models || !names)
    abort ();
  for (size_t t = 0; t < sizeof layers / sizeof *layers; t++) {
    uint64_t n = layers[t];

    /* Layer i (0 = top) owns cluster i and backs onto layer i+1. */
    for (uint64_t i = 0; i < n; i++) {
      snprintf (names[i], sizeof names[i], "d%zu-l%" PRIu64, t, i);
      snprintf (names[i + 1], sizeof names[i + 1], "d%zu-l%" PRIu64, t,
                i + 1);
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
    if (n <= MAX_BACKING + 1) {
      if (CHECKF (img != NULL, "%" PRIu64 " layers: %s", n,
                  memenv_last_error (me))) {
        if (n < MAX_BACKING) {
          check_reads (img, &models[0], 0, n * 512, "deep chain");
          check_extents (img, &models[0], 0, n * 512, "deep chain");
        }
        else {
          check_read (img, &models[0], 0, 512, "deepest chain, top");
          check_read (img, &models[0], (n - 1) * 512, 512,
                      "deepest chain, bottom");
        }
        qcow2_close (img);
      }
    }
    else {
      CHECKF (img == NULL && errno == ELOOP, "%" PRIu64 " layers opened",
              n);
      CHECKF (strstr (memenv_last_error (me), "deeper than 2048"),
              "message: %s", memenv_last_error (me));
      if (img)
        qcow2_close (img);
    }
    ib_free (&top);
    for (uint64_t i = 0; i < n; i++)
      model_free (&models[i]);
  }
  free (models);
  free (names);
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

/* The opens of dir/mid.qcow2 through the environment of test_shared. */
static unsigned shared_opens;
static struct qcow2_io *(*shared_open_real) (void *opaque, const char *path,
                                             bool readonly, char **id);

static struct qcow2_io *
shared_open (void *opaque, const char *path, bool readonly, char **id)
{
  shared_opens += strcmp (path, "dir/mid.qcow2") == 0;
  return shared_open_real (opaque, path, readonly, id);
}

/* memenv's names are its files' identities. */
static char *
shared_identity (void *opaque, const char *path)
{
  return strdup (path);
}

/* Two images over one layer: opened once with a table of shared
 * layers (twice without), each image reading its own bytes over it,
 * one closed while the other reads on.  The layer is refused for
 * writing while shared, and an image open for writing is refused as
 * a layer; each is served again once the other is closed.
 */
static void
test_shared (void)
{
  struct memenv *me = memenv_new ();
  struct qcow2_env env = *memenv_env (me);
  const struct qcow2_options rw = { .readonly = false };
  struct qcow2_layers *layers;
  struct qcow2_image *img[2], *w;
  struct ib mid, top[2];

  shared_open_real = env.open;
  env.open = shared_open;
  env.identity = shared_identity;
  ib_init (&mid, 3, 16, 1 << 20, false);
  ib_data (&mid, 1, 31);
  ib_data (&mid, 5, 32);
  ib_finish (&mid);
  add_file (me, "dir/mid.qcow2", mid.buf, mid.len);
  for (int i = 0; i < 2; i++) {
    ib_init (&top[i], 3, 16, 1 << 20, false);
    top[i].backing = "mid.qcow2";
    top[i].backing_format = "qcow2";
    top[i].model.backing = &mid.model;
    ib_data (&top[i], 1 + i, 40 + i);
    ib_finish (&top[i]);
  }

  /* Without a table, each image opens its own. */
  for (int i = 0; i < 2; i++)
    img[i] = qcow2_open (&env, memio_new (top[i].buf, top[i].len),
                         "dir/top.qcow2", &no_opts);
  CHECK (img[0] && img[1]);
  CHECK_INT (shared_opens, 2);
  for (int i = 0; i < 2; i++)
    qcow2_close (img[i]);

  shared_opens = 0;
  layers = qcow2_layers_new (&env);
  env.layers = layers;
  for (int i = 0; i < 2; i++)
    img[i] = qcow2_open (&env, memio_new (top[i].buf, top[i].len),
                         i ? "dir/top1.qcow2" : "dir/top0.qcow2", &no_opts);
  if (CHECKF (img[0] && img[1], "open: %s", memenv_last_error (me))) {
    CHECK_INT (shared_opens, 1);
    check_reads (img[0], &top[0].model, 0, 1 << 20, "shared, first");
    check_reads (img[1], &top[1].model, 0, 1 << 20, "shared, second");

    memenv_clear_errors (me);
    w = qcow2_open (&env, memio_new (mid.buf, mid.len), "dir/mid.qcow2",
                    &rw);
    CHECK (w == NULL && errno == EBUSY);
    CHECKF (strstr (memenv_last_error (me), "refused for writing: it is "
                    "the backing file"), "message: %s",
            memenv_last_error (me));

    qcow2_close (img[0]);
    check_reads (img[1], &top[1].model, 0, 1 << 20, "shared, left");
    qcow2_close (img[1]);
  }

  /* Written, then refused as a layer; shared again once closed. */
  w = qcow2_open (&env, memio_new (mid.buf, mid.len), "dir/mid.qcow2", &rw);
  if (CHECKF (w != NULL, "open for writing: %s", memenv_last_error (me))) {
    memenv_clear_errors (me);
    img[0] = qcow2_open (&env, memio_new (top[0].buf, top[0].len),
                         "dir/top0.qcow2", &no_opts);
    CHECK (img[0] == NULL && errno == EBUSY);
    CHECKF (strstr (memenv_last_error (me), "refused: it is open here for "
                    "writing, an image of its own"), "message: %s",
            memenv_last_error (me));
    qcow2_close (w);
  }
  img[0] = qcow2_open (&env, memio_new (top[0].buf, top[0].len),
                       "dir/top0.qcow2", &no_opts);
  if (CHECK (img[0] != NULL)) {
    check_reads (img[0], &top[0].model, 0, 1 << 20, "shared, again");
    qcow2_close (img[0]);
  }

  /* A stream of one image over the shared layer, detached: the other
   * reads on through the layer, which the stream let go of untouched.
   */
  img[0] = qcow2_open (&env, memio_new (top[0].buf, top[0].len),
                       "dir/top0.qcow2", &rw);
  img[1] = qcow2_open (&env, memio_new (top[1].buf, top[1].len),
                       "dir/top1.qcow2", &no_opts);
  if (CHECKF (img[0] && img[1], "open: %s", memenv_last_error (me))) {
    const struct qcow2_stream_options so = { .base = NULL };
    struct qcow2_stream *st = qcow2_stream_new (img[0], &so);
    struct qcow2_stream_progress p = { .state = QCOW2_STREAM_STARTING };
    struct qcow2_info info;

    if (CHECK (st && qcow2_stream_start (st) == 0)) {
      for (int i = 0; i < 5000; i++) {
        qcow2_stream_progress (st, &p);
        if (p.state == QCOW2_STREAM_DETACHED ||
            p.state == QCOW2_STREAM_FAILED)
          break;
        usleep (1000);
      }
      CHECK_INT (p.state, QCOW2_STREAM_DETACHED);
    }
    qcow2_stream_free (st);
    qcow2_get_info (img[0], &info);
    CHECK (info.backing == NULL);
    check_reads (img[0], &top[0].model, 0, 1 << 20, "streamed");
    check_reads (img[1], &top[1].model, 0, 1 << 20, "beside a stream");
  }
  qcow2_close (img[0]);
  qcow2_close (img[1]);
  qcow2_layers_free (layers);

  for (int i = 0; i < 2; i++)
    ib_free (&top[i]);
  ib_free (&mid);
  memenv_free (me);
}

int
main (void)
{
  test_backing ();
  test_backing_errors ();
  test_deep_chain ();
  test_data_file ();
  test_shared ();
  return unit_finish ();
}
