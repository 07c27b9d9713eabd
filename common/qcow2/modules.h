/* SPDX-License-Identifier: BSD-3-Clause */
/* The qcow2 engine: what each of its files gives the others, grouped
 * under the file that defines it (internal.h holds the state of an
 * image and its lock contract, and includes this at its end: include
 * internal.h).  Not part of the engine's interface.
 */
#ifndef QCOW2_MODULES_H
#define QCOW2_MODULES_H

#ifndef QCOW2_INTERNAL_H
#error "include internal.h, not modules.h"
#endif

/* log.c: errors name the layer's file; notices are what the user must
 * hear that is not an error; debug messages are for -v.  A message is
 * one line; a remedy may follow it after a newline: it is sent as a
 * hint, on its own.
 */
extern void log_error (const struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
extern void log_notice (const struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
extern void log_debug (const struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
extern void env_err (const struct qcow2_env *env, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
/* As log_error and log_debug, for a file that is not an image. */
extern void log_named_error (const struct qcow2_env *env, const char *name,
                             const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));
extern void log_named_debug (const struct qcow2_env *env, const char *name,
                             const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));

/* image.c */
extern struct qcow2_image *image_open_layer (const struct qcow2_env *env,
                                             struct qcow2_io *io,
                                             const char *path, char *id,
                                             const char *format,
                                             const struct qcow2_options *opts,
                                             const char **chain,
                                             unsigned depth);
/* Free a layer and those below it (no flush: for layers never written,
 * or already flushed).
 */
extern void image_free (struct qcow2_image *img);
/* The layer below img (a local qcow2 file) opened again in place, for
 * writing (a commit into it) or read-only again, its old file closed
 * first (its image locks would refuse the new one): 0, or -errno with
 * the layer read-only again (if even that fails, its reads fail).
 * Back to read-only, what it wrote is made durable and its state clean
 * first.  No request may read the layer meanwhile: img's data_lock is
 * held exclusively.
 */
extern int image_reopen_below (struct qcow2_image *img, bool writable)
  TSA_REQUIRES (img->data_lock);
/* A layer reopened for writing made durable and clean (its dirty bit
 * cleared, its bitmaps stored), as a clean close leaves an image: 0 or
 * -errno.  Before image_reopen_below makes it read-only, so that the
 * image above need not be held off meanwhile.
 */
extern int image_close_writes (struct qcow2_image *l)
  TSA_EXCLUDES (l->lock, l->data_lock);

/* luks.c: the data cipher. */
/* Encrypt or decrypt data in place, from sector on. */
extern void luks_encrypt (const struct luks_key *key, uint64_t sector,
                          uint8_t *buf, size_t len);
extern void luks_decrypt (const struct luks_key *key, uint64_t sector,
                          uint8_t *buf, size_t len);

/* luks-header.c: LUKS1 headers. */
/* Where a LUKS header lies: length bytes at offset in io, in the file
 * named name (for messages).  As QEMU's and nbdkit's LUKS code,
 * luks-header.c knows no container format.
 */
struct luks_area {
  const struct qcow2_env *env;
  const char *name;
  bool below;                   /* a backing layer's (see image.below) */
  struct qcow2_io *io;
  uint64_t offset, length;
};
/* pw: NULL if the layer has none. */
extern int luks_open (const struct luks_area *where,
                      const struct qcow2_password *pw, uint32_t max_iters,
                      struct luks_key **key);
extern void luks_close (struct luks_key *key);
/* The bytes the header and its key slots take (*len), or an error. */
extern int luks_format_check (const struct qcow2_env *env,
                              const struct qcow2_luks_options *o,
                              uint64_t *len);
/* Write a new header with key slot 0 for o->password into area. */
extern int luks_format (const struct qcow2_env *env,
                        const struct qcow2_luks_options *o, uint8_t *area,
                        uint64_t len);

/* cryptio.c */
extern struct qcow2_io *crypt_io_new (struct qcow2_io *below,
                                      const struct luks_key *key);

/* header.c */
extern int header_read (struct qcow2_image *img);
extern void header_free (struct qcow2_header *h);

/* cache.c */
enum cache_kind { CACHE_L2, CACHE_REFCOUNT };
extern struct meta_cache *cache_create (enum cache_kind kind,
                                        uint64_t entry_size,
                                        uint64_t entries);
extern struct meta_cache *cache_create_growing (enum cache_kind kind,
                                                uint64_t entry_size,
                                                uint64_t first,
                                                uint64_t max);
extern void cache_destroy (struct meta_cache *c);
extern int cache_setup_refcount (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern void cache_replace_refcount (struct qcow2_image *img,
                                    struct meta_cache *c)
  TSA_REQUIRES (img->lock);
extern int cache_get (struct qcow2_image *img, struct meta_cache *c,
                      uint64_t host_offset, uint8_t **data)
  TSA_REQUIRES (img->lock);
extern int cache_get_new (struct qcow2_image *img, struct meta_cache *c,
                          uint64_t host_offset, uint8_t **data)
  TSA_REQUIRES (img->lock);
extern int cache_get_may_unlock (struct qcow2_image *img, struct meta_cache *c,
                                 uint64_t host_offset, uint8_t **data,
                                 bool *released)
  TSA_REQUIRES (img->lock);
extern void cache_mark_dirty (struct qcow2_image *img, struct meta_cache *c,
                              const uint8_t *data)
  TSA_REQUIRES (img->lock);
extern int cache_writeback (struct qcow2_image *img, struct meta_cache *c)
  TSA_REQUIRES (img->lock);
extern void cache_forget (struct meta_cache *c, uint64_t offset,
                          uint64_t len);
extern uint32_t cache_entries (const struct meta_cache *c);
extern uint64_t cache_entry_size (const struct meta_cache *c);
extern void cache_stats (const struct meta_cache *c,
                         struct qcow2_cache_stats *stats);
extern int cache_setup (struct qcow2_image *img,
                        const struct qcow2_options *opts)
  TSA_REQUIRES (img->lock);

/* cluster.c */
extern int l1_load (struct qcow2_image *img, uint64_t offset, uint32_t size,
                    const char *what)
  TSA_REQUIRES (img->lock);
extern int cluster_map (struct qcow2_image *img, uint64_t offset,
                        uint64_t max_len, struct qcow2_run *run)
  TSA_REQUIRES (img->lock);
extern int cluster_map_may_unlock (struct qcow2_image *img, uint64_t offset,
                                   uint64_t max_len, struct qcow2_run *run)
  TSA_REQUIRES (img->lock);
extern int cluster_check_data_offset (struct qcow2_image *img,
                                      uint64_t host_offset, uint64_t len)
  TSA_REQUIRES (img->lock);
extern int cluster_l2_slice (struct qcow2_image *img, uint64_t offset,
                             uint8_t **slice, uint64_t *index)
  TSA_REQUIRES (img->lock);
extern int cluster_l2_slice_writable (struct qcow2_image *img,
                                      uint64_t offset, uint8_t **slice,
                                      uint64_t *index)
  TSA_REQUIRES (img->lock);

/* compress.c: bytes [in_cluster, in_cluster+len) of the compressed
 * cluster described by comp_offset and comp_size, into buf.
 */
extern int compress_read (struct qcow2_image *img, uint64_t comp_offset,
                          uint64_t comp_size, uint64_t in_cluster,
                          uint64_t len, uint8_t *buf);
/* Compress one cluster with the image's compression type: its length,
 * the bytes in *out (this thread's, until its next call), or -ENOSPC
 * if it does not come out smaller than a cluster.
 */
extern ssize_t compress_cluster (const struct qcow2_image *img,
                                 const uint8_t *cluster,
                                 const uint8_t **out);

/* backing.c */
extern int backing_open (struct qcow2_image *img,
                         const struct qcow2_options *opts,
                         const char **chain, unsigned depth);
extern int backing_attach_io (struct qcow2_image *img,
                              const struct qcow2_options *opts);
extern int data_file_open (struct qcow2_image *img,
                           const struct qcow2_options *opts);
/* Whether a layer's storage is a local file (not remote, not a window
 * of one).
 */
extern bool backing_is_local (const struct qcow2_image *layer);
/* The local file of a layer opened again, for writing or read-only,
 * checked to be the same file: NULL with errno, the reason logged.
 */
extern struct qcow2_io *backing_reopen (const struct qcow2_image *layer,
                                        bool writable);

/* snapshot.c */
extern int snapshot_read_table (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern int snapshot_select (struct qcow2_image *img, const char *which)
  TSA_REQUIRES (img->lock);
extern void snapshot_free_table (struct qcow2_image *img);

/* refcount.c */
extern int refcount_load_table (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern uint64_t refcount_entry_get (const uint8_t *block, uint32_t order,
                                    uint64_t index);
extern void refcount_entry_set (uint8_t *block, uint32_t order,
                                uint64_t index, uint64_t value);
extern int refcount_read (struct qcow2_image *img, uint64_t cluster,
                          uint64_t *refcount)
  TSA_REQUIRES (img->lock);
extern int refcount_switch_table (struct qcow2_image *img,
                                  const uint8_t *area, uint64_t clusters,
                                  uint64_t start, uint64_t *table,
                                  uint64_t entries, uint64_t table_clusters,
                                  const char *what)
  TSA_REQUIRES (img->lock);
extern int refcount_detect_metadata_prealloc (struct qcow2_image *img,
                                              bool *prealloc)
  TSA_REQUIRES (img->lock);
extern int refcount_update (struct qcow2_image *img, uint64_t cluster,
                            int64_t delta, uint64_t *result)
  TSA_REQUIRES (img->lock);
extern int refcount_new_block (struct qcow2_image *img, uint64_t idx)
  TSA_REQUIRES (img->lock);

/* alloc.c */
/* len bytes (at most a cluster) for a compressed cluster, at *host,
 * packed after the previous one; each cluster they touch gains a
 * reference.
 */
extern int alloc_bytes (struct qcow2_image *img, uint64_t len,
                        uint64_t *host)
  TSA_REQUIRES (img->lock);
extern void alloc_bytes_unused (struct qcow2_image *img, uint64_t host,
                                uint64_t len)
  TSA_REQUIRES (img->lock);
extern int alloc_clusters (struct qcow2_image *img, uint64_t n,
                           uint64_t *host_offset, bool *zeroed)
  TSA_REQUIRES (img->lock);
extern int alloc_clusters_upto (struct qcow2_image *img, uint64_t n,
                                uint64_t max, uint64_t *host_offset,
                                uint64_t *len, bool *zeroed)
  TSA_REQUIRES (img->lock);
extern void alloc_clusters_unused (struct qcow2_image *img,
                                   uint64_t host_offset, uint64_t n)
  TSA_REQUIRES (img->lock);
extern int alloc_free_later (struct qcow2_image *img, uint64_t host_offset,
                             uint64_t bytes)
  TSA_REQUIRES (img->lock);
extern void alloc_released (struct qcow2_image *img, uint64_t c,
                            uint64_t n)
  TSA_REQUIRES (img->lock);
extern int alloc_apply_frees (struct qcow2_image *img, size_t n)
  TSA_REQUIRES (img->lock);
extern void alloc_frees_durable (struct qcow2_image *img, size_t queued)
  TSA_REQUIRES (img->lock);
extern void alloc_begin_close (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern void alloc_forget_hint (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern int alloc_grow_reftable (struct qcow2_image *img,
                                uint64_t min_entries)
  TSA_REQUIRES (img->lock);
extern int alloc_refill_reserve (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern void alloc_reserve_durable (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern int alloc_release_reserve (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern void alloc_free_reserve (struct qcow2_image *img);
extern uint64_t alloc_reserve_end (const struct qcow2_image *img)
  TSA_REQUIRES (img->lock);

/* write-alloc.c: allocating writes, and what zero.c, fill.c and
 * stream.c share of them.
 *
 * A guest range claimed by a request working on it with img->lock
 * released (see write-alloc.c): whether one overlaps a range, and the
 * one way to claim (write_claim_may_unlock), which fill.c and stream.c
 * share.
 */
struct write_inflight {
  uint64_t start, end;
  struct write_inflight *next;
};
extern bool write_inflight_overlaps (struct qcow2_image *img, uint64_t start,
                                     uint64_t end)
  TSA_REQUIRES (img->lock);
extern int write_claim_may_unlock (struct qcow2_image *img, uint64_t start,
                                   uint64_t end,
                                   int (*io) (struct qcow2_image *img,
                                              void *opaque),
                                   void *opaque)
  TSA_REQUIRES (img->lock);
extern uint64_t write_unit_mask (const struct qcow2_image *img,
                                 uint64_t start, uint64_t end);
extern int write_reads_zero (struct qcow2_image *img, uint64_t offset,
                             uint64_t len, bool *zero)
  TSA_REQUIRES (img->lock);
extern int write_shows_zero (struct qcow2_image *img, uint64_t offset,
                             uint64_t len, bool *zero)
  TSA_REQUIRES (img->lock);
extern int write_release_old (struct qcow2_image *img,
                              const struct l2_state *s, uint64_t fresh,
                              uint64_t fresh_len)
  TSA_REQUIRES (img->lock);
/* A data cluster's host offset, checked before a write into it. */
extern int write_alloc_check_host (struct qcow2_image *img, uint64_t host,
                                   uint64_t guest)
  TSA_REQUIRES (img->lock);
extern int write_allocating (struct qcow2_image *img, const uint8_t *data,
                             uint64_t offset, uint64_t len)
  TSA_REQUIRES (img->lock);
extern int write_allocating_may_unlock (struct qcow2_image *img,
                                        const uint8_t *data,
                                        uint64_t offset, uint64_t len)
  TSA_REQUIRES (img->lock);
/* Whole clusters of a request that write.c cannot write in place. */
extern int write_alloc_run_may_unlock (struct qcow2_image *img,
                                       const uint8_t *data, uint64_t offset,
                                       uint64_t count, uint64_t *done)
  TSA_REQUIRES (img->lock);
extern int write_alloc_compressed_may_unlock (struct qcow2_image *img,
                                              const uint8_t *data,
                                              uint64_t offset,
                                              uint64_t *done)
  TSA_REQUIRES (img->lock);

/* write.c: the request loop of writes, zeroes and trims (see
 * write_request), and what zero.c shares of the write path.
 */
struct write_request {
  uint64_t offset, count;       /* done piece by piece */
  bool record;                  /* in the persistent bitmaps */
  bool fua;                     /* flushed once done */
  /* The length of the piece at offset (count left), which the piece
   * waits for in-flight writes of.
   */
  uint64_t (*piece_len) (struct qcow2_image *img, uint64_t offset,
                         uint64_t count);
  /* Do the piece, called with img->lock held, returning with it
   * released (TSA_RELEASE: the analysis does not follow the pointer,
   * write_request says it with image_released); *n is its length,
   * which it may make longer (a run).
   */
  int (*piece_unlocks) (struct qcow2_image *img,
                        const struct write_request *req,
                        uint64_t offset, uint64_t count, uint64_t *n);
  const void *opaque;           /* the piece's own */
};
extern int write_request (struct qcow2_image *img,
                          const struct write_request *req)
  TSA_EXCLUDES (img->lock, img->data_lock);
extern int write_check (struct qcow2_image *img, uint64_t count,
                        uint64_t offset);
extern int write_in_place_target (struct qcow2_image *img, uint64_t offset,
                                  uint64_t len, uint64_t *host)
  TSA_REQUIRES (img->lock);

/* fill.c: copy-on-read of what [offset, offset+count) touches, with
 * data_lock held shared.
 */
extern int fill_range (struct qcow2_image *img, uint64_t offset,
                       uint64_t count)
  TSA_EXCLUDES (img->lock) TSA_REQUIRES_SHARED (img->data_lock);

/* hostio.c */
extern int io_write_meta (struct qcow2_image *img, const void *buf,
                          uint64_t len, uint64_t offset, const char *what,
                          uint32_t may_touch)
  TSA_REQUIRES (img->lock);
extern int io_flush (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern void io_note_end (struct qcow2_image *img, uint64_t end)
  TSA_REQUIRES (img->lock);
extern void io_note_written (struct qcow2_image *img, uint64_t end)
  TSA_REQUIRES (img->lock);
extern void io_extend (struct qcow2_image *img, uint64_t end)
  TSA_REQUIRES (img->lock);
extern int io_check_data (struct qcow2_image *img, uint64_t len,
                          uint64_t offset)
  TSA_REQUIRES (img->lock);
extern int io_write_data (struct qcow2_image *img, const void *buf,
                          uint64_t len, uint64_t offset)
  TSA_REQUIRES (img->lock);
extern int io_data_error (struct qcow2_image *img, uint64_t len,
                          uint64_t offset, int r);
extern int io_write_checked (struct qcow2_image *img, const void *buf,
                             uint64_t len, uint64_t offset);
extern int io_write_features (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern void io_mark_dirty (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
/* A corruption found: in an image opened for writing, the image
 * marked corrupt on disk (written and flushed) as QEMU's
 * qcow2_signal_corruption marks it, so that nothing writes it again
 * until it is repaired; then logged ("corrupt image: ...").  Returns
 * -EIO.
 */
extern int io_corrupt (struct qcow2_image *img, const char *fmt, ...)
  TSA_REQUIRES (img->lock) __attribute__ ((format (printf, 2, 3)));

/* flush.c: the marks of what the next flush must write, inline (they
 * are single stores into img->dirty, made from every writing file).
 */
/* Grow the dirty range [*lo, *hi) of a table to cover index. */
static inline void
flush_mark_range (struct qcow2_image *img, uint64_t *lo, uint64_t *hi,
                  uint64_t index)
{
  if (*lo == *hi) {
    *lo = index;
    *hi = index + 1;
  }
  else {
    *lo = MIN (*lo, index);
    *hi = MAX (*hi, index + 1);
  }
  img->dirty.changed = true;
}

/* Something changed that the next flush must make durable. */
static inline void
flush_mark_changed (struct qcow2_image *img)
{
  img->dirty.changed = true;
}

/* Dirty L2 or L1 entries now point at clusters whose refcount or
 * contents are not durable yet: those are synced before the entries
 * are written.
 */
static inline void
flush_mark_dependency (struct qcow2_image *img)
{
  img->dirty.l2_needs_sync_first = true;
}

/* The whole refcount table was just written (a new one). */
static inline void
flush_forget_reftable (struct qcow2_image *img)
{
  img->dirty.rt_lo = img->dirty.rt_hi = 0;
}

static inline void
flush_mark_l1_dirty (struct qcow2_image *img, uint32_t index)
{
  flush_mark_range (img, &img->dirty.l1_lo, &img->dirty.l1_hi, index);
}

static inline void
flush_mark_reftable_dirty (struct qcow2_image *img, uint64_t index)
{
  flush_mark_range (img, &img->dirty.rt_lo, &img->dirty.rt_hi, index);
}

/* flush.c */
extern int flush_l2_dependencies (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern int flush_locked (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);

/* names.c: the names QEMU gives files, parsed (json: names by json.c,
 * all of them through name_parse in resolve.c).
 */
struct name_spec {
  char *path;                   /* a local file, or NULL if remote */
  char *url;                    /* else remote storage: remote.url */
  struct qcow2_remote remote;
  char *cookie;                 /* remote.cookie's storage */
  char *ssh;                    /* remote.ssh's strings' storage */
  const char *format;           /* json's format driver (raw, qcow2) */
  bool no_backing;              /* json's "backing": null */
  /* json's raw offset and size: a window of the storage. */
  bool raw_window, raw_size_set;
  uint64_t raw_offset, raw_size;
};
extern int name_fail (char **why, int err, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));
extern bool name_is_protocol (const char *name);
extern char *name_url_escape (const char *s, bool query);
extern const char *name_url_driver (const char *url);
extern char *name_url_dup (const char *url);
extern int name_nbd_url (struct name_spec *spec, const char *host,
                         const char *port, const char *path,
                         const char *export, char **why);
extern int name_parse_ssh (struct name_spec *spec, char **why);
extern int name_parse_plain (const char *name, struct name_spec *spec,
                             char **why);
extern void name_spec_free (struct name_spec *spec);

/* json.c: a "json:{...}" name. */
extern int json_parse_name (const char *name, struct name_spec *spec,
                            char **why);

/* resolve.c */
/* 0, or -EINVAL (a bad name) or -ENOTSUP (one we do not open) with
 * *why a malloc'd message (NULL when out of memory).
 */
extern int name_parse (const char *name, struct name_spec *spec,
                       char **why);
/* name, named by the image named naming, resolved as QEMU resolves it
 * (malloc'd), or NULL with *why malloc'd (or NULL: out of memory).
 */
extern char *name_resolve (const char *naming, const char *name,
                           char **why);

/* window.c: a window of storage (json: raw offset= and size=), owning
 * below; NULL with errno on failure.
 */
extern struct qcow2_io *window_io_new (struct qcow2_io *below,
                                       uint64_t offset, uint64_t size);

/* layers.c: backing layers shared through env->layers (qcow2.h).  A
 * layer's users are counted (every layer's: a layer no table shares
 * has one, the image above it); the table's lock guards its entries
 * and the count of a shared layer falling to 0, never held with an
 * image's lock.
 */
/* The environment of the layers below an image opened with env. */
extern const struct qcow2_env *layers_env (const struct qcow2_env *env);
/* The layer opened as id with format (NULL: probed) and no_backing,
 * one more user counted, in *layer: 0, or -EBUSY if id is open for
 * writing.  None yet (*layer NULL): with wait (the caller opens a top
 * image's backing file), a layer another is opening is waited for, and
 * if none is, 1: the caller is the one opening it, and ends with
 * layers_add, then layers_abandon in any case.  Without wait, or after
 * an opening waited for failed, 0: the caller opens its own.
 */
extern int layers_find (struct qcow2_layers *t, const char *id,
                        const char *format, bool no_backing, bool wait,
                        struct qcow2_image **layer);
/* *layer, just opened (and not yet used), shared from now on: 0; 1 if
 * another opened the same meanwhile, *layer then that one (a user
 * counted) and the caller frees its own; -EBUSY if its id is open for
 * writing, -ENOMEM.
 */
extern int layers_add (struct qcow2_layers *t, const char *format,
                       bool no_backing, struct qcow2_image **layer);
/* The opening layers_find gave the caller is over: if layers_add did
 * not end it (failed, or the layer's id is not the one found by), the
 * images waiting for it open their own.
 */
extern void layers_abandon (struct qcow2_layers *t, const char *id,
                            const char *format, bool no_backing);
/* One more user of a layer the caller holds (through its chain). */
extern void layers_hold (struct qcow2_image *layer);
/* One user less: true if it was the last, the caller then frees it. */
extern bool layers_release (struct qcow2_image *layer);
/* The image id opened for writing: 0, or -EBUSY if a layer of the
 * table (or another writer) is id; layers_unclaim when it is closed.
 */
extern int layers_claim (struct qcow2_layers *t, const char *id);
extern void layers_unclaim (struct qcow2_layers *t, const char *id);
/* The layer becomes open for writing in place (a commit into it): 0,
 * or -EBUSY if another image stands on it (or has its file as a layer
 * of its own).  The table then knows it as open for writing, so that
 * no image opens it as a layer; *shared says whether it was one of the
 * table's, for layers_write_end, which makes it again what it was.
 */
extern int layers_write_begin (struct qcow2_image *layer, bool *shared);
extern void layers_write_end (struct qcow2_image *layer, bool shared);

/* state.c */
/* What writing needs that reading does not, the refcount table and
 * the overlap guard's map, made at the first write (state_begin_write)
 * rather than at open: an image opened writable and only read (a VM
 * booting) never reads or maps them.  Then a no-op.
 */
extern int state_prepare_writes (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern int state_begin_write (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern int state_close (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);

/* overlap.c: the guard's policy, over the map of overlap-map.h. */
#define OL(bit) (UINT32_C (1) << QCOW2_OL_##bit##_BIT)
extern const char *overlap_name (unsigned bit);
extern int overlap_add (struct qcow2_image *img, uint64_t offset,
                        uint64_t len, unsigned bit)
  TSA_REQUIRES (img->lock);
extern int overlap_remove (struct qcow2_image *img, uint64_t offset,
                           uint64_t len)
  TSA_REQUIRES (img->lock);
extern int overlap_add_found (struct qcow2_image *img, uint64_t offset,
                              uint64_t len, unsigned bit)
  TSA_REQUIRES (img->lock);
/* What a write the guard refused would have overwritten. */
struct overlap_hit {
  unsigned bit;                 /* the structure's QCOW2_OL_*_BIT */
  uint64_t at;                  /* its cluster's host offset */
};
extern int overlap_check (struct qcow2_image *img, uint64_t offset,
                          uint64_t len, uint32_t ign, struct overlap_hit *hit)
  TSA_REQUIRES (img->lock);
extern int overlap_build (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern int overlap_move_reftable (struct qcow2_image *img,
                                  uint64_t old_offset, uint64_t old_clusters)
  TSA_REQUIRES (img->lock);

/* pool.c: reads or writes of one request's pieces by a pool of
 * threads.  The requester fills pieces and n, calls pool_start, may do
 * other work, then pool_finish, which returns once every piece is done
 * (each with its result in r).  Without a pool (p NULL), pool_finish
 * does the pieces in turn.
 */
struct pool_piece {
  struct qcow2_io *io;
  void *buf;
  size_t len;
  uint64_t offset;
  bool write;                   /* pwrite buf, else pread into it */
  /* Merged pieces (pool_merge): iovcnt buffers in file order, instead
   * of buf; len is their total.
   */
  const struct iovec *iov;
  int iovcnt;
  /* Grouped pieces (pool_group): one pread_many of io, instead of buf;
   * a failed one's offset and len are copied to the piece's.
   */
  struct qcow2_io_read *reads;
  size_t nreads;
  /* Or, instead of io: fn does the piece (a backing layer's read). */
  int (*fn) (struct pool_piece *piece);
  void *arg;
  int r;
};
struct pool_batch {
  struct pool_piece *pieces;
  size_t n;
  /* Private to pool.c. */
  size_t taken, done;
  pthread_cond_t finished;
  struct pool_batch *prev, *next;
};
extern struct io_pool *pool_get (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern size_t pool_merge (struct pool_piece *pieces, size_t n,
                          struct iovec *iov);
extern size_t pool_group (struct pool_piece *pieces, size_t n,
                          struct qcow2_io_read *reads);
extern void pool_destroy (struct io_pool *p);
extern void pool_start (struct io_pool *p, struct pool_batch *b);
extern void pool_finish (struct io_pool *p, struct pool_batch *b);

/* bitmap.c */
extern int bitmap_read_directory (struct qcow2_image *img, uint8_t **dir,
                                  struct bitmap_entry **entries)
  TSA_REQUIRES (img->lock);
extern int bitmap_open (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern void bitmap_free (struct qcow2_image *img);
extern void bitmap_record (struct qcow2_image *img, uint64_t offset,
                           uint64_t len);
extern int bitmap_begin_write (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern int bitmap_store (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);

/* check.c */
extern int check_rebuild_refcounts (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);
extern int check_run (struct qcow2_image *img, bool fix_leaks,
                      struct qcow2_check_result *res)
  TSA_REQUIRES (img->lock, img->data_lock);

/* read.c */
extern int layer_read (struct qcow2_image *img, uint8_t *buf, uint64_t count,
                       uint64_t offset)
  TSA_EXCLUDES (img->lock);
extern int read_locked (struct qcow2_image *img, uint8_t *buf, uint64_t count,
                        uint64_t offset)
  TSA_REQUIRES (img->lock);
/* With or without img->lock: it takes the backing layer's. */
extern int read_backing (struct qcow2_image *img, uint8_t *buf,
                         uint64_t count, uint64_t offset);

/* kept.c: what the read-ahead keeps of a layer (its owner's lock
 * guards it): up to limit bytes (by default KEPT_BYTES) in KEPT_PIECES
 * pieces.
 */
#define KEPT_BYTES (UINT64_C (32) << 20)
#define KEPT_PIECES 4096
struct kept_piece {
  uint64_t start, len;          /* of the layer */
  uint64_t alloc;               /* bytes of buf */
  uint64_t used;                /* kept_set.clock when last read */
  uint8_t *buf, *data;          /* data: the byte at start, in buf */
};
struct kept_set {
  struct kept_piece *p;         /* sorted by start, none overlapping */
  size_t n, cap;
  uint64_t bytes;               /* of the buffers */
  uint64_t limit;               /* of bytes */
  uint64_t clock;
};
extern void kept_free (struct kept_set *k);
/* Copies what pieces hold of [offset, end) into buf (at offset);
 * returns how many bytes that is, and the span of the rest in
 * [*gap_start, *gap_end).
 */
extern uint64_t kept_copy (struct kept_set *k, uint8_t *buf, uint64_t offset,
                           uint64_t end, uint64_t *gap_start,
                           uint64_t *gap_end);
/* Returns where the first piece holding bytes at or past offset
 * begins (offset if one holds it; UINT64_MAX if none).
 */
extern uint64_t kept_next (const struct kept_set *k, uint64_t offset);
/* Keeps buf, len bytes of the layer from start (taking it over). */
extern void kept_add (struct kept_set *k, uint8_t *buf, uint64_t start,
                      uint64_t len);

/* readahead.c: the read-ahead of a backing layer on remote storage
 * (its lock taken with no lock of that layer held), reading the layer
 * with fetch.
 */
struct readahead;
typedef int (*readahead_fetch) (struct qcow2_image *layer, uint8_t *buf,
                                uint64_t count, uint64_t offset);
extern struct readahead *readahead_new (struct qcow2_image *layer,
                                        readahead_fetch fetch,
                                        uint64_t keep);
extern void readahead_free (struct readahead *ra);
extern int readahead_read (struct readahead *ra, uint8_t *buf,
                           uint64_t count, uint64_t offset);
extern bool readahead_copy (struct readahead *ra, uint8_t *buf,
                            uint64_t count, uint64_t offset);
extern void readahead_note (struct readahead *ra, uint64_t end,
                            uint64_t count);

/* stream-detach.c: the end of a stream, the image cut loose from the
 * layers above base (NULL: from all of them).
 */
extern int stream_detach (struct qcow2_image *img, struct qcow2_image *base)
  TSA_EXCLUDES (img->lock, img->data_lock);

/* commit.c: the clusters of an image changed while a commit job copies
 * it into its backing file, one bit per cluster (of 1 << bits bytes).
 * Bits are set by writers and cleared by the job before it copies, all
 * atomically: a write marks its clusters once done, so a job that
 * clears a bit before reading the cluster either reads the new data or
 * finds the bit set again.
 */
struct commit_map {
  uint64_t *words;
  uint64_t clusters;
  unsigned bits;
  struct qcow2_commit *job;     /* whose map it is */
};

/* Mark clusters [first, end) of the map (set), or clear them. */
static inline void
commit_map_change (struct commit_map *m, uint64_t first, uint64_t end,
                   bool set)
{
  while (first < end) {
    uint64_t lo = first % 64, n = MIN (64 - lo, end - first);
    uint64_t mask = (n == 64 ? ~UINT64_C (0) : (UINT64_C (1) << n) - 1) << lo;

    if (set)
      __atomic_fetch_or (&m->words[first / 64], mask, __ATOMIC_SEQ_CST);
    else
      __atomic_fetch_and (&m->words[first / 64], ~mask, __ATOMIC_SEQ_CST);
    first += n;
  }
}

/* commit-map.c */
/* The first marked cluster in [from, end), and the marked ones
 * following it there, at most max in all: [*first, *first + *n),
 * cleared.  false if none is marked there.
 */
extern bool commit_map_take (struct commit_map *m, uint64_t from,
                             uint64_t end, uint64_t max, uint64_t *first,
                             uint64_t *n);
/* How many clusters are marked. */
extern uint64_t commit_map_count (struct commit_map *m);

/* Guest [offset, offset+len) of img changed: marked for the commit job,
 * if one runs (a load and nothing more when none does).  Called once
 * the change is done, holding img's data_lock shared, which the job
 * takes exclusively before it frees the map.
 */
static inline void
commit_note_change (struct qcow2_image *img, uint64_t offset, uint64_t len)
  TSA_REQUIRES_SHARED (img->data_lock)
{
  struct commit_map *m = __atomic_load_n (&img->commit_map, __ATOMIC_ACQUIRE);

  if (m && len > 0)
    commit_map_change (m, offset >> m->bits,
                       ((offset + len - 1) >> m->bits) + 1, true);
}

/* A client's write of [offset, offset+count) of img ended (its locks
 * released): while a commit job runs, what it marked is copied into
 * the base at once (commit.c).
 */
extern void commit_help (struct qcow2_image *img, uint64_t offset,
                         uint64_t count)
  TSA_EXCLUDES (img->lock, img->data_lock);

/* extents.c */
extern int layer_extents (struct qcow2_image *img, uint64_t offset,
                          uint64_t count, bool req_one,
                          qcow2_extent_fn add, void *opaque)
  TSA_EXCLUDES (img->lock);

#endif /* QCOW2_MODULES_H */
