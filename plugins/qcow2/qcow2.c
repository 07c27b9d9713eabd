/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit qcow2 plugin: the glue between nbdkit and the qcow2 engine in
 * common/qcow2.  Open images are kept in one table (fleet), each shared
 * by every connection to its export; the engine does its own locking.
 * file=: one image, opened in get_ready, held to the end.  dir=: every
 * image of a folder is an export of its name, opened at its first
 * client's open and closed idle-close= seconds after its last one left.
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "errstr.h"
#include "fileio.h"
#include "glue.h"
#include "lock.h"
#include "qcow2.h"

static char *filename;
/* data-file=: absolute (opened), and as given (recorded by create=). */
static char *data_file;
static char *data_file_name;

/* An open image, and the handle of each connection to it. */
struct plugin_export {
  struct plugin_export *next;
  char *name;                   /* the export name (file=: the file's) */
  char *path;                   /* the file opened, every link resolved */
  struct qcow2_image *image;    /* NULL while opening */
  /* stream=true: the image's job (NULL: stream= off, or dir='s image
   * has no backing file), and (dir=) what the description says of the
   * image as it was opened, while the job may still cut it loose.
   */
  struct glue_stream_job *job;
  char *info;
  /* The engine's environment of the image (dir=: quiet while a first
   * try may fail, see fleet_open_image).
   */
  struct qcow2_env env;
  enum { EXPORT_OPENING, EXPORT_OPEN, EXPORT_CLOSING } state;
  /* Deleted or replaced in the folder since it was opened: served to
   * its clients still, found by no new one, closed when they leave.
   */
  bool stale;
  dev_t dev;
  ino_t ino;
  unsigned users;               /* connections (file=: one more, held) */
  struct timespec idle_since;   /* when users fell to 0 */
};

/* The table of open images, and dir='s keys.  Its fields are guarded
 * by lock (clang 14 cannot mark fields of a C struct guarded: the
 * functions using them are marked TSA_REQUIRES (&fleet.lock)), but the
 * keys, set before any connection.
 */
static struct plugin_fleet {
  struct lock lock;
  /* An export's state changed (for openers waiting on it). */
  pthread_cond_t changed;
  /* An export fell idle, or the server stops: the idle sweeper's own,
   * so that opening an export does not wake it for nothing.
   */
  pthread_cond_t idle;
  struct plugin_export *exports;
  unsigned count;               /* entries in exports */
  pthread_t sweeper;            /* closes idle images (idle_close > 0) */
  bool sweeper_running, stopping;
  /* The keys: dir= (resolved), default-export=, template=,
   * idle-close= (seconds), max-exports= (0: no bound).
   */
  char *dir;
  char *default_export;
  char *template;
  uint64_t idle_close;
  uint64_t max_exports;
  int dirfd;                    /* dir=, opened */
  char *template_path;          /* template=, as a path (DIR/NAME) */
  mode_t umask;                 /* what new files' modes lack */
  const char *key;              /* the first of those keys given */
  /* The environment of the images, and the backing layers they share
   * (made at get_ready).
   */
  struct qcow2_env env;
  struct qcow2_layers *layers;
} fleet = {
  .lock = LOCK_INITIALIZER,
  .idle_close = 5, .dirfd = -1,
};

/* create=true or create=if-missing: make the image at get_ready. */
static enum { CREATE_NO, CREATE_YES, CREATE_IF_MISSING } create;
static char *create_backing;

/* Why dir= refuses an export name, or NULL: a name only ever names a
 * file directly in the folder, never one outside it, nor a hidden one
 * (template= makes new images under hidden names).
 */
static const char *
fleet_name_refusal (const char *name)
{
  if (strlen (name) > 255)
    return "it is longer than 255 bytes";
  if (name[0] == '.')
    return "it starts with '.'";
  if (strchr (name, '/'))
    return "it holds a '/'";
  if (strstr (name, ".."))
    return "it holds \"..\"";
  for (const char *c = name; *c; c++)
    if ((unsigned char) *c < 0x20 || *c == 0x7f)
      return "it holds a control byte";
  return NULL;
}

/* The entry of the export name (not stale), or NULL. */
static struct plugin_export *
fleet_find (const char *name)
  TSA_REQUIRES (&fleet.lock)
{
  for (struct plugin_export *e = fleet.exports; e; e = e->next)
    if (!e->stale && strcmp (e->name, name) == 0)
      return e;
  return NULL;
}

/* A new entry, in the table. */
static struct plugin_export *
fleet_add (const char *name)
  TSA_REQUIRES (&fleet.lock)
{
  struct plugin_export *e = calloc (1, sizeof *e);

  if (!e || !(e->name = strdup (name))) {
    nbdkit_error ("export \"%s\": %s", name, errstr (errno));
    free (e);
    return NULL;
  }
  e->state = EXPORT_OPENING;
  e->users = 1;
  e->next = fleet.exports;
  fleet.exports = e;
  fleet.count++;
  return e;
}

/* e out of the table, and freed (its image closed or never opened). */
static void
fleet_remove (struct plugin_export *e)
  TSA_REQUIRES (&fleet.lock)
{
  struct plugin_export **p = &fleet.exports;

  while (*p != e)
    p = &(*p)->next;
  *p = e->next;
  fleet.count--;
  free (e->name);
  free (e->path);
  free (e->info);
  free (e);
  pthread_cond_broadcast (&fleet.changed);
}

/* Close the image of e, and drop e.  The lock is let go meanwhile (a
 * flush may take long), e marked closing: an open of its name waits
 * (its file's locks are held until it is closed).  Its stream stops
 * where it is, and goes on from there when the image opens again.
 */
static void
fleet_close (struct plugin_export *e)
  TSA_REQUIRES (&fleet.lock)
{
  e->state = EXPORT_CLOSING;
  lock_release (&fleet.lock);
  glue_stream_job_free (e->job);
  e->job = NULL;
  if (e->image && qcow2_close (e->image) < 0)
    nbdkit_error ("%s: closing the image failed: its last changes may not "
                  "be durable", e->path);
  lock_acquire (&fleet.lock);
  fleet_remove (e);
}

static void
fleet_close_all (void)
  TSA_EXCLUDES (&fleet.lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet.lock);
  while (fleet.exports)
    fleet_close (fleet.exports);
}

static void
plugin_load (void)
{
  glue_load ("qcow2", "password", GLUE_IO_THREADS);
  /* idle-close= waits on the monotonic clock: a change of the time of
   * day must not close an image early or keep it open for long.
   */
  lock_cond_init (&fleet.changed);
  lock_cond_init (&fleet.idle);
  /* Read (by setting it) while no other thread may make a file. */
  fleet.umask = umask (022);
  umask (fleet.umask);
}

static void
plugin_unload (void)
{
  fleet_close_all ();
  free (glue_stream.base);
  qcow2_layers_free (fleet.layers);
  free (filename);
  free (data_file);
  free (data_file_name);
  glue_unload ();
  free (create_backing);
  if (fleet.dirfd >= 0)
    close (fleet.dirfd);
  free (fleet.dir);
  free (fleet.default_export);
  free (fleet.template);
  free (fleet.template_path);
  pthread_cond_destroy (&fleet.changed);
  pthread_cond_destroy (&fleet.idle);
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

/* dir=: a folder, resolved (what is in it is what it holds once
 * every link is followed).
 */
static int
plugin_config_dir (const char *key, const char *value)
{
  return glue_parse_folder (key, value, &fleet.dir);
}

/* The keys that only go with dir=. */
static int
plugin_config_fleet (const char *key, const char *value)
{
  char **dest = strcmp (key, "template") == 0 ? &fleet.template
    : strcmp (key, "default-export") == 0 ? &fleet.default_export : NULL;

  if (!fleet.key)
    fleet.key = strcmp (key, "template") == 0 ? "template"
      : strcmp (key, "default-export") == 0 ? "default-export"
      : strcmp (key, "idle-close") == 0 ? "idle-close" : "max-exports";
  if (strcmp (key, "idle-close") == 0)
    return glue_parse_number (key, value, "seconds", 86400,
                              &fleet.idle_close);
  if (strcmp (key, "max-exports") == 0)
    return glue_parse_range (key, value, "images", 1, 1000000,
                             &fleet.max_exports);
  free (*dest);
  *dest = strdup (value);
  return *dest ? 0 : -1;
}

#define WORDS(...) (const char *const []) { __VA_ARGS__, NULL }

/* The plugin's own keys (glue.c has those the filter takes too). */
static const struct glue_option plugin_options[] = {
  /* Absolute, since nbdkit may change directory; backing file names
   * resolve against the image's folder.
   */
  { "file", GLUE_PATH, .dest = &filename },
  { "dir", GLUE_FN, .fn = plugin_config_dir },
  { "default-export", GLUE_FN, .fn = plugin_config_fleet },
  { "template", GLUE_FN, .fn = plugin_config_fleet },
  { "idle-close", GLUE_FN, .fn = plugin_config_fleet },
  { "max-exports", GLUE_FN, .fn = plugin_config_fleet },
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

/* dir= and what it cannot take (yet). */
static int
plugin_config_fleet_complete (void)
{
  const char *why;

  if (filename) {
    nbdkit_error ("file= and dir= exclude each other: file= serves one "
                  "image, dir= each image in a folder");
    return -1;
  }
  if (create != CREATE_NO || data_file || create_backing) {
    nbdkit_error ("%s", create != CREATE_NO
                  ? "create= makes the image of file=: with dir=, "
                    "template= makes the images of new exports"
                  : data_file ? "data-file= names the data file of one "
                    "image: not with dir="
                  : "backing=FILE describes the image create= makes: "
                    "with dir=, template=FILE makes overlays of FILE");
    return -1;
  }
  if (glue.create.first_key && !fleet.template) {
    nbdkit_error ("%s= describes an image to make: with dir=, it needs "
                  "template=", glue.create.first_key);
    return -1;
  }
  if (fleet.default_export &&
      (why = fleet_name_refusal (fleet.default_export))) {
    nbdkit_error ("default-export=%s: refused: %s", fleet.default_export,
                  why);
    return -1;
  }
  return 0;
}

static int
plugin_config_complete (void)
{
  if (fleet.dir && plugin_config_fleet_complete () == -1)
    return -1;
  if (!fleet.dir && fleet.key) {
    nbdkit_error ("%s= goes with dir=", fleet.key);
    return -1;
  }
  if (!filename && !fleet.dir) {
    nbdkit_error ("you must supply the file=<FILENAME> parameter");
    glue_hint ("or dir=<DIR>, to serve each image in the folder DIR");
    return -1;
  }
  if (!fleet.dir && create == CREATE_NO && glue.create.first_key) {
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

/* The backing file of an image being created at path: its format
 * into opts (unless given) and, unless *size is set (not -1), its size.
 * Relative names are relative to the new image's folder, as in the
 * header; remote names (URLs, json:) are opened as the engine opens
 * backing files.
 */
static int
plugin_probe_backing (const char *path, const char *backing,
                      struct qcow2_create_options *opts, int64_t *size)
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
  char *resolved = NULL;
  int r = -1;

  io = qcow2_open_name (&glue_env, path, backing, &resolved, &named_format);
  if (!io)
    goto out;
  if (!opts->backing_format)
    opts->backing_format = named_format;
  if (!opts->backing_format) {
    if (qcow2_probe (io) == 1)
      opts->backing_format = "qcow2";
    else {
      /* A raw file could hold anything, even a qcow2 header later:
       * QEMU made the format of a backing file mandatory for that.
       */
      nbdkit_error ("backing file %s is not a qcow2 image", resolved);
      glue_hint ("if it is a raw image, say so with backing-fmt=raw "
                 "(qemu-img create -F raw)");
      io->ops->close (io);
      goto out;
    }
  }
  if (strcmp (opts->backing_format, "qcow2") == 0) {
    b = qcow2_open (&glue_env, io, resolved, &probe);
    if (!b)
      goto out;
    if (*size == -1)
      *size = qcow2_get_size (b);
    qcow2_close (b);
  }
  else {
    if (*size == -1)
      *size = io->ops->size (io);
    io->ops->close (io);
  }
  r = *size >= 0 ? 0 : -1;
 out:
  free (resolved);
  return r;
}

/* What plugin_create did to the file system, undone if serving fails:
 * to the image (returned), and to its external data file.
 */
enum create_made { MADE_NOTHING, MADE_NEW_FILE, MADE_IN_EMPTY_FILE };
static enum create_made data_file_made;

/* fileio_create, and the error logged if it fails. */
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
      free (why);
    }
    else
      glue_file_error (why, e, "create: %s", path);
    errno = e;
    return NULL;
  }
  *made = existed ? MADE_IN_EMPTY_FILE : MADE_NEW_FILE;
  return io;
}

/* The options of an image to make at path (opts->backing, if any,
 * probed: its format and, if size is -1, its size): checked.  Returns 0,
 * or -1 after logging an error.
 */
static int
plugin_create_options (const char *path, struct qcow2_create_options *opts,
                       int64_t size)
{
  if (opts->backing &&
      plugin_probe_backing (path, opts->backing, opts, &size) == -1)
    return -1;
  /* Whole sectors, as qemu-img rounds it. */
  if (size > INT64_MAX - 511) {
    nbdkit_error ("size %" PRId64 " is too large", size);
    return -1;
  }
  opts->size = (size + 511) & ~INT64_C (511);
  return qcow2_create_check (&glue_env, opts) < 0 ? -1 : 0;
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
  glue.create.opts.backing = create_backing;
  glue.create.opts.data_file = data_file_name;
  if (plugin_create_options (filename, &glue.create.opts,
                             glue.create.size) == -1)
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
  "dir=<DIR>                       Or: each qcow2 image in DIR, an export\n" \
  "                                of its file name.\n" \
  "default-export=<NAME>           dir=: the export of the empty name.\n" \
  "template=<FILE>                 dir=: a new export name makes an overlay\n" \
  "                                of FILE (the create options apply).\n" \
  "idle-close=<SECS>               dir=: close an image that long after its\n" \
  "                                last client left (default 5).\n" \
  "max-exports=<N>                 dir=: at most N images open at once.\n" \
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
plugin_open_hint (const char *path, int e)
{
  if (fleet.dir)                /* the engine logged what the file is */
    return;
  if (e == ENODATA)
    glue_hint ("%s is empty: to make a new image in it, add create=true "
               "size=SIZE", path);
  else if (e == EMEDIUMTYPE && create == CREATE_IF_MISSING)
    glue_hint ("create=if-missing: %s exists but is not a qcow2 image: "
               "it is left as it is", path);
  else if (e == EMEDIUMTYPE)
    glue_hint ("if %s is a raw disk image, nbdkit's file plugin serves "
               "it: nbdkit file %s", path, path);
}

/* Open the image at path (through io if it was just made), read-write
 * where the file and the user allow it (and readonly_why is NULL):
 * the image, *readonly saying how it is served, or NULL with errno set
 * (logged; if quiet, as debug messages only).  With checked, the file
 * opened must be that one (the one path led to when it was checked).
 */
static struct qcow2_image *
plugin_open_image (const char *path, struct qcow2_io *io, bool *readonly,
                   const struct qcow2_env *env, bool quiet,
                   const struct stat *checked, const char *readonly_why)
{
  bool asked_readonly = glue.engine.readonly || glue_server_readonly ();
  /* A copy: each export of dir= opens its image with these. */
  struct qcow2_options opts = glue.engine;
  struct qcow2_image *img;
  struct stat st;
  char *why = NULL;
  int e = 0, err;

  /* A snapshot is served read-only: the file is opened so, and locked
   * as a reader, as qemu-nbd -l does (the notice below says so).
   */
  opts.readonly = asked_readonly || opts.snapshot || readonly_why;
  /* A fleet's overlays each use little of their disk; a shared remote
   * base keeps 2 MiB of what it fetched, not 32: one server's memory
   * weighs more there than its base's traffic.
   */
  opts.small_l2_slices = fleet.dir != NULL;
  if (fleet.dir)
    opts.remote_keep = UINT64_C (2) << 20;
  if (!io && !opts.readonly) {
    io = fileio_open_with (path, false, &glue_file_options, &why);
    if (!io && (errno == EACCES || errno == EROFS || errno == EPERM)) {
      e = errno;
      opts.readonly = true;
    }
  }
  if (!io && opts.readonly && !why)
    io = fileio_open_with (path, true, &glue_file_options, &why);
  if (!io) {
    const char *remedy = glue_why_remedy (why);

    err = errno;
    (quiet ? nbdkit_debug : nbdkit_error)
      ("open: %s: %s%s", path, why ? why : errstr (err),
       glue_file_options.direct && err == EINVAL ?
       " (cache=none needs O_DIRECT)" : "");
    if (remedy)
      (quiet ? nbdkit_debug : nbdkit_error) ("hint: %s", remedy);
    free (why);
    errno = err;
    return NULL;
  }
  /* A link changed between the check and the open could lead anywhere. */
  if (checked && (fileio_stat (io, &st) == -1 || !S_ISREG (st.st_mode) ||
                  st.st_dev != checked->st_dev ||
                  st.st_ino != checked->st_ino)) {
    (quiet ? nbdkit_debug : nbdkit_error)
      ("open: %s: refused: it changed while it was opened", path);
    io->ops->close (io);
    errno = EPERM;
    return NULL;
  }
  opts.debug_cache = qcow2_debug_cache;
  img = qcow2_open (env, io, path, &opts);
  if (!img) {
    err = errno;
    if (!quiet)
      plugin_open_hint (path, err);
    errno = err;
    return NULL;
  }
  if (glue_opened (img, path, asked_readonly,
                   readonly_why ? readonly_why
                   : e ? nbdkit_printf_intern ("it cannot be opened for "
                                               "writing: %s", errstr (e))
                   : NULL) == -1) {
    err = errno;
    qcow2_close (img);
    errno = err;
    return NULL;
  }
  *readonly = opts.readonly;
  return img;
}

/* The open images that no client uses. */
static unsigned
fleet_idle_count (void)
  TSA_EXCLUDES (&fleet.lock)
{
  unsigned n = 0;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet.lock);
  for (struct plugin_export *e = fleet.exports; e; e = e->next)
    n += e->state == EXPORT_OPEN && e->users == 0;
  return n;
}

static void
fleet_close_idle (void)
  TSA_EXCLUDES (&fleet.lock)
{
  struct plugin_export *e;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet.lock);
  do {
    for (e = fleet.exports; e; e = e->next)
      if (e->state == EXPORT_OPEN && e->users == 0)
        break;
    if (e)
      fleet_close (e);
  } while (e);
}

/* idle-close=: the images of exports idle that long closed, in a
 * thread of their own, woken when an export falls idle.
 */
static void *
fleet_sweep (void *arg)
  TSA_EXCLUDES (&fleet.lock)
{
  lock_acquire (&fleet.lock);
  while (!fleet.stopping) {
    struct timespec now, next = { 0, 0 };
    struct plugin_export *e;

    clock_gettime (CLOCK_MONOTONIC, &now);
    for (e = fleet.exports; e; e = e->next) {
      struct timespec due = e->idle_since;

      if (e->state != EXPORT_OPEN || e->users > 0)
        continue;
      due.tv_sec += fleet.idle_close;
      if (due.tv_sec < now.tv_sec ||
          (due.tv_sec == now.tv_sec && due.tv_nsec <= now.tv_nsec))
        break;
      if (next.tv_sec == 0 || due.tv_sec < next.tv_sec ||
          (due.tv_sec == next.tv_sec && due.tv_nsec < next.tv_nsec))
        next = due;
    }
    if (e)
      fleet_close (e);
    else if (next.tv_sec)
      lock_wait_until (&fleet.lock, &fleet.idle, &next);
    else
      lock_wait (&fleet.lock, &fleet.idle);
  }
  lock_release (&fleet.lock);
  return NULL;
}

/* The name shown in a message: control bytes as '?', cut at 64 bytes
 * (a name is untrusted: it must not forge log lines, nor flood them).
 */
static const char *
fleet_shown (const char *name, char buf[72])
{
  size_t i;

  for (i = 0; name[i] && i < 64; i++)
    buf[i] = (unsigned char) name[i] < 0x20 || name[i] == 0x7f ? '?'
                                                                : name[i];
  strcpy (buf + i, name[i] ? "..." : "");
  return buf;
}

/* The names template= makes images of. */
static bool
fleet_creatable (const char *name)
{
  static const char more[] = "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";

  return name[0] && strchr (more, name[0]) && !strchr ("._-", name[0]) &&
    strspn (name, more) == strlen (name);
}

/* The name (in dir=) removed if it still names the file ours is: what
 * another made under it meanwhile is not ours to remove.
 */
static void
fleet_unlink_ours (const char *name, const struct stat *ours)
{
  struct stat st;

  if (fstatat (fleet.dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      st.st_dev == ours->st_dev && st.st_ino == ours->st_ino)
    unlinkat (fleet.dirfd, name, 0);
}

/* template=: the image named (DIR/NAME) made, an overlay of the
 * template, under a temporary hidden name first, then linked to its
 * name: a half-made image is never served, and of two servers making
 * the same name, the second serves the first's.  0 with *iop its file,
 * locked, and *made what it is (*iop NULL: the name was taken
 * meanwhile), or -1 after logging an error.
 */
static int
fleet_create (const char *shown, const char *named, struct qcow2_io **iop,
              struct stat *made)
{
  struct qcow2_create_options opts = glue.create.opts;
  enum create_made how;
  struct qcow2_io *io = NULL;
  char *tmp = NULL;
  bool linked = false;
  int fd, r = -1;

  *iop = NULL;
  opts.backing = fleet.template;
  if (plugin_create_options (named, &opts, glue.create.size) == -1)
    return -1;
  if (asprintf (&tmp, "%s/.new-XXXXXX", fleet.dir) == -1 ||
      (fd = mkstemp (tmp)) == -1) {
    nbdkit_error ("export \"%s\": template: making a file in %s: %s", shown,
                  fleet.dir, errstr (errno));
    free (tmp);
    return -1;
  }
  /* mkstemp makes it 0600: it gets the mode open would have given. */
  if (fstat (fd, made) == -1 || fchmod (fd, 0666 & ~fleet.umask) == -1) {
    nbdkit_error ("export \"%s\": template: %s: %s", shown, tmp,
                  errstr (errno));
    close (fd);
    unlink (tmp);
    free (tmp);
    return -1;
  }
  close (fd);
  io = plugin_create_file (tmp, &how);
  if (!io)
    goto out;
  if (qcow2_create (&glue_env, io, &opts) < 0 ||
      (io->ops->flush && io->ops->flush (io) < 0))
    goto out;
  if (link (tmp, named) == -1) {
    if (errno != EEXIST) {
      nbdkit_error ("export \"%s\": template: linking %s to %s: %s", shown,
                    tmp, named, errstr (errno));
      goto out;
    }
    io->ops->close (io);
    io = NULL;
  }
  else
    linked = true;
  /* Its name durable with it: else it is not served (nor left). */
  if (fsync (fleet.dirfd) == -1) {
    nbdkit_error ("export \"%s\": template: syncing %s: %s", shown,
                  fleet.dir, errstr (errno));
    if (linked)
      fleet_unlink_ours (named + strlen (fleet.dir) + 1, made);
    goto out;
  }
  *iop = io;
  io = NULL;
  r = 0;
 out:
  if (io)
    io->ops->close (io);
  fleet_unlink_ours (tmp + strlen (fleet.dir) + 1, made);
  free (tmp);
  return r;
}

/* Whether st is the template (in dir= or not): served read-only, since
 * a write to it would change every overlay made of it.
 */
static bool
fleet_is_template (const struct stat *st)
{
  struct stat t;

  return fleet.template_path && stat (fleet.template_path, &t) == 0 &&
    t.st_dev == st->st_dev && t.st_ino == st->st_ino;
}

/* dir=: a file is known by its device and inode (a hard link to it,
 * or another path, is the same file): a backing layer is shared by
 * every image above it, and a file is never both a layer read by some
 * and an image written by another (common/qcow2/layers.c).
 */
static char *
fleet_identity_of (const struct stat *st)
{
  char *s;

  if (asprintf (&s, "file:%ju:%ju", (uintmax_t) st->st_dev,
                (uintmax_t) st->st_ino) == -1)
    return NULL;
  return s;
}

static char *
fleet_env_identity (void *opaque, const char *path)
{
  struct stat st;

  return stat (path, &st) == 0 ? fleet_identity_of (&st) : NULL;
}

/* glue_env's open, the file known as above. */
static struct qcow2_io *
fleet_env_open (void *opaque, const char *path, bool readonly, char **id)
{
  struct qcow2_io *io = glue_env.open (opaque, path, readonly, id);
  struct stat st;
  int e;

  if (!io)
    return NULL;
  free (*id);
  *id = fileio_stat (io, &st) == 0 ? fleet_identity_of (&st) : NULL;
  if (!*id) {
    e = errno;
    io->ops->close (io);
    errno = e;
    return NULL;
  }
  return io;
}

/* What an export's description says of its image; closed: the image
 * is not open (with stream=true, its stream is not running).
 */
static char *
fleet_info_text (const struct qcow2_image *img, bool closed)
{
  struct qcow2_info i;
  char *s;

  qcow2_get_info (img, &i);
  if (asprintf (&s, "qcow2, virtual size %" PRIu64 " bytes, %s%s%s", i.size,
                i.backing ? "backing file " : "no backing file",
                i.backing ? i.backing : "",
                closed && glue_stream.on && i.backing
                ? "; streaming: not running (the image streams, from "
                  "where it stands, once a client opens it)" : "") == -1)
    return NULL;
  return s;
}

/* stream=true: the job of e's image (at path) made and started.  An
 * image with no backing file has nothing to stream: it is served as it
 * is, even read-only (the template may be).  Returns 0, or -1 after
 * logging an error.
 */
static int
fleet_stream (struct plugin_export *e, const char *path)
{
  struct qcow2_info i;

  qcow2_get_info (e->image, &i);
  if (!i.backing)
    return 0;
  /* Read before the job may change it. */
  e->info = fleet_info_text (e->image, false);
  if (!e->info) {
    nbdkit_error ("%s: %s", path, errstr (errno));
    return -1;
  }
  /* nbdkit -r and readonly=true are refused at start: an image read-only
   * here is so for a reason logged as it was opened.
   */
  if (glue_stream_job_new (e->image, path, "stream", false, &e->job) == -1 ||
      glue_stream_job_start (e->job) == -1) {
    glue_stream_job_free (e->job);
    e->job = NULL;
    return -1;
  }
  return 0;
}

/* Open the image of the export of e (made first if it is missing and
 * template= is given).  Returns 0, or -1 after logging an error.  The
 * lock is not held: e is opening, which no one else touches.
 */
static int
fleet_open_image (struct plugin_export *e, const char *shown)
{
  struct qcow2_io *io = NULL;
  char *named = NULL, *real = NULL;
  bool made = false, readonly;
  const char *readonly_why;
  struct stat st, made_st;
  int r = -1, err;

  if (asprintf (&named, "%s/%s", fleet.dir, e->name) == -1) {
    nbdkit_error ("export \"%s\": %s", shown, errstr (errno));
    return -1;
  }
  real = realpath (named, NULL);
  if (!real && errno == ENOENT && fleet.template) {
    if (!fleet_creatable (e->name)) {
      nbdkit_error ("export \"%s\": no such image in %s, and template= "
                    "makes only names of [A-Za-z0-9][A-Za-z0-9._-]*", shown,
                    fleet.dir);
      goto out;
    }
    if (fleet_create (shown, named, &io, &made_st) == -1)
      goto out;
    made = io != NULL;
    real = realpath (named, NULL);
  }
  if (!real) {
    nbdkit_error ("export \"%s\": %s%s", shown, errno == ENOENT
                  ? "no such image in " : errstr (errno),
                  errno == ENOENT ? fleet.dir : "");
    goto out;
  }
  /* A link may lead anywhere: only what is in the folder is served
   * (the file opened is the one checked, by its resolved name).
   */
  if (!glue_in_folder (real, fleet.dir)) {
    nbdkit_error ("export \"%s\": refused: it is a link leading out of "
                  "dir= (to %s)", shown, real);
    goto out;
  }
  if (stat (real, &st) == -1 || !S_ISREG (st.st_mode)) {
    nbdkit_error ("export \"%s\": refused: %s is not a regular file", shown,
                  real);
    goto out;
  }
  /* An idle image of ours may hold locks refusing this one (it is a
   * backing file of this one, written; or this one is its backing file,
   * asked for writing): tried quietly first, then with the idle ones
   * closed, whose locks must not refuse a client.
   */
  readonly_why = fleet_is_template (&st) ? "it is the template= of new "
    "exports: a write would change every overlay made of it" : NULL;
  e->env = fleet.env;
  if (fleet_idle_count () == 0 || made)
    e->image = plugin_open_image (real, io, &readonly, &e->env, false, &st,
                                  readonly_why);
  else {
    e->env.error = e->env.hint = glue_debug;
    e->image = plugin_open_image (real, NULL, &readonly, &e->env, true, &st,
                                  readonly_why);
    e->env.error = glue_env.error;
    e->env.hint = glue_env.hint;
    if (!e->image) {
      fleet_close_idle ();
      e->image = plugin_open_image (real, NULL, &readonly, &e->env, false,
                                    &st, readonly_why);
    }
  }
  err = e->image ? 0 : errno;   /* plugin_open_image's own */
  io = NULL;
  if (err == EAGAIN)
    glue_hint ("it may be an export of this server that holds it: an "
               "image is not written while it is the backing file of "
               "another served");
  if (!e->image ||
      (made && qcow2_preallocate (e->image,
                                  glue.create.opts.preallocation) < 0) ||
      (glue.repair_leaks && glue_repair (e->image, real) == -1) ||
      (glue_stream.on && fleet_stream (e, real) == -1))
    goto out;
  e->path = real;
  real = NULL;
  e->dev = st.st_dev;
  e->ino = st.st_ino;
  r = 0;
 out:
  if (r == -1 && e->image) {
    qcow2_close (e->image);
    e->image = NULL;
  }
  if (r == -1 && made)
    fleet_unlink_ours (e->name, &made_st);
  if (io)
    io->ops->close (io);
  free (named);
  free (real);
  return r;
}

/* Whether the name of e still names the file e serves (not deleted,
 * not replaced).
 */
static bool
fleet_same_file (const struct plugin_export *e)
{
  struct stat st;

  return fstatat (fleet.dirfd, e->name, &st, 0) == 0 &&
    st.st_dev == e->dev && st.st_ino == e->ino;
}

/* A connection to the export name: its entry, the image opened if it
 * is not yet (it is then by this connection alone, others asking for
 * it waiting), or NULL (logged).
 */
static struct plugin_export *
fleet_open (const char *name, const char *shown)
  TSA_EXCLUDES (&fleet.lock)
{
  struct plugin_export *e;

  lock_acquire (&fleet.lock);
  for (;;) {
    e = fleet_find (name);
    if (e && e->state != EXPORT_OPEN) {
      lock_wait (&fleet.lock, &fleet.changed);
      continue;
    }
    if (e && !fleet_same_file (e)) {
      /* Its file is gone: its clients keep it, new ones do not. */
      e->stale = true;
      if (e->users == 0)
        fleet_close (e);
      continue;
    }
    if (e) {
      e->users++;
      lock_release (&fleet.lock);
      return e;
    }
    if (fleet.max_exports && fleet.count >= fleet.max_exports) {
      /* Room made by an idle one, if there is one. */
      for (e = fleet.exports; e; e = e->next)
        if (e->state == EXPORT_OPEN && e->users == 0)
          break;
      if (e) {
        fleet_close (e);
        continue;
      }
      lock_release (&fleet.lock);
      nbdkit_error ("export \"%s\": refused: max-exports=%" PRIu64 " images "
                    "are open already", shown, fleet.max_exports);
      return NULL;
    }
    break;
  }
  e = fleet_add (name);
  lock_release (&fleet.lock);
  if (!e)
    return NULL;
  if (fleet_open_image (e, shown) == -1) {
    lock_acquire (&fleet.lock);
    fleet_remove (e);
    lock_release (&fleet.lock);
    return NULL;
  }
  lock_acquire (&fleet.lock);
  e->state = EXPORT_OPEN;
  pthread_cond_broadcast (&fleet.changed);
  lock_release (&fleet.lock);
  return e;
}

/* A connection to e ended: its image closed if it was the last, now
 * or idle-close= seconds later.
 */
static void
fleet_release (struct plugin_export *e)
  TSA_EXCLUDES (&fleet.lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet.lock);
  assert (e->users > 0);
  if (--e->users > 0)
    return;
  if (e->stale || !fleet.sweeper_running)
    fleet_close (e);
  else {
    clock_gettime (CLOCK_MONOTONIC, &e->idle_since);
    pthread_cond_signal (&fleet.idle);
  }
}

/* What the description of the open export e says: its image, and
 * with stream=true how far its stream got.  Until the stream has ended,
 * its image as it was opened (the job may cut it loose at any time).
 */
static char *
fleet_export_text (struct plugin_export *e)
{
  bool settled;
  const char *progress = glue_stream_job_description (e->job, &settled);
  char *info = settled ? fleet_info_text (e->image, false)
                       : strdup (e->info);
  char *s;

  if (!info || !progress)
    return info;
  if (asprintf (&s, "%s; %s", info, progress) == -1)
    s = NULL;
  free (info);
  return s;
}

/* The description of the image at path (of the export name): NULL if
 * it is not a qcow2 image.  An image open is asked; another is read
 * without taking its locks (a writer may hold them), without its
 * backing files.
 */
static char *
fleet_describe (const char *name, const char *path)
  TSA_EXCLUDES (&fleet.lock)
{
  struct fileio_options nolock = glue_file_options;
  struct qcow2_options opts = {
    .no_backing = true, .readonly = true,
    .passwords = glue.engine.passwords,
    .passwords_len = glue.engine.passwords_len,
  };
  struct qcow2_env env = glue_env;
  struct qcow2_image *img;
  struct qcow2_io *io;
  struct stat st;
  char *s;

  lock_acquire (&fleet.lock);
  for (struct plugin_export *e = fleet.exports; e; e = e->next)
    if (e->state == EXPORT_OPEN && !e->stale &&
        strcmp (e->path, path) == 0) {
      s = fleet_export_text (e);
      lock_release (&fleet.lock);
      return s;
    }
  lock_release (&fleet.lock);

  nolock.locking = FILEIO_LOCKING_OFF;
  nolock.direct = false;
  env.opaque = &nolock;
  env.error = env.hint = glue_debug; /* a listing is no place for them */
  io = fileio_open_with (path, true, &nolock, NULL);
  if (!io)
    return NULL;
  /* Not a FIFO, a device...: no image of an export (see fleet_open). */
  if (fileio_stat (io, &st) == -1 || !S_ISREG (st.st_mode) ||
      qcow2_probe (io) != 1) {
    io->ops->close (io);
    return NULL;
  }
  img = qcow2_open (&env, io, path, &opts);
  if (!img)
    return strdup ("qcow2 (its header cannot be read here)");
  s = fleet_info_text (img, true);
  qcow2_close (img);
  return s;
}

/* dir=: each qcow2 image in the folder, as the names it may be asked
 * by (the others are not listed: they could not be opened).
 */
static int
fleet_list (struct nbdkit_exports *exports)
{
  DIR *d = opendir (fleet.dir);
  struct dirent *de;
  int r = 0;

  if (!d) {
    nbdkit_error ("list: %s: %s", fleet.dir, errstr (errno));
    return -1;
  }
  while (r == 0 && (de = readdir (d))) {
    char *named, *real, *s = NULL;

    if (fleet_name_refusal (de->d_name) ||
        asprintf (&named, "%s/%s", fleet.dir, de->d_name) == -1)
      continue;
    real = realpath (named, NULL);
    free (named);
    if (real && glue_in_folder (real, fleet.dir) &&
        (s = fleet_describe (de->d_name, real)))
      r = nbdkit_add_export (exports, de->d_name, s);
    free (s);
    free (real);
  }
  closedir (d);
  return r;
}

static int
plugin_list_exports (int readonly, int is_tls, struct nbdkit_exports *exports)
{
  if (!fleet.dir)
    return nbdkit_use_default_export (exports);
  return fleet_list (exports);
}

static const char *
plugin_default_export (int readonly, int is_tls)
{
  return fleet.default_export ? fleet.default_export : "";
}

/* file=: the image (and its stream's job) made the table's one entry,
 * held to the end.
 */
static int
fleet_hold (struct qcow2_image *img, struct glue_stream_job *job)
  TSA_EXCLUDES (&fleet.lock)
{
  struct plugin_export *e;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet.lock);
  e = fleet_add (filename);
  if (!e)
    return -1;
  if (!(e->path = strdup (filename))) {
    nbdkit_error ("%s: %s", filename, errstr (errno));
    fleet_remove (e);
    return -1;
  }
  e->image = img;
  e->job = job;
  e->state = EXPORT_OPEN;
  return 0;
}

/* template=: the temporary files (.new-XXXXXX, see fleet_create) of
 * images a crash left half made, removed; one another server is making
 * is locked by it, and left.
 */
static void
fleet_remove_stale (void)
{
  static const char alnum[] = "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  struct fileio_options o = glue_file_options;
  DIR *d = opendir (fleet.dir);
  struct dirent *de;

  o.direct = false;
  while (d && (de = readdir (d))) {
    struct qcow2_io *io;
    struct stat st, got;
    char *path;

    if (strlen (de->d_name) != 11 || strncmp (de->d_name, ".new-", 5) ||
        strspn (de->d_name + 5, alnum) != 6 ||
        fstatat (fleet.dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == -1 ||
        !S_ISREG (st.st_mode) ||
        asprintf (&path, "%s/%s", fleet.dir, de->d_name) == -1)
      continue;
    io = fileio_open_with (path, false, &o, NULL);
    free (path);
    if (!io)
      continue;
    if (fileio_stat (io, &got) == 0 && got.st_dev == st.st_dev &&
        got.st_ino == st.st_ino) {
      nbdkit_debug ("dir: removing %s, left half made", de->d_name);
      fleet_unlink_ours (de->d_name, &got);
    }
    io->ops->close (io);
  }
  if (d)
    closedir (d);
}

/* dir=: the folder, and the template (for the errors in it to be logged
 * at start rather than to a client).
 */
static int
fleet_get_ready (void)
{
  struct qcow2_create_options opts = glue.create.opts;
  char *named = NULL;
  int r = 0;

  fleet.dirfd = open (fleet.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fleet.dirfd == -1) {
    nbdkit_error ("dir: %s: %s", fleet.dir, errstr (errno));
    return -1;
  }
  fleet.env = glue_env;
  fleet.env.identity = fleet_env_identity;
  fleet.env.open = fleet_env_open;
  fleet.layers = qcow2_layers_new (&fleet.env);
  if (!fleet.layers) {
    nbdkit_error ("dir: %s", errstr (errno));
    return -1;
  }
  fleet.env.layers = fleet.layers;
  if (glue_stream.on && (glue.engine.readonly || glue_server_readonly () ||
                          glue.engine.snapshot)) {
    nbdkit_error ("stream=true copies the backing chain into each image of "
                  "dir=, which is served read-only (%s)",
                  glue.engine.snapshot ? "snapshot="
                  : "nbdkit -r or readonly=true");
    return -1;
  }
  if (fleet.template && (glue.engine.readonly || glue_server_readonly ())) {
    nbdkit_error ("template= makes images to write: not with readonly=true "
                  "or nbdkit -r");
    return -1;
  }
  if (fleet.template) {
    opts.backing = fleet.template;
    /* As a backing file name: relative to the folder. */
    if (asprintf (&named, "%s/new", fleet.dir) == -1) {
      nbdkit_error ("dir: %s", errstr (errno));
      return -1;
    }
    if (fleet.template[0] == '/')
      fleet.template_path = strdup (fleet.template);
    else if (asprintf (&fleet.template_path, "%s/%s", fleet.dir,
                       fleet.template) == -1)
      fleet.template_path = NULL;
    if (!fleet.template_path) {
      nbdkit_error ("template: %s", errstr (errno));
      free (named);
      return -1;
    }
    r = plugin_create_options (named, &opts, glue.create.size);
    free (named);
    fleet_remove_stale ();
  }
  return r;
}

static int
plugin_get_ready (void)
{
  struct qcow2_io *io = NULL;
  enum create_made made = MADE_NOTHING;
  struct qcow2_image *image = NULL;
  struct glue_stream_job *job;
  bool readonly = true;

  /* Passwords are kept for the images opened later. */
  if (fleet.dir)
    return fleet_get_ready ();
  if (create != CREATE_NO && plugin_create (&io, &made) == -1)
    goto fail;
  image = plugin_open_image (filename, io, &readonly, &glue_env, false,
                            NULL, NULL);
  /* The image and its backing files are open: their keys are made. */
  glue_forget_password ();
  if (!image)
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
  if (glue_stream_job_new (image, filename, "stream", readonly, &job) == -1)
    goto fail;
  if (fleet_hold (image, job) == -1) {
    glue_stream_job_free (job);  /* it refers to the image */
    goto fail;
  }
  return 0;

 fail:
  qcow2_close (image);
  plugin_create_undo (made);
  return -1;
}

/* Threads do not survive nbdkit's fork into the background. */
static int
plugin_after_fork (void)
{
  if (fleet.dir && fleet.idle_close > 0) {
    int e = pthread_create (&fleet.sweeper, NULL, fleet_sweep, NULL);

    if (e) {
      nbdkit_error ("idle-close: starting a thread: %s", errstr (e));
      return -1;
    }
    fleet.sweeper_running = true;
  }
  /* file='s stream (dir='s start as their images open). */
  return fleet.dir ? 0 : glue_stream_job_start (fleet.exports->job);
}

/* Every stream stopped where it is, once the clients are gone: before
 * the images close at unload.
 */
static void
fleet_stop_streams (void)
  TSA_EXCLUDES (&fleet.lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet.lock);
  for (struct plugin_export *e = fleet.exports; e; e = e->next) {
    glue_stream_job_free (e->job);
    e->job = NULL;
  }
}

static void
plugin_cleanup (void)
  TSA_EXCLUDES (&fleet.lock)
{
  if (fleet.sweeper_running) {
    lock_acquire (&fleet.lock);
    fleet.stopping = true;
    pthread_cond_signal (&fleet.idle);
    lock_release (&fleet.lock);
    pthread_join (fleet.sweeper, NULL);
    fleet.sweeper_running = false;
  }
  fleet_stop_streams ();
}

static struct qcow2_image *
plugin_image (void *handle)
{
  return ((struct plugin_export *) handle)->image;
}

static const char *
plugin_export_description (void *handle)
{
  struct plugin_export *e = handle;
  bool settled;
  char *s;
  const char *r;

  if (!fleet.dir)
    return glue_stream_job_description (e->job, &settled);
  s = fleet_export_text (e);
  r = s ? nbdkit_strdup_intern (s) : NULL;
  free (s);
  return r;
}

static void *
plugin_open (int readonly)
{
  const char *name;
  const char *why;
  char shown[72];

  if (!fleet.dir)
    return fleet.exports;
  name = nbdkit_export_name ();
  if (!name)
    return NULL;
  if (!*name && fleet.default_export)
    name = fleet.default_export;
  fleet_shown (name, shown);
  if (!*name) {
    nbdkit_error ("export \"\": refused: dir= serves images by their name "
                  "(nbdinfo --list lists them), and default-export= names "
                  "none");
    return NULL;
  }
  if ((why = fleet_name_refusal (name))) {
    nbdkit_error ("export \"%s\": refused: %s", shown, why);
    return NULL;
  }
  return fleet_open (name, shown);
}

static void
plugin_close (void *handle)
{
  glue_close_stats (plugin_image (handle));
  if (fleet.dir)
    fleet_release (handle);
}

static int64_t
plugin_get_size (void *handle)
{
  return qcow2_get_size (plugin_image (handle));
}

static int
plugin_can_write (void *handle)
{
  return qcow2_can_write (plugin_image (handle));
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
  return qcow2_can_trim (plugin_image (handle));
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
  struct plugin_export *e = handle;

  glue_stream_job_enter (e->job);
  int r = qcow2_read (e->image, buf, count, offset);
  glue_stream_job_leave (e->job);
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

    r = qcow2_read (plugin_image (handle), buf, n, offset);
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
  struct plugin_export *e = handle;

  glue_stream_job_enter (e->job);
  int r = qcow2_write (e->image, buf, count, offset, flags & NBDKIT_FLAG_FUA);
  glue_stream_job_leave (e->job);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  int r = qcow2_zero (plugin_image (handle), count, offset,
                      flags & NBDKIT_FLAG_MAY_TRIM,
                      flags & NBDKIT_FLAG_FAST_ZERO, flags & NBDKIT_FLAG_FUA);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  int r = qcow2_trim (plugin_image (handle), count, offset,
                      flags & NBDKIT_FLAG_FUA);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_flush (void *handle, uint32_t flags)
{
  int r = qcow2_flush (plugin_image (handle));

  glue_flushed (plugin_image (handle));
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
  int r = qcow2_extents (plugin_image (handle), offset, count,
                         flags & NBDKIT_FLAG_REQ_ONE, plugin_add_extent,
                         extents);
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
  .list_exports      = plugin_list_exports,
  .default_export    = plugin_default_export,
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
