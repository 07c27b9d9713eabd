/* SPDX-License-Identifier: BSD-3-Clause */
/* template=: the image of a new export name made, an overlay of the
 * template, so that no half-made image is ever served; and the files a
 * crash left half made removed at start.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "errstr.h"
#include "fileio.h"
#include "fleet.h"
#include "glue.h"
#include "qcow2.h"

/* The name (in dir=) removed if it still names the file ours is: what
 * another made under it meanwhile is not ours to remove.
 */
void
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
int
fleet_create (const char *shown, const char *named, struct qcow2_io **iop,
              struct stat *made)
{
  struct qcow2_create_options opts = glue.create.opts;
  enum image_made how;
  struct qcow2_io *io = NULL;
  char *tmp = NULL;
  bool linked = false;
  int fd, r = -1;

  *iop = NULL;
  opts.backing = fleet.template;
  if (image_create_options (named, &opts, glue.create.size) == -1)
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
  io = image_create_file (tmp, &how);
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
bool
fleet_is_template (const struct stat *st)
{
  struct stat t;

  return fleet.template_path && stat (fleet.template_path, &t) == 0 &&
    t.st_dev == st->st_dev && t.st_ino == st->st_ino;
}

/* template=: the temporary files (.new-XXXXXX, see fleet_create) of
 * images a crash left half made, removed; one another server is making
 * is locked by it, and left.
 */
void
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
