/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit qcow2 filter: the qcow2 engine over whatever the plugin below
 * serves (a file, another NBD server, SSH, HTTP, an xz archive ...).
 * One engine serves every connection, over one context into the plugin
 * opened at after_fork (a "shared" context), so that all connections
 * see one image, as with the plugin.  Backing files are local files or
 * remote storage (URLs, json: names), as with the plugin.
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

#include <nbdkit-filter.h>

#include "checked.h"
#include "errstr.h"
#include "fileio.h"
#include "filter.h"
#include "glue.h"
#include "iszero.h"
#include "qcow2.h"

/* nbdkit 1.35.9 gave filters a dump_plugin callback; before it, the
 * filter's keys are printed at unload, which nbdkit --dump-plugin
 * reaches right after printing the plugin's.
 */
#define HAVE_FILTER_DUMP_PLUGIN GLUE_NBDKIT_AT_LEAST (35, 9)

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

/* create=true: format the plugin's export (if empty) at open. */
static bool create;

/* How often nbdkit loaded the filter: the same filter given twice is
 * one shared object, loaded twice, whose state the two would share.
 */
static unsigned load_count;

/* What the engine made of the plugin's export (below.c has the
 * context into it).  Set at after_fork, fixed until cleanup.
 */
static struct qcow2_image *image;

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
  { "qcow2-password", GLUE_FN, .any_value = true,
    .fn = glue_config_password },
  { "qcow2-passphrase", GLUE_FN, .any_value = true,
    .fn = glue_config_password },
  { "qcow2-backing-password", GLUE_FN, .any_value = true,
    .fn = glue_config_backing_password },
  { "qcow2-backing-passphrase", GLUE_FN, .any_value = true,
    .fn = glue_config_backing_password },
};

static void
qcow2_filter_load (void)
{
  glue_load ("qcow2", "qcow2-password", GLUE_IO_THREADS_FILTER);
  glue_env.backing_password_key = "qcow2-backing-password";
  load_count++;
}

static void
qcow2_filter_unload (void)
{
#if !HAVE_FILTER_DUMP_PLUGIN
  if (glue_dump_asked ())
    glue_dump_plugin ();
#endif
  glue_unload ();
  free (backing_dir);
  free (start_dir);
  for (unsigned i = 0; i < backing_chain_len; i++)
    free (backing_chain[i]);
  free (backing_chain);
  below_unload ();
  overlay_unload ();
}

/* Our keys, and the plugin's (passed on). */
static int
qcow2_filter_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                     const char *key, const char *value)
{
  int r = overlay_config (key, value);

  if (r == 0)
    r = glue_config (filter_options,
                     sizeof filter_options / sizeof *filter_options,
                     key, value, NULL);
  if (r == 0 && below_config (key, value) == -1)
    return -1;
  if (r == 0)
    return next (nxdata, key, value);
  return r == 1 ? 0 : -1;
}

static int
qcow2_filter_config_complete (nbdkit_next_config_complete *next,
                              nbdkit_backend *nxdata)
{
  if (load_count > 1) {
    nbdkit_error ("--filter=qcow2 is given %u times", load_count);
    glue_hint ("one qcow2 filter serves the image (the same filter loaded "
               "twice would share its state)");
    return -1;
  }
  if (below_config_complete () == -1)
    return -1;
  if (glue_config_complete () == -1 ||
      overlay_config_complete (create, backing_chain_len > 0) == -1)
    return -1;
  if (!create && glue.create.first_key && !overlay_active ()) {
    nbdkit_error ("%s= describes an image to make: it needs create=true",
                  glue.create.first_key);
    return -1;
  }
  if (create && glue.create.size == -1) {
    nbdkit_error ("create=true needs virtual-size=");
    glue_hint ("virtual-size= is the size of the disk the image made in "
               "the plugin's export holds");
    return -1;
  }
  if (create && glue_create_check_password ("create=true") == -1)
    return -1;
  if (create && backing_chain_len > 0) {
    nbdkit_error ("create=true makes an image without a backing file");
    glue_hint ("backing= names the chain of an image served: give one of "
               "create=true and backing=");
    return -1;
  }
  /* Checked before anything is written: the export of a plugin has no
   * way to give space without writing it.
   */
  if (glue.create.opts.preallocation == QCOW2_PREALLOC_FALLOC &&
      !overlay_active ()) {
    nbdkit_error ("preallocation=falloc: a plugin's export cannot allocate "
                  "space");
    glue_hint ("preallocation=full can: it writes the space");
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
  "backing=<NAME>                  The image's backing file, a file or a URL\n" \
  "                                (repeat for the chain below it;\n" \
  "                                backing=none ends it).\n" \
  "backing-dir=<DIR>               Where relative backing file names are\n" \
  "                                (default: the folder of the file the\n" \
  "                                plugin serves, else the current directory).\n" \
  "qcow2-password=<PASSWORD>|-|+FILE|-FD  The password of a LUKS image\n" \
  "                                (also qcow2-passphrase=).\n" \
  "qcow2-backing-password=<PASSWORD>  That of the next backing file.\n" \
  OVERLAY_CONFIG_HELP \
  GLUE_CONFIG_HELP \
  "io-threads=<N>                  Threads doing the pieces of a fragmented\n" \
  "                                request at once (default 16, 0: none).\n" \
  "create=true                     Make a new image in the export, which\n" \
  "                                must hold no data, as below (which a new\n" \
  "                                qcow2-overlay= FILE takes too).\n" \
  "virtual-size=<SIZE>             Its virtual size.\n" \
  GLUE_CREATE_HELP \
  "preallocation=off|metadata|full  As qemu-img's (off).  A new\n" \
  "                                qcow2-overlay= FILE: falloc too, each\n" \
  "                                with extended-l2=on.\n" \
  GLUE_CREATE_SPELLINGS_HELP

/* create=true reads at most this much of the export to check that it
 * is empty: what the plugin's block status does not report as zeros
 * (all of it, for a plugin without block status).  Past it the export
 * is refused: reading a whole large disk, maybe over a network, before
 * serving it would take long.  The man page and the hint say it.
 */
#define CREATE_READ_MAX (UINT64_C (1) << 30)
#define CREATE_READ_MAX_TEXT "1 GiB"

/* Checks whether the export, read through scan, is empty, for
 * create=true: every run that block status does not report as zeros
 * is read, in the order of the disk.  Returns 0 if it is, else -1
 * after logging an error (the first byte of data, or too much to
 * read).
 */
static int
qcow2_filter_check_empty (struct qcow2_io *scan, const char *name,
                          uint64_t size)
{
  const size_t chunk = 1u << 20;
  uint64_t offset = 0, nread = 0;
  uint8_t *buf;
  int r = 0;

  if (!(buf = malloc (chunk))) {
    nbdkit_error ("malloc: %s", errstr (errno));
    return -1;
  }
  while (r == 0 && offset < size) {
    uint32_t type;
    uint64_t run;

    r = scan->ops->status (scan, offset, size - offset, &type, &run);
    if (r < 0) {
      nbdkit_error ("create=true: block status of %s at offset %" PRIu64
                    ": %s", name, offset, errstr (-r));
      break;
    }
    run = MIN (run, size - offset);
    if (type & QCOW2_EXTENT_ZERO) {
      offset += run;
      continue;
    }
    for (uint64_t end = offset + run; r == 0 && offset < end; ) {
      size_t len = MIN (chunk, end - offset);

      if (nread + len > CREATE_READ_MAX) {
        nbdkit_error ("create=true: %s may hold data: block status "
                      "reports more than " CREATE_READ_MAX_TEXT " of it "
                      "as data, of which " CREATE_READ_MAX_TEXT " was read, "
                      "all zeros (to offset %" PRIu64 "): only an export "
                      "known to be empty is formatted", name, offset);
        glue_hint ("if it holds nothing you need, \"qemu-img create -f "
                   "qcow2\" formats it without this check; an export "
                   "whose free space block status reports as zeros (a "
                   "sparse file) is checked whatever its size");
        r = -1;
        break;
      }
      r = scan->ops->pread (scan, buf, len, offset);
      if (r < 0) {
        nbdkit_error ("create=true: reading %s at offset %" PRIu64 ": %s",
                      name, offset, errstr (-r));
        break;
      }
      nread += len;
      if (!is_zero (buf, len)) {
        size_t i = 0;

        while (buf[i] == 0)
          i++;
        nbdkit_error ("create=true: %s is not empty (data at offset %"
                      PRIu64 "): only an empty export is formatted",
                      name, offset + i);
        r = -1;
        break;
      }
      offset += len;
    }
  }
  free (buf);
  return r < 0 ? -1 : 0;
}

/* Checks whether create=true may make an image in the export, read through
 * scan (whose status answers block status): it must be writable, empty
 * (no data anywhere: not an image, a partition table or a file system
 * someone would miss) and large enough.  Returns 0, or -1 after
 * logging an error.
 */
static int
qcow2_filter_create_check (struct qcow2_io *scan, const char *name,
                           bool readonly)
{
  uint64_t size = scan->ops->size (scan), need;

  if (readonly) {
    nbdkit_error ("create=true: the export is read-only");
    glue_hint ("it is made read-only by nbdkit -r, readonly=true, or a "
               "plugin that cannot write");
    return -1;
  }
  if (qcow2_create_bytes (&glue_env, &glue.create.opts,
                          glue.create.opts.preallocation != QCOW2_PREALLOC_OFF,
                          &need) < 0)
    return -1;
  if (need > size) {
    nbdkit_error ("create=true: %s is %" PRIu64 " bytes, and the image's "
                  "metadata%s needs %" PRIu64 " (virtual-size=%" PRIu64
                  ", %" PRIu64 "-byte clusters)", name, size,
                  glue.create.opts.preallocation != QCOW2_PREALLOC_OFF ?
                  " with its data preallocated" : "", need,
                  glue.create.opts.size,
                  glue.create.opts.cluster_size ? glue.create.opts.cluster_size
                                                : 65536);
    glue_hint ("give the export more, or the disk less");
    return -1;
  }
  return qcow2_filter_check_empty (scan, name, size);
}

/* For create=true, makes a new image in io, the plugin's export (size
 * bytes), checked first.  Returns 0, or -1 after logging an error.
 */
static int
qcow2_filter_create (struct qcow2_io *io, const char *name, int64_t size,
                     bool readonly)
{
  /* An io of its own, whose status answers from the plugin's extents
   * (the image's io is made without them).
   */
  struct qcow2_io *scan = below_nextio_new (size,
                                            NEXTIO_READONLY | NEXTIO_EXTENTS);
  int r;

  if (!scan)
    return -1;
  r = qcow2_filter_create_check (scan, name, readonly);
  scan->ops->close (scan);
  if (r == -1)
    return -1;
  if (qcow2_create (&glue_env, io, &glue.create.opts) < 0)
    return -1;
  nbdkit_debug ("create: a %" PRIu64 "-byte image made in %s",
                glue.create.opts.size, name);
  return 0;
}

/* Sets where relative backing file names are (see backing_dir), and
 * the name the engine knows the image by: file's path (the local file
 * the plugin serves as the image, or NULL), else the plugin and its
 * keys.  Then resolves the names of backing= there.  Returns 0, or -1
 * after logging an error.
 */
static int
qcow2_filter_name_files (const char *file, const char **name, char **dir)
{
  if (backing_dir || !file)
    *dir = strdup (backing_dir ? backing_dir : start_dir);
  else {
    assert (file[0] == '/');    /* nbdkit_absolute_path made it */
    *dir = strndup (file, strrchr (file, '/') - file);
  }
  if (!*dir) {
    nbdkit_error ("strdup: %s", errstr (errno));
    return -1;
  }
  *name = file ? file : below_name ();
  for (unsigned i = 0; i < backing_chain_len; i++) {
    char *path;

    if (!qcow2_name_is_relative (backing_chain[i]))
      continue;
    if (asprintf (&path, "%s%s%s", *dir, strcmp (*dir, "/") ? "/" : "",
                  backing_chain[i]) == -1) {
      nbdkit_error ("asprintf: %s", errstr (errno));
      return -1;
    }
    free (backing_chain[i]);
    backing_chain[i] = path;
  }
  glue.engine.backing_chain = (const char *const *) backing_chain;
  glue.engine.backing_chain_len = backing_chain_len;
  return 0;
}

/* An export (read through io) that is not an image: if it starts with
 * zeros, it is likely a new one, for create=true (which checks all of
 * it).
 */
static void
qcow2_filter_hint_empty (struct qcow2_io *io, const char *name)
{
  char buf[4096];
  int64_t size = io->ops->size (io);
  uint32_t len = MIN (size, (int64_t) sizeof buf);
  int r = size < 0 ? -1 : io->ops->pread (io, buf, len, 0);

  if (r == 0 && (len == 0 || (buf[0] == 0 &&
                              memcmp (buf, buf + 1, len - 1) == 0)))
    glue_hint ("%s holds no image yet (it starts with zeros): "
               "create=true virtual-size=SIZE makes one in it if no data "
               "is found (it reads what block status does not report as "
               "zeros, up to " CREATE_READ_MAX_TEXT ")", name);
}

/* The image opened once, read-write if the plugin is writable and
 * neither nbdkit -r nor readonly=true says otherwise.
 */
static int
qcow2_filter_open_image (nbdkit_backend *backend)
{
  bool asked_readonly = glue.engine.readonly || glue_server_readonly ();
  bool readonly = asked_readonly;
  const char *name;
  struct qcow2_io *io;
  char *dir;
  int64_t size;
  int w, r;

  glue.engine.debug_cache = qcow2_debug_cache;
  if (overlay_standalone ())
    return overlay_open (-1, &image);
  /* The plugin under an overlay is only read. */
  if (below_open (backend, readonly || overlay_active (), &size) == -1)
    return -1;
  if (overlay_active ())
    return overlay_open (size, &image);
  if (!readonly && (w = below_can_write ()) != 1) {
    if (w == -1)
      return -1;
    readonly = true;
  }
  glue.engine.readonly = readonly;
  if (below_lock_file (readonly) == -1)
    return -1;
  if (qcow2_filter_name_files (below_local_file (), &name, &dir) == -1)
    return -1;
  glue.engine.names_dir = below_local_file () && !backing_dir ? NULL : dir;
  if (!(io = below_nextio_new (size, readonly ? NEXTIO_READONLY : 0))) {
    free (dir);
    return -1;
  }
  if (create && qcow2_filter_create (io, name, size, readonly) == -1) {
    io->ops->close (io);
    free (dir);
    return -1;
  }
  image = qcow2_open (&glue_env, io, name, &glue.engine);
  free (dir);
  glue.engine.names_dir = NULL;
  /* The image and its backing files are open: their keys are made. */
  glue_forget_password ();
  if (!image) {
    if ((errno == ENODATA || errno == EMEDIUMTYPE) &&
        (io = below_nextio_new (size, NEXTIO_READONLY)) != NULL) {
      qcow2_filter_hint_empty (io, name);
      io->ops->close (io);
    }
    return -1;
  }
  r = glue_opened (image, name, asked_readonly,
                   readonly && !asked_readonly ?
                   "the plugin below cannot write" : NULL);
  if (r == 0 && create &&
      qcow2_preallocate (image, glue.create.opts.preallocation) < 0)
    r = -1;
  if (r == 0 && glue.repair_leaks)
    r = glue_repair (image, name);
  return r;
}

/* The engine's debug messages in qcow2_filter_probe, which opens the
 * image read-only whatever is served.
 */
static void
qcow2_filter_probe_debug (void *opaque, const char *msg)
{
  nbdkit_debug ("before the fork: %s", msg);
}

/* Before nbdkit forks, when the disk below is a local file that
 * nbdkit's file plugin serves with no filter between: what after_fork
 * would refuse of it is refused now, so that the refusal reaches the
 * terminal and nbdkit's exit status (by after_fork nbdkit has forked
 * into the background, and logs to syslog).  The file is opened as the
 * plugin opens it (read-only if it cannot be written) and locked as
 * below_lock_file locks it, so that a lock QEMU holds is refused; the
 * image opened read-only with the same keys (create=true: the checks
 * of the export, if a regular file) and closed: nothing written, no
 * lock held across the fork.  after_fork opens it again (the file may
 * change in between).  Returns 0, or -1 after logging an error.
 */

static int
qcow2_filter_probe (void)
{
  bool asked_readonly = glue.engine.readonly || glue_server_readonly ();
  bool readonly = asked_readonly, regular;
  const char *file = below_direct_file (&regular), *name;
  struct fileio_options fo = glue_file_options, backing_fo;
  struct qcow2_env env = glue_env;
  struct qcow2_options opts;
  struct qcow2_image *img;
  struct qcow2_io *io;
  char *why = NULL, *dir;
  int r, e;

  if (!file || overlay_active ())
    return 0;
  fo.notice = NULL;             /* logged once, after the fork */
  backing_fo = fo;
  fo.direct = false;            /* the plugin's own reads are not */
  io = fileio_open_with (file, readonly, &fo, &why);
  if (!io && !readonly && (errno == EACCES || errno == EROFS)) {
    readonly = true;
    io = fileio_open_with (file, true, &fo, &why);
  }
  if (!io) {
    glue_file_error (why, errno, "%s", file);
    return -1;
  }
  if (qcow2_filter_name_files (regular ? file : NULL, &name, &dir) == -1) {
    io->ops->close (io);
    return -1;
  }
  /* A block device has no holes to seek (EINVAL): the plugin's reads
   * check it after the fork.
   */
  if (create) {
    r = regular ? qcow2_filter_create_check (io, name, readonly) : 0;
    io->ops->close (io);
    free (dir);
    return r;
  }
  opts = glue.engine;
  opts.names_dir = regular && !backing_dir ? NULL : dir;
  opts.readonly = true;
  opts.copy_on_read = false;
  opts.io_threads = 0;          /* no threads before the fork */
  /* Notices are logged once, after the fork. */
  env.opaque = &backing_fo;
  env.notice = NULL;
  env.debug = qcow2_filter_probe_debug;
  img = qcow2_open (&env, io, name, &opts);
  e = errno;
  free (dir);
  if (!img) {
    if ((e == ENODATA || e == EMEDIUMTYPE) &&
        (io = fileio_open_with (file, true, &fo, NULL)) != NULL) {
      qcow2_filter_hint_empty (io, name);
      io->ops->close (io);
    }
    return -1;
  }
  r = glue_opened_check (img, name, asked_readonly);
  qcow2_close (img);
  return r;
}

static int
qcow2_filter_get_ready (int thread_model)
{
  /* No pool of threads calling a plugin that takes one request at a
   * time: they would only wait for each other.
   */
  if (below_get_ready (thread_model))
    glue.engine.io_threads = 0;
  /* Before nbdkit forks: a refusal then reaches the terminal. */
  if (qcow2_filter_probe () == -1 || overlay_get_ready () == -1)
    return -1;
  glue_start_watch ();
  return 0;
}

/* An image that cannot be served ends nbdkit at start, with its
 * reason, heard where nbdkit was started.
 */
static int
qcow2_filter_after_fork (nbdkit_backend *backend)
{
  int r;

  glue_start_begin ();
  r = qcow2_filter_open_image (backend);
  glue_start_end (r == 0);
  return r;
}

static void
qcow2_filter_cleanup (nbdkit_backend *backend)
{
  glue_stream_stop ();
  if (image && qcow2_close (image) < 0)
    nbdkit_error ("closing the image failed: its last changes may not be "
                  "durable");
  image = NULL;
  below_cleanup ();
}

/* Connections use the shared engine, not a context of their own. */
static void *
qcow2_filter_open (nbdkit_next_open *next, nbdkit_context *context,
                   int readonly, const char *exportname, int is_tls)
{
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static void
qcow2_filter_close (void *handle)
{
  glue_close_stats (image);
}

static int64_t
qcow2_filter_get_size (nbdkit_next *next, void *handle)
{
  assert (image != NULL);       /* opened at after_fork, or no server */
  return qcow2_get_size (image);
}

static int
qcow2_filter_can_write (nbdkit_next *next, void *handle)
{
  return qcow2_can_write (image);
}

/* Flush, fast zero, multi-conn, block status: always. */
static int
qcow2_filter_yes (nbdkit_next *next, void *handle)
{
  return 1;
}

/* Zeroes go to the engine (zero flags), not written as zeros by
 * nbdkit, as a filter's can_zero of 1 (NBDKIT_ZERO_EMULATE) asks.
 */
static int
qcow2_filter_can_zero (nbdkit_next *next, void *handle)
{
  return NBDKIT_ZERO_NATIVE;
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
  return overlay_can_cache ();
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
  return glue_stream_description ();
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
  int r;

  glue_stream_enter ();
  /* As QEMU's copy-on-read, a fill that fails fails the read. */
  r = overlay_fills_reads () ? qcow2_fill (image, count, offset) : 0;
  if (r == 0)
    r = qcow2_read (image, buf, count, offset);
  glue_stream_leave ();
  return qcow2_filter_result (r, err);
}

static int
qcow2_filter_pwrite (nbdkit_next *next, void *handle, const void *buf,
                     uint32_t count, uint64_t offset, uint32_t flags,
                     int *err)
{
  glue_stream_enter ();
  int r = qcow2_write (image, buf, count, offset, flags & NBDKIT_FLAG_FUA);
  glue_stream_leave ();
  return qcow2_filter_result (r, err);
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
  int r = qcow2_flush (image);

  glue_flushed (image);
  return qcow2_filter_result (r, err);
}

/* Copy-on-read of the range (see overlay_can_cache), when it is on. */
static int
qcow2_filter_cache (nbdkit_next *next, void *handle, uint32_t count,
                    uint64_t offset, uint32_t flags, int *err)
{
  if (!overlay_fills_cache ())
    return 0;
  return qcow2_filter_result (qcow2_fill (image, count, offset), err);
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
#if HAVE_FILTER_DUMP_PLUGIN
  .dump_plugin       = glue_dump_plugin,
#endif
  .get_ready         = qcow2_filter_get_ready,
  .after_fork        = qcow2_filter_after_fork,
  .cleanup           = qcow2_filter_cleanup,
  .open              = qcow2_filter_open,
  .close             = qcow2_filter_close,
  .get_size          = qcow2_filter_get_size,
  .block_size        = qcow2_filter_block_size,
  .can_write         = qcow2_filter_can_write,
  .can_flush         = qcow2_filter_yes,
  .can_fua           = qcow2_filter_can_fua,
  .can_trim          = qcow2_filter_can_trim,
  .can_zero          = qcow2_filter_can_zero,
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
  .cache             = qcow2_filter_cache,
  .extents           = qcow2_filter_extents,
};

NBDKIT_REGISTER_FILTER (filter)
