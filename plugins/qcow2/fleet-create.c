/* SPDX-License-Identifier: BSD-3-Clause */
/* template=: the image of a new export name made, an overlay of the
 * template, so that no half-made image is ever served; and the files a
 * crash left half made removed at start.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "cleanup.h"
#include "errstr.h"
#include "fileio.h"
#include "fleet.h"
#include "glue.h"
#include "humansize.h"
#include "lock.h"
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

/* Why template= makes no image of name (match: template-match=), or
 * NULL.
 */
static const char *
fleet_create_refusal (const char *name, const char *match)
{
  if (!fleet_creatable (name))
    return "template= makes only names of [A-Za-z0-9][A-Za-z0-9._-]*";
  if (match && fnmatch (match, name, 0) != 0)
    return "template-match= does not allow making it";
  return NULL;
}

bool
fleet_can_create (const char *name)
  TSA_EXCLUDES (&fleet_lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  return fleet_live.template &&
    !fleet_create_refusal (name, fleet_live.template_match);
}

bool
fleet_has_template (void)
  TSA_EXCLUDES (&fleet_lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  return fleet_live.template != NULL;
}

/* The images in dir=: the names that are exports (not hidden, not
 * refused) of regular files or links.
 */
static uint64_t
fleet_count_images (void)
{
  int fd = dup (fleet.dirfd);
  DIR *d = fd == -1 ? NULL : fdopendir (fd);
  struct dirent *de;
  uint64_t n = 0;

  if (!d) {
    if (fd >= 0)
      close (fd);
    return 0;
  }
  rewinddir (d);
  while ((de = readdir (d))) {
    struct stat st;

    if (fleet_name_refusal (de->d_name))
      continue;
    if (de->d_type == DT_UNKNOWN &&
        fstatat (fleet.dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
      de->d_type = S_ISREG (st.st_mode) ? DT_REG
        : S_ISLNK (st.st_mode) ? DT_LNK : DT_UNKNOWN;
    n += de->d_type == DT_REG || de->d_type == DT_LNK;
  }
  closedir (d);
  return n;
}

bool
fleet_images_room (void)
  TSA_EXCLUDES (&fleet_lock)
{
  uint64_t max;

  lock_acquire (&fleet_lock);
  max = fleet_live.max_images;
  lock_release (&fleet_lock);
  return fleet_count_images () < max;
}

/* Whether one more image fits: max-images= and min-free= (the image
 * made needing need bytes).  Returns 0, or -1 after logging an error.
 */
static int
fleet_create_fits (const char *shown, uint64_t need)
  TSA_EXCLUDES (&fleet_lock)
{
  uint64_t n = fleet_count_images (), avail, max_images, min_free;
  char have[HUMAN_SIZE_LEN], floor[HUMAN_SIZE_LEN];
  struct statvfs vfs;

  lock_acquire (&fleet_lock);
  max_images = fleet_live.max_images;
  min_free = fleet_live.min_free;
  lock_release (&fleet_lock);

  if (n >= max_images) {
    nbdkit_error ("export \"%s\": refused: no such image, and making it "
                  "would pass max-images=%" PRIu64 " (%s holds %" PRIu64 ")",
                  shown, max_images, fleet.dir, n);
    return -1;
  }
  if (fstatvfs (fleet.dirfd, &vfs) == -1)
    return 0;                   /* not known: the write says, if full */
  avail = (uint64_t) vfs.f_bavail * vfs.f_frsize;
  if (avail < need || avail - need < min_free) {
    nbdkit_error ("export \"%s\": refused: no such image, and %s has %s "
                  "free: making one would leave less than min-free=%s",
                  shown, fleet.dir, human_size (have, avail),
                  human_size (floor, min_free));
    return -1;
  }
  return 0;
}

/* A new hidden file in dir= (.new-XXXXXX), made and locked: 0 with *iop,
 * its name in tmp, or -1 after logging an error.
 */
static int
fleet_create_temp (const char *shown, char tmp[12], struct qcow2_io **iop)
{
  static const char alnum[] = "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  char *path = NULL, *why = NULL;

  *iop = NULL;
  for (int tries = 0; !*iop && tries < 100; tries++) {
    unsigned char r[6];

    if (getrandom (r, sizeof r, 0) != sizeof r)
      break;
    strcpy (tmp, ".new-");
    for (int i = 0; i < 6; i++)
      tmp[5 + i] = alnum[r[i] % (sizeof alnum - 1)];
    tmp[11] = '\0';
    free (path);
    free (why);
    why = NULL;
    if (asprintf (&path, "%s/%s", fleet.dir, tmp) == -1) {
      path = NULL;
      break;
    }
    *iop = fileio_create_new (path, &fleet.files, &why);
    if (!*iop && errno != EEXIST)
      break;
  }
  if (!*iop)
    nbdkit_error ("export \"%s\": template: making a file in %s: %s", shown,
                  fleet.dir, why ? why : errstr (errno));
  free (path);
  free (why);
  return *iop ? 0 : -1;
}

/* The new image in tmp given its name: 1 if done, 0 if the name was
 * taken meanwhile, -1 (errno set) on failure.  renameat2 keeps the
 * file's name in /proc/PID/fd true; link and unlink where the file
 * system has no RENAME_NOREPLACE.
 */
static int
fleet_create_name (const char *tmp, const char *name)
{
  if (renameat2 (fleet.dirfd, tmp, fleet.dirfd, name, RENAME_NOREPLACE) == 0)
    return 1;
  if (errno == EEXIST)
    return 0;
  if (errno != EINVAL && errno != ENOSYS)
    return -1;
  if (linkat (fleet.dirfd, tmp, fleet.dirfd, name, 0) == -1)
    return errno == EEXIST ? 0 : -1;
  unlinkat (fleet.dirfd, tmp, 0);
  return 1;
}

/* The new image written into io (in tmp) and given its name, durably.
 * Returns 1, 0 if the name was taken meanwhile, or -1 after logging an
 * error (the engine's own errors are debug messages: one line says
 * what failed, naming the export).
 */
static int
fleet_create_write (const char *shown, const char *name, const char *tmp,
                    struct qcow2_io *io, struct qcow2_create_options *opts)
{
  struct qcow2_env env = fleet.env;
  const char *what = "writing the image";
  int r;

  env.error = env.hint = glue_debug;
  r = qcow2_create (&env, io, opts);
  if (r == 0 && io->ops->flush && (r = io->ops->flush (io)) < 0)
    what = "syncing the image";
  if (r == 0) {
    what = "naming it";
    r = fleet_create_name (tmp, name);
    r = r == -1 ? -errno : r;
  }
  /* Its name durable with it: else it is not served (nor left). */
  if (r == 1 && fsync (fleet.dirfd) == -1) {
    what = "syncing the folder";
    r = -errno;
  }
  if (r >= 0)
    return r;
  nbdkit_error ("export \"%s\": template: %s %s in %s failed: %s; no image "
                "was made", shown, what, name, fleet.dir, errstr (-r));
  return -1;
}

/* template=: the image named name (in dir=) made, an overlay of the
 * template, under a temporary hidden name first, then renamed to its
 * name: a half-made image is never served, and of two servers making
 * the same name, the second serves the first's.  One at a time, so
 * that max-images= holds.  0 with *iop its file, locked, and *made
 * what it is (*iop NULL: the name was taken meanwhile), or -1 after
 * logging an error.
 */
int
fleet_create (const char *shown, const char *name, struct qcow2_io **iop,
              struct stat *made)
{
  static struct lock creating = LOCK_INITIALIZER;
  struct qcow2_create_options opts = glue.create.opts;
  CLEANUP_FREE char *template = NULL, *named = NULL;
  struct qcow2_io *io = NULL;
  const char *why;
  char tmp[12];
  uint64_t need;
  int r = -1;

  *iop = NULL;
  lock_acquire (&fleet_lock);
  why = fleet_create_refusal (name, fleet_live.template_match);
  template = fleet_live.template ? strdup (fleet_live.template) : NULL;
  lock_release (&fleet_lock);
  if (why) {
    nbdkit_error ("export \"%s\": no such image in %s, and %s", shown,
                  fleet.dir, why);
    return -1;
  }
  if (!template || asprintf (&named, "%s/%s", fleet.dir, name) == -1) {
    nbdkit_error ("export \"%s\": %s", shown, template ? errstr (errno)
                  : "template= was turned off meanwhile");
    named = NULL;
    return -1;
  }
  opts.backing = template;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&creating);
  if (image_create_options (&fleet.env, named, &opts, glue.create.size) == -1 ||
      qcow2_create_bytes (&fleet.env, &opts,
                          opts.preallocation != QCOW2_PREALLOC_OFF,
                          &need) < 0 ||
      fleet_create_fits (shown, need) == -1 ||
      fleet_create_temp (shown, tmp, &io) == -1 ||
      fileio_stat (io, made) == -1)
    goto out;
  r = fleet_create_write (shown, name, tmp, io, &opts);
  if (r == 1) {
    glue_noticef (named, "export \"%s\": made, an overlay of template=%s",
                  shown, template);
    *iop = io;
    io = NULL;
  }
  r = r >= 0 ? 0 : -1;
 out:
  if (io) {
    io->ops->close (io);
    fleet_unlink_ours (tmp, made);
  }
  return r;
}

/* Whether st is the template (in dir= or not): served read-only, since
 * a write to it would change every overlay made of it.
 */
bool
fleet_is_template (const struct stat *st)
  TSA_EXCLUDES (&fleet_lock)
{
  CLEANUP_FREE char *path = NULL;
  struct stat t;

  lock_acquire (&fleet_lock);
  if (fleet_live.template_path)
    path = strdup (fleet_live.template_path);
  lock_release (&fleet_lock);
  return path && fileio_stat_with (path, &fleet.files, &t) == 0 &&
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
  struct fileio_options o = fleet.files;
  int fd = dup (fleet.dirfd);
  DIR *d = fd == -1 ? NULL : fdopendir (fd);
  struct dirent *de;

  if (!d && fd >= 0)
    close (fd);
  if (d)
    rewinddir (d);              /* a dup shares the offset: from the start */
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
