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

/* A name the image records, resolved against its folder. */
static char *
backing_resolve (const struct qcow2_image *img,
                 const struct qcow2_options *opts, const char *name)
{
  const char *dir = opts->names_dir ? opts->names_dir : img->path;
  const char *end = opts->names_dir ? dir + strlen (dir)
                                    : strrchr (img->path, '/');
  char *r;

  if (name[0] == '/' || !end)
    return strdup (name);
  while (opts->names_dir && end > dir && end[-1] == '/')
    end--;                      /* "/" is "", as a name's prefix */
  if (asprintf (&r, "%.*s/%s", (int) (end - dir), dir, name) < 0)
    return NULL;
  return r;
}

/* hint: what the user can do if the file is missing. */
static struct qcow2_io *
backing_open_file (struct qcow2_image *img, const char *what,
                   const char *hint, const char *path, bool readonly,
                   char **id)
{
  struct qcow2_io *io;

  *id = NULL;
  io = img->env->open (img->env->opaque, path, readonly, id);
  if (!io) {
    int e = errno;
    log_error (img, "cannot open %s \"%s\"%s: %s%s", what, path,
               readonly ? "" : " for writing", *id ? *id : errstr (e),
               e == ENOENT ? hint : "");
    free (*id);
    *id = NULL;
    errno = e;
  }
  return io;
}

/* -ELOOP, said, if id is already in the chain above. */
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

int
backing_open (struct qcow2_image *img, const struct qcow2_options *opts,
              const char **chain, unsigned depth)
{
  bool named = opts->backing_chain_len > 0;
  const char *name = named ? opts->backing_chain[0] : img->h.backing_file;
  const char *format = named ? NULL : img->h.backing_format;
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
  };
  struct qcow2_io *io;
  char *path, *id;

  if (strncmp (name, "json:", 5) == 0 || strstr (name, "://")) {
    log_error (img, "backing file \"%s\" is not a local file: only local "
               "backing files are supported", name);
    return -ENOTSUP;
  }
  if (format && strcmp (format, "qcow2") != 0 && strcmp (format, "raw") != 0) {
    log_error (img, "backing file \"%s\" has format \"%s\": only qcow2 and "
               "raw backing files are supported", name, format);
    return -ENOTSUP;
  }
  if (depth + 1 > QCOW2_MAX_CHAIN_DEPTH) {
    log_error (img, "backing chain is deeper than %d images",
               QCOW2_MAX_CHAIN_DEPTH);
    return -ELOOP;
  }

  path = named ? strdup (name) : backing_resolve (img, opts, name);
  if (!path)
    return -ENOMEM;
  if (img->env->identity) {
    char *pre = img->env->identity (img->env->opaque, path);
    int r = pre ? backing_check_loop (img, chain, depth, pre, path) : 0;

    free (pre);
    if (r < 0) {
      free (path);
      return r;
    }
  }
  io = backing_open_file (img, named ? "backing file (named by backing=)"
                         : "backing file", named ? "" : "; backing=none "
                         "serves the image without it, and \"qemu-img rebase "
                         "-u -b NEW-NAME -F FORMAT IMAGE\" gives the image "
                         "its new name", path, true, &id);
  if (!io) {
    int e = errno;
    free (path);
    return -e;
  }
  if (backing_check_loop (img, chain, depth, id, path) < 0) {
    io->ops->close (io);
    free (id);
    free (path);
    return -ELOOP;
  }
  chain[depth + 1] = id;

  img->backing = image_open_layer (img->env, io, path, id, format,
                                   &layer_opts, chain, depth + 1);
  free (path);
  if (img->backing)
    return 0;
  /* ENODATA and EMEDIUMTYPE say what the top image is (qcow2.h). */
  return errno == ENODATA || errno == EMEDIUMTYPE ? -EINVAL : -errno;
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

int
data_file_open (struct qcow2_image *img, const struct qcow2_options *opts)
{
  char *path, *id;

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
    path = backing_resolve (img, opts, img->h.data_file);
  else {
    log_error (img, "image needs an external data file (incompatible "
               "feature bit 2) but names none: give data-file=");
    return -EINVAL;
  }
  if (!path)
    return -ENOMEM;
  /* Written with the image: guest data lives there. */
  img->data_io = backing_open_file (img, "external data file",
                                    "; data-file=FILE names where it is",
                                    path, opts->readonly || opts->snapshot,
                                    &id);
  free (path);
  free (id);
  if (!img->data_io) {
    int e = errno;
    img->data_io = img->io;
    return -e;
  }
  return 0;
}
