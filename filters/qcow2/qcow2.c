/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit qcow2 filter: the qcow2 engine over whatever the plugin below
 * serves (a file, another NBD server, SSH, HTTP, an xz archive ...).
 * One engine serves every connection, over one context into the plugin
 * opened at after_fork (a "shared" context), so that all connections
 * see one image, as with the plugin.  Backing files are local files or
 * remote storage (URLs, json: names), as with the plugin.
 *
 * This file has nbdkit's callbacks, answered from the engine; the
 * rest, top down (filter.h): start.c opens the image, create.c makes
 * one (create=true), config.c has the keys, overlay.c and record.c the
 * overlay (qcow2-overlay=FILE), below.c the plugin below.
 */
#include <assert.h>
#include <stdbool.h>
#include <stdint.h>

#include <nbdkit-filter.h>

#include "filter.h"
#include "glue.h"
#include "qcow2.h"

/* nbdkit 1.35.9 gave filters a dump_plugin callback; before it, the
 * filter's keys are printed at unload, which nbdkit --dump-plugin
 * reaches right after printing the plugin's.
 */
#define HAVE_FILTER_DUMP_PLUGIN GLUE_NBDKIT_AT_LEAST (35, 9)

/* What the engine made of the plugin's export (below.c has the
 * context into it).  Set at after_fork, fixed until cleanup.
 */
static struct qcow2_image *image;

static void
qcow2_filter_load (void)
{
  config_load ();
}

static void
qcow2_filter_unload (void)
{
#if !HAVE_FILTER_DUMP_PLUGIN
  if (glue_dump_asked ())
    glue_dump_plugin ();
#endif
  glue_unload ();
  config_unload ();
  below_unload ();
  overlay_unload ();
}

/* Our keys, and the plugin's (passed on). */
static int
qcow2_filter_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                     const char *key, const char *value)
{
  int r = config_key (key, value);

  if (r == 0)
    return next (nxdata, key, value);
  return r == 1 ? 0 : -1;
}

static int
qcow2_filter_config_complete (nbdkit_next_config_complete *next,
                              nbdkit_backend *nxdata)
{
  if (config_complete () == -1)
    return -1;
  return next (nxdata);
}

static int
qcow2_filter_get_ready (int thread_model)
{
  /* No pool of threads calling a plugin that takes one request at a
   * time: they would only wait for each other.
   */
  if (below_get_ready (thread_model))
    glue.engine.io_threads = 0;
  return start_get_ready ();
}

/* An image that cannot be served ends nbdkit at start, with its
 * reason, heard where nbdkit was started.
 */
static int
qcow2_filter_after_fork (nbdkit_backend *backend)
{
  return start_open (backend, &image);
}

static void
qcow2_filter_cleanup (nbdkit_backend *backend)
{
  glue_stream_stop ();
  if (image && qcow2_close (image) < 0)
    nbdkit_error ("closing the image failed: its last changes may not be "
                  "durable");
  image = NULL;
  below_cleanup ();
}

/* Connections use the shared engine, not a context of their own. */
static void *
qcow2_filter_open (nbdkit_next_open *next, nbdkit_context *context,
                   int readonly, const char *exportname, int is_tls)
{
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static void
qcow2_filter_close (void *handle)
{
  glue_close_stats (image);
}

static int64_t
qcow2_filter_get_size (nbdkit_next *next, void *handle)
{
  assert (image != NULL);       /* opened at after_fork, or no server */
  return qcow2_get_size (image);
}

static int
qcow2_filter_can_write (nbdkit_next *next, void *handle)
{
  return qcow2_can_write (image);
}

/* Flush, fast zero, multi-conn, block status: always. */
static int
qcow2_filter_yes (nbdkit_next *next, void *handle)
{
  return 1;
}

/* Zeroes go to the engine (zero flags), not written as zeros by
 * nbdkit, as a filter's can_zero of 1 (NBDKIT_ZERO_EMULATE) asks.
 */
static int
qcow2_filter_can_zero (nbdkit_next *next, void *handle)
{
  return NBDKIT_ZERO_NATIVE;
}

static int
qcow2_filter_can_fua (nbdkit_next *next, void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

static int
qcow2_filter_can_trim (nbdkit_next *next, void *handle)
{
  return qcow2_can_trim (image);
}

static int
qcow2_filter_can_cache (nbdkit_next *next, void *handle)
{
  return overlay_can_cache ();
}

/* Every callback answers from the engine: a connection has no context
 * of its own into the plugin (next is NULL) to pass a question on to.
 */
static int
qcow2_filter_is_rotational (nbdkit_next *next, void *handle)
{
  return 0;
}

static const char *
qcow2_filter_export_description (nbdkit_next *next, void *handle)
{
  return glue_stream_description ();
}

/* As the plugin's: the image's bytes, not the plugin's below. */
static int
qcow2_filter_block_size (nbdkit_next *next, void *handle,
                         uint32_t *minimum, uint32_t *preferred,
                         uint32_t *maximum)
{
  glue_block_size (minimum, preferred, maximum);
  return 0;
}

static int
qcow2_filter_result (int r, int *err)
{
  if (r < 0) {
    *err = -r;
    return -1;
  }
  return 0;
}

static int
qcow2_filter_pread (nbdkit_next *next, void *handle, void *buf,
                    uint32_t count, uint64_t offset, uint32_t flags,
                    int *err)
{
  int r;

  glue_stream_enter ();
  /* As QEMU's copy-on-read, a fill that fails fails the read. */
  r = overlay_fills_reads () ? qcow2_fill (image, count, offset) : 0;
  if (r == 0)
    r = qcow2_read (image, buf, count, offset);
  glue_stream_leave ();
  return qcow2_filter_result (r, err);
}

static int
qcow2_filter_pwrite (nbdkit_next *next, void *handle, const void *buf,
                     uint32_t count, uint64_t offset, uint32_t flags,
                     int *err)
{
  glue_stream_enter ();
  int r = qcow2_write (image, buf, count, offset, flags & NBDKIT_FLAG_FUA);
  glue_stream_leave ();
  return qcow2_filter_result (r, err);
}

static int
qcow2_filter_zero (nbdkit_next *next, void *handle, uint32_t count,
                   uint64_t offset, uint32_t flags, int *err)
{
  return qcow2_filter_result (qcow2_zero (image, count, offset,
                                          flags & NBDKIT_FLAG_MAY_TRIM,
                                          flags & NBDKIT_FLAG_FAST_ZERO,
                                          flags & NBDKIT_FLAG_FUA), err);
}

static int
qcow2_filter_trim (nbdkit_next *next, void *handle, uint32_t count,
                   uint64_t offset, uint32_t flags, int *err)
{
  return qcow2_filter_result (qcow2_trim (image, count, offset,
                                          flags & NBDKIT_FLAG_FUA), err);
}

static int
qcow2_filter_flush (nbdkit_next *next, void *handle, uint32_t flags,
                    int *err)
{
  int r = qcow2_flush (image);

  glue_flushed (image);
  return qcow2_filter_result (r, err);
}

/* Copy-on-read of the range (see overlay_can_cache), when it is on. */
static int
qcow2_filter_cache (nbdkit_next *next, void *handle, uint32_t count,
                    uint64_t offset, uint32_t flags, int *err)
{
  if (!overlay_fills_cache ())
    return 0;
  return qcow2_filter_result (qcow2_fill (image, count, offset), err);
}

static int
qcow2_filter_add_extent (void *opaque, uint64_t offset, uint64_t length,
                         uint32_t type)
{
  return nbdkit_add_extent (opaque, offset, length, type) == -1 ? -errno : 0;
}

static int
qcow2_filter_extents (nbdkit_next *next, void *handle, uint32_t count,
                      uint64_t offset, uint32_t flags,
                      struct nbdkit_extents *extents, int *err)
{
  return qcow2_filter_result (qcow2_extents (image, offset, count,
                                             flags & NBDKIT_FLAG_REQ_ONE,
                                             qcow2_filter_add_extent,
                                             extents), err);
}

static struct nbdkit_filter filter = {
  .name              = "qcow2",
  .longname          = "nbdkit qcow2 filter",
  .load              = qcow2_filter_load,
  .unload            = qcow2_filter_unload,
  .config            = qcow2_filter_config,
  .config_complete   = qcow2_filter_config_complete,
  .config_help       = config_help,
#if HAVE_FILTER_DUMP_PLUGIN
  .dump_plugin       = glue_dump_plugin,
#endif
  .get_ready         = qcow2_filter_get_ready,
  .after_fork        = qcow2_filter_after_fork,
  .cleanup           = qcow2_filter_cleanup,
  .open              = qcow2_filter_open,
  .close             = qcow2_filter_close,
  .get_size          = qcow2_filter_get_size,
  .block_size        = qcow2_filter_block_size,
  .can_write         = qcow2_filter_can_write,
  .can_flush         = qcow2_filter_yes,
  .can_fua           = qcow2_filter_can_fua,
  .can_trim          = qcow2_filter_can_trim,
  .can_zero          = qcow2_filter_can_zero,
  .can_fast_zero     = qcow2_filter_yes,
  .can_multi_conn    = qcow2_filter_yes,
  .can_extents       = qcow2_filter_yes,
  .can_cache         = qcow2_filter_can_cache,
  .is_rotational     = qcow2_filter_is_rotational,
  .export_description = qcow2_filter_export_description,
  .pread             = qcow2_filter_pread,
  .pwrite            = qcow2_filter_pwrite,
  .zero              = qcow2_filter_zero,
  .trim              = qcow2_filter_trim,
  .flush             = qcow2_filter_flush,
  .cache             = qcow2_filter_cache,
  .extents           = qcow2_filter_extents,
};

NBDKIT_REGISTER_FILTER (filter)
