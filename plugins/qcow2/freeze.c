/* SPDX-License-Identifier: BSD-3-Clause */
/* export-snapshot: an export's data frozen at an instant under a new
 * name, FROZEN, while the export goes on under its own name, NAME, as
 * a thin overlay over it.  Clients' requests are held off meanwhile
 * (the export's gate): those in flight finish first, and what they
 * wrote is flushed into what becomes FROZEN.  The steps, in NAME's
 * folder, each durable before the next:
 *
 *   1  a journal, .snap-XXXXXX: "NAME\nFROZEN\nTEMP\n"
 *   2  TEMP (.new-XXXXXX): the new overlay, backed by FROZEN
 *   3  FROZEN linked to NAME's file (both name the image)
 *   4  TEMP renamed to NAME (NAME is the overlay; FROZEN the image)
 *   5  the journal removed
 *
 * A crash before 4 is undone at the next start (TEMP there: TEMP
 * removed, and FROZEN if it names NAME's file), a crash after it is
 * the snapshot made (TEMP gone): either way NAME serves every flushed
 * write, and QEMU opens every file.  freeze_recover does that.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "cleanup.h"
#include "errstr.h"
#include "fileio.h"
#include "glue.h"
#include "monotonic.h"
#include "plugin.h"
#include "qcow2.h"

/* A hidden name of the pattern PREFIX-XXXXXX, random, into buf. */
static int
freeze_hidden_name (const char *prefix, char buf[16])
{
  static const char alnum[] = "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  unsigned char r[6];

  if (getrandom (r, sizeof r, 0) != sizeof r)
    return -1;
  snprintf (buf, 16, "%s-", prefix);
  for (int i = 0; i < 6; i++)
    buf[strlen (prefix) + 1 + i] = alnum[r[i] % (sizeof alnum - 1)];
  buf[strlen (prefix) + 7] = '\0';
  return 0;
}

/* Step 1: the journal, durable.  Returns 0 with its name in journal,
 * or -errno.
 */
static int
freeze_journal (const struct freeze_spot *f, const char *temp,
                char journal[16])
{
  CLEANUP_FREE char *text = NULL;
  int dirfd = f->dirfd, fd = -1, e = 0;
  ssize_t n;

  if (asprintf (&text, "%s\n%s\n%s\n", f->name, f->frozen, temp) == -1)
    return -errno;
  for (int tries = 0; fd == -1 && tries < 100; tries++) {
    if (freeze_hidden_name (".snap", journal) == -1)
      return -errno;
    fd = openat (dirfd, journal, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                 0600);
    if (fd == -1 && errno != EEXIST)
      return -errno;
  }
  if (fd == -1)
    return -EEXIST;
  n = write (fd, text, strlen (text));
  if (n == -1)
    e = errno;
  else if (n != (ssize_t) strlen (text))
    e = EIO;                    /* a short write: the disk is full */
  else if (fsync (fd) == -1)
    e = errno;
  close (fd);
  if (e == 0 && fsync (dirfd) == -1)
    e = errno;
  if (e)
    unlinkat (dirfd, journal, 0);
  return -e;
}

/* Step 2: the overlay in temp (under folder), of the image's format,
 * backed by frozen.  Returns 0 or -errno.
 */
static int
freeze_overlay (const struct freeze_spot *f, const char *temp,
                const struct qcow2_info *i)
{
  struct qcow2_create_options opts = {
    .size = i->size, .cluster_size = i->cluster_size,
    .compat_v2 = i->version == 2, .extended_l2 = i->extended_l2,
    .lazy_refcounts = i->lazy_refcounts, .refcount_bits = i->refcount_bits,
    .zstd = i->zstd, .backing = f->frozen, .backing_format = "qcow2",
  };
  CLEANUP_FREE char *path = NULL, *why = NULL;
  struct qcow2_io *io;
  int r;

  if (asprintf (&path, "%s/%s", f->folder, temp) == -1)
    return -errno;
  io = fileio_create_new (path, f->files, &why);
  if (!io)
    return -errno;
  r = qcow2_create (f->env, io, &opts);
  if (r == 0 && io->ops->flush)
    r = io->ops->flush (io);
  io->ops->close (io);
  return r;
}

/* Steps 3 and 4, each durable: 0, or -errno (nothing renamed). */
static int
freeze_switch (const struct freeze_spot *f, const char *temp)
{
  if (linkat (f->dirfd, f->name, f->dirfd, f->frozen, 0) == -1)
    return -errno;
  if (fsync (f->dirfd) == -1 ||
      renameat (f->dirfd, temp, f->dirfd, f->name) == -1) {
    int e = errno;

    unlinkat (f->dirfd, f->frozen, 0);
    return -e;
  }
  return fsync (f->dirfd) == -1 ? -errno : 0;
}

/* What export-snapshot refuses to freeze, or NULL. */
static const char *
freeze_refusal (const struct plugin_export *served,
                const struct qcow2_info *i)
{
  struct qcow2_stream_progress p;
  bool cancelled;

  if (!served->image || !qcow2_can_write (served->image))
    return "it is served read-only";
  if (i->encrypted)
    return "it is encrypted (its overlay would need a key of its own)";
  if (glue_stream.on ||
      glue_stream_job_progress (served->job, &p, &cancelled))
    return "a stream job is on it (it would copy the frozen data back)";
  return NULL;
}

int
freeze_export (const struct freeze_spot *f, uint64_t *paused_ns,
               char **why)
{
  struct plugin_export *served = f->served;
  struct qcow2_info i;
  char temp[16], journal[16];
  const char *refused;
  uint64_t t0;
  int r = 0;

  *why = NULL;
  qcow2_get_info (served->image, &i);
  if ((refused = freeze_refusal (served, &i))) {
    if (asprintf (why, "%s: %s", f->name, refused) == -1)
      *why = NULL;
    return -1;
  }
  if (freeze_hidden_name (".new", temp) == -1 ||
      (r = freeze_journal (f, temp, journal)) < 0) {
    if (asprintf (why, "writing the journal in %s: %s", f->folder,
                  errstr (r < 0 ? -r : errno)) == -1)
      *why = NULL;
    return -1;
  }
  /* Clients go on while the overlay is made and what they wrote goes
   * to the disk (without the image's lock, which a flush holds): the
   * flush under the gate then syncs only what was written meanwhile,
   * and the pause they see is short.
   */
  r = freeze_overlay (f, temp, &i);
  if (r == 0)
    r = qcow2_writeback (served->image);
  t0 = monotonic_ns ();
  if (r == 0) {
    gate_shut (served, GATE_HELD);
    r = qcow2_flush (served->image);
    if (r == 0)
      r = freeze_switch (f, temp);
    if (r < 0)
      gate_open (served);
  }
  if (r < 0) {
    unlinkat (f->dirfd, temp, 0);
    unlinkat (f->dirfd, journal, 0);
    if (asprintf (why, "%s: %s (nothing was changed)", f->frozen,
                  r == -EEXIST ? "it exists already" : errstr (-r)) == -1)
      *why = NULL;
    return -1;
  }
  /* The old image is FROZEN's now: closed, and opened again as the
   * overlay's backing file.
   */
  glue_stream_job_free (served->job);
  served->job = NULL;
  if (qcow2_close (served->image) < 0)
    nbdkit_error ("%s: closing the image failed: it was flushed when "
                  "frozen; see above", f->frozen);
  served->image = NULL;
  r = f->reopen (served);
  gate_open (served);
  *paused_ns = monotonic_ns () - t0;
  unlinkat (f->dirfd, journal, 0);
  fsync (f->dirfd);
  if (r == -1 && asprintf (why, "%s: the overlay made cannot be opened "
                           "(see the server's log): the export is "
                           "closed", f->name) == -1)
    *why = NULL;
  return r;
}

/* A journal's lines, read: name, frozen and temp (in buf), or -1. */
static int
freeze_read_journal (int dirfd, const char *journal, char buf[1024],
                     char **lines)
{
  int fd = openat (dirfd, journal, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  ssize_t n = fd == -1 ? -1 : read (fd, buf, 1023);
  char *p = buf;

  if (fd >= 0)
    close (fd);
  if (n <= 0)
    return -1;
  buf[n] = '\0';
  for (int k = 0; k < 3; k++) {
    char *nl = strchr (p, '\n');

    if (!nl || nl == p || memchr (p, '/', nl - p))
      return -1;
    *nl = '\0';
    lines[k] = p;
    p = nl + 1;
  }
  return *p ? -1 : 0;
}

/* One journal's snapshot ended: undone if it stopped before step 4. */
static void
freeze_recover_one (int dirfd, const char *folder, const char *journal,
                    const char *only)
{
  char buf[1024], *l[3];
  struct stat name_st, frozen_st, temp_st;

  if (freeze_read_journal (dirfd, journal, buf, l) == -1) {
    nbdkit_debug ("%s/%s: not a snapshot's journal: left", folder, journal);
    return;
  }
  if (only && strcmp (l[0], only) != 0)
    return;                     /* another image's, not ours to end */
  if (fstatat (dirfd, l[2], &temp_st, AT_SYMLINK_NOFOLLOW) == 0) {
    /* Not renamed: FROZEN, if linked, names NAME's image still. */
    if (fstatat (dirfd, l[0], &name_st, AT_SYMLINK_NOFOLLOW) == 0 &&
        fstatat (dirfd, l[1], &frozen_st, AT_SYMLINK_NOFOLLOW) == 0 &&
        name_st.st_dev == frozen_st.st_dev &&
        name_st.st_ino == frozen_st.st_ino)
      unlinkat (dirfd, l[1], 0);
    unlinkat (dirfd, l[2], 0);
    glue_noticef (folder, "export-snapshot of %s into %s was interrupted: "
                  "undone, %s is as it was", l[0], l[1], l[0]);
  }
  else
    glue_noticef (folder, "export-snapshot of %s into %s was interrupted "
                  "once done: %s is frozen", l[0], l[1], l[1]);
  unlinkat (dirfd, journal, 0);
  fsync (dirfd);
}

void
freeze_recover (int dirfd, const char *folder, const char *only)
{
  int fd = dup (dirfd);
  DIR *d = fd == -1 ? NULL : fdopendir (fd);
  struct dirent *de;

  if (!d) {
    if (fd >= 0)
      close (fd);
    return;
  }
  rewinddir (d);
  while ((de = readdir (d)))
    if (strncmp (de->d_name, ".snap-", 6) == 0 && strlen (de->d_name) == 12)
      freeze_recover_one (dirfd, folder, de->d_name, only);
  closedir (d);
}
