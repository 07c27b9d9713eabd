/* SPDX-License-Identifier: BSD-3-Clause */
/* The storage interface the qcow2 engine talks through.  The engine
 * never sees a file descriptor: a file, another nbdkit plugin, an
 * in-memory image for tests and fuzzing, or a fault-injecting backend
 * all implement these few operations.
 */
#ifndef QCOW2_IO_H
#define QCOW2_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* The most buffers the engine passes to preadv or pwritev at once. */
#define QCOW2_IOV_MAX 64

/* Allocation flags (status; qcow2_extents), equal to NBD's
 * base:allocation flags: not allocated, and reads as zeros.
 */
#define QCOW2_EXTENT_HOLE 1
#define QCOW2_EXTENT_ZERO 2

struct qcow2_io;
struct qcow2_layers;

/* One read of pread_many. */
struct qcow2_io_read {
  void *buf;
  size_t count;
  uint64_t offset;
  int r;                        /* its result: 0 or -errno */
};

struct qcow2_io_ops {
  /* Read count bytes at offset.  Bytes past the end of storage read as
   * zeros.  Returns 0 or -errno.
   */
  int (*pread) (struct qcow2_io *io, void *buf, size_t count,
                uint64_t offset);
  /* Write count bytes at offset, growing storage as needed. */
  int (*pwrite) (struct qcow2_io *io, const void *buf, size_t count,
                 uint64_t offset);
  /* Optional (may be NULL, then both): as pread and pwrite, for the
   * iovcnt buffers (at most QCOW2_IOV_MAX) in turn from offset.  Used
   * when pieces of a request lie next to each other in storage but not
   * in the request.
   */
  int (*preadv) (struct qcow2_io *io, const struct iovec *iov, int iovcnt,
                 uint64_t offset);
  int (*pwritev) (struct qcow2_io *io, const struct iovec *iov, int iovcnt,
                  uint64_t offset);
  /* Make every completed write durable. */
  int (*flush) (struct qcow2_io *io);
  /* Deallocate a range so that it reads as zeros (or -EOPNOTSUPP). */
  int (*punch) (struct qcow2_io *io, uint64_t offset, uint64_t count);
  /* Current size of storage in bytes, or -errno. */
  int64_t (*size) (struct qcow2_io *io);
  /* Optional (may be NULL): how [offset, offset+count) is allocated:
   * *type is 0 (data), QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO (a hole),
   * or one of the two alone (as NBD means them), and *len the length of
   * the run starting at offset that has that type.  Used so that raw
   * backing files report what qemu reports.  Remote storage, where a
   * question costs a round trip and which is only ever read, keeps the
   * answers, so that asking piece by piece is cheap.
   */
  int (*status) (struct qcow2_io *io, uint64_t offset, uint64_t count,
                 uint32_t *type, uint64_t *len);
  /* Optional (may be NULL): the n reads at once, returning when all are
   * done, each with its result.  For storage where a request costs a
   * round trip (a network): they are all in flight together, where
   * calls of pread from as many threads might not be.
   */
  void (*pread_many) (struct qcow2_io *io, struct qcow2_io_read *reads,
                      size_t n);
  /* Optional (may be NULL): bytes of storage actually allocated. */
  int64_t (*allocated) (struct qcow2_io *io);
  /* Optional (may be NULL): give [offset, offset+count) space of its
   * own without writing it (posix_fallocate), growing storage as
   * needed; what was never written there still reads as zeros.
   */
  int (*preallocate) (struct qcow2_io *io, uint64_t offset, uint64_t count);
  void (*close) (struct qcow2_io *io);
};

struct qcow2_io {
  const struct qcow2_io_ops *ops;
  /* Writes to this storage wait for each other anyway (a file through
   * the page cache: the kernel holds the file's lock across a buffered
   * write), so the pieces of a request are written in turn, not by
   * threads that would only spin on that lock.
   */
  bool serial_writes;
  /* A write into a hole inside this storage costs more than one past
   * its end (O_DIRECT on ext4: the hole becomes an unwritten extent,
   * converted in the writer's thread when the write completes), so the
   * engine does not extend it ahead of allocations (io_extend),
   * though a flush after allocating writes then costs a second host
   * flush, as in QEMU.
   */
  bool grows_by_writes;
};

/* Remote storage a backing file name gives (read-only): a URL, QEMU's
 * legacy "nbd:HOST:PORT" syntax or a "json:{...}" name, which the
 * engine turns into the URL and options here.
 */
struct qcow2_remote {
  /* nbd://, nbds://, nbd+unix://, nbds+unix:// (an NBD server),
   * http://, https:// or ssh://[USER@]HOST[:PORT]/PATH[?host_key_check=no]
   * (QEMU's URL syntax for each).
   */
  const char *url;
  /* http and https, from a json: name (QEMU's curl driver options). */
  bool sslverify;               /* check the server's certificate */
  unsigned timeout;             /* seconds a request may take; 0: default */
  const char *cookie;           /* the Cookie header, or NULL */
  /* ssh: the URL's parts, percent-decoded (the one parse of it). */
  struct {
    const char *host;           /* NULL: not an ssh URL */
    const char *port;           /* NULL: the default */
    const char *user;           /* NULL: the default */
    const char *path;
    bool verify_host;           /* false: host_key_check=no */
  } ssh;
};

/* How the engine opens the other files an image names (backing files,
 * external data files).  Supplied by whoever drives the engine.
 */
struct qcow2_env {
  void *opaque;
  /* Open path (already resolved against the naming image's folder).
   * On success returns the I/O object and sets *id to a malloc'd name
   * that is equal for two paths naming the same file (used to detect
   * backing chains that loop).  On failure returns NULL and sets errno;
   * *id is then a malloc'd message explaining why, a remedy after a
   * newline if any (or NULL).
   */
  struct qcow2_io *(*open) (void *opaque, const char *path, bool readonly,
                            char **id);
  /* Optional (may be NULL): the name open would give path as *id,
   * without opening it (malloc'd; NULL if it cannot say), so that a
   * loop in a backing chain is found before the file is opened a
   * second time (which image locks would refuse).
   */
  char *(*identity) (void *opaque, const char *path);
  /* Optional (NULL: remote names are refused): open remote storage
   * read-only.  On failure returns NULL and sets errno; *why is then a
   * malloc'd message saying what failed, then after a newline what to
   * do, if anything (or NULL).
   */
  struct qcow2_io *(*open_remote) (void *opaque,
                                   const struct qcow2_remote *remote,
                                   char **why);
  /* Error and debug messages from the engine, each one line. */
  void (*error) (void *opaque, const char *msg);
  void (*debug) (void *opaque, const char *msg);
  /* Optional (NULL: not logged): what the user can do about the error
   * just sent, one line, to be logged on a line of its own.
   */
  void (*hint) (void *opaque, const char *msg);
  /* Optional: something the user should know that is not an error
   * (an image repaired, bitmaps dropped), about the file at path.
   */
  void (*notice) (void *opaque, const char *path, const char *msg);
  /* The option that gives the password of encrypted images, named in
   * messages (NULL: "password").
   */
  const char *password_key;
  /* And the one of backing files' passwords (NULL: "backing-password"). */
  const char *backing_password_key;
  /* Optional (NULL: each image opens its own chain): the table of
   * backing layers the images opened with this environment share
   * (qcow2_layers_new, qcow2.h).
   */
  struct qcow2_layers *layers;
};

#endif /* QCOW2_IO_H */
