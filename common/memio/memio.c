/* SPDX-License-Identifier: BSD-3-Clause */
/* An in-memory qcow2_io backend and a qcow2_env over a table of named
 * in-memory files.
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lock.h"
#include "memio.h"

struct memio {
  struct qcow2_io io;
  /* The engine may call from many threads at once: guards all below. */
  struct lock lock;
  unsigned refs;
  uint8_t *data;
  size_t len, cap;
  struct memio_stats stats;
};

static struct memio *
memio_of (struct qcow2_io *io)
{
  return (struct memio *) io;
}

/* Read [offset, offset+count). */
static void
memio_read_locked (struct memio *m, void *buf, size_t count, uint64_t offset)
  TSA_REQUIRES (m->lock)
{
  size_t n = 0;

  if (offset < m->len) {
    n = m->len - offset < count ? m->len - offset : count;
    memcpy (buf, m->data + offset, n);
  }
  memset ((uint8_t *) buf + n, 0, count - n);
}

static int
memio_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  struct memio *m = memio_of (io);

  lock_acquire (&m->lock);
  m->stats.reads++;
  m->stats.round_trips += io->ops->pread_many != NULL;
  memio_read_locked (m, buf, count, offset);
  lock_release (&m->lock);
  return 0;
}

/* Make room for end bytes; new bytes read as zeros. */
static int
memio_grow (struct memio *m, size_t end)
  TSA_REQUIRES (m->lock)
{
  if (end > m->cap) {
    size_t cap = m->cap ? m->cap : 4096;
    uint8_t *p;

    while (cap < end)
      cap = cap > SIZE_MAX / 2 ? end : cap * 2;
    p = realloc (m->data, cap);
    if (!p)
      return -ENOMEM;
    m->data = p;
    m->cap = cap;
  }
  if (end > m->len) {
    memset (m->data + m->len, 0, end - m->len);
    m->len = end;
  }
  assert (m->len <= m->cap);
  return 0;
}

static int
memio_pwrite (struct qcow2_io *io, const void *buf, size_t count,
              uint64_t offset)
{
  struct memio *m = memio_of (io);
  int r;

  if (offset > SIZE_MAX || count > SIZE_MAX - offset)
    return -EFBIG;
  lock_acquire (&m->lock);
  m->stats.writes++;
  r = memio_grow (m, offset + count);
  if (r == 0)
    memcpy (m->data + offset, buf, count);
  lock_release (&m->lock);
  return r;
}

static int
memio_flush (struct qcow2_io *io)
{
  struct memio *m = memio_of (io);

  lock_acquire (&m->lock);
  m->stats.flushes++;
  lock_release (&m->lock);
  return 0;
}

/* Like a punched hole in a file: zeros, and the size does not change. */
static int
memio_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  struct memio *m = memio_of (io);

  lock_acquire (&m->lock);
  m->stats.punches++;
  if (offset < m->len) {
    size_t n = m->len - offset < count ? m->len - offset : count;
    memset (m->data + offset, 0, n);
  }
  lock_release (&m->lock);
  return 0;
}

static int64_t
memio_size (struct qcow2_io *io)
{
  struct memio *m = memio_of (io);
  int64_t size;

  lock_acquire (&m->lock);
  size = m->len;
  lock_release (&m->lock);
  return size;
}

static void
memio_close (struct qcow2_io *io)
{
  struct memio *m = memio_of (io);
  unsigned refs;

  lock_acquire (&m->lock);
  assert (m->refs > 0);
  refs = --m->refs;
  lock_release (&m->lock);
  if (refs > 0)
    return;
  lock_destroy (&m->lock);
  free (m->data);
  free (m);
}

/* As remote storage: the reads, all in one round trip. */
static void
memio_pread_many (struct qcow2_io *io, struct qcow2_io_read *reads, size_t n)
{
  struct memio *m = memio_of (io);

  lock_acquire (&m->lock);
  m->stats.round_trips++;
  m->stats.reads += n;
  for (size_t i = 0; i < n; i++) {
    memio_read_locked (m, reads[i].buf, reads[i].count, reads[i].offset);
    reads[i].r = 0;
  }
  lock_release (&m->lock);
}

/* No hole callback: everything is data, as in a fully allocated file. */
static const struct qcow2_io_ops memio_ops = {
  .pread = memio_pread,
  .pwrite = memio_pwrite,
  .flush = memio_flush,
  .punch = memio_punch,
  .size = memio_size,
  .close = memio_close,
};

static const struct qcow2_io_ops memio_remote_ops = {
  .pread = memio_pread,
  .pwrite = memio_pwrite,
  .flush = memio_flush,
  .punch = memio_punch,
  .size = memio_size,
  .pread_many = memio_pread_many,
  .close = memio_close,
};

struct qcow2_io *
memio_new (const void *data, size_t len)
{
  struct memio *m = calloc (1, sizeof *m);

  if (!m)
    return NULL;
  /* Copied in, not zeroed first: tests open thousands of images. */
  if (len > 0 && !(m->data = malloc (len))) {
    free (m);
    errno = ENOMEM;
    return NULL;
  }
  if (len > 0)
    memcpy (m->data, data, len);
  m->len = m->cap = len;
  lock_init (&m->lock);
  m->refs = 1;
  m->io.ops = &memio_ops;
  return &m->io;
}

struct qcow2_io *
memio_new_remote (const void *data, size_t len)
{
  struct qcow2_io *io = memio_new (data, len);

  if (io)
    io->ops = &memio_remote_ops;
  return io;
}

struct qcow2_io *
memio_ref (struct qcow2_io *io)
{
  struct memio *m = memio_of (io);

  lock_acquire (&m->lock);
  assert (m->refs > 0);         /* taken from a reference held */
  m->refs++;
  lock_release (&m->lock);
  return io;
}

const void *
memio_data (struct qcow2_io *io, size_t *len)
{
  struct memio *m = memio_of (io);

  *len = m->len;
  return m->data;
}

void
memio_stats (struct qcow2_io *io, struct memio_stats *stats)
{
  struct memio *m = memio_of (io);

  lock_acquire (&m->lock);
  *stats = m->stats;
  lock_release (&m->lock);
}

struct memenv_file {
  char *name;
  struct qcow2_io *io;
};

struct memenv {
  struct qcow2_env env;
  struct memenv_file *files;
  size_t nr_files;
  char last_error[1024];
  unsigned errors;
  char last_remote[1024];
  bool verbose;
};

static struct qcow2_io *
memenv_open (void *opaque, const char *path, bool readonly, char **id)
{
  struct memenv *me = opaque;

  *id = NULL;
  for (size_t i = 0; i < me->nr_files; i++) {
    if (strcmp (me->files[i].name, path) == 0) {
      *id = strdup (path);
      if (!*id)
        return NULL;
      return memio_ref (me->files[i].io);
    }
  }
  errno = ENOENT;
  return NULL;
}

/* Remote storage is a file registered under its URL. */
static struct qcow2_io *
memenv_open_remote (void *opaque, const struct qcow2_remote *remote,
                    char **why)
{
  struct memenv *me = opaque;
  struct qcow2_io *io;
  char *id;

  snprintf (me->last_remote, sizeof me->last_remote, "%s sslverify=%d "
            "timeout=%u cookie=%s", remote->url, remote->sslverify,
            remote->timeout, remote->cookie ? remote->cookie : "");
  if (remote->ssh.host) {
    size_t len = strlen (me->last_remote);
    snprintf (me->last_remote + len, sizeof me->last_remote - len,
              " ssh: host=%s port=%s user=%s path=%s verify_host=%d",
              remote->ssh.host, remote->ssh.port ? remote->ssh.port : "",
              remote->ssh.user ? remote->ssh.user : "", remote->ssh.path,
              remote->ssh.verify_host);
  }
  io = memenv_open (opaque, remote->url, true, &id);
  free (id);
  *why = NULL;
  return io;
}

static void
memenv_error (void *opaque, const char *msg)
{
  struct memenv *me = opaque;

  snprintf (me->last_error, sizeof me->last_error, "%s", msg);
  me->errors++;
  if (me->verbose)
    fprintf (stderr, "memenv: error: %s\n", msg);
}

static void
memenv_debug (void *opaque, const char *msg)
{
  struct memenv *me = opaque;

  if (me->verbose)
    fprintf (stderr, "memenv: debug: %s\n", msg);
}

struct memenv *
memenv_new (void)
{
  struct memenv *me = calloc (1, sizeof *me);

  if (!me)
    return NULL;
  me->env.opaque = me;
  me->env.open = memenv_open;
  me->env.open_remote = memenv_open_remote;
  me->env.error = memenv_error;
  me->env.debug = memenv_debug;
  me->verbose = getenv ("MEMENV_VERBOSE") != NULL;
  return me;
}

void
memenv_free (struct memenv *me)
{
  if (!me)
    return;
  for (size_t i = 0; i < me->nr_files; i++) {
    free (me->files[i].name);
    me->files[i].io->ops->close (me->files[i].io);
  }
  free (me->files);
  free (me);
}

int
memenv_add (struct memenv *me, const char *name, struct qcow2_io *io)
{
  struct memenv_file *f;
  char *copy;

  for (size_t i = 0; i < me->nr_files; i++) {
    if (strcmp (me->files[i].name, name) == 0) {
      struct qcow2_io *old = me->files[i].io;

      me->files[i].io = memio_ref (io);   /* before old: io may be old */
      old->ops->close (old);
      return 0;
    }
  }
  copy = strdup (name);
  f = realloc (me->files, (me->nr_files + 1) * sizeof *f);
  if (!copy || !f) {
    free (copy);
    if (f)
      me->files = f;
    return -ENOMEM;
  }
  me->files = f;
  me->files[me->nr_files].name = copy;
  me->files[me->nr_files].io = memio_ref (io);
  me->nr_files++;
  return 0;
}

const struct qcow2_env *
memenv_env (struct memenv *me)
{
  return &me->env;
}

const char *
memenv_last_error (const struct memenv *me)
{
  return me->last_error;
}

const char *
memenv_last_remote (const struct memenv *me)
{
  return me->last_remote;
}

unsigned
memenv_error_count (const struct memenv *me)
{
  return me->errors;
}

void
memenv_clear_errors (struct memenv *me)
{
  me->last_error[0] = '\0';
  me->errors = 0;
}
