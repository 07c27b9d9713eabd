/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit qcow2 plugin: the glue between nbdkit and the qcow2 engine in
 * common/qcow2.  file=: one image, opened in get_ready, held to the end
 * (image.c).  dir=: every image of a folder is an export of its name
 * (fleet.c).  Here: nbdkit's callbacks, the keys, and the dispatch to
 * one or the other (plugin.h says who calls whom).
 */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "control.h"
#include "errstr.h"
#include "glue.h"
#include "plugin.h"
#include "qcow2.h"

/* malloc-mmap-threshold=: glibc keeps what a thread frees in that
 * thread's arena, and each of nbdkit's threads frees, when its
 * connection ends, a buffer as large as the largest request it served:
 * a fleet whose VMs had left kept 80 to 90 MiB.  Blocks of at least
 * this size are mapped on their own, and returned when freed (0:
 * glibc's choice, which raises its threshold as large blocks are
 * freed).  glibc's first threshold, 128 KiB, rather than more: a
 * buffer that nbdkit grows past the threshold leaves its old block in
 * the arena: with 1 MiB, a connection's 16 threads kept 3 MiB so after
 * 64 writes of up to 4 MiB.  A cluster's copy on write (64 KiB by
 * default) stays below it, in the arena.
 */
static uint64_t malloc_mmap_threshold = 128 << 10;

static int
plugin_config_mmap_threshold (const char *key, const char *value)
{
  if (glue_parse_size (key, value, true, &malloc_mmap_threshold) == -1)
    return -1;
  /* glibc's bounds (32 MiB: its largest on 64-bit hosts). */
  if (malloc_mmap_threshold &&
      (malloc_mmap_threshold < 4096 || malloc_mmap_threshold > 32 << 20)) {
    nbdkit_error ("%s: %s is out of range (4K to 32M, or 0)", key, value);
    return -1;
  }
  return 0;
}

static void
plugin_load (void)
{
  glue_load ("qcow2", "password", GLUE_IO_THREADS);
  fleet_load ();
  control_jobs_register ();
  control_commit_register ();
  control_snapshot_register ();
  control_fleet_register ();
}

static void
plugin_unload (void)
{
  control_unload ();
  fleet_unload ();
  image_unload ();
  free (glue_stream.base);
  glue_unload ();
}

/* cache=none|writeback (index in the row's words). */
static void
plugin_set_cache (unsigned i)
{
  glue_file_options.direct = i == 0;
}

static void
plugin_set_backing_format (unsigned i)
{
  glue.create.opts.backing_format = i == 0 ? "qcow2" : "raw";
}

#define WORDS(...) (const char *const []) { __VA_ARGS__, NULL }

/* The plugin's own keys (glue.c has those the filter takes too). */
static const struct glue_option plugin_options[] = {
  { "file", GLUE_FN, .any_value = true, .fn = image_config_file },
  { "dir", GLUE_FN, .fn = fleet_config },
  { "default-export", GLUE_FN, .fn = fleet_config },
  { "template", GLUE_FN, .fn = fleet_config },
  { "idle-close", GLUE_FN, .fn = fleet_config },
  { "max-exports", GLUE_FN, .fn = fleet_config },
  { "max-images", GLUE_FN, .fn = fleet_config },
  { "min-free", GLUE_FN, .fn = fleet_config },
  { "template-match", GLUE_FN, .fn = fleet_config },
  { "control", GLUE_FN, .fn = control_config },
  { "password", GLUE_FN, .any_value = true,
    .fn = glue_config_password },
  /* nbdkit's luks filter calls it passphrase=. */
  { "passphrase", GLUE_FN, .any_value = true,
    .fn = glue_config_password },
  { "backing-password", GLUE_FN, .any_value = true,
    .fn = glue_config_backing_password },
  { "backing-passphrase", GLUE_FN, .any_value = true,
    .fn = glue_config_backing_password },
  { "data-file", GLUE_FN, .fn = image_config_data_file },
  { "data_file", GLUE_FN, .fn = image_config_data_file },
  { "backing", GLUE_FN, .fn = image_config_backing },
  /* qemu-img's spellings of the options of an image to create. */
  { "backing_file", GLUE_FN, .fn = image_config_backing },
  { "backing-fmt", GLUE_WORD, true, .words = WORDS ("qcow2", "raw"),
    .set = plugin_set_backing_format },
  { "backing_fmt", GLUE_WORD, true, .words = WORDS ("qcow2", "raw"),
    .set = plugin_set_backing_format },
  { "data-file-raw", GLUE_BOOL, true,
    .dest = &glue.create.opts.data_file_raw,
    .given = &glue.create.data_file_raw_set },
  { "data_file_raw", GLUE_BOOL, true,
    .dest = &glue.create.opts.data_file_raw,
    .given = &glue.create.data_file_raw_set },
  { "malloc-mmap-threshold", GLUE_FN, .fn = plugin_config_mmap_threshold },
  { "cache", GLUE_WORD, .words = WORDS ("none", "writeback"),
    .set = plugin_set_cache },
  { "create", GLUE_FN, .fn = image_config_create },
  { "size", GLUE_FN, true, .fn = glue_config_create_size },
  { "stream", GLUE_BOOL, .dest = &glue_stream.on },
  { "stream-base", GLUE_STRING, .dest = &glue_stream.base },
  { "stream-rate", GLUE_SIZE, .dest = &glue_stream.rate,
    .given = &glue_stream.rate_given },
  { "stream-detach", GLUE_BOOL, .dest = &glue_stream.detach,
    .given = &glue_stream.detach_given },
};

static int
plugin_config (const char *key, const char *value)
{
  const struct glue_option *o;
  int r = glue_config (plugin_options,
                       sizeof plugin_options / sizeof *plugin_options,
                       key, value, &o);
  if (r == 0) {
    nbdkit_error ("unknown parameter '%s'", key);
    return -1;
  }
  /* backing=FILE only describes an image to make; backing=none not. */
  if (r == 1 && o && !glue.create.first_key &&
      o->fn == image_config_backing && strcmp (value, "none") != 0)
    glue.create.first_key = o->key;
  return r == 1 ? 0 : -1;
}

/* dir= with none of the keys of file=. */
static int
plugin_config_fleet_complete (void)
{
  const char *key = image_key_given ();

  if (image_on ()) {
    nbdkit_error ("file= and dir= exclude each other: file= serves one "
                  "image, dir= each image in a folder");
    return -1;
  }
  if (key) {
    nbdkit_error ("%s", strcmp (key, "create") == 0
                  ? "create= makes the image of file=: with dir=, "
                    "template= makes the images of new exports"
                  : strcmp (key, "data-file") == 0 ? "data-file= names the "
                    "data file of one image: not with dir="
                  : "backing=FILE describes the image create= makes: "
                    "with dir=, template=FILE makes overlays of FILE");
    return -1;
  }
  return fleet_config_complete ();
}

static int
plugin_config_complete (void)
{
  if (fleet_on () && plugin_config_fleet_complete () == -1)
    return -1;
  if (!fleet_on () && fleet_key_given ()) {
    nbdkit_error ("%s= goes with dir=", fleet_key_given ());
    return -1;
  }
  if (!image_on () && !fleet_on ()) {
    nbdkit_error ("you must supply the file=<FILENAME> parameter");
    glue_hint ("or dir=<DIR>, to serve each image in the folder DIR");
    return -1;
  }
  if (!fleet_on () && image_config_complete () == -1)
    return -1;
  /* QEMU maps a raw data file by metadata preallocation. */
  if (glue.create.opts.data_file_raw &&
      glue.create.opts.preallocation == QCOW2_PREALLOC_OFF)
    glue.create.opts.preallocation = QCOW2_PREALLOC_METADATA;
  if (glue_stream_config_complete ("stream") == -1)
    return -1;
  /* Before any connection's threads. */
  if (malloc_mmap_threshold &&
      mallopt (M_MMAP_THRESHOLD, (int) malloc_mmap_threshold) != 1)
    nbdkit_debug ("malloc-mmap-threshold=%" PRIu64 ": refused by the C "
                  "library", malloc_mmap_threshold);
  return glue_config_complete ();
}

#define plugin_config_help \
  "[file=]<FILENAME>               (required) The qcow2 image to serve.\n" \
  "dir=<DIR>                       Or: each qcow2 image in DIR, an export\n" \
  "                                of its file name.\n" \
  "default-export=<NAME>           dir=: the export of the empty name.\n" \
  "template=<FILE>                 dir=: a new export name makes an overlay\n" \
  "                                of FILE (the create options apply).\n" \
  "idle-close=<SECS>               dir=: close an image that long after its\n" \
  "                                last client left (default 5).\n" \
  "max-exports=<N>                 dir=: at most N images open at once.\n" \
  "max-images=<N>                  dir=: template= makes none past N images\n" \
  "                                in DIR (default 1000).\n" \
  "min-free=<SIZE>                 dir=: nor when less than SIZE would stay\n" \
  "                                free (default 256M).\n" \
  "template-match=<GLOB>           dir=: template= makes only names of GLOB.\n" \
  "control=<SOCKET>                A QMP control socket (LIVE OPERATIONS).\n" \
  "backing=none                    Serve the image without its backing file.\n" \
  "data-file=<FILENAME>            Override the external data file (with\n" \
  "                                create=: the one made).\n" \
  "password=<PASSWORD>|-|+FILE|-FD The password of a LUKS-encrypted image\n" \
  "                                (also passphrase=).\n" \
  "backing-password=<PASSWORD>     That of the next backing file, if other.\n" \
  "malloc-mmap-threshold=<SIZE>    Freed blocks of SIZE returned to the\n" \
  "                                system at once (default 128K, 0: libc's).\n" \
  "cache=none|writeback            none: O_DIRECT, past the page cache\n" \
  "                                (default writeback).\n" \
  GLUE_CONFIG_HELP \
  "io-threads=<N>                  Threads doing the pieces of a fragmented\n" \
  "                                request at once (default 4, 0: none).\n" \
  "stream=true                     Copy the backing chain into the image\n" \
  "                                while serving it, then drop the link.\n" \
  "stream-base=<NAME>              Stop at this layer (it stays the backing).\n" \
  "stream-rate=<SIZE>              At most this many bytes a second.\n" \
  "stream-detach=false             Copy, but keep the backing link.\n" \
  "create=true|if-missing          Make the image first (true: the file\n" \
  "                                must be missing or empty), as below.\n" \
  "size=<SIZE>                     Its virtual size (or that of backing=).\n" \
  "backing=<FILE>                  Its backing file (whose size and format\n" \
  "                                are taken).\n" \
  "backing-fmt=qcow2|raw           The backing file's format.\n" \
  "data-file-raw=on                The data file is a raw image of the disk.\n" \
  GLUE_CREATE_HELP \
  "preallocation=off|metadata|falloc|full  As qemu-img's (off).\n" \
  GLUE_CREATE_SPELLINGS_HELP

static int
plugin_list_exports (int readonly, int is_tls, struct nbdkit_exports *exports)
{
  if (!fleet_on ())
    return nbdkit_use_default_export (exports);
  return fleet_list (exports);
}

static const char *
plugin_default_export (int readonly, int is_tls)
{
  return fleet_default_export ();
}

/* Passwords are kept for the images dir= opens later. */
static int
plugin_get_ready (void)
{
  /* The control socket last: nbdkit exits without unload if this
   * fails, and the socket would stay.
   */
  if ((fleet_on () ? fleet_get_ready () : image_get_ready ()) == -1)
    return -1;
  return control_get_ready ();
}

/* Threads do not survive nbdkit's fork into the background: file='s
 * stream starts here (dir='s as their images open).
 */
static int
plugin_after_fork (void)
{
  if (control_after_fork () == -1)
    return -1;
  return fleet_on () ? fleet_after_fork () : image_after_fork ();
}

/* Every stream stopped where it is, once the clients are gone: before
 * the images close at unload.
 */
static void
plugin_cleanup (void)
{
  control_cleanup ();
  if (fleet_on ())
    fleet_cleanup ();
  else
    image_cleanup ();
}

static struct qcow2_image *
plugin_image (void *handle)
{
  return ((struct plugin_export *) handle)->image;
}

static const char *
plugin_export_description (void *handle)
{
  struct plugin_export *e = handle;
  bool settled;

  if (fleet_on ())
    return fleet_description (e);
  return glue_stream_job_description (e->job, &settled);
}

static void *
plugin_open (int readonly)
{
  return fleet_on () ? fleet_connect () : image_connect ();
}

static void
plugin_close (void *handle)
{
  if (plugin_image (handle))
    glue_close_stats (plugin_image (handle));
  if (fleet_on ())
    fleet_release (handle);
  else
    image_release ();
}

static int64_t
plugin_get_size (void *handle)
{
  return qcow2_get_size (plugin_image (handle));
}

static int
plugin_can_write (void *handle)
{
  return qcow2_can_write (plugin_image (handle));
}

static int
plugin_can_flush (void *handle)
{
  return 1;
}

static int
plugin_can_fua (void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

static int
plugin_can_trim (void *handle)
{
  return qcow2_can_trim (plugin_image (handle));
}

static int
plugin_can_zero (void *handle)
{
  return 1;
}

static int
plugin_can_fast_zero (void *handle)
{
  return 1;
}

static int
plugin_can_multi_conn (void *handle)
{
  return 1;
}

static int
plugin_can_extents (void *handle)
{
  return 1;
}

static int
plugin_block_size (void *handle, uint32_t *minimum, uint32_t *preferred,
                   uint32_t *maximum)
{
  glue_block_size (minimum, preferred, maximum);
  return 0;
}

static int
plugin_can_cache (void *handle)
{
  return NBDKIT_CACHE_NATIVE;
}

static int
plugin_errno (int r)
{
  errno = -r;
  return -1;
}

/* A request of an export deleted by block-export-del: refused
 * (ESHUTDOWN), and its connection dropped where nbdkit lets a plugin
 * do so (1.33.3 on: nbdkit_disconnect).
 */
static int
plugin_deleted (void)
{
#if GLUE_NBDKIT_AT_LEAST (33, 3)
  nbdkit_disconnect (1);
#endif
  return -1;
}

static int
plugin_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  struct plugin_export *e = handle;
  int r;

  if (!gate_enter (e))
    return plugin_deleted ();
  glue_stream_job_kick (__atomic_load_n (&e->job, __ATOMIC_ACQUIRE));
  r = qcow2_read (e->image, buf, count, offset);
  gate_leave (e);
  return r < 0 ? plugin_errno (r) : 0;
}

/* NBD_CMD_CACHE, answered as qemu-nbd answers it: the range is read,
 * so that its L2 slices are in the cache and its data (and that of the
 * backing files) in the host's page cache.
 */
static int
plugin_cache (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  const uint32_t chunk = 1024 * 1024;
  struct plugin_export *e = handle;
  void *buf = malloc (count < chunk ? count : chunk);
  int r = 0;

  if (!buf) {
    nbdkit_error ("cache: %s", errstr (errno));
    return -1;
  }
  if (!gate_enter (e)) {
    free (buf);
    return plugin_deleted ();
  }
  while (count > 0 && r == 0) {
    uint32_t n = count < chunk ? count : chunk;

    r = qcow2_read (e->image, buf, n, offset);
    offset += n;
    count -= n;
  }
  gate_leave (e);
  free (buf);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_pwrite (void *handle, const void *buf, uint32_t count,
               uint64_t offset, uint32_t flags)
{
  struct plugin_export *e = handle;
  int r;

  if (!gate_enter (e))
    return plugin_deleted ();
  glue_stream_job_kick (__atomic_load_n (&e->job, __ATOMIC_ACQUIRE));
  r = qcow2_write (e->image, buf, count, offset, flags & NBDKIT_FLAG_FUA);
  gate_leave (e);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct plugin_export *e = handle;
  int r;

  if (!gate_enter (e))
    return plugin_deleted ();
  r = qcow2_zero (e->image, count, offset, flags & NBDKIT_FLAG_MAY_TRIM,
                  flags & NBDKIT_FLAG_FAST_ZERO, flags & NBDKIT_FLAG_FUA);
  gate_leave (e);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct plugin_export *e = handle;
  int r;

  if (!gate_enter (e))
    return plugin_deleted ();
  r = qcow2_trim (e->image, count, offset, flags & NBDKIT_FLAG_FUA);
  gate_leave (e);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_flush (void *handle, uint32_t flags)
{
  struct plugin_export *e = handle;
  int r;

  if (!gate_enter (e))
    return plugin_deleted ();
  r = qcow2_flush (e->image);
  glue_flushed (e->image);
  gate_leave (e);
  return r < 0 ? plugin_errno (r) : 0;
}

static int
plugin_add_extent (void *opaque, uint64_t offset, uint64_t length,
                   uint32_t type)
{
  return nbdkit_add_extent (opaque, offset, length, type) == -1 ? -errno : 0;
}

static int
plugin_extents (void *handle, uint32_t count, uint64_t offset,
                uint32_t flags, struct nbdkit_extents *extents)
{
  struct plugin_export *e = handle;
  int r;

  if (!gate_enter (e))
    return plugin_deleted ();
  r = qcow2_extents (e->image, offset, count, flags & NBDKIT_FLAG_REQ_ONE,
                     plugin_add_extent, extents);
  gate_leave (e);
  return r < 0 ? plugin_errno (r) : 0;
}

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static struct nbdkit_plugin plugin = {
  .name              = "qcow2",
  .longname          = "nbdkit qcow2 plugin",
  .version           = PACKAGE_VERSION,
  .load              = plugin_load,
  .unload            = plugin_unload,
  .config            = plugin_config,
  .config_complete   = plugin_config_complete,
  .config_help       = plugin_config_help,
  .magic_config_key  = "file",
  .dump_plugin       = glue_dump_plugin,
  .list_exports      = plugin_list_exports,
  .default_export    = plugin_default_export,
  .get_ready         = plugin_get_ready,
  .after_fork        = plugin_after_fork,
  .cleanup           = plugin_cleanup,
  .export_description = plugin_export_description,
  .open              = plugin_open,
  .close             = plugin_close,
  .get_size          = plugin_get_size,
  .can_write         = plugin_can_write,
  .can_flush         = plugin_can_flush,
  .can_fua           = plugin_can_fua,
  .can_trim          = plugin_can_trim,
  .can_zero          = plugin_can_zero,
  .can_fast_zero     = plugin_can_fast_zero,
  .can_multi_conn    = plugin_can_multi_conn,
  .can_extents       = plugin_can_extents,
  .can_cache         = plugin_can_cache,
  .block_size        = plugin_block_size,
  .pread             = plugin_pread,
  .cache             = plugin_cache,
  .pwrite            = plugin_pwrite,
  .zero              = plugin_zero,
  .trim              = plugin_trim,
  .flush             = plugin_flush,
  .extents           = plugin_extents,
  .errno_is_preserved = 1,
};

NBDKIT_REGISTER_PLUGIN (plugin)
