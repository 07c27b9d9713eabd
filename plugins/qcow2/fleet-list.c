/* SPDX-License-Identifier: BSD-3-Clause */
/* dir='s listing (nbdinfo --list), and what each export's description
 * says.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
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

/* What an export's description says of its image; closed: the image
 * is not open (with stream=true, its stream is not running).
 */
char *
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

/* The description of the image at path (of the export name): NULL if
 * it is not a qcow2 image.  An image open is asked; another is read
 * without taking its locks (a writer may hold them), without its
 * backing files.
 */
static char *
fleet_describe (const char *name, const char *path)
  TSA_EXCLUDES (&fleet_lock)
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

  lock_acquire (&fleet_lock);
  for (struct fleet_export *e = fleet_exports; e; e = e->next)
    if (e->state == EXPORT_OPEN && !e->stale &&
        strcmp (e->path, path) == 0) {
      s = fleet_export_text (e);
      lock_release (&fleet_lock);
      return s;
    }
  lock_release (&fleet_lock);

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
int
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

const char *
fleet_description (struct plugin_export *served)
{
  char *s = fleet_export_text (fleet_entry (served));
  const char *r = s ? nbdkit_strdup_intern (s) : NULL;

  free (s);
  return r;
}
