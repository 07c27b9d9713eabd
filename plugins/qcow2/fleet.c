/* SPDX-License-Identifier: BSD-3-Clause */
/* dir=: every image of a folder is an export of its name, opened at its
 * first client's open and shared by every connection to it, closed
 * idle-close= seconds after its last one left; template= makes the
 * image of a new name.  The engine does each image's own locking; the
 * table of open images has its lock here.
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "errstr.h"
#include "fileio.h"
#include "fleet.h"
#include "glue.h"
#include "lock.h"
#include "plugin.h"
#include "qcow2.h"

/* The table of open images, and what the idle sweeper is told, under
 * fleet_lock (an entry's fields too: clang 14 cannot mark fields of a
 * C struct guarded, so the functions using them require the lock).
 */
struct lock fleet_lock = LOCK_INITIALIZER;
struct fleet_export *fleet_exports TSA_GUARDED_BY (&fleet_lock);
static unsigned fleet_count TSA_GUARDED_BY (&fleet_lock);
static bool fleet_sweeper_running TSA_GUARDED_BY (&fleet_lock);
static bool fleet_stopping TSA_GUARDED_BY (&fleet_lock);
/* An export's state changed (for openers waiting on it). */
static pthread_cond_t fleet_changed;
/* An export fell idle, or the server stops: the idle sweeper's own,
 * so that opening an export does not wake it for nothing.
 */
static pthread_cond_t fleet_idle;
static pthread_t fleet_sweeper;   /* closes idle images (idle_close > 0) */

struct fleet_keys fleet = { .idle_close = 5, .dirfd = -1 };


/* The entry of the export name (not stale), or NULL. */
static struct fleet_export *
fleet_find (const char *name)
  TSA_REQUIRES (&fleet_lock)
{
  for (struct fleet_export *e = fleet_exports; e; e = e->next)
    if (!e->stale && strcmp (e->name, name) == 0)
      return e;
  return NULL;
}

/* A new entry, in the table. */
static struct fleet_export *
fleet_add (const char *name)
  TSA_REQUIRES (&fleet_lock)
{
  struct fleet_export *e = calloc (1, sizeof *e);

  if (!e || !(e->name = strdup (name))) {
    nbdkit_error ("export \"%s\": %s", name, errstr (errno));
    free (e);
    return NULL;
  }
  e->state = EXPORT_OPENING;
  e->users = 1;
  e->next = fleet_exports;
  fleet_exports = e;
  fleet_count++;
  return e;
}

/* e out of the table, and freed (its image closed or never opened). */
static void
fleet_remove (struct fleet_export *e)
  TSA_REQUIRES (&fleet_lock)
{
  struct fleet_export **p = &fleet_exports;

  while (*p != e)
    p = &(*p)->next;
  *p = e->next;
  fleet_count--;
  free (e->name);
  free (e->path);
  free (e->info);
  free (e);
  pthread_cond_broadcast (&fleet_changed);
}

/* Close the image of e, and drop e.  The lock is let go meanwhile (a
 * flush may take long), e marked closing: an open of its name waits
 * (its file's locks are held until it is closed).  Its stream stops
 * where it is, and goes on from there when the image opens again.
 */
static void
fleet_close (struct fleet_export *e)
  TSA_REQUIRES (&fleet_lock)
{
  e->state = EXPORT_CLOSING;
  lock_release (&fleet_lock);
  glue_stream_job_free (e->served.job);
  e->served.job = NULL;
  image_close (e->served.image, e->path);
  lock_acquire (&fleet_lock);
  fleet_remove (e);
}

static void
fleet_close_all (void)
  TSA_EXCLUDES (&fleet_lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  while (fleet_exports)
    fleet_close (fleet_exports);
}

/* dir='s keys: dir= resolved (what is in it is what it holds once
 * every link is followed); the others go only with dir=.
 */
int
fleet_config (const char *key, const char *value)
{
  char **dest = strcmp (key, "template") == 0 ? &fleet.template
    : strcmp (key, "default-export") == 0 ? &fleet.default_export : NULL;

  if (strcmp (key, "dir") == 0)
    return glue_parse_folder (key, value, &fleet.dir);
  if (!fleet.key)
    fleet.key = strcmp (key, "template") == 0 ? "template"
      : strcmp (key, "default-export") == 0 ? "default-export"
      : strcmp (key, "idle-close") == 0 ? "idle-close" : "max-exports";
  if (strcmp (key, "idle-close") == 0)
    return glue_parse_number (key, value, "seconds", 86400,
                              &fleet.idle_close);
  if (strcmp (key, "max-exports") == 0)
    return glue_parse_range (key, value, "images", 1, 1000000,
                             &fleet.max_exports);
  free (*dest);
  *dest = strdup (value);
  return *dest ? 0 : -1;
}

bool
fleet_on (void)
{
  return fleet.dir != NULL;
}

const char *
fleet_key_given (void)
{
  return fleet.key;
}

/* What dir= needs of the other keys (those of file= are refused by
 * the caller).
 */
int
fleet_config_complete (void)
{
  const char *why;

  if (glue.create.first_key && !fleet.template) {
    nbdkit_error ("%s= describes an image to make: with dir=, it needs "
                  "template=", glue.create.first_key);
    return -1;
  }
  if (fleet.default_export &&
      (why = fleet_name_refusal (fleet.default_export))) {
    nbdkit_error ("default-export=%s: refused: %s", fleet.default_export,
                  why);
    return -1;
  }
  return 0;
}

/* The open images that no client uses. */
static unsigned
fleet_idle_count (void)
  TSA_EXCLUDES (&fleet_lock)
{
  unsigned n = 0;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  for (struct fleet_export *e = fleet_exports; e; e = e->next)
    n += e->state == EXPORT_OPEN && e->users == 0;
  return n;
}

static void
fleet_close_idle (void)
  TSA_EXCLUDES (&fleet_lock)
{
  struct fleet_export *e;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  do {
    for (e = fleet_exports; e; e = e->next)
      if (e->state == EXPORT_OPEN && e->users == 0)
        break;
    if (e)
      fleet_close (e);
  } while (e);
}

/* idle-close=: the images of exports idle that long closed, in a
 * thread of their own, woken when an export falls idle.
 */
static void *
fleet_sweep (void *arg)
  TSA_EXCLUDES (&fleet_lock)
{
  lock_acquire (&fleet_lock);
  while (!fleet_stopping) {
    struct timespec now, next = { 0, 0 };
    struct fleet_export *e;

    clock_gettime (CLOCK_MONOTONIC, &now);
    for (e = fleet_exports; e; e = e->next) {
      struct timespec due = e->idle_since;

      if (e->state != EXPORT_OPEN || e->users > 0)
        continue;
      due.tv_sec += fleet.idle_close;
      if (due.tv_sec < now.tv_sec ||
          (due.tv_sec == now.tv_sec && due.tv_nsec <= now.tv_nsec))
        break;
      if (next.tv_sec == 0 || due.tv_sec < next.tv_sec ||
          (due.tv_sec == next.tv_sec && due.tv_nsec < next.tv_nsec))
        next = due;
    }
    if (e)
      fleet_close (e);
    else if (next.tv_sec)
      lock_wait_until (&fleet_lock, &fleet_idle, &next);
    else
      lock_wait (&fleet_lock, &fleet_idle);
  }
  lock_release (&fleet_lock);
  return NULL;
}






/* dir=: a file is known by its device and inode (a hard link to it,
 * or another path, is the same file): a backing layer is shared by
 * every image above it, and a file is never both a layer read by some
 * and an image written by another (common/qcow2/layers.c).
 */
static char *
fleet_identity_of (const struct stat *st)
{
  char *s;

  if (asprintf (&s, "file:%ju:%ju", (uintmax_t) st->st_dev,
                (uintmax_t) st->st_ino) == -1)
    return NULL;
  return s;
}

static char *
fleet_env_identity (void *opaque, const char *path)
{
  struct stat st;

  return stat (path, &st) == 0 ? fleet_identity_of (&st) : NULL;
}

/* glue_env's open, the file known as above. */
static struct qcow2_io *
fleet_env_open (void *opaque, const char *path, bool readonly, char **id)
{
  struct qcow2_io *io = glue_env.open (opaque, path, readonly, id);
  struct stat st;
  int e;

  if (!io)
    return NULL;
  free (*id);
  *id = fileio_stat (io, &st) == 0 ? fleet_identity_of (&st) : NULL;
  if (!*id) {
    e = errno;
    io->ops->close (io);
    errno = e;
    return NULL;
  }
  return io;
}


/* stream=true: the job of e's image (at path) made and started.  An
 * image with no backing file has nothing to stream: it is served as it
 * is, even read-only (the template may be).  Returns 0, or -1 after
 * logging an error.
 */
static int
fleet_stream (struct fleet_export *e, const char *path)
{
  struct qcow2_info i;

  qcow2_get_info (e->served.image, &i);
  if (!i.backing)
    return 0;
  /* Read before the job may change it. */
  e->info = fleet_info_text (e->served.image, false);
  if (!e->info) {
    nbdkit_error ("%s: %s", path, errstr (errno));
    return -1;
  }
  /* nbdkit -r and readonly=true are refused at start: an image read-only
   * here is so for a reason logged as it was opened.
   */
  if (glue_stream_job_new (e->served.image, path, "stream", false, &e->served.job) == -1 ||
      glue_stream_job_start (e->served.job) == -1) {
    glue_stream_job_free (e->served.job);
    e->served.job = NULL;
    return -1;
  }
  return 0;
}

/* Open the image of the export of e (made first if it is missing and
 * template= is given).  Returns 0, or -1 after logging an error.  The
 * lock is not held: e is opening, which no one else touches.
 */
static int
fleet_open_image (struct fleet_export *e, const char *shown)
{
  /* A fleet's overlays each use little of their disk; a shared remote
   * base keeps 2 MiB of what it fetched, not 32: one server's memory
   * weighs more there than its base's traffic.
   */
  struct image_how how = {
    .env = &e->env, .small_l2_slices = true,
    .remote_keep = UINT64_C (2) << 20,
  };
  struct qcow2_io *io = NULL;
  char *named = NULL, *real = NULL;
  bool made = false, readonly;
  const char *readonly_why;
  struct stat st, made_st;
  int r = -1, err;

  if (asprintf (&named, "%s/%s", fleet.dir, e->name) == -1) {
    nbdkit_error ("export \"%s\": %s", shown, errstr (errno));
    return -1;
  }
  real = realpath (named, NULL);
  if (!real && errno == ENOENT && fleet.template) {
    if (!fleet_creatable (e->name)) {
      nbdkit_error ("export \"%s\": no such image in %s, and template= "
                    "makes only names of [A-Za-z0-9][A-Za-z0-9._-]*", shown,
                    fleet.dir);
      goto out;
    }
    if (fleet_create (shown, named, &io, &made_st) == -1)
      goto out;
    made = io != NULL;
    real = realpath (named, NULL);
  }
  if (!real) {
    nbdkit_error ("export \"%s\": %s%s", shown, errno == ENOENT
                  ? "no such image in " : errstr (errno),
                  errno == ENOENT ? fleet.dir : "");
    goto out;
  }
  /* A link may lead anywhere: only what is in the folder is served
   * (the file opened is the one checked, by its resolved name).
   */
  if (!glue_in_folder (real, fleet.dir)) {
    nbdkit_error ("export \"%s\": refused: it is a link leading out of "
                  "dir= (to %s)", shown, real);
    goto out;
  }
  if (stat (real, &st) == -1 || !S_ISREG (st.st_mode)) {
    nbdkit_error ("export \"%s\": refused: %s is not a regular file", shown,
                  real);
    goto out;
  }
  /* An idle image of ours may hold locks refusing this one (it is a
   * backing file of this one, written; or this one is its backing file,
   * asked for writing): tried quietly first, then with the idle ones
   * closed, whose locks must not refuse a client.
   */
  readonly_why = fleet_is_template (&st) ? "it is the template= of new "
    "exports: a write would change every overlay made of it" : NULL;
  e->env = fleet.env;
  how.checked = &st;
  how.readonly_why = readonly_why;
  if (fleet_idle_count () == 0 || made)
    e->served.image = image_open (real, io, &how, &readonly);
  else {
    e->env.error = e->env.hint = glue_debug;
    how.quiet = true;
    e->served.image = image_open (real, NULL, &how, &readonly);
    e->env.error = glue_env.error;
    e->env.hint = glue_env.hint;
    if (!e->served.image) {
      fleet_close_idle ();
      how.quiet = false;
      e->served.image = image_open (real, NULL, &how, &readonly);
    }
  }
  err = e->served.image ? 0 : errno;   /* image_open's own */
  io = NULL;
  if (err == EAGAIN)
    glue_hint ("it may be an export of this server that holds it: an "
               "image is not written while it is the backing file of "
               "another served");
  if (!e->served.image ||
      (made && qcow2_preallocate (e->served.image,
                                  glue.create.opts.preallocation) < 0) ||
      (glue.repair_leaks && glue_repair (e->served.image, real) == -1) ||
      (glue_stream.on && fleet_stream (e, real) == -1))
    goto out;
  e->path = real;
  real = NULL;
  e->dev = st.st_dev;
  e->ino = st.st_ino;
  r = 0;
 out:
  if (r == -1 && e->served.image) {
    qcow2_close (e->served.image);
    e->served.image = NULL;
  }
  if (r == -1 && made)
    fleet_unlink_ours (e->name, &made_st);
  if (io)
    io->ops->close (io);
  free (named);
  free (real);
  return r;
}

/* Whether the name of e still names the file e serves (not deleted,
 * not replaced).
 */
static bool
fleet_same_file (const struct fleet_export *e)
{
  struct stat st;

  return fstatat (fleet.dirfd, e->name, &st, 0) == 0 &&
    st.st_dev == e->dev && st.st_ino == e->ino;
}

/* A connection to the export name: its entry, the image opened if it
 * is not yet (it is then by this connection alone, others asking for
 * it waiting), or NULL (logged).
 */
static struct fleet_export *
fleet_open (const char *name, const char *shown)
  TSA_EXCLUDES (&fleet_lock)
{
  struct fleet_export *e;

  lock_acquire (&fleet_lock);
  for (;;) {
    e = fleet_find (name);
    if (e && e->state != EXPORT_OPEN) {
      lock_wait (&fleet_lock, &fleet_changed);
      continue;
    }
    if (e && !fleet_same_file (e)) {
      /* Its file is gone: its clients keep it, new ones do not. */
      e->stale = true;
      if (e->users == 0)
        fleet_close (e);
      continue;
    }
    if (e) {
      e->users++;
      lock_release (&fleet_lock);
      return e;
    }
    if (fleet.max_exports && fleet_count >= fleet.max_exports) {
      /* Room made by an idle one, if there is one. */
      for (e = fleet_exports; e; e = e->next)
        if (e->state == EXPORT_OPEN && e->users == 0)
          break;
      if (e) {
        fleet_close (e);
        continue;
      }
      lock_release (&fleet_lock);
      nbdkit_error ("export \"%s\": refused: max-exports=%" PRIu64 " images "
                    "are open already", shown, fleet.max_exports);
      return NULL;
    }
    break;
  }
  e = fleet_add (name);
  lock_release (&fleet_lock);
  if (!e)
    return NULL;
  if (fleet_open_image (e, shown) == -1) {
    lock_acquire (&fleet_lock);
    fleet_remove (e);
    lock_release (&fleet_lock);
    return NULL;
  }
  lock_acquire (&fleet_lock);
  e->state = EXPORT_OPEN;
  pthread_cond_broadcast (&fleet_changed);
  lock_release (&fleet_lock);
  return e;
}

/* A connection to e ended: its image closed if it was the last, now
 * or idle-close= seconds later.
 */
void
fleet_release (struct plugin_export *served)
  TSA_EXCLUDES (&fleet_lock)
{
  struct fleet_export *e = fleet_entry (served);

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  assert (e->users > 0);
  if (--e->users > 0)
    return;
  if (e->stale || !fleet_sweeper_running)
    fleet_close (e);
  else {
    clock_gettime (CLOCK_MONOTONIC, &e->idle_since);
    pthread_cond_signal (&fleet_idle);
  }
}





/* dir=: the folder, and the template (for the errors in it to be logged
 * at start rather than to a client).
 */
int
fleet_get_ready (void)
{
  struct qcow2_create_options opts = glue.create.opts;
  char *named = NULL;
  int r = 0;

  fleet.dirfd = open (fleet.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fleet.dirfd == -1) {
    nbdkit_error ("dir: %s: %s", fleet.dir, errstr (errno));
    return -1;
  }
  fleet.env = glue_env;
  fleet.env.identity = fleet_env_identity;
  fleet.env.open = fleet_env_open;
  fleet.layers = qcow2_layers_new (&fleet.env);
  if (!fleet.layers) {
    nbdkit_error ("dir: %s", errstr (errno));
    return -1;
  }
  fleet.env.layers = fleet.layers;
  if (glue_stream.on && (glue.engine.readonly || glue_server_readonly () ||
                          glue.engine.snapshot)) {
    nbdkit_error ("stream=true copies the backing chain into each image of "
                  "dir=, which is served read-only (%s)",
                  glue.engine.snapshot ? "snapshot="
                  : "nbdkit -r or readonly=true");
    return -1;
  }
  if (fleet.template && (glue.engine.readonly || glue_server_readonly ())) {
    nbdkit_error ("template= makes images to write: not with readonly=true "
                  "or nbdkit -r");
    return -1;
  }
  if (fleet.template) {
    opts.backing = fleet.template;
    /* As a backing file name: relative to the folder. */
    if (asprintf (&named, "%s/new", fleet.dir) == -1) {
      nbdkit_error ("dir: %s", errstr (errno));
      return -1;
    }
    if (fleet.template[0] == '/')
      fleet.template_path = strdup (fleet.template);
    else if (asprintf (&fleet.template_path, "%s/%s", fleet.dir,
                       fleet.template) == -1)
      fleet.template_path = NULL;
    if (!fleet.template_path) {
      nbdkit_error ("template: %s", errstr (errno));
      free (named);
      return -1;
    }
    r = image_create_options (named, &opts, glue.create.size);
    free (named);
    fleet_remove_stale ();
  }
  return r;
}

/* Every stream stopped where it is, once the clients are gone: before
 * the images close at unload.
 */
static void
fleet_stop_streams (void)
  TSA_EXCLUDES (&fleet_lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  for (struct fleet_export *e = fleet_exports; e; e = e->next) {
    glue_stream_job_free (e->served.job);
    e->served.job = NULL;
  }
}


void
fleet_load (void)
{
  /* idle-close= waits on the monotonic clock: a change of the time of
   * day must not close an image early or keep it open for long.
   */
  lock_cond_init (&fleet_changed);
  lock_cond_init (&fleet_idle);
  /* Read (by setting it) while no other thread may make a file. */
  fleet.umask = umask (022);
  umask (fleet.umask);
}

void
fleet_unload (void)
{
  fleet_close_all ();
  qcow2_layers_free (fleet.layers);
  if (fleet.dirfd >= 0)
    close (fleet.dirfd);
  free (fleet.dir);
  free (fleet.default_export);
  free (fleet.template);
  free (fleet.template_path);
  pthread_cond_destroy (&fleet_changed);
  pthread_cond_destroy (&fleet_idle);
}

/* Threads do not survive nbdkit's fork into the background. */
int
fleet_after_fork (void)
  TSA_EXCLUDES (&fleet_lock)
{
  int e;

  if (fleet.idle_close == 0)
    return 0;
  e = pthread_create (&fleet_sweeper, NULL, fleet_sweep, NULL);
  if (e) {
    nbdkit_error ("idle-close: starting a thread: %s", errstr (e));
    return -1;
  }
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  fleet_sweeper_running = true;
  return 0;
}

void
fleet_cleanup (void)
  TSA_EXCLUDES (&fleet_lock)
{
  bool running;

  lock_acquire (&fleet_lock);
  running = fleet_sweeper_running;
  fleet_stopping = true;
  pthread_cond_signal (&fleet_idle);
  lock_release (&fleet_lock);
  if (running) {
    pthread_join (fleet_sweeper, NULL);
    lock_acquire (&fleet_lock);
    fleet_sweeper_running = false;
    lock_release (&fleet_lock);
  }
  fleet_stop_streams ();
}

const char *
fleet_default_export (void)
{
  return fleet.default_export ? fleet.default_export : "";
}

struct plugin_export *
fleet_connect (void)
{
  const char *name = nbdkit_export_name ();
  const char *why;
  char shown[72];
  struct fleet_export *e;

  if (!name)
    return NULL;
  if (!*name && fleet.default_export)
    name = fleet.default_export;
  fleet_shown (name, shown);
  if (!*name) {
    nbdkit_error ("export \"\": refused: dir= serves images by their name "
                  "(nbdinfo --list lists them), and default-export= names "
                  "none");
    return NULL;
  }
  if ((why = fleet_name_refusal (name))) {
    nbdkit_error ("export \"%s\": refused: %s", shown, why);
    return NULL;
  }
  e = fleet_open (name, shown);
  return e ? &e->served : NULL;
}
