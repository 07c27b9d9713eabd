/* SPDX-License-Identifier: BSD-3-Clause */
/* The qcow2 engine: state and functions shared between its modules.
 * Not part of the engine's interface.  README lists the files from the
 * bottom up; each calls only files above it, but in three circles,
 * each inherent in what the files do:
 *
 *  - image.c <-> backing.c: a backing file is an image, opened as one;
 *  - cache.c <-> flush.c: evicting a dirty L2 slice first makes what it
 *    points at durable, and a flush writes the caches back;
 *  - alloc.c <-> refcount.c: allocating updates refcounts, and a new
 *    refcount block (or table) is itself allocated.
 *
 * The declarations are grouped under the file that defines them.
 */
#ifndef QCOW2_INTERNAL_H
#define QCOW2_INTERNAL_H

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "qcow2.h"
#include "checked.h"
#include "cleanup.h"
#include "io.h"
#include "format.h"
#include "overlap-map.h"
#include "tsa.h"

/* Built with AddressSanitizer (gcc says so one way, clang another). */
#if defined (__SANITIZE_ADDRESS__)
#define QCOW2_ASAN 1
#elif defined (__has_feature)
#if __has_feature (address_sanitizer)
#define QCOW2_ASAN 1
#endif
#endif

/* The header as read from disk, fields in host order. */
struct qcow2_header {
  uint32_t version;
  uint64_t backing_file_offset;
  uint32_t backing_file_size;
  uint32_t cluster_bits;
  uint64_t size;
  uint32_t crypt_method;
  uint32_t l1_size;
  uint64_t l1_table_offset;
  uint64_t refcount_table_offset;
  uint32_t refcount_table_clusters;
  uint32_t nb_snapshots;
  uint64_t snapshots_offset;
  uint64_t incompatible_features;
  uint64_t compatible_features;
  uint64_t autoclear_features;
  uint32_t refcount_order;
  uint32_t header_length;
  uint8_t compression_type;

  /* From the header extensions and the backing file name field. */
  char *backing_file;
  char *backing_format;
  char *data_file;
  /* Where the backing format extension starts (0: none), and where the
   * extensions (with their end mark) and the backing name end: a
   * stream's detach (stream.c) rewrites them.
   */
  uint64_t backing_format_ext, names_end;
  bool has_bitmaps_ext;
  uint32_t nb_bitmaps;
  uint64_t bitmap_directory_size;
  uint64_t bitmap_directory_offset;
  uint64_t bitmaps_field_offset;        /* where that offset is stored */
  bool has_crypto_ext;
  uint64_t crypto_offset, crypto_length;        /* the LUKS header */
};

/* One internal snapshot, from the snapshot table. */
struct qcow2_snapshot {
  uint64_t l1_table_offset;
  uint32_t l1_size;
  uint64_t disk_size;
  char *id;
  char *name;
};

/* What a guest range maps to, as found in the L2 tables. */
enum qcow2_run_kind {
  RUN_UNALLOCATED,      /* read from the backing file, or zeros */
  RUN_ZERO,             /* reads as zeros */
  RUN_DATA,             /* host_offset in the data file */
  RUN_COMPRESSED,       /* one compressed cluster */
};

struct qcow2_run {
  enum qcow2_run_kind kind;
  bool copied;                  /* RUN_DATA: refcount is exactly one */
  uint64_t length;              /* guest bytes covered */
  uint64_t host_offset;         /* RUN_DATA: host offset of the first byte */
  uint64_t comp_offset;         /* RUN_COMPRESSED: descriptor */
  uint64_t comp_size;
};

/* A persistent bitmap's entry in the bitmap directory. */
#define BITMAP_ENTRY_FIXED 24
#define BITMAP_MAX_DIR (64u << 20)
#define BITMAP_MAX_COUNT 65535         /* as QEMU's QCOW2_MAX_BITMAPS */
struct bitmap_entry {
  uint64_t pos;                 /* of the entry, in the directory */
  uint64_t table_offset;
  uint32_t table_size;          /* entries */
  uint32_t flags;
  uint8_t type, granularity_bits;
  uint16_t name_size;
  uint32_t extra_size;
  const char *name;             /* name_size bytes, in the directory */
};

struct meta_cache;
struct luks_key;
struct overlap_map;
struct io_pool;
struct qcow2_bitmaps;

/* Runs of clusters [first, end) in ascending order; head is the first
 * run with clusters left, left how many they hold in all.
 */
struct alloc_run {
  uint64_t first, end;
};
struct alloc_runs {
  struct alloc_run *v;
  size_t head, len, cap;
  uint64_t left;
};

/* Parts of struct qcow2_image, each owned by one file: only that file
 * changes them, besides image.c setting them up at open; the others
 * read them under img->lock, and change them through its functions.
 */

/* hostio.c: the file's ends and flushes. */
struct image_host {
  /* The end of what was written to io, and its value at the last
   * flush: the least the file's length may be after a crash.  An L2
   * entry may point at a cluster past durable_end only once a flush has
   * made the cluster's data durable (see write_allocating).
   */
  uint64_t written_end, durable_end;
  uint64_t flushes;             /* host flushes issued (for tests) */
  bool flush_failed;            /* see io_flush_failed */
  /* The corrupt bit was set without img->lock (io_corrupt_nolock):
   * the header is written by the next io_sync_corrupt.  Atomic.
   */
  bool corrupt_unwritten;
  /* io_write_corrupt is writing the mark: the guard refusing that write
   * (another structure claims the header's cluster) ends there.
   */
  bool writing_corrupt;
};

/* cache.c: the metadata caches. */
struct image_caches {
  struct meta_cache *l2;        /* L2 slices */
  struct meta_cache *refcount;  /* refcount blocks */
  bool debug;                   /* -D qcow2.cache=1 */
};

/* flush.c: what the next flush must write, and in which order. */
struct image_dirty {
  bool changed;                 /* something to flush since the last flush */
  /* Dirty L2 entries or L1 entries point at clusters whose refcount or
   * contents are not durable yet: sync those before writing them.
   */
  bool l2_needs_sync_first;
  /* Syncs of those dependencies done so far: an L2 slice last changed
   * before the latest one depends on nothing that is not durable (see
   * cache_write_entry).
   */
  uint32_t dep_syncs;
  uint64_t l1_lo, l1_hi;        /* dirty L1 entries [lo, hi) */
  uint64_t rt_lo, rt_hi;        /* dirty reftable entries [lo, hi) */
};

/* alloc.c: allocation, the reserve, and frees waiting for a flush. */
struct image_alloc {
  uint64_t free_hint;           /* first cluster that may be free */
  /* Clusters counted (refcount 1) but not yet used, as runs in
   * ascending order: cur's refcounts are durable, so allocating from
   * it makes no table depend on an unwritten refcount block; next
   * becomes durable with the flush that is writing it.  Together at
   * most 4 MiB or 64 clusters.
   */
  struct alloc_runs reserve_cur, reserve_next;
  bool reserve_next_durable;
  uint64_t allocated_since_flush;
  bool closing;                 /* no more reserve */
  /* Where the next compressed cluster goes, packed after the last one
   * in a cluster they share (0: start a new cluster).
   */
  uint64_t free_byte_offset;
  uint64_t *pending_free;       /* host offsets to decrement after flush */
  size_t pending_len, pending_cap;
  size_t pending_durable;       /* how many of them a flush made safe */
};

/* img->lock: a mutex that clang's thread-safety analysis knows as a
 * capability (pthread_mutex_t itself cannot be marked).
 */
struct TSA_CAPABILITY ("mutex") image_mutex {
  pthread_mutex_t mutex;
};

/* img->data_lock, the same way: a rwlock, held shared or exclusively. */
struct TSA_CAPABILITY ("rwlock") image_rwlock {
  pthread_rwlock_t rwlock;
};

struct qcow2_image {
  const struct qcow2_env *env;
  char *path;                   /* as given; names resolve against it */
  char *id;                     /* canonical identity, for loop checks */
  struct qcow2_io *io;          /* the image file */
  uint64_t file_size;           /* past every cluster written or taken */
  struct image_host host;       /* hostio.c */

  /* A raw layer (only ever a backing file) has no qcow2 metadata: reads
   * go straight to io, and only size and backing are meaningful.
   */
  bool raw;
  bool below;                   /* a backing layer (not the image served) */
  uint64_t size;                /* virtual size served */

  struct qcow2_header h;
  struct image_geometry geo;    /* header.c */

  struct qcow2_io *data_io;     /* == io unless an external data file */
  bool data_file_raw;
  /* Where guest data is read and written: data_io, or, if the image is
   * encrypted, the layer over it that encrypts (cryptio.c) with luks.
   */
  struct qcow2_io *guest_io;
  struct luks_key *luks;

  uint64_t *l1;                 /* L1 of what is served, in host order */
  uint32_t l1_size;

  struct qcow2_snapshot *snapshots;
  uint32_t nb_snapshots;
  uint64_t snapshot_table_bytes;
  const struct qcow2_snapshot *served_snapshot;   /* NULL = active */

  struct qcow2_image *backing;  /* NULL if none or backing=none */

  uint64_t *reftable;           /* refcount table, in host order */
  uint64_t reftable_size;       /* entries */

  /* preallocation=metadata, detected at the first extents request. */
  bool prealloc_checked;
  bool metadata_prealloc;

  struct image_caches caches;   /* cache.c */

  /* Write state (top image only). */
  bool writable;                /* opened for writing, not a snapshot */
  bool discard;                 /* trim frees clusters (discard=unmap) */
  bool write_started;           /* header prepared for the first write */
  bool compress;                /* compress=: see qcow2_options */
  bool copy_on_read;            /* see qcow2_options; fill.c */
  bool lazy_refcounts;
  struct image_dirty dirty;     /* flush.c */
  struct image_alloc alloc;     /* alloc.c */
  /* Persistent bitmaps kept up to date (bitmap.c), or NULL. */
  struct qcow2_bitmaps *bitmaps;

  /* The overlap guard: structures checked before every write, and the
   * map of where metadata lives (NULL when no mapped structure is
   * checked).
   */
  uint32_t overlap_mask;
  struct overlap_map *overlap;
  bool overlap_conflict;        /* found at open: never write */
  char overlap_conflict_msg[160];

  /* Reading or writing the host runs of one request at once (top
   * image only): io_threads from the options, the pool started at the
   * first request that needs it.
   */
  unsigned io_threads;
  struct io_pool *pool;

  /* A backing layer on remote storage: its read-ahead (read.c), set
   * at open; else NULL.
   */
  struct readahead *readahead;

  /* The lock contract.
   *
   * lock guards everything above but the fields said to be atomic
   * (file_size, h.incompatible_features) and what is fixed at open
   * (geometry, env, io, path, backing): the caches, the tables, the
   * refcounts and allocation, the dirty ranges, the overlap map and the
   * in-flight list below.  It is taken through image_lock and
   * image_unlock, which in debug builds record its holder, so that
   * ASSERT_LOCKED (img) checks it.
   *
   * data_lock is held shared by every request while it reads or writes
   * data at host offsets it looked up; exclusively while freed clusters
   * are released, so that no request still uses a cluster that is
   * reused.  Never taken twice by one thread (it prefers writers, see
   * image_init_data_lock).
   *
   * Order: data_lock, then lock; a backing layer's lock only after the
   * layer above's (reads of the chain go down, never up).  pool.c's
   * lock is taken with none of these held.
   *
   * Naming: internal functions are called with lock held, unless their
   * comment says they take it (the public qcow2_*, layer_read,
   * layer_extents).  "_may_unlock" functions may release and retake it
   * (a cache miss read unlocked): the caller re-checks what it looked
   * up before the call (an L1 entry, a run), as the function's comment
   * says.  "_unlocks" functions are called with it and return without
   * it (the request loop's pieces).  "_locked" names the variant, for a
   * holder of the lock, of a function that otherwise takes it
   * (read_locked, flush_locked).  "_unlocked" names a function called
   * without it (write_claim_may_unlock's io).
   *
   * Checked by clang (-Wthread-safety, see tsa.h; configure turns it
   * on with clang, and CI builds with it): a function that needs the
   * lock says TSA_REQUIRES (img->lock) after its parameters, in its
   * declaration here or, if static, in its definition; one that takes
   * it itself TSA_EXCLUDES; one that returns without it TSA_RELEASE.
   * "_may_unlock" functions are TSA_REQUIRES: they hold it again when
   * they return.  Functions that touch nothing the lock guards (codecs,
   * data I/O at offsets looked up) carry nothing.  Fields cannot be
   * marked (clang does not resolve a sibling member in C), so the
   * analysis checks who calls what holding what, not each access.
   * data_lock is a capability too (image_data_rdlock, _wrlock,
   * _unlock); a function called holding it shared says
   * TSA_REQUIRES_SHARED (img->data_lock).
   */
  struct image_mutex lock;
#ifndef NDEBUG
  pthread_t lock_holder;        /* valid while lock_held */
  bool lock_held;
#endif
  struct image_rwlock data_lock;
  /* Guest ranges being written by allocating writes with the lock
   * released (write-alloc.c): other writes and zeroes of them wait for
   * inflight_done.
   */
  struct write_inflight *inflight;
  pthread_cond_t inflight_done;
};

/* What a client is told of a failed host read, write or flush.  NBD
 * has no error for most of what storage fails with (a bad file
 * descriptor would reach the client as EINVAL, "bad request"), so all
 * but a full disk and a lack of memory are EIO.
 */
static inline int
io_errno (int r)
{
  switch (r) {
  case -ENOSPC: case -EDQUOT: case -EFBIG:
    return -ENOSPC;
  case -ENOMEM:
    return r;
  default:
    return -EIO;
  }
}

/* The header's incompatible features: read without img->lock at every
 * request (qcow2_is_corrupt, qcow2_can_write), changed under it, so
 * every access is atomic.
 */
static inline uint64_t
image_incompat (const struct qcow2_image *img)
{
  return __atomic_load_n (&img->h.incompatible_features, __ATOMIC_RELAXED);
}

/* Returns the bits as they were. */
static inline uint64_t
image_set_incompat (struct qcow2_image *img, uint64_t bits)
{
  return __atomic_fetch_or (&img->h.incompatible_features, bits,
                            __ATOMIC_RELAXED);
}

static inline void
image_clear_incompat (struct qcow2_image *img, uint64_t bits)
{
  __atomic_fetch_and (&img->h.incompatible_features, ~bits,
                      __ATOMIC_RELAXED);
}

/* The lock's primitives, the only functions whose bodies the analysis
 * does not check.
 */
#ifndef NDEBUG
/* The holder, recorded in debug builds.  Atomic, so that a thread that
 * does not hold the lock may ask too (image_released): lock_held is
 * published after lock_holder, so a thread that sees it set by another
 * sees that other's name, never its own.
 */
static inline void
image_note_holder (struct qcow2_image *img)
{
  __atomic_store_n (&img->lock_holder, pthread_self (), __ATOMIC_RELAXED);
  __atomic_store_n (&img->lock_held, true, __ATOMIC_RELEASE);
}

static inline void
image_note_released (struct qcow2_image *img)
{
  __atomic_store_n (&img->lock_held, false, __ATOMIC_RELAXED);
}

/* Whether this thread holds the lock. */
static inline bool
image_lock_held (const struct qcow2_image *img)
{
  return __atomic_load_n (&img->lock_held, __ATOMIC_ACQUIRE) &&
    pthread_equal (__atomic_load_n (&img->lock_holder, __ATOMIC_RELAXED),
                   pthread_self ());
}
#define ASSERT_LOCKED(img) assert (image_lock_held (img))
#else
#define image_note_holder(img) ((void) (img))
#define image_note_released(img) ((void) (img))
#define ASSERT_LOCKED(img) ((void) (img))
#endif

static inline void
image_lock (struct qcow2_image *img)
  TSA_ACQUIRE (img->lock) TSA_NO_TSA
{
  pthread_mutex_lock (&img->lock.mutex);
  image_note_holder (img);
}

static inline void
image_unlock (struct qcow2_image *img)
  TSA_RELEASE (img->lock) TSA_NO_TSA
{
  ASSERT_LOCKED (img);
  image_note_released (img);
  pthread_mutex_unlock (&img->lock.mutex);
}

/* After a call through a pointer to a function that released the lock
 * (the analysis does not follow pointers): says so, and checks it.
 */
static inline void
image_released (struct qcow2_image *img)
  TSA_RELEASE (img->lock) TSA_NO_TSA
{
#ifndef NDEBUG
  assert (!image_lock_held (img));
#endif
}

/* data_lock's primitives: held shared by requests, exclusively by
 * the release of freed clusters (see the lock contract above).
 */
static inline void
image_data_rdlock (struct qcow2_image *img)
  TSA_ACQUIRE_SHARED (img->data_lock) TSA_NO_TSA
{
  pthread_rwlock_rdlock (&img->data_lock.rwlock);
}

static inline void
image_data_wrlock (struct qcow2_image *img)
  TSA_ACQUIRE (img->data_lock) TSA_NO_TSA
{
  pthread_rwlock_wrlock (&img->data_lock.rwlock);
}

static inline void
image_data_unlock (struct qcow2_image *img)
  TSA_RELEASE_GENERIC (img->data_lock) TSA_NO_TSA
{
  pthread_rwlock_unlock (&img->data_lock.rwlock);
}

/* The largest refcount the image's width holds. */
static inline uint64_t
refcount_max (const struct qcow2_image *img)
{
  return img->h.refcount_order == 6 ? UINT64_MAX
    : (UINT64_C (1) << (1u << img->h.refcount_order)) - 1;
}

/* Wait on cond, which releases the lock meanwhile. */
static inline void
image_wait (struct qcow2_image *img, pthread_cond_t *cond)
  TSA_REQUIRES (img->lock) TSA_NO_TSA
{
  ASSERT_LOCKED (img);
  image_note_released (img);
  pthread_cond_wait (cond, &img->lock.mutex);
  image_note_holder (img);
}

static inline bool
image_is_corrupt (const struct qcow2_image *img)
{
  return image_incompat (img) & QCOW2_INCOMPAT_CORRUPT;
}

/* The file size, for callers that do not hold img->lock. */
static inline uint64_t
image_file_size (const struct qcow2_image *img)
{
  return __atomic_load_n (&img->file_size, __ATOMIC_RELAXED);
}

/* The L2 codec (format.h) on entry idx of one of img's slices. */
static inline void
l2_get (const struct qcow2_image *img, const uint8_t *slice, uint64_t idx,
        struct l2_state *s)
{
  l2_decode (&img->geo, img->data_io != img->io,
             slice + idx * img->geo.l2_entry_size, s);
}

static inline void
l2_set (const struct qcow2_image *img, uint8_t *slice, uint64_t idx,
        uint64_t entry, uint64_t bitmap)
{
  l2_encode (&img->geo, slice + idx * img->geo.l2_entry_size, entry, bitmap);
}

/* log.c: errors name the layer's file; notices are what the user must
 * hear that is not an error; debug messages are for -v.
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
                                      uint64_t host_offset, uint64_t len);
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
/* A corruption found: said ("corrupt image: ..."), and, in an image
 * opened for writing, the image marked corrupt on disk as QEMU's
 * qcow2_signal_corruption marks it, so that nothing writes it again
 * until it is repaired.  Returns -EIO.
 */
extern int io_corrupt (struct qcow2_image *img, const char *fmt, ...)
  TSA_REQUIRES (img->lock) __attribute__ ((format (printf, 2, 3)));
/* The same from code that may not hold img->lock: the mark is set at
 * once, and written to the header by the next io_sync_corrupt.
 */
extern int io_corrupt_nolock (struct qcow2_image *img, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
extern void io_sync_corrupt (struct qcow2_image *img)
  TSA_REQUIRES (img->lock);

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

/* state.c */
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
extern int overlap_check (struct qcow2_image *img, uint64_t offset,
                          uint64_t len, uint32_t ign)
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
/* The read-ahead of a backing layer on remote storage (its lock taken
 * with no lock of that layer held).
 */
struct readahead;
extern struct readahead *readahead_new (void);
extern void readahead_free (struct readahead *ra);
extern int read_locked (struct qcow2_image *img, uint8_t *buf, uint64_t count,
                        uint64_t offset)
  TSA_REQUIRES (img->lock);
/* With or without img->lock: it takes the backing layer's. */
extern int read_backing (struct qcow2_image *img, uint8_t *buf,
                         uint64_t count, uint64_t offset);

/* extents.c */
extern int layer_extents (struct qcow2_image *img, uint64_t offset,
                          uint64_t count, bool req_one,
                          qcow2_extent_fn add, void *opaque)
  TSA_EXCLUDES (img->lock);

#endif /* QCOW2_INTERNAL_H */
