/* SPDX-License-Identifier: BSD-3-Clause */
/* What the plugin and the filter must know of nbdkit that nbdkit's API
 * (1.32 to 1.45) does not tell them, inferred here and nowhere else.
 * Each piece names the nbdkit behaviour it depends on, the nbdkit
 * versions that need it, and the API that would retire it.  Everything
 * else goes through nbdkit's API.
 *
 * What remains, what the user would miss without it, the nbdkit
 * versions that need it, and the test showing it:
 *
 *  piece                what the user gets           nbdkit   test
 *  glue_server_readonly nbdkit -r opens the image    all      test-locking,
 *                       read-only at start: shared            test-filter-
 *                       with readers, a corrupt               qcow2-start
 *                       image served                          (corrupt)
 *  glue_log_notice,     notices ("served read-only") all      test-messages
 *  glue_captive         where nbdkit logs, without
 *                       -v (syslog in background)
 *  glue_plugin_name,    the overlay's record of what all      test-overlay-
 *  glue_filters_below   lies below the filter                 identity
 *  glue_start_*         a refusal at after_fork      all      test-filter-
 *                       heard in the background               qcow2-start,
 *                       (exit 1, the message on               test-overlay-
 *                       stderr); no pid file or               start
 *                       socket left; --run's
 *                       command fails at once
 *  glue_quiet_open      no "error: no connection (or  all      test-filter-
 *                       context) in this thread" at           qcow2-start
 *                       start over the nbd plugin             (nbd plugin)
 *  glue_dump_asked      the filter's keys in         <1.35.9  test-filter-
 *                       --dump-plugin                         qcow2-options
 *
 * Outside this file, common/nbdio/names.c gives the nbdkit helpers
 * serving http(s) and ssh backing files a stderr of its own (a shell
 * opening its pipe by /proc/$PPID/fd): their lines are logged with the
 * backing file's name, and repeats counted (test-remote-http.sh).
 * libnbd starts the helper with our stderr and offers no other.
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "glue.h"
#include "lock.h"

/* The process nbdkit loaded the module in (set by glue_load). */
static pid_t load_pid;

void
glue_introspect_load (void)
{
  load_pid = getpid ();
}

static char *cmdline;
static size_t cmdline_len;
static pthread_once_t cmdline_once = PTHREAD_ONCE_INIT;

/* Read once, by whichever thread asks first: the command line does not
 * change, and connections ask from several threads at once.  Empty if
 * it cannot be read.
 */
static void
introspect_read_cmdline (void)
{
  FILE *fp = fopen ("/proc/self/cmdline", "re");
  FILE *mem;
  char buf[4096];
  size_t n;

  if (!fp)
    return;
  /* The memory stream ends in a NUL of its own, should the last
   * argument lack one.
   */
  if ((mem = open_memstream (&cmdline, &cmdline_len)) != NULL) {
    bool bad;

    while ((n = fread (buf, 1, sizeof buf, fp)) > 0)
      fwrite (buf, 1, n, mem);
    bad = ferror (fp);
    if (fclose (mem) == EOF || bad) {
      free (cmdline);
      cmdline = NULL;
      cmdline_len = 0;
    }
  }
  fclose (fp);
}

/* Passes each argument of nbdkit's command line, as /proc/self/cmdline
 * holds it, in turn to fn, with the one after it (or NULL), up to "--"
 * or until fn returns true.  Returns true if fn did.
 *
 * Depends on: nbdkit parsing its options with getopt_long, so that
 * what follows "--" is not nbdkit's, and /proc/self/cmdline holding
 * the arguments as given (getopt_long reorders only pointers to them).
 * Retired by: an nbdkit call telling a module, before the first
 * connection, whether it serves read-only (-r), where it logs (--log),
 * and that it runs --run's command (none up to 1.45).
 */
static bool
introspect_cmdline (bool (*fn) (const char *arg, const char *next,
                                void *opaque),
                    void *opaque)
{
  pthread_once (&cmdline_once, introspect_read_cmdline);
  for (size_t i = 0; i < cmdline_len; i += strlen (cmdline + i) + 1) {
    size_t next = i + strlen (cmdline + i) + 1;

    if (strcmp (cmdline + i, "--") == 0)
      break;
    if (fn (cmdline + i, next < cmdline_len ? cmdline + next : NULL, opaque))
      return true;
  }
  return false;
}

/* Whether a is -r, --readonly, --read-only, or r among grouped short
 * flags (-fr,
 * -r4, -rU SOCKET: the letters up to the first that takes an argument):
 * nbdkit's short options of 1.32 to 1.45.
 */
static bool
introspect_arg_readonly (const char *a, const char *next, void *opaque)
{
  if (strcmp (a, "--readonly") == 0 || strcmp (a, "--read-only") == 0)
    return true;
  if (a[0] != '-' || a[1] == '-')
    return false;
  for (a++; *a && strchr ("46fnorsvV", *a); a++)
    if (*a == 'r')
      return true;
  return false;
}

/* The plugin and the filter open the image before any connection,
 * where nbdkit would tell .open whether it is read-only: so that
 * nbdkit -r opens it read-only at start (locked for reading, shared
 * with other readers; a corrupt image served).  Depends on: the
 * command line (above).
 */
bool
glue_server_readonly (void)
{
  return introspect_cmdline (introspect_arg_readonly, NULL);
}

#if !GLUE_NBDKIT_AT_LEAST (35, 9)
static bool
introspect_arg_dump (const char *a, const char *next, void *opaque)
{
  return strcmp (a, "--dump-plugin") == 0;
}

/* Only for nbdkit before 1.35.9.  Retired by: the filter's
 * .dump_plugin (nbdkit 1.35.9).
 */
bool
glue_dump_asked (void)
{
  return introspect_cmdline (introspect_arg_dump, NULL);
}
#endif

static bool
introspect_arg_run (const char *a, const char *next, void *opaque)
{
  return strcmp (a, "--run") == 0 || strncmp (a, "--run=", 6) == 0;
}

/* Whether nbdkit runs a --run command.  Depends on: nbdkit --run
 * forking, the command in the parent and the server in the child,
 * after the sockets were bound (captive.c, 1.32 to 1.45).
 */
bool
glue_captive (void)
{
  return introspect_cmdline (introspect_arg_run, NULL);
}

/* --log=WHERE or --log WHERE (the last one counts). */
static bool
introspect_arg_log (const char *arg, const char *next, void *opaque)
{
  const char **where = opaque;

  if (strncmp (arg, "--log=", 6) == 0)
    *where = arg + 6;
  else if (strcmp (arg, "--log") == 0 && next)
    *where = next;
  return false;
}

/* Where nbdkit logs: "stderr", "syslog", "null" or a file's path
 * (nbdkit 1.43.2 and later).  Depends on: --log (the command line), and
 * nbdkit's default: syslog once it forked into the background (a
 * process other than the one that loaded us, but for the server --run
 * forks, which stays in the foreground).
 */
static const char *
introspect_log_destination (void)
{
  const char *where = "default";

  introspect_cmdline (introspect_arg_log, &where);
  if (strcmp (where, "default") == 0)
    where = getpid () != load_pid && !glue_captive () ? "syslog" : "stderr";
  return where;
}

/* A notice, where nbdkit logs, shaped as nbdkit's lines with "notice"
 * where nbdkit writes "error" (syslog: LOG_NOTICE where nbdkit's
 * errors are LOG_ERR).  Needed because nbdkit gives modules no level
 * between debug (shown with -v only) and error, while the user must
 * hear of what is served other than asked (read-only, unlocked) also
 * from a server in the background, whose stderr is /dev/null.  A line
 * is one write, appended as nbdkit appends its own to --log=/path
 * (nbdkit 1.43.2; an older nbdkit refuses such a --log before any
 * notice).  Retired by: an nbdkit_notice (none up to 1.45).
 */
void
glue_log_notice (const char *module, const char *path, const char *msg)
{
  const char *where = introspect_log_destination ();
  char *line;
  int fd;

  if (strcmp (where, "null") == 0)
    return;
  if (strcmp (where, "syslog") == 0) {
    syslog (LOG_DAEMON | LOG_NOTICE, "%s: notice: %s: %s", module, path, msg);
    return;
  }
  if (where[0] != '/') {
    flockfile (stderr);
    fprintf (stderr, "nbdkit: %s: notice: %s: %s\n", module, path, msg);
    funlockfile (stderr);
    return;
  }
  if (asprintf (&line, "nbdkit: %s: notice: %s: %s\n", module, path,
                msg) < 0)
    return;
  fd = open (where, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd >= 0) {
    ssize_t r = write (fd, line, strlen (line));

    (void) r;                   /* nowhere else to write it */
    close (fd);
  }
  free (line);
}

/* The name of the plugin nbdkit loaded (nbdkit-NAME-plugin.so), into
 * the buffer opaque points to (GLUE_PLUGIN_NAME_MAX bytes).
 */
static int
introspect_find_plugin (struct dl_phdr_info *info, size_t size, void *opaque)
{
  const char *base = strrchr (info->dlpi_name, '/');
  char *name = opaque;
  size_t len;

  base = base ? base + 1 : info->dlpi_name;
  len = strlen (base);
  if (strncmp (base, "nbdkit-", 7) != 0 || len < 7 + 10 ||
      strcmp (base + len - 10, "-plugin.so") != 0 ||
      len - 17 >= GLUE_PLUGIN_NAME_MAX)
    return 0;
  memcpy (name, base + 7, len - 17);
  name[len - 17] = '\0';
  return 1;
}

/* Depends on: nbdkit loading the plugin as a shared object named
 * nbdkit-NAME-plugin.so.  Retired by: an nbdkit call naming the plugin
 * to a filter (none up to 1.45).
 */
void
glue_plugin_name (char name[GLUE_PLUGIN_NAME_MAX])
{
  name[0] = '\0';
  dl_iterate_phdr (introspect_find_plugin, name);
  assert (strlen (name) < GLUE_PLUGIN_NAME_MAX);
}

/* The filters named after --filter=self, as "--filter=NAME" each
 * (NAME: a path's nbdkit-NAME-filter.so shortened), space-separated.
 */
struct introspect_filters {
  const char *self;
  bool below;                   /* self seen */
  FILE *fp;
};

static bool
introspect_arg_filter (const char *a, const char *next, void *opaque)
{
  struct introspect_filters *f = opaque;
  const char *name, *base;
  size_t len;

  if (strncmp (a, "--filter=", 9) == 0)
    name = a + 9;
  else if (strcmp (a, "--filter") == 0 && next)
    name = next;
  else
    return false;
  base = strrchr (name, '/');
  base = base ? base + 1 : name;
  len = strlen (base);
  if (strncmp (base, "nbdkit-", 7) == 0 && len > 7 + 10 &&
      strcmp (base + len - 10, "-filter.so") == 0) {
    base += 7;
    len -= 17;
  }
  if (f->below)
    fprintf (f->fp, "%s--filter=%.*s", ftell (f->fp) ? " " : "",
             (int) len, base);
  else if (strlen (f->self) == len && strncmp (base, f->self, len) == 0)
    f->below = true;
  return false;
}

/* Depends on: the command line (above), and nbdkit stacking the
 * filters in the order given, the first on top.  Retired by: an nbdkit
 * call naming the layers below a filter (none up to 1.45).
 */
char *
glue_filters_below (const char *self)
{
  struct introspect_filters f = { .self = self };
  char *names = NULL;
  size_t size = 0;

  if (!(f.fp = open_memstream (&names, &size)))
    return NULL;
  introspect_cmdline (introspect_arg_filter, &f);
  if (fclose (f.fp) == EOF) {
    free (names);
    return NULL;
  }
  return names;
}

/* Swaps what fd 2 is, between nbdkit's messages. */
static void
introspect_set_stderr (int fd)
{
  flockfile (stderr);
  fflush (stderr);
  dup2 (fd, STDERR_FILENO);
  funlockfile (stderr);
}

/* What nbdkit before 1.43.9 logs when a plugin asks for the client's
 * export name in a context without a client, as the nbd and sh plugins
 * do at open: harmless, the plugin then uses its own export=.  A line
 * of nbdkit's stderr, or one of syslog's shaped as one
 * (introspect_start_say).
 */
static bool
introspect_no_client_line (const char *line)
{
  /* 1.43.9 on: "no context", where the nbd plugin asks its export. */
  return strstr (line, ": no connection in this thread\n") != NULL ||
    strstr (line, ": no context in this thread\n") != NULL;
}

/* nbdkit's stderr while a context without a client opens: a pipe,
 * whose lines go on to what stderr was (out), but for the one above.
 * Whoever reads the pipe holds lock, which guards the rest.  The relay
 * thread frees it at the pipe's end: when glue_quiet_open and every
 * process started in the while (one a plugin leaves running) have
 * closed their end.
 */
struct introspect_relay {
  struct lock lock;
  int in, out;                  /* fixed at start */
  bool restored;                /* fd 2 is out again */
  size_t len;
  char line[4096];
};

/* Once fd 2 is out again, a line goes between nbdkit's messages, as
 * nbdkit writes each (under stderr's lock, in several writes).  Not
 * before: a thread holding that lock may be waiting for room in the
 * pipe, which only this reader makes.
 */
static void
introspect_relay_write (struct introspect_relay *r, const char *s, size_t n)
  TSA_REQUIRES (r->lock)
{
  if (r->restored)
    flockfile (stderr);
  while (n) {
    ssize_t w = write (r->out, s, n);

    if (w == -1 && errno == EINTR)
      continue;
    if (w <= 0)
      break;                    /* nowhere else to write it */
    s += w;
    n -= w;
  }
  if (r->restored)
    funlockfile (stderr);
}

/* Reads up to max bytes (no more than the pipe holds), passing on each
 * line ended, a line longer than the buffer in pieces, and at the
 * pipe's end the unended rest.  Returns true at the pipe's end.
 */
static bool
introspect_relay_read (struct introspect_relay *r, size_t max)
  TSA_REQUIRES (r->lock)
{
  bool end = false;

  while (max && !end) {
    size_t room = sizeof r->line - 1 - r->len;
    ssize_t got = read (r->in, r->line + r->len, room < max ? room : max);
    char *start = r->line, *nl;

    if (got == -1 && errno == EINTR)
      continue;
    if (got == -1)
      break;                    /* EAGAIN: nothing more for now */
    end = got == 0;
    max -= got;
    r->len += got;
    r->line[r->len] = '\0';
    while ((nl = memchr (start, '\n', r->line + r->len - start))) {
      char after = nl[1];

      nl[1] = '\0';
      if (!introspect_no_client_line (start))
        introspect_relay_write (r, start, nl + 1 - start);
      nl[1] = after;
      start = nl + 1;
    }
    r->len -= start - r->line;
    memmove (r->line, start, r->len + 1);
    if (r->len == sizeof r->line - 1 || (end && r->len)) {
      introspect_relay_write (r, r->line, r->len);
      r->len = 0;
    }
  }
  return end;
}

static void *
introspect_relay_thread (void *arg)
{
  struct introspect_relay *r = arg;
  bool end = false;

  while (!end) {
    struct pollfd p = { .fd = r->in, .events = POLLIN };

    /* Only the pipe's end ends the thread: until glue_quiet_open closed
     * its end, it may use r.  A failed poll is a read finding nothing.
     */
    poll (&p, 1, -1);
    lock_acquire (&r->lock);
    end = introspect_relay_read (r, sizeof r->line);
    lock_release (&r->lock);
  }
  close (r->in);
  close (r->out);
  lock_destroy (&r->lock);
  free (r);
  return NULL;
}

/* The line above is left out by a thread of ours reading stderr while
 * the context opens, not by a file read after: what other threads (a
 * plugin's, started at its after_fork) write in the while goes on at
 * once and whole, none of it is held in a file should the process die
 * in the open, and a process the open starts keeps a stderr that is
 * read for as long as it runs.  Only where nbdkit logs to stderr
 * (syslog gets the line).  Depends on: nbdkit writing its log to fd 2
 * while a context without a client opens, and the wording of that
 * line (1.43.9 words it "no context").
 */
void *
glue_quiet_open (void *(*open) (void *opaque), void *opaque)
{
  struct introspect_relay *r;
  int p[2] = { -1, -1 }, e, held;
  sigset_t all, old;
  pthread_t thread;
  void *h;

  if (strcmp (introspect_log_destination (), "stderr") != 0)
    return open (opaque);
  if (!(r = calloc (1, sizeof *r)))
    return open (opaque);
  r->out = fcntl (STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
  /* Only the end read is not blocking: writers wait for room. */
  if (r->out == -1 || pipe2 (p, O_CLOEXEC) == -1 ||
      fcntl (p[0], F_SETFL, O_NONBLOCK) == -1) {
    if (r->out >= 0)
      close (r->out);
    if (p[0] >= 0) {
      close (p[0]);
      close (p[1]);
    }
    free (r);
    return open (opaque);
  }
  r->in = p[0];
  lock_init (&r->lock);
  /* Signals are the server's. */
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  e = pthread_create (&thread, NULL, introspect_relay_thread, r);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (e) {
    close (p[1]);
    introspect_relay_thread (r);        /* closes and frees */
    return open (opaque);
  }
  pthread_detach (thread);

  introspect_set_stderr (p[1]);
  h = open (opaque);
  introspect_set_stderr (r->out);
  /* What the open wrote comes before what its caller says next. */
  lock_acquire (&r->lock);
  r->restored = true;
  if (ioctl (r->in, FIONREAD, &held) == 0 && held > 0)
    introspect_relay_read (r, held);
  lock_release (&r->lock);
  close (p[1]);                 /* r is the thread's from here */
  return h;
}

/* A listening socket: the connections queued on it are taken, and
 * left open, so that they close as this process exits and their
 * clients (the --run command) end after it, making nbdkit's status
 * this process's; then it is shut down (connecting to it is refused,
 * for every process sharing it: shutting it down first would reset
 * the queued ones at once), and what came in between taken too.
 */
static void
introspect_refuse_queue (int fd)
{
  fcntl (fd, F_SETFL, fcntl (fd, F_GETFL) | O_NONBLOCK);
  while (accept (fd, NULL, NULL) >= 0)
    ;
  shutdown (fd, SHUT_RDWR);
  while (accept (fd, NULL, NULL) >= 0)
    ;
}

/* A Unix socket's path, removed: nbdkit leaves it at exit, and another
 * nbdkit given it cannot bind it.  Only a socket: nothing else can be
 * bound there while this one is.
 */
static void
introspect_unlink_socket (int fd)
{
  struct sockaddr_un a = { 0 };
  socklen_t len = sizeof a - 1;         /* the path ends in a NUL */
  struct stat st;

  if (getsockname (fd, (struct sockaddr *) &a, &len) == 0 &&
      a.sun_family == AF_UNIX && a.sun_path[0] == '/' &&
      lstat (a.sun_path, &st) == 0 && S_ISSOCK (st.st_mode))
    unlink (a.sun_path);
}

/* Calls fn on each socket this process listens on. */
static void
introspect_listening (void (*fn) (int fd))
{
  DIR *d = opendir ("/proc/self/fd");
  struct dirent *e;

  while (d && (e = readdir (d)) != NULL) {
    int listening = 0;
    socklen_t len = sizeof listening;
    char *end;
    long fd = strtol (e->d_name, &end, 10);

    if (*end == '\0' && fd != dirfd (d) &&
        getsockopt ((int) fd, SOL_SOCKET, SO_ACCEPTCONN, &listening,
                    &len) == 0 && listening)
      fn ((int) fd);
  }
  if (d)
    closedir (d);
}

/* -P FILE, -PFILE (-fP FILE: after flags), --pidfile[=]FILE or
 * --pid-file[=]FILE (the last one counts).
 */
static bool
introspect_arg_pidfile (const char *a, const char *next, void *opaque)
{
  const char **file = opaque;

  if (strncmp (a, "--pidfile=", 10) == 0 || strncmp (a, "--pid-file=", 11) == 0)
    *file = strchr (a, '=') + 1;
  else if (strcmp (a, "--pidfile") == 0 || strcmp (a, "--pid-file") == 0)
    *file = next;
  else if (a[0] == '-' && a[1] != '-') {
    a += 1 + strspn (a + 1, "46fnorsvV");
    if (*a == 'P')
      *file = a[1] ? a + 1 : next;
  }
  return false;
}

/* nbdkit's pid file, absolute (the server runs in "/"), or NULL. */
static char *start_pidfile;

/* The pid file, removed if it holds this process's pid. */
static void
introspect_unlink_pidfile (void)
{
  FILE *fp = start_pidfile ? fopen (start_pidfile, "re") : NULL;
  long pid = 0;

  if (fp && fscanf (fp, "%ld", &pid) == 1 && pid == getpid ())
    unlink (start_pidfile);
  if (fp)
    fclose (fp);
}

/* The start of a server heard, for a module that opens what it serves
 * at after_fork (the filter: its plugin can be opened no earlier).
 * nbdkit forks into the background before after_fork: its first
 * process, the command's, has exited 0 by then, and the server logs to
 * syslog, its stderr /dev/null.  So that a refusal then is heard as one
 * at get_ready, the first process, as it exits after the fork, waits
 * for the server's word on a pipe (start_status: 'b' as after_fork
 * begins, then 'o' once the server is ready, or the pipe's end), shows
 * on its stderr what the server logs meanwhile (start_log: the server's
 * stderr while after_fork runs, with syslog's lines copied to it), and
 * exits 1 if the server is not ready.  Depends on: nbdkit's first
 * process calling exit () after the fork (fork_into_background, 1.32 to
 * 1.45); its openlog (program_name, LOG_PID, 0) when it may log to
 * syslog; syslog's copy (LOG_PERROR) being "IDENT[PID]: MESSAGE".
 * Retired by: nbdkit calling .after_fork before its first process
 * exits, or letting a filter open its plugin at .get_ready.
 */
static int start_status[2] = { -1, -1 }, start_log[2] = { -1, -1 };
static int start_stderr = -1;   /* the server's stderr, while swapped */

static void
introspect_start_close (void)
{
  for (int i = 0; i < 2; i++) {
    if (start_status[i] >= 0)
      close (start_status[i]);
    if (start_log[i] >= 0)
      close (start_log[i]);
    start_status[i] = start_log[i] = -1;
  }
}

/* A line of what the server logged, on this process's stderr as nbdkit
 * writes it there: syslog's ("nbdkit[PID]: MESSAGE") as an error, or as
 * the notice it is ("MODULE: notice: ...", glue_log_notice's); the rest
 * as it is.
 */
static void
introspect_start_say (char *line)
{
  size_t ident = strcspn (line, " [:"), pid = 0, word;
  const char *msg = NULL;
  char *out;

  if (ident && line[ident] == '[') {
    pid = strspn (line + ident + 1, "0123456789");
    if (pid && strncmp (line + ident + 1 + pid, "]: ", 3) == 0)
      msg = line + ident + pid + 4;
  }
  word = msg ? strcspn (msg, " :") : 0;
  if (asprintf (&out, "%s%s%s\n", msg ? "nbdkit: " : "",
                !msg || (word && strncmp (msg + word, ": notice: ", 10) == 0)
                ? "" : "error: ", msg ? msg : line) < 0)
    return;
  if (!introspect_no_client_line (out))
    fputs (out, stderr);
  free (out);
}

/* Says each line start_log holds now (non-blocking), and at its end
 * (*open false) the rest.  Returns whether it read anything.
 */
static bool
introspect_start_relay (char *buf, size_t size, size_t *len, bool *open)
{
  bool got_some = false;
  ssize_t got;
  char *nl;

  while ((got = read (start_log[0], buf + *len, size - 1 - *len)) > 0 ||
         (got == -1 && errno == EINTR)) {
    got_some |= got > 0;
    *len += got > 0 ? got : 0;
    buf[*len] = '\0';
    while ((nl = strchr (buf, '\n')) != NULL) {
      *nl = '\0';
      introspect_start_say (buf);
      *len -= nl + 1 - buf;
      memmove (buf, nl + 1, *len + 1);
    }
    if (*len == size - 1) {     /* a line too long: in pieces */
      introspect_start_say (buf);
      *len = 0;
    }
  }
  *open = got == -1 && errno == EAGAIN;
  if (!*open && *len) {
    introspect_start_say (buf);
    *len = 0;
  }
  return got_some;
}

/* The first process, at exit: once the server has said 'b', waits for
 * its 'o', else exits 1.  A process that forked no server (nbdkit -f,
 * or an exit before the fork) finds the pipe's end at once.  A
 * destructor, not atexit: it goes with this module's code, which
 * nbdkit unloads before it exits (ThreadSanitizer's atexit keeps no
 * link to the module and called into unmapped code).
 */
static void __attribute__ ((destructor))
introspect_start_wait (void)
{
  bool begun = false, ready = false, said = false, open = true;
  char buf[4096], c;
  size_t len = 0;

  if (getpid () != load_pid || start_status[0] == -1)
    return;
  close (start_status[1]);
  close (start_log[1]);
  start_status[1] = start_log[1] = -1;
  fcntl (start_log[0], F_SETFL, O_NONBLOCK);
  while (!ready) {
    struct pollfd p[2] = {
      { .fd = start_status[0], .events = POLLIN },
      { .fd = open ? start_log[0] : -1, .events = POLLIN },
    };
    ssize_t got;

    if (poll (p, 2, -1) == -1 && errno != EINTR)
      break;
    if (p[1].revents)
      said |= introspect_start_relay (buf, sizeof buf, &len, &open);
    if (!p[0].revents ||
        ((got = read (start_status[0], &c, 1)) == -1 && errno == EINTR))
      continue;
    if (got <= 0)
      break;
    begun |= c == 'b';
    ready = c == 'o';
  }
  /* What the server logged before its word. */
  if (open)
    said |= introspect_start_relay (buf, sizeof buf, &len, &open);
  introspect_start_close ();
  if (begun && !ready) {
    if (!said)
      fprintf (stderr, "nbdkit: error: the server ended at start: see "
               "where nbdkit logs (--log)\n");
    fflush (NULL);
    _exit (EXIT_FAILURE);
  }
}

void
glue_start_watch (void)
{
  const char *pidfile = NULL;

  introspect_cmdline (introspect_arg_pidfile, &pidfile);
  if (pidfile && !start_pidfile)
    start_pidfile = nbdkit_absolute_path (pidfile);
  if (glue_captive () || start_status[0] >= 0)
    return;
  if (pipe2 (start_status, O_CLOEXEC) == -1 ||
      pipe2 (start_log, O_CLOEXEC) == -1) {
    nbdkit_debug ("a start in the background will not be heard: %m");
    introspect_start_close ();
  }
}

/* syslog's lines are copied to stderr (LOG_PERROR) in the while:
 * harmless where nbdkit does not log to syslog.
 */
void
glue_start_begin (void)
{
  if (start_status[1] == -1)
    return;
  if (getpid () == load_pid) {  /* no fork: -f, -s, socket activation */
    introspect_start_close ();
    return;
  }
  close (start_status[0]);
  close (start_log[0]);
  start_status[0] = start_log[0] = -1;
  /* Without 'b', the first process exits as nbdkit has it exit (0). */
  if ((start_stderr = fcntl (STDERR_FILENO, F_DUPFD_CLOEXEC, 3)) == -1 ||
      write (start_status[1], "b", 1) != 1) {
    if (start_stderr >= 0)
      close (start_stderr);
    start_stderr = -1;
    introspect_start_close ();
    return;
  }
  introspect_set_stderr (start_log[1]);
  openlog (NULL, LOG_PID | LOG_PERROR, 0);
}

/* A server not ready: the pid file and Unix sockets nbdkit made, which
 * it does not remove at exit, are removed.  Under --run, the command's
 * client would wait for ever (nbdkit exits, but the parent running the
 * command keeps the listening sockets open): it is refused, the socket
 * kept (the client told it is refused, not that the socket does not
 * exist).  Depends on: --run's fork (glue_captive), in every nbdkit
 * 1.32 to 1.45 before .after_fork, and the listening sockets being
 * this process's descriptors.  Called by the one thread of nbdkit's in
 * after_fork, before nbdkit accepts, the process ending just after:
 * the sockets of a plugin's threads are none of them listening.
 * Retired by: nbdkit closing its listening sockets in the --run parent
 * and removing what it made at exit, or running .after_fork before it
 * starts the command.
 */
void
glue_start_end (bool ready)
{
  if (!ready) {
    introspect_unlink_pidfile ();
    introspect_listening (glue_captive () ? introspect_refuse_queue
                                          : introspect_unlink_socket);
  }
  if (start_stderr == -1)
    return;
  openlog (NULL, LOG_PID, 0);
  introspect_set_stderr (start_stderr);
  close (start_stderr);
  start_stderr = -1;
  if (ready && write (start_status[1], "o", 1) != 1)
    nbdkit_debug ("the first process was not told the server is ready: %m");
  introspect_start_close ();
}
