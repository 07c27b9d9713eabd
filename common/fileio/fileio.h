/* SPDX-License-Identifier: BSD-3-Clause */
/* A qcow2_io backend over a local file. */
#ifndef QCOW2_FILEIO_H
#define QCOW2_FILEIO_H

#include <stdbool.h>
#include <sys/stat.h>

#include "io.h"

/* Image locking, as QEMU's file-posix driver does it (locking=). */
enum fileio_locking {
  FILEIO_LOCKING_AUTO,          /* where the file system supports it */
  FILEIO_LOCKING_ON,
  FILEIO_LOCKING_OFF,
};

/* How files are opened. */
struct fileio_options {
  /* O_DIRECT, past the page cache (cache=none).  Reads and writes that
   * are not aligned as the file system requires go through an aligned
   * buffer; a write covering part of a block reads the block first.
   */
  bool direct;
  enum fileio_locking locking;
  /* Optional: told when locking=auto finds no lock support. */
  void (*notice) (const char *path, const char *msg);
  /* Optional: told how each file was locked. */
  void (*debug) (const char *path, const char *msg);
  /* Optional (NULL: none): a folder, resolved, with beneath_fd open on
   * it.  A path under it is opened relative to beneath_fd by
   * fileio_open_beneath, never leaving it, and must be a regular file
   * (else refused before any lock, read or write): names there are
   * untrusted (a folder of images that others may change).
   */
  const char *beneath;
  int beneath_fd;
};

/* Open path (opts may be NULL: the defaults, which lock).  On failure
 * returns NULL with errno set; if why is not NULL, *why is then a
 * malloc'd explanation (or NULL).
 *
 * Locks: QEMU's byte-range OFD locks (block/file-posix.c), held as long
 * as the file is open.  Byte 100+N held means "I use permission N",
 * 200+N "I do not share permission N", with N 0 (consistent read),
 * 1 (write) and 3 (resize).  Read-only, a file is locked as QEMU locks
 * an image or backing file it reads: using 0, not sharing 1 and 3;
 * read-write, using 0, 1 and 3, not sharing 1 and 3.  Opening fails
 * (EAGAIN) if another process holds what conflicts: a byte 200+N of a
 * permission we use, or a byte 100+N of one we do not share.
 */
extern struct qcow2_io *fileio_open_with (const char *path, bool readonly,
                                          const struct fileio_options *opts,
                                          char **why);

/* Open name (relative, not empty) as openat (dirfd, name, flags, mode)
 * does, but never leaving the folder dirfd: a "..", or a symbolic link
 * with an absolute target, that would lead out of it fails with EXDEV
 * (as openat2's RESOLVE_BENEATH, which is used where the kernel has it;
 * the walk done without it gives the same results).  Links inside the
 * folder are followed.  Returns the descriptor, or -1 with errno set.
 */
extern int fileio_open_beneath (int dirfd, const char *name, int flags,
                                mode_t mode);

/* Whether path lies under opts->beneath (and opens beneath it). */
extern bool fileio_is_beneath (const char *path,
                               const struct fileio_options *opts);
/* stat of the file path names, resolved as fileio_open_with resolves
 * it (under opts->beneath, beneath it).
 */
extern int fileio_stat_with (const char *path,
                             const struct fileio_options *opts,
                             struct stat *st);

/* Runs fstat on the file io (from fileio_open_with or fileio_create)
 * has open: what was opened, whatever its name leads to since.
 */
extern int fileio_stat (struct qcow2_io *io, struct stat *st);

/* Create path, or open it if it exists and is empty (else EEXIST),
 * locked for writing before anything is written.
 */
extern struct qcow2_io *fileio_create (const char *path,
                                       const struct fileio_options *opts,
                                       char **why);
/* Create path, which must not exist (else EEXIST, a link too), locked
 * for writing; its mode 0666 less the umask, as a new file's.
 */
extern struct qcow2_io *fileio_create_new (const char *path,
                                           const struct fileio_options *opts,
                                           char **why);

/* A qcow2_env.open callback opening local files with fileio_open_with,
 * with the qcow2_env's opaque as the options (or NULL); the identity of
 * a file is its canonical path.
 */
extern struct qcow2_io *fileio_env_open (void *opaque, const char *path,
                                         bool readonly, char **id);
/* The qcow2_env.identity callback that goes with it. */
extern char *fileio_env_identity (void *opaque, const char *path);

#endif /* QCOW2_FILEIO_H */
