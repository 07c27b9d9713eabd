/* SPDX-License-Identifier: BSD-3-Clause */
/* control=SOCKET's socket and thread (plugins/qcow2/control.c), run in
 * this process as nbdkit would run them (its functions stubbed): the
 * socket's mode, what it replaces and what it refuses, its removal;
 * events from several threads at once, each to every negotiated client
 * in order, with QEMU's timestamp, none to a client before
 * negotiation, each logged once; the tick; and a client that stops
 * reading dropped past its bound of unread output while another goes
 * on being served.  ThreadSanitizer runs it in CI.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "control.h"
#include "glue.h"
#include "unit.h"

/* nbdkit's functions and the glue's that control.c calls. */
static pthread_mutex_t stub_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_error[512];
static unsigned events_logged;

void __attribute__ ((format (printf, 1, 2)))
nbdkit_error (const char *fmt, ...)
{
  va_list ap;

  pthread_mutex_lock (&stub_lock);
  va_start (ap, fmt);
  vsnprintf (last_error, sizeof last_error, fmt, ap);
  va_end (ap);
  pthread_mutex_unlock (&stub_lock);
}

void
nbdkit_debug (const char *fmt, ...)
{
}

char *
nbdkit_absolute_path (const char *path)
{
  char cwd[4096], *abs;

  if (path[0] == '/')
    return strdup (path);
  if (!getcwd (cwd, sizeof cwd) || asprintf (&abs, "%s/%s", cwd, path) == -1)
    return NULL;
  return abs;
}

/* Counts the notices of X_TEST events, as logged. */
void
glue_noticef (const char *where, const char *fmt, ...)
{
  char msg[256];
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (msg, sizeof msg, fmt, ap);
  va_end (ap);
  pthread_mutex_lock (&stub_lock);
  if (strcmp (where, "event") == 0 &&
      strncmp (msg, "X_TEST { \"thread\": ", 19) == 0)
    events_logged++;
  pthread_mutex_unlock (&stub_lock);
}

static unsigned
logged (void)
{
  unsigned n;

  pthread_mutex_lock (&stub_lock);
  n = events_logged;
  pthread_mutex_unlock (&stub_lock);
  return n;
}

void
glue_hint (const char *fmt, ...)
{
}

static char dir[] = "/tmp/test-unit-control.XXXXXX";
static char path[sizeof dir + 16];

/* A client: connected, its greeting read. */
struct client {
  int fd;
  char buf[1 << 18];
  size_t len;
};

static bool
client_connect (struct client *c)
{
  struct sockaddr_un a = { .sun_family = AF_UNIX };
  struct timeval t = { .tv_sec = 20 };

  strcpy (a.sun_path, path);
  c->len = 0;
  c->fd = socket (AF_UNIX, SOCK_STREAM, 0);
  setsockopt (c->fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
  return connect (c->fd, (struct sockaddr *) &a, sizeof a) == 0;
}

/* The next line, parsed (NULL at EOF, or after 20 s). */
static struct json_object *
client_line (struct client *c)
{
  char *nl;
  struct json_object *o;
  ssize_t r;

  while (!(nl = memchr (c->buf, '\n', c->len))) {
    if (c->len == sizeof c->buf)
      return NULL;
    r = recv (c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
    if (r <= 0)
      return NULL;
    c->len += r;
  }
  *nl = '\0';
  o = json_tokener_parse (c->buf);
  c->len -= nl + 1 - c->buf;
  memmove (c->buf, nl + 1, c->len);
  return o;
}

static void
client_send (struct client *c, const char *msg)
{
  CHECK (send (c->fd, msg, strlen (msg), MSG_NOSIGNAL) ==
         (ssize_t) strlen (msg));
}

static bool
has (struct json_object *o, const char *key)
{
  return json_object_object_get_ex (o, key, NULL);
}

static unsigned ticks;

static void
tick (void)
{
  __atomic_add_fetch (&ticks, 1, __ATOMIC_RELAXED);
}

#define THREADS 4
#define EVENTS 250

static void *
emitter (void *arg)
{
  for (int i = 0; i < EVENTS; i++) {
    struct json_object *data = json_object_new_object ();

    json_object_object_add (data, "thread",
                            json_object_new_int ((intptr_t) arg));
    json_object_object_add (data, "n", json_object_new_int (i));
    control_event ("X_TEST", data);
  }
  return NULL;
}

/* Every event of every thread, in each thread's order. */
static void
check_events (struct client *c)
{
  int next[THREADS] = { 0 };
  bool ordered = true, stamped = true;
  struct timeval now;
  unsigned got = 0;

  gettimeofday (&now, NULL);
  while (got < THREADS * EVENTS) {
    struct json_object *e = client_line (c), *data, *ts, *v;
    int t, n;

    if (!CHECKF (e, "event %u of %d: none", got, THREADS * EVENTS))
      return;
    if (!CHECKF (json_object_object_get_ex (e, "data", &data) &&
                 strcmp (json_object_get_string (
                           json_object_object_get (e, "event")), "X_TEST")
                 == 0, "not the event: %s", json_object_get_string (e)))
      return;
    t = json_object_get_int (json_object_object_get (data, "thread"));
    n = json_object_get_int (json_object_object_get (data, "n"));
    ordered &= t >= 0 && t < THREADS && n == next[t];
    if (t >= 0 && t < THREADS)
      next[t] = n + 1;
    stamped &= json_object_object_get_ex (e, "timestamp", &ts) &&
      json_object_object_length (ts) == 2 &&
      json_object_object_get_ex (ts, "seconds", &v) &&
      llabs (json_object_get_int64 (v) - now.tv_sec) < 60 &&
      json_object_object_get_ex (ts, "microseconds", &v) &&
      json_object_get_int64 (v) >= 0 && json_object_get_int64 (v) < 1000000;
    json_object_put (e);
    got++;
  }
  CHECK (ordered);
  CHECK (stamped);
}

static void
check_serving (void)
{
  static struct client a, b, slow;
  pthread_t threads[THREADS];
  struct json_object *o;
  struct stat st;
  char big[70000];

  CHECK (control_config ("control", "ctl.sock") == 0);
  CHECK (control_on ());
  control_set_tick (tick);
  CHECK (control_get_ready () == 0);
  CHECK (stat (path, &st) == 0 && S_ISSOCK (st.st_mode) &&
         (st.st_mode & 07777) == 0600);
  CHECK (control_after_fork () == 0);

  /* a negotiates, b does not. */
  CHECK (client_connect (&a) && client_connect (&b) &&
         client_connect (&slow));
  o = client_line (&a);
  CHECK (o && has (o, "QMP"));
  json_object_put (o);
  json_object_put (client_line (&b));
  json_object_put (client_line (&slow));
  client_send (&a, "{\"execute\": \"qmp_capabilities\"}");
  o = client_line (&a);
  CHECK (o && has (o, "return"));
  json_object_put (o);

  for (intptr_t t = 0; t < THREADS; t++)
    pthread_create (&threads[t], NULL, emitter, (void *) t);
  for (int t = 0; t < THREADS; t++)
    pthread_join (threads[t], NULL);
  check_events (&a);
  CHECK_INT (logged (), THREADS * EVENTS);
  /* Nothing for b, which has not negotiated: its next line answers. */
  client_send (&b, "{\"execute\": \"query-version\", \"id\": 1}");
  o = client_line (&b);
  CHECK (o && has (o, "error") && has (o, "id"));
  json_object_put (o);

  /* slow negotiates, then reads nothing: past 4 MiB unread it is
   * dropped, while a gets every event, without waiting for it.
   */
  client_send (&slow, "{\"execute\": \"qmp_capabilities\"}");
  client_send (&a, "{\"execute\": \"query-version\", \"id\": 2}");
  json_object_put (client_line (&a));
  memset (big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  for (int i = 0; i < 100; i++) {
    struct json_object *data = json_object_new_object ();

    json_object_object_add (data, "x", json_object_new_string (big));
    control_event ("X_BIG", data);
    o = client_line (&a);
    CHECKF (o && has (o, "event"), "big event %d: not received", i);
    json_object_put (o);
  }
  {
    size_t total = 0;
    ssize_t r;
    char sink[65536];

    while ((r = recv (slow.fd, sink, sizeof sink, 0)) > 0)
      total += r;
    /* What the kernel held: the rest was dropped with it. */
    CHECKF (r == 0 && total < 4 << 20, "slow client: %zu bytes, then %zd",
            total, r);
  }
  sleep (1);
  unsigned n = __atomic_load_n (&ticks, __ATOMIC_RELAXED);
  CHECKF (n >= 3,
          "%u ticks", n);

  control_cleanup ();
  /* Once the thread is stopped, an event is only logged. */
  control_event ("X_AFTER", NULL);
  CHECK (client_line (&a) == NULL);
  close (a.fd), close (b.fd), close (slow.fd);
  control_unload ();
  CHECK (lstat (path, &st) == -1 && errno == ENOENT);
}

/* Starts a server on path as far as get_ready: the error, or "". */
static const char *
start (void)
{
  last_error[0] = '\0';
  CHECK (control_config ("control", path) == 0);
  if (control_get_ready () == 0) {
    control_unload ();
    return "";
  }
  control_unload ();
  return last_error;
}

static void
check_refusals (void)
{
  struct sockaddr_un a = { .sun_family = AF_UNIX };
  int fd;
  const char *err;
  char long_path[200];

  strcpy (a.sun_path, path);
  /* A stale socket: bound, no one listening. */
  fd = socket (AF_UNIX, SOCK_STREAM, 0);
  CHECK (bind (fd, (struct sockaddr *) &a, sizeof a) == 0);
  close (fd);
  err = start ();
  CHECKF (*err == '\0', "stale socket: %s", err);
  /* A live one. */
  fd = socket (AF_UNIX, SOCK_STREAM, 0);
  CHECK (bind (fd, (struct sockaddr *) &a, sizeof a) == 0 &&
         listen (fd, 1) == 0);
  err = start ();
  CHECKF (strstr (err, "another server listens on it"), "live: %s", err);
  CHECK (access (path, F_OK) == 0);
  close (fd);
  unlink (path);
  /* Not a socket: a file, a folder, a symbolic link to a socket. */
  close (creat (path, 0600));
  err = start ();
  CHECKF (strstr (err, "exists and is not a socket"), "file: %s", err);
  CHECK (access (path, F_OK) == 0);
  unlink (path);
  CHECK (mkdir (path, 0700) == 0);
  err = start ();
  CHECKF (strstr (err, "exists and is not a socket"), "folder: %s", err);
  rmdir (path);
  CHECK (symlink ("elsewhere.sock", path) == 0);
  err = start ();
  CHECKF (strstr (err, "exists and is not a socket"), "link: %s", err);
  unlink (path);
  /* Too long a path for a socket. */
  memset (long_path, 'a', sizeof long_path - 1);
  long_path[sizeof long_path - 1] = '\0';
  CHECK (control_config ("control", long_path) == -1 &&
         strstr (last_error, "too long for a socket's path"));
  /* Removed at unload only if still ours. */
  CHECK (control_config ("control", path) == 0 && control_get_ready () == 0);
  unlink (path);
  close (creat (path, 0600));
  control_unload ();
  CHECK (access (path, F_OK) == 0);
  unlink (path);
}

int
main (void)
{
  if (!mkdtemp (dir) || chdir (dir) == -1) {
    perror (dir);
    return EXIT_FAILURE;
  }
  snprintf (path, sizeof path, "%s/ctl.sock", dir);
  check_serving ();
  check_refusals ();
  rmdir (dir);
  return unit_finish ();
}
