/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit test of the local-file backend's open when the threads' keys
 * cannot be made: every pthread key of the process taken, an open with
 * O_DIRECT (whose threads keep buffers and rings under keys) fails with
 * a message saying so, and one through the page cache, which needs no
 * key, still serves the file.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"
#include "unit.h"

int
main (void)
{
  const char *dir = getenv ("TMPDIR");
  char path[PATH_MAX], buf[5] = "";
  static pthread_key_t keys[PTHREAD_KEYS_MAX + 1];
  struct fileio_options direct = { .direct = true,
                                   .locking = FILEIO_LOCKING_OFF };
  struct fileio_options cached = { .locking = FILEIO_LOCKING_OFF };
  struct qcow2_io *io;
  char *why = NULL;
  size_t n = 0;
  int fd;

  snprintf (path, sizeof path, "%s/test-unit-fileio.XXXXXX",
            dir ? dir : "/tmp");
  fd = mkstemp (path);
  if (!CHECK (fd >= 0) || !CHECK (write (fd, "data", 4) == 4))
    return unit_finish ();
  close (fd);

  while (n < PTHREAD_KEYS_MAX + 1 &&
         pthread_key_create (&keys[n], NULL) == 0)
    n++;
  CHECKF (n < PTHREAD_KEYS_MAX + 1, "made %zu keys: none ran out", n);

  errno = 0;
  io = fileio_open_with (path, true, &direct, &why);
  CHECK (io == NULL);
  CHECK_INT (errno, EAGAIN);
  CHECKF (why && strstr (why, "no key for its threads' buffers "
                         "(pthread_key_create: ") &&
          strstr (why, "\ncache=writeback opens it without"),
          "why: %s", why ? why : "(none)");
  free (why);
  why = NULL;
  if (io)
    io->ops->close (io);

  io = fileio_open_with (path, true, &cached, &why);
  if (CHECKF (io != NULL, "page cache open: %s", why ? why : strerror (errno))) {
    CHECK_INT (io->ops->pread (io, buf, 4, 0), 0);
    CHECK (memcmp (buf, "data", 4) == 0);
    io->ops->close (io);
  }
  free (why);

  while (n > 0)
    pthread_key_delete (keys[--n]);
  unlink (path);
  return unit_finish ();
}
