/* SPDX-License-Identifier: BSD-3-Clause */
/* dir='s listing (nbdinfo --list), and what each export's description
 * says.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "cleanup.h"
#include "errstr.h"
#include "escape.h"
#include "fileio.h"
#include "fleet.h"
#include "glue.h"
#include "lock.h"
#include "qcow2.h"

/* What an export's description says of its image; closed: the image
 * is not open (with stream=true, its stream is not running).
 */
char *
fleet_info_text (const struct qcow2_image *img, bool closed)
{
  struct qcow2_info i;
  char *s, *backing;

  qcow2_get_info (img, &i);
  /* The image's words: escaped. */
  backing = i.backing ? escape_dup (i.backing) : NULL;
  if ((i.backing && !backing) ||
      asprintf (&s, "qcow2, virtual size %" PRIu64 " bytes, %s%s%s", i.size,
                backing ? "backing file " : "no backing file",
                backing ? backing : "",
                closed && glue_stream.on && backing
                ? "; streaming: not running (the image streams, from "
                  "where it stands, once a client reads or writes it)"
                : "") == -1)
    s = NULL;
  free (backing);
  return s;
}

/* What the description of the open export e says: its image, and
 * with stream=true how far its stream got.  Until the stream has ended,
 * its image as it was opened (the job may cut it loose at any time).
 */
static char *
fleet_export_text (struct fleet_export *e)
{
  bool settled;
  const char *progress = glue_stream_job_description (e->served.job, &settled);
  char *info = settled ? fleet_info_text (e->served.image, false)
                       : strdup (e->info);
  char *s;

  if (!info || !progress)
    return info;
  if (asprintf (&s, "%s; %s", info, progress) == -1)
    s = NULL;
  free (info);
  return s;
}

/* The images the listing left out, each logged once: known by file
 * and change time, the last few (a listing of a folder with more bad
 * files than that logs some again).
 */
#define FLEET_UNLISTED_MAX 64
struct fleet_unlisted {
  dev_t dev;
  ino_t ino;
  struct timespec ctime;
};
static struct lock fleet_unlisted_lock = LOCK_INITIALIZER;
static struct fleet_unlisted fleet_unlisted[FLEET_UNLISTED_MAX]
  TSA_GUARDED_BY (&fleet_unlisted_lock);
static unsigned fleet_unlisted_next TSA_GUARDED_BY (&fleet_unlisted_lock);

/* name (at path, its file st) left out of the listing, for why:
 * logged unless it was already.
 */
static void
fleet_leave_out (const char *name, const char *path, const struct stat *st,
                 const char *why)
  TSA_EXCLUDES (&fleet_unlisted_lock)
{
  struct fleet_unlisted u = {
    .dev = st->st_dev, .ino = st->st_ino, .ctime = st->st_ctim,
  };
  char shown[FLEET_SHOWN_MAX];

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_unlisted_lock);
  for (unsigned k = 0; k < FLEET_UNLISTED_MAX; k++)
    if (memcmp (&fleet_unlisted[k], &u, sizeof u) == 0)
      return;
  fleet_unlisted[fleet_unlisted_next++ % FLEET_UNLISTED_MAX] = u;
  glue_noticef (path, "export \"%s\": not listed: %s",
                fleet_shown (name, shown), why);
}

/* What a listing reads an image through: dir='s files without locks
 * (a writer may hold them), past the page cache never; and the first
 * error the engine reports of it.  files first: the engine's
 * callbacks take it for the options (fleet_env_open, fileio).
 */
struct fleet_reading {
  struct fileio_options files;
  char why[1024];
};

static void
fleet_reading_error (void *opaque, const char *msg)
{
  struct fleet_reading *r = opaque;

  if (!r->why[0])
    snprintf (r->why, sizeof r->why, "%s", msg);
}

/* The local backing file img (in dir=) names, looked for, not opened:
 * 0 with *st, 1 if it names none or no local file, or -1 (errno set).
 */
static int
fleet_backing_stat (const struct qcow2_image *img, struct stat *st)
{
  CLEANUP_FREE char *path = NULL;
  struct qcow2_info i;

  qcow2_get_info (img, &i);
  if (!i.backing || glue.engine.no_backing ||
      (!qcow2_name_is_relative (i.backing) && i.backing[0] != '/'))
    return 1;
  if (i.backing[0] == '/')
    path = strdup (i.backing);
  else if (asprintf (&path, "%s/%s", fleet.dir, i.backing) == -1)
    path = NULL;
  if (!path)
    return 1;
  return fileio_stat_with (path, &fleet.files, st);
}

/* Whether img names a local backing file that is not there: a client
 * would be refused it, and so would nbdinfo --list, which opens each
 * export listed.  Why then in why.
 */
static bool
fleet_backing_missing (const struct qcow2_image *img, char *why, size_t n)
{
  char shown[ESCAPE_SIZE (64)];
  struct qcow2_info i;
  struct stat st;

  if (fleet_backing_stat (img, &st) != -1)
    return false;
  qcow2_get_info (img, &i);
  snprintf (why, n, "its backing file %s: %s",
            escape_text (i.backing, 64, shown), errstr (errno));
  return true;
}

/* The description of the open export of file st, or NULL (*open false)
 * if none is open.
 */
static char *
fleet_describe_open (const struct stat *st, bool *open)
  TSA_EXCLUDES (&fleet_lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  for (struct fleet_export *e = fleet_exports; e; e = e->next)
    if (e->state == EXPORT_OPEN && e->dev == st->st_dev &&
        e->ino == st->st_ino) {
      *open = true;
      return fleet_export_text (e);
    }
  *open = false;
  return NULL;
}

/* The description of the image of the export name: an image open is
 * asked; another is read from its own metadata alone, without taking
 * its locks, opening its backing files or starting a stream.  NULL if
 * it is not listed: not a qcow2 image, or one that cannot be read
 * (logged once).
 */
/* What a listing reads images with: r's options, and an environment
 * that keeps the engine's first error in r.
 */
static struct qcow2_env
fleet_reading_env (struct fleet_reading *r)
{
  struct qcow2_env env = fleet.env;

  r->files = fleet.files;
  r->files.locking = FILEIO_LOCKING_OFF;
  r->files.direct = false;
  r->why[0] = '\0';
  env.opaque = r;
  env.error = fleet_reading_error;
  env.hint = glue_debug;
  env.layers = NULL;
  return env;
}

/* Its own metadata alone, without its backing file. */
static const struct qcow2_options fleet_reading_opts = {
  .no_backing = true, .readonly = true,
};

static char *
fleet_describe (const char *name)
{
  struct fleet_reading r;
  struct qcow2_env env = fleet_reading_env (&r);
  struct qcow2_options opts = fleet_reading_opts;
  struct qcow2_image *img;
  struct qcow2_io *io;
  struct stat st;
  char *path, *why = NULL, *s;
  bool open;

  opts.passwords = glue.engine.passwords;
  opts.passwords_len = glue.engine.passwords_len;
  if (asprintf (&path, "%s/%s", fleet.dir, name) == -1)
    return NULL;
  io = fileio_open_with (path, true, &r.files, &why);
  if (!io) {
    /* Gone meanwhile: nothing to say. */
    if (errno != ENOENT && fstatat (fleet.dirfd, name, &st,
                                    AT_SYMLINK_NOFOLLOW) == 0)
      fleet_leave_out (name, path, &st, why ? why : errstr (errno));
    free (why);
    free (path);
    return NULL;
  }
  open = false;
  s = fileio_stat (io, &st) == 0 ? fleet_describe_open (&st, &open) : NULL;
  if (open || qcow2_probe (io) != 1)
    io->ops->close (io);
  else if ((img = qcow2_open (&env, io, path, &opts))) {
    if (fleet_backing_missing (img, r.why, sizeof r.why))
      fleet_leave_out (name, path, &st, r.why);
    else
      s = fleet_info_text (img, true);
    qcow2_close (img);
  }
  else
    fleet_leave_out (name, path, &st, r.why[0] ? r.why : errstr (errno));
  free (path);
  return s;
}

static int
fleet_compare_names (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

/* The names of dir= that may be exports (not hidden, not refused),
 * sorted: *names (n of them), or -1 after logging an error.
 */
static int
fleet_names (char ***names, size_t *n)
{
  int fd = dup (fleet.dirfd);
  DIR *d = fd == -1 ? NULL : fdopendir (fd);
  struct dirent *de;
  size_t cap = 0;

  *names = NULL;
  *n = 0;
  if (!d) {
    nbdkit_error ("list: %s: %s", fleet.dir, errstr (errno));
    if (fd >= 0)
      close (fd);
    return -1;
  }
  rewinddir (d);
  while ((de = readdir (d))) {
    if (fleet_name_refusal (de->d_name))
      continue;
    if (*n == cap) {
      char **more = realloc (*names, (cap = cap * 2 + 16) * sizeof *more);
      if (!more)
        break;
      *names = more;
    }
    if (!((*names)[*n] = strdup (de->d_name)))
      break;
    ++*n;
  }
  closedir (d);
  if (*n)
    qsort (*names, *n, sizeof **names, fleet_compare_names);
  return 0;
}

/* dir=: each qcow2 image in the folder that can be read, by name, as
 * the names it may be asked by.
 */
int
fleet_list (struct nbdkit_exports *exports)
{
  char **names;
  size_t n;
  int r = 0;

  if (fleet_names (&names, &n) == -1)
    return -1;
  for (size_t i = 0; i < n; i++) {
    char *s = r == 0 ? fleet_describe (names[i]) : NULL;

    if (s)
      r = nbdkit_add_export (exports, names[i], s);
    free (s);
    free (names[i]);
  }
  free (names);
  return r;
}

const char *
fleet_description (struct plugin_export *served)
{
  char *s = fleet_export_text (fleet_entry (served));
  const char *r = s ? nbdkit_strdup_intern (s) : NULL;

  free (s);
  return r;
}

/* Whether the image of name (in dir=) stands on the file base. */
static bool
fleet_stands_on (const char *name, const struct stat *base)
{
  struct fleet_reading r;
  struct qcow2_env env = fleet_reading_env (&r);
  CLEANUP_FREE char *path = NULL;
  struct qcow2_image *img;
  struct qcow2_io *io;
  struct stat st;
  bool on = false;

  if (asprintf (&path, "%s/%s", fleet.dir, name) == -1) {
    path = NULL;
    return false;
  }
  io = fileio_open_with (path, true, &r.files, NULL);
  if (io && qcow2_probe (io) != 1) {
    io->ops->close (io);
    return false;
  }
  if (io && (img = qcow2_open (&env, io, path, &fleet_reading_opts))) {
    on = fleet_backing_stat (img, &st) == 0 && st.st_dev == base->st_dev &&
      st.st_ino == base->st_ino;
    qcow2_close (img);
  }
  return on;
}

bool
fleet_backed_by (const struct stat *base, const char *self, char *who,
                 size_t n)
{
  char **names;
  size_t count;
  bool found = false;

  if (fleet_names (&names, &count) == -1)
    return true;                /* not known: as if so */
  for (size_t i = 0; i < count; i++) {
    if (!found && strcmp (names[i], self) != 0 &&
        fleet_stands_on (names[i], base)) {
      snprintf (who, n, "%s", names[i]);
      found = true;
    }
    free (names[i]);
  }
  free (names);
  return found;
}
