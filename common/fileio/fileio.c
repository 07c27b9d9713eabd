/* SPDX-License-Identifier: BSD-3-Clause */
/* A qcow2_io backend over a local file (see fileio.h): opening it,
 * through the page cache (rw.c) or with O_DIRECT (direct.c), locked
 * (locking.c); making it; the qcow2_env callbacks.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"
#include "errstr.h"
#include "fileio-internal.h"

struct qcow2_io *
fileio_open_with (const char *path, bool readonly,
                  const struct fileio_options *opts, char **why)
{
  bool direct = opts && opts->direct;
  struct fileio *f;
  struct stat st;
  size_t align = 0;
  char *discard = NULL;
  int fd, e;

  if (!why)
    why = &discard;
  *why = NULL;
  /* O_DIRECT's threads keep buffers (and rings) of their own. */
  if (direct && ((e = fileio_bounce_ready ()) != 0 ||
                 (e = fileio_ring_ready ()) != 0)) {
    if (asprintf (why, "cannot open it with O_DIRECT: no key for its "
                  "threads' buffers (pthread_key_create: %s)\n"
                  "cache=writeback opens it without", errstr (e)) == -1)
      *why = NULL;
    free (discard);
    errno = e;
    return NULL;
  }
  /* Not blocking in open on a FIFO (which then fails below or at its
   * first read): O_NONBLOCK is dropped once the file is open.
   */
  fd = open (path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NONBLOCK |
             (direct ? O_DIRECT : 0));
  if (fd == -1)
    return NULL;
  if (fstat (fd, &st) == -1 ||
      fcntl (fd, F_SETFL, fcntl (fd, F_GETFL) & ~O_NONBLOCK) == -1)
    goto err;
  if (S_ISDIR (st.st_mode)) {
    errno = EISDIR;
    goto err;
  }
  if (S_ISREG (st.st_mode) &&
      (e = fileio_lock (fd, path, readonly, opts, why)) < 0) {
    errno = -e;
    goto err;
  }
  if (direct) {
    align = fileio_direct_align (fd);
    if (align == 0 || align > FILEIO_MAX_ALIGN || !is_power_of_2 (align)) {
      errno = EINVAL;
      goto err;
    }
  }
  f = malloc (sizeof *f);
  if (!f)
    goto err;
  f->fd = fd;
  f->align = align;
  f->io.ops = direct ? &fileio_direct_ops : &fileio_ops;
  f->io.serial_writes = !direct && S_ISREG (st.st_mode);
  f->io.grows_by_writes = direct && S_ISREG (st.st_mode);
  f->ranges = NULL;
  f->end = st.st_size;
  if (direct) {
    lock_init (&f->ranges_lock);
    lock_cond_init (&f->ranges_done);
  }
  return &f->io;

 err:
  e = errno;
  close (fd);
  free (discard);
  errno = e;
  return NULL;
}

int
fileio_stat (struct qcow2_io *io, struct stat *st)
{
  return fstat (((struct fileio *) io)->fd, st);
}

struct qcow2_io *
fileio_create (const char *path, const struct fileio_options *opts,
               char **why)
{
  struct qcow2_io *io;
  int fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  int64_t size;

  *why = NULL;
  if (fd == -1)
    return NULL;
  close (fd);
  io = fileio_open_with (path, false, opts, why);
  if (!io)
    return NULL;
  size = io->ops->size (io);
  if (size != 0) {
    io->ops->close (io);
    errno = size < 0 ? (int) -size : EEXIST;
    return NULL;
  }
  return io;
}

char *
fileio_env_identity (void *opaque, const char *path)
{
  (void) opaque;
  return realpath (path, NULL);
}

struct qcow2_io *
fileio_env_open (void *opaque, const char *path, bool readonly, char **id)
{
  struct qcow2_io *io = fileio_open_with (path, readonly, opaque, id);

  if (!io)
    return NULL;
  *id = realpath (path, NULL);
  if (!*id) {
    int e = errno;
    io->ops->close (io);
    errno = e;
    return NULL;
  }
  return io;
}

