/* SPDX-License-Identifier: BSD-3-Clause */
/* fileio_open_beneath: names resolved inside a folder, never out of it,
 * both ways (the kernel's openat2, and the walk done without it, by
 * NBDKIT_QCOW2_OPENAT2=0), each case checked for the same file or the
 * same error: links inside followed (relative, through folders, "..",
 * chains), absolute links, ".." above the folder, links out, loops and
 * a dangling link refused or created as openat would; and (the
 * fleet's) names refused, made and shown as the plugin's rules say.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "unit.h"

static char top[] = "/tmp/qcow2-beneath.XXXXXX";
static int dirfd_;

/* rel in top, in a buffer of its own until the next call. */
static const char *
in_top (const char *rel)
{
  static char p[256];

  snprintf (p, sizeof p, "%s/%s", top, rel);
  return p;
}

/* A file (target NULL) or a link to target, at rel in top. */
static void
mk (const char *rel, const char *target)
{
  int fd;

  if (target) {
    if (symlink (target, in_top (rel)) == -1)
      abort ();
    return;
  }
  fd = open (in_top (rel), O_CREAT | O_WRONLY, 0644);
  if (fd == -1)
    abort ();
  close (fd);
}

/* The inode name opens to, or -errno. */
static long long
open_as (const char *name, int flags)
{
  struct stat st;
  int fd = fileio_open_beneath (dirfd_, name, flags, 0644);
  long long r;

  if (fd == -1)
    return -errno;
  r = fstat (fd, &st) == 0 ? (long long) st.st_ino : -errno;
  close (fd);
  return r;
}

static long long
ino_of (const char *rel)
{
  struct stat st;

  return stat (in_top (rel), &st) == 0 ? (long long) st.st_ino : -errno;
}

struct want {
  const char *name;
  const char *file;             /* the file it must open (in top), or */
  int err;                      /* the error */
};

static void
check_all (const char *how)
{
  static const struct want cases[] = {
    { "img", "d/img", 0 },
    { "sub/img", "d/sub/img", 0 },
    { "rel", "d/img", 0 },              /* rel -> img */
    { "deep", "d/sub/img", 0 },         /* deep -> sub/../sub/img */
    { "chain", "d/img", 0 },            /* chain -> rel -> img */
    { "up", "d/img", 0 },               /* -> sub/up -> ../img */
    { "sub/up", "d/img", 0 },
    { "./img", "d/img", 0 },
    { "sub/../img", "d/img", 0 },
    { "abs", NULL, EXDEV },             /* an absolute link, even inside */
    { "out", NULL, EXDEV },             /* -> ../outside */
    { "../outside", NULL, EXDEV },
    { "sub/../../outside", NULL, EXDEV },
    { "outdir/x", NULL, EXDEV },        /* a folder link leading out */
    { "loop", NULL, ELOOP },            /* loop -> loop2 -> loop */
    { "nothere", NULL, ENOENT },
    { "dangling", NULL, ENOENT },       /* -> nothere */
    { "img/x", NULL, ENOTDIR },
  };

  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const struct want *w = &cases[i];
    long long got = open_as (w->name, O_RDONLY);
    long long want = w->file ? ino_of (w->file) : -w->err;

    CHECKF (got == want, "%s: %s: got %lld, want %lld", how, w->name, got,
            want);
  }
  /* O_CREAT through a dangling link inside makes its target inside. */
  CHECKF (open_as ("dangling", O_RDWR | O_CREAT) > 0 &&
          ino_of ("d/nothere") == open_as ("dangling", O_RDONLY),
          "%s: O_CREAT through a dangling link", how);
  unlink (in_top ("d/nothere"));
  /* O_PATH follows links as the other flags do. */
  CHECK_INT (open_as ("rel", O_PATH), ino_of ("d/img"));
  CHECK_INT (open_as ("out", O_PATH), -EXDEV);
  /* O_NOFOLLOW: the last name a link is refused, as openat's. */
  CHECK_INT (open_as ("rel", O_RDONLY | O_NOFOLLOW), -ELOOP);
  CHECK_INT (open_as ("", O_RDONLY), -ENOENT);
  CHECK_INT (open_as ("/etc/passwd", O_RDONLY), -EXDEV);
}

int
main (void)
{
  char abs[128];

  if (!mkdtemp (top) || mkdir (in_top ("d"), 0755) == -1 ||
      mkdir (in_top ("d/sub"), 0755) == -1)
    abort ();
  mk ("outside", NULL);
  mk ("d/img", NULL);
  mk ("d/sub/img", NULL);
  mk ("d/rel", "img");
  mk ("d/deep", "sub/../sub/img");
  mk ("d/chain", "rel");
  mk ("d/up", "sub/up");
  mk ("d/sub/up", "../img");
  snprintf (abs, sizeof abs, "%s/d/img", top);
  mk ("d/abs", abs);
  mk ("d/out", "../outside");
  mk ("d/outdir", "..");
  mk ("d/loop", "loop2");
  mk ("d/loop2", "loop");
  mk ("d/dangling", "nothere");
  dirfd_ = open (in_top ("d"), O_RDONLY | O_DIRECTORY);
  if (dirfd_ == -1)
    abort ();

  setenv ("NBDKIT_QCOW2_OPENAT2", "1", 1);
  check_all ("openat2");
  setenv ("NBDKIT_QCOW2_OPENAT2", "0", 1);
  check_all ("walk");

  close (dirfd_);
  snprintf (abs, sizeof abs, "rm -rf %s", top);
  if (system (abs) != 0)
    abort ();
  return unit_finish ();
}
