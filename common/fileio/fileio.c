/* SPDX-License-Identifier: BSD-3-Clause */
/* A qcow2_io backend over a local file (see fileio.h): opening it
 * (under a folder of untrusted names, beneath it: beneath.c), through
 * the page cache (rw.c) or with O_DIRECT (direct.c), locked
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

/* The name of path under opts->beneath, or NULL if it is not there. */
static const char *
fileio_beneath_name (const char *path, const struct fileio_options *opts)
{
  size_t n = opts && opts->beneath ? strlen (opts->beneath) : 0;

  if (n && strncmp (path, opts->beneath, n) == 0 && path[n] == '/')
    return path + n + 1;
  return NULL;
}

/* open (path, flags, mode), or under opts->beneath fileio_open_beneath,
 * then (there) refused unless a regular file, *why saying why.
 */
static int
fileio_open_path (const char *path, int flags, mode_t mode,
                  const struct fileio_options *opts, char **why)
{
  const char *name = fileio_beneath_name (path, opts);
  struct stat st;
  int fd, e;

  if (!name)
    return open (path, flags, mode);
  fd = fileio_open_beneath (opts->beneath_fd, name, flags, mode);
  if (fd == -1) {
    e = errno;
    if ((e == EXDEV || e == ELOOP) &&
        asprintf (why, "refused: %s leads out of %s (by \"..\" or a "
                  "symbolic link to an absolute name), or through more "
                  "than 40 links", name, opts->beneath) == -1)
      *why = NULL;
    errno = e == EXDEV ? EPERM : e;
    return -1;
  }
  if (fstat (fd, &st) == -1) {
    e = errno;
    close (fd);
    errno = e;
    return -1;
  }
  if (!S_ISREG (st.st_mode)) {
    if (asprintf (why, "refused: %s in %s is not a regular file (a "
                  "folder, FIFO, socket or device)", name,
                  opts->beneath) == -1)
      *why = NULL;
    close (fd);
    errno = EPERM;
    return -1;
  }
  return fd;
}

/* A qcow2_io over fd (open on path as opts says, O_NONBLOCK), which
 * it takes: closed on failure.
 */
static struct qcow2_io *
fileio_from_fd (int fd, const char *path, bool readonly,
                const struct fileio_options *opts, char **why)
{
  bool direct = opts && opts->direct;
  struct fileio *f;
  struct stat st;
  size_t align = 0;
  int e;

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
  errno = e;
  return NULL;
}

/* Open path as fileio_open_with does, with more flags (O_CREAT...). */
static struct qcow2_io *
fileio_open_flags (const char *path, bool readonly, int more, mode_t mode,
                   const struct fileio_options *opts, char **why)
{
  bool direct = opts && opts->direct;
  struct qcow2_io *io;
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
  fd = fileio_open_path (path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC |
                         O_NONBLOCK | (direct ? O_DIRECT : 0) | more, mode,
                         opts, why);
  io = fd == -1 ? NULL : fileio_from_fd (fd, path, readonly, opts, why);
  e = errno;
  free (discard);
  errno = e;
  return io;
}

struct qcow2_io *
fileio_open_with (const char *path, bool readonly,
                  const struct fileio_options *opts, char **why)
{
  return fileio_open_flags (path, readonly, 0, 0, opts, why);
}

bool
fileio_is_beneath (const char *path, const struct fileio_options *opts)
{
  return fileio_beneath_name (path, opts) != NULL;
}

int
fileio_stat_with (const char *path, const struct fileio_options *opts,
                  struct stat *st)
{
  const char *name = fileio_beneath_name (path, opts);
  int fd, r, e;

  if (!name)
    return stat (path, st);
  fd = fileio_open_beneath (opts->beneath_fd, name, O_PATH, 0);
  if (fd == -1)
    return -1;
  r = fstat (fd, st);
  e = errno;
  close (fd);
  errno = e;
  return r;
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
  struct qcow2_io *io = fileio_open_flags (path, false, O_CREAT, 0644, opts,
                                          why);
  int64_t size;

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

struct qcow2_io *
fileio_create_new (const char *path, const struct fileio_options *opts,
                   char **why)
{
  return fileio_open_flags (path, false, O_CREAT | O_EXCL, 0666, opts, why);
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

