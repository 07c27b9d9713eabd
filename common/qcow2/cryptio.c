/* SPDX-License-Identifier: BSD-3-Clause */
/* The guest data of an encrypted image: a struct qcow2_io over the
 * file that holds the data (the image, or its external data file) that
 * encrypts what is written and decrypts what is read, in 512-byte
 * sectors numbered by host offset, as QEMU does.  The data paths use it
 * as they use the file, so no plaintext reaches the file.
 *
 * It has no punch and no hole: a hole reads as zeros, which decrypt to
 * noise, so zeroing writes encrypted zeros and extents never report
 * the file's holes.
 *
 * A write never changes the caller's buffer: it encrypts a copy.  A
 * write that starts or ends inside a sector first reads and decrypts
 * that sector, holding a lock for it, so that two requests writing
 * different bytes of one sector (byte-granular clients do) both land.
 * A read that starts or ends inside a sector holds the same lock, so
 * that it never decrypts a sector half rewritten by such a write (a
 * request that covers a whole sector overlaps any other that touches
 * it, and then NBD promises nothing).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CRYPT_LOCKS 64                  /* sector locks, by sector number */

struct crypt_io {
  struct qcow2_io io;
  struct qcow2_io *below;               /* not owned */
  const struct luks_key *key;           /* not owned */
  /* Which of these a request takes depends on its sectors, which the
   * thread-safety analysis cannot name: crypt_io_lock_ends and
   * crypt_io_unlock_ends, which pair them, are its only users and are
   * not checked.
   */
  struct lock locks[CRYPT_LOCKS];
};

static struct crypt_io *
crypt_io_of (struct qcow2_io *io)
{
  return (struct crypt_io *) io;
}

/* The sectors of [start, end) a request covers in part: the locks of
 * the first and the last, taken in order (one if they share it).
 */
struct crypt_io_ends {
  unsigned lo, hi;
};

static struct crypt_io_ends
crypt_io_lock_ends (struct crypt_io *c, uint64_t start, uint64_t end)
  TSA_NO_TSA
{
  unsigned a = (start / QCOW2_CRYPT_SECTOR) % CRYPT_LOCKS;
  unsigned b = ((end - QCOW2_CRYPT_SECTOR) / QCOW2_CRYPT_SECTOR) % CRYPT_LOCKS;
  struct crypt_io_ends e = { MIN (a, b), MAX (a, b) };

  assert (start < end && start % QCOW2_CRYPT_SECTOR == 0 &&
          end % QCOW2_CRYPT_SECTOR == 0);
  lock_acquire (&c->locks[e.lo]);
  if (e.hi != e.lo)
    lock_acquire (&c->locks[e.hi]);
  return e;
}

static void
crypt_io_unlock_ends (struct crypt_io *c, struct crypt_io_ends e)
  TSA_NO_TSA
{
  if (e.hi != e.lo)
    lock_release (&c->locks[e.hi]);
  lock_release (&c->locks[e.lo]);
}

static int
crypt_io_pread (struct qcow2_io *io, void *buf, size_t count,
                uint64_t offset)
{
  struct crypt_io *c = crypt_io_of (io);
  uint64_t start = offset & ~(uint64_t) (QCOW2_CRYPT_SECTOR - 1);
  uint64_t end = (offset + count + QCOW2_CRYPT_SECTOR - 1)
    & ~(uint64_t) (QCOW2_CRYPT_SECTOR - 1);
  struct crypt_io_ends e;
  uint8_t *tmp;
  int r;

  if (start == offset && end == offset + count) {
    if ((r = c->below->ops->pread (c->below, buf, count, offset)) == 0)
      luks_decrypt (c->key, offset / QCOW2_CRYPT_SECTOR, buf, count);
    return r;
  }
  if (!(tmp = malloc (end - start)))
    return -ENOMEM;
  e = crypt_io_lock_ends (c, start, end);
  r = c->below->ops->pread (c->below, tmp, end - start, start);
  crypt_io_unlock_ends (c, e);
  if (r == 0) {
    luks_decrypt (c->key, start / QCOW2_CRYPT_SECTOR, tmp, end - start);
    memcpy (buf, tmp + (offset - start), count);
  }
  free (tmp);
  return r;
}

/* Read and decrypt the sector at offset into buf. */
static int
crypt_io_read_sector (struct crypt_io *c, uint8_t *buf, uint64_t offset)
{
  int r = c->below->ops->pread (c->below, buf, QCOW2_CRYPT_SECTOR, offset);

  if (r == 0)
    luks_decrypt (c->key, offset / QCOW2_CRYPT_SECTOR, buf,
                  QCOW2_CRYPT_SECTOR);
  return r;
}

static int
crypt_io_pwrite (struct qcow2_io *io, const void *buf, size_t count,
                 uint64_t offset)
{
  struct crypt_io *c = crypt_io_of (io);
  const uint64_t ss = QCOW2_CRYPT_SECTOR;
  uint64_t start = offset & ~(ss - 1);
  uint64_t end = (offset + count + ss - 1) & ~(ss - 1);
  uint64_t len = end - start;
  bool head = start != offset, tail = end != offset + count;
  struct crypt_io_ends e = { 0, 0 };
  uint8_t *tmp = malloc (len);
  int r = 0;

  if (!tmp)
    return -ENOMEM;
  if (head || tail)
    e = crypt_io_lock_ends (c, start, end);
  if (head)
    r = crypt_io_read_sector (c, tmp, start);
  if (r == 0 && tail && (!head || len > ss))
    r = crypt_io_read_sector (c, tmp + len - ss, end - ss);
  if (r == 0) {
    memcpy (tmp + (offset - start), buf, count);
    luks_encrypt (c->key, start / ss, tmp, len);
    r = c->below->ops->pwrite (c->below, tmp, len, start);
  }
  if (head || tail)
    crypt_io_unlock_ends (c, e);
  free (tmp);
  return r;
}

static int
crypt_io_flush (struct qcow2_io *io)
{
  struct crypt_io *c = crypt_io_of (io);
  return c->below->ops->flush (c->below);
}

static int64_t
crypt_io_size (struct qcow2_io *io)
{
  struct crypt_io *c = crypt_io_of (io);
  return c->below->ops->size (c->below);
}

static void
crypt_io_close (struct qcow2_io *io)
{
  struct crypt_io *c = crypt_io_of (io);

  for (unsigned i = 0; i < CRYPT_LOCKS; i++)
    lock_destroy (&c->locks[i]);
  free (c);
}

static const struct qcow2_io_ops crypt_io_ops = {
  .pread = crypt_io_pread,
  .pwrite = crypt_io_pwrite,
  .flush = crypt_io_flush,
  .size = crypt_io_size,
  .close = crypt_io_close,
};

struct qcow2_io *
crypt_io_new (struct qcow2_io *below, const struct luks_key *key)
{
  struct crypt_io *c = calloc (1, sizeof *c);

  if (!c)
    return NULL;
  c->io.ops = &crypt_io_ops;
  c->io.serial_writes = below->serial_writes;
  c->io.grows_by_writes = below->grows_by_writes;
  c->below = below;
  c->key = key;
  for (unsigned i = 0; i < CRYPT_LOCKS; i++)
    lock_init (&c->locks[i]);
  return &c->io;
}
