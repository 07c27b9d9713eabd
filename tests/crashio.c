/* SPDX-License-Identifier: BSD-3-Clause */
/* The crash-recording backend (see crashio.h): reads and the current
 * contents come from a memio; the flushed state and the log of writes
 * since the last flush are kept beside it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "errstr.h"
#include "memio.h"
#include "crashio.h"
#include "xalloc.h"

struct crashio_entry {
  uint64_t offset, len;
  uint8_t *data;                /* NULL for a punch */
  size_t first_piece;
  bool lost;                    /* a flush after it failed */
};

struct crashio {
  struct qcow2_io io;
  /* Each operation (hook, contents, log) is done whole under it: the
   * engine's I/O threads issue some at once.
   */
  pthread_mutex_t lock;
  unsigned refs;
  struct qcow2_io *live;        /* the contents now */
  uint8_t *durable;             /* the contents at the last flush */
  size_t durable_len, durable_cap;
  struct crashio_entry *log;
  size_t nlog, caplog, npieces;
  crashio_hook hook;
  void *hook_opaque;
};

static const char *const op_names[CRASHIO_NR_OPS] = {
  [CRASHIO_PREAD] = "pread", [CRASHIO_PWRITE] = "pwrite",
  [CRASHIO_FLUSH] = "flush", [CRASHIO_PUNCH] = "punch",
};

const char *
crashio_op_name (enum crashio_op op)
{
  return op_names[op];
}

static struct crashio *
crashio_of (struct qcow2_io *io)
{
  return (struct crashio *) io;
}

static int
crashio_call_hook (struct crashio *c, enum crashio_op op, uint64_t offset,
                   uint64_t count)
{
  return c->hook ? -c->hook (c->hook_opaque, op, offset, count) : 0;
}

static size_t
crashio_sectors (uint64_t offset, uint64_t len)
{
  if (len == 0)
    return 0;
  return (offset + len - 1) / CRASHIO_SECTOR - offset / CRASHIO_SECTOR + 1;
}

static void
crashio_record (struct crashio *c, const void *buf, uint64_t len,
                uint64_t offset)
{
  struct crashio_entry *e;

  c->log = test_grow (c->log, &c->caplog, c->nlog + 1, sizeof *c->log);
  e = &c->log[c->nlog++];
  e->offset = offset;
  e->len = len;
  e->data = NULL;
  if (buf) {
    e->data = test_xrealloc (NULL, len);
    memcpy (e->data, buf, len);
  }
  e->first_piece = c->npieces;
  e->lost = false;
  c->npieces += crashio_sectors (offset, len);
}

static void
crashio_clear_log (struct crashio *c)
{
  for (size_t i = 0; i < c->nlog; i++)
    free (c->log[i].data);
  c->nlog = c->npieces = 0;
}

static int
crashio_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  struct crashio *c = crashio_of (io);
  int r;

  pthread_mutex_lock (&c->lock);
  r = crashio_call_hook (c, CRASHIO_PREAD, offset, count);
  if (r == 0)
    r = c->live->ops->pread (c->live, buf, count, offset);
  pthread_mutex_unlock (&c->lock);
  return r;
}

static int
crashio_pwrite (struct qcow2_io *io, const void *buf, size_t count,
                uint64_t offset)
{
  struct crashio *c = crashio_of (io);
  int r;

  pthread_mutex_lock (&c->lock);
  r = crashio_call_hook (c, CRASHIO_PWRITE, offset, count);
  if (r == 0)
    r = c->live->ops->pwrite (c->live, buf, count, offset);
  if (r == 0)
    crashio_record (c, buf, count, offset);
  pthread_mutex_unlock (&c->lock);
  return r;
}

static int
crashio_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  struct crashio *c = crashio_of (io);
  int r;

  pthread_mutex_lock (&c->lock);
  r = crashio_call_hook (c, CRASHIO_PUNCH, offset, count);
  if (r == 0)
    r = c->live->ops->punch (c->live, offset, count);
  if (r == 0)
    crashio_record (c, NULL, count, offset);
  pthread_mutex_unlock (&c->lock);
  return r;
}

/* A flush: the writes since the last one reach the flushed state, in
 * order, but those a failed flush lost.
 */
static void
crashio_settle (struct crashio *c)
{
  for (size_t i = 0; i < c->nlog; i++) {
    const struct crashio_entry *e = &c->log[i];
    uint64_t end = e->offset + e->len;
    if (e->lost)
      continue;
    if (e->data && end > c->durable_len) {
      c->durable = test_grow (c->durable, &c->durable_cap, end, 1);
      memset (c->durable + c->durable_len, 0, end - c->durable_len);
      c->durable_len = end;
    }
    if (e->data)
      memcpy (c->durable + e->offset, e->data, e->len);
    else if (e->offset < c->durable_len)
      memset (c->durable + e->offset, 0,
              MIN (e->len, c->durable_len - e->offset));
  }
  crashio_clear_log (c);
}

static int
crashio_flush (struct qcow2_io *io)
{
  struct crashio *c = crashio_of (io);
  int r;

  pthread_mutex_lock (&c->lock);
  r = crashio_call_hook (c, CRASHIO_FLUSH, 0, 0);
  if (r == 0)
    crashio_settle (c);
  else
    for (size_t i = 0; i < c->nlog; i++)
      c->log[i].lost = true;
  pthread_mutex_unlock (&c->lock);
  return r;
}

static int64_t
crashio_size (struct qcow2_io *io)
{
  struct crashio *c = crashio_of (io);

  return c->live->ops->size (c->live);
}

static void
crashio_close (struct qcow2_io *io)
{
  struct crashio *c = crashio_of (io);

  if (--c->refs > 0)
    return;
  crashio_clear_log (c);
  free (c->log);
  free (c->durable);
  c->live->ops->close (c->live);
  pthread_mutex_destroy (&c->lock);
  free (c);
}

static const struct qcow2_io_ops crashio_ops = {
  .pread = crashio_pread,
  .pwrite = crashio_pwrite,
  .flush = crashio_flush,
  .punch = crashio_punch,
  .size = crashio_size,
  .close = crashio_close,
};

struct crashio *
crashio_new (const void *data, size_t len)
{
  struct crashio *c = test_xrealloc (NULL, sizeof *c);

  memset (c, 0, sizeof *c);
  pthread_mutex_init (&c->lock, NULL);
  c->io.ops = &crashio_ops;
  c->refs = 1;
  c->live = memio_new (data, len);
  c->durable = test_xrealloc (NULL, len);
  if (!c->live) {
    fprintf (stderr, "memio_new: %s\n", errstr (errno));
    abort ();
  }
  if (len)
    memcpy (c->durable, data, len);
  c->durable_len = c->durable_cap = len;
  return c;
}

void
crashio_free (struct crashio *c)
{
  if (c)
    crashio_close (&c->io);
}

struct qcow2_io *
crashio_io (struct crashio *c)
{
  c->refs++;
  return &c->io;
}

void
crashio_set_hook (struct crashio *c, crashio_hook hook, void *opaque)
{
  c->hook = hook;
  c->hook_opaque = opaque;
}

const uint8_t *
crashio_data (struct crashio *c, size_t *len)
{
  return memio_data (c->live, len);
}

const uint8_t *
crashio_durable (struct crashio *c, size_t *len)
{
  *len = c->durable_len;
  return c->durable;
}

size_t
crashio_nr_entries (struct crashio *c)
{
  return c->nlog;
}

size_t
crashio_nr_pieces (struct crashio *c)
{
  return c->npieces;
}

size_t
crashio_entry_pieces (struct crashio *c, size_t e, size_t *first)
{
  *first = c->log[e].first_piece;
  return crashio_sectors (c->log[e].offset, c->log[e].len);
}

/* The entry holding piece i (binary search on first_piece). */
static size_t
crashio_entry_of (struct crashio *c, size_t i)
{
  size_t lo = 0, hi = c->nlog;

  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (c->log[mid].first_piece <= i)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

void
crashio_get_piece (struct crashio *c, size_t i, struct crashio_piece *p)
{
  size_t e = crashio_entry_of (c, i);
  const struct crashio_entry *en = &c->log[e];
  uint64_t sector = en->offset / CRASHIO_SECTOR + (i - en->first_piece);
  uint64_t start = sector * CRASHIO_SECTOR, end = start + CRASHIO_SECTOR;

  p->entry = e;
  p->offset = start > en->offset ? start : en->offset;
  p->len = (end < en->offset + en->len ? end : en->offset + en->len)
    - p->offset;
  p->punch = en->data == NULL;
}

void
crashio_crash_image (struct crashio *c, const uint8_t *keep, uint8_t **buf,
                     size_t *cap, size_t *len)
{
  size_t n = c->durable_len;

  /* The length first: the furthest kept write. */
  for (size_t e = 0; e < c->nlog; e++) {
    const struct crashio_entry *en = &c->log[e];
    size_t np = crashio_sectors (en->offset, en->len);
    if (!en->data)
      continue;
    for (size_t k = np; k-- > 0; ) {
      if (crashio_bit (keep, en->first_piece + k)) {
        struct crashio_piece p;
        crashio_get_piece (c, en->first_piece + k, &p);
        if (p.offset + p.len > n)
          n = p.offset + p.len;
        break;
      }
    }
  }
  if (*cap < n) {
    free (*buf);                /* nothing of it is kept */
    *buf = test_grow (NULL, cap, n, 1);
  }
  memcpy (*buf, c->durable, c->durable_len);
  memset (*buf + c->durable_len, 0, n - c->durable_len);
  for (size_t i = 0; i < c->npieces; i++) {
    struct crashio_piece p;
    if (!crashio_bit (keep, i))
      continue;
    crashio_get_piece (c, i, &p);
    if (p.punch) {
      if (p.offset < n)
        memset (*buf + p.offset, 0,
                p.offset + p.len > n ? n - p.offset : p.len);
    }
    else
      memcpy (*buf + p.offset,
              c->log[p.entry].data + (p.offset - c->log[p.entry].offset),
              p.len);
  }
  *len = n;
}
