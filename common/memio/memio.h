/* SPDX-License-Identifier: BSD-3-Clause */
/* An in-memory qcow2_io backend, and a qcow2_env that opens named
 * in-memory files, so that unit tests and fuzzers drive the engine
 * (backing chains included) without touching the filesystem.
 */
#ifndef QCOW2_MEMIO_H
#define QCOW2_MEMIO_H

#include <stddef.h>
#include <stdint.h>

#include "io.h"

/* A new in-memory file holding a copy of data[0, len) (data may be
 * NULL when len is 0).  The object is reference counted: ops->close
 * drops a reference, so a test may keep one to inspect the contents
 * after the engine is done.  Returns NULL with errno set on failure.
 */
extern struct qcow2_io *memio_new (const void *data, size_t len);

/* The same, with pread_many, as remote storage (where each request
 * costs a round trip): its reads are counted in round_trips too.
 */
extern struct qcow2_io *memio_new_remote (const void *data, size_t len);

/* Take another reference to io (which must come from memio_new). */
extern struct qcow2_io *memio_ref (struct qcow2_io *io);

/* Returns the current contents, valid until the next write or close. */
extern const void *memio_data (struct qcow2_io *io, size_t *len);

/* Calls made so far, so tests can check what the engine did. */
struct memio_stats {
  uint64_t reads, writes, flushes, punches;
  /* memio_new_remote: calls of pread, and of pread_many. */
  uint64_t round_trips;
};
extern void memio_stats (struct qcow2_io *io, struct memio_stats *stats);

/* A table of named in-memory files behind a struct qcow2_env: its open
 * callback finds path in the table (the name is also the file's
 * identity, for loop detection), its open_remote callback the URL, and
 * error messages are kept for the caller to check.
 */
struct memenv;

extern struct memenv *memenv_new (void);
extern void memenv_free (struct memenv *me);

/* Register io under name, taking a reference; a second file of the
 * same name replaces the first.  Returns 0, or -errno.
 */
extern int memenv_add (struct memenv *me, const char *name,
                       struct qcow2_io *io);

/* Returns the environment to give qcow2_open, valid until memenv_free. */
extern const struct qcow2_env *memenv_env (struct memenv *me);

/* Returns the last error message the engine sent (empty if none), and how
 * many it sent; memenv_clear_errors forgets them.  Messages are also
 * printed on stderr if MEMENV_VERBOSE is set in the environment.
 */
extern const char *memenv_last_error (const struct memenv *me);
extern unsigned memenv_error_count (const struct memenv *me);
/* Returns the last remote storage opened: "URL sslverify=0|1 timeout=N
 * cookie=COOKIE", and for ssh " ssh: host=H port=P user=U path=PATH
 * verify_host=0|1" (empty if none).
 */
extern const char *memenv_last_remote (const struct memenv *me);
extern void memenv_clear_errors (struct memenv *me);

#endif /* QCOW2_MEMIO_H */
