/* SPDX-License-Identifier: BSD-3-Clause */
/* The qcow2 engine: state and functions shared between its modules.
 * Not part of the engine's interface.  README lists the files from the
 * bottom up; each calls only files above it, but in four circles,
 * each inherent in what the files do:
 *
 *  - image.c <-> backing.c: a backing file is an image, opened as one;
 *  - cache.c <-> flush.c: evicting a dirty L2 slice first makes what it
 *    points at durable, and a flush writes the caches back;
 *  - alloc.c <-> refcount.c: allocating updates refcounts, and a new
 *    refcount block (or table) is itself allocated;
 *  - write.c <-> commit.c: a client's write during a commit copies
 *    what it changed into the base, through the base's own writes.
 *
 * The functions each file gives the others are declared in modules.h
 * (included at the end), grouped under the file that defines them.
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
#include "lock.h"
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
   * stream's detach (stream-detach.c) rewrites them.
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

/* img->data_lock: a rwlock, held shared or exclusively, that clang's
 * thread-safety analysis knows as a capability, as lock.h's struct lock
 * (img->lock) is a mutex.
 */
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

  /* NULL if none or backing=none; changed by a stream's detach only
   * (see the lock contract).
   */
  struct qcow2_image *backing;
  /* Images and layers standing on this layer (atomic; layers.c): a
   * layer of a table of shared layers (shared, NULL if none) may have
   * several, and so nothing in a layer points up.
   */
  unsigned users;
  struct qcow2_layers *shared;
  bool claimed;                 /* open for writing, known to env->layers */

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

  /* A commit job copying this image into its backing file (commit.c),
   * set and cleared under lock; and while it runs, the clusters
   * changed since it started (atomic, NULL when no job runs), which
   * every write, zero and trim marks once done (commit_note_change).
   */
  struct qcow2_commit *commit;
  struct commit_map *commit_map;

  /* The lock contract.
   *
   * lock guards everything above but the fields marked atomic
   * (file_size, h.incompatible_features), what is fixed at open
   * (geometry, env, io, path) and the backing chain: the caches, the
   * tables, the refcounts and allocation, the dirty ranges, the overlap
   * map and the in-flight list below.  It is taken through image_lock and
   * image_unlock, which in debug builds record its holder, so that
   * ASSERT_LOCKED (img) checks it.
   *
   * data_lock is held shared by every request while it reads or writes
   * data at host offsets it looked up; exclusively while freed clusters
   * are released, so that no request still uses a cluster that is
   * reused.  Never taken twice by one thread (it prefers writers, see
   * image_init_data_lock).
   *
   * The backing chain (backing, each layer's backing below it, and
   * h.backing_file and h.backing_format) is set at open and changed
   * only by a stream's detach (stream_detach_swap), which points the
   * served image past the layers it drops (they keep their own links)
   * holding the served image's data_lock exclusively and its lock.  So it is read by a thread that holds either (a request
   * goes down the chain holding data_lock shared; the layers' own
   * locks do not guard it), by the stream job's thread, its only
   * writer, or when no job runs: at open, before the job is started
   * (qcow2_get_info, qcow2_chain_encrypted), and at close, after it is
   * freed.
   *
   * Order: data_lock, then lock; a backing layer's lock only after the
   * layer above's (reads of the chain go down, never up).  pool.c's
   * lock is taken with none of these held.
   *
   * A backing layer may be shared by several images (env->layers,
   * layers.c): it is only ever read, its locks and read-ahead are its
   * own, what is fixed at open stays so, and its own backing pointer
   * never changes (a stream's detach changes the top's only), so each
   * image above takes its lock as it would an unshared layer's, the
   * order above holding along every chain.  The table's lock is taken
   * with none of an image's held.
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
   * declaration (modules.h) or, if static, in its definition; one
   * that takes it itself TSA_EXCLUDES; one that returns without it
   * TSA_RELEASE.
   * "_may_unlock" functions are TSA_REQUIRES: they hold it again when
   * they return.  Functions that touch nothing the lock guards (codecs,
   * data I/O at offsets looked up) carry nothing.  Fields cannot be
   * marked (clang does not resolve a sibling member in C), so the
   * analysis checks who calls what holding what, not each access.
   * data_lock is a capability too (image_data_rdlock, _wrlock,
   * _unlock); a function called holding it shared says
   * TSA_REQUIRES_SHARED (img->data_lock).
   */
  struct lock lock;
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
  lock_acquire (&img->lock);
  image_note_holder (img);
}

static inline void
image_unlock (struct qcow2_image *img)
  TSA_RELEASE (img->lock) TSA_NO_TSA
{
  ASSERT_LOCKED (img);
  image_note_released (img);
  lock_release (&img->lock);
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
  lock_wait (&img->lock, cond);
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

/* What each file gives the others. */
#include "modules.h"

#endif /* QCOW2_INTERNAL_H */
