/* A qcow2_io backend over a local file. */
#ifndef QCOW2_FILEIO_H
#define QCOW2_FILEIO_H

#include <stdbool.h>

#include "io.h"

/* How files are opened. */
struct fileio_options {
  /* O_DIRECT, past the page cache (cache=none).  Reads and writes that
   * are not aligned as the file system requires go through an aligned
   * buffer; a write covering part of a block reads the block first.
   */
  bool direct;
};

/* Open path (opts may be NULL: the defaults).  On failure returns NULL
 * with errno set.
 */
extern struct qcow2_io *fileio_open (const char *path, bool readonly);
extern struct qcow2_io *fileio_open_with (const char *path, bool readonly,
                                          const struct fileio_options *opts);

/* Create path, or open it if it exists and is empty (else EEXIST). */
extern struct qcow2_io *fileio_create (const char *path);

/* A qcow2_env.open callback opening local files with fileio_open_with,
 * with the qcow2_env's opaque as the options (or NULL); the identity of
 * a file is its canonical path.
 */
extern struct qcow2_io *fileio_env_open (void *opaque, const char *path,
                                         bool readonly, char **id);

#endif /* QCOW2_FILEIO_H */
