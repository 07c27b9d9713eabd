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

/* A qcow2_env.open callback opening local files with fileio_open_with,
 * with the qcow2_env's opaque as the options (or NULL); the identity of
 * a file is its canonical path.
 */
extern struct qcow2_io *fileio_env_open (void *opaque, const char *path,
                                         bool readonly, char **id);
/* The qcow2_env.identity callback that goes with it. */
extern char *fileio_env_identity (void *opaque, const char *path);

#endif /* QCOW2_FILEIO_H */
