/* A qcow2_io backend over a local file: pread/pwrite, fdatasync,
 * hole punching, and SEEK_HOLE for finding holes.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"

struct fileio {
  struct qcow2_io io;
  int fd;
};

static int
fileio_fd (struct qcow2_io *io)
{
  return ((struct fileio *) io)->fd;
}

static int
fileio_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  char *p = buf;

  while (count > 0) {
    ssize_t n = pread (fileio_fd (io), p, count, offset);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0) {               /* past the end of the file */
      memset (p, 0, count);
      return 0;
    }
    p += n;
    count -= n;
    offset += n;
  }
  return 0;
}

static int
fileio_pwrite (struct qcow2_io *io, const void *buf, size_t count,
               uint64_t offset)
{
  const char *p = buf;

  while (count > 0) {
    ssize_t n = pwrite (fileio_fd (io), p, count, offset);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += n;
    count -= n;
    offset += n;
  }
  return 0;
}

static int
fileio_flush (struct qcow2_io *io)
{
  return fdatasync (fileio_fd (io)) == -1 ? -errno : 0;
}

static int
fileio_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  if (fallocate (fileio_fd (io), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                 offset, count) == -1)
    return -errno;
  return 0;
}

static int64_t
fileio_size (struct qcow2_io *io)
{
  /* lseek rather than fstat, so block devices work too. */
  off_t size = lseek (fileio_fd (io), 0, SEEK_END);

  return size == -1 ? -errno : size;
}

static int
fileio_hole (struct qcow2_io *io, uint64_t offset, uint64_t count,
             bool *is_hole, uint64_t *len)
{
  int fd = fileio_fd (io);
  off_t data = lseek (fd, offset, SEEK_DATA);

  if (data == -1) {
    if (errno != ENXIO)
      return -errno;
    *is_hole = true;            /* no data from here to the end */
    *len = count;
    return 0;
  }
  if ((uint64_t) data > offset) {
    *is_hole = true;
    *len = data - offset;
    return 0;
  }
  off_t hole = lseek (fd, offset, SEEK_HOLE);
  if (hole == -1)
    return -errno;
  *is_hole = false;
  *len = hole - offset;
  return 0;
}

static int64_t
fileio_allocated (struct qcow2_io *io)
{
  struct stat st;

  if (fstat (fileio_fd (io), &st) == -1)
    return -errno;
  return (int64_t) st.st_blocks * 512;
}

static void
fileio_close (struct qcow2_io *io)
{
  close (fileio_fd (io));
  free (io);
}

static const struct qcow2_io_ops fileio_ops = {
  .pread = fileio_pread,
  .pwrite = fileio_pwrite,
  .flush = fileio_flush,
  .punch = fileio_punch,
  .size = fileio_size,
  .hole = fileio_hole,
  .allocated = fileio_allocated,
  .close = fileio_close,
};

struct qcow2_io *
fileio_open (const char *path, bool readonly)
{
  struct fileio *f;
  struct stat st;
  int fd, e;

  fd = open (path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fd == -1)
    return NULL;
  if (fstat (fd, &st) == -1)
    goto err;
  if (S_ISDIR (st.st_mode)) {
    errno = EISDIR;
    goto err;
  }
  f = malloc (sizeof *f);
  if (!f)
    goto err;
  f->fd = fd;
  f->io.ops = &fileio_ops;
  return &f->io;

 err:
  e = errno;
  close (fd);
  errno = e;
  return NULL;
}

struct qcow2_io *
fileio_create (const char *path)
{
  struct qcow2_io *io;
  int fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  int64_t size;

  if (fd == -1)
    return NULL;
  close (fd);
  io = fileio_open (path, false);
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
fileio_env_open (void *opaque, const char *path, bool readonly, char **id)
{
  struct qcow2_io *io = fileio_open (path, readonly);

  *id = NULL;
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
