/* SPDX-License-Identifier: BSD-3-Clause */
/* Opening and closing images and backing layers, and the public entry
 * points with no file of their own (read, extents, check, the image's
 * properties).  The others (qcow2.h) live with their concern: write.c,
 * zero.c, flush.c, fill.c, snapshot.c, create.c, ...
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

/* glibc's rwlocks prefer readers: under a steady read load a flush,
 * which releases freed clusters holding data_lock exclusively, would
 * wait without bound.  Preferring the writer bounds its wait by the
 * longest request in progress; no thread ever takes data_lock twice,
 * which such a lock would not allow.
 */
static void
image_init_data_lock (struct qcow2_image *img)
{
  pthread_rwlockattr_t attr;

  pthread_rwlockattr_init (&attr);
#ifdef __GLIBC__
  pthread_rwlockattr_setkind_np (&attr,
                                 PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
  pthread_rwlock_init (&img->data_lock.rwlock, &attr);
  pthread_rwlockattr_destroy (&attr);
}

void
image_free (struct qcow2_image *img)
{
  if (!img)
    return;
  if (img->backing && layers_release (img->backing))
    image_free (img->backing);
  if (img->claimed)
    layers_unclaim (img->env->layers, img->id);
  pool_destroy (img->pool);
  readahead_free (img->readahead);
  bitmap_free (img);
  cache_destroy (img->caches.l2);
  cache_destroy (img->caches.refcount);
  overlap_map_destroy (img->overlap);
  if (img->guest_io && img->guest_io != img->data_io)
    img->guest_io->ops->close (img->guest_io);
  luks_close (img->luks);
  if (img->data_io && img->data_io != img->io)
    img->data_io->ops->close (img->data_io);
  if (img->io)
    img->io->ops->close (img->io);
  snapshot_free_table (img);
  header_free (&img->h);
  free (img->l1);
  free (img->reftable);
  free (img->path);
  free (img->id);
  free (img->alloc.pending_free);
  alloc_free_reserve (img);
  lock_destroy (&img->lock);
  pthread_rwlock_destroy (&img->data_lock.rwlock);
  pthread_cond_destroy (&img->inflight_done);
  free (img);
}

static int
image_probe_format (struct qcow2_image *img, const char **format)
{
  int r = qcow2_probe (img->io);

  if (r < 0) {
    log_error (img, "reading the first bytes to probe the format: %s",
               errstr (-r));
    return r;
  }
  *format = r ? "qcow2" : "raw";
  return 0;
}

/* The header, the active L1 table, the refcount table and the snapshot
 * table must not share a cluster: each would be read as the other and
 * written over the other.
 */
static int
image_check_tables_apart (struct qcow2_image *img)
{
  const struct qcow2_header *h = &img->h;
  const struct { const char *what; uint64_t off, len; } t[] = {
    { "header", 0, img->geo.cluster_size },
    { "L1 table", h->l1_table_offset, (uint64_t) h->l1_size * 8 },
    { "refcount table", h->refcount_table_offset,
      (uint64_t) h->refcount_table_clusters << img->geo.cluster_bits },
    { "snapshot table", h->snapshots_offset, img->snapshot_table_bytes },
    { "encryption header", h->crypto_offset,
      h->crypt_method == QCOW2_CRYPT_LUKS ? h->crypto_length : 0 },
  };
  const size_t n = sizeof t / sizeof t[0];

  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++) {
      if (!t[i].len || !t[j].len)
        continue;
      /* Compare whole clusters. */
      uint64_t a0 = t[i].off >> img->geo.cluster_bits;
      uint64_t a1 = (t[i].off + t[i].len - 1) >> img->geo.cluster_bits;
      uint64_t b0 = t[j].off >> img->geo.cluster_bits;
      uint64_t b1 = (t[j].off + t[j].len - 1) >> img->geo.cluster_bits;
      if (a0 <= b1 && b0 <= a1) {
        log_error (img, "corrupt image: the %s (at %#" PRIx64 ") and the %s "
                   "(at %#" PRIx64 ") overlap", t[i].what, t[i].off,
                   t[j].what, t[j].off);
        return -EINVAL;
      }
    }
  return 0;
}

/* One debug line per layer, top first: what -v users ask about. */
static void
image_describe (const struct qcow2_image *img,
                const struct qcow2_options *opts)
{
  const struct qcow2_header *h = &img->h;
  char backing[64 + QCOW2_MAX_BACKING_NAME] = "none";
  char data_file[64 + PATH_MAX] = "none";

  if (opts->backing_io)
    snprintf (backing, sizeof backing, "%s (raw, opened by the caller)",
              opts->backing_io_name ? opts->backing_io_name : "a file");
  else if (opts->backing_chain_len > 0)
    snprintf (backing, sizeof backing, "\"%s\" (format probed, named by "
              "backing=)", opts->backing_chain[0]);
  else if (h->backing_file)
    snprintf (backing, sizeof backing, "\"%s\" (%s%s)", h->backing_file,
              h->backing_format ? h->backing_format : "format probed",
              opts->no_backing ? ", not opened: backing=none" : "");
  if (img->data_io != img->io)
    snprintf (data_file, sizeof data_file, "\"%s\"%s",
              opts->data_file ? opts->data_file : h->data_file,
              img->data_file_raw ? " (raw)" : "");
  log_debug (img, "qcow2 v%" PRIu32 ", %" PRIu64 "-byte clusters, virtual "
             "size %" PRIu64 ", %u-bit refcounts%s%s, %s compression, "
             "backing %s, data file %s, L2 cache %" PRIu32 " slices "
             "of %" PRIu64 " bytes, %s",
             h->version, img->geo.cluster_size, img->size,
             1u << h->refcount_order,
             img->geo.extended_l2 ? ", extended L2" : "",
             img->lazy_refcounts ? ", lazy refcounts" : "",
             h->compression_type == QCOW2_COMPRESSION_ZSTD ? "zstd" : "zlib",
             backing, data_file,
             cache_entries (img->caches.l2), cache_entry_size (img->caches.l2),
             qcow2_can_write (img) ? "read-write" : "read-only");
}

/* An encrypted image's guest data goes through the layer that
 * encrypts it, keyed by the password.
 */
static int
image_open_crypto (struct qcow2_image *img, const struct qcow2_options *opts)
{
  int r;

  img->guest_io = img->data_io;
  if (img->h.crypt_method != QCOW2_CRYPT_LUKS)
    return 0;
  if (img->data_file_raw) {
    log_error (img, "LUKS-encrypted image with a raw external data file "
               "(autoclear bit 1): encrypted data is not a raw disk");
    return -EINVAL;
  }
  const struct luks_area where = {
    .env = img->env, .name = img->path, .below = img->below, .io = img->io,
    .offset = img->h.crypto_offset, .length = img->h.crypto_length,
  };
  if ((r = luks_open (&where, opts->passwords_len && opts->passwords[0].text
                                ? &opts->passwords[0] : NULL,
                      opts->max_pbkdf2_iterations, &img->luks)) < 0)
    return r;
  if (!(img->guest_io = crypt_io_new (img->data_io, img->luks))) {
    img->guest_io = img->data_io;
    return -ENOMEM;
  }
  return 0;
}

/* compress=: what QEMU's compress driver can do on this image. */
static int
image_set_compress (struct qcow2_image *img, const struct qcow2_options *opts)
{
  static const char *const names[] = { "zlib", "zstd" };

  if (img->luks || img->data_io != img->io) {
    log_error (img, "compress= cannot be used on %s: QEMU does not "
               "compress its clusters either",
               img->luks ? "an encrypted image" : "an image with an "
               "external data file");
    return -ENOTSUP;
  }
  if (opts->compress_type >= 0 &&
      opts->compress_type != img->h.compression_type) {
    log_error (img, "compress=%s, but the image's compressed clusters are "
               "%s\n"
               "an image's compression type is set when it is made "
               "(compression-type= with create=true)",
               names[opts->compress_type & 1],
               names[img->h.compression_type & 1]);
    return -EINVAL;
  }
  img->compress = true;
  return 0;
}

/* copy_on_read: fills go into the image file, as new clusters. */
static int
image_set_copy_on_read (struct qcow2_image *img)
  TSA_REQUIRES (img->lock)
{
  if (!img->writable || img->data_io != img->io) {
    log_error (img, "copy-on-read needs %s", !img->writable
               ? "an image opened read-write (not a snapshot)"
               : "the guest data in the image file, not an external data "
               "file");
    return -EINVAL;
  }
  img->copy_on_read = true;
  return 0;
}

/* Called with the lock held, though the image is not shared yet: the
 * state it sets up is the lock's to guard.
 */
static int
image_open_qcow2 (struct qcow2_image *img, const struct qcow2_options *opts)
  TSA_REQUIRES (img->lock)
{
  int r;

  if ((r = header_read (img)) < 0)
    return r;
  if ((r = data_file_open (img, opts)) < 0)
    return r;
  if ((r = image_open_crypto (img, opts)) < 0)
    return r;
  if ((r = snapshot_read_table (img)) < 0)
    return r;
  if ((r = image_check_tables_apart (img)) < 0)
    return r;
  if (opts->snapshot) {
    if ((r = snapshot_select (img, opts->snapshot)) < 0)
      return r;
  }
  else {
    /* QEMU serves whole sectors of a qcow2 image. */
    img->size = img->h.size & ~UINT64_C (511);
    r = l1_load (img, img->h.l1_table_offset, img->h.l1_size,
                 "active L1 table");
    if (r < 0)
      return r;
  }
  if ((r = cache_setup (img, opts)) < 0)
    return r;
  img->writable = !opts->readonly && !opts->snapshot;
  if (img->writable && opts->compress &&
      (r = image_set_compress (img, opts)) < 0)
    return r;
  if (opts->copy_on_read && (r = image_set_copy_on_read (img)) < 0)
    return r;
  img->discard = !opts->discard_ignore;
  img->lazy_refcounts = img->h.compatible_features
    & QCOW2_COMPAT_LAZY_REFCOUNTS;
  img->overlap_mask = opts->overlap_set ? opts->overlap_mask
                                        : QCOW2_OL_CACHED;
  /* bitmap_open maps the bitmaps' tables for the guard: the map first. */
  if (img->writable && img->h.nb_bitmaps &&
      (r = state_prepare_writes (img)) < 0)
    return r;
  if (img->writable && (r = bitmap_open (img)) < 0)
    return r;
  image_describe (img, opts);
  return 0;
}

/* An image opened for writing, known as such to the table of shared
 * layers before anything is read: refused while it is a layer there
 * (read by others as their backing file), as QEMU's image locks would
 * refuse it.
 */
static int
image_claim (struct qcow2_image *img)
{
  int r = layers_claim (img->env->layers, img->id);

  if (r == -EBUSY)
    log_error (img, "refused for writing: it is the backing file of "
               "another image open, or open for writing already (as "
               "QEMU's image locks would refuse it)");
  img->claimed = r == 0;
  return r;
}

struct qcow2_image *
image_open_layer (const struct qcow2_env *env, struct qcow2_io *io,
                  const char *path, char *id, const char *format,
                  const struct qcow2_options *opts,
                  const char **chain, unsigned depth)
{
  struct qcow2_image *img;
  int64_t size;
  int r;

  img = calloc (1, sizeof *img);
  if (!img) {
    r = -errno;
    io->ops->close (io);
    free (id);
    errno = -r;
    return NULL;
  }
  img->overlap = &overlap_map_empty;
  lock_init (&img->lock);
  image_init_data_lock (img);
  lock_cond_init (&img->inflight_done);
  img->env = env;
  img->io = io;
  img->id = id;
  img->users = 1;
  img->below = depth > 0;
  img->caches.debug = opts->debug_cache;
  img->path = strdup (path);
  if (!img->path) {
    r = -errno;
    goto err;
  }
  if (depth == 0 && env->layers && !opts->readonly && !opts->snapshot &&
      (r = image_claim (img)) < 0)
    goto err;

  size = io->ops->size (io);
  if (size < 0) {
    r = (int) size;
    log_error (img, "cannot get the file size: %s", errstr (-r));
    goto err;
  }
  img->file_size = img->host.written_end = img->host.durable_end = size;

  if (!format && (r = image_probe_format (img, &format)) < 0)
    goto err;
  if (strcmp (format, "raw") == 0) {
    if (opts->backing_chain_len > 0) {
      log_error (img, "raw, so it has no backing file: backing=%s cannot "
                 "follow it", opts->backing_chain[0]);
      r = -EINVAL;
      goto err;
    }
    img->raw = true;
    img->size = img->file_size;
    log_debug (img, "raw, size %" PRIu64 ", read-only", img->size);
    return img;
  }
  if (strcmp (format, "qcow2") != 0) {
    log_error (img, "unsupported format \"%s\" (qcow2 and raw are "
               "supported)", format);
    r = -ENOTSUP;
    goto err;
  }
  image_lock (img);
  r = image_open_qcow2 (img, opts);
  image_unlock (img);
  /* The backing file opened with this layer's lock dropped (nothing
   * else can take it yet), so that opening a chain holds one lock at a
   * time, however deep (ThreadSanitizer counts at most 64).
   */
  if (r == 0 && !opts->backing_io &&    /* qcow2_open attaches that */
      (opts->backing_chain_len > 0 ||
       (!opts->no_backing && img->h.backing_file)))
    r = backing_open (img, opts, chain, depth);
  if (r < 0)
    goto err;
  return img;

 err:
  image_free (img);
  errno = -r;
  return NULL;
}

struct qcow2_image *
qcow2_open (const struct qcow2_env *env, struct qcow2_io *io,
            const char *path, const struct qcow2_options *opts)
{
  const char *chain[QCOW2_MAX_CHAIN_DEPTH + 1];
  char *id = env->identity ? env->identity (env->opaque, path) : NULL;
  struct qcow2_image *img = NULL;
  int r;

  assert (!opts->backing_io ||
          (!opts->backing_chain_len && !opts->no_backing));
  if (!id)
    id = strdup (path);
  if (!id) {
    r = -errno;
    io->ops->close (io);
  }
  else {
    chain[0] = id;
    img = image_open_layer (env, io, path, id, "qcow2", opts, chain, 0);
    r = img ? 0 : -errno;
  }
  /* The backing file handed in is the image's once it is open;
   * backing_attach_io consumes it even when it fails.
   */
  if (opts->backing_io) {
    if (img)
      r = backing_attach_io (img, opts);
    else
      opts->backing_io->ops->close (opts->backing_io);
  }
  if (r < 0) {
    image_free (img);
    errno = -r;
    return NULL;
  }
  img->io_threads = opts->io_threads;
  return img;
}

int
qcow2_close (struct qcow2_image *img)
{
  int r = 0;

  if (!img)
    return 0;
  if (img->writable) {
    image_data_wrlock (img);
    image_lock (img);
    r = state_close (img);
    if (r < 0)
      io_mark_dirty (img);
    image_unlock (img);
    image_data_unlock (img);
  }
  image_free (img);
  return r;
}

/* The storage of a layer whose file could not be opened again: every
 * read and write fails (the layer keeps its place in the chain, and the
 * requests reaching it fail, until the image is opened anew).
 */
static int
image_gone_pread (struct qcow2_io *io, void *buf, size_t count,
                  uint64_t offset)
{
  return -EIO;
}

static int
image_gone_pwrite (struct qcow2_io *io, const void *buf, size_t count,
                   uint64_t offset)
{
  return -EIO;
}

static int
image_gone_flush (struct qcow2_io *io)
{
  return -EIO;
}

static int64_t
image_gone_size (struct qcow2_io *io)
{
  return -EIO;
}

static void
image_gone_close (struct qcow2_io *io)
{
}

static const struct qcow2_io_ops image_gone_ops = {
  .pread = image_gone_pread, .pwrite = image_gone_pwrite,
  .flush = image_gone_flush, .size = image_gone_size,
  .close = image_gone_close,
};
static struct qcow2_io image_gone_io = { .ops = &image_gone_ops };

/* The layer's file opened again (see image_reopen_below), or, failing
 * that, read-only as it was; failing that too, gone.
 */
static int
image_reopen_io (struct qcow2_image *l, bool writable)
{
  struct qcow2_io *io;
  int r = 0;

  l->io->ops->close (l->io);
  io = backing_reopen (l, writable);
  if (!io) {
    r = -errno;
    if (writable)
      io = backing_reopen (l, false);
    if (!io) {
      log_error (l, "the backing file cannot be opened again: reads of "
                 "it fail from now on\n"
                 "open the image again (restart the server) once the "
                 "file is back");
      io = &image_gone_io;
    }
  }
  l->io = l->data_io = l->guest_io = io;
  return r;
}

/* What writing a layer needs that reading it did not: its refcount
 * table, the overlap guard's map, its persistent bitmaps (kept up to
 * date, as QEMU keeps a commit's base's).  Freed clusters are not
 * punched: a read through the image above may still be reading one
 * (see commit.c).
 */
static int
image_begin_writes (struct qcow2_image *l)
  TSA_REQUIRES (l->lock)
{
  int r;

  if ((r = state_prepare_writes (l)) < 0)
    return r;
  if ((r = bitmap_open (l)) < 0)
    return r;
  l->writable = true;
  l->discard = false;
  return 0;
}

/* A layer read-only again, as it was opened. */
static void
image_end_writes (struct qcow2_image *l)
  TSA_REQUIRES (l->lock)
{
  bitmap_free (l);
  overlap_map_destroy (l->overlap);
  l->overlap = &overlap_map_empty;
  l->overlap_conflict = false;
  free (l->reftable);
  l->reftable = NULL;
  l->reftable_size = 0;
  l->writable = false;
  l->discard = true;
  l->write_started = false;
  l->alloc.closing = false;
}

int
image_close_writes (struct qcow2_image *l)
{
  int r;

  image_data_wrlock (l);
  image_lock (l);
  r = state_close (l);
  if (r < 0)
    io_mark_dirty (l);
  else
    l->write_started = false;
  image_unlock (l);
  image_data_unlock (l);
  return r;
}

int
image_reopen_below (struct qcow2_image *img, bool writable)
{
  struct qcow2_image *l = img->backing;
  int r = 0, e;

  assert (l && !l->raw && l->data_io == l->io && !l->luks);
  image_data_wrlock (l);
  image_lock (l);
  if (!writable) {
    /* Usually done already, by image_close_writes. */
    if (l->write_started && (r = state_close (l)) < 0)
      io_mark_dirty (l);
    image_end_writes (l);
  }
  e = image_reopen_io (l, writable);
  if (writable && e == 0 && (e = image_begin_writes (l)) < 0) {
    image_end_writes (l);
    image_reopen_io (l, false);
  }
  image_unlock (l);
  image_data_unlock (l);
  return r < 0 ? r : e;
}

bool
qcow2_can_trim (const struct qcow2_image *img)
{
  return qcow2_can_write (img) && img->discard;
}

uint64_t
qcow2_host_flushes (struct qcow2_image *img)
{
  uint64_t n;

  image_lock (img);
  n = img->host.flushes;
  image_unlock (img);
  return n;
}

uint64_t
qcow2_get_size (const struct qcow2_image *img)
{
  return img->size;
}

bool
qcow2_chain_encrypted (const struct qcow2_image *img)
{
  for (; img; img = img->backing)
    if (img->luks)
      return true;
  return false;
}

int
qcow2_read (struct qcow2_image *img, void *buf, uint64_t count,
            uint64_t offset)
{
  int r;

  if (range_exceeds (offset, count, img->size)) {
    log_error (img, "read of %" PRIu64 " bytes at %" PRIu64 " is beyond "
               "the virtual size %" PRIu64, count, offset, img->size);
    return -EINVAL;
  }
  image_data_rdlock (img);
  /* As QEMU's copy-on-read, a fill that fails fails the read. */
  r = img->copy_on_read ? fill_range (img, offset, count) : 0;
  if (r == 0)
    r = layer_read (img, buf, count, offset);
  image_data_unlock (img);
  return r;
}

int
qcow2_extents (struct qcow2_image *img, uint64_t offset, uint64_t count,
               bool req_one, qcow2_extent_fn add, void *opaque)
{
  if (range_exceeds (offset, count, img->size)) {
    log_error (img, "extents of %" PRIu64 " bytes at %" PRIu64 " are "
               "beyond the virtual size %" PRIu64, count, offset, img->size);
    return -EINVAL;
  }
  image_data_rdlock (img);
  int r = layer_extents (img, offset, count, req_one, add, opaque);
  image_data_unlock (img);
  return r;
}

void
qcow2_cache_stats (struct qcow2_image *img, struct qcow2_cache_stats *stats)
{
  image_lock (img);
  cache_stats (img->caches.l2, stats);
  image_unlock (img);
}

int
qcow2_check (struct qcow2_image *img, bool fix_leaks,
             struct qcow2_check_result *res)
{
  int r;

  memset (res, 0, sizeof *res);
  if (img->raw)
    return 0;
  if (fix_leaks && (r = qcow2_check_writable (img)) < 0)
    return r;
  image_data_wrlock (img);
  image_lock (img);
  /* An image left dirty gets its refcounts rebuilt first (and a
   * rebuild leaves no leak).
   */
  r = fix_leaks ? state_begin_write (img) : 0;
  if (r == 0)
    r = check_run (img, fix_leaks, res);
  image_unlock (img);
  image_data_unlock (img);
  return r;
}
