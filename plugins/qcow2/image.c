/* SPDX-License-Identifier: BSD-3-Clause */
/* One image: opened where the file and the user allow writing, or made
 * first (create=; and, called by fleet.c, the overlays template=
 * makes).  file='s keys, and its image served from get_ready on.  What
 * differs between file= and dir= its callers say (struct image_how).
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
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
#include "plugin.h"
#include "qcow2.h"

/* file='s keys, set before any connection. */
static struct {
  char *filename;
  /* data-file=: absolute (opened), and as given (recorded by create=). */
  char *data_file;
  char *data_file_name;
  /* create=true or create=if-missing: make the image at get_ready. */
  enum { CREATE_NO, CREATE_YES, CREATE_IF_MISSING } create;
  char *create_backing;
  /* What making the image did to its external data file. */
  enum image_made data_file_made;
  /* The image every connection serves (from get_ready on), how many
   * connections there are, and whether block-export-del closed it.
   */
  struct plugin_export served;
  unsigned clients;             /* atomic */
  bool deleted;                 /* atomic */
  /* The image's folder, and a descriptor of it (export-snapshot's,
   * opened at its first).
   */
  char *folder;
  int folder_fd;
} image = { .folder_fd = -1 };

/* Absolute, since nbdkit may change directory; backing file names
 * resolve against the image's folder.
 */
int
image_config_file (const char *key, const char *value)
{
  free (image.filename);
  image.filename = nbdkit_absolute_path (value);
  return image.filename ? 0 : -1;
}

int
image_config_data_file (const char *key, const char *value)
{
  free (image.data_file);
  free (image.data_file_name);
  image.data_file = nbdkit_absolute_path (value);
  image.data_file_name = strdup (value);
  return image.data_file && image.data_file_name ? 0 : -1;
}

/* "none" serves an image alone; a file name is for create=. */
int
image_config_backing (const char *key, const char *value)
{
  free (image.create_backing);
  image.create_backing = NULL;
  glue.engine.no_backing = strcmp (value, "none") == 0;
  if (!glue.engine.no_backing && !(image.create_backing = strdup (value)))
    return -1;
  return 0;
}

int
image_config_create (const char *key, const char *value)
{
  bool yes;

  if (strcmp (value, "if-missing") == 0) {
    image.create = CREATE_IF_MISSING;
    return 0;
  }
  if (glue_parse_bool (key, value, &yes) == -1)
    return -1;
  image.create = yes ? CREATE_YES : CREATE_NO;
  return 0;
}

bool
image_on (void)
{
  return image.filename != NULL;
}

const char *
image_key_given (void)
{
  return image.create != CREATE_NO ? "create"
    : image.data_file ? "data-file"
    : image.create_backing ? "backing" : NULL;
}

int
image_config_complete (void)
{
  if (image.create == CREATE_NO && glue.create.first_key) {
    nbdkit_error ("%s= describes an image to make: it needs create=true "
                  "(or create=if-missing)%s", glue.create.first_key,
                  strcmp (glue.create.first_key, "backing") == 0 ?
                  "; to serve an image without its backing file, use "
                  "backing=none" : "");
    return -1;
  }
  if (image.create != CREATE_NO && glue.create.size == -1 &&
      !image.create_backing) {
    nbdkit_error ("create=true needs size= (or backing= to take its size)");
    return -1;
  }
  if (image.create != CREATE_NO &&
      glue_create_check_password (image.create == CREATE_YES ? "create=true"
                                  : "create=if-missing") == -1)
    return -1;
  if (image.create != CREATE_NO && glue.create.opts.backing_format &&
      !image.create_backing) {
    nbdkit_error ("backing-fmt= names the format of backing=FILE, which "
                  "is not given");
    return -1;
  }
  glue.engine.data_file = image.data_file;
  return 0;
}
/* The backing file of an image being created at path: its format
 * into opts (unless given) and, unless *size is set (not -1), its size.
 * Relative names are relative to the new image's folder, as in the
 * header; remote names (URLs, json:) are opened as the engine opens
 * backing files.
 */
static int
image_probe_backing (const struct qcow2_env *env, const char *path,
                     const char *backing, struct qcow2_create_options *opts,
                     int64_t *size)
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

  io = qcow2_open_name (env, path, backing, &resolved, &named_format);
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
    b = qcow2_open (env, io, resolved, &probe);
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

struct qcow2_io *
image_create_file (const char *path, enum image_made *made)
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

/* opts->backing, if any, probed: its format and, if size is -1, its
 * size.
 */
int
image_create_options (const struct qcow2_env *env, const char *path,
                      struct qcow2_create_options *opts, int64_t size)
{
  if (opts->backing &&
      image_probe_backing (env, path, opts->backing, opts, &size) == -1)
    return -1;
  /* Whole sectors, as qemu-img rounds it. */
  if (size > INT64_MAX - 511) {
    nbdkit_error ("size %" PRId64 " is too large", size);
    return -1;
  }
  opts->size = (size + 511) & ~INT64_C (511);
  return qcow2_create_check (env, opts) < 0 ? -1 : 0;
}

/* Everything is checked before the file is touched; then the image is
 * written into a new file, or an empty one (create=if-missing leaves a
 * file that is not empty alone, to be served as it is).
 */
static int
image_create (struct qcow2_io **iop, enum image_made *made)
{
  struct qcow2_io *io;
  struct stat st;
  bool existed;

  *iop = NULL;
  *made = MADE_NOTHING;
  existed = stat (image.filename, &st) == 0;
  if (image.create == CREATE_IF_MISSING && existed && st.st_size > 0) {
    nbdkit_debug ("create=if-missing: %s exists: served as it is, if it "
                  "is the image described", image.filename);
    return 0;
  }
  glue.create.opts.backing = image.create_backing;
  glue.create.opts.data_file = image.data_file_name;
  if (image_create_options (&glue_env, image.filename, &glue.create.opts,
                            glue.create.size) == -1)
    return -1;

  /* The data file first, closed again: the engine opens it (and
   * locks it) with the image.
   */
  if (image.data_file) {
    struct qcow2_io *dio = image_create_file (image.data_file,
                                              &image.data_file_made);

    if (!dio)
      return -1;
    dio->ops->close (dio);
  }
  /* Locked for writing before anything is written, and served through
   * the same open file (a second one would meet its own locks).
   */
  io = image_create_file (image.filename, made);
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
image_create_undo_file (const char *path, enum image_made made)
{
  if ((made == MADE_NEW_FILE && unlink (path) == -1) ||
      (made == MADE_IN_EMPTY_FILE && truncate (path, 0) == -1))
    nbdkit_error ("create: removing what was made of %s: %s", path,
                  errstr (errno));
}

static void
image_create_undo (enum image_made made)
{
  image_create_undo_file (image.filename, made);
  image_create_undo_file (image.data_file, image.data_file_made);
  image.data_file_made = MADE_NOTHING;
}


/* Hints for files that are not qcow2 images (qcow2_open's errno). */
static void
image_open_hint (const char *path, int e)
{
  if (e == ENODATA)
    glue_hint ("%s is empty: to make a new image in it, add create=true "
               "size=SIZE", path);
  else if (e == EMEDIUMTYPE && image.create == CREATE_IF_MISSING)
    glue_hint ("create=if-missing: %s exists but is not a qcow2 image: "
               "it is left as it is", path);
  else if (e == EMEDIUMTYPE)
    glue_hint ("if %s is a raw disk image, nbdkit's file plugin serves "
               "it: nbdkit file %s", path, path);
}

/* The file of path opened, read-write unless opts says read-only or
 * the file cannot be written (then *e is why, and opts is read-only).
 * NULL with errno set, logged.
 */
static struct qcow2_io *
image_open_file (const char *path, struct qcow2_options *opts,
                 const struct image_how *how, int *e)
{
  const struct fileio_options *files =
    how->files ? how->files : &glue_file_options;
  bool quiet = how->quiet;
  struct qcow2_io *io = NULL;
  char *why = NULL;
  int err;

  if (!opts->readonly) {
    io = fileio_open_with (path, false, files, &why);
    if (!io && !why &&
        (errno == EACCES || errno == EROFS || errno == EPERM)) {
      *e = errno;
      opts->readonly = true;
    }
  }
  if (!io && opts->readonly && !why)
    io = fileio_open_with (path, true, files, &why);
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
  }
  return io;
}

struct qcow2_image *
image_open (const char *path, struct qcow2_io *io,
            const struct image_how *how, bool *readonly)
{
  bool asked_readonly = glue.engine.readonly || glue_server_readonly ();
  /* A copy: each export of dir= opens its image with these. */
  struct qcow2_options opts = glue.engine;
  struct qcow2_image *img;
  struct stat st;
  int e = 0, err;

  /* A snapshot is served read-only: the file is opened so, and locked
   * as a reader, as qemu-nbd -l does (the notice below says so).
   */
  opts.readonly = asked_readonly || opts.snapshot || how->readonly_why;
  opts.small_l2_slices = how->small_l2_slices;
  if (how->remote_keep)
    opts.remote_keep = how->remote_keep;
  if (!io && !(io = image_open_file (path, &opts, how, &e)))
    return NULL;
  /* A link changed between the check and the open could lead anywhere. */
  if (how->checked &&
      (fileio_stat (io, &st) == -1 || !S_ISREG (st.st_mode) ||
       st.st_dev != how->checked->st_dev ||
       st.st_ino != how->checked->st_ino)) {
    (how->quiet ? nbdkit_debug : nbdkit_error)
      ("open: %s: refused: it changed while it was opened", path);
    io->ops->close (io);
    errno = EPERM;
    return NULL;
  }
  opts.debug_cache = qcow2_debug_cache;
  img = qcow2_open (how->env, io, path, &opts);
  if (!img) {
    err = errno;
    if (!how->quiet && how->hints)
      image_open_hint (path, err);
    errno = err;
    return NULL;
  }
  if (glue_opened (img, path, asked_readonly,
                   how->readonly_why ? how->readonly_why
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

void
image_close (struct qcow2_image *img, const char *path)
{
  int r = img ? qcow2_close (img) : 0;

  /* What a client flushed was durable then: only what came after may
   * be lost.
   */
  if (r < 0)
    nbdkit_error ("%s: closing the image failed (its final flush: %s): "
                  "what was written since the last flush may be lost", path,
                  errstr (-r));
}

/* The folder of the image, and a descriptor of it, made once. */
static int
image_folder (void)
{
  const char *slash = strrchr (image.filename, '/');

  if (image.folder_fd >= 0)
    return 0;
  free (image.folder);
  image.folder = strndup (image.filename, slash - image.filename);
  if (!image.folder)
    return -1;
  image.folder_fd = open (*image.folder ? image.folder : "/",
                          O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return image.folder_fd == -1 ? -1 : 0;
}

/* file=: the image made if asked, opened, checked, repaired if asked,
 * its stream job made: served to every connection.
 */
int
image_get_ready (void)
{
  struct plugin_export *single = &image.served;
  const struct image_how how = { .env = &glue_env, .hints = true };
  struct qcow2_io *io = NULL;
  enum image_made made = MADE_NOTHING;
  struct qcow2_image *img = NULL;
  struct glue_stream_job *job;
  bool readonly = true;

  /* A snapshot of it a crash interrupted, ended before it opens. */
  if (image_folder () == 0)
    freeze_recover (image.folder_fd, image.folder,
                    strrchr (image.filename, '/') + 1);
  if (image.create != CREATE_NO && image_create (&io, &made) == -1)
    goto fail;
  img = image_open (image.filename, io, &how, &readonly);
  /* The image and its backing files are open: their keys are made. */
  glue_forget_password ();
  if (!img)
    goto fail;
  glue.create.opts.backing = image.create_backing;
  if (image.create == CREATE_IF_MISSING && made == MADE_NOTHING &&
      glue_create_compare (img, image.filename) == -1)
    goto fail;
  if (made != MADE_NOTHING &&
      qcow2_preallocate (img, glue.create.opts.preallocation) < 0)
    goto fail;
  if (glue.repair_leaks && glue_repair (img, image.filename) == -1)
    goto fail;
  if (glue_stream_job_new (img, image.filename, "stream", readonly,
                           &single->inflight, &job) == -1)
    goto fail;
  single->image = img;
  single->job = job;
  return 0;

 fail:
  qcow2_close (img);
  image_create_undo (made);
  return -1;
}

void
image_unload (void)
{
  glue_stream_job_free (image.served.job);
  image_close (image.served.image, image.filename);
  free (image.served.job_id);
  if (image.folder_fd >= 0)
    close (image.folder_fd);
  free (image.folder);
  free (image.filename);
  free (image.data_file);
  free (image.data_file_name);
  free (image.create_backing);
}

int
image_after_fork (void)
{
  return glue_stream_job_start (image.served.job);
}

void
image_cleanup (void)
{
  glue_stream_job_free (image.served.job);
  image.served.job = NULL;
  qcow2_commit_free (image.served.commit);
  image.served.commit = NULL;
}

struct plugin_export *
image_connect (void)
{
  if (__atomic_load_n (&image.deleted, __ATOMIC_ACQUIRE)) {
    nbdkit_error ("%s: refused: its export was deleted (block-export-del)",
                  image.filename);
    return NULL;
  }
  __atomic_add_fetch (&image.clients, 1, __ATOMIC_RELAXED);
  return &image.served;
}

void
image_release (void)
{
  __atomic_sub_fetch (&image.clients, 1, __ATOMIC_RELAXED);
}

/* The export's name, for the control socket: the file's own. */
static const char *
image_export_name (void)
{
  const char *slash = strrchr (image.filename, '/');

  return slash ? slash + 1 : image.filename;
}

int
image_each (plugin_view_fn fn, void *opaque)
{
  struct plugin_view v = {
    .name = image_export_name (), .path = image.filename,
    .served = &image.served,
    .clients = __atomic_load_n (&image.clients, __ATOMIC_RELAXED),
  };

  if (image.deleted)
    return 0;
  v.readonly = !qcow2_can_write (image.served.image);
  return fn (&v, opaque);
}

struct plugin_export *
image_hold (const char *name)
{
  if (image.deleted || strcmp (name, image_export_name ()) != 0) {
    errno = ENOENT;
    return NULL;
  }
  return &image.served;
}

int
image_delete (const char *name, bool hard, unsigned *clients)
{
  if (!image_hold (name))
    return -1;
  *clients = __atomic_load_n (&image.clients, __ATOMIC_RELAXED);
  if (*clients > 0 && !hard) {
    errno = EBUSY;
    return -1;
  }
  __atomic_store_n (&image.deleted, true, __ATOMIC_RELEASE);
  gate_shut (&image.served, GATE_CLOSED);
  image_cleanup ();
  image_close (image.served.image, image.filename);
  image.served.image = NULL;
  image.served.job_held = false;
  return 0;
}

int
image_reopen (struct plugin_export *served)
{
  const struct image_how how = { .env = &glue_env };
  bool readonly;

  served->image = image_open (image.filename, NULL, &how, &readonly);
  return served->image ? 0 : -1;
}

int
image_freeze_spot (const char *frozen, struct freeze_spot *f,
                   const char **why)
{
  const char *name, *own;
  struct stat st;

  *why = NULL;
  if (image_folder () == -1) {
    *why = "its folder cannot be opened";
    return -1;
  }
  own = strrchr (image.filename, '/') + 1;
  *f = (struct freeze_spot) {
    .folder = image.folder, .dirfd = image.folder_fd, .name = own,
    .files = &glue_file_options, .env = &glue_env,
    .served = &image.served, .reopen = image_reopen,
  };
  if (!frozen)
    return 0;
  /* Beside the image: its backing name, if relative, reads the same. */
  name = strrchr (frozen, '/');
  if (name && (name - frozen != own - 1 - image.filename ||
               strncmp (frozen, image.filename, name - frozen) != 0)) {
    *why = "it must be in the image's folder (a name, or a path there)";
    return -1;
  }
  name = name ? name + 1 : frozen;
  if (!*name || strcmp (name, ".") == 0 || strcmp (name, "..") == 0 ||
      strcmp (name, own) == 0) {
    *why = "it is not a file's name";
    return -1;
  }
  if (fstatat (image.folder_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
      errno != ENOENT) {
    *why = "it exists already";
    return -1;
  }
  f->frozen = name;
  return 0;
}
