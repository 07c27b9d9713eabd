/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdio's relay of what the nbdkit helpers serving http(s) and ssh
 * URLs say on stderr (see struct nbdio_relay): a pipe their stderr is
 * redirected to, and a thread of the serving process reading it, which
 * logs each line with the URL and counts repeats rather than logging
 * them.  It calls only log.c.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errstr.h"
#include "nbdio-internal.h"

/* Gives the helper's command (io->argv, made by nbdio_nbdkit_argv) the
 * relay's pipe as stderr.  libnbd starts it with our stderr and offers
 * no other, so a shell opens the pipe by our pid and descriptor (the
 * pipe is not inherited: neither by the other children of the server,
 * nor across its exec), and the parent's stderr if that cannot be.
 * That shell is the first relay.wrap arguments, left out when the pipe
 * is not read (see nbdio_helper_argv).  Without a pipe the helper keeps
 * our stderr.  Returns 0, or -ENOMEM.
 */
int
nbdio_relay_open (struct nbdio *io)
{
  struct nbdio_relay *rl = &io->relay;
  size_t n = 0, wrap = 4;
  char *script = NULL, **argv;
  const char *sh[4];

  while (io->argv[n])
    n++;
  if (pipe2 (rl->fd, O_CLOEXEC | O_NONBLOCK) == -1)
    return 0;
  /* A redirection failing on a command (exec's) ends sh; on a group it
   * does not, and the helper starts with our stderr.  An exec failing
   * ends sh: nbdkit is not started twice.  "nbdkit" is $0, in sh's
   * messages.
   */
  argv = calloc (n + wrap + 1, sizeof *argv);
  if (!argv || asprintf (&script, "f=/proc/$PPID/fd/%d; [ -w \"$f\" ] && "
                         "{ exec \"$@\"; } 2>\"$f\"; exec \"$@\"",
                         rl->fd[1]) < 0)
    goto nomem;
  sh[0] = "sh", sh[1] = "-c", sh[2] = script, sh[3] = "nbdkit";
  for (size_t i = 0; i < wrap; i++)
    if (!(argv[i] = strdup (sh[i])))
      goto nomem;
  free (script);
  memcpy (argv + wrap, io->argv, (n + 1) * sizeof *argv);
  free (io->argv);
  io->argv = argv;
  rl->wrap = wrap;
  rl->on = true;
  return 0;

 nomem:
  for (size_t i = 0; argv && i < wrap; i++)
    free (argv[i]);
  free (argv);
  free (script);
  close (rl->fd[0]);
  close (rl->fd[1]);
  return -ENOMEM;
}

/* A line logged again but for its numbers (a port, milliseconds)
 * within this long of the last is counted, not logged; counts are
 * logged as often.
 */
#define NBDIO_RELAY_MS 10000

/* Returns s without its digits: lines alike have the same. */
static char *
nbdio_relay_shape (const char *s)
{
  char *r = malloc (strlen (s) + 1), *q = r;

  for (; r && *s; s++)
    if (!isdigit ((unsigned char) *s))
      *q++ = *s;
  if (r)
    *q = '\0';
  return r;
}

/* Log how many lines like the last logged have not been. */
static void
nbdio_relay_count (struct nbdio *io, uint64_t now)
{
  struct nbdio_relay *rl = &io->relay;

  if (rl->repeats)
    nbdio_say (io, NBDIO_ERROR, "%s: nbdkit's %s plugin said the same %u "
               "more time%s in %" PRIu64 " s", io->name, io->plugin,
               rl->repeats, rl->repeats > 1 ? "s" : "",
               (now - rl->logged_ms + 999) / 1000);
  rl->repeats = 0;
  rl->logged_ms = now;
}

/* Logs a line a helper wrote (without nbdkit's "nbdkit: PLUGIN[N]:
 * error: ", the URL in its place), or counts it if like the last.
 */
static void
nbdio_relay_line (struct nbdio *io, const char *line)
{
  struct nbdio_relay *rl = &io->relay;
  const char *msg = line, *p;
  uint64_t now = nbdio_now_ms ();
  char *shape = nbdio_relay_shape (line), *was;

  if (strncmp (line, "nbdkit: ", 8) == 0 && (p = strstr (line, ": error: ")))
    msg = p + 9;
  if (shape && rl->shape && strcmp (shape, rl->shape) == 0 &&
      now - rl->last_ms < NBDIO_RELAY_MS) {
    free (shape);
    rl->repeats++;
    rl->last_ms = now;
    if (now - rl->logged_ms >= NBDIO_RELAY_MS)
      nbdio_relay_count (io, now);
    return;
  }
  nbdio_relay_count (io, now);
  nbdio_say (io, NBDIO_ERROR, "%s: nbdkit's %s plugin: %s", io->name,
             io->plugin, msg);
  /* Never a freed shape: a fork may copy it at any time. */
  was = rl->shape;
  rl->shape = shape;
  free (was);
  rl->last_ms = now;
}

/* Read what the pipe holds, logging each line ended (and, at the end,
 * the one not ended).
 */
static void
nbdio_relay_read (struct nbdio *io, bool end)
{
  struct nbdio_relay *rl = &io->relay;
  ssize_t got;

  for (;;) {
    char *nl;

    got = read (rl->fd[0], rl->line + rl->len, sizeof rl->line - 1 - rl->len);
    if (got <= 0 && !(got == -1 && errno == EINTR))
      break;
    rl->len += got > 0 ? got : 0;
    rl->line[rl->len] = '\0';
    while ((nl = strchr (rl->line, '\n'))) {
      *nl = '\0';
      nbdio_relay_line (io, rl->line);
      rl->len -= nl + 1 - rl->line;
      memmove (rl->line, nl + 1, rl->len + 1);
    }
    /* A line longer than the buffer: logged in pieces. */
    if (rl->len == sizeof rl->line - 1) {
      nbdio_relay_line (io, rl->line);
      rl->len = 0;
    }
  }
  if (end && rl->len) {
    nbdio_relay_line (io, rl->line);
    rl->len = 0;
  }
}

static void *
nbdio_relay_thread (void *arg)
{
  struct nbdio *io = arg;
  struct nbdio_relay *rl = &io->relay;

  for (;;) {
    struct pollfd p[2] = {
      { .fd = rl->fd[0], .events = POLLIN },
      { .fd = rl->wake[0], .events = POLLIN },
    };
    uint64_t now = nbdio_now_ms ();
    int ms = !rl->repeats ? -1
      : now - rl->logged_ms >= NBDIO_RELAY_MS ? 0
      : (int) (rl->logged_ms + NBDIO_RELAY_MS - now);

    if (poll (p, 2, ms) == -1 && errno != EINTR)
      break;
    if (p[1].revents)
      break;
    if (p[0].revents)
      nbdio_relay_read (io, false);
    now = nbdio_now_ms ();
    if (rl->repeats && now - rl->logged_ms >= NBDIO_RELAY_MS)
      nbdio_relay_count (io, now);
  }
  return NULL;
}

/* Start the thread that reads the pipe in this process: at open,
 * before the first helper, and again in the server nbdkit forks (at
 * its first connection, before it starts a helper).
 */
void
nbdio_relay_start (struct nbdio *io)
{
  struct nbdio_relay *rl = &io->relay;
  sigset_t all, old;
  int e;

  if (!rl->on || __atomic_load_n (&rl->pid, __ATOMIC_ACQUIRE) == getpid ())
    return;
  /* The thread of the process before a fork is gone: its pipe too.
   * That process may live on, its thread reading the pipe for its
   * helpers (nbdkit --run runs the command there): this one's get a
   * pipe of their own, at the same descriptors (named in argv).  When
   * it exits, its helpers (which end with it) cannot block writing
   * into a pipe nobody reads: a pipe without reader fails writes.
   */
  e = 0;
  if (rl->has_thread) {
    int p[2];

    close (rl->wake[0]);
    close (rl->wake[1]);
    rl->has_thread = false;
    rl->len = rl->repeats = 0;
    if (pipe2 (p, O_CLOEXEC | O_NONBLOCK) == -1)
      e = errno;
    else {
      if (dup3 (p[0], rl->fd[0], O_CLOEXEC) == -1 ||
          dup3 (p[1], rl->fd[1], O_CLOEXEC) == -1)
        e = errno;
      close (p[0]);
      close (p[1]);
    }
    /* Not a pipe of two halves: none, for good. */
    if (e) {
      close (rl->fd[0]);
      close (rl->fd[1]);
      free (rl->shape);
      rl->shape = NULL;
      rl->on = false;
    }
  }
  if (e == 0 && pipe2 (rl->wake, O_CLOEXEC | O_NONBLOCK) == -1)
    e = errno;
  else if (e == 0) {
    /* Signals are the server's. */
    sigfillset (&all);
    pthread_sigmask (SIG_SETMASK, &all, &old);
    e = pthread_create (&rl->thread, NULL, nbdio_relay_thread, io);
    pthread_sigmask (SIG_SETMASK, &old, NULL);
    rl->has_thread = e == 0;
    if (e) {
      close (rl->wake[0]);
      close (rl->wake[1]);
    }
  }
  if (e) {
    /* A pipe nobody reads would fill and block the helper writing. */
    nbdio_say (io, NBDIO_DEBUG, "%s: nbdkit's %s plugin keeps our stderr: "
               "cannot start the thread relaying it: %s", io->name,
               io->plugin, errstr (e));
    return;
  }
  __atomic_store_n (&rl->pid, getpid (), __ATOMIC_RELEASE);
}

/* The command starting a helper: given the pipe as stderr only if its
 * thread runs in this process (see nbdio_relay_start).
 */
char **
nbdio_helper_argv (struct nbdio *io)
{
  if (__atomic_load_n (&io->relay.pid, __ATOMIC_ACQUIRE) == getpid ())
    return io->argv;
  return io->argv + io->relay.wrap;
}

void
nbdio_relay_stop (struct nbdio *io)
{
  struct nbdio_relay *rl = &io->relay;
  bool here;

  if (!rl->on)
    return;
  here = __atomic_load_n (&rl->pid, __ATOMIC_ACQUIRE) == getpid ();
  if (rl->has_thread) {
    if (here) {
      ssize_t r = write (rl->wake[1], "", 1);
      (void) r;
      pthread_join (rl->thread, NULL);
    }
    close (rl->wake[0]);
    close (rl->wake[1]);
  }
  /* The pipe of a thread in the process before a fork is its to read. */
  if (here || !rl->has_thread) {
    nbdio_relay_read (io, true);
    nbdio_relay_count (io, nbdio_now_ms ());
  }
  close (rl->fd[0]);
  close (rl->fd[1]);
  free (rl->shape);
  rl->on = false;
}
