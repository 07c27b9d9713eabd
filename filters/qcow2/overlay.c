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

#include "errstr.h"
#include "fileio.h"
#include "filter.h"
#include "glue.h"
#include "qcow2.h"

static char *overlay_file;      /* qcow2-overlay=, absolute */
static char *overlay_backing;   /* qcow2-overlay-backing=, as given */
static bool overlay_on_read;    /* qcow2-overlay-on-read=true */
/* qcow2-overlay-on-read=/PATH: copy-on-read while PATH exists (as the
 * cow filter's cow-on-read=/PATH).
 */
static char *overlay_on_read_path;
/* qcow2-overlay-on-cache=: whether cache requests fill FILE (the cow
 * filter's cow-on-cache=); -1, not given: as copy-on-read does.
 */
static int overlay_on_cache = -1;
static bool overlay_force;      /* qcow2-overlay-force= */
/* Set before nbdkit forks (overlay_get_ready): FILE was there and its
 * record checked; it is served alone (see overlay_standalone).
 */
static bool overlay_checked;
static bool overlay_alone;

/* What FILE records when qcow2-overlay-backing= is not given: our name
 * of the disk below (record.c).
 */
static char *overlay_own_name;

static int
overlay_config_file (const char *key, const char *value)
{
  free (overlay_file);
  overlay_file = value[0] ? nbdkit_absolute_path (value) : NULL;
  if (!value[0])
    nbdkit_error ("qcow2-overlay: empty file name");
  return overlay_file ? 0 : -1;
}

static int
overlay_config_backing (const char *key, const char *value)
{
  free (overlay_backing);
  overlay_backing = value[0] ? strdup (value) : NULL;
  if (!value[0])
    nbdkit_error ("qcow2-overlay-backing: empty name (without the key, "
                  "no backing file name is recorded)");
  return overlay_backing ? 0 : -1;
}

/* true|false, or /PATH. */
static int
overlay_config_on_read (const char *key, const char *value)
{
  free (overlay_on_read_path);
  overlay_on_read_path = NULL;
  overlay_on_read = false;
  if (value[0] != '/')
    return glue_parse_bool (key, value, &overlay_on_read);
  overlay_on_read_path = strdup (value);
  if (!overlay_on_read_path)
    nbdkit_error ("strdup: %s", errstr (errno));
  return overlay_on_read_path ? 0 : -1;
}

static int
overlay_config_on_cache (const char *key, const char *value)
{
  bool b;

  if (glue_parse_bool (key, value, &b) == -1)
    return -1;
  overlay_on_cache = b;
  return 0;
}

static const struct glue_option overlay_options[] = {
  { "qcow2-overlay", GLUE_FN, .any_value = true, .fn = overlay_config_file },
  { "qcow2-overlay-backing", GLUE_FN, .any_value = true,
    .fn = overlay_config_backing },
  { "qcow2-overlay-on-read", GLUE_FN, .any_value = true,
    .fn = overlay_config_on_read },
  { "qcow2-overlay-on-cache", GLUE_FN, .fn = overlay_config_on_cache },
  { "qcow2-overlay-force", GLUE_BOOL, .dest = &overlay_force },
  { "qcow2-overlay-stream", GLUE_BOOL, .dest = &glue_stream.on },
  { "qcow2-overlay-stream-rate", GLUE_SIZE, .dest = &glue_stream.rate,
    .given = &glue_stream.rate_given },
  { "qcow2-overlay-stream-detach", GLUE_BOOL, .dest = &glue_stream.detach,
    .given = &glue_stream.detach_given },
};

int
overlay_config (const char *key, const char *value)
{
  return glue_config_rows (overlay_options,
                           sizeof overlay_options / sizeof *overlay_options,
                           key, value, NULL);
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

  if (glue_stream_config_complete ("qcow2-overlay-stream") == -1)
    return -1;
  if (!overlay_file) {
    if (overlay_backing || overlay_on_read || overlay_on_read_path ||
        overlay_on_cache != -1 || overlay_force || glue_stream.on) {
      nbdkit_error ("%s needs qcow2-overlay=FILE", overlay_backing ?
                    "qcow2-overlay-backing=" : overlay_on_read ||
                    overlay_on_read_path ? "qcow2-overlay-on-read=" :
                    overlay_on_cache != -1 ? "qcow2-overlay-on-cache=" :
                    overlay_force ? "qcow2-overlay-force=" :
                    "qcow2-overlay-stream=");
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
    nbdkit_error ("qcow2-overlay=%s: preallocation= needs extended-l2=on",
                  overlay_file);
    glue_hint ("a cluster preallocated whole would hide the plugin's disk "
               "there");
    return -1;
  }
  if (glue_stream.on && (glue.engine.readonly || glue_server_readonly ())) {
    nbdkit_error ("qcow2-overlay-stream=true copies the plugin's disk into "
                  "%s: not with nbdkit -r or readonly=true", overlay_file);
    return -1;
  }
  if ((overlay_on_read || overlay_on_read_path || overlay_on_cache == 1) &&
      (glue.engine.readonly || glue_server_readonly ())) {
    nbdkit_error ("%s%s writes what is read into %s: not with nbdkit -r",
                  overlay_on_read ? "qcow2-overlay-on-read=true" :
                  overlay_on_read_path ? "qcow2-overlay-on-read=" :
                  "qcow2-overlay-on-cache=true",
                  overlay_on_read_path ? overlay_on_read_path : "",
                  overlay_file);
    return -1;
  }
  if (!(overlay_own_name = record_name (below_identity (), below_stack ())))
    return -1;
  /* FILE's backing file is the plugin's disk, raw: the name given, else
   * ours, which QEMU refuses.
   */
  glue.create.opts.backing = overlay_backing ? overlay_backing
                                             : overlay_own_name;
  glue.create.opts.backing_format = "raw";
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

/* Makes FILE (a disk of size bytes, in a new or empty file), locked for
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
    glue_file_error (why, e, "qcow2-overlay: making %s", overlay_file);
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

/* Opens FILE for the engine: made if missing or empty, else as it is.
 * Returns NULL on error (logged).
 */
static struct qcow2_io *
overlay_open_file (bool readonly, int64_t size, enum overlay_made *made)
{
  struct stat st;
  bool existed = stat (overlay_file, &st) == 0;
  struct qcow2_io *io;
  char *why = NULL;

  *made = MADE_NOTHING;
  if (overlay_alone && (!existed || st.st_size == 0)) {
    nbdkit_error ("qcow2-overlay: %s is gone since nbdkit started",
                  overlay_file);
    return NULL;
  }
  if (!existed || st.st_size == 0) {
    if (!readonly)
      return overlay_make_file (existed, size, made);
    nbdkit_error ("qcow2-overlay: %s %s, and nbdkit serves read-only (-r): "
                  "it is made only to be written", overlay_file,
                  existed ? "is empty" : "does not exist");
    return NULL;
  }
  io = fileio_open_with (overlay_file, readonly, &glue_file_options, &why);
  if (!io)
    glue_file_error (why, errno, "qcow2-overlay: %s", overlay_file);
  return io;
}

/* FILE's record checked (record_check); served alone if it has none and
 * qcow2-overlay-stream=true is given again.  Returns 0, or -1 after
 * logging an error.
 */
static int
overlay_check_record (struct qcow2_image *img)
{
  const struct record_given g = {
    .file = overlay_file, .backing = overlay_backing,
    .own_name = overlay_own_name, .force = overlay_force,
  };
  int r = record_check (img, &g);

  overlay_alone = r == 1;
  return r < 0 ? -1 : 0;
}

/* Once nbdkit has forked and the plugin is open, checks FILE's size
 * (known before only when the file plugin serves a local file
 * directly), and, if FILE was not there before, what it records.
 * Returns 0, or -1 after logging an error.
 */
static int
overlay_check (struct qcow2_image *img, int64_t size)
{
  if (!overlay_checked && overlay_check_record (img) == -1)
    return -1;
  return record_check_size (img, overlay_file, size);
}

int
overlay_get_ready (void)
{
  bool readonly = glue.engine.readonly || glue_server_readonly ();
  struct qcow2_options opts = glue.engine;
  struct qcow2_image *img;
  struct qcow2_io *io;
  struct stat st;
  char *why = NULL;
  bool missing;
  int r;

  if (!overlay_file)
    return 0;
  if (record_is_below (overlay_file))
    return -1;
  if (overlay_backing && !overlay_force &&
      record_other_file (overlay_file, overlay_backing)) {
    nbdkit_error ("qcow2-overlay-backing=%s is another file than the "
                  "plugin's (%s)", overlay_backing, below_served_file ());
    glue_hint ("FILE's backing file is the plugin's disk "
               "(qcow2-overlay-force=true records it anyway)");
    return -1;
  }
  /* Missing or empty: made once nbdkit has forked, if it may write. */
  missing = stat (overlay_file, &st) == -1;
  if (missing || st.st_size == 0) {
    if (!readonly)
      return 0;
    nbdkit_error ("qcow2-overlay: %s %s, and nbdkit serves read-only (-r): "
                  "it is made only to be written", overlay_file,
                  missing ? "does not exist" : "is empty");
    return -1;
  }
  io = fileio_open_with (overlay_file, true, &glue_file_options, &why);
  if (!io) {
    glue_file_error (why, errno, "qcow2-overlay: %s", overlay_file);
    return -1;
  }
  /* FILE alone, read-only, just for its header: its backing file is
   * what is being checked.
   */
  opts.readonly = true;
  opts.no_backing = true;
  opts.backing_chain_len = 0;
  opts.backing_io = NULL;
  opts.copy_on_read = false;
  opts.io_threads = 0;
  img = qcow2_open (&glue_env, io, overlay_file, &opts);
  if (!img) {
    if (errno == EMEDIUMTYPE)
      record_not_qcow2 (overlay_file);
    return -1;
  }
  r = overlay_check_record (img);
  if (r == 0 && !overlay_alone && below_served_size () >= 0)
    r = record_check_size (img, overlay_file, below_served_size ());
  qcow2_close (img);
  overlay_checked = r == 0;
  return r;
}

bool
overlay_standalone (void)
{
  return overlay_alone;
}

int
overlay_open (int64_t size, struct qcow2_image **image)
{
  bool readonly = glue.engine.readonly || glue_server_readonly ();
  bool below = size >= 0;
  struct qcow2_options opts = glue.engine;
  enum overlay_made made;
  struct qcow2_io *io;
  int e;

  assert (overlay_file && overlay_own_name);    /* overlay_active () */
  assert (!below == overlay_alone);

  /* A local file the plugin serves is locked as QEMU locks a backing
   * file: no one may write it while it is under FILE.
   */
  if (below && below_lock_file (true) == -1)
    return -1;
  if (!below)
    glue_noticef (overlay_file, "qcow2-overlay-stream=true: FILE holds the "
                  "whole disk, streamed and detached already: served alone, "
                  "the plugin below unused");
  if (!(io = overlay_open_file (readonly, size, &made)))
    return -1;
  opts.readonly = readonly;
  opts.copy_on_read = overlay_on_read && below;
  if (below) {
    opts.backing_io_name = below_name ();
    opts.backing_io = below_nextio_new (size,
                                        NEXTIO_READONLY | NEXTIO_EXTENTS);
    if (!opts.backing_io) {
      io->ops->close (io);
      overlay_undo (made);
      return -1;
    }
  }
  *image = qcow2_open (&glue_env, io, overlay_file, &opts);
  e = errno;
  /* FILE is open: its key is made (and a new FILE's header written). */
  glue_forget_password ();
  if (!*image && e == EMEDIUMTYPE)
    record_not_qcow2 (overlay_file);
  else if (*image && made == MADE_NOTHING && below &&
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
  if (below)
    nbdkit_debug ("qcow2-overlay: %s over the plugin's disk (%" PRId64
                  " bytes)%s", overlay_file, size,
                  overlay_on_read ? ", copying what is read" : "");
  return 0;
}

bool
overlay_fills_reads (void)
{
  return overlay_on_read_path && access (overlay_on_read_path, F_OK) == 0;
}

bool
overlay_fills_cache (void)
{
  return overlay_on_cache == -1 ? overlay_on_read || overlay_fills_reads ()
                                : overlay_on_cache;
}

int
overlay_can_cache (void)
{
  /* Answered in every overlay, as the cow filter does: whether a
   * request fills FILE may change while nbdkit runs.
   */
  return overlay_file ? NBDKIT_CACHE_NATIVE : NBDKIT_CACHE_NONE;
}

void
overlay_unload (void)
{
  free (overlay_file);
  free (overlay_backing);
  free (overlay_own_name);
  free (overlay_on_read_path);
}
