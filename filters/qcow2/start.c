/* SPDX-License-Identifier: BSD-3-Clause */
/* The qcow2 filter's image, opened once for every connection: at
 * after_fork, through one context into the plugin (nbdkit lets a filter
 * open its plugin no earlier), and checked before the fork where it can
 * be (a local file nbdkit's file plugin serves alone, and the overlay's
 * FILE), so that a refusal reaches the terminal; after the fork, the
 * glue has it heard there (glue_start_*).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include <nbdkit-filter.h>

#include "fileio.h"
#include "filter.h"
#include "glue.h"
#include "qcow2.h"

/* The image opened once, read-write if the plugin is writable and
 * neither nbdkit -r nor readonly=true says otherwise.
 */
static int
start_open_image (nbdkit_backend *backend, struct qcow2_image **image)
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
    return overlay_open (-1, image);
  /* The plugin under an overlay is only read. */
  if (below_open (backend, readonly || overlay_active (), &size) == -1)
    return -1;
  if (overlay_active ())
    return overlay_open (size, image);
  if (!readonly && (w = below_can_write ()) != 1) {
    if (w == -1)
      return -1;
    readonly = true;
  }
  glue.engine.readonly = readonly;
  if (below_lock_file (readonly) == -1)
    return -1;
  if (config_names (below_local_file (), &name, &dir) == -1)
    return -1;
  glue.engine.names_dir = dir;
  if (!(io = below_nextio_new (size, readonly ? NEXTIO_READONLY : 0))) {
    free (dir);
    return -1;
  }
  if (config_create && create_make (io, name, size, readonly) == -1) {
    io->ops->close (io);
    free (dir);
    return -1;
  }
  *image = qcow2_open (&glue_env, io, name, &glue.engine);
  free (dir);
  glue.engine.names_dir = NULL;
  /* The image and its backing files are open: their keys are made. */
  glue_forget_password ();
  if (!*image) {
    if ((errno == ENODATA || errno == EMEDIUMTYPE) &&
        (io = below_nextio_new (size, NEXTIO_READONLY)) != NULL) {
      create_hint_empty (io, name);
      io->ops->close (io);
    }
    return -1;
  }
  r = glue_opened (*image, name, asked_readonly,
                   readonly && !asked_readonly ?
                   "the plugin below cannot write" : NULL);
  if (r == 0 && config_create &&
      qcow2_preallocate (*image, glue.create.opts.preallocation) < 0)
    r = -1;
  if (r == 0 && glue.repair_leaks)
    r = glue_repair (*image, name);
  return r;
}

/* The engine's debug messages in start_probe, which opens the image
 * read-only whatever is served.
 */
static void
start_probe_debug (void *opaque, const char *msg)
{
  nbdkit_debug ("before the fork: %s", msg);
}

/* Before nbdkit forks, when the disk below is a local file that
 * nbdkit's file plugin serves with no filter between: what after_fork
 * would refuse of it is refused now, so that the refusal reaches the
 * terminal before nbdkit listens.  The file is opened as the plugin
 * opens it (read-only if it cannot be written) and locked as
 * below_lock_file locks it, so that a lock QEMU holds is refused; the
 * image opened read-only with the same keys (create=true: the checks
 * of the export, if a regular file) and closed: nothing written, no
 * lock held across the fork.  after_fork opens it again (the file may
 * change in between).  Returns 0, or -1 after logging an error.
 */
static int
start_probe (void)
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
  if (config_names (regular ? file : NULL, &name, &dir) == -1) {
    io->ops->close (io);
    return -1;
  }
  /* A block device has no holes to seek (EINVAL): the plugin's reads
   * check it after the fork.
   */
  if (config_create) {
    r = regular ? create_check (io, name, readonly) : 0;
    io->ops->close (io);
    free (dir);
    return r;
  }
  opts = glue.engine;
  opts.names_dir = dir;
  opts.readonly = true;
  opts.copy_on_read = false;
  opts.io_threads = 0;          /* no threads before the fork */
  /* Notices are logged once, after the fork. */
  env.opaque = &backing_fo;
  env.notice = NULL;
  env.debug = start_probe_debug;
  img = qcow2_open (&env, io, name, &opts);
  e = errno;
  free (dir);
  if (!img) {
    if ((e == ENODATA || e == EMEDIUMTYPE) &&
        (io = fileio_open_with (file, true, &fo, NULL)) != NULL) {
      create_hint_empty (io, name);
      io->ops->close (io);
    }
    return -1;
  }
  r = glue_opened_check (img, name, asked_readonly);
  qcow2_close (img);
  return r;
}

int
start_get_ready (void)
{
  if (start_probe () == -1 || overlay_get_ready () == -1)
    return -1;
  glue_start_watch ();
  return 0;
}

int
start_open (nbdkit_backend *backend, struct qcow2_image **image)
{
  int r;

  glue_start_begin ();
  r = start_open_image (backend, image);
  glue_start_end (r == 0);
  return r;
}
