/* SPDX-License-Identifier: BSD-3-Clause */
/* What the qcow2 filter's files share, a section each.
 * From the top down, each calling only those below it (as
 * tests/layering-rim.py checks):
 *
 *   qcow2.c    nbdkit's callbacks, answered from the engine
 *   start.c    the image opened once: checked before the fork where
 *              it can be, opened at after_fork
 *   create.c   create=true: an image made in the plugin's export
 *   config.c   the keys, and where relative backing names are
 *   overlay.c  the overlay mode (qcow2-overlay=FILE): its keys, FILE
 *              opened or made
 *   record.c   what FILE records of the disk below it, and its checks
 *   below.c    the plugin below: its identity, its export as storage
 */
#ifndef QCOW2_FILTER_H
#define QCOW2_FILTER_H

#include <stdbool.h>
#include <stdint.h>

#include <nbdkit-filter.h>

#include "qcow2.h"

/* start.c: the image, opened once for every connection. */

/* At get_ready, before nbdkit forks: what can be refused of the image
 * without the plugin is refused then (a local file nbdkit's file plugin
 * serves alone, the overlay's FILE).  Returns 0, or -1 after logging an
 * error.
 */
extern int start_get_ready (void);
/* At after_fork: opens the plugin's context and the image in it (or
 * the overlay), as *image.  Returns 0, or -1 after logging an error,
 * heard where nbdkit was started.
 */
extern int start_open (nbdkit_backend *backend, struct qcow2_image **image);

/* create.c: create=true. */

/* Checks whether create=true may make an image in the export, read
 * through scan (whose status answers block status), called name in
 * messages.  Returns 0, or -1 after logging an error.
 */
extern int create_check (struct qcow2_io *scan, const char *name,
                         bool readonly);
/* Makes a new image in io, the plugin's export (size bytes), checked
 * first.  Returns 0, or -1 after logging an error.
 */
extern int create_make (struct qcow2_io *io, const char *name, int64_t size,
                        bool readonly);
/* For an export (read through io) that holds no image: a hint naming
 * create=true if it starts with zeros.
 */
extern void create_hint_empty (struct qcow2_io *io, const char *name);

/* config.c: the keys. */

/* create=true: format the plugin's export (if empty) at open. */
extern bool config_create;
/* --help's list of the filter's keys. */
extern const char config_help[];
extern void config_load (void);
extern void config_unload (void);
/* Takes a key: the filter's, the glue's or the overlay's (returns 1),
 * or the plugin's, noted (below_config) for it to be passed on
 * (returns 0).  Returns -1 after logging an error.
 */
extern int config_key (const char *key, const char *value);
/* After the last key.  Returns 0, or -1 after logging an error. */
extern int config_complete (void);
/* The name the engine knows the image by (*name): file (the local file
 * the plugin serves as the image, or NULL), else the plugin and its
 * keys; and where relative backing file names are, there the names of
 * backing= resolved: *names_dir, for the engine's names_dir (NULL: the
 * image's folder), malloc'd.  Returns 0, or -1 after logging an error.
 */
extern int config_names (const char *file, const char **name,
                         char **names_dir);

/* overlay.c: the overlay mode, qcow2-overlay=FILE. */

/* Takes a key of the overlay.  Returns 1 if done, 0 if not the
 * overlay's, -1 on error (logged).
 */
extern int overlay_config (const char *key, const char *value);
/* Called after the last key; create: create=true was given; chain:
 * backing= was.  Returns 0, or -1 after logging an error.
 */
extern int overlay_config_complete (bool create, bool chain);
extern bool overlay_active (void);
/* Before nbdkit forks (get_ready): what can be checked of FILE
 * without the plugin's disk (it is ours, and records this plugin and
 * the stack below), so that a refusal reaches the terminal and
 * nbdkit's exit status.  Returns 0, or -1 after logging an error.
 */
extern int overlay_get_ready (void);
/* Whether FILE is served alone, the plugin below unused: a FILE that
 * qcow2-overlay-stream=true (given again) has detached already.
 */
extern bool overlay_standalone (void);
/* Opens FILE (made if missing) as *image over the plugin's context
 * (below_open: read-only), whose disk is size bytes (-1: standalone,
 * the plugin not opened).  Returns 0, or -1 after logging an error.
 */
extern int overlay_open (int64_t size, struct qcow2_image **image);
/* Whether NBD cache requests are taken (in an overlay): they fill
 * FILE with qcow2-overlay-on-cache= (by default, with
 * qcow2-overlay-on-read=), else do nothing.
 */
extern int overlay_can_cache (void);
/* Whether a cache request, now, fills FILE. */
extern bool overlay_fills_cache (void);
/* Whether a read, now, is copied into FILE first: with
 * qcow2-overlay-on-read=/PATH, while PATH exists (with =true, the
 * engine copies every read itself).
 */
extern bool overlay_fills_reads (void);
extern void overlay_unload (void);

#define OVERLAY_CONFIG_HELP \
  "qcow2-overlay=<FILE>            Serve the plugin's disk with every change\n" \
  "                                kept in the qcow2 image FILE (made if\n" \
  "                                missing); the plugin is only read.\n" \
  "qcow2-overlay-backing=<NAME>    Record NAME (raw) as FILE's backing file.\n" \
  "qcow2-overlay-on-read=true|/PATH  Copy what is read into FILE (/PATH:\n" \
  "                                while PATH exists).\n" \
  "qcow2-overlay-on-cache=true|false  Cache requests fill FILE (default:\n" \
  "                                as qcow2-overlay-on-read=).\n" \
  "qcow2-overlay-force=true        Continue a FILE made over another disk.\n" \
  "qcow2-overlay-stream=true       Copy the whole disk into FILE while\n" \
  "                                serving it, then drop FILE's backing name.\n" \
  "qcow2-overlay-stream-rate=<SIZE>  At most this many bytes a second.\n" \
  "qcow2-overlay-stream-detach=false  Copy, but keep FILE's backing name.\n"


/* record.c: what FILE records of the disk below it. */

/* What an overlay is given, for the checks of its FILE. */
struct record_given {
  const char *file;             /* qcow2-overlay=, absolute */
  const char *backing;          /* qcow2-overlay-backing=, or NULL */
  const char *own_name;         /* record_name's, of this disk */
  bool force;                   /* qcow2-overlay-force=true */
};
/* The backing file name a FILE made without qcow2-overlay-backing=
 * records: a json: name of a driver QEMU does not have (so that QEMU
 * refuses FILE rather than read it as a whole disk), holding plugin
 * (below_identity) and stack (below_stack).  NULL on error (logged).
 */
extern char *record_name (const char *plugin, const char *stack);
/* Checks what FILE, open as img, records.  Returns 0 if it names this
 * disk (or qcow2-overlay-force=true serves it anyway, with a notice), 1
 * if it names none and qcow2-overlay-stream=true is given (streamed and
 * detached already: served alone), or -1 after logging an error.
 */
extern int record_check (struct qcow2_image *img,
                         const struct record_given *g);
/* Checks that FILE (open as img) holds a disk of size bytes, as the
 * plugin's.  Returns 0, or -1 after logging an error with the qemu-img
 * resize that makes it so.
 */
extern int record_check_size (struct qcow2_image *img, const char *file,
                              int64_t size);
/* Whether FILE is the file the plugin serves (logged). */
extern bool record_is_below (const char *file);
/* Whether a backing file name (relative: to FILE's folder), if a local
 * file, is another file than the one the plugin serves.
 */
extern bool record_other_file (const char *file, const char *name);
/* Logs that FILE is not a qcow2 image. */
extern void record_not_qcow2 (const char *file);

/* below.c: the plugin below (the files above call it; it calls none
 * of them).
 */

/* Notes a key given to the filter if it says what the plugin serves
 * (file=, url=, ...).  Returns 0, or -1 after logging an error.
 */
extern int below_config (const char *key, const char *value);
/* After the last key, learns the plugin's name and what it serves (the
 * qcow2 plugin refused).  Returns 0, or -1 after logging an error.
 */
extern int below_config_complete (void);
/* nbdkit's thread model for the plugin: whether its calls take turns. */
extern bool below_get_ready (int thread_model);
/* Opens the context into the plugin, shared by all connections (held
 * to below_cleanup), and prepares it: *size, its export's size.
 * Returns 0, or -1 on error (logged).
 */
extern int below_open (nbdkit_backend *backend, bool readonly,
                       int64_t *size);
/* The plugin's can_write: 1, 0, or -1 on error (logged). */
extern int below_can_write (void);

/* Returns the plugin's export (size bytes) as a qcow2_io, which the engine
 * owns, or NULL on error (logged).  Flags: NEXTIO_READONLY, never
 * written; NEXTIO_EXTENTS, its hole op answers from the plugin's extents.
 */
#define NEXTIO_READONLY 1u
#define NEXTIO_EXTENTS 2u
extern struct qcow2_io *below_nextio_new (int64_t size, unsigned flags);

/* Takes QEMU's locks on the local file nbdkit's file plugin serves, if
 * it serves one, held until below_cleanup.  Returns 0, or -1 after
 * logging an error.
 */
extern int below_lock_file (bool readonly);
/* Closes the context into the plugin, and the file locked. */
extern void below_cleanup (void);

/* What the plugin below is, as an overlay records it: its name and
 * the keys that say what it serves, file= as an absolute path ("file
 * file=/srv/a.raw", "curl url=https://h/a.raw", "memory").  Set at
 * config_complete.
 */
extern const char *below_identity (void);
/* What else makes the disk below, recorded with the identity: the
 * filters between the qcow2 filter and the plugin and the keys passed
 * on but the naming ones and credentials ("--filter=offset offset=1M
 * range=2M"; for a plugin not among those whose naming keys name its
 * disk, its keys: "script=/x.sh"), or "" when the plugin's naming keys
 * say it all.  Set at config_complete.
 */
extern const char *below_stack (void);
/* The identity and the stack, in messages. */
extern const char *below_description (void);
/* Whether an identity recorded (below_identity's form) names this
 * plugin's disk: the same, or a local file served by nbdkit's file
 * plugin spelled otherwise (same device and inode).
 */
extern bool below_same_plugin (const char *recorded);
/* Returns the one local file nbdkit's file plugin is given, or NULL. */
extern const char *below_served_file (void);
/* That file when its bytes are the disk below (no filter between),
 * known before the plugin is opened: a regular file (*regular, the
 * image below_lock_file locks) or a block device.  Else NULL.
 */
extern const char *below_direct_file (bool *regular);
/* The size of the disk below, when known before the plugin is opened
 * (that file, regular, with no filter between), else -1.
 */
extern int64_t below_served_size (void);
/* Returns the local file the plugin serves (known once below_lock_file
 * ran), or NULL.
 */
extern const char *below_local_file (void);
/* The plugin and its keys, naming its disk in messages ("curl
 * url=...", "memory export"; "file file=/srv/a.raw").
 */
extern const char *below_name (void);
extern void below_unload (void);

#endif /* QCOW2_FILTER_H */
