/* SPDX-License-Identifier: BSD-3-Clause */
/* A read-only qcow2_io over libnbd (see nbdio.h).
 *
 * Each connection has a thread of its own, which connects (so that the
 * nbdkit it may start, whose --exit-with-parent follows the thread that
 * started it, lives exactly as long as the connection) and then runs
 * libnbd's state machine: requests are submitted from any thread with
 * libnbd's asynchronous calls and completed by that thread, so that
 * every piece of every request is in flight at once (libnbd's
 * synchronous calls on one handle wait for each other).
 *
 * A connection that dies (the server went away, or answered nothing
 * for the timeout while requests waited, when the thread shuts the
 * socket down) fails what was in flight on it with EIO; the next
 * request connects again.  nbdkit may fork after opening the storage
 * (into the background): the connections of the process before the
 * fork are left, and new ones made.
 */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>

#include "checked.h"
#include "errstr.h"
#include "nbdio.h"
#include "monotonic.h"
#include "tsa.h"

/* What one NBD request may carry when the server does not say (the
 * NBD protocol's recommendation).
 */
#define NBDIO_MAX_REQUEST (32u << 20)

enum conn_state {
  CONN_UNUSED,                  /* never connected */
  CONN_CONNECTING,              /* its thread is connecting */
  CONN_READY,                   /* requests may be submitted */
  CONN_DEAD,                    /* lost: to be reaped, then reconnected */
  CONN_FAILED,                  /* connecting failed: the same */
};

struct nbdio;

/* A mutex that clang's thread-safety analysis knows as a capability
 * (pthread_mutex_t itself cannot be marked): io->lock, io->status_lock
 * and a wait's lock.
 */
struct TSA_CAPABILITY ("mutex") nbdio_mutex {
  pthread_mutex_t m;
};

static void
nbdio_lock (struct nbdio_mutex *l)
  TSA_ACQUIRE (*l) TSA_NO_TSA
{
  pthread_mutex_lock (&l->m);
}

static void
nbdio_unlock (struct nbdio_mutex *l)
  TSA_RELEASE (*l) TSA_NO_TSA
{
  pthread_mutex_unlock (&l->m);
}

/* Block status is asked in spans as long as the protocol allows (4 GiB)
 * and the replies kept: nbdcopy's and a guest's queries cost a round
 * trip a span, not one a query.  At most this many spans of at most
 * NBDIO_STATUS_EXTENTS extents each (a longer reply is kept up to
 * there): some 1.5 MiB at most.
 */
#define NBDIO_STATUS_SPANS 8
#define NBDIO_STATUS_EXTENTS 16384
/* A span starts at a multiple of this before the offset asked (when
 * the extents up to it fit): queries in any order, such as a client's
 * threads' each in its own part of the disk, cost one round trip a
 * span.
 */
#define NBDIO_STATUS_ALIGN (64u << 20)

struct nbdio_extent {
  uint64_t end;                 /* where it ends (it starts at the last's) */
  uint32_t type;                /* QCOW2_EXTENT_* */
};

struct nbdio_span {
  uint64_t start;               /* where the first extent starts */
  struct nbdio_extent *ext;     /* NULL: an empty slot */
  size_t n;                     /* > 0 in a slot in use */
  uint64_t used;                /* io->status_tick at its last use */
};

struct nbdio_conn {
  struct nbdio *io;
  /* Under io->lock (clang cannot check fields in C: the functions
   * that need it say so).
   */
  enum conn_state state;
  bool has_thread;              /* thread to be joined (this process's) */
  pthread_t thread;
  pid_t pid;                    /* the process that connected */
  struct nbd_handle *h;         /* READY, DEAD: the handle */
  int fd;                       /* its socket */
  int shut_fd;                  /* our descriptor of the socket, or -1 */
  unsigned users;               /* threads submitting to h right now */
  unsigned gen;                 /* its number (io->conn_seq) */
  bool shut;                    /* READY but not served: not used again */
  bool timed_out;               /* atomic: dropped for the timeout */
  bool stopping;
  int wake[2];                  /* wakes the thread from poll: its own */
  /* Atomic: commands submitted and not yet completed, and when the
   * connection last moved on (the server sent something, or a request
   * came while none waited): the timeout counts from there.
   */
  unsigned inflight;
  uint64_t progress_ms;
};

struct nbdio {
  struct qcow2_io io;
  char *name;                   /* the URL, for messages */
  char *uri;                    /* an NBD server's, or NULL */
  char **argv;                  /* or the nbdkit to start */
  const char *plugin;           /* its plugin: "curl" or "ssh" */
  struct nbdio_options opts;
  unsigned nconns;              /* connections allowed */
  uint64_t size;                /* the export's, fixed at open */
  uint32_t block_min, block_max;
  bool has_status;              /* base:allocation */

  struct nbdio_mutex lock;
  pthread_cond_t changed;       /* a connection changed state */
  unsigned failures;            /* connecting failed: how many times */
  unsigned conn_seq;            /* connections made so far (atomic) */
  bool down_said;               /* failing to connect said, not said back */
  bool lost;                    /* said lost, not yet said back */
  char *last_why;               /* why it failed the last time */
  struct nbdio_conn conns[NBDIO_MAX_CONNS];

  /* Block status replies kept (the storage never changes while open):
   * the least recently used goes first.
   */
  struct nbdio_mutex status_lock;
  struct nbdio_span spans[NBDIO_STATUS_SPANS];
  uint64_t status_tick;         /* uses so far, for spans[].used */
};

/* What a message is (false and true: debug and error).  A notice's
 * text does not start with the storage's name: the notice callback
 * gets it apart.
 */
enum nbdio_level { NBDIO_DEBUG, NBDIO_ERROR, NBDIO_NOTICE };

static void __attribute__ ((format (printf, 3, 4)))
nbdio_say (struct nbdio *io, enum nbdio_level level, const char *fmt, ...)
{
  void (*fn) (const char *) =
    level == NBDIO_DEBUG ? io->opts.debug : io->opts.error;
  char msg[1024];
  va_list ap;

  if (!fn && !(level == NBDIO_NOTICE && io->opts.notice))
    return;
  va_start (ap, fmt);
  vsnprintf (msg, sizeof msg, fmt, ap);
  va_end (ap);
  if (level == NBDIO_NOTICE && io->opts.notice)
    io->opts.notice (io->name, msg);
  else if (level == NBDIO_NOTICE) {
    char *named;
    if (asprintf (&named, "%s: %s", io->name, msg) >= 0) {
      fn (named);
      free (named);
    }
  }
  else
    fn (msg);
}

static uint64_t
nbdio_now_ms (void)
{
  return monotonic_ns () / 1000000;
}

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

/* Connecting: libnbd's error (without the name of the call), with
 * what the user can do about it.
 */
static char *
nbdio_connect_error (struct nbdio *io)
{
  const char *err = nbd_get_error ();
  int e = nbd_get_errno ();
  char *why;

  /* libnbd sees only the connection reset. */
  if (io->argv && !nbdio_in_path (io->argv[0]))
    return asprintf (&why, "nbdkit's %s plugin could not be started: "
                     "%s not found in PATH (install nbdkit and its %s "
                     "plugin, or add its folder to PATH)", io->plugin,
                     io->argv[0], io->plugin) < 0 ? NULL : why;
  if (err && strncmp (err, "nbd_", 4) == 0 && strstr (err, ": "))
    err = strstr (err, ": ") + 2;
  if (io->argv && err && strstr (err, "handshake"))
    /* nbdkit said why on stderr; libnbd only saw it give up. */
    return asprintf (&why, "nbdkit's %s plugin cannot serve it (its "
                     "message is above)", io->plugin) < 0 ? NULL : why;
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

/* Wait for fd to be ready as libnbd asks, or for the wake pipe; ms
 * (-1: no limit).  0: ready or woken, 1: timed out.
 */
static int
nbdio_poll (struct nbdio_conn *c, struct nbd_handle *h, int ms,
            short *revents)
{
  unsigned dir = nbd_aio_get_direction (h);
  struct pollfd p[2] = {
    { .fd = nbd_aio_get_fd (h),
      .events = (dir & LIBNBD_AIO_DIRECTION_READ ? POLLIN : 0)
                | (dir & LIBNBD_AIO_DIRECTION_WRITE ? POLLOUT : 0) },
    { .fd = c->wake[0], .events = POLLIN },
  };
  int n;

  *revents = 0;
  if (p[0].fd == -1)
    return 0;
  do
    n = poll (p, 2, ms);
  while (n == -1 && errno == EINTR);
  if (p[1].revents & POLLIN) {
    char buf[64];
    while (read (c->wake[0], buf, sizeof buf) > 0)
      ;
  }
  *revents = p[0].revents;
  return n == 0;
}

/* Move the state machine on after poll said revents. */
static void
nbdio_notify (struct nbd_handle *h, short revents)
{
  unsigned dir = nbd_aio_get_direction (h);

  if ((revents & POLLIN) ||
      ((revents & (POLLHUP | POLLERR)) && (dir & LIBNBD_AIO_DIRECTION_READ)))
    nbd_aio_notify_read (h);
  else if (revents & (POLLOUT | POLLHUP | POLLERR))
    nbd_aio_notify_write (h);
}

static void
nbdio_wake (struct nbdio_conn *c)
{
  ssize_t r = write (c->wake[1], "", 1);
  (void) r;                     /* a full pipe wakes it anyway */
}

/* The helper's socket, in the folder libnbd made for it
 * (/tmp/libnbdXXXXXX), is not needed once connected: removed now, not
 * at nbd_close, which a server killed or forked into the background
 * never reaches.  The helper listening on it learns its name only from
 * the connection.
 */
static void
nbdio_unlink_socket (struct nbd_handle *h)
{
  struct sockaddr_un addr;
  socklen_t len = sizeof addr;
  char *slash;

  memset (&addr, 0, sizeof addr);
  if (getpeername (nbd_aio_get_fd (h), (struct sockaddr *) &addr, &len) == -1
      || addr.sun_family != AF_UNIX || len <= offsetof (struct sockaddr_un,
                                                        sun_path)
      || len > sizeof addr)
    return;
  addr.sun_path[sizeof addr.sun_path - 1] = '\0';
  slash = strrchr (addr.sun_path, '/');
  if (strncmp (addr.sun_path, "/tmp/libnbd", 11) != 0 || !slash ||
      strcmp (slash, "/sock") != 0)
    return;
  unlink (addr.sun_path);
  *slash = '\0';
  rmdir (addr.sun_path);
}

/* A new handle, connected within the timeout; NULL with *why. */
static struct nbd_handle *
nbdio_connect (struct nbdio_conn *c, char **why)
{
  struct nbdio *io = c->io;
  uint64_t deadline = nbdio_now_ms () + io->opts.timeout * UINT64_C (1000);
  struct nbd_handle *h = nbd_create ();
  int r;

  *why = NULL;
  if (!h) {
    *why = nbdio_connect_error (io);
    return NULL;
  }
  /* Reads are checked (every byte accounted for: see nbdio_chunk):
   * the buffers need not be zeroed first.
   */
  if (nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1 ||
      nbd_set_pread_initialize (h, false) == -1 ||
      (io->opts.tls_certificates &&
       nbd_set_tls_certificates (h, io->opts.tls_certificates) == -1) ||
      (io->opts.tls_psk_file &&
       nbd_set_tls_psk_file (h, io->opts.tls_psk_file) == -1) ||
      (io->opts.tls_username &&
       nbd_set_tls_username (h, io->opts.tls_username) == -1))
    goto fail;
  if (io->argv) {
    /* libnbd forks and execs nbdkit within this call, which inherits
     * this thread's signal mask: nbdkit's threads and ours block every
     * signal, and a helper started so would never take the SIGTERM of
     * --exit-with-parent.  Signals arriving meanwhile run the serving
     * nbdkit's handlers here, which any of its threads may run.
     */
    sigset_t none, old;
    sigemptyset (&none);
    pthread_sigmask (SIG_SETMASK, &none, &old);
    r = nbd_aio_connect_systemd_socket_activation (h, io->argv);
    pthread_sigmask (SIG_SETMASK, &old, NULL);
  }
  else
    r = nbd_aio_connect_uri (h, io->uri);
  while (r != -1 && !nbd_aio_is_ready (h)) {
    uint64_t now = nbdio_now_ms ();
    short revents;

    if (nbd_aio_is_dead (h) || nbd_aio_is_closed (h))
      goto fail;
    if (now >= deadline ||
        nbdio_poll (c, h, MIN (deadline - now, INT32_MAX), &revents)) {
      if (asprintf (why, "no answer within %u s (remote-timeout=)",
                    io->opts.timeout) < 0)
        *why = NULL;
      goto out;
    }
    if (__atomic_load_n (&c->stopping, __ATOMIC_RELAXED)) {
      *why = strdup ("closed while connecting");
      goto out;
    }
    nbdio_notify (h, revents);
  }
  if (r != -1) {
    if (io->argv)
      nbdio_unlink_socket (h);
    return h;
  }
 fail:
  *why = nbdio_connect_error (io);
 out:
  nbd_kill_subprocess (h, SIGKILL);
  nbd_close (h);
  return NULL;
}

/* The export's size through h, or -1 with *why. */
static int64_t
nbdio_export_size (struct nbdio *io, struct nbd_handle *h, char **why)
{
  int64_t size = nbd_get_size (h);

  *why = size == -1 ? nbdio_connect_error (io) : NULL;
  return size;
}

/* A handle connected again: does it serve what was opened? */
static int
nbdio_check_export (struct nbdio *io, struct nbd_handle *h, char **why)
{
  int64_t size = nbdio_export_size (io, h, why);

  if (size == -1)
    return -1;
  if ((uint64_t) size != io->size) {
    if (asprintf (why, "the export's size is now %" PRId64 ", not %" PRIu64
                  ": it is not the storage that was opened", size,
                  io->size) < 0)
      *why = NULL;
    return -1;
  }
  return 0;
}

/* The first handle: what the export is (its size, the requests it
 * takes, block status, how many connections).
 */
static int
nbdio_init_export (struct nbdio *io, struct nbd_handle *h, char **why)
{
  int64_t size = nbdio_export_size (io, h, why);
  int64_t min, max;

  if (size == -1)
    return -1;
  min = nbd_get_block_size (h, LIBNBD_SIZE_MINIMUM);
  max = nbd_get_block_size (h, LIBNBD_SIZE_MAXIMUM);
  io->size = size;
  io->block_min = min > 1 && min <= 65536 ? min : 1;
  io->block_max = max >= io->block_min && max < NBDIO_MAX_REQUEST
                  ? max & ~(io->block_min - 1) : NBDIO_MAX_REQUEST;
  io->has_status =
    nbd_can_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
  /* A server may serve each connection's requests a few at a time
   * (nbdkit: --threads each): where it allows several connections,
   * more are made as the load needs.
   */
  if (io->uri && nbd_can_multi_conn (h) == 1)
    io->nconns = NBDIO_MAX_CONNS;
  return 0;
}

/* c (of io) is connected through h. */
static void
nbdio_ready (struct nbdio *io, struct nbdio_conn *c, struct nbd_handle *h)
  TSA_REQUIRES (io->lock)
{
  assert (c->io == io);
  assert (c->state == CONN_CONNECTING || c->state == CONN_UNUSED);
  assert (!c->h && c->users == 0);
  c->h = h;
  c->fd = nbd_aio_get_fd (h);
  c->shut_fd = fcntl (c->fd, F_DUPFD_CLOEXEC, 0);
  c->state = CONN_READY;
  c->gen = __atomic_add_fetch (&io->conn_seq, 1, __ATOMIC_RELEASE);
  c->shut = false;
  c->timed_out = false;
  pthread_cond_broadcast (&io->changed);
}

/* c's thread connects again: the handle, or NULL (c failed, and why
 * kept for the requests waiting).
 */
static struct nbd_handle *
nbdio_conn_reconnect (struct nbdio_conn *c)
{
  struct nbdio *io = c->io;
  char *why = NULL;
  struct nbd_handle *h = nbdio_connect (c, &why);

  nbdio_lock (&io->lock);
  assert (c->state == CONN_CONNECTING && !c->h);
  if (h && nbdio_check_export (io, h, &why) == -1) {
    nbd_kill_subprocess (h, SIGKILL);
    nbd_close (h);
    h = NULL;
  }
  if (!h) {
    c->state = CONN_FAILED;
    io->failures++;
    io->lost = true;
    free (io->last_why);
    io->last_why = why;
    pthread_cond_broadcast (&io->changed);
    nbdio_unlock (&io->lock);
    return NULL;
  }
  nbdio_ready (io, c, h);
  if (io->lost)
    nbdio_say (io, NBDIO_NOTICE, "connected again");
  io->lost = io->down_said = false;
  nbdio_unlock (&io->lock);
  return h;
}

/* c's thread runs the state machine of h until the connection dies or
 * is closed; then c is dead (to be reaped).
 */
static void
nbdio_conn_serve (struct nbdio_conn *c, struct nbd_handle *h)
{
  struct nbdio *io = c->io;
  bool timed_out = false;

  while (!nbd_aio_is_dead (h) && !nbd_aio_is_closed (h) &&
         !__atomic_load_n (&c->stopping, __ATOMIC_RELAXED)) {
    uint64_t deadline = __atomic_load_n (&c->progress_ms, __ATOMIC_ACQUIRE)
                        + io->opts.timeout * UINT64_C (1000);
    uint64_t now = nbdio_now_ms ();
    short revents;

    /* Requests wait and the server has said nothing for the timeout:
     * as if it were gone (the socket shut down fails them all, and the
     * connection).  The poll wakes by then at the latest, without a
     * request waking it.
     */
    if (now >= deadline) {
      if (__atomic_load_n (&c->inflight, __ATOMIC_ACQUIRE) > 0 &&
          !timed_out) {
        nbdio_say (io, true, "%s: no answer for %u s (remote-timeout=): "
                   "requests waiting on it fail, and the next one "
                   "connects again", io->name, io->opts.timeout);
        timed_out = true;
        __atomic_store_n (&c->timed_out, true, __ATOMIC_RELEASE);
        shutdown (c->shut_fd, SHUT_RDWR);
      }
      deadline = now + io->opts.timeout * UINT64_C (1000);
    }
    if (nbdio_poll (c, h, MIN (deadline - now, INT32_MAX), &revents))
      continue;
    if (revents)
      __atomic_store_n (&c->progress_ms, nbdio_now_ms (), __ATOMIC_RELEASE);
    nbdio_notify (h, revents);
  }

  nbdio_lock (&io->lock);
  assert (c->state == CONN_READY && c->h == h);
  if (c->shut && !c->stopping) {
    nbdio_say (io, NBDIO_NOTICE, "the server no longer serves a "
               "connection (shutting down?): its requests are asked again "
               "on a new one");
    c->state = CONN_DEAD;
  }
  else if (!c->stopping) {
    io->lost = true;
    if (!timed_out)
      nbdio_say (io, NBDIO_NOTICE, "the connection was lost (%s): "
                 "requests waiting on it are asked again on a new one",
                 nbd_get_error () ? nbd_get_error ()
                 : "the server closed it");
    c->state = CONN_DEAD;
  }
  pthread_cond_broadcast (&io->changed);
  nbdio_unlock (&io->lock);
}

/* The thread of a connection: connect (unless connected at open, in
 * the thread that opened), then serve.
 */
static void *
nbdio_conn_thread (void *arg)
{
  struct nbdio_conn *c = arg;
  struct nbd_handle *h = c->h ? c->h : nbdio_conn_reconnect (c);

  if (h)
    nbdio_conn_serve (c, h);
  return NULL;
}

/* Start c's thread: it connects (the state becomes
 * CONN_CONNECTING) unless c is connected already.  Signals are the
 * server's.
 */
static int
nbdio_start (struct nbdio *io, struct nbdio_conn *c)
  TSA_REQUIRES (io->lock)
{
  sigset_t all, old;
  int e;

  /* The thread's own pipe: after a fork, a thread of the process
   * before it may poll the pipes it had.
   */
  assert (!c->has_thread && c->wake[0] == -1);
  assert (c->h ? c->state == CONN_READY : c->state == CONN_UNUSED);
  if (pipe2 (c->wake, O_CLOEXEC | O_NONBLOCK) == -1)
    return -errno;
  if (!c->h) {
    c->state = CONN_CONNECTING;
    c->pid = getpid ();
  }
  c->stopping = false;
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  e = pthread_create (&c->thread, NULL, nbdio_conn_thread, c);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (e) {
    close (c->wake[0]);
    close (c->wake[1]);
    c->wake[0] = c->wake[1] = -1;
    c->state = CONN_FAILED;
    return -e;
  }
  c->has_thread = true;
  return 0;
}

/* Forget c's last connection: no thread submits to it, and its
 * thread has finished, or does not exist in this process, or was told
 * to stop by nbdio_close (which joins it without io->lock, which the
 * thread takes to end).  io->lock is held, but in nbdio_close, when no
 * other thread uses io.
 */
static void
nbdio_reap (struct nbdio_conn *c)
{
  if (c->has_thread && c->pid == getpid ())
    pthread_join (c->thread, NULL);
  c->has_thread = false;
  if (c->h && c->pid == getpid ()) {
    nbd_kill_subprocess (c->h, SIGKILL);
    nbd_close (c->h);
  }
  else if (c->h)
    /* The handle of the process before a fork, whose thread is gone:
     * not used again, and its socket not left open.
     */
    close (c->fd);
  c->h = NULL;
  if (c->shut_fd >= 0)
    close (c->shut_fd);
  if (c->wake[0] >= 0) {
    close (c->wake[0]);
    close (c->wake[1]);
  }
  c->shut_fd = c->wake[0] = c->wake[1] = -1;
  c->state = CONN_UNUSED;
}

/* A connection to submit to (its users counted: see nbdio_release),
 * or NULL with errno and, if why is not NULL, *why (malloc'd) when
 * none can be made.  The least busy, connecting again (or one more,
 * where several are allowed) when it is busy or none is left.
 */
static struct nbdio_conn *
nbdio_acquire (struct nbdio *io, char **why)
{
  unsigned failures;
  struct nbdio_conn *c = NULL;

  nbdio_lock (&io->lock);
  failures = io->failures;
  for (;;) {
    struct nbdio_conn *best = NULL, *slot = NULL;
    bool connecting = false;

    for (unsigned i = 0; i < io->nconns; i++) {
      struct nbdio_conn *k = &io->conns[i];
      if ((k->state == CONN_READY || k->state == CONN_CONNECTING) &&
          k->pid != getpid ())
        k->state = CONN_DEAD;           /* the process before a fork */
      if (k->state == CONN_READY && !k->shut &&
          (!best || __atomic_load_n (&k->inflight, __ATOMIC_RELAXED)
                    < __atomic_load_n (&best->inflight, __ATOMIC_RELAXED)))
        best = k;
      connecting |= k->state == CONN_CONNECTING;
      if (!slot && k->state != CONN_READY && k->state != CONN_CONNECTING &&
          k->users == 0)
        slot = k;
    }
    if (best && (connecting || !slot ||
                 __atomic_load_n (&best->inflight, __ATOMIC_RELAXED) == 0)) {
      c = best;
      /* Connected at open: its thread starts with its first use. */
      if (!c->has_thread && nbdio_start (io, c) < 0)
        c->state = CONN_DEAD;
      else
        break;
      continue;
    }
    if (!best && io->failures != failures) {
      /* An attempt made since this request came failed: said for the
       * first request it fails until a connection is made again
       * (EALREADY: for the others).
       */
      errno = io->down_said ? EALREADY : EIO;
      io->down_said = true;
      if (why && errno == EIO)
        *why = io->last_why ? strdup (io->last_why) : NULL;
      break;
    }
    if (slot && !connecting) {
      int e;
      nbdio_reap (slot);
      if ((e = nbdio_start (io, slot)) < 0) {
        errno = -e;
        if (why && asprintf (why, "cannot start a thread: %s",
                             errstr (-e)) < 0)
          *why = NULL;
        break;
      }
      if (best) {
        c = best;
        break;
      }
    }
    pthread_cond_wait (&io->changed, &io->lock.m);
  }
  if (c)
    c->users++;
  nbdio_unlock (&io->lock);
  return c;
}

static void
nbdio_release (struct nbdio_conn *c)
{
  nbdio_lock (&c->io->lock);
  assert (c->users > 0);
  if (--c->users == 0)
    pthread_cond_broadcast (&c->io->changed);
  nbdio_unlock (&c->io->lock);
}

/* A set of commands waited for together. */
struct nbdio_wait {
  struct nbdio_mutex lock;
  pthread_cond_t done;
  unsigned pending;
};

/* One NBD command: a read into buf (bounce, if the server's alignment
 * needs one, then copied to out), or a block status.
 */
struct nbdio_cmd {
  struct nbdio_wait *w;
  struct nbdio_conn *c;
  unsigned gen;                 /* the connection it was sent on */
  unsigned seen;                /* the last connection made by then */
  bool retried;
  uint8_t *buf;
  uint32_t len;
  uint64_t offset;
  uint8_t *bounce, *out;        /* out: [skip, skip + out_len) of bounce */
  size_t skip, out_len;
  int *result;                  /* where an error goes (first one kept) */
  int err;
  uint32_t *ext;                /* block status: malloc'd pairs */
  size_t next;
  /* A read: what the server's chunks delivered, as sorted disjoint
   * runs relative to offset (one run, for a server sending in order),
   * or why they were wrong (a chunk outside the request, or over
   * another).  libnbd 1.14 reports success for a reply that covers
   * only part of the range: it is complete only if the runs are
   * exactly [0, len).
   */
  bool is_read;
  const char *bad;
  struct nbdio_run { uint32_t start, end; } *runs;
  size_t nruns, runs_max;
  uint64_t delivered;
};

/* Chunk [start, end) of cmd's range delivered: NULL, or what is wrong
 * (it is over one delivered before, or no memory to remember it).
 */
static const char *
nbdio_account (struct nbdio_cmd *cmd, uint32_t start, uint32_t end)
{
  struct nbdio_run *r;
  size_t i = cmd->nruns;

  /* From the end: chunks come in order, mostly. */
  while (i > 0 && cmd->runs[i - 1].end > start)
    i--;
  if (i < cmd->nruns && cmd->runs[i].start < end)
    return "chunks over each other";
  if (i > 0 && cmd->runs[i - 1].end == start) {
    cmd->runs[i - 1].end = end;
    if (i < cmd->nruns && cmd->runs[i].start == end) {
      cmd->runs[i - 1].end = cmd->runs[i].end;
      memmove (&cmd->runs[i], &cmd->runs[i + 1],
               (cmd->nruns - i - 1) * sizeof *cmd->runs);
      cmd->nruns--;
    }
    return NULL;
  }
  if (i < cmd->nruns && cmd->runs[i].start == end) {
    cmd->runs[i].start = start;
    return NULL;
  }
  if (cmd->nruns == cmd->runs_max) {
    size_t max = cmd->runs_max ? 2 * cmd->runs_max : 4;
    if (!(r = reallocarray (cmd->runs, max, sizeof *r)))
      return "more chunks than memory to count them";
    cmd->runs = r;
    cmd->runs_max = max;
  }
  memmove (&cmd->runs[i + 1], &cmd->runs[i],
           (cmd->nruns - i) * sizeof *cmd->runs);
  cmd->runs[i] = (struct nbdio_run) { start, end };
  cmd->nruns++;
  return NULL;
}

/* libnbd's chunk callback for reads: each chunk accounted for, holes
 * zeroed here (the buffer is not initialised: see nbdio_connect).
 */
static int
nbdio_chunk (void *opaque, const void *subbuf, size_t count,
             uint64_t offset, unsigned status, int *error)
{
  struct nbdio_cmd *cmd = opaque;
  uint64_t start = offset - cmd->offset;

  if (cmd->bad || status == LIBNBD_READ_ERROR)
    return 0;                   /* the command fails anyway */
  if (offset < cmd->offset || range_exceeds (start, count, cmd->len))
    cmd->bad = "a chunk outside the range asked for";
  else if (count == 0)
    cmd->bad = "an empty chunk";
  else
    cmd->bad = nbdio_account (cmd, start, start + count);
  if (cmd->bad)
    return 0;
  if (status == LIBNBD_READ_HOLE)
    memset (cmd->buf + start, 0, count);
  cmd->delivered += count;
  return 0;
}

static int
nbdio_done (void *opaque, int *error)
{
  struct nbdio_cmd *cmd = opaque;
  struct nbdio_wait *w = cmd->w;

  /* A server shutting down waits for its clients to leave: this
   * connection ends (its thread sees it closed), the next request
   * connects again.
   */
  if (*error == ESHUTDOWN)
    shutdown (cmd->c->shut_fd, SHUT_RDWR);
  if (cmd->is_read && *error == 0 &&
      (cmd->bad || cmd->nruns != 1 || cmd->runs[0].start != 0 ||
       cmd->runs[0].end != cmd->len)) {
    nbdio_say (cmd->c->io, true, "%s: the server answered a read of %"
               PRIu32 " bytes at %" PRIu64 " with %s (%" PRIu64 " bytes "
               "in all): the read fails", cmd->c->io->name, cmd->len,
               cmd->offset, cmd->bad ? cmd->bad
               : "chunks not covering all of it", cmd->delivered);
    *error = EIO;
  }
  if (__atomic_fetch_sub (&cmd->c->inflight, 1, __ATOMIC_RELEASE) == 0)
    assert (!"a command completed twice");
  nbdio_lock (&w->lock);
  assert (w->pending > 0);
  cmd->err = *error;
  if (--w->pending == 0)
    pthread_cond_broadcast (&w->done);
  nbdio_unlock (&w->lock);
  return 1;
}

static int
nbdio_extent (void *opaque, const char *metacontext, uint64_t offset,
              uint32_t *entries, size_t n, int *error)
{
  struct nbdio_cmd *cmd = opaque;

  if (strcmp (metacontext, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0 ||
      cmd->ext)
    return 0;
  cmd->ext = malloc (n * sizeof *entries);
  if (cmd->ext) {
    memcpy (cmd->ext, entries, n * sizeof *entries);
    cmd->next = n / 2;
  }
  return 0;
}

/* Submit cmd to a connection; an error said (once per request) sets
 * *cmd->result.  Block status if status, else a read.
 */
static void
nbdio_submit (struct nbdio *io, struct nbdio_cmd *cmd, bool status,
              bool *said)
{
  struct nbdio_conn *c;
  char *why = NULL;
  int64_t cookie;

  c = nbdio_acquire (io, &why);
  if (!c) {
    int e = errno;
    if (!*said && e != EALREADY)
      nbdio_say (io, true, "%s: cannot connect: %s", io->name,
                 why ? why : errstr (e));
    *said = true;
    free (why);
    if (*cmd->result == 0)
      *cmd->result = -EIO;
    return;
  }
  cmd->c = c;
  cmd->gen = c->gen;
  cmd->seen = __atomic_load_n (&io->conn_seq, __ATOMIC_ACQUIRE);
  nbdio_lock (&cmd->w->lock);
  cmd->w->pending++;
  nbdio_unlock (&cmd->w->lock);
  if (__atomic_fetch_add (&c->inflight, 1, __ATOMIC_ACQ_REL) == 0)
    __atomic_store_n (&c->progress_ms, nbdio_now_ms (), __ATOMIC_RELEASE);
  if (status)
    cookie = nbd_aio_block_status (
      c->h, cmd->len, cmd->offset,
      (nbd_extent_callback) { .callback = nbdio_extent, .user_data = cmd },
      (nbd_completion_callback) { .callback = nbdio_done,
                                  .user_data = cmd }, 0);
  else {
    cmd->is_read = true;
    cookie = nbd_aio_pread_structured (
      c->h, cmd->buf, cmd->len, cmd->offset,
      (nbd_chunk_callback) { .callback = nbdio_chunk, .user_data = cmd },
      (nbd_completion_callback) { .callback = nbdio_done,
                                  .user_data = cmd }, 0);
  }
  if (cookie == -1) {
    /* Not queued: no completion will come. */
    __atomic_fetch_sub (&c->inflight, 1, __ATOMIC_RELEASE);
    nbdio_lock (&cmd->w->lock);
    cmd->w->pending--;
    nbdio_unlock (&cmd->w->lock);
    /* Found closed: not served (see nbdio_retry). */
    if (!cmd->retried && (nbd_aio_is_dead (c->h) || nbd_aio_is_closed (c->h)))
      cmd->err = ESHUTDOWN;
    else if (!*said)
      nbdio_say (io, true, "%s: %s", io->name, nbd_get_error ());
    if (cmd->err != ESHUTDOWN) {
      *said = true;
      if (*cmd->result == 0)
        *cmd->result = -EIO;
    }
  }
  /* libnbd sent what it could at once; the thread sends the rest. */
  else if (nbd_aio_get_direction (c->h) & LIBNBD_AIO_DIRECTION_WRITE)
    nbdio_wake (c);
  nbdio_release (c);
}

static void
nbdio_wait_pending (struct nbdio_wait *w)
{
  nbdio_lock (&w->lock);
  while (w->pending > 0)
    pthread_cond_wait (&w->done, &w->lock.m);
  nbdio_unlock (&w->lock);
}

/* Commands the server did not serve (it is shutting down, and answered
 * ESHUTDOWN; or their connection was found closed, or closed with them
 * in flight, other than for the timeout) go once more, on a new
 * connection: a planned restart of the server costs no request (reads
 * and block status may be asked twice).  Their connection is not used
 * again: its thread, woken, finds it shut down; nor are the others
 * made before it was sent, to the same server going away (what they
 * have in flight fails, and is asked again the same way).
 */
static void
nbdio_retry (struct nbdio *io, struct nbdio_cmd *cmds, size_t n,
             bool status, bool *said)
{
  for (size_t i = 0; i < n; i++) {
    struct nbdio_cmd *cmd = &cmds[i];
    struct nbdio_conn *c = cmd->c;

    if ((cmd->err != ESHUTDOWN && cmd->err != ENOTCONN) || cmd->retried)
      continue;
    nbdio_lock (&io->lock);
    if (cmd->err == ENOTCONN && c->gen == cmd->gen &&
        __atomic_load_n (&c->timed_out, __ATOMIC_ACQUIRE)) {
      nbdio_unlock (&io->lock);
      continue;
    }
    for (unsigned j = 0; j < io->nconns; j++) {
      struct nbdio_conn *k = &io->conns[j];
      if (k->state == CONN_READY && !k->shut && k->pid == getpid () &&
          k->gen <= cmd->seen) {
        k->shut = true;
        shutdown (k->shut_fd, SHUT_RDWR);
        nbdio_wake (k);
      }
    }
    nbdio_unlock (&io->lock);
    cmd->retried = true;
    cmd->err = 0;
    free (cmd->ext);
    cmd->ext = NULL;
    cmd->next = 0;
    nbdio_submit (io, cmd, status, said);
  }
}

/* Wait for the commands submitted (status: block status), retried once
 * if not served, then gather their results.
 */
static void
nbdio_wait_all (struct nbdio *io, struct nbdio_wait *w,
                struct nbdio_cmd *cmds, size_t n, bool status, bool *said)
{
  nbdio_wait_pending (w);
  nbdio_retry (io, cmds, n, status, said);
  nbdio_wait_pending (w);
  for (size_t i = 0; i < n; i++) {
    struct nbdio_cmd *cmd = &cmds[i];
    if (cmd->err && *cmd->result == 0)
      *cmd->result = -cmd->err;
    if (cmd->bounce && !cmd->err)
      memcpy (cmd->out, cmd->bounce + cmd->skip, cmd->out_len);
    free (cmd->bounce);
    free (cmd->runs);
  }
}

/* Commands reading [offset, offset+count) into buf (the part within
 * the export), aligned to the server's minimum block size and cut at
 * its maximum, into cmds (NULL: just count them): how many.
 */
static size_t
nbdio_plan_read (struct nbdio *io, uint8_t *buf, size_t count,
                 uint64_t offset, int *result, struct nbdio_cmd *cmds)
{
  size_t n = 0;

  while (count > 0) {
    uint64_t start = offset & ~(uint64_t) (io->block_min - 1);
    uint64_t end = MIN (offset + count, start + io->block_max);
    uint64_t aend = MIN ((end + io->block_min - 1)
                         & ~(uint64_t) (io->block_min - 1), io->size);

    if (cmds) {
      struct nbdio_cmd *cmd = &cmds[n];
      *cmd = (struct nbdio_cmd) { .buf = buf, .len = aend - start,
                                  .offset = start, .result = result };
      if (start != offset || aend != end) {
        cmd->bounce = cmd->buf = malloc (aend - start);
        cmd->out = buf;
        cmd->skip = offset - start;
        cmd->out_len = end - offset;
        if (!cmd->bounce) {
          *result = -ENOMEM;
          cmd->len = 0;
        }
      }
    }
    n++;
    buf += end - offset;
    count -= end - offset;
    offset = end;
  }
  return n;
}

static void
nbdio_pread_many (struct qcow2_io *qio, struct qcow2_io_read *reads,
                  size_t n)
{
  struct nbdio *io = (struct nbdio *) qio;
  struct nbdio_wait w = { .lock = { PTHREAD_MUTEX_INITIALIZER },
                          .done = PTHREAD_COND_INITIALIZER };
  struct nbdio_cmd *cmds;
  size_t ncmds = 0;
  bool said = false;

  /* Past the end of the export reads as zeros. */
  for (size_t i = 0; i < n; i++) {
    struct qcow2_io_read *rd = &reads[i];
    size_t in = rd->offset >= io->size ? 0
                : MIN (rd->count, io->size - rd->offset);
    memset ((uint8_t *) rd->buf + in, 0, rd->count - in);
    rd->r = 0;
    ncmds += nbdio_plan_read (io, rd->buf, in, rd->offset, &rd->r, NULL);
  }
  cmds = calloc (ncmds ? ncmds : 1, sizeof *cmds);
  if (!cmds) {
    for (size_t i = 0; i < n; i++)
      reads[i].r = -ENOMEM;
    return;
  }
  ncmds = 0;
  for (size_t i = 0; i < n; i++) {
    struct qcow2_io_read *rd = &reads[i];
    size_t in = rd->offset >= io->size ? 0
                : MIN (rd->count, io->size - rd->offset);
    ncmds += nbdio_plan_read (io, rd->buf, in, rd->offset, &rd->r,
                              cmds + ncmds);
  }
  for (size_t i = 0; i < ncmds; i++) {
    cmds[i].w = &w;
    if (cmds[i].len && *cmds[i].result == 0)
      nbdio_submit (io, &cmds[i], false, &said);
  }
  nbdio_wait_all (io, &w, cmds, ncmds, false, &said);
  free (cmds);
}

static int
nbdio_pread (struct qcow2_io *io, void *buf, size_t count, uint64_t offset)
{
  struct qcow2_io_read rd = { buf, count, offset, 0 };

  nbdio_pread_many (io, &rd, 1);
  return rd.r;
}

static int
nbdio_preadv (struct qcow2_io *io, const struct iovec *iov, int iovcnt,
              uint64_t offset)
{
  struct qcow2_io_read rd[QCOW2_IOV_MAX];
  int r = 0;

  for (int i = 0; i < iovcnt; i++) {
    rd[i] = (struct qcow2_io_read) { iov[i].iov_base, iov[i].iov_len,
                                     offset, 0 };
    offset += iov[i].iov_len;
  }
  nbdio_pread_many (io, rd, iovcnt);
  for (int i = 0; i < iovcnt && r == 0; i++)
    r = rd[i].r;
  return r;
}

static int
nbdio_pwrite (struct qcow2_io *io, const void *buf, size_t count,
              uint64_t offset)
{
  return -EROFS;
}

static int
nbdio_pwritev (struct qcow2_io *io, const struct iovec *iov, int iovcnt,
               uint64_t offset)
{
  return -EROFS;
}

static int
nbdio_flush (struct qcow2_io *io)
{
  return 0;
}

static int
nbdio_punch (struct qcow2_io *io, uint64_t offset, uint64_t count)
{
  return -EOPNOTSUPP;
}

static int64_t
nbdio_size (struct qcow2_io *io)
{
  return ((struct nbdio *) io)->size;
}

/* The extent at offset from the spans kept, if one covers it
 */
static bool
nbdio_span_find (struct nbdio *io, uint64_t offset, uint32_t *type,
                 uint64_t *len)
  TSA_REQUIRES (io->status_lock)
{
  for (unsigned i = 0; i < NBDIO_STATUS_SPANS; i++) {
    struct nbdio_span *sp = &io->spans[i];
    size_t lo = 0, hi = sp->n;

    if (sp->n == 0 || offset < sp->start || offset >= sp->ext[sp->n - 1].end)
      continue;
    /* The first extent ending after offset. */
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (sp->ext[mid].end > offset)
        hi = mid;
      else
        lo = mid + 1;
    }
    assert (lo < sp->n);
    *type = sp->ext[lo].type;
    *len = sp->ext[lo].end - offset;
    sp->used = ++io->status_tick;
    return true;
  }
  return false;
}

static bool
nbdio_status_cached (struct nbdio *io, uint64_t offset, uint32_t *type,
                     uint64_t *len)
{
  bool found;

  nbdio_lock (&io->status_lock);
  found = nbdio_span_find (io, offset, type, len);
  nbdio_unlock (&io->status_lock);
  return found;
}

/* Keep the reply to a block status at start (n length, flags pairs),
 * in the place of the span used least recently, and what it says of
 * offset: 1, 0 if it ends before offset, or -EIO if it says nothing
 * (the server answered no extent, or only empty ones).
 */
static int
nbdio_status_keep (struct nbdio *io, uint64_t start, const uint32_t *pairs,
                   size_t n, uint64_t offset, uint32_t *type, uint64_t *len)
{
  struct nbdio_extent *ext;
  struct nbdio_span *victim = &io->spans[0];
  uint64_t pos = start;
  size_t k = 0;
  int r;

  n = MIN (n, NBDIO_STATUS_EXTENTS);
  if (n == 0 || !(ext = malloc (n * sizeof *ext)))
    return n == 0 ? -EIO : -ENOMEM;
  /* Extents past the end (a server may round up the last) are cut
   * there; empty ones, which the protocol forbids, are skipped.
   */
  for (size_t i = 0; i < n && pos < io->size; i++) {
    if (pairs[2 * i] == 0)
      continue;
    pos += MIN (pairs[2 * i], io->size - pos);
    ext[k++] = (struct nbdio_extent) {
      .end = pos,
      .type = pairs[2 * i + 1] & (QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO) };
  }
  if (k == 0) {
    free (ext);
    return -EIO;
  }
  nbdio_lock (&io->status_lock);
  for (unsigned i = 1; i < NBDIO_STATUS_SPANS; i++)
    if (io->spans[i].used < victim->used)
      victim = &io->spans[i];
  free (victim->ext);
  *victim = (struct nbdio_span) { .start = start, .ext = ext, .n = k };
  r = nbdio_span_find (io, offset, type, len);
  nbdio_unlock (&io->status_lock);
  return r;
}

/* Ask the server for the extents from start (as far as the protocol's
 * 32 bits allow), keep them, and say what they say of offset (as
 * nbdio_status_keep).
 */
static int
nbdio_status_ask (struct nbdio *io, uint64_t start, uint64_t offset,
                  uint32_t *type, uint64_t *len)
{
  struct nbdio_wait w = { .lock = { PTHREAD_MUTEX_INITIALIZER },
                          .done = PTHREAD_COND_INITIALIZER };
  int r = 0;
  struct nbdio_cmd cmd = {
    .w = &w, .offset = start, .result = &r,
    .len = MIN (io->size - start, UINT32_MAX & ~UINT32_C (65535)) };
  bool said = false;

  assert (start <= offset && offset < io->size);
  nbdio_submit (io, &cmd, true, &said);
  nbdio_wait_all (io, &w, &cmd, 1, true, &said);
  if (r == 0 &&
      (r = nbdio_status_keep (io, start, cmd.ext, cmd.ext ? cmd.next : 0,
                              offset, type, len)) == -EIO)
    nbdio_say (io, true, "%s: the server answered a block status at %"
               PRIu64 " with no extent there", io->name, start);
  free (cmd.ext);
  return r;
}

/* Block status: asked in spans, which are kept (NBDIO_STATUS_SPANS). */
static int
nbdio_status (struct qcow2_io *qio, uint64_t offset, uint64_t count,
              uint32_t *type, uint64_t *len)
{
  struct nbdio *io = (struct nbdio *) qio;
  uint64_t start = offset & ~(uint64_t) (NBDIO_STATUS_ALIGN - 1);
  int r;

  if (offset >= io->size) {
    *type = QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO;
    *len = count;
    return 0;
  }
  if (!io->has_status) {
    *type = 0;
    *len = count;
    return 0;
  }
  if (nbdio_status_cached (io, offset, type, len))
    return 0;
  r = nbdio_status_ask (io, start, offset, type, len);
  /* The reply from the aligned start ended before offset. */
  if (r == 0 && start < offset)
    r = nbdio_status_ask (io, offset, offset, type, len);
  return r == 0 ? -EIO : MIN (r, 0);
}

static void
nbdio_close (struct qcow2_io *qio)
{
  struct nbdio *io = (struct nbdio *) qio;

  nbdio_lock (&io->lock);
  for (unsigned i = 0; i < io->nconns; i++) {
    struct nbdio_conn *c = &io->conns[i];
    if (c->has_thread && c->pid == getpid ()) {
      __atomic_store_n (&c->stopping, true, __ATOMIC_RELAXED);
      nbdio_wake (c);
    }
  }
  nbdio_unlock (&io->lock);
  for (unsigned i = 0; i < io->nconns; i++)
    nbdio_reap (&io->conns[i]);
  for (char **a = io->argv; a && *a; a++)
    free (*a);
  free (io->argv);
  free (io->uri);
  free (io->name);
  free (io->last_why);
  for (unsigned i = 0; i < NBDIO_STATUS_SPANS; i++)
    free (io->spans[i].ext);
  pthread_mutex_destroy (&io->lock.m);
  pthread_cond_destroy (&io->changed);
  pthread_mutex_destroy (&io->status_lock.m);
  free (io);
}

static const struct qcow2_io_ops nbdio_ops = {
  .pread = nbdio_pread,
  .pwrite = nbdio_pwrite,
  .preadv = nbdio_preadv,
  .pwritev = nbdio_pwritev,
  .flush = nbdio_flush,
  .punch = nbdio_punch,
  .size = nbdio_size,
  .status = nbdio_status,
  .pread_many = nbdio_pread_many,
  .close = nbdio_close,
};

static int
nbdio_hex (char c)
{
  return c >= '0' && c <= '9' ? c - '0'
    : c >= 'a' && c <= 'f' ? c - 'a' + 10
    : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Percent-decoding of a URL's part [s, s+len). */
static char *
nbdio_unescape (const char *s, size_t len)
{
  char *r = malloc (len + 1), *q = r;

  if (!r)
    return NULL;
  for (size_t i = 0; i < len; i++) {
    if (s[i] == '%' && i + 2 < len && nbdio_hex (s[i + 1]) >= 0 &&
        nbdio_hex (s[i + 2]) >= 0) {
      *q++ = nbdio_hex (s[i + 1]) << 4 | nbdio_hex (s[i + 2]);
      i += 2;
    }
    else
      *q++ = s[i];
  }
  *q = '\0';
  return r;
}

/* Append "key=value" (value len bytes, percent-decoded if unescape) to
 * the argv being built.
 */
static int
nbdio_arg (char ***argv, size_t *n, const char *key, const char *value,
           size_t len, bool unescape)
{
  char *v = unescape ? nbdio_unescape (value, len) : strndup (value, len);
  char **a = realloc (*argv, (*n + 2) * sizeof **argv);
  int r = -1;

  if (a) {
    *argv = a;
    if (v && (key ? asprintf (&a[*n], "%s=%s", key, v) : asprintf (&a[*n], "%s", v)) >= 0) {
      a[++*n] = NULL;
      r = 0;
    }
  }
  free (v);
  return r;
}

/* An NBD URL with its socket= made absolute, against the folder we are
 * in now (as QEMU, which connects before it forks): nbdkit forking into
 * the background changes to /, and connects again from there.
 */
static char *
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

/* The nbdkit serving an http(s) or ssh URL: its arguments, or -1 with
 * *why.
 */
static int
nbdio_nbdkit_argv (struct nbdio *io, const struct qcow2_remote *remote,
                   char **why)
{
  const char *url = remote->url;
  char ***argv = &io->argv;
  size_t n = 0;
  bool ssh = strncmp (url, "ssh://", 6) == 0;
  int r = 0;

  for (const char *a = "nbdkit\0-r\0--exit-with-parent\0"; *a;
       a += strlen (a) + 1)
    r |= nbdio_arg (argv, &n, NULL, a, strlen (a), false);
  io->plugin = ssh ? "ssh" : "curl";
  if (!ssh) {
    char t[32];
    r |= nbdio_arg (argv, &n, NULL, "curl", 4, false);
    r |= nbdio_arg (argv, &n, "url", url, strlen (url), false);
    if (!remote->sslverify)
      r |= nbdio_arg (argv, &n, "sslverify", "false", 5, false);
    if (remote->timeout) {
      snprintf (t, sizeof t, "%u", remote->timeout);
      r |= nbdio_arg (argv, &n, "timeout", t, strlen (t), false);
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
      r |= nbdio_arg (argv, &n, "cookie", remote->cookie,
                      strlen (remote->cookie), false);
    /* Redirects stay on the web (libcurl may follow them elsewhere). */
    r |= nbdio_arg (argv, &n, "protocols", "http,https", 10, false);
    return r ? -ENOMEM : 0;
  }

  /* ssh://[USER@]HOST[:PORT]/PATH[?host_key_check=no|yes], as QEMU. */
  const char *auth = url + 6, *path = auth + strcspn (auth, "/?");
  const char *at = memchr (auth, '@', path - auth), *host = at ? at + 1 : auth;
  const char *port = NULL, *query = strchr (path, '?');
  const char *hend = path;

  if (*host == '[') {
    const char *close = memchr (host, ']', path - host);
    if (close) {
      port = close[1] == ':' ? close + 2 : NULL;
      hend = close + 1;
    }
  }
  else if ((port = memchr (host, ':', path - host)))
    hend = port++;
  if (*path != '/' || hend == host) {
    if (asprintf (why, "\"%s\" is not an ssh URL QEMU reads: "
                  "ssh://[USER@]HOST[:PORT]/PATH", url) < 0)
      *why = NULL;
    return -EINVAL;
  }
  if (query && strcmp (query, "?host_key_check=no") != 0 &&
      strcmp (query, "?host_key_check=yes") != 0) {
    if (asprintf (why, "%s: only host_key_check=no or yes are supported "
                  "(nbdkit's ssh plugin checks known_hosts or nothing)",
                  url) < 0)
      *why = NULL;
    return -ENOTSUP;
  }
  r |= nbdio_arg (argv, &n, NULL, "ssh", 3, false);
  if (*host == '[')
    r |= nbdio_arg (argv, &n, "host", host + 1, hend - host - 2, false);
  else
    r |= nbdio_arg (argv, &n, "host", host, hend - host, true);
  if (port)
    r |= nbdio_arg (argv, &n, "port", port, path - port, false);
  if (at)
    r |= nbdio_arg (argv, &n, "user", auth, at - auth, true);
  r |= nbdio_arg (argv, &n, "path", path,
                  query ? (size_t) (query - path) : strlen (path), true);
  if (query && strcmp (query, "?host_key_check=no") == 0)
    r |= nbdio_arg (argv, &n, "verify-remote-host", "false", 5, false);
  return r ? -ENOMEM : 0;
}

struct qcow2_io *
nbdio_open (const struct qcow2_remote *remote,
            const struct nbdio_options *opts, char **why)
{
  struct nbdio *io = calloc (1, sizeof *io);
  char *msg = NULL;
  struct nbdio_conn *c;
  int e = 0;

  if (why)
    *why = NULL;
  if (!io)
    return NULL;
  io->io.ops = &nbdio_ops;
  if (opts)
    io->opts = *opts;
  if (!io->opts.timeout)
    io->opts.timeout = NBDIO_TIMEOUT;
  pthread_mutex_init (&io->lock.m, NULL);
  pthread_cond_init (&io->changed, NULL);
  pthread_mutex_init (&io->status_lock.m, NULL);
  io->block_min = 1;
  io->block_max = NBDIO_MAX_REQUEST;
  io->nconns = strncmp (remote->url, "nbd", 3) == 0 ? 1 : NBDIO_MAX_CONNS;
  for (unsigned i = 0; i < NBDIO_MAX_CONNS; i++)
    io->conns[i] = (struct nbdio_conn) { .io = io, .fd = -1, .shut_fd = -1,
                                         .wake = { -1, -1 } };
  if (!(io->name = strdup (remote->url)))
    e = errno;
  else if (strncmp (remote->url, "nbd", 3) == 0) {
    if (!(io->uri = nbdio_socket_uri (remote->url)))
      e = errno;
  }
  else if ((e = -nbdio_nbdkit_argv (io, remote, &msg)) != 0)
    goto fail;
  if (e)
    goto fail;

  /* Connected once now: what is wrong is said at start.  The
   * connection serves from the first request on, when its thread
   * starts (nbdkit may fork in between: see nbdio_acquire).
   */
  c = &io->conns[0];
  c->pid = getpid ();
  {
    struct nbd_handle *h = nbdio_connect (c, &msg);
    if (!h || nbdio_init_export (io, h, &msg) == -1) {
      if (h) {
        nbd_kill_subprocess (h, SIGKILL);
        nbd_close (h);
      }
      e = ENXIO;
      goto fail;
    }
    nbdio_lock (&io->lock);
    nbdio_ready (io, c, h);
    nbdio_unlock (&io->lock);
  }
  nbdio_say (io, false, "%s: %" PRIu64 " bytes, requests of %" PRIu32
             " to %" PRIu32 " bytes, %s, up to %u connection%s", io->name,
             io->size, io->block_min, io->block_max,
             io->has_status ? "block status" : "no block status",
             io->nconns, io->nconns > 1 ? "s" : "");
  return &io->io;

 fail:
  if (why)
    *why = msg;
  else
    free (msg);
  nbdio_close (&io->io);
  errno = e ? e : ENOMEM;
  return NULL;
}
