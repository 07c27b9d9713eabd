/* SPDX-License-Identifier: BSD-3-Clause */
/* The qcow2 filter's plugin below: what it is (its name and keys, for
 * messages and an overlay's record), the local file nbdkit's file
 * plugin serves (locked as QEMU locks an image), and its export as the
 * engine's storage (struct nextio), its calls taking turns when the
 * plugin's thread model asks it.  It calls nothing of the filter's
 * other files.
 */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <nbdkit-filter.h>

#include "checked.h"
#include "errstr.h"
#include "fileio.h"
#include "filter.h"
#include "glue.h"
#include "lock.h"
#include "qcow2.h"

/* The most the engine asks of the plugin in one call (its requests are
 * 32-bit).
 */
#define NEXT_MAX (32u << 20)

/* file=, passed on to the plugin (nbdkit's file plugin, or another
 * that takes the key), and how often: a single local file that nbdkit's
 * file plugin serves is the image, locked as the plugin locks its
 * image, and named by its path (messages, relative backing file names).
 */
static char *below_file;
static unsigned below_file_count;
static bool below_file_is_image;
static bool below_file_plugin;  /* the plugin is nbdkit's file plugin */
static struct qcow2_io *below_file_lock;

/* What names the image in messages otherwise: the plugin and the keys
 * that say what it serves ("curl url=...", "ssh host=h path=/p",
 * "memory export"), set at config_complete.  below_keys: those keys
 * as given (URLs without their user and password).
 */
static char *image_name;
static char *below_keys;

/* The plugin and those keys, file= as an absolute path: what an
 * overlay records of the disk it sits on (filter_identity).
 */
static char *below_id_keys;
static char *identity;

/* What else makes the disk below (below_stack): the filters between
 * the qcow2 filter and the plugin, and the keys passed on that do not
 * name it (below_others, each "key=value", without credentials),
 * recorded when there are such filters or the plugin's naming keys
 * are not known.  The whole of it in messages (description).
 */
static char **below_others;
static size_t below_others_len;
static bool below_filters;      /* filters between (transparent or not) */
static char *stack;
static char *description;

/* The context into the plugin, shared by all connections (below_open
 * to below_cleanup).  When the plugin's thread model does not allow
 * requests in parallel (nbdkit tells get_ready), the engine's calls
 * into it, which may come from several threads at once (its I/O pool,
 * flushes), take turns: every call into the plugin is made holding
 * below_lock (clang checks each), which is only taken when
 * below_serialized.
 */
static bool below_serialized;
static struct lock below_lock = LOCK_INITIALIZER;
static nbdkit_next *below_next TSA_PT_GUARDED_BY (&below_lock);

/* The plugin's export, as the engine's storage: it cannot grow. */
struct nextio {
  struct qcow2_io io;
  uint64_t size;
  bool can_flush, can_trim, can_extents;
};

/* One call into the plugin: its error in *err. */
enum nextio_op { NEXTIO_READ, NEXTIO_WRITE, NEXTIO_TRIM, NEXTIO_FLUSH,
                 NEXTIO_STATUS };
struct nextio_call {
  enum nextio_op op;
  uint8_t *buf;                 /* read into, or written (not changed) */
  uint32_t len;
  uint64_t offset;
  struct nbdkit_extents *extents;
};

static int
nextio_call (const struct nextio_call *c, int *err)
  TSA_REQUIRES (&below_lock)
{
  nbdkit_next *next = below_next;

  assert (c->len <= NEXT_MAX);
  assert ((c->buf != NULL) == (c->op == NEXTIO_READ || c->op == NEXTIO_WRITE));
  switch (c->op) {
  case NEXTIO_READ:
    return next->pread (next, c->buf, c->len, c->offset, 0, err);
  case NEXTIO_WRITE:
    return next->pwrite (next, c->buf, c->len, c->offset, 0, err);
  case NEXTIO_TRIM:
    return next->trim (next, c->len, c->offset, 0, err);
  case NEXTIO_FLUSH:
    return next->flush (next, 0, err);
  case NEXTIO_STATUS:
    return next->extents (next, c->len, c->offset, 0, c->extents, err);
  }
  abort ();
}

/* Makes the call, in its turn.  Returns 0, or -errno. */
static int
nextio_turn (const struct nextio_call *c)
  TSA_EXCLUDES (&below_lock)
{
  int err = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE_IF (&below_lock, below_serialized);

  if (nextio_call (c, &err) == -1)
    return -(err ? err : EIO);
  return 0;
}

/* [offset, offset+count) read, written or trimmed in calls of at most
 * NEXT_MAX bytes.
 */
static int
nextio_chunks (struct nextio *n, enum nextio_op op, uint8_t *buf,
               size_t count, uint64_t offset)
{
  assert (op == NEXTIO_READ || op == NEXTIO_WRITE || op == NEXTIO_TRIM);
  while (count > 0) {
    struct nextio_call c = {
      .op = op, .buf = buf, .len = MIN (count, NEXT_MAX), .offset = offset,
    };
    int r = nextio_turn (&c);

    if (r < 0)
      return r;
    if (buf)
      buf += c.len;
    offset += c.len;
    count -= c.len;
  }
  return 0;
}

static int
nextio_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  struct nextio *n = (struct nextio *) io;
  uint8_t *p = buf;

  /* Past the end of storage reads as zeros. */
  if (offset >= n->size) {
    memset (p, 0, count);
    return 0;
  }
  if (count > n->size - offset) {
    memset (p + (n->size - offset), 0, count - (n->size - offset));
    count = n->size - offset;
  }
  return nextio_chunks (n, NEXTIO_READ, p, count, offset);
}

static int
nextio_pwrite (struct qcow2_io *io, const void *buf, size_t count,
               uint64_t offset)
{
  struct nextio *n = (struct nextio *) io;

  if (offset > n->size || count > n->size - offset)
    return -ENOSPC;             /* the plugin's export cannot grow */
  /* The plugin's pwrite takes a const buffer: nothing is written to. */
  return nextio_chunks (n, NEXTIO_WRITE, (uint8_t *) buf, count, offset);
}

static int
nextio_flush (struct qcow2_io *io)
{
  struct nextio *n = (struct nextio *) io;
  struct nextio_call c = { .op = NEXTIO_FLUSH };

  /* A plugin that cannot flush (nbdkit's memory plugin) has nothing to
   * make durable.
   */
  if (!n->can_flush)
    return 0;
  return nextio_turn (&c);
}

static int
nextio_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  struct nextio *n = (struct nextio *) io;

  if (!n->can_trim)
    return -EOPNOTSUPP;
  return nextio_chunks (n, NEXTIO_TRIM, NULL, count, offset);
}

static int64_t
nextio_size (struct qcow2_io *io)
{
  return ((struct nextio *) io)->size;
}

/* The allocation of the plugin's export from its extents: the run of
 * extents from offset that have the type of the first.  Without
 * extents, all data.
 */
static int
nextio_status (struct qcow2_io *io, uint64_t offset, uint64_t count,
               uint32_t *type, uint64_t *len)
{
  struct nextio *n = (struct nextio *) io;
  struct nextio_call c = { .op = NEXTIO_STATUS, .offset = offset };
  int r;

  *type = offset >= n->size ? QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO : 0;
  *len = count;
  if (offset >= n->size || !n->can_extents)
    return 0;
  c.len = MIN (count, MIN (n->size - offset, NEXT_MAX));
  if (!(c.extents = nbdkit_extents_new (offset, n->size)))
    return -errno;
  r = nextio_turn (&c);
  if (r == 0) {
    *len = 0;
    for (size_t i = 0; i < nbdkit_extents_count (c.extents); i++) {
      struct nbdkit_extent x = nbdkit_get_extent (c.extents, i);
      uint32_t t = x.type & (QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO);

      if (i == 0)
        *type = t;
      else if (t != *type)
        break;
      *len = x.offset + x.length - offset;
    }
    r = *len ? 0 : -EIO;
    assert (r < 0 || *len <= n->size - offset);   /* nbdkit clips */
  }
  nbdkit_extents_free (c.extents);
  return r;
}

static void
nextio_close (struct qcow2_io *io)
{
  free (io);
}

static const struct qcow2_io_ops nextio_ops = {
  .pread = nextio_pread,
  .pwrite = nextio_pwrite,
  .flush = nextio_flush,
  .punch = nextio_punch,
  .size = nextio_size,
  .status = nextio_status,
  .close = nextio_close,
};

struct qcow2_io *
below_nextio_new (int64_t size, unsigned flags)
  TSA_EXCLUDES (&below_lock)
{
  struct nextio *n = calloc (1, sizeof *n);
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE_IF (&below_lock, below_serialized);

  if (!n) {
    nbdkit_error ("calloc: %s", errstr (errno));
    return NULL;
  }
  n->io.ops = &nextio_ops;
  n->size = size;
  /* nbdkit allows a call into the plugin only once it was asked
   * whether it can do it.
   */
  n->can_flush = below_next->can_flush (below_next) == 1;
  n->can_trim = !(flags & NEXTIO_READONLY) &&
    below_next->can_trim (below_next) == 1;
  n->can_extents = (flags & NEXTIO_EXTENTS) &&
    below_next->can_extents (below_next) == 1;
  return &n->io;
}

/* The keys of the plugin's that say what it serves, in messages. */
static const char *const naming_keys[] = {
  "file", "url", "uri", "host", "hostname", "port", "path", "socket",
  "export",
};

/* Plugins whose disk those keys name (for memory, none: it is always
 * new and empty): the others' keys are all recorded.
 */
static const char *const named_plugins[] = {
  "file", "curl", "ssh", "nbd", "memory",
};

/* Filters that change no byte of the disk (they delay, count, cache,
 * limit or fail requests): left out of the stack, with the keys named
 * after them (delay-read=, latency-read=, iostats-file=).
 */
static const char *const transparent_filters[] = {
  "blocksize", "blocksize-policy", "cache", "cacheextents", "delay",
  "error", "exitlast", "exitwhen", "fastzero", "flush-coalesce", "fua",
  "iostats", "ip", "latency", "limit", "log", "multi-conn", "noextents",
  "nofilter", "noparallel", "nozero", "pause", "protect", "rate",
  "readahead", "retry", "retry-request", "stats",
};

/* Words of keys that carry credentials, never recorded (a password, an
 * S3 secret key, an HTTP header or cookie): they do not say what the
 * disk is, and FILE is no place for them.
 */
static const char *const secret_words[] = {
  "password", "passphrase", "secret", "token", "cookie", "header",
  "access-key",
};

static bool
below_in (const char *s, const char *const *list, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (strcmp (s, list[i]) == 0)
      return true;
  return false;
}

static bool
below_secret (const char *key)
{
  for (size_t i = 0; i < sizeof secret_words / sizeof *secret_words; i++)
    if (strstr (key, secret_words[i]))
      return true;
  return false;
}

/* key=value appended to *keys; a URL's user and password left out. */
static int
below_note_key (char **keys_p, const char *key, const char *value)
{
  const char *old = *keys_p;
  const char *scheme = strstr (value, "://");
  const char *at = scheme ? strchr (scheme + 3, '@') : NULL;
  const char *slash = scheme ? strchr (scheme + 3, '/') : NULL;
  char *keys;
  int r;

  if (at && (!slash || at < slash))
    r = asprintf (&keys, "%s%s%s=%.*s%s", old ? old : "",
                  old ? " " : "", key, (int) (scheme + 3 - value),
                  value, at + 1);
  else
    r = asprintf (&keys, "%s%s%s=%s", old ? old : "",
                  old ? " " : "", key, value);
  if (r == -1) {
    nbdkit_error ("asprintf: %s", errstr (errno));
    return -1;
  }
  free (*keys_p);
  *keys_p = keys;
  return 0;
}

const char *
below_identity (void)
{
  return identity;
}

const char *
below_stack (void)
{
  return stack;
}

const char *
below_description (void)
{
  return description;
}

const char *
below_served_file (void)
{
  return below_file_plugin && below_file_count == 1 ? below_file : NULL;
}

/* No filter between, which may change the disk's bytes or size (even
 * the blocksize filter rounds it): the file's are the disk's.
 */
const char *
below_direct_file (bool *regular)
{
  struct stat st;

  if (!below_served_file () || below_filters ||
      stat (below_file, &st) == -1 ||
      !(S_ISREG (st.st_mode) || S_ISBLK (st.st_mode)))
    return NULL;
  *regular = S_ISREG (st.st_mode);
  return below_file;
}

int64_t
below_served_size (void)
{
  struct stat st;
  bool regular;

  if (!below_direct_file (&regular) || !regular ||
      stat (below_file, &st) == -1)
    return -1;
  return st.st_size;
}

/* A local file in a record of ours is the file the plugin serves when
 * it is the same file, however spelled (./a.raw, ../d/a.raw, a
 * symbolic link): only its path differs from our identity.
 */
bool
below_same_plugin (const char *recorded)
{
  static const char head[] = "file file=";
  const size_t len = sizeof head - 1;
  const char *served = below_served_file ();
  struct stat a, b;

  if (strcmp (recorded, identity) == 0)
    return true;
  return served && strncmp (identity, head, len) == 0 &&
    strcmp (identity + len, served) == 0 &&
    strncmp (recorded, head, len) == 0 &&
    stat (recorded + len, &a) == 0 && stat (served, &b) == 0 &&
    a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

const char *
below_local_file (void)
{
  return below_file_is_image ? below_file : NULL;
}

/* When the plugin serves one local file, QEMU's locks on it, held by
 * a descriptor of our own until cleanup: QEMU then sees the image in
 * use, and the filter refuses an image QEMU is writing.
 */
int
below_lock_file (bool readonly)
{
  struct stat st;
  char *why = NULL;

  if (!below_served_file () || stat (below_file, &st) == -1 ||
      !S_ISREG (st.st_mode)) {
    nbdkit_debug ("%s: not locked: the plugin below is not nbdkit's file "
                  "plugin serving this local file", below_file);
    return 0;
  }
  assert (!below_file_lock);    /* the image opens once */
  below_file_is_image = true;
  below_file_lock = fileio_open_with (below_file, readonly,
                                      &glue_file_options, &why);
  if (!below_file_lock) {
    nbdkit_error ("%s: %s", below_file, why ? why : errstr (errno));
    free (why);
    return -1;
  }
  return 0;
}

struct context_open {
  nbdkit_backend *backend;
  bool readonly;
};

static void *
below_open_1 (void *opaque)
{
  struct context_open *c = opaque;

  return nbdkit_next_context_open (c->backend, c->readonly, "", 1);
}

/* The context has no client: nbdkit logs an error when the plugin
 * asks for the client's export name (the nbd and sh plugins do, at
 * open; "no connection", or from 1.43.9 "no context, in this thread"),
 * which is left out.
 */
int
below_open (nbdkit_backend *backend, bool readonly, int64_t *size)
  TSA_EXCLUDES (&below_lock)
{
  struct context_open c = { backend, readonly };
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE_IF (&below_lock, below_serialized);

  assert (!below_next);         /* opened once */
  below_next = glue_quiet_open (below_open_1, &c);
  if (!below_next || below_next->prepare (below_next) == -1)
    return -1;
  *size = below_next->get_size (below_next);
  return *size == -1 ? -1 : 0;
}

int
below_can_write (void)
  TSA_EXCLUDES (&below_lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE_IF (&below_lock, below_serialized);

  return below_next->can_write (below_next);
}

int
below_config (const char *key, const char *value)
{
  if (strcmp (key, "file") == 0) {
    free (below_file);
    below_file = nbdkit_absolute_path (value);
    below_file_count++;
  }
  if (!below_in (key, naming_keys, sizeof naming_keys / sizeof *naming_keys)) {
    char **others;

    if (below_secret (key))
      return 0;
    others = realloc (below_others, (below_others_len + 1) * sizeof *others);
    if (!others) {
      nbdkit_error ("realloc: %s", errstr (errno));
      return -1;
    }
    below_others = others;
    others[below_others_len] = NULL;
    if (below_note_key (&others[below_others_len], key, value) == -1)
      return -1;
    below_others_len++;
    return 0;
  }
  if (below_note_key (&below_keys, key, value) == -1 ||
      below_note_key (&below_id_keys, key,
                      strcmp (key, "file") == 0 && below_file ?
                      below_file : value) == -1)
    return -1;
  return 0;
}

/* Whether key=value (or a filter's name, with its "--filter=") is one
 * of the filters given that change nothing below, or named after one.
 */
static bool
below_transparent (const char *word, const char *filters)
{
  for (size_t i = 0;
       i < sizeof transparent_filters / sizeof *transparent_filters; i++) {
    const char *name = transparent_filters[i];
    size_t len = strlen (name);
    const char *f;

    if (strncmp (word, "--filter=", 9) == 0) {
      if (strcmp (word + 9, name) == 0)
        return true;
      continue;
    }
    /* Given: "--filter=NAME" followed by a space or the end. */
    for (f = strstr (filters, name); f; f = strstr (f + 1, name))
      if (f - filters >= 9 && strncmp (f - 9, "--filter=", 9) == 0 &&
          (f[len] == ' ' || f[len] == '\0'))
        break;
    if (f && strncmp (word, name, len) == 0)
      return true;
  }
  return false;
}

/* word appended to the stack being made, unless transparent. */
static void
below_stack_word (FILE *fp, const char *word, const char *filters)
{
  if (!below_transparent (word, filters))
    fprintf (fp, "%s%s", ftell (fp) ? " " : "", word);
}

/* Records the filters below and the other keys, if the disk depends on
 * them (see below_stack).  Returns 0, or -1 after logging an error.
 */
static int
below_make_stack (const char *plugin)
{
  char *filters = glue_filters_below ("qcow2");
  char *words = filters ? strdup (filters) : NULL, *save, *w;
  bool named = below_in (plugin, named_plugins,
                         sizeof named_plugins / sizeof *named_plugins);
  size_t size = 0;
  FILE *fp = words ? open_memstream (&stack, &size) : NULL;

  if (!fp) {
    nbdkit_error ("the filters below: %s", errstr (errno));
    free (filters);
    free (words);
    return -1;
  }
  below_filters = filters[0] != '\0';
  /* Filters are named by their short names: no spaces in them. */
  for (w = strtok_r (words, " ", &save); w; w = strtok_r (NULL, " ", &save))
    below_stack_word (fp, w, filters);
  if (ftell (fp) || !named)
    for (size_t i = 0; i < below_others_len; i++)
      below_stack_word (fp, below_others[i], filters);
  free (filters);
  free (words);
  if (fclose (fp) == EOF) {
    nbdkit_error ("the filters below: %s", errstr (errno));
    return -1;
  }
  return 0;
}

int
below_config_complete (void)
{
  char plugin[GLUE_PLUGIN_NAME_MAX];

  glue_plugin_name (plugin);
  below_file_plugin = strcmp (plugin, "file") == 0;
  if (strcmp (plugin, "qcow2") == 0) {
    nbdkit_error ("--filter=qcow2 over the qcow2 plugin");
    glue_hint ("the plugin serves the image already: use one of them "
               "(nbdkit qcow2 FILE, or nbdkit --filter=qcow2 file FILE)");
    return -1;
  }
  if (asprintf (&image_name, "%s %s", plugin[0] ? plugin : "the plugin's",
                below_keys ? below_keys : "export") == -1 ||
      asprintf (&identity, "%s%s%s", plugin[0] ? plugin : "plugin",
                below_id_keys ? " " : "",
                below_id_keys ? below_id_keys : "") == -1) {
    nbdkit_error ("asprintf: %s", errstr (errno));
    return -1;
  }
  if (below_make_stack (plugin) == -1)
    return -1;
  if (asprintf (&description, "%s%s%s", identity, stack[0] ? " " : "",
                stack) == -1) {
    nbdkit_error ("asprintf: %s", errstr (errno));
    return -1;
  }
  return 0;
}

const char *
below_name (void)
{
  return image_name;
}

bool
below_get_ready (int thread_model)
{
  below_serialized = thread_model != NBDKIT_THREAD_MODEL_PARALLEL;
  return below_serialized;
}

void
below_cleanup (void)
  TSA_EXCLUDES (&below_lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE_IF (&below_lock, below_serialized);

  if (below_next) {
    below_next->finalize (below_next);
    nbdkit_next_context_close (below_next);
    below_next = NULL;
  }
  if (below_file_lock) {
    below_file_lock->ops->close (below_file_lock);
    below_file_lock = NULL;
  }
}

void
below_unload (void)
{
  free (below_file);
  free (below_keys);
  free (below_id_keys);
  free (identity);
  for (size_t i = 0; i < below_others_len; i++)
    free (below_others[i]);
  free (below_others);
  free (stack);
  free (description);
  free (image_name);
}
