/* SPDX-License-Identifier: BSD-3-Clause */
/* What the plugin's files share.  From the top down, each calling only
 * those below it:
 *
 *   qcow2.c  nbdkit's callbacks, the keys and the help, the dispatch
 *            to one image (file=) or to the fleet (dir=)
 *   fleet.c  dir=: the table of open exports, their open and release,
 *            the idle sweeper, template=, the listing and descriptions
 *   exports.c the exports the control socket's commands work on
 *   image.c  one image opened, or made first (create=, and the images
 *            template= makes): told by its caller what differs between
 *            file= and dir=, it knows nothing of the fleet
 *   freeze.c export-snapshot: an export's data frozen under a new name
 *   gate.c   the gate each client request passes (a snapshot or a
 *            deletion holds them off)
 */
#ifndef NBDKIT_QCOW2_PLUGIN_H
#define NBDKIT_QCOW2_PLUGIN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "qcow2.h"

struct fileio_options;
struct freeze_spot;
struct glue_stream_job;
struct json_object;
struct nbdkit_exports;

/* What a connection serves: an image, and its stream=true job (NULL:
 * none).  file=: one, held from get_ready to the end; dir=: the first
 * member of an entry of the fleet's table.
 */
struct plugin_export {
  struct qcow2_image *image;
  struct glue_stream_job *job;  /* atomic: the control socket may make it */
  /* Requests in flight (atomic): the stream job yields to them; the
   * gate (atomic, enum gate_state) lets them in (gate.c).
   */
  unsigned inflight;
  int gate;
  /* The control socket's (its thread alone): the job's id as given
   * (NULL: the export's name), whether its job holds the export open,
   * and whether its end was told (an event).
   */
  char *job_id;
  bool job_held;
  bool job_told;
  /* A commit job (block-commit): the control socket's too, freed by
   * whoever closes the image (before it).
   */
  struct qcow2_commit *commit;
  bool commit_ready_told;
};

/* What the control socket sees of an open export. */
struct plugin_view {
  const char *name;             /* the export's (file=: the file's base) */
  const char *path;             /* its file */
  struct plugin_export *served;
  unsigned clients;             /* connections */
  bool readonly;
};
typedef int (*plugin_view_fn) (const struct plugin_view *v, void *opaque);

/* gate.c: every request passes the export's gate. */
enum gate_state {
  GATE_OPEN,                    /* requests go in */
  GATE_HELD,                    /* they wait: the image is being changed */
  GATE_CLOSED,                  /* they fail: the export was deleted */
};
/* A request begins: true, or false (errno ESHUTDOWN) if the export is
 * closed; waits while it is held.
 */
extern bool gate_enter (struct plugin_export *e);
extern void gate_leave (struct plugin_export *e);
/* Hold (GATE_HELD) or close (GATE_CLOSED) the gate, and wait until no
 * request is in flight: then none begins until gate_open.
 */
extern void gate_shut (struct plugin_export *e, enum gate_state how);
extern void gate_open (struct plugin_export *e);

/* image.c */

/* How image_open opens an image: what its caller's mode decides. */
struct image_how {
  const struct qcow2_env *env;
  const struct fileio_options *files;  /* how the file opens (NULL: glue's) */
  /* Errors as debug messages only: a first try that may fail. */
  bool quiet;
  /* Remedies for a file that is not an image (file=: the user named it). */
  bool hints;
  /* Many small images, each using little of its disk (dir=). */
  bool small_l2_slices;
  uint64_t remote_keep;         /* a remote layer's keep; 0: the default */
  /* The file must be this one (opened by the name it was checked by). */
  const struct stat *checked;
  const char *readonly_why;     /* served read-only for this, or NULL */
};

/* Open the image at path (through io if it was just made), read-write
 * where the file and the user allow it: the image, *readonly saying
 * how it is served, or NULL with errno set (logged).
 */
extern struct qcow2_image *image_open (const char *path, struct qcow2_io *io,
                                       const struct image_how *how,
                                       bool *readonly);
/* Close img (served as path): its stream job must be freed first. */
extern void image_close (struct qcow2_image *img, const char *path);

/* What making an image did to the file system, for undoing it. */
enum image_made { MADE_NOTHING, MADE_NEW_FILE, MADE_IN_EMPTY_FILE };
/* fileio_create, and the error logged if it fails. */
extern struct qcow2_io *image_create_file (const char *path,
                                           enum image_made *made);
/* The options of an image to make at path, its backing file (if any)
 * probed (env opening it), checked.  Returns 0, or -1 after logging an
 * error.
 */
extern int image_create_options (const struct qcow2_env *env,
                                 const char *path,
                                 struct qcow2_create_options *opts,
                                 int64_t size);

/* file=: its keys (the table's functions), whether file= was given,
 * the first other key given that only file= takes (or NULL), their
 * checks, the image opened (or made) at get_ready, closed at unload.
 */
extern int image_config_file (const char *key, const char *value);
extern int image_config_data_file (const char *key, const char *value);
extern int image_config_backing (const char *key, const char *value);
extern int image_config_create (const char *key, const char *value);
extern bool image_on (void);
extern const char *image_key_given (void);
extern int image_config_complete (void);
extern int image_get_ready (void);
extern void image_unload (void);
/* After the fork (its stream job starts), before unload (stopped). */
extern int image_after_fork (void);
extern void image_cleanup (void);
/* A connection to it (NULL, logged: deleted), and its end. */
extern struct plugin_export *image_connect (void);
extern void image_release (void);
/* For the control socket, as fleet_each, fleet_hold and fleet_delete
 * (a hold needs no release: the image is open to the end).
 */
extern int image_each (plugin_view_fn fn, void *opaque);
extern struct plugin_export *image_hold (const char *name);
extern int image_delete (const char *name, bool hard, unsigned *clients);
/* As fleet_freeze_spot (frozen: a name in the image's folder, or a
 * path there), and the image opened again.
 */
extern int image_freeze_spot (const char *frozen, struct freeze_spot *f,
                              const char **why);
extern int image_reopen (struct plugin_export *served);

/* exports.c: the control socket's commands' exports, in either mode
 * (fleet_each and image_each, and so on: see them).
 */
extern int exports_each (plugin_view_fn fn, void *opaque);
extern struct plugin_export *exports_hold (const char *name);
extern void exports_unhold (struct plugin_export *served);
extern int exports_delete (const char *name, bool hard, unsigned *clients);
extern int exports_freeze_spot (struct plugin_export *served,
                                const char *frozen, struct freeze_spot *f,
                                const char **why);

/* control-*.c: the control socket's commands, registered at load. */
extern void control_jobs_register (void);
extern void control_commit_register (void);
extern void control_snapshot_register (void);
extern void control_fleet_register (void);

/* control-jobinfo.c, for control-jobs.c and control-commit.c: a job
 * as QEMU's BlockJobInfo says it (with events, as its events' data).
 */
struct job_info {
  const char *type, *id, *status;
  uint64_t len, offset, speed;
  bool busy, paused, ready;
};
extern struct json_object *jobs_info_object (const struct job_info *j,
                                             bool events);

/* control-commit.c, for control-jobs.c: a commit job in the listing
 * of jobs (QEMU's BlockJobInfo), one tick's look at it (true if the
 * export has one; *ended the export whose job failed, to release), and
 * what block-job-* do to it (what: an enum glue_stream_do).
 */
extern struct json_object *commit_query (struct plugin_export *served,
                                         const char *id);
extern bool commit_poll_one (const struct plugin_view *v,
                             struct plugin_export **ended);
extern int commit_control (struct plugin_export *served, const char *id,
                           int what, uint64_t rate);

/* freeze.c: export-snapshot, in both modes. */
struct freeze_spot {
  const char *folder;           /* the export's file's folder */
  int dirfd;                    /* open on it */
  const char *name;             /* the export's file, in folder */
  const char *frozen;           /* what freezes its data, in folder */
  const struct fileio_options *files;
  const struct qcow2_env *env;
  struct plugin_export *served;
  /* name opened again into served->image (the overlay now), as the
   * mode opens it: 0, or -1 after logging an error.
   */
  int (*reopen) (struct plugin_export *served);
};
/* The snapshot made (see freeze.c): 0 with *paused_ns how long clients'
 * requests were held off; or -1 with *why (malloc'd) saying why.
 */
extern int freeze_export (const struct freeze_spot *f, uint64_t *paused_ns,
                          char **why);
/* The journals of snapshots a crash interrupted, in the folder (only
 * those of the image named only, if not NULL): each undone or
 * finished.
 */
extern void freeze_recover (int dirfd, const char *folder,
                            const char *only);

/* fleet.c */

/* The control socket's: fn on each open export, under the table's lock
 * (fn must not block), until fn returns non-zero (returned).  An
 * export held open by a job (fleet_hold: opened first if it is not,
 * logged if it cannot be), released with fleet_unhold.  An export's
 * image closed and its name free again (fleet_delete: hard, though
 * clients are connected; their requests then fail): 0, or -1 with
 * errno ENOENT (not open) or EBUSY (clients, not hard); *clients how
 * many it had.
 */
extern int fleet_each (plugin_view_fn fn, void *opaque);
extern struct plugin_export *fleet_hold (const char *name);
extern void fleet_unhold (struct plugin_export *served);
extern int fleet_delete (const char *name, bool hard, unsigned *clients);
/* export-snapshot's: where the export held (fleet_hold) lies, with
 * frozen the name its data freezes under (checked: an export name,
 * under max-images=; NULL: none, for block-commit), into *f (its
 * strings live as long as the export).  0, or -1 with *why.  And its
 * image opened again.  Whether an image in DIR other than the export
 * of self stands on the file base (looked for in each one's header):
 * its name then in who.
 */
extern int fleet_freeze_spot (struct plugin_export *served,
                              const char *frozen, struct freeze_spot *f,
                              const char **why);
extern int fleet_reopen (struct plugin_export *served);
extern bool fleet_backed_by (const struct stat *base, const char *self,
                             char *who, size_t n);
extern bool fleet_base_is_template (const struct stat *st);
/* A key changed while the fleet runs (template, template-match,
 * idle-close, max-exports, max-images, min-free, stream-rate; "" for
 * none, the string keys): checked as at start, logged.  Returns 0, or
 * -1 after logging an error.  And what they are (fleet_get: its
 * strings malloc'd, template_path left NULL).
 */
struct fleet_live;
extern int fleet_set (const char *key, const char *value);
extern void fleet_get (struct fleet_live *live);

extern void fleet_load (void);
extern void fleet_unload (void);
extern int fleet_config (const char *key, const char *value);
/* dir= was given; the first other key of the fleet given (or NULL). */
extern bool fleet_on (void);
extern const char *fleet_key_given (void);
extern int fleet_config_complete (void);
extern int fleet_get_ready (void);
extern int fleet_after_fork (void);
extern void fleet_cleanup (void);
extern int fleet_list (struct nbdkit_exports *exports);
extern const char *fleet_default_export (void);
/* A connection to the export it asked for, or NULL (logged). */
extern struct plugin_export *fleet_connect (void);
extern void fleet_release (struct plugin_export *served);
/* The export's description, interned for nbdkit (or NULL). */
extern const char *fleet_description (struct plugin_export *served);

#endif /* NBDKIT_QCOW2_PLUGIN_H */
