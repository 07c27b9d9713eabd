/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit qcow2 filter: the qcow2 engine over whatever the plugin below
 * serves (a file, another NBD server, SSH, HTTP, an xz archive ...).
 * One engine serves every connection, over one context into the plugin
 * opened at after_fork (a "shared" context), so that all connections
 * see one image, as with the plugin.  Backing files are local files.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
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
#include "glue.h"
#include "qcow2.h"

/* The most the engine asks of the plugin in one call (its requests are
 * 32-bit).
 */
#define NEXT_MAX (32u << 20)

/* backing-dir=: where backing files named by a relative name are.
 * Without it: the image's folder when the plugin serves a local file,
 * else the current directory (taken at config_complete, before nbdkit
 * runs in the background in "/").
 */
static char *backing_dir;
static char *start_dir;

/* backing=FILE, in the order given: the chain below the image, as
 * written, then (at open) resolved where backing files are.
 */
static char **backing_chain;
static unsigned backing_chain_len;

/* file=, passed on to the plugin (nbdkit's file plugin, or another
 * that takes the key), and how often: a single local file that the
 * plugin has open is the image, locked as the plugin locks its image,
 * and named by its path (messages, relative backing file names).
 */
static char *below_file;
static unsigned below_file_count;
static bool below_file_is_image;
static struct qcow2_io *below_file_lock;

/* create=true: format the plugin's export (if empty) at open. */
static bool create;

/* The context into the plugin, shared by all connections, and what the
 * engine made of it.  Set at after_fork, fixed until cleanup.
 */
static nbdkit_next *below;
static struct qcow2_image *image;
static bool open_failed;

/* When the plugin's thread model does not allow requests in parallel
 * (nbdkit tells get_ready), the engine's calls into it, which may come
 * from several threads at once (its I/O pool, flushes), take turns.
 */
static bool below_serialized;
static pthread_mutex_t below_lock = PTHREAD_MUTEX_INITIALIZER;

/* The plugin's export, as the engine's storage: it cannot grow. */
struct nextio {
  struct qcow2_io io;
  nbdkit_next *next;
  uint64_t size;
  bool can_flush, can_trim;
};

static void
nextio_lock (void)
{
  if (below_serialized)
    pthread_mutex_lock (&below_lock);
}

static void
nextio_unlock (void)
{
  if (below_serialized)
    pthread_mutex_unlock (&below_lock);
}

/* [offset, offset+count) read, written or trimmed in calls of at most
 * NEXT_MAX bytes.
 */
enum nextio_op { NEXTIO_READ, NEXTIO_WRITE, NEXTIO_TRIM };

static int
nextio_chunks (struct nextio *n, enum nextio_op op, uint8_t *buf,
               size_t count, uint64_t offset)
{
  int err = 0;

  while (count > 0) {
    uint32_t len = count < NEXT_MAX ? count : NEXT_MAX;
    nbdkit_next *next = n->next;
    int r;

    nextio_lock ();
    r = op == NEXTIO_READ ? next->pread (next, buf, len, offset, 0, &err)
      : op == NEXTIO_WRITE ? next->pwrite (next, buf, len, offset, 0, &err)
      : next->trim (next, len, offset, 0, &err);
    nextio_unlock ();
    if (r == -1)
      return -(err ? err : EIO);
    if (buf)
      buf += len;
    offset += len;
    count -= len;
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
  int err = 0, r;

  /* A plugin that cannot flush (nbdkit's memory plugin) has nothing to
   * make durable.
   */
  if (!n->can_flush)
    return 0;
  nextio_lock ();
  r = n->next->flush (n->next, 0, &err);
  nextio_unlock ();
  return r == -1 ? -(err ? err : EIO) : 0;
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
  .close = nextio_close,
};

static int
qcow2_filter_backing (const char *key, const char *value)
{
  char **chain;

  if (glue.engine.no_backing) {
    nbdkit_error ("backing=%s: backing=none ends the chain, so nothing "
                  "can follow it", value);
    return -1;
  }
  if (strcmp (value, "none") == 0) {
    glue.engine.no_backing = true;
    return 0;
  }
  if (value[0] == '\0') {
    nbdkit_error ("backing: empty file name (backing=none serves the image "
                  "without its backing file)");
    return -1;
  }
  chain = realloc (backing_chain, (backing_chain_len + 1) * sizeof *chain);
  if (!chain) {
    nbdkit_error ("realloc: %s", errstr (errno));
    return -1;
  }
  backing_chain = chain;
  chain[backing_chain_len] = strdup (value);
  if (!chain[backing_chain_len]) {
    nbdkit_error ("strdup: %s", errstr (errno));
    return -1;
  }
  backing_chain_len++;
  return 0;
}

/* The filter's own keys (glue.c has those shared with the plugin). */
static const struct glue_option filter_options[] = {
  { "backing", GLUE_FN, .fn = qcow2_filter_backing },
  { "backing-dir", GLUE_PATH, .dest = &backing_dir },
  { "create", GLUE_BOOL, .dest = &create },
  { "virtual-size", GLUE_FN, true, .fn = glue_config_create_size },
  { "qcow2-password", GLUE_FN, .fn = glue_config_password },
  { "qcow2-passphrase", GLUE_FN, .fn = glue_config_password },
  { "qcow2-backing-password", GLUE_FN, .fn = glue_config_backing_password },
  { "qcow2-backing-passphrase", GLUE_FN,
    .fn = glue_config_backing_password },
};

static void
qcow2_filter_load (void)
{
  glue.engine.io_threads = GLUE_IO_THREADS_FILTER;
}

static void
qcow2_filter_unload (void)
{
  glue_unload ();
  free (backing_dir);
  free (start_dir);
  for (unsigned i = 0; i < backing_chain_len; i++)
    free (backing_chain[i]);
  free (backing_chain);
  free (below_file);
}

/* Our keys, and the plugin's (passed on). */
static int
qcow2_filter_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                     const char *key, const char *value)
{
  int r = glue_config (filter_options,
                       sizeof filter_options / sizeof *filter_options,
                       key, value, NULL);

  if (r == 0 && strcmp (key, "file") == 0) {
    free (below_file);
    below_file = nbdkit_absolute_path (value);
    below_file_count++;
  }
  if (r == 0)
    return next (nxdata, key, value);
  return r == 1 ? 0 : -1;
}

static int
qcow2_filter_config_complete (nbdkit_next_config_complete *next,
                              nbdkit_backend *nxdata)
{
  if (glue_config_complete () == -1)
    return -1;
  if (!create && glue.create.first_key) {
    nbdkit_error ("%s= describes an image to make: it needs create=true",
                  glue.create.first_key);
    return -1;
  }
  if (create && glue.create.size == -1) {
    nbdkit_error ("create=true needs virtual-size= (the size of the disk "
                  "the image made in the plugin's export holds)");
    return -1;
  }
  if (create && backing_chain_len > 0) {
    nbdkit_error ("create=true makes an image without a backing file: "
                  "backing= names the chain of an image served");
    return -1;
  }
  glue.create.opts.size = (glue.create.size + 511) & ~INT64_C (511);
  if (create && qcow2_create_check (&glue_env, &glue.create.opts) < 0)
    return -1;
  if (!backing_dir && !(start_dir = nbdkit_realpath (".")))
    return -1;
  return next (nxdata);
}

#define qcow2_filter_config_help \
  "backing=none                    Serve the image without its backing file.\n" \
  "backing=<FILE>                  The image's backing file (repeat for the\n" \
  "                                chain below it; backing=none ends it).\n" \
  "create=true virtual-size=<SIZE> Make a new image in the (empty) export,\n" \
  "                                also cluster-size=, compat=, extended-l2=,\n" \
  "                                lazy-refcounts=.\n" \
  "backing-dir=<DIR>               Where relative backing file names are\n" \
  "                                (default: the current directory).\n" \
  "qcow2-password=<PASSWORD>|-|+FILE|-FD  The password of a LUKS image\n" \
  "                                (also qcow2-passphrase=).\n" \
  "qcow2-backing-password=<PASSWORD>  That of the next backing file.\n" \
  GLUE_CONFIG_HELP

static int
qcow2_filter_get_ready (int thread_model)
{
  below_serialized = thread_model != NBDKIT_THREAD_MODEL_PARALLEL;
  /* No pool of threads calling a plugin that takes one request at a
   * time: they would only wait for each other.
   */
  if (below_serialized)
    glue.engine.io_threads = 0;
  return 0;
}

/* Whether this process has st's file open (the plugin below, after
 * opening its context: nbdkit's file plugin opens at open).
 */
static bool
qcow2_filter_file_is_open (const struct stat *st)
{
  DIR *d = opendir ("/proc/self/fd");
  struct dirent *e;
  bool found = false;

  if (!d)
    return false;
  while (!found && (e = readdir (d)) != NULL) {
    struct stat fst;
    char *end;
    long fd = strtol (e->d_name, &end, 10);

    if (*end == '\0' && fd != dirfd (d) && fstat ((int) fd, &fst) == 0)
      found = fst.st_dev == st->st_dev && fst.st_ino == st->st_ino;
  }
  closedir (d);
  return found;
}

/* When the plugin serves one local file, QEMU's locks on it, held by
 * a descriptor of our own until cleanup: QEMU then sees the image in
 * use, and the filter refuses an image QEMU is writing.
 */
static int
qcow2_filter_lock_below (bool readonly)
{
  struct stat st;
  char *why = NULL;

  if (below_file_count != 1 || !below_file)
    return 0;
  if (stat (below_file, &st) == -1 || !S_ISREG (st.st_mode)
      || !qcow2_filter_file_is_open (&st)) {
    nbdkit_debug ("%s: not locked: the plugin below has no such local "
                  "file open", below_file);
    return 0;
  }
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

/* create=true: a new image in the export, which must be empty (its
 * first MiB all zeros: not an image, a partition table or a file
 * system someone would miss).  0, or -1 said.
 */
static int
qcow2_filter_create (struct qcow2_io *io)
{
  uint64_t len = MIN (io->ops->size (io), 1u << 20);
  uint8_t *buf = malloc (len ? len : 1);
  int r;

  if (!buf) {
    nbdkit_error ("malloc: %s", errstr (errno));
    return -1;
  }
  r = io->ops->pread (io, buf, len, 0);
  if (r < 0) {
    nbdkit_error ("create: reading the plugin's export: %s", errstr (-r));
    free (buf);
    return -1;
  }
  for (uint64_t i = 0; i < len; i++) {
    if (buf[i] != 0) {
      nbdkit_error ("create=true: the plugin's export is not empty (data "
                    "at offset %" PRIu64 "): only an empty export is "
                    "formatted", i);
      free (buf);
      return -1;
    }
  }
  free (buf);
  if (qcow2_create (&glue_env, io, &glue.create.opts) < 0)
    return -1;
  nbdkit_debug ("create: a %" PRIu64 "-byte image made in the plugin's "
                "export", glue.create.opts.size);
  return 0;
}

/* Where relative backing file names are (see backing_dir), and the
 * name the engine knows the image by, which resolves them there.
 * Then the names of backing=, resolved there.  0, or -1 said.
 */
static int
qcow2_filter_name_files (char **image_path)
{
  char *dir;
  int r = 0;

  if (backing_dir || !below_file_is_image)
    dir = strdup (backing_dir ? backing_dir : start_dir);
  else  /* an absolute path: it has a slash */
    dir = strndup (below_file, strrchr (below_file, '/') - below_file);
  if (!dir) {
    nbdkit_error ("strdup: %s", errstr (errno));
    return -1;
  }
  /* Names are dir + "/" + name, so the root folder is "". */
  if (strcmp (dir, "/") == 0)
    dir[0] = '\0';
  if (!backing_dir && below_file_is_image)
    *image_path = strdup (below_file);
  else if (asprintf (image_path, "%s/image", dir) == -1)
    *image_path = NULL;
  for (unsigned i = 0; *image_path && i < backing_chain_len; i++) {
    char *path;

    if (backing_chain[i][0] == '/')
      continue;
    if (asprintf (&path, "%s/%s", dir, backing_chain[i]) == -1) {
      free (*image_path);
      *image_path = NULL;
      break;
    }
    free (backing_chain[i]);
    backing_chain[i] = path;
  }
  if (!*image_path) {
    nbdkit_error ("asprintf: %s", errstr (errno));
    r = -1;
  }
  glue.engine.backing_chain = (const char *const *) backing_chain;
  glue.engine.backing_chain_len = backing_chain_len;
  free (dir);
  return r;
}

/* The image opened once, read-write if the plugin is writable and
 * nbdkit does not serve read-only.  The name the engine knows it by
 * resolves relative backing file names in backing-dir.
 */
static int
qcow2_filter_open_image (nbdkit_backend *backend)
{
  bool readonly = glue.engine.readonly || glue_server_readonly ();
  struct nextio *n;
  char *path;
  int64_t size;
  int w;

  below = nbdkit_next_context_open (backend, readonly, "", 1);
  if (!below)
    return -1;
  if (below->prepare (below) == -1)
    return -1;
  size = below->get_size (below);
  if (size == -1)
    return -1;
  if (!readonly && (w = below->can_write (below)) != 1) {
    if (w == -1)
      return -1;
    readonly = true;
  }
  glue.engine.readonly = readonly;
  if (qcow2_filter_lock_below (readonly) == -1)
    return -1;
  n = calloc (1, sizeof *n);
  if (!n) {
    nbdkit_error ("calloc: %s", errstr (errno));
    return -1;
  }
  n->io.ops = &nextio_ops;
  n->next = below;
  n->size = size;
  /* nbdkit allows a call into the plugin only once it was asked
   * whether it can do it.
   */
  n->can_flush = below->can_flush (below) == 1;
  n->can_trim = !readonly && below->can_trim (below) == 1;
  if (create && readonly) {
    nbdkit_error ("create=true: the export is read-only (nbdkit -r, or a "
                  "plugin that cannot write)");
    free (n);
    return -1;
  }
  if ((create && qcow2_filter_create (&n->io) == -1) ||
      qcow2_filter_name_files (&path) == -1) {
    free (n);
    return -1;
  }
  image = qcow2_open (&glue_env, &n->io, path, &glue.engine);
  free (path);
  /* The image and its backing files are open: their keys are made. */
  glue_forget_password ();
  if (!image)
    return -1;
  if (glue.repair_leaks && glue_repair (image, "the image") == -1)
    return -1;
  return 0;
}

/* nbdkit may have started --run's command, which connects at once,
 * before after_fork: if the image cannot be served, nbdkit exiting
 * then would leave that client waiting for ever.  So the error is said
 * now and every connection is refused with it.
 */
static int
qcow2_filter_after_fork (nbdkit_backend *backend)
{
  if (qcow2_filter_open_image (backend) == -1) {
    nbdkit_error ("the image cannot be served: every connection is "
                  "refused");
    open_failed = true;
  }
  return 0;
}

static void
qcow2_filter_cleanup (nbdkit_backend *backend)
{
  if (image && qcow2_close (image) < 0)
    nbdkit_error ("closing the image failed: its last changes may not be "
                  "durable");
  image = NULL;
  if (below) {
    below->finalize (below);
    nbdkit_next_context_close (below);
    below = NULL;
  }
  if (below_file_lock) {
    below_file_lock->ops->close (below_file_lock);
    below_file_lock = NULL;
  }
}

/* Connections use the shared engine, not a context of their own. */
static void *
qcow2_filter_open (nbdkit_next_open *next, nbdkit_context *context,
                   int readonly, const char *exportname, int is_tls)
{
  if (open_failed) {
    nbdkit_error ("the image could not be opened (the error is logged "
                  "at start)");
    return NULL;
  }
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static int64_t
qcow2_filter_get_size (nbdkit_next *next, void *handle)
{
  return qcow2_get_size (image);
}

static int
qcow2_filter_can_write (nbdkit_next *next, void *handle)
{
  return qcow2_can_write (image);
}

/* Flush, zero (fast too), multi-conn, block status: always. */
static int
qcow2_filter_yes (nbdkit_next *next, void *handle)
{
  return 1;
}

static int
qcow2_filter_can_fua (nbdkit_next *next, void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

static int
qcow2_filter_can_trim (nbdkit_next *next, void *handle)
{
  return qcow2_can_trim (image);
}

static int
qcow2_filter_can_cache (nbdkit_next *next, void *handle)
{
  return NBDKIT_CACHE_NONE;
}

/* Every callback answers from the engine: a connection has no context
 * of its own into the plugin (next is NULL) to pass a question on to.
 */
static int
qcow2_filter_is_rotational (nbdkit_next *next, void *handle)
{
  return 0;
}

static const char *
qcow2_filter_export_description (nbdkit_next *next, void *handle)
{
  return NULL;
}

/* As the plugin: any byte range, 4 KiB preferred, 32 MiB at most. */
static int
qcow2_filter_block_size (nbdkit_next *next, void *handle,
                         uint32_t *minimum, uint32_t *preferred,
                         uint32_t *maximum)
{
  *minimum = 1;
  *preferred = 4096;
  *maximum = 32 * 1024 * 1024;
  return 0;
}

static int
qcow2_filter_result (int r, int *err)
{
  if (r < 0) {
    *err = -r;
    return -1;
  }
  return 0;
}

static int
qcow2_filter_pread (nbdkit_next *next, void *handle, void *buf,
                    uint32_t count, uint64_t offset, uint32_t flags,
                    int *err)
{
  return qcow2_filter_result (qcow2_read (image, buf, count, offset), err);
}

static int
qcow2_filter_pwrite (nbdkit_next *next, void *handle, const void *buf,
                     uint32_t count, uint64_t offset, uint32_t flags,
                     int *err)
{
  return qcow2_filter_result (qcow2_write (image, buf, count, offset,
                                           flags & NBDKIT_FLAG_FUA), err);
}

static int
qcow2_filter_zero (nbdkit_next *next, void *handle, uint32_t count,
                   uint64_t offset, uint32_t flags, int *err)
{
  return qcow2_filter_result (qcow2_zero (image, count, offset,
                                          flags & NBDKIT_FLAG_MAY_TRIM,
                                          flags & NBDKIT_FLAG_FAST_ZERO,
                                          flags & NBDKIT_FLAG_FUA), err);
}

static int
qcow2_filter_trim (nbdkit_next *next, void *handle, uint32_t count,
                   uint64_t offset, uint32_t flags, int *err)
{
  return qcow2_filter_result (qcow2_trim (image, count, offset,
                                          flags & NBDKIT_FLAG_FUA), err);
}

static int
qcow2_filter_flush (nbdkit_next *next, void *handle, uint32_t flags,
                    int *err)
{
  return qcow2_filter_result (qcow2_flush (image), err);
}

static int
qcow2_filter_add_extent (void *opaque, uint64_t offset, uint64_t length,
                         uint32_t type)
{
  return nbdkit_add_extent (opaque, offset, length, type) == -1 ? -errno : 0;
}

static int
qcow2_filter_extents (nbdkit_next *next, void *handle, uint32_t count,
                      uint64_t offset, uint32_t flags,
                      struct nbdkit_extents *extents, int *err)
{
  return qcow2_filter_result (qcow2_extents (image, offset, count,
                                             flags & NBDKIT_FLAG_REQ_ONE,
                                             qcow2_filter_add_extent,
                                             extents), err);
}

static struct nbdkit_filter filter = {
  .name              = "qcow2",
  .longname          = "nbdkit qcow2 filter",
  .load              = qcow2_filter_load,
  .unload            = qcow2_filter_unload,
  .config            = qcow2_filter_config,
  .config_complete   = qcow2_filter_config_complete,
  .config_help       = qcow2_filter_config_help,
  .get_ready         = qcow2_filter_get_ready,
  .after_fork        = qcow2_filter_after_fork,
  .cleanup           = qcow2_filter_cleanup,
  .open              = qcow2_filter_open,
  .get_size          = qcow2_filter_get_size,
  .block_size        = qcow2_filter_block_size,
  .can_write         = qcow2_filter_can_write,
  .can_flush         = qcow2_filter_yes,
  .can_fua           = qcow2_filter_can_fua,
  .can_trim          = qcow2_filter_can_trim,
  .can_zero          = qcow2_filter_yes,
  .can_fast_zero     = qcow2_filter_yes,
  .can_multi_conn    = qcow2_filter_yes,
  .can_extents       = qcow2_filter_yes,
  .can_cache         = qcow2_filter_can_cache,
  .is_rotational     = qcow2_filter_is_rotational,
  .export_description = qcow2_filter_export_description,
  .pread             = qcow2_filter_pread,
  .pwrite            = qcow2_filter_pwrite,
  .zero              = qcow2_filter_zero,
  .trim              = qcow2_filter_trim,
  .flush             = qcow2_filter_flush,
  .extents           = qcow2_filter_extents,
};

NBDKIT_REGISTER_FILTER (filter)
