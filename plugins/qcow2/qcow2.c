/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit qcow2 plugin: the glue between nbdkit and the qcow2 engine in
 * common/qcow2.  The image is opened once, in get_ready, and shared by
 * every connection; the engine does its own locking.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "errstr.h"
#include "fileio.h"
#include "glue.h"
#include "qcow2.h"

static char *filename;
/* data-file=: absolute (opened), and as given (recorded by create=). */
static char *data_file;
static char *data_file_name;
static struct qcow2_image *image;

/* create=true or create=if-missing: make the image at get_ready. */
static enum { CREATE_NO, CREATE_YES, CREATE_IF_MISSING } create;
static char *create_backing;

static void
plugin_load (void)
{
  glue_load ("qcow2", "password", GLUE_IO_THREADS);
}

static void
plugin_unload (void)
{
  glue_stream_stop ();
  if (image && qcow2_close (image) < 0)
    nbdkit_error ("%s: closing the image failed: its last changes may not "
                  "be durable", filename);
  free (filename);
  free (data_file);
  free (data_file_name);
  glue_unload ();
  free (create_backing);
}

/* cache=none|writeback (index in the row's words). */
static void
plugin_set_cache (unsigned i)
{
  glue_file_options.direct = i == 0;
}

/* "none" serves an image alone; a file name is for create=. */
static int
plugin_config_backing (const char *key, const char *value)
{
  free (create_backing);
  create_backing = NULL;
  glue.engine.no_backing = strcmp (value, "none") == 0;
  if (!glue.engine.no_backing && !(create_backing = strdup (value)))
    return -1;
  return 0;
}

static int
plugin_config_data_file (const char *key, const char *value)
{
  free (data_file);
  free (data_file_name);
  data_file = nbdkit_absolute_path (value);
  data_file_name = strdup (value);
  return data_file && data_file_name ? 0 : -1;
}

static void
plugin_set_backing_format (unsigned i)
{
  glue.create.opts.backing_format = i == 0 ? "qcow2" : "raw";
}

static int
plugin_config_create (const char *key, const char *value)
{
  bool yes;

  if (strcmp (value, "if-missing") == 0) {
    create = CREATE_IF_MISSING;
    return 0;
  }
  if (glue_parse_bool (key, value, &yes) == -1)
    return -1;
  create = yes ? CREATE_YES : CREATE_NO;
  return 0;
}

#define WORDS(...) (const char *const []) { __VA_ARGS__, NULL }

/* The plugin's own keys (glue.c has those the filter takes too). */
static const struct glue_option plugin_options[] = {
  /* Absolute, since nbdkit may change directory; backing file names
   * resolve against the image's folder.
   */
  { "file", GLUE_PATH, .dest = &filename },
  { "password", GLUE_FN, .any_value = true,
    .fn = glue_config_password },
  /* nbdkit's luks filter calls it passphrase=. */
  { "passphrase", GLUE_FN, .any_value = true,
    .fn = glue_config_password },
  { "backing-password", GLUE_FN, .any_value = true,
    .fn = glue_config_backing_password },
  { "backing-passphrase", GLUE_FN, .any_value = true,
    .fn = glue_config_backing_password },
  { "data-file", GLUE_FN, .fn = plugin_config_data_file },
  { "data_file", GLUE_FN, .fn = plugin_config_data_file },
  { "backing", GLUE_FN, .fn = plugin_config_backing },
  /* qemu-img's spellings of the options of an image to create. */
  { "backing_file", GLUE_FN, .fn = plugin_config_backing },
  { "backing-fmt", GLUE_WORD, true, .words = WORDS ("qcow2", "raw"),
    .set = plugin_set_backing_format },
  { "backing_fmt", GLUE_WORD, true, .words = WORDS ("qcow2", "raw"),
    .set = plugin_set_backing_format },
  { "data-file-raw", GLUE_BOOL, true,
    .dest = &glue.create.opts.data_file_raw,
    .given = &glue.create.data_file_raw_set },
  { "data_file_raw", GLUE_BOOL, true,
    .dest = &glue.create.opts.data_file_raw,
    .given = &glue.create.data_file_raw_set },
  { "cache", GLUE_WORD, .words = WORDS ("none", "writeback"),
    .set = plugin_set_cache },
  { "create", GLUE_FN, .fn = plugin_config_create },
  { "size", GLUE_FN, true, .fn = glue_config_create_size },
  { "stream", GLUE_BOOL, .dest = &glue_stream.on },
  { "stream-base", GLUE_STRING, .dest = &glue_stream.base },
  { "stream-rate", GLUE_SIZE, .dest = &glue_stream.rate,
    .given = &glue_stream.rate_given },
  { "stream-detach", GLUE_BOOL, .dest = &glue_stream.detach,
    .given = &glue_stream.detach_given },
};

static int
plugin_config (const char *key, const char *value)
{
  const struct glue_option *o;
  int r = glue_config (plugin_options,
                       sizeof plugin_options / sizeof *plugin_options,
                       key, value, &o);
  if (r == 0) {
    nbdkit_error ("unknown parameter '%s'", key);
    return -1;
  }
  /* backing=FILE only describes an image to make; backing=none not. */
  if (r == 1 && o && !glue.create.first_key &&
      o->fn == plugin_config_backing && strcmp (value, "none") != 0)
    glue.create.first_key = o->key;
  return r == 1 ? 0 : -1;
}

static int
plugin_config_complete (void)
{
  if (!filename) {
    nbdkit_error ("you must supply the file=<FILENAME> parameter");
    return -1;
  }
  if (create == CREATE_NO && glue.create.first_key) {
    nbdkit_error ("%s= describes an image to make: it needs create=true "
                  "(or create=if-missing)%s", glue.create.first_key,
                  strcmp (glue.create.first_key, "backing") == 0 ?
                  "; to serve an image without its backing file, use "
                  "backing=none" : "");
    return -1;
  }
  if (create != CREATE_NO && glue.create.size == -1 && !create_backing) {
    nbdkit_error ("create=true needs size= (or backing= to take its size)");
    return -1;
  }
  if (create != CREATE_NO &&
      glue_create_check_password (create == CREATE_YES ? "create=true"
                                  : "create=if-missing") == -1)
    return -1;
  if (create != CREATE_NO && glue.create.opts.backing_format &&
      !create_backing) {
    nbdkit_error ("backing-fmt= names the format of backing=FILE, which "
                  "is not given");
    return -1;
  }
  /* QEMU maps a raw data file by metadata preallocation. */
  if (glue.create.opts.data_file_raw &&
      glue.create.opts.preallocation == QCOW2_PREALLOC_OFF)
    glue.create.opts.preallocation = QCOW2_PREALLOC_METADATA;
  glue.engine.data_file = data_file;
  if (glue_stream_config_complete ("stream") == -1)
    return -1;
  return glue_config_complete ();
}

/* The backing file of an image being created: its format and, unless
 * size= was given, its size.  Relative names are relative to the new
 * image's folder, as in the header; remote names (URLs, json:) are
 * opened as the engine opens backing files.
 */
static int
plugin_probe_backing (void)
{
  /* An encrypted backing file opens with its own password. */
  struct qcow2_options probe = {
    .no_backing = true, .readonly = true,
    .passwords = glue.engine.passwords_len > 1 ? glue.engine.passwords + 1
                                               : glue.engine.passwords,
    .passwords_len = glue.engine.passwords_len - (glue.engine.passwords_len > 1),
  };
  struct qcow2_image *b = NULL;
  struct qcow2_io *io;
  const char *named_format;
  char *path = NULL;
  int r = -1;

  io = qcow2_open_name (&glue_env, filename, create_backing, &path,
                        &named_format);
  if (!io)
    goto out;
  if (!glue.create.opts.backing_format)
    glue.create.opts.backing_format = named_format;
  if (!glue.create.opts.backing_format) {
    if (qcow2_probe (io) == 1)
      glue.create.opts.backing_format = "qcow2";
    else {
      /* A raw file could hold anything, even a qcow2 header later:
       * QEMU made the format of a backing file mandatory for that.
       */
      nbdkit_error ("backing file %s is not a qcow2 image", path);
      glue_hint ("if it is a raw image, say so with backing-fmt=raw "
                 "(qemu-img create -F raw)");
      io->ops->close (io);
      goto out;
    }
  }
  if (strcmp (glue.create.opts.backing_format, "qcow2") == 0) {
    b = qcow2_open (&glue_env, io, path, &probe);
    if (!b)
      goto out;
    if (glue.create.size == -1)
      glue.create.size = qcow2_get_size (b);
    qcow2_close (b);
  }
  else {
    if (glue.create.size == -1)
      glue.create.size = io->ops->size (io);
    io->ops->close (io);
  }
  r = glue.create.size >= 0 ? 0 : -1;
 out:
  free (path);
  return r;
}

/* What plugin_create did to the file system, undone if serving fails:
 * to the image (returned), and to its external data file.
 */
enum create_made { MADE_NOTHING, MADE_NEW_FILE, MADE_IN_EMPTY_FILE };
static enum create_made data_file_made;

/* fileio_create, and the error said if it fails. */
static struct qcow2_io *
plugin_create_file (const char *path, enum create_made *made)
{
  struct stat st;
  bool existed = stat (path, &st) == 0;
  struct qcow2_io *io;
  char *why;

  io = fileio_create (path, &glue_file_options, &why);
  if (!io) {
    int e = errno;

    if (!existed && e != EEXIST)
      unlink (path);                    /* made, then not opened */
    if (e == EEXIST) {
      nbdkit_error ("create: %s already exists and is not empty", path);
      glue_hint ("remove it, drop create=true, or use create=if-missing");
    }
    else
      nbdkit_error ("create: %s: %s", path, why ? why : errstr (e));
    free (why);
    errno = e;
    return NULL;
  }
  *made = existed ? MADE_IN_EMPTY_FILE : MADE_NEW_FILE;
  return io;
}

/* Everything is checked before the file is touched; then the image is
 * written into a new file, or an empty one (create=if-missing leaves a
 * file that is not empty alone, to be served as it is).
 */
static int
plugin_create (struct qcow2_io **iop, enum create_made *made)
{
  struct qcow2_io *io;
  struct stat st;
  bool existed;

  *iop = NULL;
  *made = MADE_NOTHING;
  existed = stat (filename, &st) == 0;
  if (create == CREATE_IF_MISSING && existed && st.st_size > 0) {
    nbdkit_debug ("create=if-missing: %s exists: served as it is, if it "
                  "is the image described", filename);
    return 0;
  }
  if (create_backing && plugin_probe_backing () == -1)
    return -1;
  /* Whole sectors, as qemu-img rounds it. */
  if (glue.create.size > INT64_MAX - 511) {
    nbdkit_error ("size %" PRId64 " is too large", glue.create.size);
    return -1;
  }
  glue.create.opts.size = (glue.create.size + 511) & ~INT64_C (511);
  glue.create.opts.backing = create_backing;
  glue.create.opts.data_file = data_file_name;
  if (qcow2_create_check (&glue_env, &glue.create.opts) < 0)
    return -1;

  /* The data file first, closed again: the engine opens it (and
   * locks it) with the image.
   */
  if (data_file) {
    struct qcow2_io *dio = plugin_create_file (data_file, &data_file_made);

    if (!dio)
      return -1;
    dio->ops->close (dio);
  }
  /* Locked for writing before anything is written, and served through
   * the same open file (a second one would meet its own locks).
   */
  io = plugin_create_file (filename, made);
  if (!io)
    return -1;
  if (qcow2_create (&glue_env, io, &glue.create.opts) < 0) {
    io->ops->close (io);
    return -1;
  }
  *iop = io;
  assert (*made != MADE_NOTHING);
  return 0;
}

/* Serving a new image failed: leave nothing behind (the image is
 * closed by then, so no write follows).
 */
static void
plugin_create_undo_file (const char *path, enum create_made made)
{
  if ((made == MADE_NEW_FILE && unlink (path) == -1) ||
      (made == MADE_IN_EMPTY_FILE && truncate (path, 0) == -1))
    nbdkit_error ("create: removing what was made of %s: %s", path,
                  errstr (errno));
}

static void
plugin_create_undo (enum create_made made)
{
  plugin_create_undo_file (filename, made);
  plugin_create_undo_file (data_file, data_file_made);
  data_file_made = MADE_NOTHING;
}

#define plugin_config_help \
  "[file=]<FILENAME>               (required) The qcow2 image to serve.\n" \
  "backing=none                    Serve the image without its backing file.\n" \
  "data-file=<FILENAME>            Override the external data file (with\n" \
  "                                create=: the one made).\n" \
  "password=<PASSWORD>|-|+FILE|-FD The password of a LUKS-encrypted image\n" \
  "                                (also passphrase=).\n" \
  "backing-password=<PASSWORD>     That of the next backing file, if other.\n" \
  "cache=none|writeback            none: O_DIRECT, past the page cache\n" \
  "                                (default writeback).\n" \
  GLUE_CONFIG_HELP \
  "io-threads=<N>                  Threads doing the pieces of a fragmented\n" \
  "                                request at once (default 4, 0: none).\n" \
  "stream=true                     Copy the backing chain into the image\n" \
  "                                while serving it, then drop the link.\n" \
  "stream-base=<NAME>              Stop at this layer (it stays the backing).\n" \
  "stream-rate=<SIZE>              At most this many bytes a second.\n" \
  "stream-detach=false             Copy, but keep the backing link.\n" \
  "create=true|if-missing          Make the image first (true: the file\n" \
  "                                must be missing or empty), as below.\n" \
  "size=<SIZE>                     Its virtual size (or that of backing=).\n" \
  "backing=<FILE>                  Its backing file (whose size and format\n" \
  "                                are taken).\n" \
  "backing-fmt=qcow2|raw           The backing file's format.\n" \
  "data-file-raw=on                The data file is a raw image of the disk.\n" \
  GLUE_CREATE_HELP \
  "preallocation=off|metadata|falloc|full  As qemu-img's (off).\n" \
  GLUE_CREATE_SPELLINGS_HELP

/* Hints for files that are not qcow2 images (qcow2_open's errno). */
static void
plugin_open_hint (int e)
{
  if (e == ENODATA)
    nbdkit_error ("%s is empty: to make a new image in it, add create=true "
                  "size=SIZE", filename);
  else if (e == EMEDIUMTYPE && create == CREATE_IF_MISSING)
    nbdkit_error ("create=if-missing: %s exists but is not a qcow2 image: "
                  "it is left as it is", filename);
  else if (e == EMEDIUMTYPE)
    nbdkit_error ("if %s is a raw disk image, nbdkit's file plugin serves "
                  "it: nbdkit file %s", filename, filename);
}

/* Open the image (through io if create= made it), read-write where the
 * file and the user allow it.
 */
static int
plugin_open_image (struct qcow2_io *io)
{
  bool asked_readonly = glue.engine.readonly || glue_server_readonly ();
  char *why = NULL;
  int e = 0;

  /* A snapshot is served read-only: the file is opened so, and locked
   * as a reader, as qemu-nbd -l does (the notice below says so).
   */
  glue.engine.readonly = asked_readonly || glue.engine.snapshot;
  if (!io && !glue.engine.readonly) {
    io = fileio_open_with (filename, false, &glue_file_options, &why);
    if (!io && (errno == EACCES || errno == EROFS || errno == EPERM)) {
      e = errno;
      glue.engine.readonly = true;
    }
  }
  if (!io && glue.engine.readonly && !why)
    io = fileio_open_with (filename, true, &glue_file_options, &why);
  if (!io) {
    nbdkit_error ("open: %s: %s%s", filename, why ? why : errstr (errno),
                  glue_file_options.direct && errno == EINVAL ?
                  " (cache=none needs O_DIRECT)" : "");
    free (why);
    return -1;
  }
  glue.engine.debug_cache = qcow2_debug_cache;
  image = qcow2_open (&glue_env, io, filename, &glue.engine);
  if (!image) {
    plugin_open_hint (errno);
    return -1;
  }
  return glue_opened (image, filename, asked_readonly,
                      e ? nbdkit_printf_intern ("it cannot be opened for "
                                                "writing: %s", errstr (e))
                        : NULL);
}

static int
plugin_get_ready (void)
{
  struct qcow2_io *io = NULL;
  enum create_made made = MADE_NOTHING;
  int r;

  if (create != CREATE_NO && plugin_create (&io, &made) == -1)
    goto fail;
  r = plugin_open_image (io);
  /* The image and its backing files are open: their keys are made. */
  glue_forget_password ();
  if (r == -1)
    goto fail;
  glue.create.opts.backing = create_backing;
  if (create == CREATE_IF_MISSING && made == MADE_NOTHING &&
      glue_create_compare (image, filename) == -1)
    goto fail;
  if (made != MADE_NOTHING &&
      qcow2_preallocate (image, glue.create.opts.preallocation) < 0)
    goto fail;
  if (glue.repair_leaks && glue_repair (image, filename) == -1)
    goto fail;
  if (glue_stream_prepare (image, filename, "stream",
                           glue.engine.readonly) == -1)
    goto fail;
  assert (image != NULL);
  return 0;

 fail:
  qcow2_close (image);
  image = NULL;
  plugin_create_undo (made);
  return -1;
}

/* Threads do not survive nbdkit's fork into the background. */
static int
plugin_after_fork (void)
{
  return glue_stream_start ();
}

static void
plugin_cleanup (void)
{
  glue_stream_stop ();
}

static const char *
plugin_export_description (void *handle)
{
  return glue_stream_description ();
}

static void *
plugin_open (int readonly)
{
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static void
plugin_close (void *handle)
{
  glue_close_stats (image);
}

static int64_t
plugin_get_size (void *handle)
{
  return qcow2_get_size (image);
}

static int
plugin_can_write (void *handle)
{
  return qcow2_can_write (image);
}

static int
plugin_can_flush (void *handle)
{
  return 1;
}

static int
plugin_can_fua (void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

static int
plugin_can_trim (void *handle)
{
  return qcow2_can_trim (image);
}

static int
plugin_can_zero (void *handle)
{
  return 1;
}

static int
plugin_can_fast_zero (void *handle)
{
  return 1;
}

static int
plugin_can_multi_conn (void *handle)
{
  return 1;
}

static int
plugin_can_extents (void *handle)
{
  return 1;
}

/* As qemu-nbd advertises them: any byte range works (partial clusters
 * cost one read and one write), 4 KiB suits every cluster size, and a
 * request may be as long as qemu-nbd's longest.
 */
static int
plugin_block_size (void *handle, uint32_t *minimum, uint32_t *preferred,
                   uint32_t *maximum)
{
  *minimum = 1;
  *preferred = 4096;
  *maximum = 32 * 1024 * 1024;
  return 0;
}

static int
plugin_can_cache (void *handle)
{
  return NBDKIT_CACHE_NATIVE;
}

static int
plugin_errno (int r)
{
  errno = -r;
  return -1;
}

static int
plugin_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  glue_stream_enter ();
  int r = qcow2_read (image, buf, count, offset);
  glue_stream_leave ();
  return r < 0 ? plugin_errno (r) : 0;
}

/* NBD_CMD_CACHE, answered as qemu-nbd answers it: the range is read,
 * so that its L2 slices are in the cache and its data (and that of the
 * backing files) in the host's page cache.
 */
static int
plugin_cache (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  const uint32_t chunk = 1024 * 1024;
  void *buf = malloc (count < chunk ? count : chunk);
  int r = 0;

  if (!buf) {
    nbdkit_error ("cache: %s", errstr (errno));
    return -1;
  }
  while (count > 0 && r == 0) {
    uint32_t n = count < chunk ? count : chunk;

    r = qcow2_read (image, buf, n, offset);
    offset += n;
    count -= n;
  }
  free (buf);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_pwrite (void *handle, const void *buf, uint32_t count,
               uint64_t offset, uint32_t flags)
{
  glue_stream_enter ();
  int r = qcow2_write (image, buf, count, offset, flags & NBDKIT_FLAG_FUA);
  glue_stream_leave ();
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  int r = qcow2_zero (image, count, offset, flags & NBDKIT_FLAG_MAY_TRIM,
                      flags & NBDKIT_FLAG_FAST_ZERO, flags & NBDKIT_FLAG_FUA);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  int r = qcow2_trim (image, count, offset, flags & NBDKIT_FLAG_FUA);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_flush (void *handle, uint32_t flags)
{
  int r = qcow2_flush (image);

  glue_flushed (image);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_add_extent (void *opaque, uint64_t offset, uint64_t length,
                   uint32_t type)
{
  return nbdkit_add_extent (opaque, offset, length, type) == -1 ? -errno : 0;
}

static int
plugin_extents (void *handle, uint32_t count, uint64_t offset,
                uint32_t flags, struct nbdkit_extents *extents)
{
  int r = qcow2_extents (image, offset, count, flags & NBDKIT_FLAG_REQ_ONE,
                         plugin_add_extent, extents);
  return r < 0 ? plugin_errno (r) : 0;
}

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static struct nbdkit_plugin plugin = {
  .name              = "qcow2",
  .longname          = "nbdkit qcow2 plugin",
  .version           = PACKAGE_VERSION,
  .load              = plugin_load,
  .unload            = plugin_unload,
  .config            = plugin_config,
  .config_complete   = plugin_config_complete,
  .config_help       = plugin_config_help,
  .magic_config_key  = "file",
  .dump_plugin       = glue_dump_plugin,
  .get_ready         = plugin_get_ready,
  .after_fork        = plugin_after_fork,
  .cleanup           = plugin_cleanup,
  .export_description = plugin_export_description,
  .open              = plugin_open,
  .close             = plugin_close,
  .get_size          = plugin_get_size,
  .can_write         = plugin_can_write,
  .can_flush         = plugin_can_flush,
  .can_fua           = plugin_can_fua,
  .can_trim          = plugin_can_trim,
  .can_zero          = plugin_can_zero,
  .can_fast_zero     = plugin_can_fast_zero,
  .can_multi_conn    = plugin_can_multi_conn,
  .can_extents       = plugin_can_extents,
  .can_cache         = plugin_can_cache,
  .block_size        = plugin_block_size,
  .pread             = plugin_pread,
  .cache             = plugin_cache,
  .pwrite            = plugin_pwrite,
  .zero              = plugin_zero,
  .trim              = plugin_trim,
  .flush             = plugin_flush,
  .extents           = plugin_extents,
  .errno_is_preserved = 1,
};

NBDKIT_REGISTER_PLUGIN (plugin)
