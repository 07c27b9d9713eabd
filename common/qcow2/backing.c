/* SPDX-License-Identifier: BSD-3-Clause */
/* Backing chains and external data files: the other files an image
 * names, opened through the environment (the engine has no idea what a
 * file is), resolved against the naming image's folder.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errstr.h"
#include "internal.h"

/* The storage spec names, opened through the environment: a local
 * file by env->open (its identity in *id), remote storage by
 * env->open_remote (its URL the identity), and a json: name's raw
 * window over either.  what: which file, for messages; hint: what the
 * user can do if a local file is missing.
 */
static struct qcow2_io *
backing_open_storage (const struct qcow2_image *img, const char *what,
                      const char *hint, const char *name,
                      const struct name_spec *spec, bool readonly, char **id)
{
  const struct qcow2_env *env = img->env;
  struct qcow2_io *io = NULL;
  char *why = NULL;
  int e;

  *id = NULL;
  if (spec->path)
    io = env->open (env->opaque, spec->path, readonly, &why);
  else if (!readonly) {
    log_error (img, "cannot open %s \"%s\" for writing: remote storage is "
               "only read\n"
               "serve the image read-only (readonly=true, or nbdkit -r)",
               what, name);
    errno = EROFS;
    return NULL;
  }
  else if (!env->open_remote) {
    log_error (img, "cannot open %s \"%s\": remote storage is not "
               "supported here", what, name);
    errno = ENOTSUP;
    return NULL;
  }
  else if ((io = env->open_remote (env->opaque, &spec->remote, &why)) &&
           !(why = strdup (spec->url))) {
    io->ops->close (io);
    io = NULL;
  }
  if (!io) {
    e = errno;
    log_error (img, "cannot open %s \"%s\"%s: %s%s", what, name,
               readonly ? "" : " for writing", why ? why : errstr (e),
               e == ENOENT && spec->path ? hint : "");
    free (why);
    errno = e;
    return NULL;
  }
  *id = why;
  if (spec->raw_window) {
    int64_t size = io->ops->size (io);
    uint64_t len = spec->raw_size_set ? spec->raw_size
                   : size >= 0 && (uint64_t) size >= spec->raw_offset
                   ? size - spec->raw_offset : 0;
    struct qcow2_io *w = NULL;

    e = size < 0 ? (int) -size : 0;
    if (!e && (spec->raw_offset > (uint64_t) size ||
               len > (uint64_t) size - spec->raw_offset)) {
      log_error (img, "%s \"%s\": the sum of offset (%" PRIu64 ") and "
                 "size (%" PRIu64 ") is more than the storage's size "
                 "(%" PRId64 ")\n"
                 "is this the right export?", what, name,
                 spec->raw_offset, len, size);
      e = EINVAL;
    }
    else if (!e && !(w = window_io_new (io, spec->raw_offset, len)))
      e = errno;
    else if (e)
      log_error (img, "%s \"%s\": cannot get its size: %s", what, name,
                 errstr (e));
    if (!w) {
      io->ops->close (io);
      free (*id);
      *id = NULL;
      errno = e;
      return NULL;
    }
    io = w;
  }
  return io;
}

/* The format of a backing file: the image's header says it (QEMU
 * takes it over a json: name's), else the json: name, else it is
 * probed (NULL).  Raw's offset and size need raw.
 */
static int
backing_format (const struct qcow2_image *img, const char *name,
                const char *header_format, const struct name_spec *spec,
                const char **format)
{
  *format = header_format ? header_format : spec->format;
  if (header_format && spec->format && strcmp (header_format, spec->format))
    log_debug (img, "backing file \"%s\" read as %s, as its image says, "
               "not %s as its name says (as QEMU does)", name, header_format,
               spec->format);
  if (spec->raw_window && !*format)
    *format = "raw";
  if (spec->raw_window && strcmp (*format, "raw") != 0) {
    log_error (img, "backing file \"%s\": offset and size are options of "
               "the raw format, not of %s", name, *format);
    return -EINVAL;
  }
  return 0;
}

/* A name the image records, resolved as QEMU resolves it: against the
 * image's name, or the folder opts->names_dir gives for a relative
 * local name.  NULL with *why (see name_resolve).
 */
static char *
backing_resolve (const struct qcow2_image *img,
                 const struct qcow2_options *opts, const char *name,
                 char **why)
{
  const char *dir = opts->names_dir;
  size_t len = dir ? strlen (dir) : 0;
  char *r;

  if (!dir || !qcow2_name_is_relative (name))
    return name_resolve (img->path, name, why);
  *why = NULL;
  while (len > 0 && dir[len - 1] == '/')
    len--;                      /* "/" is "", as a name's prefix */
  if (asprintf (&r, "%.*s/%s", (int) len, dir, name) < 0)
    return NULL;
  return r;
}

/* Logs that a name cannot be parsed or resolved; returns its error. */
static int
backing_bad_name (const struct qcow2_image *img, const char *what,
                  const char *name, int r, char *why)
{
  log_error (img, "%s \"%s\": %s", what, name, why ? why : errstr (ENOMEM));
  free (why);
  return why ? r : -ENOMEM;
}

/* Returns -ELOOP (logged) if id is already in the chain above. */
static int
backing_check_loop (struct qcow2_image *img, const char **chain,
                    unsigned depth, const char *id, const char *path)
{
  for (unsigned i = 0; i <= depth; i++) {
    if (strcmp (chain[i], id) == 0) {
      log_error (img, "backing chain loops: backing file \"%s\" is already "
                 "in the chain (layer %u)", path, i);
      return -ELOOP;
    }
  }
  return 0;
}

/* Check the identity a layer will have before opening it, so that a
 * loop is found before the file is opened a second time (which image
 * locks would refuse): a local file's from the environment, remote
 * storage's its URL.  *pre gets it (malloc'd; NULL if unknown).
 */
static int
backing_check_loop_early (struct qcow2_image *img, const char **chain,
                          unsigned depth, const char *name,
                          const struct name_spec *spec, char **pre)
{
  if (spec->url)
    *pre = strdup (spec->url);
  else
    *pre = img->env->identity ? img->env->identity (img->env->opaque,
                                                    spec->path) : NULL;
  return *pre ? backing_check_loop (img, chain, depth, *pre, name) : 0;
}

/* Whether the layer a name gives may be shared (env->layers): not a
 * window of storage (json's raw offset and size), nor remote storage
 * with options of its own (json's cookie, timeout, sslverify), which
 * its identity does not tell apart; not a chain backing= names.
 */
static bool
backing_shareable (const struct qcow2_image *img,
                   const struct name_spec *spec, bool named)
{
  return img->env->layers && !named && !spec->raw_window &&
    !spec->remote.cookie && !spec->remote.timeout && spec->remote.sslverify;
}

/* A layer open for writing (an image of another client) is not read
 * as a backing file, as QEMU's image locks would refuse it.
 */
static int
backing_refused (struct qcow2_image *img, const char *path)
{
  log_error (img, "backing file \"%s\" refused: it is open here for "
             "writing, an image of its own: an image is not read over a "
             "base that may change (QEMU's image locks refuse it too)", path);
  return -EBUSY;
}

/* The layer id (opened with format and no_backing) if the table of
 * shared layers has it: 0 with it below img, 1 if it has not (*opening:
 * the caller opens it for the images waiting: see layers_find).  A top
 * image's backing file opened by another is waited for.
 */
static int
backing_share (struct qcow2_image *img, const char *path, const char *id,
               const char *format, bool no_backing, const char **chain,
               unsigned depth, bool *opening)
{
  struct qcow2_image *layer;
  int r = layers_find (img->env->layers, id, format, no_backing,
                       depth == 0, &layer);

  *opening = r == 1;
  if (r == -EBUSY)
    return backing_refused (img, path);
  if (!layer)
    return 1;
  /* Its chain was checked from it down, not from the images above. */
  for (struct qcow2_image *l = layer; l && r == 0; l = l->backing)
    r = backing_check_loop (img, chain, depth, l->id, path);
  if (r < 0) {
    if (layers_release (layer))
      image_free (layer);
    return r;
  }
  log_debug (img, "backing file \"%s\": shared, already open", path);
  img->backing = layer;
  return 0;
}

/* The layer below img, in io (which it owns) named path, known by id
 * (owned too): chained, unless it loops, and opened as an image of the
 * given format (NULL: probed); shared if share (with no_backing).
 */
static int
backing_attach (struct qcow2_image *img, struct qcow2_io *io,
                const char *path, char *id, const char *format,
                const struct qcow2_options *layer_opts, const char **chain,
                unsigned depth, bool share)
{
  struct qcow2_image *layer;
  int r;

  if (backing_check_loop (img, chain, depth, id, path) < 0) {
    io->ops->close (io);
    free (id);
    return -ELOOP;
  }
  chain[depth + 1] = id;
  layer = image_open_layer (layers_env (img->env), io, path, id, format,
                            layer_opts, chain, depth + 1);
  /* ENODATA and EMEDIUMTYPE say what the top image is (qcow2.h). */
  if (!layer)
    return errno == ENODATA || errno == EMEDIUMTYPE ? -EINVAL : -errno;
  /* Without it (out of memory) reads go on, only slower. */
  if (io->ops->pread_many)
    layer->readahead = readahead_new (layer, layer_read,
                                      layer_opts->remote_keep);
  if (share) {
    struct qcow2_image *ours = layer;

    /* Out of memory, it serves this image alone. */
    r = layers_add (img->env->layers, format, layer_opts->no_backing,
                    &layer);
    if (r == 1 || r == -EBUSY)
      image_free (ours);
    if (r == -EBUSY)
      return backing_refused (img, path);
  }
  img->backing = layer;
  return 0;
}

int
backing_open (struct qcow2_image *img, const struct qcow2_options *opts,
              const char **chain, unsigned depth)
{
  bool named = opts->backing_chain_len > 0;
  const char *name = named ? opts->backing_chain[0] : img->h.backing_file;
  const char *what = named ? "backing file (named by backing=)"
                           : "backing file";
  const char *format;
  struct qcow2_options layer_opts = {
    .debug_cache = opts->debug_cache, .readonly = true,
    .no_backing = opts->no_backing,
    .backing_chain = named ? opts->backing_chain + 1 : NULL,
    .backing_chain_len = named ? opts->backing_chain_len - 1 : 0,
    /* The next password, or the last one again. */
    .passwords = opts->passwords_len > 1 ? opts->passwords + 1
                                         : opts->passwords,
    .passwords_len = opts->passwords_len - (opts->passwords_len > 1),
    .max_pbkdf2_iterations = opts->max_pbkdf2_iterations,
    .remote_keep = opts->remote_keep,
  };
  struct name_spec spec;
  struct qcow2_io *io;
  char *path, *id, *why, *pre = NULL;
  bool share, opening = false;
  int r;

  if (!named && img->h.backing_format &&
      strcmp (img->h.backing_format, "qcow2") != 0 &&
      strcmp (img->h.backing_format, "raw") != 0) {
    log_error (img, "backing file \"%s\" has format \"%s\": only qcow2 and "
               "raw backing files are supported", name,
               img->h.backing_format);
    return -ENOTSUP;
  }
  if (depth + 1 > QCOW2_MAX_CHAIN_DEPTH) {
    log_error (img, "backing chain is deeper than %d images",
               QCOW2_MAX_CHAIN_DEPTH);
    return -ELOOP;
  }

  /* backing= names are used as given (the modules resolve them). */
  path = named ? strdup (name) : backing_resolve (img, opts, name, &why);
  if (!path)
    return backing_bad_name (img, what, name, -EINVAL, named ? NULL : why);
  if ((r = name_parse (path, &spec, &why)) < 0) {
    r = backing_bad_name (img, what, path, r, why);
    goto out;
  }
  if ((r = backing_format (img, path, named ? NULL : img->h.backing_format,
                           &spec, &format)) < 0 ||
      (r = backing_check_loop_early (img, chain, depth, path, &spec,
                                     &pre)) < 0)
    goto out;
  layer_opts.no_backing |= spec.no_backing;
  share = backing_shareable (img, &spec, named);
  if (share && pre &&
      (r = backing_share (img, path, pre, format, layer_opts.no_backing,
                          chain, depth, &opening)) <= 0)
    goto out;
  io = backing_open_storage (img, what, named ? "" : "\nbacking=none "
                             "serves the image without it; \"qemu-img "
                             "rebase -u -b NEW-NAME -F FORMAT IMAGE\" gives "
                             "the image its new name", path, &spec, true, &id);
  r = io ? backing_attach (img, io, path, id, format, &layer_opts, chain,
                           depth, share) : -errno;
  if (opening)
    layers_abandon (img->env->layers, pre, format, layer_opts.no_backing);
 out:
  name_spec_free (&spec);
  free (path);
  free (pre);
  return r;
}

/* The top image's backing file handed in open (opts->backing_io): a
 * raw layer, whatever the header names.  Consumes the I/O object, as
 * image_open_layer does.
 */
int
backing_attach_io (struct qcow2_image *img, const struct qcow2_options *opts)
{
  const char *name = opts->backing_io_name ? opts->backing_io_name
                                           : "backing file";
  const struct qcow2_options layer_opts = { .readonly = true };
  char *id = strdup (name);

  if (!id) {
    opts->backing_io->ops->close (opts->backing_io);
    return -ENOMEM;
  }
  img->backing = image_open_layer (img->env, opts->backing_io, name, id,
                                   "raw", &layer_opts, NULL, 1);
  return img->backing ? 0 : -errno;
}

/* Whether the storage of a layer is a local file, whole: its name
 * parsed again (the layer keeps it as it was resolved).
 */
bool
backing_is_local (const struct qcow2_image *layer)
{
  struct name_spec spec;
  char *why = NULL;
  bool local;

  if (name_parse (layer->path, &spec, &why) < 0) {
    free (why);
    return false;
  }
  local = spec.path && !spec.raw_window;
  name_spec_free (&spec);
  return local;
}

struct qcow2_io *
backing_reopen (const struct qcow2_image *layer, bool writable)
{
  struct qcow2_io *io = NULL;
  struct name_spec spec;
  char *why = NULL, *id = NULL;
  int r;

  if ((r = name_parse (layer->path, &spec, &why)) < 0) {
    errno = -backing_bad_name (layer, "backing file", layer->path, r, why);
    return NULL;
  }
  if (!spec.path || spec.raw_window) {
    log_error (layer, "cannot open it again%s: not a local file",
               writable ? " for writing" : "");
    errno = ENOTSUP;
  }
  else if ((io = backing_open_storage (layer, "backing file", "",
                                       layer->path, &spec, !writable,
                                       &id)) &&
           layer->id && id && strcmp (id, layer->id) != 0) {
    log_error (layer, "opened again, it is another file (%s, not %s): "
               "replaced meanwhile?", id, layer->id);
    io->ops->close (io);
    io = NULL;
    errno = ESTALE;
  }
  r = errno;
  free (id);
  name_spec_free (&spec);
  errno = r;
  return io;
}

struct qcow2_io *
qcow2_open_name (const struct qcow2_env *env, const char *naming,
                 const char *name, char **resolved, const char **format)
{
  /* Only what messages need of the image naming it. */
  const struct qcow2_image naming_img = { .env = env, .path = (char *) naming };
  struct qcow2_io *io = NULL;
  struct name_spec spec;
  char *why = NULL, *id;
  int r;

  *format = NULL;
  *resolved = name_resolve (naming, name, &why);
  if (!*resolved) {
    errno = -backing_bad_name (&naming_img, "backing file", name, -EINVAL,
                               why);
    return NULL;
  }
  if ((r = name_parse (*resolved, &spec, &why)) < 0)
    r = backing_bad_name (&naming_img, "backing file", *resolved, r, why);
  else if ((r = backing_format (&naming_img, *resolved, NULL, &spec,
                                format)) == 0) {
    io = backing_open_storage (&naming_img, "backing file", "", *resolved,
                               &spec, true, &id);
    r = io ? 0 : -errno;
    if (io)
      free (id);
  }
  name_spec_free (&spec);
  if (r < 0) {
    free (*resolved);
    *resolved = NULL;
    errno = -r;
  }
  return io;
}

int
data_file_open (struct qcow2_image *img, const struct qcow2_options *opts)
{
  const char *what = "external data file";
  struct name_spec spec;
  char *path, *id, *why = NULL;
  int r;

  img->data_io = img->io;
  if (!(img->h.incompatible_features & QCOW2_INCOMPAT_DATA_FILE)) {
    if (opts->data_file) {
      log_error (img, "data-file is set but the image has no external "
                 "data file");
      return -EINVAL;
    }
    if (img->data_file_raw) {
      log_error (img, "autoclear bit 1 (raw external data) is set but the "
                 "image has no external data file");
      return -EINVAL;
    }
    return 0;
  }
  if (opts->data_file)
    path = strdup (opts->data_file);
  else if (img->h.data_file && img->h.data_file[0])
    path = backing_resolve (img, opts, img->h.data_file, &why);
  else {
    log_error (img, "image needs an external data file (incompatible "
               "feature bit 2) but names none: give data-file=");
    return -EINVAL;
  }
  if (!path)
    return backing_bad_name (img, what, img->h.data_file, -EINVAL, why);
  if ((r = name_parse (path, &spec, &why)) < 0) {
    r = backing_bad_name (img, what, path, r, why);
    free (path);
    return r;
  }
  if (spec.format || spec.no_backing) {
    log_error (img, "%s \"%s\": a data file is raw storage: its name "
               "cannot give a format or a backing file", what, path);
    r = -EINVAL;
  }
  /* Written with the image: guest data lives there. */
  else if ((img->data_io = backing_open_storage (
              img, what, "\ndata-file=FILE names where it is", path, &spec,
              opts->readonly || opts->snapshot, &id)) != NULL)
    free (id);
  else {
    r = -errno;
    img->data_io = img->io;
  }
  name_spec_free (&spec);
  free (path);
  return r;
}
