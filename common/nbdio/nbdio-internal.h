/* SPDX-License-Identifier: BSD-3-Clause */
/* What the files of nbdio share: its state, and the functions one file
 * gives the others.  From the bottom up (README: each file calls only
 * those before it): log.c, messages and the clock; names.c, URLs and
 * the nbdkit helpers' command; relay.c, what the helpers say on stderr;
 * conn.c, connections, their threads, reconnection; nbdio.c, reads,
 * block status, open and close.
 */
#ifndef NBDIO_INTERNAL_H
#define NBDIO_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <libnbd.h>

#include "lock.h"
#include "nbdio.h"
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

/* The helpers' stderr (relay.c): a pipe each helper writes to, read
 * by a thread of the serving process, which says a line once and
 * counts the lines like it that follow (a base down makes nbdkit's
 * curl plugin say the same for every request) rather than each.
 * Nothing but that thread and, once it has ended, nbdio_close touches
 * the lines: no lock.  The thread is started under io->lock; pid is
 * read without (nbdio_helper_argv).
 */
struct nbdio_relay {
  bool on;                      /* fd holds the pipe */
  int fd[2];
  size_t wrap;                  /* argv's first, giving the helper the pipe */
  bool has_thread;              /* then wake holds its pipe */
  pid_t pid;                    /* the process the thread runs in (atomic) */
  pthread_t thread;
  int wake[2];
  char line[1024];              /* a line not yet ended */
  size_t len;
  char *shape;                  /* the last line logged, without digits */
  unsigned repeats;             /* lines like it since, not logged */
  uint64_t logged_ms, last_ms;  /* it (or a count) logged; the last like it */
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

  struct lock lock;
  pthread_cond_t changed;       /* a connection changed state */
  unsigned failures;            /* connecting failed: how many times */
  unsigned conn_seq;            /* connections made so far (atomic) */
  bool down_logged;             /* failing to connect logged, not back yet */
  bool lost;                    /* logged lost, not yet logged back */
  char *last_why;               /* why it failed the last time */
  struct nbdio_conn conns[NBDIO_MAX_CONNS];
  struct nbdio_relay relay;     /* the helpers' stderr */

  /* Block status replies kept (the storage never changes while open):
   * the least recently used goes first.
   */
  struct lock status_lock;
  struct nbdio_span spans[NBDIO_STATUS_SPANS];
  uint64_t status_tick;         /* uses so far, for spans[].used */
};

/* What a message is, and so which of the options' callbacks gets it:
 * debug, error, or notice (the error callback if there is no notice
 * one).  A notice's text does not start with the storage's name: the
 * notice callback gets it apart.
 */
enum nbdio_level { NBDIO_DEBUG, NBDIO_ERROR, NBDIO_NOTICE };

/* log.c */
extern void nbdio_say (struct nbdio *io, enum nbdio_level level,
                       const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));
extern uint64_t nbdio_now_ms (void);

/* names.c */
extern char *nbdio_socket_uri (const char *url);
extern int nbdio_nbdkit_argv (struct nbdio *io,
                              const struct qcow2_remote *remote, char **why);

/* relay.c */
extern int nbdio_relay_open (struct nbdio *io);
extern void nbdio_relay_start (struct nbdio *io)
  TSA_REQUIRES (io->lock);
extern char **nbdio_helper_argv (struct nbdio *io);
extern void nbdio_relay_stop (struct nbdio *io);

/* conn.c */
extern void nbdio_wake (struct nbdio_conn *c);
extern struct nbd_handle *nbdio_connect (struct nbdio_conn *c, char **why);
extern int nbdio_init_export (struct nbdio *io, struct nbd_handle *h,
                              char **why);
extern void nbdio_ready (struct nbdio *io, struct nbdio_conn *c,
                         struct nbd_handle *h)
  TSA_REQUIRES (io->lock);
extern void nbdio_reap (struct nbdio_conn *c);
extern struct nbdio_conn *nbdio_acquire (struct nbdio *io, char **why)
  TSA_EXCLUDES (io->lock);
extern void nbdio_release (struct nbdio_conn *c)
  TSA_EXCLUDES (c->io->lock);

#endif /* NBDIO_INTERNAL_H */
