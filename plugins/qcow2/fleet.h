/* SPDX-License-Identifier: BSD-3-Clause */
/* What the files of dir= share.  From the top down, each calling only
 * those below it (then image.c, plugin.h):
 *
 *   fleet-control.c what the control socket sees of the table, and
 *                   does to it
 *   fleet.c         the table of open exports: open, release, the idle
 *                   sweeper; the keys, get_ready and the end
 *   fleet-open.c    an export's image opened, its file found beneath DIR
 *   fleet-list.c    the listing, and what an export's description says
 *   fleet-create.c  template=: new images made, half-made ones removed
 *   fleet-names.c   which names are exports, are made, and are shown
 */
#ifndef NBDKIT_QCOW2_FLEET_H
#define NBDKIT_QCOW2_FLEET_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "escape.h"
#include "fileio.h"
#include "lock.h"
#include "plugin.h"
#include "qcow2.h"

/* A name as messages show it, at most: 64 bytes of it escaped. */
#define FLEET_SHOWN_MAX ESCAPE_SIZE (64)

/* An open image, shared by the connections to its export. */
struct fleet_export {
  /* First: what a connection's handle points to (fleet_entry). */
  struct plugin_export served;
  struct fleet_export *next;
  char *name;                   /* the export name */
  char *path;                   /* DIR/NAME, found beneath DIR */
  /* With stream=true, what the description says of the image as it
   * was opened, while the job may still cut it loose.
   */
  char *info;
  /* The engine's environment of the image (quiet while a first try
   * may fail, see fleet_open_image).
   */
  struct qcow2_env env;
  /* Deleted (block-export-del): its image closed, found by no name,
   * freed when its last connection leaves.
   */
  enum { EXPORT_OPENING, EXPORT_OPEN, EXPORT_CLOSING, EXPORT_DELETED } state;
  /* Deleted or replaced in the folder since it was opened: served to
   * its clients and new ones until they have all left, then closed.
   */
  bool gone;
  dev_t dev;                    /* its file */
  ino_t ino;
  unsigned users;               /* connections, and a job's hold */
  struct timespec idle_since;   /* when users fell to 0 */
};

/* dir='s keys, and what get_ready makes of them: set before any
 * connection, then only read.
 */
struct fleet_keys {
  char *dir;                    /* dir= (resolved) */
  char *default_export;
  const char *key;              /* the first of the fleet's keys given */
  int dirfd;                    /* dir=, opened */
  /* How the images' files open: glue's options, beneath dir=.  The
   * environment of the images, and the backing layers they share.
   * Made at get_ready.
   */
  struct fileio_options files;
  struct qcow2_env env;
  struct qcow2_layers *layers;
};
extern struct fleet_keys fleet;

/* The keys the control socket may change while nbdkit runs
 * (nbdkit-fleet-set), under fleet_lock: template= (and its path, DIR/NAME
 * if relative), template-match=, idle-close= (seconds), max-exports=
 * (0: no bound), max-images=, min-free= (bytes).
 */
struct fleet_live {
  char *template;
  char *template_path;
  char *template_match;
  uint64_t idle_close;
  uint64_t max_exports;
  uint64_t max_images;
  uint64_t min_free;
};

/* A live key (a name of nbdkit's: idle-close, template...) parsed into
 * l: 0, or -1 after logging an error.
 */
extern int fleet_parse_live (struct fleet_live *l, const char *key,
                             const char *value);

/* The table of open images (fleet.c's), and the live keys. */
extern struct lock fleet_lock;
extern struct fleet_export *fleet_exports TSA_GUARDED_BY (&fleet_lock);
extern struct fleet_live fleet_live TSA_GUARDED_BY (&fleet_lock);

/* The entry whose served member a connection's handle is. */
static inline struct fleet_export *
fleet_entry (struct plugin_export *served)
{
  return (struct fleet_export *) served;
}

/* fleet.c: the table's entries.  The entry of the export name (not
 * deleted), or NULL.  A connection to the export name: its entry, the
 * image opened if it is not yet (it is then by this connection alone,
 * others asking for it waiting), or NULL (logged).  e's image closed
 * (the lock let go meanwhile, e closing), e left in the table.  e out
 * of the table, and freed (its image closed or never opened).
 */
extern struct fleet_export *fleet_find (const char *name)
  TSA_REQUIRES (&fleet_lock);
extern struct fleet_export *fleet_open (const char *name, const char *shown)
  TSA_EXCLUDES (&fleet_lock);
extern void fleet_close_image (struct fleet_export *e)
  TSA_REQUIRES (&fleet_lock);
extern void fleet_remove (struct fleet_export *e)
  TSA_REQUIRES (&fleet_lock);
/* e, its image closed, freed now if no connection holds it, else when
 * the last leaves (found by no name meanwhile).
 */
extern void fleet_drop (struct fleet_export *e)
  TSA_REQUIRES (&fleet_lock);

/* fleet-open.c */

/* The image of e opened (e->served.image, e->path...), its file found
 * beneath DIR or made; quiet: errors that closing idle images may
 * cure as debug messages.  Returns 0; or -1 after logging an error,
 * *again saying whether a try with the idle images closed may do.
 */
extern int fleet_open_image (struct fleet_export *e, const char *shown,
                             bool quiet, bool *again)
  TSA_EXCLUDES (&fleet_lock);
/* The engine's environment's: a file known by its device and inode,
 * and glue's open of it.
 */
extern char *fleet_env_identity (void *opaque, const char *path);
extern struct qcow2_io *fleet_env_open (void *opaque, const char *path,
                                        bool readonly, char **id);

/* fleet-list.c */

/* What an export's description says of its image; closed: the image
 * is not open (with stream=true, its stream is not running).
 */
extern char *fleet_info_text (const struct qcow2_image *img, bool closed);

/* fleet-create.c */

/* template=: the image of name (in dir=) made: see fleet-create.c. */
extern int fleet_create (const char *shown, const char *name,
                         struct qcow2_io **iop, struct stat *made);
/* Whether template= would make an image of name; whether template= is
 * given.
 */
extern bool fleet_can_create (const char *name)
  TSA_EXCLUDES (&fleet_lock);
extern bool fleet_has_template (void)
  TSA_EXCLUDES (&fleet_lock);
/* template: an image to make overlays of, there (at start, and when
 * the control socket changes it): 0 with *path its path, or -1 after
 * logging an error.
 */
extern int fleet_check_template (const char *template, char **path);
/* The name (in dir=) removed if it still names the file ours is. */
extern void fleet_unlink_ours (const char *name, const struct stat *ours);
/* Whether st is the template: served read-only. */
extern bool fleet_is_template (const struct stat *st)
  TSA_EXCLUDES (&fleet_lock);
/* Whether DIR has room for one more image under max-images=. */
extern bool fleet_images_room (void)
  TSA_EXCLUDES (&fleet_lock);
/* The files of images a crash left half made, removed. */
extern void fleet_remove_stale (void);

/* fleet-names.c */

/* Why dir= refuses an export name, or NULL. */
extern const char *fleet_name_refusal (const char *name);
/* Whether template= makes an image of name. */
extern bool fleet_creatable (const char *name);
/* name as a message shows it, in buf: bytes outside printable ASCII
 * escaped (a name is untrusted: it must not forge log lines, nor flood
 * them), cut at 64 bytes.
 */
extern const char *fleet_shown (const char *name, char buf[FLEET_SHOWN_MAX]);

#endif /* NBDKIT_QCOW2_FLEET_H */
