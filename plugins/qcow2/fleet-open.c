/* SPDX-License-Identifier: BSD-3-Clause */
/* dir=: the image of an export opened.  Its file is found beneath the
 * folder from dir='s descriptor (fileio's beneath: links followed one
 * step at a time inside DIR, "..", absolute links and anything but a
 * regular file refused before any read, lock or write), and so is
 * every file an image names in DIR: nothing outside DIR is opened
 * because of a name there, swapped in while it is opened or not.  A
 * name with no file is made by template=; a file this server already
 * serves (another name of an open image, a base of open images, an
 * image written and named as a base) is refused or served read-only,
 * saying which export holds it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "errstr.h"
#include "fileio.h"
#include "fleet.h"
#include "glue.h"
#include "qcow2.h"

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

char *
fleet_env_identity (void *opaque, const char *path)
{
  struct stat st;

  return fileio_stat_with (path, opaque, &st) == 0 ? fleet_identity_of (&st)
                                                   : NULL;
}

/* Whether an open export other than self has the file st (with idle,
 * one that no client uses too): its name then in buf.
 */
static bool
fleet_served_as (const struct stat *st, const struct fleet_export *self,
                 bool idle, char buf[FLEET_SHOWN_MAX])
  TSA_EXCLUDES (&fleet_lock)
{
  bool found = false;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  for (struct fleet_export *e = fleet_exports; e && !found; e = e->next)
    if (e != self && e->state == EXPORT_OPEN && e->dev == st->st_dev &&
        e->ino == st->st_ino && (idle || e->users > 0)) {
      fleet_shown (e->name, buf);
      found = true;
    }
  return found;
}

/* glue_env's open, the file known as above (an image this server
 * writes is refused as a backing file by the layers' table, before).
 */
struct qcow2_io *
fleet_env_open (void *opaque, const char *path, bool readonly, char **id)
{
  struct qcow2_io *io;
  struct stat st;
  int e;

  io = glue_env.open (opaque, path, readonly, id);
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

/* stream=true: the job of e's image (at path) made, to start at its
 * first request (a listing that opens the export for a moment starts
 * nothing).  An image with no backing file has nothing to stream: it
 * is served as it is, even read-only (the template may be).  Returns 0,
 * or -1 after logging an error.
 */
static int
fleet_stream (struct fleet_export *e, const char *path)
{
  struct qcow2_info i;

  qcow2_get_info (e->served.image, &i);
  if (!i.backing)
    return 0;
  /* Read before the job may change it. */
  e->info = fleet_info_text (e->served.image, false);
  if (!e->info) {
    nbdkit_error ("%s: %s", path, errstr (errno));
    return -1;
  }
  /* nbdkit -r and readonly=true are refused at start: an image read-only
   * here is so for a reason logged as it was opened.
   */
  if (glue_stream_job_new (e->served.image, path, "stream", false,
                           &e->served.inflight, &e->served.job) == -1)
    return -1;
  glue_stream_job_arm (e->served.job);
  return 0;
}

/* How a fleet's image is opened.  Its overlays each use little of their
 * disk; a shared remote base keeps 2 MiB of what it fetched, not 32:
 * one server's memory weighs more there than its base's traffic.
 */
static struct image_how
fleet_how (struct fleet_export *e)
{
  return (struct image_how) {
    .env = &e->env, .files = &fleet.files, .small_l2_slices = true,
    .remote_keep = UINT64_C (2) << 20,
  };
}

/* The file of e's name, as its open will find it, into st; made from
 * template= if there is none (then *iop is its file, open, locked;
 * *made what it is).  Returns 0, or -1 after logging an error.
 */
static int
fleet_find_file (struct fleet_export *e, const char *shown,
                 const char *named, struct stat *st, struct qcow2_io **iop,
                 struct stat *made)
{
  int err;

  *iop = NULL;
  if (fileio_stat_with (named, &fleet.files, st) == 0)
    return 0;
  if (errno == ENOENT && fleet_has_template ()) {
    if (fleet_create (shown, e->name, iop, made) == -1)
      return -1;
    if (*iop) {
      *st = *made;
      return 0;
    }
    /* Made by another meanwhile: that one is served. */
    if (fileio_stat_with (named, &fleet.files, st) == 0)
      return 0;
  }
  err = errno;
  if (err == ENOENT)
    nbdkit_error ("export \"%s\": no such image in %s", shown, fleet.dir);
  else if (err == EXDEV || err == ELOOP)
    nbdkit_error ("export \"%s\": refused: it is a link leading out of "
                  "dir= (by \"..\" or to an absolute name), or through "
                  "more than 40 links", shown);
  else
    nbdkit_error ("export \"%s\": %s", shown, errstr (err));
  return -1;
}

/* Why e's file st is served read-only, or NULL. */
static const char *
fleet_readonly_why (const struct stat *st)
{
  char *id;
  bool layer;

  if (fleet_is_template (st))
    return "it is the template= of new exports: a write would change "
      "every overlay made of it";
  id = fleet_identity_of (st);
  layer = id && qcow2_layers_has (fleet.layers, id);
  free (id);
  return layer ? "it is the backing file of images open here: a write "
    "would change them" : NULL;
}

/* The image of e opened, its checks done; quiet: errors that may go
 * once idle images are closed as debug messages, for a second try.
 * Returns 0; or -1 after logging an error, with *again if a try with
 * the idle images closed may succeed.
 */
static int
fleet_open_file (struct fleet_export *e, const char *shown,
                 const char *named, bool quiet, bool *again)
{
  struct image_how how = fleet_how (e);
  char other[FLEET_SHOWN_MAX];
  struct qcow2_io *io;
  struct stat st, made_st;
  bool readonly;

  *again = false;
  if (fleet_find_file (e, shown, named, &st, &io, &made_st) == -1)
    return -1;
  if (!S_ISREG (st.st_mode)) {
    nbdkit_error ("export \"%s\": refused: %s is not a regular file",
                  shown, named);
    return -1;
  }
  if (fleet_served_as (&st, e, quiet, other)) {
    /* Idle, that export is closed for this one. */
    *again = quiet;
    (quiet ? nbdkit_debug : nbdkit_error)
      ("export \"%s\": refused: its file is that of export \"%s\", open "
       "here: an image is served by one name at a time", shown, other);
    if (io)
      io->ops->close (io);
    return -1;
  }
  e->env = fleet.env;
  if (quiet && !io)
    e->env.error = e->env.hint = glue_debug;
  how.quiet = quiet && !io;
  how.checked = &st;
  how.readonly_why = fleet_readonly_why (&st);
  e->served.image = image_open (named, io, &how, &readonly);
  e->env.error = glue_env.error;
  e->env.hint = glue_env.hint;
  if (!e->served.image ||
      (io && qcow2_preallocate (e->served.image,
                                glue.create.opts.preallocation) < 0) ||
      (glue.repair_leaks && glue_repair (e->served.image, named) == -1) ||
      (glue_stream.on && fleet_stream (e, named) == -1)) {
    *again = how.quiet && !e->served.image;
    qcow2_close (e->served.image);
    e->served.image = NULL;
    if (io)
      fleet_unlink_ours (e->name, &made_st);
    return -1;
  }
  e->dev = st.st_dev;
  e->ino = st.st_ino;
  return 0;
}

int
fleet_open_image (struct fleet_export *e, const char *shown, bool quiet,
                  bool *again)
{
  char *named;

  if (asprintf (&named, "%s/%s", fleet.dir, e->name) == -1) {
    nbdkit_error ("export \"%s\": %s", shown, errstr (errno));
    *again = false;
    return -1;
  }
  if (fleet_open_file (e, shown, named, quiet, again) == -1) {
    free (named);
    return -1;
  }
  free (e->path);
  e->path = named;
  return 0;
}

int
fleet_reopen (struct plugin_export *served)
  TSA_EXCLUDES (&fleet_lock)
{
  struct fleet_export *e = fleet_entry (served);
  struct image_how how = fleet_how (e);
  struct stat st;
  bool readonly;

  if (fileio_stat_with (e->path, &fleet.files, &st) == -1) {
    nbdkit_error ("%s: %s", e->path, errstr (errno));
    return -1;
  }
  how.checked = &st;
  e->env = fleet.env;
  served->image = image_open (e->path, NULL, &how, &readonly);
  if (!served->image)
    return -1;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  e->dev = st.st_dev;
  e->ino = st.st_ino;
  return 0;
}
