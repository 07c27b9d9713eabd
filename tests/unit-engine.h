/* SPDX-License-Identifier: BSD-3-Clause */
/* What the engine's unit tests share: images built in memory
 * (imgbuild.h) opened through the in-memory environment (memio.h), and
 * reads and extents checked against the builder's model.  Header-only,
 * so that each check counts in the program that makes it (unit.h).
 */
#ifndef QCOW2_UNIT_ENGINE_H
#define QCOW2_UNIT_ENGINE_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "qcow2.h"
#include "memio.h"
#include "imgbuild.h"
#include "unit.h"

static const struct qcow2_options no_opts __attribute__ ((unused));

/* Open the bytes of ib as path.  If iop, it gets a reference to the
 * image's storage, for checking what the engine did to it.
 */
static inline struct qcow2_image *
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
static inline void
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
static inline bool
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

static inline bool
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
static inline void
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

static inline int
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

static inline void
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

static inline void
print_extents (const char *title, const struct extents *e)
{
  fprintf (stderr, "  %s:\n", title);
  for (size_t i = 0; i < e->n; i++)
    fprintf (stderr, "    %#12" PRIx64 " +%#12" PRIx64 " type %" PRIu32 "\n",
             e->v[i].offset, e->v[i].length, e->v[i].type);
}

static inline bool
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

static inline void
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
static inline void
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

/* Set the 16-bit refcount of the cluster at host offset in an image
 * ib_finish made (one refcount block, named by the table at cluster 1).
 */
static inline void
set_refcount (uint8_t *buf, uint64_t cs, uint64_t host, uint16_t value)
{
  uint64_t block = be64_get (buf + cs);

  be16_put (buf + block + host / cs * 2, value);
}

#endif /* QCOW2_UNIT_ENGINE_H */
