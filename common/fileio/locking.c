/* SPDX-License-Identifier: BSD-3-Clause */
/* fileio's image locking (locking=; see fileio_open_with in fileio.h):
 * QEMU's byte-range OFD locks, taken and checked as block/file-posix.c
 * does.  It calls no other file of fileio.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "errstr.h"
#include "fileio-internal.h"

/* QEMU's lock bytes (block/file-posix.c): 100+N "uses permission N",
 * 200+N "does not share permission N".
 */
#define LOCK_USE 100
#define LOCK_SHARE 200
#define PERM_CONSISTENT_READ 0
#define PERM_WRITE 1
#define PERM_RESIZE 3
#define PERM_COUNT 5

static const char *const perm_names[PERM_COUNT] = {
  "consistent read", "write", "write unchanged", "resize", "change children",
};

static int
fileio_lock_byte (int fd, int cmd, short type, off_t byte)
{
  struct flock fl = {
    .l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1,
  };

  if (fcntl (fd, cmd, &fl) == -1)
    return -errno;
  if (cmd == F_OFD_GETLK)
    return fl.l_type == F_UNLCK ? 0 : 1;
  return 0;
}

/* As QEMU's raw_apply_lock_bytes and raw_check_lock_bytes. */
int
fileio_lock (int fd, const char *path, bool readonly,
             const struct fileio_options *opts, char **why)
{
  unsigned use = 1u << PERM_CONSISTENT_READ;
  unsigned unshared = 1u << PERM_WRITE | 1u << PERM_RESIZE;
  enum fileio_locking mode = opts ? opts->locking : FILEIO_LOCKING_AUTO;
  int r = 0;

  if (mode == FILEIO_LOCKING_OFF) {
    if (opts->debug)
      opts->debug (path, "not locked (locking=off)");
    return 0;
  }
  if (!readonly)
    use |= 1u << PERM_WRITE | 1u << PERM_RESIZE;
  for (int n = 0; n < PERM_COUNT && r == 0; n++) {
    if (use & 1u << n)
      r = fileio_lock_byte (fd, F_OFD_SETLK, F_RDLCK, LOCK_USE + n);
    if (r == 0 && unshared & 1u << n)
      r = fileio_lock_byte (fd, F_OFD_SETLK, F_RDLCK, LOCK_SHARE + n);
  }
  if (r == -EINVAL || r == -EOPNOTSUPP || r == -ENOLCK || r == -ENOSYS) {
    if (mode == FILEIO_LOCKING_ON) {
      if (asprintf (why, "cannot lock it (%s): the file system does not "
                    "support OFD locks\nlocking=off opens it unlocked",
                    errstr (-r)) == -1)
        *why = NULL;
      return r;
    }
    if (opts && opts->notice)
      opts->notice (path, "not locked: the file system does not support "
                    "OFD locks, so QEMU cannot see that it is in use");
    return 0;
  }
  for (int n = 0; n < PERM_COUNT && r == 0; n++) {
    const char *what = NULL;
    bool shared = false;
    int c = 0;

    if (use & 1u << n &&
        (c = fileio_lock_byte (fd, F_OFD_GETLK, F_WRLCK, LOCK_SHARE + n)) > 0)
      what = "another process (QEMU?) has it open and shares that with "
        "nobody";
    else if (c == 0 && unshared & 1u << n &&
             (c = fileio_lock_byte (fd, F_OFD_GETLK, F_WRLCK,
                                    LOCK_USE + n)) > 0) {
      what = n == PERM_WRITE ? "another process (QEMU?) has it open for "
        "writing" : "another process (QEMU?) has it open and may change it";
      shared = true;
    }
    if (c < 0)
      r = c;
    else if (what) {
      if (asprintf (why, "failed to get %s\"%s\" lock: %s (is another "
                    "process using the image?)\nlocking=off serves it "
                    "anyway, as qemu's -U or file.locking=off does",
                    shared ? "shared " : "", perm_names[n], what) == -1)
        *why = NULL;
      r = -EAGAIN;
    }
  }
  if (r == 0 && opts && opts->debug)
    opts->debug (path, readonly ? "locked as QEMU locks an image it reads "
                 "(OFD lock bytes 100, 201, 203)"
                 : "locked as QEMU locks an image it writes "
                 "(OFD lock bytes 100, 101, 103, 201, 203)");
  return r;
}
