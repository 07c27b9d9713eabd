/* SPDX-License-Identifier: BSD-3-Clause */
/* The world the qcow2 fuzz target opens its images in (see
 * fuzz-env.h): bounded storage over memio, the environment, the base
 * files made at start-up and the LUKS templates of "\0TPL" inputs.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "fuzz-env.h"

#define BASE_RAW_SIZE (192u << 10)
#define DATA_RAW_SIZE (64u << 10)
#define BASE_QCOW2_SIZE (256u << 10)
#define FILE_MAX (64u << 20)            /* largest file the storage holds */
#define TEMPLATES 3

const struct qcow2_password fuzz_env_password = {
  .text = "fuzz", .whole_file = "fuzz\n",
};

static uint8_t base_raw[BASE_RAW_SIZE], data_raw[DATA_RAW_SIZE];
static uint8_t *base_qcow2;
static size_t base_qcow2_len;

void
fuzz_env_fill_pattern (uint8_t *p, size_t n, uint64_t seed)
{
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t) ((i * 131 + (i >> 9) + seed) | 1);
}

/* Storage of bounded size, like a file system's largest file, over
 * memio: a corrupt table may send a write to any host offset, and memio
 * would try to allocate all the bytes up to it.
 */
struct capio {
  struct qcow2_io io;
  struct qcow2_io *inner;
};

static struct qcow2_io *
capio_inner (struct qcow2_io *io)
{
  return ((struct capio *) io)->inner;
}

static int
capio_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  struct qcow2_io *in = capio_inner (io);
  return in->ops->pread (in, buf, count, offset);
}

static int
capio_pwrite (struct qcow2_io *io, const void *buf, size_t count,
              uint64_t offset)
{
  struct qcow2_io *in = capio_inner (io);

  if (offset > FILE_MAX || count > FILE_MAX - offset)
    return -EFBIG;
  return in->ops->pwrite (in, buf, count, offset);
}

static int
capio_flush (struct qcow2_io *io)
{
  struct qcow2_io *in = capio_inner (io);
  return in->ops->flush (in);
}

static int
capio_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  struct qcow2_io *in = capio_inner (io);
  return in->ops->punch (in, offset, count);
}

static int64_t
capio_size (struct qcow2_io *io)
{
  struct qcow2_io *in = capio_inner (io);
  return in->ops->size (in);
}

static void
capio_close (struct qcow2_io *io)
{
  struct qcow2_io *in = capio_inner (io);

  in->ops->close (in);
  free (io);
}

static const struct qcow2_io_ops capio_ops = {
  .pread = capio_pread,
  .pwrite = capio_pwrite,
  .flush = capio_flush,
  .punch = capio_punch,
  .size = capio_size,
  .close = capio_close,
};

struct qcow2_io *
fuzz_env_capio (struct qcow2_io *inner)
{
  struct capio *c = calloc (1, sizeof *c);

  if (!c)
    abort ();
  c->io.ops = &capio_ops;
  c->io.serial_writes = inner->serial_writes;
  c->io.grows_by_writes = inner->grows_by_writes;
  c->inner = inner;
  return &c->io;
}

static struct qcow2_io *
fuzz_env_open (void *opaque, const char *path, bool readonly, char **id)
{
  struct fuzz_env *fe = opaque;
  struct qcow2_io *io = fe->mem->open (fe->mem->opaque, path, readonly, id);

  return io ? fuzz_env_capio (io) : NULL;
}

static void
fuzz_env_error (void *opaque, const char *msg)
{
  struct fuzz_env *fe = opaque;
  fe->mem->error (fe->mem->opaque, msg);
}

static void
fuzz_env_debug (void *opaque, const char *msg)
{
  struct fuzz_env *fe = opaque;
  fe->mem->debug (fe->mem->opaque, msg);
}

static void
fuzz_env_notice (void *opaque, const char *path, const char *msg)
{
}

void
fuzz_env_init (struct fuzz_env *fe, struct memenv *me)
{
  fe->env = (struct qcow2_env) {
    .opaque = fe,
    .open = fuzz_env_open,
    .error = fuzz_env_error,
    .debug = fuzz_env_debug,
    .notice = fuzz_env_notice,
  };
  fe->mem = memenv_env (me);
}

void
fuzz_env_add_file (struct memenv *me, const char *name, const void *data,
                   size_t len)
{
  struct qcow2_io *io = memio_new (data, len);

  if (!io || memenv_add (me, name, io) < 0)
    abort ();
  io->ops->close (io);
}

/* The files every input sees.  base.qcow2 is made once, by the engine
 * itself: a few clusters of its own over base.raw.
 */
static void
fuzz_env_make_base (void)
{
  const struct qcow2_create_options co = {
    .size = BASE_QCOW2_SIZE, .cluster_size = 512,
    .backing = "base.raw", .backing_format = "raw",
  };
  const struct qcow2_options opts = { 0 };
  struct memenv *me = memenv_new ();
  struct qcow2_io *io = memio_new (NULL, 0);
  struct qcow2_image *img;
  uint8_t buf[1536];
  const void *p;

  fuzz_env_fill_pattern (base_raw, sizeof base_raw, 0x5a);
  fuzz_env_fill_pattern (data_raw, sizeof data_raw, 0xd0);
  fuzz_env_fill_pattern (buf, sizeof buf, 0x33);
  if (!me || !io)
    abort ();
  fuzz_env_add_file (me, "dir/base.raw", base_raw, sizeof base_raw);
  if (qcow2_create (memenv_env (me), io, &co) < 0)
    abort ();
  img = qcow2_open (memenv_env (me), memio_ref (io), "dir/base.qcow2", &opts);
  if (!img ||
      qcow2_write (img, buf, sizeof buf, 1024, false) < 0 ||
      qcow2_write (img, buf, 700, 150000, false) < 0 ||
      qcow2_zero (img, 4096, 8192, false, false, false) < 0 ||
      qcow2_close (img) < 0) {
    fprintf (stderr, "fuzz-qcow2: making base.qcow2: %s\n",
             memenv_last_error (me));
    abort ();
  }
  p = memio_data (io, &base_qcow2_len);
  base_qcow2 = malloc (base_qcow2_len);
  if (!base_qcow2)
    abort ();
  memcpy (base_qcow2, p, base_qcow2_len);
  io->ops->close (io);
  memenv_free (me);
}

void
fuzz_env_add_base_files (struct memenv *me)
{
  fuzz_env_add_file (me, "dir/base.raw", base_raw, sizeof base_raw);
  fuzz_env_add_file (me, "dir/base.qcow2", base_qcow2, base_qcow2_len);
  fuzz_env_add_file (me, "dir/data.raw", data_raw, sizeof data_raw);
}

/* The LUKS templates of "\0TPL" inputs, and where their LUKS headers
 * are.
 */
static struct {
  uint8_t *buf;
  size_t len;
  uint64_t luks;
} templates[TEMPLATES];

/* The offset of the encryption header of the image in buf. */
static uint64_t
fuzz_env_find_luks (const uint8_t *buf, size_t len)
{
  uint64_t off = be32_get (buf + 100);

  while (off + 24 <= len) {
    uint32_t type = be32_get (buf + off), n = be32_get (buf + off + 4);

    if (type == 0x0537be77)
      return be64_get (buf + off + 8);
    if (type == 0)
      break;
    off += 8 + ((n + 7) & ~7u);
  }
  abort ();
}

/* Make template i with the engine, as fuzz_env_make_base makes its file. */
static void
fuzz_env_make_template (int i)
{
  static const struct qcow2_luks_options luks[TEMPLATES] = {
    { .password = "fuzz", .iter_time = 1 },
    { .password = "fuzz", .cipher_alg = "cast5-128", .cipher_mode = "cbc",
      .ivgen_alg = "essiv", .ivgen_hash_alg = "md5", .hash_alg = "sha1",
      .iter_time = 1 },
    { .password = "fuzz\n", .cipher_alg = "serpent-128",
      .cipher_mode = "ecb", .ivgen_alg = "plain", .hash_alg = "sha512",
      .iter_time = 1 },
  };
  const struct qcow2_create_options co[TEMPLATES] = {
    { .size = 64 << 10, .cluster_size = 512, .luks = &luks[0] },
    { .size = 256 << 10, .cluster_size = 4096, .luks = &luks[1] },
    { .size = DATA_RAW_SIZE, .cluster_size = 4096, .luks = &luks[2],
      .data_file = "data.raw" },
  };
  const struct qcow2_options opts = {
    .passwords = &fuzz_env_password, .passwords_len = 1,
  };
  struct memenv *me = memenv_new ();
  struct qcow2_io *io = memio_new (NULL, 0);
  struct qcow2_image *img;
  uint8_t buf[1536];
  const void *p;

  fuzz_env_fill_pattern (buf, sizeof buf, 0x44 + i);
  if (!me || !io)
    abort ();
  fuzz_env_add_file (me, "dir/data.raw", data_raw, sizeof data_raw);
  img = qcow2_create (memenv_env (me), io, &co[i]) < 0 ? NULL
    : qcow2_open (memenv_env (me), memio_ref (io), "dir/disk.qcow2", &opts);
  if (!img ||
      qcow2_write (img, buf, sizeof buf, 1024, false) < 0 ||
      qcow2_write (img, buf, 700, 30000, false) < 0 ||
      qcow2_zero (img, 4096, 8192, false, false, false) < 0 ||
      qcow2_close (img) < 0) {
    fprintf (stderr, "fuzz-qcow2: making LUKS template %d: %s\n", i,
             memenv_last_error (me));
    abort ();
  }
  p = memio_data (io, &templates[i].len);
  templates[i].buf = malloc (templates[i].len);
  if (!templates[i].buf)
    abort ();
  memcpy (templates[i].buf, p, templates[i].len);
  templates[i].luks = fuzz_env_find_luks (templates[i].buf, templates[i].len);
  io->ops->close (io);
  memenv_free (me);
}

uint8_t *
fuzz_env_template_image (const uint8_t *data, size_t size, size_t *len)
{
  const unsigned t = size ? data[0] % TEMPLATES : 0;
  const size_t max = 2 * templates[t].len;
  uint8_t *buf = calloc (1, max);
  size_t i = 1;

  if (!buf)
    abort ();
  memcpy (buf, templates[t].buf, templates[t].len);
  *len = templates[t].len;
  while (i + 6 <= size) {
    uint8_t flags = data[i], n = data[i + 5];
    uint64_t off = (uint64_t) data[i + 1] | (uint64_t) data[i + 2] << 8
      | (uint64_t) data[i + 3] << 16 | (uint64_t) data[i + 4] << 24;

    i += 6;
    if (flags & 2) {
      *len = off % max;
      continue;
    }
    if (flags & 1)
      off += templates[t].luks;
    if (*len > 0)
      for (size_t at = off % *len, k = 0; k < n && i + k < size &&
             at + k < *len; k++)
        buf[at + k] = data[i + k];
    i += n;
  }
  return buf;
}

void
fuzz_env_setup (void)
{
  fuzz_env_make_base ();
  for (int i = 0; i < TEMPLATES; i++)
    fuzz_env_make_template (i);
}
