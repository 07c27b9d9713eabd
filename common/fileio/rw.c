/* SPDX-License-Identifier: BSD-3-Clause */
/* fileio's reads and writes through the page cache (see fileio.h):
 * pread/pwrite looping over short transfers, fdatasync, hole punching,
 * SEEK_HOLE for finding holes; the iovec helpers and the ops the
 * O_DIRECT ones share.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"
#include "fileio-internal.h"

static int
fileio_fd (struct qcow2_io *io)
{
  return ((struct fileio *) io)->fd;
}

/* Copies the iovec from position pos on into iov[] (room for
 * QCOW2_IOV_MAX): what is left to do after a short read or write.
 * Returns the count.
 */
static int
fileio_iov_from (const struct iovec *in, int cnt, size_t pos,
                 struct iovec *iov)
{
  int n = 0;

  assert (cnt <= QCOW2_IOV_MAX);
  for (int i = 0; i < cnt; i++) {
    if (pos >= in[i].iov_len) {
      pos -= in[i].iov_len;
      continue;
    }
    iov[n].iov_base = (char *) in[i].iov_base + pos;
    iov[n++].iov_len = in[i].iov_len - pos;
    pos = 0;
  }
  return n;
}

size_t
fileio_iov_len (const struct iovec *iov, int cnt)
{
  size_t len = 0;

  for (int i = 0; i < cnt; i++)
    len += iov[i].iov_len;
  return len;
}

/* Copy n bytes between flat and the iovec's bytes from position pos:
 * into the iovec if to_iov, else out of it.
 */
void
fileio_iov_copy (const struct iovec *in, int cnt, size_t pos, void *flat,
                 size_t n, bool to_iov)
{
  struct iovec iov[QCOW2_IOV_MAX];
  int k = fileio_iov_from (in, cnt, pos, iov);
  uint8_t *p = flat;

  for (int i = 0; i < k && n > 0; i++) {
    size_t m = MIN (n, iov[i].iov_len);
    if (to_iov)
      memcpy (iov[i].iov_base, p, m);
    else
      memcpy (p, iov[i].iov_base, m);
    p += m;
    n -= m;
  }
  assert (n == 0);              /* the iovec holds what is copied */
}

/* Read (with zeros past the end of the file) or write, looping over
 * short transfers.
 */
int
fileio_rw_fd (int fd, const struct iovec *in, int cnt, uint64_t offset,
              bool write, bool ring)
{
  size_t count = fileio_iov_len (in, cnt), done = 0;
  struct iovec iov[QCOW2_IOV_MAX];

  while (done < count) {
    int k = fileio_iov_from (in, cnt, done, iov);
    ssize_t n = fileio_xfer (fd, iov, k, offset + done, write, ring);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0 && !write) {     /* past the end of the file */
      for (int i = 0; i < k; i++)
        memset (iov[i].iov_base, 0, iov[i].iov_len);
      return 0;
    }
    done += n;
  }
  return 0;
}


static int
fileio_preadv (struct qcow2_io *io, const struct iovec *iov, int cnt,
               uint64_t offset)
{
  if (cnt > QCOW2_IOV_MAX)
    return -EINVAL;
  return fileio_rw_fd (fileio_fd (io), iov, cnt, offset, false, false);
}

static int
fileio_pwritev (struct qcow2_io *io, const struct iovec *iov, int cnt,
                uint64_t offset)
{
  if (cnt > QCOW2_IOV_MAX)
    return -EINVAL;
  return fileio_rw_fd (fileio_fd (io), iov, cnt, offset, true, false);
}

static int
fileio_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  struct iovec iov = { buf, count };

  return fileio_preadv (io, &iov, 1, offset);
}

static int
fileio_pwrite (struct qcow2_io *io, const void *buf, size_t count,
               uint64_t offset)
{
  struct iovec iov = { (void *) buf, count };

  return fileio_pwritev (io, &iov, 1, offset);
}

int
fileio_flush (struct qcow2_io *io)
{
  return fdatasync (fileio_fd (io)) == -1 ? -errno : 0;
}

int
fileio_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  if (fallocate (fileio_fd (io), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                 offset, count) == -1)
    return -errno;
  return 0;
}

int
fileio_preallocate (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  /* posix_fallocate, unlike fallocate, also works (by writing zeros
   * into the holes) where the file system cannot allocate.
   */
  return -posix_fallocate (fileio_fd (io), offset, count);
}

int64_t
fileio_size (struct qcow2_io *io)
{
  /* lseek rather than fstat, so block devices work too. */
  off_t size = lseek (fileio_fd (io), 0, SEEK_END);

  return size == -1 ? -errno : size;
}

int
fileio_status (struct qcow2_io *io, uint64_t offset, uint64_t count,
               uint32_t *type, uint64_t *len)
{
  int fd = fileio_fd (io);
  off_t data = lseek (fd, offset, SEEK_DATA);

  *type = QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO;
  if (data == -1) {
    /* A block device has no SEEK_DATA (EINVAL): all of it is data. */
    if (errno == EINVAL) {
      *type = 0;
      *len = count;
      return 0;
    }
    if (errno != ENXIO)
      return -errno;
    *len = count;               /* no data from here to the end */
    return 0;
  }
  if ((uint64_t) data > offset) {
    *len = data - offset;
    return 0;
  }
  off_t hole = lseek (fd, offset, SEEK_HOLE);
  if (hole == -1)
    return -errno;
  *type = 0;
  *len = hole - offset;
  return 0;
}

int64_t
fileio_allocated (struct qcow2_io *io)
{
  struct stat st;

  if (fstat (fileio_fd (io), &st) == -1)
    return -errno;
  return (int64_t) st.st_blocks * 512;
}

void
fileio_close (struct qcow2_io *io)
{
  struct fileio *f = (struct fileio *) io;

  close (f->fd);
  if (f->align) {
    assert (!f->ranges);        /* no write in flight */
    lock_destroy (&f->ranges_lock);
    pthread_cond_destroy (&f->ranges_done);
  }
  free (f);
}

const struct qcow2_io_ops fileio_ops = {
  .pread = fileio_pread,
  .pwrite = fileio_pwrite,
  .preadv = fileio_preadv,
  .pwritev = fileio_pwritev,
  .flush = fileio_flush,
  .punch = fileio_punch,
  .size = fileio_size,
  .status = fileio_status,
  .allocated = fileio_allocated,
  .preallocate = fileio_preallocate,
  .close = fileio_close,
};
