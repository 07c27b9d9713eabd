/* SPDX-License-Identifier: BSD-3-Clause */
/* The qcow2 engine: public interface.
 *
 * One struct qcow2_image per opened image, shared by every connection;
 * all functions are safe to call from many threads at once.  Errors are
 * returned as -errno, with a message sent to env->error first.
 */
#ifndef QCOW2_H
#define QCOW2_H

#include <stdbool.h>
#include <stdint.h>

#include "io.h"

struct qcow2_image;

/* Metadata structures the overlap guard protects (QEMU's names). */
enum {
  QCOW2_OL_MAIN_HEADER_BIT,
  QCOW2_OL_ACTIVE_L1_BIT,
  QCOW2_OL_ACTIVE_L2_BIT,
  QCOW2_OL_REFCOUNT_TABLE_BIT,
  QCOW2_OL_REFCOUNT_BLOCK_BIT,
  QCOW2_OL_SNAPSHOT_TABLE_BIT,
  QCOW2_OL_INACTIVE_L1_BIT,
  QCOW2_OL_INACTIVE_L2_BIT,
  QCOW2_OL_BITMAP_DIRECTORY_BIT,
  QCOW2_OL_CRYPTO_HEADER_BIT,
  QCOW2_OL_MAX_BITS
};
#define QCOW2_OL_ALL ((UINT32_C (1) << QCOW2_OL_MAX_BITS) - 1)
#define QCOW2_OL_CONSTANT \
  ((UINT32_C (1) << QCOW2_OL_MAIN_HEADER_BIT) | \
   (UINT32_C (1) << QCOW2_OL_ACTIVE_L1_BIT) | \
   (UINT32_C (1) << QCOW2_OL_REFCOUNT_TABLE_BIT) | \
   (UINT32_C (1) << QCOW2_OL_SNAPSHOT_TABLE_BIT) | \
   (UINT32_C (1) << QCOW2_OL_CRYPTO_HEADER_BIT))
#define QCOW2_OL_CACHED \
  (QCOW2_OL_ALL & ~(UINT32_C (1) << QCOW2_OL_INACTIVE_L2_BIT))

/* overlap-check=MODE: the mask of a mode (none, constant, cached,
 * all), or -1; overlap-check.NAME: the bit of a structure (main-header,
 * active-l1, ...), or -1.
 */
extern int64_t qcow2_overlap_mode (const char *mode);
extern int qcow2_overlap_structure (const char *name);

/* A password as read (nbdkit reads a file's first line, without its
 * newline), and, when it came from a file that holds more (QEMU's
 * secret file= keeps a trailing newline), the whole file, tried if the
 * first opens no key slot.
 */
struct qcow2_password {
  const char *text;
  const char *whole_file;       /* or NULL */
};

struct qcow2_options {
  uint64_t l2_cache_size;       /* bytes; 0 = cover the disk, up to a cap */
  uint64_t l2_slice_size;       /* bytes; 0 = default (see cache.c) */
  /* Without l2_slice_size: small slices even where the cache covers
   * the disk (many images in one process, each using little of it).
   */
  bool small_l2_slices;
  /* Bytes a remote backing layer keeps of what it fetched, for reads
   * of it again (0: 32 MiB).
   */
  uint64_t remote_keep;
  bool no_backing;              /* serve the image without its backing file */
  /* A backing chain the user names, the top image's backing file first:
   * each replaces the name its layer's header records (format probed);
   * the last one's own backing file comes from its header unless
   * no_backing.  Names are used as given.
   */
  const char *const *backing_chain;
  unsigned backing_chain_len;
  /* The top image's backing file, already open, in place of whatever
   * its header names: a raw disk (say another nbdkit plugin's), never
   * written, whose hole op, if any, answers block status where the
   * image allocates nothing.  qcow2_open owns it from the call on, as
   * it owns io: closed with the image, or when opening fails.
   * backing_io_name names it in messages.  Not with backing_chain or
   * no_backing.
   */
  struct qcow2_io *backing_io;
  const char *backing_io_name;
  /* Copy-on-read: reads fill the clusters they touch that the image
   * does not allocate with what the backing file holds there, as
   * qcow2_fill does (the image must be writable).
   */
  bool copy_on_read;
  const char *snapshot;         /* internal snapshot name or ID, or NULL */
  const char *data_file;        /* override the external data file name */
  /* The folder where the image's relative backing and data file names
   * are, when its path names no local file (NULL: the path's folder).
   */
  const char *names_dir;
  bool debug_cache;             /* debug messages for L2 cache hits/misses */
  bool readonly;                /* never write (io may be read-only) */
  bool discard_ignore;          /* trim does nothing (discard=ignore) */
  bool overlap_set;             /* else the default, QCOW2_OL_CACHED */
  uint32_t overlap_mask;        /* structures the overlap guard checks */
  /* Threads reading the host runs of one request at once, when it maps
   * to several (0: the requesting thread reads them in turn).
   */
  unsigned io_threads;
  /* The passwords of LUKS-encrypted layers: the image's, then those of
   * its backing files in chain order; a layer past the last one given
   * uses the last (so that one password serves a whole chain).  A
   * password with no text: the layer has none.
   */
  const struct qcow2_password *passwords;
  unsigned passwords_len;
  /* Key slots (and master key digests) asking more PBKDF2 iterations
   * are refused, not tried (0: no limit).  For whoever opens images
   * that anyone may have made, and must bound the time that takes: the
   * fuzzer.
   */
  uint32_t max_pbkdf2_iterations;
  /* Whole-cluster writes to unallocated clusters are stored compressed
   * (when that saves space), with compress_type (QCOW2_COMPRESS_ZLIB
   * or _ZSTD; it must be the image's) or, if -1, the image's type.
   */
  bool compress;
  int compress_type;
};
#define QCOW2_COMPRESS_ZLIB 0
#define QCOW2_COMPRESS_ZSTD 1

/* LUKS encryption of a new image: qemu-img's encrypt.* options (NULL
 * or 0: QEMU's defaults, aes-256 xts plain64 sha256, 2000 ms).
 */
struct qcow2_luks_options {
  const char *password;
  const char *cipher_alg;       /* aes-256, serpent-128, ... */
  const char *cipher_mode;      /* xts, cbc, ecb, ctr */
  const char *ivgen_alg;        /* plain, plain64, essiv */
  const char *ivgen_hash_alg;
  const char *hash_alg;         /* of PBKDF2 and the key split */
  uint64_t iter_time;           /* ms of PBKDF2 to open a key slot */
};

enum qcow2_preallocation {
  QCOW2_PREALLOC_OFF,
  QCOW2_PREALLOC_METADATA,
  QCOW2_PREALLOC_FALLOC,
  QCOW2_PREALLOC_FULL,
};

/* Write a new, empty image into io (which should be empty). */
struct qcow2_create_options {
  uint64_t size;                /* virtual size */
  uint64_t cluster_size;        /* 0 = 64 KiB */
  bool compat_v2;               /* version 2 (compat=0.10) */
  bool extended_l2;
  bool lazy_refcounts;
  const char *backing;          /* backing file name, or NULL */
  const char *backing_format;   /* "qcow2" or "raw", or NULL */
  unsigned refcount_bits;       /* 1 to 64, a power of two; 0 = 16 */
  bool zstd;                    /* compression type zstd, else zlib */
  const char *data_file;        /* external data file name, or NULL */
  bool data_file_raw;           /* it is a raw image of the disk */
  const struct qcow2_luks_options *luks;        /* encrypted, or NULL */
  /* Only checked here (qemu-img refuses a backing file with it but for
   * extended L2): qcow2_preallocate does it once the image is open.
   */
  enum qcow2_preallocation preallocation;
};
extern int qcow2_create (const struct qcow2_env *env, struct qcow2_io *io,
                         const struct qcow2_create_options *opts);
/* The checks qcow2_create makes first, for a caller that must know
 * before it touches the file: 0, or -errno with the reason reported.
 */
extern int qcow2_create_check (const struct qcow2_env *env,
                               const struct qcow2_create_options *opts);

/* Whether io holds a qcow2 image, by its first bytes (the magic): 1 if
 * so, 0 if not (a raw image, or too short), -errno if they cannot be
 * read.
 */
extern int qcow2_probe (struct qcow2_io *io);

/* The bytes of storage the image qcow2_create makes with opts takes
 * (its metadata), or with preallocated, at least what qcow2_preallocate
 * then adds (every L2 table, and every data cluster but in an external
 * data file): 0, or -errno with the reason reported.
 */
extern int qcow2_create_bytes (const struct qcow2_env *env,
                               const struct qcow2_create_options *opts,
                               bool preallocated, uint64_t *bytes);

/* Whether a backing file name is a local name relative to a folder,
 * rather than absolute, a URL, QEMU's legacy nbd: syntax, file:PATH
 * or a json: name (used as they are).
 */
extern bool qcow2_name_is_relative (const char *name);

/* The storage a backing file name names, opened read-only as the
 * engine opens backing files: a local name resolved against the folder
 * of naming (an image's name), a URL, a json: name.  *resolved gets
 * the name resolved (malloc'd), *format the format the name gives (a
 * json: name's driver) or NULL.  Returns NULL on failure (logged), with
 * errno set.
 */
extern struct qcow2_io *qcow2_open_name (const struct qcow2_env *env,
                                         const char *naming, const char *name,
                                         char **resolved,
                                         const char **format);

/* Open the image in io (named path, used to resolve relative names).
 * On success the image owns io.  On failure returns NULL and errno,
 * the reason reported; ENODATA: the file is empty, EMEDIUMTYPE: it is
 * not a qcow2 image (no magic), so that the caller can say what to do;
 * ENOTSUP for an image of another format QEMU knows (VMDK, VHD...),
 * logged with what converts and serves it.
 */
extern struct qcow2_image *qcow2_open (const struct qcow2_env *env,
                                       struct qcow2_io *io, const char *path,
                                       const struct qcow2_options *opts);
/* Close, flushing first if the image was written: returns the flush's
 * error, if any (the image is freed anyway).
 */
extern int qcow2_close (struct qcow2_image *img);

/* A table of shared backing layers, for a caller serving many images
 * at once (env->layers): a backing layer that several open images
 * stand on is opened once (a local file by the identity env gives it,
 * remote storage by its URL), its caches, descriptors and connections
 * shared, and closed with the last image using it.  A file open as a
 * shared layer is refused for writing, and one open for writing is
 * refused as a layer (-EBUSY, logged).  The table keeps a copy of env
 * (with layers set to the table) for the layers, which outlive the
 * image that opened them.  Freed once every image is closed.
 */
extern struct qcow2_layers *qcow2_layers_new (const struct qcow2_env *env);
extern void qcow2_layers_free (struct qcow2_layers *layers);
/* Whether the file of identity id (env's identity) is open as a layer,
 * or being opened as one: so that its caller serves it read-only
 * rather than meet its own lock.
 */
extern bool qcow2_layers_has (struct qcow2_layers *layers, const char *id);

/* What the header of an open image says, in create's terms (for
 * create=if-missing, which must find the image it would make).  The
 * backing file name belongs to the image (NULL: none), and a stream's
 * detach changes it: asked before the stream job starts.
 */
struct qcow2_info {
  uint64_t size;                /* the header's virtual size */
  uint64_t cluster_size;
  unsigned version, refcount_bits;
  bool extended_l2, lazy_refcounts, zstd, encrypted, data_file_raw;
  const char *backing;          /* the backing file name recorded */
  const char *backing_format;   /* and its format, or NULL */
};
extern void qcow2_get_info (const struct qcow2_image *img,
                            struct qcow2_info *info);

/* Virtual size of what is served (the snapshot's, if one was chosen). */
extern uint64_t qcow2_get_size (const struct qcow2_image *img);

/* Whether the image or a layer of its backing chain is encrypted (a
 * password opened it).  Once open, before a stream may drop layers.
 */
extern bool qcow2_chain_encrypted (const struct qcow2_image *img);

/* 0 if the image may be written, else -errno with the reason reported
 * (corrupt bit set, snapshot export, ...).
 */
extern int qcow2_check_writable (struct qcow2_image *img);

/* Whether the header's corrupt bit is set. */
extern bool qcow2_is_corrupt (const struct qcow2_image *img);

extern int qcow2_read (struct qcow2_image *img, void *buf, uint64_t count,
                       uint64_t offset);

/* Writing (see qcow2_options.readonly).  fua: durable before returning.
 * qcow2_zero with fast fails with -ENOTSUP, changing nothing, when
 * zeroing would need data written; may_trim lets it free clusters.
 */
extern int qcow2_write (struct qcow2_image *img, const void *buf,
                        uint64_t count, uint64_t offset, bool fua);
extern int qcow2_zero (struct qcow2_image *img, uint64_t count,
                       uint64_t offset, bool may_trim, bool fast, bool fua);
extern int qcow2_trim (struct qcow2_image *img, uint64_t count,
                       uint64_t offset, bool fua);
extern int qcow2_flush (struct qcow2_image *img);
/* What was written sent to the disk with the image's lock not held, so
 * that a flush soon after syncs little and holds requests up less
 * long.  Makes nothing durable in the image's own accounting (a flush
 * must follow); a failure is a flush's.
 */
extern int qcow2_writeback (struct qcow2_image *img);

/* Copy what the backing file holds of [offset, offset+count) into the
 * image (QEMU's copy-on-read; an NBD cache request): every cluster the
 * range touches that the image allocates nothing of, whole, so that it
 * is read from the image from then on.  Never changes what the guest
 * reads: a cluster that a write, zero or trim reaches first keeps what
 * it wrote.  Clusters that read as zeros get zero flags (version 3),
 * not data.  Nothing to do without a backing file, or on an image that
 * cannot be written.
 */
extern int qcow2_fill (struct qcow2_image *img, uint64_t count,
                       uint64_t offset);

/* Streaming, as QEMU's block-stream job: a thread copies into the
 * image, while it is served, every range it allocates nothing of and
 * that a layer of its backing chain above the base holds (as
 * qcow2_fill copies, so that a client's write always wins), then
 * rewrites the header's backing name to the base (or none) in one
 * crash-safe step and closes the layers dropped.  Ranges no such layer
 * holds stay unallocated; ranges that read as zeros become zero
 * clusters.  What is allocated is done: a job started again goes on
 * from where the image stands.  Notices say how far it got.
 */
struct qcow2_stream;
struct qcow2_stream_options {
  /* The first layer kept (QEMU's base): matched by the name the layer
   * above records, its path, or the file it names; NULL: none kept.
   */
  const char *base;
  uint64_t rate;                /* bytes per second; 0: no limit */
  bool keep_backing;            /* copy only: the chain stays as it is */
  bool debug;                   /* a debug message per step */
  /* Client requests in flight, counted by the caller (read atomically):
   * the job waits, a bounded time, while there are.  NULL: no count.
   */
  const unsigned *busy;
};
enum qcow2_stream_state {
  QCOW2_STREAM_STARTING,
  QCOW2_STREAM_RUNNING,
  QCOW2_STREAM_WAITING,         /* a failed step, retried soon */
  QCOW2_STREAM_DONE,            /* all copied, the link kept */
  QCOW2_STREAM_DETACHED,        /* all copied, the layers dropped */
  QCOW2_STREAM_FAILED,
  QCOW2_STREAM_STOPPED,
};
struct qcow2_stream_progress {
  enum qcow2_stream_state state;
  bool counted;                 /* total known (the job counts first) */
  /* Bytes to copy (what is copied and what is left, counted again now
   * and then: clients' writes take ranges over), and copied.
   */
  uint64_t total, done;
  const char *base;             /* the options' base, or NULL */
  bool paused;                  /* qcow2_stream_pause's */
  uint64_t rate;                /* bytes per second now; 0: no limit */
};
/* A job for img, checked (the image writable, the base found), not
 * started: NULL with errno, the reason reported; ENOENT: the image has
 * no backing file, nothing to do (a notice says so).
 */
extern struct qcow2_stream *qcow2_stream_new (struct qcow2_image *img,
                                              const struct qcow2_stream_options *opts);
/* Start its thread (after any fork): 0 or -errno. */
extern int qcow2_stream_start (struct qcow2_stream *s);
extern void qcow2_stream_progress (struct qcow2_stream *s,
                                   struct qcow2_stream_progress *p);
/* The rate changed while the job runs (0: no limit), the pacing
 * starting again from now; and the job paused (before its next step:
 * one in flight ends first) or resumed.
 */
extern void qcow2_stream_set_rate (struct qcow2_stream *s, uint64_t rate);
extern void qcow2_stream_pause (struct qcow2_stream *s, bool pause);
/* Stop the job (where it is: a step in flight ends first) and free it,
 * before the image is closed.
 */
extern void qcow2_stream_free (struct qcow2_stream *s);

/* Committing, as QEMU's active block-commit (a mirror job): the data
 * of the image copied into its backing file (the base: the layer
 * directly below, a local qcow2 file) while the image is served and
 * written, so that the base alone then holds the whole disk.
 *
 * The base, opened read-only below the image, is opened again
 * read-write in place (reads through the image go on meanwhile), and
 * known to env->layers as open for writing: no other image may stand
 * on it, before or during the job.  A thread copies every range the
 * image allocates, as the image reads it (zero clusters as zeros,
 * compressed ones as data), through the base's ordinary write path;
 * ranges the image does not allocate stay as the base has them.  Every
 * write, zero and trim of the image while the job runs marks its
 * clusters, which the job copies again.  Once all is copied with
 * nothing marked, the job is ready (and stays so, copying what clients
 * write meanwhile); completing it copies what is left, with no client
 * request in flight, and makes the base durable and clean.
 *
 * The base only ever gets, for a guest range, the data the image holds
 * there: at every instant, and after a crash at any point, the chain
 * reads the same, and both files are consistent (the base's metadata
 * ordered as every write's is).  A job stopped or killed part-way may
 * be started again: it copies all again, and finishes.
 *
 * Internal snapshots and persistent bitmaps of the base are kept, as
 * QEMU keeps them: the snapshots' clusters are copied on write, the
 * bitmaps record what the job writes.  Refused: a raw, remote or
 * encrypted base, one with an external data file, one of another
 * virtual size than the image, one another open image stands on.
 */
struct qcow2_commit;
struct qcow2_commit_options {
  uint64_t rate;                /* bytes per second; 0: no limit */
  /* Client requests in flight, counted by the caller (read atomically):
   * the job waits, a bounded time, while there are.  NULL: no count.
   */
  const unsigned *busy;
  bool debug;                   /* a debug message per step */
  /* Called (by the job's thread, or qcow2_commit_run's caller; no lock
   * held) when it becomes ready or fails, so that the caller need not
   * poll for it.  May be NULL.
   */
  void (*changed) (void);
};
enum qcow2_commit_state {
  QCOW2_COMMIT_CREATED,         /* checked, not started */
  QCOW2_COMMIT_RUNNING,         /* copying */
  QCOW2_COMMIT_WAITING,         /* a failed step, retried soon */
  QCOW2_COMMIT_READY,           /* in sync: may be completed */
  QCOW2_COMMIT_COMPLETED,       /* qcow2_commit_complete succeeded */
  QCOW2_COMMIT_FAILED,          /* given up: only freed now */
};
struct qcow2_commit_progress {
  enum qcow2_commit_state state;
  /* In sync once: stays so, as QEMU's ready, though clients' writes
   * make more to copy.
   */
  bool ready;
  bool paused;
  /* QEMU's: offset, the bytes copied; len, those and the bytes still
   * to copy (clients' writes add to it).
   */
  uint64_t len, offset;
  uint64_t rate;
  const char *base;             /* the base's file name */
  int error;                    /* FAILED: -errno */
};
/* A job committing img into its backing file, checked (as above; img
 * writable), not started: NULL with errno, the reason reported
 * (ENOENT: img has no backing file; EBUSY: another image stands on the
 * base, or img has a job already; ENOTSUP: a base that cannot be
 * written so).  One job per image; no stream job at the same time.
 */
extern struct qcow2_commit *qcow2_commit_new (struct qcow2_image *img,
                                              const struct qcow2_commit_options *opts);
/* The base opened for writing, and the job's thread started (after any
 * fork): 0, or -errno (the base's file cannot be opened for writing,
 * the base is corrupt...) with the job failed and the base read-only
 * again.
 */
extern int qcow2_commit_start (struct qcow2_commit *c);
/* Instead of qcow2_commit_start: the job's work done in the caller's
 * thread, until in sync (ready), with no pacing: 0 or -errno (the job
 * failed).  For tests and offline use.
 */
extern int qcow2_commit_run (struct qcow2_commit *c);
extern void qcow2_commit_progress (struct qcow2_commit *c,
                                   struct qcow2_commit_progress *p);
extern void qcow2_commit_set_rate (struct qcow2_commit *c, uint64_t rate);
/* Paused, the job copies nothing until resumed. */
extern void qcow2_commit_pause (struct qcow2_commit *c, bool pause);
/* The end of the job, once ready, called with no client request on img
 * in flight and none let in (the caller holds them off until it has
 * switched): what is still marked copied, the base flushed and closed
 * clean.  0, or -errno: -EBUSY if not ready (or requests are counted
 * in flight), the job's error if it failed; after another error the
 * job has failed (the chain as it was).  Then the base
 * holds the whole disk (the image's data over what it held): the
 * caller frees the job, closes img (and with it the base) and opens
 * the base's file in its place, letting requests in only then.
 */
extern int qcow2_commit_complete (struct qcow2_commit *c);
/* Stop the job (a step in flight ends first) and free it, the base
 * read-only again (what it wrote durable) and a layer of env->layers
 * as before; before img is closed.  Without a completion (a cancel),
 * the chain stays as it was: the base may hold copies of ranges that
 * the image covers, so reads through the image are unchanged.
 */
extern void qcow2_commit_free (struct qcow2_commit *c);

/* Allocate every cluster of the disk, as qemu-img's preallocation=:
 * metadata maps them (the file covers them, with holes), falloc also
 * gives them space of their own (io's preallocate), full writes zeros
 * to them.  An encrypted image is made full whatever is asked (zeros
 * not written decrypt to noise).  With extended L2 entries, the
 * subclusters are left unallocated, as QEMU leaves them, so that a
 * backing file shows through.
 */
extern int qcow2_preallocate (struct qcow2_image *img,
                              enum qcow2_preallocation mode);

/* Whether writes are possible, trims free space, zeroing is cheap. */
extern bool qcow2_can_write (const struct qcow2_image *img);
extern bool qcow2_can_trim (const struct qcow2_image *img);

/* Why the image cannot be written, or NULL if it can. */
extern const char *qcow2_readonly_reason (const struct qcow2_image *img);

/* What qemu-img check would report.  A corruption: a cluster referenced
 * more often than its refcount says, a reference a cluster or more past
 * the end of the file, a COPIED flag that disagrees with a refcount, an
 * unaligned table or cluster offset.  A leak: a cluster counted more
 * often than it is referenced.
 */
struct qcow2_check_result {
  uint64_t corruptions;
  uint64_t leaks;
  uint64_t leaks_fixed;
};

/* Check the image's metadata (as it is in memory, unwritten changes
 * included).  With fix_leaks, on an image that may be written: an image
 * left dirty by lazy refcounts gets its refcounts rebuilt first, then
 * each leaked cluster's refcount is lowered to its references, and
 * clusters nothing references are freed; the repair is flushed.
 * Returns 0 (whatever was found) or -errno if the check could not be
 * done.
 */
extern int qcow2_check (struct qcow2_image *img, bool fix_leaks,
                        struct qcow2_check_result *res);

/* Host flushes issued so far (for tests and statistics). */
extern uint64_t qcow2_host_flushes (struct qcow2_image *img);

/* Extent flags: QCOW2_EXTENT_HOLE and QCOW2_EXTENT_ZERO (io.h). */

/* Report the allocation status of [offset, offset+count) as a sequence
 * of calls to add, merged so that adjacent calls differ in type.  Stops
 * early, with success, if add returns 1 or if req_one is set after the
 * first extent.
 */
typedef int (*qcow2_extent_fn) (void *opaque, uint64_t offset,
                                uint64_t length, uint32_t type);
extern int qcow2_extents (struct qcow2_image *img, uint64_t offset,
                          uint64_t count, bool req_one,
                          qcow2_extent_fn add, void *opaque);

/* Debug statistics of the L2 cache (of the top image). */
struct qcow2_cache_stats {
  uint64_t hits, misses, evictions;
  uint64_t slice_size, slices;
};
extern void qcow2_cache_stats (struct qcow2_image *img,
                               struct qcow2_cache_stats *stats);

#endif /* QCOW2_H */
