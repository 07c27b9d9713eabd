/* SPDX-License-Identifier: BSD-3-Clause */
/* Opening a file beneath a folder, never leaving it whatever its
 * names lead to: openat2's RESOLVE_BENEATH where the kernel has it, and
 * otherwise the same walk done here, one name at a time from an open
 * folder, every symbolic link read from the link opened (so that no
 * name is looked up twice: a link swapped in between is met, not
 * followed past the check).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined (__linux__) && defined (__has_include)
#if __has_include (<linux/openat2.h>)
#include <linux/openat2.h>
#define BENEATH_HAVE_OPENAT2 1
#endif
#endif

#include "fileio.h"

/* As the kernel: at most 40 links in one resolution. */
#define BENEATH_MAX_LINKS 40
/* Folders deep below the base (each one an open descriptor). */
#define BENEATH_MAX_DEPTH 64

/* The folders walked into below the base, innermost last. */
struct beneath_walk {
  int base;
  int fds[BENEATH_MAX_DEPTH];
  int depth;
  int links;
  char *todo;                   /* what is left to resolve */
};

static int
beneath_cur (const struct beneath_walk *w)
{
  return w->depth ? w->fds[w->depth - 1] : w->base;
}

static void
beneath_free (struct beneath_walk *w)
{
  while (w->depth > 0)
    close (w->fds[--w->depth]);
  free (w->todo);
}

/* The link open as fd (O_PATH) read; what is left of the path after it,
 * rest, goes after its target.  Returns 0, or -1 with errno set: an
 * absolute target leads out of the base.
 */
static int
beneath_follow (struct beneath_walk *w, int fd, const char *rest)
{
  char target[4096], *todo;
  ssize_t n = readlinkat (fd, "", target, sizeof target - 1);

  if (n < 0)
    return -1;
  target[n] = '\0';
  if (target[0] == '/' || n == 0) {
    errno = n ? EXDEV : ENOENT;
    return -1;
  }
  if (++w->links > BENEATH_MAX_LINKS) {
    errno = ELOOP;
    return -1;
  }
  if (asprintf (&todo, "%s%s%s", target, *rest ? "/" : "", rest) == -1)
    return -1;
  free (w->todo);
  w->todo = todo;
  return 0;
}

/* One step of the walk: the first name of w->todo.  Returns the file
 * opened (its last name), 0 to go on, or -1 with errno set.
 */
static int
beneath_step (struct beneath_walk *w, int flags, mode_t mode)
{
  char *name = w->todo + strspn (w->todo, "/");
  size_t len = strcspn (name, "/");
  const char *rest = name + len + strspn (name + len, "/");
  bool last = *rest == '\0';
  struct stat st;
  int fd;

  name[len] = '\0';
  if (len == 0 || strcmp (name, ".") == 0)
    name = (char *) ".";
  else if (strcmp (name, "..") == 0) {
    if (w->depth == 0) {
      errno = EXDEV;
      return -1;
    }
    close (w->fds[--w->depth]);
    name = (char *) ".";
  }
  if (last) {
    fd = openat (beneath_cur (w), name, flags | O_NOFOLLOW | O_CLOEXEC, mode);
    /* O_PATH opens a link itself, where others fail with ELOOP. */
    if (fd >= 0 && (flags & (O_PATH | O_NOFOLLOW)) == O_PATH &&
        fstat (fd, &st) == 0 && S_ISLNK (st.st_mode)) {
      close (fd);
      fd = -1;
      errno = ELOOP;
    }
    if (fd >= 0 || errno != ELOOP || (flags & O_NOFOLLOW))
      return fd;
  }
  else if (strcmp (name, ".") == 0) {
    memmove (w->todo, rest, strlen (rest) + 1);
    return 0;
  }
  /* A folder to walk into, or a link (the last name too). */
  fd = openat (beneath_cur (w), name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd == -1)
    return -1;
  if (fstat (fd, &st) == -1)
    goto err;
  if (S_ISLNK (st.st_mode)) {
    if (beneath_follow (w, fd, rest) == -1)
      goto err;
    close (fd);
    return 0;
  }
  if (last) {
    /* A link when opened, no longer one: a race, met again (and
     * counted, so that a name swapped forever does not hold us).
     */
    errno = ELOOP;
    if (++w->links > BENEATH_MAX_LINKS)
      goto err;
    close (fd);
    return 0;
  }
  if (!S_ISDIR (st.st_mode) || w->depth == BENEATH_MAX_DEPTH) {
    errno = S_ISDIR (st.st_mode) ? ENAMETOOLONG : ENOTDIR;
    goto err;
  }
  w->fds[w->depth++] = fd;
  memmove (w->todo, rest, strlen (rest) + 1);
  return 0;

 err:
  {
    int e = errno;
    close (fd);
    errno = e;
    return -1;
  }
}

static int
beneath_walk (int dirfd, const char *name, int flags, mode_t mode)
{
  struct beneath_walk w = { .base = dirfd, .todo = strdup (name) };
  int fd = 0, e;

  if (!w.todo)
    return -1;
  while (fd == 0)
    fd = beneath_step (&w, flags, mode);
  e = errno;
  beneath_free (&w);
  errno = e;
  return fd;
}

/* The kernel's own walk, or -1 with errno ENOSYS where it has none
 * (or NBDKIT_QCOW2_OPENAT2=0 says not to use it: the tests' way to
 * check the two agree).
 */
static int
beneath_openat2 (int dirfd, const char *name, int flags, mode_t mode)
{
#ifdef BENEATH_HAVE_OPENAT2
  const char *env = getenv ("NBDKIT_QCOW2_OPENAT2");
  struct open_how how = {
    .flags = (unsigned) (flags | O_CLOEXEC),
    .mode = flags & (O_CREAT | O_TMPFILE) ? mode : 0,
    .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
  };
  int fd, tries = 0;

  if (!env || strcmp (env, "0") != 0) {
    /* EAGAIN: a rename raced a ".." (the kernel's check); again. */
    do
      fd = syscall (SYS_openat2, dirfd, name, &how, sizeof how);
    while (fd == -1 && errno == EAGAIN && ++tries < 8);
    return fd;
  }
#endif
  errno = ENOSYS;
  return -1;
}

int
fileio_open_beneath (int dirfd, const char *name, int flags, mode_t mode)
{
  int fd;

  if (name[0] == '/' || name[0] == '\0') {
    errno = name[0] ? EXDEV : ENOENT;
    return -1;
  }
  fd = beneath_openat2 (dirfd, name, flags, mode);
  if (fd >= 0 || (errno != ENOSYS && errno != EPERM))
    return fd;
  /* EPERM: a seccomp filter may refuse the unknown call so. */
  return beneath_walk (dirfd, name, flags, mode);
}
