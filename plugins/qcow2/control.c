/* SPDX-License-Identifier: BSD-3-Clause */
/* control=SOCKET (control.h says what it offers; control-qmp.c speaks
 * the protocol): the socket, made at get_ready, where its errors still
 * reach the terminal (nbdkit then exits 1); its thread, started after nbdkit's fork into the background
 * (threads do not survive it) and stopped at cleanup, before the images
 * close; the socket removed at unload if it is still ours.  The thread
 * owns the clients: it reads them (and runs their commands), writes
 * their output, sends them the events other threads queue, and calls
 * the tick.  A client is never waited for: output it leaves unread is
 * kept up to a bound, past which it is dropped.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "control.h"
#include "control-qmp.h"
#include "errstr.h"
#include "glue.h"
#include "lock.h"
#include "tsa.h"

/* Clients at once; output a client may leave unread; events queued and
 * not yet sent; the tick's period; one read.
 */
#define CONTROL_CLIENTS_MAX 32
#define CONTROL_OUTPUT_MAX (4 << 20)
#define CONTROL_EVENTS_MAX 1024
#define CONTROL_TICK_MS 200
#define CONTROL_READ_MAX 65536

struct control_client {
  int fd;
  struct qmp_session qmp;
  char *out;                    /* unsent: [out_start, out_len) */
  size_t out_start, out_len, out_size;
  bool ending;                  /* no more input: closed once out is sent */
  bool dropped;                 /* closed at the end of the round */
};

/* control= (absolute), the socket's address, and its file once made
 * (removed at unload only if the path still names it).
 */
static char *control_path;
static struct sockaddr_un control_addr = { .sun_family = AF_UNIX };
static int control_fd = -1;
static bool control_made;
static dev_t control_dev;
static ino_t control_ino;

static void (*control_tick) (void);
static pthread_t control_thread;
static bool control_thread_started;

/* The control thread's own. */
static struct control_client *control_clients[CONTROL_CLIENTS_MAX];
static size_t control_nclients;
static int control_wake_read = -1;
/* Files a command left to close once its events are sent
 * (control_close_later).
 */
#define CONTROL_DEFERRED_MAX 8
static int control_deferred[CONTROL_DEFERRED_MAX];
static size_t control_ndeferred;

/* An event's line, queued for the control thread. */
struct control_queued {
  struct control_queued *next;
  size_t len;
  char line[];
};

/* What other threads tell the control thread, under control_lock:
 * events queued (control_wake_write woken for each), the stop.
 */
static struct lock control_lock = LOCK_INITIALIZER;
static bool control_running TSA_GUARDED_BY (&control_lock);
static bool control_stopping TSA_GUARDED_BY (&control_lock);
static int control_wake_write TSA_GUARDED_BY (&control_lock) = -1;
static struct control_queued *control_queue TSA_GUARDED_BY (&control_lock);
static struct control_queued **control_queue_end
  TSA_GUARDED_BY (&control_lock) = &control_queue;
static unsigned control_queued_len TSA_GUARDED_BY (&control_lock);
static unsigned control_dropped TSA_GUARDED_BY (&control_lock);
static bool control_tick_asked TSA_GUARDED_BY (&control_lock);

bool
control_on (void)
{
  return control_path != NULL;
}

void
control_set_tick (void (*fn) (void))
{
  control_tick = fn;
}

int
control_config (const char *key, const char *value)
{
  char *path = nbdkit_absolute_path (value);

  if (!path)
    return -1;
  if (strlen (path) >= sizeof control_addr.sun_path) {
    nbdkit_error ("%s=%s: too long for a socket's path (%zu bytes, at "
                  "most %zu)", key, path, strlen (path),
                  sizeof control_addr.sun_path - 1);
    glue_hint ("name a shorter path (a relative one is taken from the "
               "current folder)");
    free (path);
    return -1;
  }
  free (control_path);
  control_path = path;
  return 0;
}

/* Clears the way for the socket: a socket left by a server that is
 * gone (it refuses connections) is removed; anything else is refused.
 */
static int
control_clear (void)
{
  struct stat st;
  int probe, r, err;

  if (lstat (control_path, &st) == -1) {
    if (errno == ENOENT)
      return 0;
    nbdkit_error ("control=%s: %s", control_path, errstr (errno));
    return -1;
  }
  if (!S_ISSOCK (st.st_mode)) {
    nbdkit_error ("control=%s: exists and is not a socket", control_path);
    glue_hint ("remove it, or name another path");
    return -1;
  }
  probe = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (probe == -1) {
    nbdkit_error ("control=%s: socket: %s", control_path, errstr (errno));
    return -1;
  }
  r = connect (probe, (struct sockaddr *) &control_addr, sizeof control_addr);
  err = errno;
  close (probe);
  /* EAGAIN: its queue of connections is full, but it listens. */
  if (r == 0 || err == EAGAIN) {
    nbdkit_error ("control=%s: another server listens on it", control_path);
    glue_hint ("stop that server, or name another path");
    return -1;
  }
  if (err != ECONNREFUSED) {
    nbdkit_error ("control=%s: %s", control_path, errstr (err));
    return -1;
  }
  if (unlink (control_path) == -1 && errno != ENOENT) {
    nbdkit_error ("control=%s: removing the stale socket: %s", control_path,
                  errstr (errno));
    return -1;
  }
  nbdkit_debug ("control=%s: a stale socket removed", control_path);
  return 0;
}

/* The socket closed, and its file removed if the path still names it
 * (another server may have taken the path since, after removing ours).
 * nbdkit exits without unload when get_ready or after_fork fails: each
 * failure after the socket is made removes it (control_at_exit too).
 */
static void
control_remove (void)
{
  struct stat st;

  if (control_fd >= 0)
    close (control_fd);
  control_fd = -1;
  if (control_made && lstat (control_path, &st) == 0 &&
      S_ISSOCK (st.st_mode) && st.st_dev == control_dev &&
      st.st_ino == control_ino && unlink (control_path) == -1)
    nbdkit_debug ("control=%s: %s", control_path, errstr (errno));
  control_made = false;
}

/* nbdkit exits without unload if it fails after get_ready (its own
 * socket taken), but also in its parent, once forked into the
 * background: at exit (or when the plugin is unloaded, all done), the
 * socket is removed if no fork came first.  A destructor, not atexit:
 * it goes with the plugin's code, which nbdkit may unload before it
 * exits (ThreadSanitizer's atexit then called into unmapped code).
 */
static bool control_forked, control_fork_noted;

static void
control_note_fork (void)
{
  control_forked = true;
}

static void __attribute__ ((destructor))
control_at_exit (void)
{
  if (!control_forked)
    control_remove ();
}

int
control_get_ready (void)
{
  struct stat st;

  if (!control_path)
    return 0;
  strcpy (control_addr.sun_path, control_path);
  if (control_clear () == -1)
    return -1;
  control_fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                       0);
  if (control_fd == -1) {
    nbdkit_error ("control=%s: socket: %s", control_path, errstr (errno));
    return -1;
  }
  /* Mode 0600 from its first moment: Linux makes the file with the
   * mode of the unbound socket (as the umask allows), and no client
   * can connect before listen.
   */
  if (fchmod (control_fd, 0600) == -1 ||
      bind (control_fd, (struct sockaddr *) &control_addr,
            sizeof control_addr) == -1) {
    nbdkit_error ("control=%s: %s", control_path, errstr (errno));
    return -1;
  }
  if (stat (control_path, &st) == 0) {
    control_made = true;
    control_dev = st.st_dev;
    control_ino = st.st_ino;
  }
  if (control_made && !control_fork_noted) {
    if (pthread_atfork (NULL, control_note_fork, NULL) != 0) {
      nbdkit_error ("control=%s: %s", control_path, errstr (ENOMEM));
      control_remove ();
      return -1;
    }
    control_fork_noted = true;
  }
  if (!control_made || listen (control_fd, 16) == -1) {
    nbdkit_error ("control=%s: %s", control_path, errstr (errno));
    control_remove ();
    return -1;
  }
  if ((st.st_mode & 0777) != 0600) {
    nbdkit_error ("control=%s: made with mode %o, not 0600", control_path,
                  (unsigned) (st.st_mode & 0777));
    control_remove ();
    return -1;
  }
  nbdkit_debug ("control=%s: listening", control_path);
  return 0;
}

/* The session's output, and the events: queued for the client, which
 * is dropped if it leaves too much unread.
 */
static void
control_send (void *opaque, const char *line, size_t len)
{
  struct control_client *c = opaque;

  if (c->dropped)
    return;
  if (c->out_len - c->out_start + len > CONTROL_OUTPUT_MAX) {
    nbdkit_debug ("control: a client dropped: it left over %d bytes "
                  "unread", CONTROL_OUTPUT_MAX);
    c->dropped = true;
    return;
  }
  if (c->out_len + len > c->out_size && c->out_start > 0) {
    memmove (c->out, c->out + c->out_start, c->out_len - c->out_start);
    c->out_len -= c->out_start;
    c->out_start = 0;
  }
  if (c->out_len + len > c->out_size) {
    size_t size = c->out_size * 2 > c->out_len + len
      ? c->out_size * 2 : c->out_len + len;
    char *out = realloc (c->out, size);

    if (!out) {
      nbdkit_debug ("control: a client dropped: %s", errstr (errno));
      c->dropped = true;
      return;
    }
    c->out = out;
    c->out_size = size;
  }
  memcpy (c->out + c->out_len, line, len);
  c->out_len += len;
}

static void
control_flush (struct control_client *c)
{
  ssize_t r = send (c->fd, c->out + c->out_start, c->out_len - c->out_start,
                    MSG_NOSIGNAL);

  if (r == -1) {
    if (errno != EAGAIN && errno != EINTR)
      c->dropped = true;
    return;
  }
  c->out_start += r;
  if (c->out_start == c->out_len)
    c->out_start = c->out_len = 0;
}

static void
control_read (struct control_client *c)
{
  static char buf[CONTROL_READ_MAX];
  ssize_t r = recv (c->fd, buf, sizeof buf, 0);

  if (r == -1) {
    if (errno != EAGAIN && errno != EINTR)
      c->dropped = true;
  }
  /* The end of its input: it may still read what it is owed. */
  else if (r == 0 || qmp_session_input (&c->qmp, buf, r) == -1)
    c->ending = true;
}

/* What a client refused gets, as its only line. */
static void
control_send_now (void *opaque, const char *line, size_t len)
{
  if (send (*(int *) opaque, line, len, MSG_NOSIGNAL | MSG_DONTWAIT) == -1)
    nbdkit_debug ("control: %s", errstr (errno));
}

static void
control_accept (void)
{
  int fd = accept4 (control_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  struct control_client *c;

  if (fd == -1) {
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
      nbdkit_debug ("control: accept: %s", errstr (errno));
    return;
  }
  if (control_nclients == CONTROL_CLIENTS_MAX) {
    nbdkit_debug ("control: a client refused: %d at once already",
                  CONTROL_CLIENTS_MAX);
    qmp_refuse (control_send_now, &fd,
                "too many control clients at once: try again later");
    close (fd);
    return;
  }
  c = calloc (1, sizeof *c);
  if (!c || qmp_session_init (&c->qmp, control_send, c) == -1) {
    nbdkit_debug ("control: a client refused: %s", errstr (errno));
    free (c);
    close (fd);
    return;
  }
  c->fd = fd;
  control_clients[control_nclients++] = c;
  control_flush (c);
}

static void
control_close (struct control_client *c)
{
  close (c->fd);
  qmp_session_fini (&c->qmp);
  free (c->out);
  free (c);
}

/* The clients dropped, or done, closed. */
static void
control_reap (void)
{
  size_t kept = 0;

  for (size_t i = 0; i < control_nclients; i++) {
    struct control_client *c = control_clients[i];

    if (c->ending && c->out_start == c->out_len)
      c->dropped = true;
    if (c->dropped)
      control_close (c);
    else
      control_clients[kept++] = c;
  }
  control_nclients = kept;
}

/* Sends the events queued to every client past negotiation; *tick
 * says whether a tick was asked for.  Returns whether the thread must
 * stop.
 */
static bool
control_take_events (bool *tick)
{
  char drain[256];
  struct control_queued *q, *next;
  unsigned dropped;
  bool stop;

  while (read (control_wake_read, drain, sizeof drain) > 0)
    ;
  lock_acquire (&control_lock);
  q = control_queue;
  control_queue = NULL;
  control_queue_end = &control_queue;
  control_queued_len = 0;
  dropped = control_dropped;
  control_dropped = 0;
  stop = control_stopping;
  *tick = control_tick_asked;
  control_tick_asked = false;
  lock_release (&control_lock);
  for (; q; q = next) {
    next = q->next;
    for (size_t i = 0; i < control_nclients; i++)
      if (control_clients[i]->qmp.negotiated)
        control_send (control_clients[i], q->line, q->len);
    free (q);
  }
  if (dropped)
    glue_noticef ("event", "%u events were not sent to the control clients "
                  "(over %d at once)", dropped, CONTROL_EVENTS_MAX);
  return stop;
}

void
control_close_later (int fd)
{
  if (control_ndeferred == CONTROL_DEFERRED_MAX)
    close (fd);
  else
    control_deferred[control_ndeferred++] = fd;
}

/* The files left to close, closed once no event waits to be sent
 * (stopping: at once).
 */
static void
control_close_deferred (bool stopping)
{
  bool pending;

  if (!control_ndeferred)
    return;
  lock_acquire (&control_lock);
  pending = control_queue != NULL;
  lock_release (&control_lock);
  if (pending && !stopping)
    return;
  while (control_ndeferred)
    close (control_deferred[--control_ndeferred]);
}

static int64_t
control_now_ms (void)
{
  struct timespec t;

  clock_gettime (CLOCK_MONOTONIC, &t);
  return (int64_t) t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The poll of a round: the wake pipe, the socket, the clients. */
static size_t
control_poll_fds (struct pollfd *fds, size_t *first)
{
  size_t n = 0;

  fds[n++] = (struct pollfd) { .fd = control_wake_read, .events = POLLIN };
  if (control_fd >= 0)
    fds[n++] = (struct pollfd) { .fd = control_fd, .events = POLLIN };
  *first = n;
  for (size_t i = 0; i < control_nclients; i++) {
    struct control_client *c = control_clients[i];

    fds[n++] = (struct pollfd) {
      .fd = c->fd,
      .events = (c->ending ? 0 : POLLIN) |
        (c->out_len > c->out_start ? POLLOUT : 0),
    };
  }
  return n;
}

static void *
control_run (void *arg)
{
  struct pollfd fds[2 + CONTROL_CLIENTS_MAX];
  int64_t next_tick = control_now_ms () + CONTROL_TICK_MS;

  for (;;) {
    size_t first, n = control_poll_fds (fds, &first);
    int64_t wait = next_tick - control_now_ms ();
    bool tick = false;

    if (poll (fds, n, wait < 0 ? 0 : wait) == -1 && errno != EINTR) {
      nbdkit_error ("control: poll: %s", errstr (errno));
      break;
    }
    if (fds[0].revents && control_take_events (&tick))
      break;
    if (tick)
      next_tick = 0;
    for (size_t i = 0; i < control_nclients; i++) {
      struct control_client *c = control_clients[i];

      if (fds[first + i].revents & (POLLIN | POLLHUP | POLLERR) &&
          !c->ending)
        control_read (c);
      if (!c->dropped && c->out_len > c->out_start)
        control_flush (c);
    }
    if (control_fd >= 0 && fds[1].revents)
      control_accept ();
    control_reap ();
    control_close_deferred (false);
    if (control_now_ms () >= next_tick) {
      if (control_tick)
        control_tick ();
      next_tick = control_now_ms () + CONTROL_TICK_MS;
    }
  }
  for (size_t i = 0; i < control_nclients; i++)
    control_close (control_clients[i]);
  control_nclients = 0;
  control_close_deferred (true);
  return NULL;
}

int
control_after_fork (void)
{
  int wake[2], err;

  if (control_fd == -1 && !control_tick)
    return 0;
  if (pipe2 (wake, O_CLOEXEC | O_NONBLOCK) == -1) {
    nbdkit_error ("control: pipe: %s", errstr (errno));
    control_remove ();
    return -1;
  }
  control_wake_read = wake[0];
  lock_acquire (&control_lock);
  control_wake_write = wake[1];
  control_running = true;
  lock_release (&control_lock);
  err = pthread_create (&control_thread, NULL, control_run, NULL);
  if (err) {
    lock_acquire (&control_lock);
    control_running = false;
    lock_release (&control_lock);
    nbdkit_error ("control: cannot start its thread: %s", errstr (err));
    control_remove ();
    return -1;
  }
  control_thread_started = true;
  return 0;
}

/* Wakes the control thread (a byte in its pipe: if the pipe is full,
 * it is woken already).
 */
static void
control_wake (void)
  TSA_REQUIRES (&control_lock)
{
  if (write (control_wake_write, "", 1) == -1 && errno != EAGAIN)
    nbdkit_debug ("control: waking its thread: %s", errstr (errno));
}

void
control_ask_tick (void)
{
  lock_acquire (&control_lock);
  if (control_running) {
    control_tick_asked = true;
    control_wake ();
  }
  lock_release (&control_lock);
}

/* An event's line, queued if the thread runs (counted as dropped if it
 * has no room).
 */
static void
control_queue_line (const char *line, size_t len)
{
  struct control_queued *q = malloc (sizeof *q + len);
  bool queued = false;

  if (q) {
    q->next = NULL;
    q->len = len;
    memcpy (q->line, line, len);
  }
  lock_acquire (&control_lock);
  if (control_running && q && control_queued_len < CONTROL_EVENTS_MAX) {
    *control_queue_end = q;
    control_queue_end = &q->next;
    control_queued_len++;
    queued = true;
    control_wake ();
  }
  else if (control_running)
    control_dropped++;
  lock_release (&control_lock);
  if (!queued)
    free (q);
}

void
control_event (const char *name, struct json_object *data)
{
  struct json_object *msg = json_object_new_object ();
  struct json_object *timestamp = json_object_new_object ();
  struct timespec now;
  char *line;
  size_t len;

  if (clock_gettime (CLOCK_REALTIME, &now) == -1)
    now.tv_sec = -1, now.tv_nsec = -1000;
  line = data ? qmp_line (data, false, &len) : NULL;
  glue_noticef ("event", "%s%s%s", name, line ? " " : "", line ? line : "");
  free (line);
  /* QEMU's order: the timestamp first. */
  if (!msg || !timestamp ||
      json_object_object_add (msg, "timestamp", timestamp) == -1) {
    json_object_put (timestamp);
    timestamp = NULL;
  }
  if (timestamp &&
      json_object_object_add (timestamp, "seconds",
                              json_object_new_int64 (now.tv_sec)) == 0 &&
      json_object_object_add (timestamp, "microseconds",
                              json_object_new_int64 (now.tv_nsec / 1000))
        == 0 &&
      json_object_object_add (msg, "event",
                              json_object_new_string (name)) == 0 &&
      (!data ||
       json_object_object_add (msg, "data", json_object_get (data)) == 0) &&
      (line = qmp_line (msg, true, &len)) != NULL) {
    control_queue_line (line, len);
    free (line);
  }
  json_object_put (msg);
  json_object_put (data);
}

void
control_cleanup (void)
{
  if (!control_thread_started)
    return;
  lock_acquire (&control_lock);
  control_stopping = true;
  control_running = false;
  control_wake ();
  lock_release (&control_lock);
  pthread_join (control_thread, NULL);
  control_thread_started = false;
}

void
control_unload (void)
{
  struct control_queued *q, *next;

  control_cleanup ();
  lock_acquire (&control_lock);
  q = control_queue;
  control_queue = NULL;
  control_queue_end = &control_queue;
  if (control_wake_write >= 0)
    close (control_wake_write);
  control_wake_write = -1;
  lock_release (&control_lock);
  for (; q; q = next) {
    next = q->next;
    free (q);
  }
  if (control_wake_read >= 0)
    close (control_wake_read);
  control_wake_read = -1;
  control_remove ();
  free (control_path);
  control_path = NULL;
}
