/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdio's connections (see nbdio.c): each has a thread of its own,
 * which connects (so that the nbdkit it may start, whose
 * --exit-with-parent follows the thread that started it, lives exactly
 * as long as the connection) and then runs libnbd's state machine,
 * until the connection dies or is closed; requests take the least busy
 * connection, and one is made again (or one more) as they need.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <libnbd.h>

#include "checked.h"
#include "errstr.h"
#include "nbdio-internal.h"

/* Wait for fd to be ready as libnbd asks, or for the wake pipe, for ms
 * (-1: no limit).  Returns 0 if ready or woken, 1 if timed out.
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

void
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
static char *
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

/* Returns a new handle, connected within the timeout, or NULL with
 * *why.
 */
struct nbd_handle *
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
    r = nbd_aio_connect_systemd_socket_activation (h,
                                                    nbdio_helper_argv (io));
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

/* Returns the export's size through h, or -1 with *why. */
static int64_t
nbdio_export_size (struct nbdio *io, struct nbd_handle *h, char **why)
{
  int64_t size = nbd_get_size (h);

  *why = size == -1 ? nbdio_connect_error (io) : NULL;
  return size;
}

/* Checks that a handle connected again serves what was opened.
 * Returns 0, or -1 with *why.
 */
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

/* Learns from the first handle what the export is (its size, the
 * requests it takes, block status, how many connections).
 */
int
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

/* Marks c (of io) connected through h. */
void
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

/* Connects c again, in c's thread.  Returns the handle, or NULL (c
 * failed, and why kept for the requests waiting).
 */
static struct nbd_handle *
nbdio_conn_reconnect (struct nbdio_conn *c)
  TSA_EXCLUDES (c->io->lock)
{
  struct nbdio *io = c->io;
  char *why = NULL;
  struct nbd_handle *h = nbdio_connect (c, &why);

  lock_acquire (&io->lock);
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
    lock_release (&io->lock);
    return NULL;
  }
  nbdio_ready (io, c, h);
  if (io->lost)
    nbdio_say (io, NBDIO_NOTICE, "connected again");
  io->lost = io->down_logged = false;
  lock_release (&io->lock);
  return h;
}

/* c's thread runs the state machine of h until the connection dies or
 * is closed; then c is dead (to be reaped).
 */
static void
nbdio_conn_serve (struct nbdio_conn *c, struct nbd_handle *h)
  TSA_EXCLUDES (c->io->lock)
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
        nbdio_say (io, NBDIO_ERROR, "%s: no answer for %u s (remote-timeout=): "
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

  lock_acquire (&io->lock);
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
  lock_release (&io->lock);
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
  nbdio_relay_start (io);       /* reads what this process's helpers say */
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
void
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

/* Returns a connection to submit to (its users counted: see
 * nbdio_release), or NULL with errno and, if why is not NULL, *why
 * (malloc'd) when none can be made.  The least busy, connecting again (or
 * one more, where several are allowed) when it is busy or none is left.
 */
struct nbdio_conn *
nbdio_acquire (struct nbdio *io, char **why)
{
  unsigned failures;
  struct nbdio_conn *c = NULL;
  /* Once a request, not once a connection: a system call each. */
  pid_t pid = getpid ();

  lock_acquire (&io->lock);
  failures = io->failures;
  for (;;) {
    struct nbdio_conn *best = NULL, *slot = NULL;
    bool connecting = false;

    for (unsigned i = 0; i < io->nconns; i++) {
      struct nbdio_conn *k = &io->conns[i];
      if ((k->state == CONN_READY || k->state == CONN_CONNECTING) &&
          k->pid != pid)
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
      /* An attempt made since this request came failed: logged for the
       * first request it fails until a connection is made again
       * (EALREADY: for the others).
       */
      errno = io->down_logged ? EALREADY : EIO;
      io->down_logged = true;
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
    lock_wait (&io->lock, &io->changed);
  }
  if (c)
    c->users++;
  lock_release (&io->lock);
  return c;
}

void
nbdio_release (struct nbdio_conn *c)
{
  lock_acquire (&c->io->lock);
  assert (c->users > 0);
  if (--c->users == 0)
    pthread_cond_broadcast (&c->io->changed);
  lock_release (&c->io->lock);
}
