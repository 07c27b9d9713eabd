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

#include "cleanup.h"
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

/* max-images= and min-free=: bounds that a client's names cannot pass
 * by making images, however many it asks for.
 */
struct fleet_keys fleet = { .dirfd = -1 };
struct fleet_live fleet_live = {
  .idle_close = 5, .max_images = 1000, .min_free = UINT64_C (256) << 20,
};

struct fleet_export *
fleet_find (const char *name)
  TSA_REQUIRES (&fleet_lock)
{
  for (struct fleet_export *e = fleet_exports; e; e = e->next)
    if (e->state != EXPORT_DELETED && strcmp (e->name, name) == 0)
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

void
fleet_remove (struct fleet_export *e)
  TSA_REQUIRES (&fleet_lock)
{
  struct fleet_export **p = &fleet_exports;

  /* Its image closed or never opened, no connection left but for a
   * deleted export's (whose last one leaving frees it).
   */
  assert (!e->served.image && !e->served.job && !e->served.commit);
  assert (e->users == 0 || e->state == EXPORT_OPENING);
  while (*p != e)
    p = &(*p)->next;
  *p = e->next;
  if (e->state != EXPORT_DELETED)
    fleet_count--;
  free (e->name);
  free (e->path);
  free (e->info);
  free (e->served.job_id);
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
  fleet_close_image (e);
  fleet_remove (e);
}

void
fleet_drop (struct fleet_export *e)
  TSA_REQUIRES (&fleet_lock)
{
  assert (e->state == EXPORT_CLOSING && !e->served.image);
  if (e->users == 0)
    fleet_remove (e);
  else {
    /* No image: max-exports= no longer counts it. */
    e->state = EXPORT_DELETED;
    fleet_count--;
    pthread_cond_broadcast (&fleet_changed);
  }
}

void
fleet_close_image (struct fleet_export *e)
  TSA_REQUIRES (&fleet_lock)
{
  /* Open, or being closed by its one closer (block-export-del). */
  assert (e->state == EXPORT_OPEN || e->state == EXPORT_CLOSING);
  e->state = EXPORT_CLOSING;
  lock_release (&fleet_lock);
  glue_stream_job_free (e->served.job);
  e->served.job = NULL;
  qcow2_commit_free (e->served.commit);
  e->served.commit = NULL;
  image_close (e->served.image, e->path);
  e->served.image = NULL;
  lock_acquire (&fleet_lock);
}

/* At unload.  nbdkit, quitting, does not close the connections still
 * open (their threads have ended, no .close called): their users are
 * gone.
 */
static void
fleet_close_all (void)
  TSA_EXCLUDES (&fleet_lock)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  while (fleet_exports) {
    struct fleet_export *e = fleet_exports;

    e->users = 0;
    if (e->state == EXPORT_DELETED)
      fleet_remove (e);
    else
      fleet_close (e);
  }
}

/* dir='s keys: dir= resolved (what is in it is what it holds once
 * every link is followed); the others go only with dir=.
 */
/* The keys that go only with dir=. */
static const char *const fleet_keys_only[] = {
  "default-export", "template", "template-match", "idle-close",
  "max-exports", "max-images", "min-free", NULL
};

/* A live key's value parsed into l (one of fleet_live's; a string
 * key's old value freed).  Returns 0, or -1 after logging an error.
 */
int
fleet_parse_live (struct fleet_live *l, const char *key, const char *value)
{
  char **dest = strcmp (key, "template") == 0 ? &l->template
    : strcmp (key, "template-match") == 0 ? &l->template_match : NULL;

  if (strcmp (key, "idle-close") == 0)
    return glue_parse_number (key, value, "seconds", 86400, &l->idle_close);
  if (strcmp (key, "max-exports") == 0)       /* 0: no bound */
    return glue_parse_range (key, value, "images", 0, 1000000,
                             &l->max_exports);
  if (strcmp (key, "max-images") == 0)
    return glue_parse_range (key, value, "images", 1, 10000000,
                             &l->max_images);
  if (strcmp (key, "min-free") == 0)
    return glue_parse_size (key, value, true, &l->min_free);
  assert (dest);
  free (*dest);
  *dest = strdup (value);
  return *dest ? 0 : -1;
}

int
fleet_config (const char *key, const char *value)
  TSA_EXCLUDES (&fleet_lock)
{
  if (strcmp (key, "dir") == 0)
    return glue_parse_folder (key, value, &fleet.dir);
  for (size_t i = 0; !fleet.key && fleet_keys_only[i]; i++)
    if (strcmp (key, fleet_keys_only[i]) == 0)
      fleet.key = fleet_keys_only[i];
  if (strcmp (key, "default-export") == 0) {
    free (fleet.default_export);
    fleet.default_export = strdup (value);
    return fleet.default_export ? 0 : -1;
  }
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  return fleet_parse_live (&fleet_live, key, value);
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
  TSA_EXCLUDES (&fleet_lock)
{
  bool template, match;
  const char *why;

  lock_acquire (&fleet_lock);
  template = fleet_live.template != NULL;
  match = fleet_live.template_match != NULL;
  lock_release (&fleet_lock);
  if (glue.create.first_key && !template) {
    nbdkit_error ("%s= describes an image to make: with dir=, it needs "
                  "template=", glue.create.first_key);
    return -1;
  }
  if (match && !template) {
    nbdkit_error ("template-match= limits the names template= makes "
                  "images of: it needs template=");
    return -1;
  }
  if (fleet.default_export &&
      (why = fleet_name_refusal (fleet.default_export))) {
    char shown[FLEET_SHOWN_MAX];

    nbdkit_error ("default-export=%s: refused: %s",
                  fleet_shown (fleet.default_export, shown), why);
    return -1;
  }
  return 0;
}

/* Whether e holds locks it has no client for: an open image no client
 * uses, or one being closed (its locks go once it is).
 */
static bool
fleet_holds_idle (const struct fleet_export *e)
  TSA_REQUIRES (&fleet_lock)
{
  return (e->state == EXPORT_OPEN && e->users == 0) ||
    e->state == EXPORT_CLOSING;
}

static unsigned
fleet_idle_count (void)
  TSA_EXCLUDES (&fleet_lock)
{
  unsigned n = 0;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  for (struct fleet_export *e = fleet_exports; e; e = e->next)
    n += fleet_holds_idle (e);
  return n;
}

/* Every idle image closed, and those closing waited for. */
static void
fleet_close_idle (void)
  TSA_EXCLUDES (&fleet_lock)
{
  struct fleet_export *e;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  do {
    for (e = fleet_exports; e; e = e->next)
      if (fleet_holds_idle (e))
        break;
    if (e && e->state == EXPORT_CLOSING)
      lock_wait (&fleet_lock, &fleet_changed);
    else if (e)
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
      due.tv_sec += fleet_live.idle_close;
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

/* What has become of e's name: 0 if it still names the file e serves,
 * else ENOENT (deleted) or EEXIST (another file now).
 */
static int
fleet_name_fate (const struct fleet_export *e)
{
  struct stat st;

  if (fileio_stat_with (e->path, &fleet.files, &st) == -1)
    return errno == ENOENT ? ENOENT : EEXIST;
  return st.st_dev == e->dev && st.st_ino == e->ino ? 0 : EEXIST;
}

/* e's name no longer names its file (fate, as fleet_name_fate says):
 * an idle image is closed (the name's file now is opened instead);
 * one in use goes on, for new clients too, until its last client
 * leaves, lest the name be remade (by template=) under a VM writing to
 * it.  Logged once.  Returns whether e was closed.
 */
static bool
fleet_name_lost (struct fleet_export *e, int fate, const char *shown)
  TSA_REQUIRES (&fleet_lock)
{
  const char *what = fate == ENOENT ? "deleted" : "replaced by another";

  if (e->users == 0) {
    nbdkit_debug ("export \"%s\": its file was %s while it was open, "
                  "idle: closed", shown, what);
    fleet_close (e);
    return true;
  }
  if (!e->gone)
    glue_noticef (e->path, "export \"%s\": its file was %s while %u "
                  "client(s) used it: they and new clients keep the open "
                  "image until the last leaves", shown, what, e->users);
  e->gone = true;
  return false;
}

/* Room under max-exports= for one more image: made by closing an idle
 * one if need be.  Returns 0; -1 if there is none (logged); 1 if the
 * table changed meanwhile (to be looked at again).
 */
static int
fleet_make_room (const char *shown)
  TSA_REQUIRES (&fleet_lock)
{
  struct fleet_export *e;

  if (!fleet_live.max_exports || fleet_count < fleet_live.max_exports)
    return 0;
  for (e = fleet_exports; e; e = e->next)
    if (e->state == EXPORT_OPEN && e->users == 0)
      break;
  if (e) {
    fleet_close (e);
    return 1;
  }
  nbdkit_error ("export \"%s\": refused: max-exports=%" PRIu64 " images "
                "are open already", shown, fleet_live.max_exports);
  return -1;
}

/* The image of the new entry e opened: quietly first if idle images
 * or those closing may hold locks refusing it (a backing file of it,
 * written; or it is theirs, asked for writing), then with them closed,
 * whose locks must not refuse a client.  Returns 0, or -1 after
 * logging an error.
 */
static int
fleet_open_entry (struct fleet_export *e, const char *shown)
  TSA_EXCLUDES (&fleet_lock)
{
  bool again;

  if (fleet_open_image (e, shown, fleet_idle_count () > 0, &again) == 0)
    return 0;
  if (!again)
    return -1;
  fleet_close_idle ();
  return fleet_open_image (e, shown, false, &again);
}

struct fleet_export *
fleet_open (const char *name, const char *shown)
  TSA_EXCLUDES (&fleet_lock)
{
  struct fleet_export *e;
  int r;

  lock_acquire (&fleet_lock);
  for (;;) {
    e = fleet_find (name);
    if (e && e->state != EXPORT_OPEN) {
      lock_wait (&fleet_lock, &fleet_changed);
      continue;
    }
    if (e && !e->gone && (r = fleet_name_fate (e)) != 0 &&
        fleet_name_lost (e, r, shown))
      continue;
    if (e) {
      e->users++;
      lock_release (&fleet_lock);
      return e;
    }
    r = fleet_make_room (shown);
    if (r == -1) {
      lock_release (&fleet_lock);
      return NULL;
    }
    if (r == 0)
      break;
  }
  e = fleet_add (name);
  lock_release (&fleet_lock);
  if (!e)
    return NULL;
  if (fleet_open_entry (e, shown) == -1) {
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
 * (its file gone, or no sweeper) or idle-close= seconds later.
 */
void
fleet_release (struct plugin_export *served)
  TSA_EXCLUDES (&fleet_lock)
{
  struct fleet_export *e = fleet_entry (served);
  char shown[FLEET_SHOWN_MAX];

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&fleet_lock);
  assert (e->users > 0);
  /* Closing (deleted): its closer frees it. */
  if (--e->users > 0 || e->state == EXPORT_CLOSING)
    return;
  if (e->state == EXPORT_DELETED)
    fleet_remove (e);
  else if (e->gone) {
    glue_noticef (e->path, "export \"%s\": closed: its file was deleted or "
                  "replaced while it was open, and its last client left",
                  fleet_shown (e->name, shown));
    fleet_close (e);
  }
  else if (!fleet_sweeper_running || fleet_live.idle_close == 0)
    fleet_close (e);
  else {
    clock_gettime (CLOCK_MONOTONIC, &e->idle_since);
    pthread_cond_signal (&fleet_idle);
  }
}

int
fleet_check_template (const char *template, char **path)
{
  struct qcow2_create_options opts = glue.create.opts;
  struct stat st;
  char *named;
  int r;

  if (template[0] == '/')
    *path = strdup (template);
  else if (asprintf (path, "%s/%s", fleet.dir, template) == -1)
    *path = NULL;
  if (!*path) {
    nbdkit_error ("template: %s", errstr (errno));
    return -1;
  }
  if (fileio_stat_with (*path, &fleet.files, &st) == -1) {
    int e = errno;

    nbdkit_error ("template=%s: %s", template,
                  e == ENOENT ? "no such file" : e == EXDEV || e == ELOOP
                  ? "a link leading out of dir=" : errstr (e));
    free (*path);
    return -1;
  }
  if (!S_ISREG (st.st_mode)) {
    nbdkit_error ("template=%s: not a regular file", template);
    free (*path);
    return -1;
  }
  /* As a backing file name: relative to the folder. */
  if (asprintf (&named, "%s/new", fleet.dir) == -1) {
    nbdkit_error ("template: %s", errstr (errno));
    free (*path);
    return -1;
  }
  opts.backing = template;
  r = image_create_options (&fleet.env, named, &opts, glue.create.size);
  free (named);
  if (r == -1)
    free (*path);
  return r;
}

/* template= at start: checked, its path kept. */
static int
fleet_ready_template (void)
  TSA_EXCLUDES (&fleet_lock)
{
  CLEANUP_FREE char *template = NULL;
  char *path;

  lock_acquire (&fleet_lock);
  template = fleet_live.template ? strdup (fleet_live.template) : NULL;
  lock_release (&fleet_lock);
  if (!template)
    return 0;
  if (glue.engine.readonly || glue_server_readonly ()) {
    nbdkit_error ("template= makes images to write: not with readonly=true "
                  "or nbdkit -r");
    return -1;
  }
  if (fleet_check_template (template, &path) == -1)
    return -1;
  lock_acquire (&fleet_lock);
  fleet_live.template_path = path;
  lock_release (&fleet_lock);
  fleet_remove_stale ();
  return 0;
}

/* default-export=: an image there, or one template= can make. */
static int
fleet_check_default (void)
{
  char shown[FLEET_SHOWN_MAX], *named;
  struct stat st;
  int r, e;

  if (asprintf (&named, "%s/%s", fleet.dir, fleet.default_export) == -1) {
    nbdkit_error ("default-export: %s", errstr (errno));
    return -1;
  }
  r = fileio_stat_with (named, &fleet.files, &st);
  e = errno;
  free (named);
  if (r == 0 || (e == ENOENT && fleet_can_create (fleet.default_export)))
    return 0;
  nbdkit_error ("default-export=%s: %s", fleet_shown (fleet.default_export,
                                                      shown),
                e == ENOENT ? "no such image in dir=, and template= would "
                "not make it" : e == EXDEV || e == ELOOP
                ? "a link leading out of dir=" : errstr (e));
  return -1;
}

/* dir=: the folder, and the template (for the errors in it to be logged
 * at start rather than to a client).
 */
int
fleet_get_ready (void)
{
  fleet.dirfd = open (fleet.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fleet.dirfd == -1) {
    nbdkit_error ("dir: %s: %s", fleet.dir, errstr (errno));
    return -1;
  }
  fleet.files = glue_file_options;
  fleet.files.beneath = fleet.dir;
  fleet.files.beneath_fd = fleet.dirfd;
  fleet.env = glue_env;
  fleet.env.opaque = &fleet.files;
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
  /* Snapshots a crash interrupted, ended before any image opens. */
  freeze_recover (fleet.dirfd, fleet.dir, NULL);
  if (fleet_ready_template () == -1)
    return -1;
  if (fleet.default_export && fleet_check_default () == -1)
    return -1;
  return 0;
}

/* Every job stopped where it is, once the clients are gone: before
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
    qcow2_commit_free (e->served.commit);
    e->served.commit = NULL;
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
  lock_acquire (&fleet_lock);
  free (fleet_live.template);
  free (fleet_live.template_match);
  free (fleet_live.template_path);
  lock_release (&fleet_lock);
  pthread_cond_destroy (&fleet_changed);
  pthread_cond_destroy (&fleet_idle);
}

/* Threads do not survive nbdkit's fork into the background. */
int
fleet_after_fork (void)
  TSA_EXCLUDES (&fleet_lock)
{
  int e;

  /* Started with idle-close=0 too: the control socket may change it. */
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
  char shown[FLEET_SHOWN_MAX];
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
