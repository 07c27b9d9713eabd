/* A qcow2_io backend over a local file. */
#ifndef QCOW2_FILEIO_H
#define QCOW2_FILEIO_H

#include <stdbool.h>

#include "io.h"

/* Open path.  On failure returns NULL with errno set. */
extern struct qcow2_io *fileio_open (const char *path, bool readonly);

/* Create path, or open it if it exists and is empty (else EEXIST). */
extern struct qcow2_io *fileio_create (const char *path);

/* A qcow2_env.open callback opening local files with fileio_open; the
 * identity of a file is its canonical path.
 */
extern struct qcow2_io *fileio_env_open (void *opaque, const char *path,
                                         bool readonly, char **id);

#endif /* QCOW2_FILEIO_H */
