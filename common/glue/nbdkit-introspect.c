/* SPDX-License-Identifier: BSD-3-Clause */
/* What the plugin and the filter must know of nbdkit that nbdkit's API
 * (1.32 to 1.45) does not tell them, inferred here and nowhere else.
 * Each piece names the nbdkit behaviour it depends on, and the API that
 * would retire it.  Everything else goes through nbdkit's API.
 */
#include <assert.h>
#include <dirent.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <syslog.h>
#include <unistd.h>

#include "glue.h"

/* The process nbdkit loaded the module in (set by glue_load). */
static pid_t load_pid;

void
glue_introspect_load (void)
{
  load_pid = getpid ();
}

static char cmdline[16384];
static size_t cmdline_len;
static pthread_once_t cmdline_once = PTHREAD_ONCE_INIT;

/* Read once, by whichever thread asks first: the command line does not
 * change, and connections ask from several threads at once.
 */
static void
introspect_read_cmdline (void)
{
  FILE *fp = fopen ("/proc/self/cmdline", "r");

  if (fp) {
    cmdline_len = fread (cmdline, 1, sizeof cmdline - 1, fp);
    fclose (fp);
  }
  cmdline[cmdline_len] = '\0';
}

/* nbdkit's command line, as /proc/self/cmdline holds it: each argument
 * in turn to fn, with the one after it (or NULL), up to "--" or until
 * fn returns true: true if it did.
 *
 * Depends on: nbdkit parsing its options with getopt_long, so that
 * what follows "--" or a plugin's name is not nbdkit's.
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
  assert (cmdline_len < sizeof cmdline);
  for (size_t i = 0; i < cmdline_len; i += strlen (cmdline + i) + 1) {
    size_t next = i + strlen (cmdline + i) + 1;

    if (strcmp (cmdline + i, "--") == 0)
      break;
    if (fn (cmdline + i, next < cmdline_len ? cmdline + next : NULL, opaque))
      return true;
  }
  return false;
}

/* -r, --readonly, --read-only, or r among grouped short flags (-fr,
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

/* Depends on: the command line (above).  The plugin and the filter
 * open the image before any connection, where nbdkit tells .open
 * whether it is read-only.
 */
bool
glue_server_readonly (void)
{
  return introspect_cmdline (introspect_arg_readonly, NULL);
}

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
 * (nbdkit 1.34 and later).  Depends on: --log (the command line), and
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
 * from a server in the background, whose stderr is /dev/null.
 * Retired by: an nbdkit_notice (none up to 1.45).
 */
void
glue_log_notice (const char *module, const char *path, const char *msg)
{
  const char *where = introspect_log_destination ();
  FILE *fp = NULL;

  if (strcmp (where, "null") == 0)
    return;
  if (strcmp (where, "syslog") == 0) {
    syslog (LOG_DAEMON | LOG_NOTICE, "%s: notice: %s: %s", module, path, msg);
    return;
  }
  if (where[0] == '/' && !(fp = fopen (where, "a")))
    return;
  if (!fp)
    fp = stderr;
  flockfile (fp);
  fprintf (fp, "nbdkit: %s: notice: %s: %s\n", module, path, msg);
  funlockfile (fp);
  if (fp != stderr)
    fclose (fp);
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

/* What nbdkit logs when a plugin asks for the client's export name in
 * a context without a client, as the nbd plugin does at open (1.32 to
 * 1.43; "no context" from 1.44): harmless, the plugin then uses its
 * own export=.
 */
static bool
introspect_no_client_line (const char *line)
{
  return strstr (line, ": error: no connection in this thread\n") ||
    strstr (line, ": error: no context in this thread\n") ||
    strstr (line, ": error: no context->exportname in this thread\n");
}

/* Depends on: nbdkit writing its log to fd 2 (not syslog) while a
 * context without a client opens, and the wording of that line.
 * Retired by: nbdkit not calling it an error in a context opened by a
 * filter (as of 1.45 it does).
 */
void *
glue_quiet_open (void *(*open) (void *opaque), void *opaque)
{
  FILE *caught = tmpfile ();
  int saved = caught ? dup (STDERR_FILENO) : -1;
  char *line = NULL;
  size_t len = 0;
  void *r;

  if (saved >= 0)
    dup2 (fileno (caught), STDERR_FILENO);
  r = open (opaque);
  if (saved >= 0) {
    dup2 (saved, STDERR_FILENO);
    close (saved);
    rewind (caught);
    while (getline (&line, &len, caught) != -1)
      if (!introspect_no_client_line (line))
        fputs (line, stderr);
    free (line);
  }
  if (caught)
    fclose (caught);
  return r;
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
  int listening = 0;
  socklen_t len = sizeof listening;

  if (getsockopt (fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == -1 ||
      !listening)
    return;
  fcntl (fd, F_SETFL, fcntl (fd, F_GETFL) | O_NONBLOCK);
  while (accept (fd, NULL, NULL) >= 0)
    ;
  shutdown (fd, SHUT_RDWR);
  while (accept (fd, NULL, NULL) >= 0)
    ;
}

/* The server failed at start (after_fork): nbdkit exits, but under
 * --run the parent, running the command, keeps the listening sockets
 * open, and the command's client would wait for ever on a server that
 * is gone.  Depends on: --run's fork (glue_captive) and the listening
 * sockets being this process's descriptors (found in /proc/self/fd).
 * Retired by: nbdkit closing its listening sockets in the --run parent,
 * or running .after_fork before it starts the command (not up to 1.45).
 */
void
glue_refuse_clients (void)
{
  DIR *d;
  struct dirent *e;

  if (!glue_captive () || !(d = opendir ("/proc/self/fd")))
    return;
  while ((e = readdir (d)) != NULL) {
    char *end;
    long fd = strtol (e->d_name, &end, 10);

    if (*end == '\0' && fd != dirfd (d))
      introspect_refuse_queue ((int) fd);
  }
  closedir (d);
}
