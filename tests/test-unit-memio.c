/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests of the in-memory backend and environment that the other
 * unit tests (and the fuzzer) rely on.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "memio.h"
#include "unit.h"

static void
test_memio (void)
{
  uint8_t src[100], buf[300];
  struct qcow2_io *io;
  struct memio_stats st;
  const uint8_t *data;
  size_t len;

  for (int i = 0; i < 100; i++)
    src[i] = i + 1;
  io = memio_new (src, sizeof src);
  if (!CHECK (io != NULL))
    return;
  src[0] = 0xff;                /* memio has its own copy */
  data = memio_data (io, &len);
  CHECK (len == 100 && data[0] == 1 && data[99] == 100);
  CHECK_INT (io->ops->size (io), 100);
  CHECK (io->ops->status == NULL);

  /* Reads past the end give zeros. */
  memset (buf, 0xaa, sizeof buf);
  CHECK_INT (io->ops->pread (io, buf, 20, 90), 0);
  CHECK (buf[0] == 91 && buf[9] == 100 && buf[10] == 0 && buf[19] == 0);
  CHECK (buf[20] == 0xaa);
  memset (buf, 0xaa, sizeof buf);
  CHECK_INT (io->ops->pread (io, buf, 10, UINT64_MAX - 5), 0);
  CHECK (buf[0] == 0 && buf[9] == 0 && buf[10] == 0xaa);

  /* Writes grow the file; the gap reads as zeros. */
  memset (buf, 0x55, sizeof buf);
  CHECK_INT (io->ops->pwrite (io, buf, 50, 200), 0);
  CHECK_INT (io->ops->size (io), 250);
  data = memio_data (io, &len);
  CHECK (len == 250 && data[99] == 100 && data[100] == 0 && data[199] == 0);
  CHECK (data[200] == 0x55 && data[249] == 0x55);
  CHECK_INT (io->ops->pwrite (io, buf, 2, 0), 0);
  CHECK (memio_data (io, &len) && len == 250);
  CHECK_INT (io->ops->pwrite (io, buf, 1, UINT64_MAX), -EFBIG);
  CHECK_INT (io->ops->pwrite (io, buf, 0, 250), 0);
  CHECK_INT (io->ops->size (io), 250);
  /* A big write, to make it reallocate. */
  uint8_t *big = calloc (1, 100000);
  big[99999] = 7;
  CHECK_INT (io->ops->pwrite (io, big, 100000, 1000), 0);
  data = memio_data (io, &len);
  CHECK (len == 101000 && data[100999] == 7 && data[200] == 0x55);
  free (big);

  /* Punching zeroes and keeps the size, even past the end. */
  CHECK_INT (io->ops->punch (io, 210, 10), 0);
  data = memio_data (io, &len);
  CHECK (data[209] == 0x55 && data[210] == 0 && data[219] == 0);
  CHECK (data[220] == 0x55);
  CHECK_INT (io->ops->punch (io, 100990, 1000), 0);
  CHECK_INT (io->ops->punch (io, UINT64_MAX - 1, 1000), 0);
  data = memio_data (io, &len);
  CHECK (len == 101000 && data[100999] == 0);

  CHECK_INT (io->ops->flush (io), 0);
  CHECK_INT (io->ops->flush (io), 0);
  memio_stats (io, &st);
  CHECK_EQ (st.reads, 2);
  CHECK_EQ (st.writes, 4);         /* not the one refused */
  CHECK_EQ (st.punches, 3);
  CHECK_EQ (st.flushes, 2);

  /* Reference counted: the second close frees it (valgrind checks). */
  CHECK (memio_ref (io) == io);
  io->ops->close (io);
  CHECK_INT (io->ops->size (io), 101000);
  io->ops->close (io);

  io = memio_new (NULL, 0);
  if (CHECK (io != NULL)) {
    CHECK_INT (io->ops->size (io), 0);
    CHECK_INT (io->ops->pread (io, buf, 10, 0), 0);
    io->ops->close (io);
  }
}

static void
test_memenv (void)
{
  struct memenv *me = memenv_new ();
  const struct qcow2_env *env;
  struct qcow2_io *a, *b, *io;
  struct memio_stats st;
  char *id;
  size_t len;

  if (!CHECK (me != NULL))
    return;
  env = memenv_env (me);
  a = memio_new ("aaaa", 4);
  b = memio_new ("bb", 2);
  CHECK_INT (memenv_add (me, "dir/a.qcow2", a), 0);
  CHECK_INT (memenv_add (me, "b.raw", b), 0);

  /* Each open is a reference to the registered file. */
  io = env->open (env->opaque, "dir/a.qcow2", true, &id);
  if (CHECK (io == a && id && strcmp (id, "dir/a.qcow2") == 0)) {
    CHECK_INT (io->ops->pwrite (io, "x", 1, 0), 0);
    CHECK (((const char *) memio_data (a, &len))[0] == 'x');
    io->ops->close (io);
  }
  free (id);

  errno = 0;
  id = (char *) "junk";
  io = env->open (env->opaque, "a.qcow2", true, &id);
  CHECK (io == NULL && errno == ENOENT && id == NULL);

  /* Adding a name again replaces the file, even with itself. */
  CHECK_INT (memenv_add (me, "b.raw", a), 0);
  CHECK_INT (memenv_add (me, "b.raw", a), 0);
  io = env->open (env->opaque, "b.raw", false, &id);
  CHECK (io == a);
  if (io)
    io->ops->close (io);
  free (id);
  memio_stats (b, &st);
  CHECK_EQ (st.writes, 0);

  /* Messages from the engine. */
  CHECK (memenv_last_error (me)[0] == '\0');
  CHECK_INT (memenv_error_count (me), 0);
  env->error (env->opaque, "first");
  env->error (env->opaque, "second");
  env->debug (env->opaque, "not an error");
  CHECK (strcmp (memenv_last_error (me), "second") == 0);
  CHECK_INT (memenv_error_count (me), 2);
  memenv_clear_errors (me);
  CHECK (memenv_last_error (me)[0] == '\0');
  CHECK_INT (memenv_error_count (me), 0);

  a->ops->close (a);
  b->ops->close (b);
  memenv_free (me);
  memenv_free (NULL);
}

int
main (void)
{
  test_memio ();
  test_memenv ();
  return unit_finish ();
}
