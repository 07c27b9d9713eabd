/* SPDX-License-Identifier: BSD-3-Clause */
/* A read-only qcow2_io over libnbd (see nbdio.h).
 *
 * Each connection has a thread of its own, which connects (so that the
 * nbdkit it may start, whose --exit-with-parent follows the thread that
 * started it, lives exactly as long as the connection) and then runs
 * libnbd's state machine: requests are submitted from any thread with
 * libnbd's asynchronous calls and completed by that thread, so that
 * every piece of every request is in flight at once (libnbd's
 * synchronous calls on one handle wait for each other).
 *
 * A connection that dies (the server went away, or answered nothing
 * for the timeout while requests waited, when the thread shuts the
 * socket down) fails what was in flight on it with EIO; the next
 * request connects again.  nbdkit may fork after opening the storage
 * (into the background): the connections of the process before the
 * fork are left, and new ones made.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <libnbd.h>

#include "checked.h"
#include "errstr.h"
#include "nbdio-internal.h"

/* A set of commands waited for together.  pending (atomic) counts
 * the commands in flight and one more while the waiter submits; what
 * brings it to 0 posts done.  Not a mutex and condition: the thread
 * completing the last command woke the waiter, which then waited for
 * the mutex that thread still held, a context switch more a read.  A
 * semaphore may be destroyed once sem_wait returns (POSIX): the waiter
 * leaves at once.
 */
struct nbdio_wait {
  unsigned pending;
  sem_t done;
};

static void
nbdio_wait_init (struct nbdio_wait *w)
{
  w->pending = 1;
  sem_init (&w->done, 0, 0);
}

/* Wait for what was submitted since nbdio_wait_init (or the last
 * wait): the waiter's own count dropped, then the last command's post.
 * Ready to submit and wait again.
 */
static void
nbdio_wait_pending (struct nbdio_wait *w)
{
  if (__atomic_sub_fetch (&w->pending, 1, __ATOMIC_ACQ_REL) > 0)
    while (sem_wait (&w->done) == -1)
      assert (errno == EINTR);
  __atomic_store_n (&w->pending, 1, __ATOMIC_RELAXED);
}

/* One NBD command: a read into buf (bounce, if the server's alignment
 * needs one, then copied to out), or a block status.
 */
struct nbdio_cmd {
  struct nbdio_wait *w;
  struct nbdio_conn *c;
  unsigned gen;                 /* the connection it was sent on */
  unsigned seen;                /* the last connection made by then */
  bool retried;
  uint8_t *buf;
  uint32_t len;
  uint64_t offset;
  uint8_t *bounce, *out;        /* out: [skip, skip + out_len) of bounce */
  size_t skip, out_len;
  int *result;                  /* where an error goes (first one kept) */
  int err;
  uint32_t *ext;                /* block status: malloc'd pairs */
  size_t next;
  /* A read: what the server's chunks delivered, as sorted disjoint
   * runs relative to offset (one run, for a server sending in order),
   * or why they were wrong (a chunk outside the request, or over
   * another).  libnbd 1.14 reports success for a reply that covers
   * only part of the range: it is complete only if the runs are
   * exactly [0, len).
   */
  bool is_read;
  const char *bad;
  struct nbdio_run { uint32_t start, end; } *runs;
  size_t nruns, runs_max;
  uint64_t delivered;
};

/* Records chunk [start, end) of cmd's range as delivered.  Returns
 * NULL, or what is wrong (it is over one delivered before, or no
 * memory to remember it).
 */
static const char *
nbdio_account (struct nbdio_cmd *cmd, uint32_t start, uint32_t end)
{
  struct nbdio_run *r;
  size_t i = cmd->nruns;

  /* From the end: chunks come in order, mostly. */
  while (i > 0 && cmd->runs[i - 1].end > start)
    i--;
  if (i < cmd->nruns && cmd->runs[i].start < end)
    return "chunks over each other";
  if (i > 0 && cmd->runs[i - 1].end == start) {
    cmd->runs[i - 1].end = end;
    if (i < cmd->nruns && cmd->runs[i].start == end) {
      cmd->runs[i - 1].end = cmd->runs[i].end;
      memmove (&cmd->runs[i], &cmd->runs[i + 1],
               (cmd->nruns - i - 1) * sizeof *cmd->runs);
      cmd->nruns--;
    }
    return NULL;
  }
  if (i < cmd->nruns && cmd->runs[i].start == end) {
    cmd->runs[i].start = start;
    return NULL;
  }
  if (cmd->nruns == cmd->runs_max) {
    size_t max = cmd->runs_max ? 2 * cmd->runs_max : 4;
    if (!(r = reallocarray (cmd->runs, max, sizeof *r)))
      return "more chunks than memory to count them";
    cmd->runs = r;
    cmd->runs_max = max;
  }
  memmove (&cmd->runs[i + 1], &cmd->runs[i],
           (cmd->nruns - i) * sizeof *cmd->runs);
  cmd->runs[i] = (struct nbdio_run) { start, end };
  cmd->nruns++;
  return NULL;
}

/* libnbd's chunk callback for reads: each chunk accounted for, holes
 * zeroed here (the buffer is not initialised: see nbdio_connect).
 */
static int
nbdio_chunk (void *opaque, const void *subbuf, size_t count,
             uint64_t offset, unsigned status, int *error)
{
  struct nbdio_cmd *cmd = opaque;
  uint64_t start = offset - cmd->offset;

  if (cmd->bad || status == LIBNBD_READ_ERROR)
    return 0;                   /* the command fails anyway */
  if (offset < cmd->offset || range_exceeds (start, count, cmd->len))
    cmd->bad = "a chunk outside the range asked for";
  else if (count == 0)
    cmd->bad = "an empty chunk";
  else
    cmd->bad = nbdio_account (cmd, start, start + count);
  if (cmd->bad)
    return 0;
  if (status == LIBNBD_READ_HOLE)
    memset (cmd->buf + start, 0, count);
  cmd->delivered += count;
  return 0;
}

static int
nbdio_done (void *opaque, int *error)
{
  struct nbdio_cmd *cmd = opaque;
  struct nbdio_wait *w = cmd->w;

  /* A server shutting down waits for its clients to leave: this
   * connection ends (its thread sees it closed), the next request
   * connects again.
   */
  if (*error == ESHUTDOWN)
    shutdown (cmd->c->shut_fd, SHUT_RDWR);
  if (cmd->is_read && *error == 0 &&
      (cmd->bad || cmd->nruns != 1 || cmd->runs[0].start != 0 ||
       cmd->runs[0].end != cmd->len)) {
    nbdio_say (cmd->c->io, NBDIO_ERROR, "%s: the server answered a read of %"
               PRIu32 " bytes at %" PRIu64 " with %s (%" PRIu64 " bytes "
               "in all): the read fails", cmd->c->io->name, cmd->len,
               cmd->offset, cmd->bad ? cmd->bad
               : "chunks not covering all of it", cmd->delivered);
    *error = EIO;
  }
  if (__atomic_fetch_sub (&cmd->c->inflight, 1, __ATOMIC_RELEASE) == 0)
    assert (!"a command completed twice");
  cmd->err = *error;
  /* Neither cmd nor w may be touched once pending is down, but to post
   * (the waiter waits for that).
   */
  if (__atomic_sub_fetch (&w->pending, 1, __ATOMIC_ACQ_REL) == 0)
    sem_post (&w->done);
  return 1;
}

static int
nbdio_extent (void *opaque, const char *metacontext, uint64_t offset,
              uint32_t *entries, size_t n, int *error)
{
  struct nbdio_cmd *cmd = opaque;

  if (strcmp (metacontext, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0 ||
      cmd->ext)
    return 0;
  cmd->ext = malloc (n * sizeof *entries);
  if (cmd->ext) {
    memcpy (cmd->ext, entries, n * sizeof *entries);
    cmd->next = n / 2;
  }
  return 0;
}

/* Submit cmd to a connection; an error logged (once per request) sets
 * *cmd->result.  Block status if status, else a read.
 */
static void
nbdio_submit (struct nbdio *io, struct nbdio_cmd *cmd, bool status,
              bool *logged)
{
  struct nbdio_conn *c;
  char *why = NULL;
  int64_t cookie;

  c = nbdio_acquire (io, &why);
  if (!c) {
    int e = errno;
    if (!*logged && e != EALREADY)
      nbdio_say (io, NBDIO_ERROR, "%s: cannot connect: %s", io->name,
                 why ? why : errstr (e));
    *logged = true;
    free (why);
    if (*cmd->result == 0)
      *cmd->result = -EIO;
    return;
  }
  cmd->c = c;
  cmd->gen = c->gen;
  cmd->seen = __atomic_load_n (&io->conn_seq, __ATOMIC_ACQUIRE);
  __atomic_add_fetch (&cmd->w->pending, 1, __ATOMIC_RELAXED);
  if (__atomic_fetch_add (&c->inflight, 1, __ATOMIC_ACQ_REL) == 0)
    __atomic_store_n (&c->progress_ms, nbdio_now_ms (), __ATOMIC_RELEASE);
  if (status)
    cookie = nbd_aio_block_status (
      c->h, cmd->len, cmd->offset,
      (nbd_extent_callback) { .callback = nbdio_extent, .user_data = cmd },
      (nbd_completion_callback) { .callback = nbdio_done,
                                  .user_data = cmd }, 0);
  else {
    cmd->is_read = true;
    cookie = nbd_aio_pread_structured (
      c->h, cmd->buf, cmd->len, cmd->offset,
      (nbd_chunk_callback) { .callback = nbdio_chunk, .user_data = cmd },
      (nbd_completion_callback) { .callback = nbdio_done,
                                  .user_data = cmd }, 0);
  }
  if (cookie == -1) {
    /* Not queued: no completion will come. */
    __atomic_fetch_sub (&c->inflight, 1, __ATOMIC_RELEASE);
    /* Never to 0: the waiter's own count is in it. */
    __atomic_sub_fetch (&cmd->w->pending, 1, __ATOMIC_RELAXED);
    /* Found closed: not served (see nbdio_retry). */
    if (!cmd->retried && (nbd_aio_is_dead (c->h) || nbd_aio_is_closed (c->h)))
      cmd->err = ESHUTDOWN;
    else if (!*logged)
      nbdio_say (io, NBDIO_ERROR, "%s: %s", io->name, nbd_get_error ());
    if (cmd->err != ESHUTDOWN) {
      *logged = true;
      if (*cmd->result == 0)
        *cmd->result = -EIO;
    }
  }
  /* libnbd sent what it could at once; the thread sends the rest. */
  else if (nbd_aio_get_direction (c->h) & LIBNBD_AIO_DIRECTION_WRITE)
    nbdio_wake (c);
  nbdio_release (c);
}

/* Commands the server did not serve (it is shutting down, and answered
 * ESHUTDOWN; or their connection was found closed, or closed with them
 * in flight, other than for the timeout) go once more, on a new
 * connection: a planned restart of the server costs no request (reads
 * and block status may be asked twice).  Their connection is not used
 * again: its thread, woken, finds it shut down; nor are the others
 * made before it was sent, to the same server going away (what they
 * have in flight fails, and is asked again the same way).
 */
static void
nbdio_retry (struct nbdio *io, struct nbdio_cmd *cmds, size_t n,
             bool status, bool *logged)
  TSA_EXCLUDES (io->lock)
{
  for (size_t i = 0; i < n; i++) {
    struct nbdio_cmd *cmd = &cmds[i];
    struct nbdio_conn *c = cmd->c;

    if ((cmd->err != ESHUTDOWN && cmd->err != ENOTCONN) || cmd->retried)
      continue;
    lock_acquire (&io->lock);
    if (cmd->err == ENOTCONN && c->gen == cmd->gen &&
        __atomic_load_n (&c->timed_out, __ATOMIC_ACQUIRE)) {
      lock_release (&io->lock);
      continue;
    }
    for (unsigned j = 0; j < io->nconns; j++) {
      struct nbdio_conn *k = &io->conns[j];
      if (k->state == CONN_READY && !k->shut && k->pid == getpid () &&
          k->gen <= cmd->seen) {
        k->shut = true;
        shutdown (k->shut_fd, SHUT_RDWR);
        nbdio_wake (k);
      }
    }
    lock_release (&io->lock);
    cmd->retried = true;
    cmd->err = 0;
    free (cmd->ext);
    cmd->ext = NULL;
    cmd->next = 0;
    nbdio_submit (io, cmd, status, logged);
  }
}

/* Wait for the commands submitted (status: block status), retried once
 * if not served, then gather their results; w is done with (its
 * nbdio_wait_init is the caller's).
 */
static void
nbdio_wait_all (struct nbdio *io, struct nbdio_wait *w,
                struct nbdio_cmd *cmds, size_t n, bool status,
                bool *logged)
{
  nbdio_wait_pending (w);
  nbdio_retry (io, cmds, n, status, logged);
  nbdio_wait_pending (w);
  sem_destroy (&w->done);
  for (size_t i = 0; i < n; i++) {
    struct nbdio_cmd *cmd = &cmds[i];
    if (cmd->err && *cmd->result == 0)
      *cmd->result = -cmd->err;
    if (cmd->bounce && !cmd->err)
      memcpy (cmd->out, cmd->bounce + cmd->skip, cmd->out_len);
    free (cmd->bounce);
    free (cmd->runs);
  }
}

/* Fills cmds (NULL: just count them) with commands reading [offset,
 * offset+count) into buf (the part within the export), aligned to the
 * server's minimum block size and cut at its maximum.  Returns how
 * many.
 */
static size_t
nbdio_plan_read (struct nbdio *io, uint8_t *buf, size_t count,
                 uint64_t offset, int *result, struct nbdio_cmd *cmds)
{
  size_t n = 0;

  while (count > 0) {
    uint64_t start = offset & ~(uint64_t) (io->block_min - 1);
    uint64_t end = MIN (offset + count, start + io->block_max);
    uint64_t aend = MIN ((end + io->block_min - 1)
                         & ~(uint64_t) (io->block_min - 1), io->size);

    if (cmds) {
      struct nbdio_cmd *cmd = &cmds[n];
      *cmd = (struct nbdio_cmd) { .buf = buf, .len = aend - start,
                                  .offset = start, .result = result };
      if (start != offset || aend != end) {
        cmd->bounce = cmd->buf = malloc (aend - start);
        cmd->out = buf;
        cmd->skip = offset - start;
        cmd->out_len = end - offset;
        if (!cmd->bounce) {
          *result = -ENOMEM;
          cmd->len = 0;
        }
      }
    }
    n++;
    buf += end - offset;
    count -= end - offset;
    offset = end;
  }
  return n;
}

static void
nbdio_pread_many (struct qcow2_io *qio, struct qcow2_io_read *reads,
                  size_t n)
{
  struct nbdio *io = (struct nbdio *) qio;
  struct nbdio_wait w;
  struct nbdio_cmd *cmds;
  size_t ncmds = 0;
  bool logged = false;

  /* Past the end of the export reads as zeros. */
  for (size_t i = 0; i < n; i++) {
    struct qcow2_io_read *rd = &reads[i];
    size_t in = rd->offset >= io->size ? 0
                : MIN (rd->count, io->size - rd->offset);
    memset ((uint8_t *) rd->buf + in, 0, rd->count - in);
    rd->r = 0;
    ncmds += nbdio_plan_read (io, rd->buf, in, rd->offset, &rd->r, NULL);
  }
  cmds = calloc (ncmds ? ncmds : 1, sizeof *cmds);
  if (!cmds) {
    for (size_t i = 0; i < n; i++)
      reads[i].r = -ENOMEM;
    return;
  }
  ncmds = 0;
  for (size_t i = 0; i < n; i++) {
    struct qcow2_io_read *rd = &reads[i];
    size_t in = rd->offset >= io->size ? 0
                : MIN (rd->count, io->size - rd->offset);
    ncmds += nbdio_plan_read (io, rd->buf, in, rd->offset, &rd->r,
                              cmds + ncmds);
  }
  nbdio_wait_init (&w);
  for (size_t i = 0; i < ncmds; i++) {
    cmds[i].w = &w;
    if (cmds[i].len && *cmds[i].result == 0)
      nbdio_submit (io, &cmds[i], false, &logged);
  }
  nbdio_wait_all (io, &w, cmds, ncmds, false, &logged);
  free (cmds);
}

static int
nbdio_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  struct qcow2_io_read rd = { buf, count, offset, 0 };

  nbdio_pread_many (io, &rd, 1);
  return rd.r;
}

static int
nbdio_preadv (struct qcow2_io *io, const struct iovec *iov, int iovcnt,
              uint64_t offset)
{
  struct qcow2_io_read rd[QCOW2_IOV_MAX];
  int r = 0;

  for (int i = 0; i < iovcnt; i++) {
    rd[i] = (struct qcow2_io_read) { iov[i].iov_base, iov[i].iov_len,
                                     offset, 0 };
    offset += iov[i].iov_len;
  }
  nbdio_pread_many (io, rd, iovcnt);
  for (int i = 0; i < iovcnt && r == 0; i++)
    r = rd[i].r;
  return r;
}

static int
nbdio_pwrite (struct qcow2_io *io, const void *buf, size_t count,
              uint64_t offset)
{
  return -EROFS;
}

static int
nbdio_pwritev (struct qcow2_io *io, const struct iovec *iov, int iovcnt,
               uint64_t offset)
{
  return -EROFS;
}

static int
nbdio_flush (struct qcow2_io *io)
{
  return 0;
}

static int
nbdio_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  return -EOPNOTSUPP;
}

static int64_t
nbdio_size (struct qcow2_io *io)
{
  return ((struct nbdio *) io)->size;
}

/* Whether one of the spans kept covers offset; if so, sets *type and
 * *len to the extent there.
 */
static bool
nbdio_span_find (struct nbdio *io, uint64_t offset, uint32_t *type,
                 uint64_t *len)
  TSA_REQUIRES (io->status_lock)
{
  for (unsigned i = 0; i < NBDIO_STATUS_SPANS; i++) {
    struct nbdio_span *sp = &io->spans[i];
    size_t lo = 0, hi = sp->n;

    if (sp->n == 0 || offset < sp->start || offset >= sp->ext[sp->n - 1].end)
      continue;
    /* The first extent ending after offset. */
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (sp->ext[mid].end > offset)
        hi = mid;
      else
        lo = mid + 1;
    }
    assert (lo < sp->n);
    *type = sp->ext[lo].type;
    *len = sp->ext[lo].end - offset;
    sp->used = ++io->status_tick;
    return true;
  }
  return false;
}

static bool
nbdio_status_cached (struct nbdio *io, uint64_t offset, uint32_t *type,
                     uint64_t *len)
  TSA_EXCLUDES (io->status_lock)
{
  bool found;

  lock_acquire (&io->status_lock);
  found = nbdio_span_find (io, offset, type, len);
  lock_release (&io->status_lock);
  return found;
}

/* Keep the reply to a block status at start (n length, flags pairs),
 * in the place of the span used least recently.  Returns what it says
 * of offset: 1, 0 if it ends before offset, or -EIO if it says nothing
 * (the server answered no extent, or only empty ones).
 */
static int
nbdio_status_keep (struct nbdio *io, uint64_t start, const uint32_t *pairs,
                   size_t n, uint64_t offset, uint32_t *type, uint64_t *len)
  TSA_EXCLUDES (io->status_lock)
{
  struct nbdio_extent *ext;
  struct nbdio_span *victim = &io->spans[0];
  uint64_t pos = start;
  size_t k = 0;
  int r;

  n = MIN (n, NBDIO_STATUS_EXTENTS);
  if (n == 0 || !(ext = malloc (n * sizeof *ext)))
    return n == 0 ? -EIO : -ENOMEM;
  /* Extents past the end (a server may round up the last) are cut
   * there; empty ones, which the protocol forbids, are skipped.
   */
  for (size_t i = 0; i < n && pos < io->size; i++) {
    if (pairs[2 * i] == 0)
      continue;
    pos += MIN (pairs[2 * i], io->size - pos);
    ext[k++] = (struct nbdio_extent) {
      .end = pos,
      .type = pairs[2 * i + 1] & (QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO) };
  }
  if (k == 0) {
    free (ext);
    return -EIO;
  }
  lock_acquire (&io->status_lock);
  for (unsigned i = 1; i < NBDIO_STATUS_SPANS; i++)
    if (io->spans[i].used < victim->used)
      victim = &io->spans[i];
  free (victim->ext);
  *victim = (struct nbdio_span) { .start = start, .ext = ext, .n = k };
  r = nbdio_span_find (io, offset, type, len);
  lock_release (&io->status_lock);
  return r;
}

/* Ask the server for the extents from start (as far as the protocol's
 * 32 bits allow), keep them, and return what they say of offset (as
 * nbdio_status_keep).
 */
static int
nbdio_status_ask (struct nbdio *io, uint64_t start, uint64_t offset,
                  uint32_t *type, uint64_t *len)
{
  struct nbdio_wait w;
  int r = 0;
  struct nbdio_cmd cmd = {
    .w = &w, .offset = start, .result = &r,
    .len = MIN (io->size - start, UINT32_MAX & ~UINT32_C (65535)) };
  bool logged = false;

  assert (start <= offset && offset < io->size);
  nbdio_wait_init (&w);
  nbdio_submit (io, &cmd, true, &logged);
  nbdio_wait_all (io, &w, &cmd, 1, true, &logged);
  if (r == 0 &&
      (r = nbdio_status_keep (io, start, cmd.ext, cmd.ext ? cmd.next : 0,
                              offset, type, len)) == -EIO)
    nbdio_say (io, NBDIO_ERROR, "%s: the server answered a block status at %"
               PRIu64 " with no extent there", io->name, start);
  free (cmd.ext);
  return r;
}

/* Block status: asked in spans, which are kept (NBDIO_STATUS_SPANS). */
static int
nbdio_status (struct qcow2_io *qio, uint64_t offset, uint64_t count,
              uint32_t *type, uint64_t *len)
{
  struct nbdio *io = (struct nbdio *) qio;
  uint64_t start = offset & ~(uint64_t) (NBDIO_STATUS_ALIGN - 1);
  int r;

  if (offset >= io->size) {
    *type = QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO;
    *len = count;
    return 0;
  }
  if (!io->has_status) {
    *type = 0;
    *len = count;
    return 0;
  }
  if (nbdio_status_cached (io, offset, type, len))
    return 0;
  r = nbdio_status_ask (io, start, offset, type, len);
  /* The reply from the aligned start ended before offset. */
  if (r == 0 && start < offset)
    r = nbdio_status_ask (io, offset, offset, type, len);
  return r == 0 ? -EIO : MIN (r, 0);
}

static void
nbdio_close (struct qcow2_io *qio)
{
  struct nbdio *io = (struct nbdio *) qio;

  lock_acquire (&io->lock);
  for (unsigned i = 0; i < io->nconns; i++) {
    struct nbdio_conn *c = &io->conns[i];
    if (c->has_thread && c->pid == getpid ()) {
      __atomic_store_n (&c->stopping, true, __ATOMIC_RELAXED);
      nbdio_wake (c);
    }
  }
  lock_release (&io->lock);
  for (unsigned i = 0; i < io->nconns; i++)
    nbdio_reap (&io->conns[i]);
  nbdio_relay_stop (io);        /* the helpers' last words logged */
  for (char **a = io->argv; a && *a; a++)
    free (*a);
  free (io->argv);
  free (io->uri);
  free (io->name);
  free (io->last_why);
  for (unsigned i = 0; i < NBDIO_STATUS_SPANS; i++)
    free (io->spans[i].ext);
  lock_destroy (&io->lock);
  pthread_cond_destroy (&io->changed);
  lock_destroy (&io->status_lock);
  free (io);
}

static const struct qcow2_io_ops nbdio_ops = {
  .pread = nbdio_pread,
  .pwrite = nbdio_pwrite,
  .preadv = nbdio_preadv,
  .pwritev = nbdio_pwritev,
  .flush = nbdio_flush,
  .punch = nbdio_punch,
  .size = nbdio_size,
  .status = nbdio_status,
  .pread_many = nbdio_pread_many,
  .close = nbdio_close,
};

struct qcow2_io *
nbdio_open (const struct qcow2_remote *remote,
            const struct nbdio_options *opts, char **why)
{
  struct nbdio *io = calloc (1, sizeof *io);
  char *msg = NULL;
  struct nbdio_conn *c;
  int e = 0;

  if (why)
    *why = NULL;
  if (!io)
    return NULL;
  io->io.ops = &nbdio_ops;
  if (opts)
    io->opts = *opts;
  if (!io->opts.timeout)
    io->opts.timeout = NBDIO_TIMEOUT;
  lock_init (&io->lock);
  lock_cond_init (&io->changed);
  lock_init (&io->status_lock);
  io->block_min = 1;
  io->block_max = NBDIO_MAX_REQUEST;
  io->nconns = strncmp (remote->url, "nbd", 3) == 0 ? 1 : NBDIO_MAX_CONNS;
  for (unsigned i = 0; i < NBDIO_MAX_CONNS; i++)
    io->conns[i] = (struct nbdio_conn) { .io = io, .fd = -1, .shut_fd = -1,
                                         .wake = { -1, -1 } };
  if (!(io->name = strdup (remote->url)))
    e = errno;
  else if (strncmp (remote->url, "nbd", 3) == 0) {
    if (!(io->uri = nbdio_socket_uri (remote->url)))
      e = errno;
  }
  else if ((e = -nbdio_nbdkit_argv (io, remote, &msg)) != 0 ||
           (e = -nbdio_relay_open (io)) != 0)
    goto fail;
  if (e)
    goto fail;
  /* The helpers' stderr read from the first on. */
  lock_acquire (&io->lock);
  nbdio_relay_start (io);
  lock_release (&io->lock);

  /* Connected once now: what is wrong is logged at start.  The
   * connection serves from the first request on, when its thread
   * starts (nbdkit may fork in between: see nbdio_acquire).
   */
  c = &io->conns[0];
  c->pid = getpid ();
  {
    struct nbd_handle *h = nbdio_connect (c, &msg);
    if (!h || nbdio_init_export (io, h, &msg) == -1) {
      if (h) {
        nbd_kill_subprocess (h, SIGKILL);
        nbd_close (h);
      }
      e = ENXIO;
      goto fail;
    }
    lock_acquire (&io->lock);
    nbdio_ready (io, c, h);
    lock_release (&io->lock);
  }
  nbdio_say (io, NBDIO_DEBUG, "%s: %" PRIu64 " bytes, requests of %" PRIu32
             " to %" PRIu32 " bytes, %s, up to %u connection%s", io->name,
             io->size, io->block_min, io->block_max,
             io->has_status ? "block status" : "no block status",
             io->nconns, io->nconns > 1 ? "s" : "");
  return &io->io;

 fail:
  if (why)
    *why = msg;
  else
    free (msg);
  nbdio_close (&io->io);
  errno = e ? e : ENOMEM;
  return NULL;
}
