/* SPDX-License-Identifier: BSD-3-Clause */
/* The qcow2 filter's overlay mode, qcow2-overlay=FILE: the plugin's
 * disk as the raw backing file of the local qcow2 image FILE, which
 * keeps every change (nbdkit's cow filter keeps them in a temporary
 * file, lost at exit).  The plugin is opened read-only and never
 * written; FILE is made if missing, else continued, and locked as
 * QEMU locks an image.  Reads of what FILE does not hold go to the
 * plugin, block status there to the plugin's extents (the engine's
 * backing_io).  With qcow2-overlay-on-read=true, what is read from the
 * plugin, and what NBD cache requests name, is copied into FILE (the
 * engine's copy_on_read and qcow2_fill).
 */
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

#include "errstr.h"
#include "fileio.h"
#include "filter.h"
#include "glue.h"
#include "qcow2.h"

static char *overlay_file;      /* qcow2-overlay=, absolute */
static char *overlay_backing;   /* qcow2-overlay-backing=, as given */
static bool overlay_on_read;    /* qcow2-overlay-on-read= */

int
overlay_config (const char *key, const char *value)
{
  if (strcmp (key, "qcow2-overlay") == 0) {
    free (overlay_file);
    overlay_file = value[0] ? nbdkit_absolute_path (value) : NULL;
    if (!value[0])
      nbdkit_error ("qcow2-overlay: empty file name");
    return overlay_file ? 1 : -1;
  }
  if (strcmp (key, "qcow2-overlay-backing") == 0) {
    free (overlay_backing);
    overlay_backing = value[0] ? strdup (value) : NULL;
    if (!value[0])
      nbdkit_error ("qcow2-overlay-backing: empty name (without the key, "
                    "no backing file name is recorded)");
    return overlay_backing ? 1 : -1;
  }
  if (strcmp (key, "qcow2-overlay-on-read") == 0)
    return glue_parse_bool (key, value, &overlay_on_read) == 0 ? 1 : -1;
  if (strcmp (key, "qcow2-overlay-stream") == 0)
    return glue_parse_bool (key, value, &glue_stream.on) == 0 ? 1 : -1;
  if (strcmp (key, "qcow2-overlay-stream-rate") == 0)
    return glue_parse_size (key, value, false, &glue_stream.rate) == 0
           ? 1 : -1;
  if (strcmp (key, "qcow2-overlay-stream-detach") == 0)
    return glue_parse_bool (key, value, &glue_stream.detach) == 0 ? 1 : -1;
  return 0;
}

bool
overlay_active (void)
{
  return overlay_file != NULL;
}

int
overlay_config_complete (bool create, bool chain)
{
  const char *clash =
    create ? "create=true (which makes an image in the plugin's export)" :
    chain || glue.engine.no_backing ? "backing= (with qcow2-overlay=, the "
    "plugin's disk is FILE's backing file)" :
    glue.create.size != -1 ? "virtual-size= (FILE's disk is as large as "
    "the plugin's)" : NULL;

  if (!overlay_file) {
    if (overlay_backing || overlay_on_read || glue_stream.on) {
      nbdkit_error ("%s needs qcow2-overlay=FILE", overlay_backing ?
                    "qcow2-overlay-backing=" : overlay_on_read ?
                    "qcow2-overlay-on-read=" : "qcow2-overlay-stream=");
      return -1;
    }
    return 0;
  }
  if (clash) {
    nbdkit_error ("qcow2-overlay=%s cannot go with %s", overlay_file, clash);
    return -1;
  }
  /* As qemu-img: a cluster preallocated whole would hide the disk
   * below; with extended L2 its subclusters stay unallocated.
   */
  if (glue.create.opts.preallocation != QCOW2_PREALLOC_OFF &&
      !glue.create.opts.extended_l2) {
    nbdkit_error ("qcow2-overlay=%s: preallocation= needs extended-l2=on "
                  "(a cluster preallocated whole would hide the plugin's "
                  "disk there)", overlay_file);
    return -1;
  }
  if (glue_stream.on && (glue.engine.readonly || glue_server_readonly ())) {
    nbdkit_error ("qcow2-overlay-stream=true copies the plugin's disk into "
                  "%s: not with nbdkit -r or readonly=true", overlay_file);
    return -1;
  }
  if (overlay_on_read && (glue.engine.readonly || glue_server_readonly ())) {
    nbdkit_error ("qcow2-overlay-on-read=true writes what is read into %s: "
                  "not with nbdkit -r", overlay_file);
    return -1;
  }
  /* FILE's backing file, if named, is the plugin's disk: raw. */
  glue.create.opts.backing = overlay_backing;
  glue.create.opts.backing_format = overlay_backing ? "raw" : NULL;
  glue.create.opts.size = 0;
  return qcow2_create_check (&glue_env, &glue.create.opts) < 0 ? -1 : 0;
}

/* What overlay_open_file did to the file system, undone if FILE is
 * not served after all.
 */
enum overlay_made { MADE_NOTHING, MADE_NEW_FILE, MADE_IN_EMPTY_FILE };

static void
overlay_undo (enum overlay_made made)
{
  if ((made == MADE_NEW_FILE && unlink (overlay_file) == -1) ||
      (made == MADE_IN_EMPTY_FILE && truncate (overlay_file, 0) == -1))
    nbdkit_error ("qcow2-overlay: removing what was made of %s: %s",
                  overlay_file, errstr (errno));
}

/* FILE made (a disk of size bytes, in a new or empty file), locked for
 * writing before anything is written.
 */
static struct qcow2_io *
overlay_make_file (bool existed, int64_t size, enum overlay_made *made)
{
  struct qcow2_io *io;
  char *why = NULL, *what;
  int r;

  /* A password always means encryption, as with create=true. */
  if (asprintf (&what, "qcow2-overlay=%s (made now)", overlay_file) < 0) {
    nbdkit_error ("qcow2-overlay: %s", errstr (errno));
    return NULL;
  }
  r = glue_create_check_password (what);
  free (what);
  if (r == -1)
    return NULL;
  glue.create.opts.size = (size + 511) & ~INT64_C (511);
  io = fileio_create (overlay_file, &glue_file_options, &why);
  if (!io) {
    int e = errno;

    if (!existed && e != EEXIST)
      unlink (overlay_file);            /* made, then not opened */
    nbdkit_error ("qcow2-overlay: making %s: %s", overlay_file,
                  why ? why : errstr (e));
    free (why);
    return NULL;
  }
  *made = existed ? MADE_IN_EMPTY_FILE : MADE_NEW_FILE;
  if (qcow2_create (&glue_env, io, &glue.create.opts) < 0) {
    io->ops->close (io);
    overlay_undo (*made);
    *made = MADE_NOTHING;
    return NULL;
  }
  nbdkit_debug ("qcow2-overlay: %s made: a disk of %" PRIu64 " bytes over "
                "the plugin's", overlay_file, glue.create.opts.size);
  return io;
}

/* FILE, opened for the engine: made if missing or empty, else as it
 * is.  NULL on error (said).
 */
static struct qcow2_io *
overlay_open_file (bool readonly, int64_t size, enum overlay_made *made)
{
  struct stat st;
  bool existed = stat (overlay_file, &st) == 0;
  struct qcow2_io *io;
  char *why = NULL;

  *made = MADE_NOTHING;
  if (!existed || st.st_size == 0) {
    if (!readonly)
      return overlay_make_file (existed, size, made);
    nbdkit_error ("qcow2-overlay: %s %s, and nbdkit serves read-only (-r): "
                  "it is made only to be written", overlay_file,
                  existed ? "is empty" : "does not exist");
    return NULL;
  }
  io = fileio_open_with (overlay_file, readonly, &glue_file_options, &why);
  if (!io) {
    nbdkit_error ("qcow2-overlay: %s: %s", overlay_file,
                  why ? why : errstr (errno));
    free (why);
  }
  return io;
}

/* FILE continued must be an overlay of this disk: as large, and
 * naming qcow2-overlay-backing= if given.  0, or -1 said.
 */
static int
overlay_check (struct qcow2_image *img, int64_t size)
{
  uint64_t want = (size + 511) & ~INT64_C (511);
  const char *name = qcow2_get_backing_name (img);

  if (qcow2_get_size (img) != want) {
    nbdkit_error ("qcow2-overlay: %s holds a disk of %" PRIu64 " bytes, but "
                  "the plugin's disk is %" PRId64 " bytes: an overlay is "
                  "as large as the disk below it (if the plugin's disk has "
                  "grown, \"qemu-img resize %s %" PRIu64 "\" grows %s)",
                  overlay_file, qcow2_get_size (img), size, overlay_file,
                  want, overlay_file);
    return -1;
  }
  if (overlay_backing && (!name || strcmp (name, overlay_backing) != 0)) {
    nbdkit_error ("qcow2-overlay: %s records %s%s%s as its backing file, "
                  "not \"%s\": \"qemu-img rebase -u -b %s -F raw %s\" "
                  "records the new name", overlay_file, name ? "\"" : "",
                  name ? name : "no name", name ? "\"" : "", overlay_backing,
                  overlay_backing, overlay_file);
    return -1;
  }
  return 0;
}

int
overlay_open (nbdkit_next *below, int64_t size, const char *name,
              struct qcow2_image **image)
{
  bool readonly = glue.engine.readonly || glue_server_readonly ();
  struct qcow2_options opts = glue.engine;
  enum overlay_made made;
  struct qcow2_io *io;
  int e;

  /* A local file the plugin serves is locked as QEMU locks a backing
   * file: no one may write it while it is under FILE.
   */
  if (filter_lock_below (true) == -1 ||
      !(io = overlay_open_file (readonly, size, &made)))
    return -1;
  opts.readonly = readonly;
  opts.copy_on_read = overlay_on_read;
  opts.backing_io_name = name;
  opts.backing_io = filter_nextio_new (below, size,
                                       NEXTIO_READONLY | NEXTIO_EXTENTS);
  if (!opts.backing_io) {
    io->ops->close (io);
    overlay_undo (made);
    return -1;
  }
  *image = qcow2_open (&glue_env, io, overlay_file, &opts);
  e = errno;
  /* FILE is open: its key is made (and a new FILE's header written). */
  glue_forget_password ();
  if (!*image && e == EMEDIUMTYPE)
    nbdkit_error ("qcow2-overlay: %s is not a qcow2 image: name a new file, "
                  "or remove it", overlay_file);
  else if (*image && made == MADE_NOTHING &&
           overlay_check (*image, size) == -1) {
    qcow2_close (*image);
    *image = NULL;
  }
  if (!*image) {
    overlay_undo (made);
    return -1;
  }
  if (glue_opened (*image, overlay_file, readonly, NULL) == -1 ||
      (glue.repair_leaks && glue_repair (*image, overlay_file) == -1))
    return -1;
  /* A new FILE's preallocation= (extended L2: the disk shows through). */
  if (made != MADE_NOTHING &&
      glue.create.opts.preallocation != QCOW2_PREALLOC_OFF &&
      qcow2_preallocate (*image, glue.create.opts.preallocation) < 0) {
    qcow2_close (*image);
    *image = NULL;
    overlay_undo (made);
    return -1;
  }
  if (glue_stream_prepare (*image, overlay_file, "qcow2-overlay-stream",
                           readonly) == -1 ||
      glue_stream_start () == -1)
    return -1;
  nbdkit_debug ("qcow2-overlay: %s over the plugin's disk (%" PRId64
                " bytes)%s", overlay_file, size,
                overlay_on_read ? ", copying what is read" : "");
  return 0;
}

int
overlay_can_cache (void)
{
  return overlay_on_read ? NBDKIT_CACHE_NATIVE : NBDKIT_CACHE_NONE;
}

void
overlay_unload (void)
{
  free (overlay_file);
  free (overlay_backing);
}
