/* SPDX-License-Identifier: BSD-3-Clause */
/* A qcow2_io backend for crash and fault tests: an in-memory file (a
 * memio) that also keeps the state at the last flush and records every
 * write and punch issued since, so that a test can build the images a
 * crash could leave: the flushed state plus any subset of the later
 * writes, each torn into 512-byte sectors that persist or not on their
 * own (a disk with a volatile cache writes back in any order).  A hook
 * sees every operation first and may fail it with an errno.  Threads
 * may issue operations at once: each is done whole, in turn.
 */
#ifndef QCOW2_CRASHIO_H
#define QCOW2_CRASHIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io.h"

#define CRASHIO_SECTOR 512

enum crashio_op {
  CRASHIO_PREAD,
  CRASHIO_PWRITE,
  CRASHIO_FLUSH,
  CRASHIO_PUNCH,
  CRASHIO_NR_OPS
};

extern const char *crashio_op_name (enum crashio_op op);

/* Called before each operation: 0 lets it happen, a positive errno
 * fails it: nothing is written; a failed flush makes nothing durable,
 * and the writes before it never will be, though reads still see them
 * (as Linux marks pages clean after a failed writeback): a crash may
 * keep any of them, a later flush none.
 */
typedef int (*crashio_hook) (void *opaque, enum crashio_op op,
                             uint64_t offset, uint64_t count);

struct crashio;

/* A file holding a copy of data[0, len), flushed. */
extern struct crashio *crashio_new (const void *data, size_t len);
extern void crashio_free (struct crashio *c);

/* A new reference to the file for the engine (its close drops it);
 * the crashio itself must outlive it.
 */
extern struct qcow2_io *crashio_io (struct crashio *c);

extern void crashio_set_hook (struct crashio *c, crashio_hook hook,
                              void *opaque);

/* The contents now (as reads see them), valid until the next write. */
extern const uint8_t *crashio_data (struct crashio *c, size_t *len);

/* The contents at the last flush, valid until the next flush. */
extern const uint8_t *crashio_durable (struct crashio *c, size_t *len);

/* The sector pieces written since the last flush, in issue order. */
struct crashio_piece {
  size_t entry;                 /* which write or punch since the flush */
  uint64_t offset, len;         /* the piece: within one sector */
  bool punch;
};
extern size_t crashio_nr_entries (struct crashio *c);
extern size_t crashio_nr_pieces (struct crashio *c);
extern void crashio_get_piece (struct crashio *c, size_t i,
                               struct crashio_piece *p);
/* The first piece of entry e, and how many it has. */
extern size_t crashio_entry_pieces (struct crashio *c, size_t e,
                                    size_t *first);

/* The image a crash would leave if exactly the pieces whose bit is set
 * in keep (a bitmap over crashio_nr_pieces) had reached the disk, in
 * issue order.  The file is as long as the flushed state or the end of
 * the last kept write piece, whichever is further.  It goes to *buf,
 * reallocated if its *cap bytes are too few (so that thousands of
 * images reuse one buffer).
 */
extern void crashio_crash_image (struct crashio *c, const uint8_t *keep,
                                 uint8_t **buf, size_t *cap, size_t *len);

static inline bool
crashio_bit (const uint8_t *map, size_t i)
{
  return map[i / 8] >> (i % 8) & 1;
}

static inline void
crashio_set_bit (uint8_t *map, size_t i, bool on)
{
  if (on)
    map[i / 8] |= 1u << (i % 8);
  else
    map[i / 8] &= ~(1u << (i % 8));
}

#endif /* QCOW2_CRASHIO_H */
