/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdio's names (see nbdio.c): an NBD URL made absolute, the nbdkit
 * that serves an http(s) or ssh URL (its arguments, and what it says
 * on stderr relayed), and what went wrong connecting, logged with what
 * to do.
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
#include <strings.h>
#include <unistd.h>

#include <libnbd.h>

#include "errstr.h"
#include "nbdio-internal.h"

/* Is cmd an executable file in a folder of PATH? */
static bool
nbdio_in_path (const char *cmd)
{
  const char *p = getenv ("PATH");

  while (p && *p) {
    size_t n = strcspn (p, ":");
    char *f;
    bool ok;

    /* An empty folder is the current one. */
    if (asprintf (&f, "%.*s/%s", n ? (int) n : 1, n ? p : ".", cmd) < 0)
      return true;              /* not known: libnbd's error says */
    ok = access (f, X_OK) == 0;
    free (f);
    if (ok)
      return true;
    p += n + (p[n] == ':');
  }
  return false;
}

/* Returns libnbd's error connecting (without the name of the call),
 * with what the user can do about it.
 */
char *
nbdio_connect_error (struct nbdio *io)
{
  const char *err = nbd_get_error ();
  int e = nbd_get_errno ();
  char *why;

  /* libnbd sees only the connection reset. */
  if (io->argv && !nbdio_in_path ("nbdkit"))
    return asprintf (&why, "nbdkit's %s plugin could not be started: "
                     "nbdkit not found in PATH (install nbdkit and its %s "
                     "plugin, or add its folder to PATH)", io->plugin,
                     io->plugin) < 0 ? NULL : why;
  if (err && strncmp (err, "nbd_", 4) == 0 && strstr (err, ": "))
    err = strstr (err, ": ") + 2;
  if (io->argv && err && strstr (err, "handshake")) {
    /* nbdkit said why on stderr; libnbd only saw it give up.  A
     * redirect to a protocol the admin keeps it from is logged so there
     * ("not supported or disabled"): what allows it is logged here.
     */
    const char *web = io->opts.web_protocols;
    bool narrow = web && strcmp (io->plugin, "curl") == 0 &&
      strcmp (web, "http,https") != 0;
    return asprintf (&why, "nbdkit's %s plugin cannot serve it (its "
                     "message is above)%s%s%s", io->plugin,
                     narrow ? "; it may use only " : "", narrow ? web : "",
                     narrow ? ", redirects included (backing-protocols=)"
                     : "") < 0 ? NULL : why;
  }
  if (asprintf (&why, "%s%s", err ? err : "the connection failed",
                e == ECONNREFUSED || e == ENOENT
                ? ": is the NBD server running?"
                : err && strstr (err, "getaddrinfo")
                ? ": does the host name resolve?"
                : err && strstr (err, "refused TLS")
                ? " (the server does not offer TLS: nbd:// and nbd+unix:// "
                  "connect without it)"
                : err && strstr (err, "no export")
                ? " (is the export name right?)" : "") < 0)
    why = NULL;
  return why;
}

/* Append "key=value" (or value if key is NULL) to the argv being
 * built.
 */
static int
nbdio_arg (char ***argv, size_t *n, const char *key, const char *value)
{
  char **a = realloc (*argv, (*n + 2) * sizeof **argv);

  if (!a)
    return -1;
  *argv = a;
  if ((key ? asprintf (&a[*n], "%s=%s", key, value)
       : asprintf (&a[*n], "%s", value)) < 0) {
    a[*n] = NULL;
    return -1;
  }
  a[++*n] = NULL;
  return 0;
}

/* An NBD URL with its socket= made absolute, against the folder we are
 * in now (as QEMU, which connects before it forks): nbdkit forking into
 * the background changes to /, and connects again from there.
 */
char *
nbdio_socket_uri (const char *url)
{
  const char *q = strchr (url, '?'), *sock = NULL;
  char *cwd, *r = NULL;
  FILE *fp;
  size_t len;

  for (const char *p = q; p; p = strchr (p + 1, '&'))
    if (strncmp (p + 1, "socket=", 7) == 0)
      sock = p + 8;
  if (!sock || *sock == '/' || strncasecmp (sock, "%2f", 3) == 0)
    return strdup (url);
  if (!(cwd = getcwd (NULL, 0)) || !(fp = open_memstream (&r, &len))) {
    free (cwd);
    return NULL;
  }
  fprintf (fp, "%.*s", (int) (sock - url), url);
  /* The folder percent-encoded, as libnbd decodes the query. */
  for (const char *c = cwd; *c; c++) {
    if (isalnum ((unsigned char) *c) || strchr ("/-._~", *c))
      fputc (*c, fp);
    else
      fprintf (fp, "%%%02X", (unsigned char) *c);
  }
  fprintf (fp, "/%s", sock);
  free (cwd);
  if (fclose (fp) != 0) {
    free (r);
    return NULL;
  }
  return r;
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

/* Sets the arguments of the nbdkit serving an http(s) or ssh URL.
 * Returns 0, or -errno with *why.  Its stderr is the relay's pipe, so
 * that its lines are logged with the backing file's name and its repeats
 * counted (a base down gives a line and a count, not a line per read:
 * test-remote-http.sh).  libnbd starts it with our stderr and offers no
 * other, so it opens the pipe by our pid and descriptor (the pipe is not
 * inherited: neither by the other children of the server, nor across its
 * exec), as its parent's stderr if that cannot be.  The shell that does
 * so is the first relay.wrap arguments, left out when the pipe is not read
 * (see nbdio_helper_argv).
 */
int
nbdio_nbdkit_argv (struct nbdio *io, const struct qcow2_remote *remote,
                   char **why)
{
  const char *url = remote->url;
  char ***argv = &io->argv;
  size_t n = 0;
  bool ssh = remote->ssh.host != NULL;
  int r = 0;

  if (pipe2 (io->relay.fd, O_CLOEXEC | O_NONBLOCK) == 0) {
    char *script;
    io->relay.on = true;
    /* A redirection failing on a command (exec's) ends sh; on a
     * group it does not, and the helper starts with our stderr.  An
     * exec failing ends sh: nbdkit is not started twice.
     */
    if (asprintf (&script, "f=/proc/$PPID/fd/%d; [ -w \"$f\" ] && "
                  "{ exec \"$@\"; } 2>\"$f\"; exec \"$@\"",
                  io->relay.fd[1]) < 0)
      return -ENOMEM;
    r |= nbdio_arg (argv, &n, NULL, "sh");
    r |= nbdio_arg (argv, &n, NULL, "-c");
    r |= nbdio_arg (argv, &n, NULL, script);
    r |= nbdio_arg (argv, &n, NULL, "nbdkit");  /* $0, in sh's messages */
    io->relay.wrap = n;
    free (script);
  }
  for (const char *a = "nbdkit\0-r\0--exit-with-parent\0"; *a;
       a += strlen (a) + 1)
    r |= nbdio_arg (argv, &n, NULL, a);
  io->plugin = ssh ? "ssh" : "curl";
  if (!ssh) {
    char t[32];
    r |= nbdio_arg (argv, &n, NULL, "curl");
    r |= nbdio_arg (argv, &n, "url", url);
    if (!remote->sslverify)
      r |= nbdio_arg (argv, &n, "sslverify", "false");
    if (remote->timeout) {
      snprintf (t, sizeof t, "%u", remote->timeout);
      r |= nbdio_arg (argv, &n, "timeout", t);
    }
    /* The curl plugin reads "+FILE", "-FD" and "-" as where to find the
     * cookie (nbdkit_read_password): a name in an image must not make
     * the server read its files or descriptors.  QEMU sends the string
     * as it is; nbdkit has no way to, so such a cookie is refused, as
     * is a line break, which would end the header.
     */
    if (remote->cookie &&
        (remote->cookie[0] == '+' || remote->cookie[0] == '-')) {
      if (asprintf (why, "the cookie \"%s\" is refused: nbdkit's curl "
                    "plugin would read it as the name of a file or "
                    "descriptor to read the cookie from, not as the "
                    "cookie", remote->cookie) < 0)
        *why = NULL;
      return -EINVAL;
    }
    if (remote->cookie && strpbrk (remote->cookie, "\r\n")) {
      *why = strdup ("the cookie is refused: it holds a line break");
      return -EINVAL;
    }
    if (remote->cookie)
      r |= nbdio_arg (argv, &n, "cookie", remote->cookie);
    /* Redirects stay on the web (libcurl may follow them elsewhere),
     * and within what the admin allows: an https base redirecting to
     * http:// is not read in clear when only https is.
     */
    r |= nbdio_arg (argv, &n, "protocols", io->opts.web_protocols
                    ? io->opts.web_protocols : "http,https");
    return r ? -ENOMEM : 0;
  }

  /* The URL's parts, as the engine split it. */
  r |= nbdio_arg (argv, &n, NULL, "ssh");
  r |= nbdio_arg (argv, &n, "host", remote->ssh.host);
  if (remote->ssh.port)
    r |= nbdio_arg (argv, &n, "port", remote->ssh.port);
  if (remote->ssh.user)
    r |= nbdio_arg (argv, &n, "user", remote->ssh.user);
  r |= nbdio_arg (argv, &n, "path", remote->ssh.path);
  if (!remote->ssh.verify_host)
    r |= nbdio_arg (argv, &n, "verify-remote-host", "false");
  return r ? -ENOMEM : 0;
}
