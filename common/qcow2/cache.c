/* SPDX-License-Identifier: BSD-3-Clause */
/* Metadata caches: L2 slices and refcount blocks.
 *
 * A cache holds a fixed number of equal entries, found by the host
 * offset of what they hold through a hash table, evicted least recently
 * used first.  The L2 cache holds slices of L2 tables (l2-slice-size
 * bytes, down to 512) rather than whole tables, so that a small cache
 * covers a large disk: a miss reads one slice, not a whole cluster.
 *
 * Entries are changed in place and marked dirty; they reach the disk on
 * writeback (at flush) or when evicted.  Evicting a dirty L2 slice first
 * makes its dependencies durable (see flush.c).
 *
 * All functions are called with img->lock held.  Readers may have a
 * missing entry read with the lock released (cache_get_may_unlock), so
 * that the misses of concurrent requests overlap: the entry is then
 * "loading", in the hash table (others wait for it) but out of the LRU
 * list (never evicted); a caller that cannot wait makes it stale and
 * reads its own copy.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "errstr.h"
#include "internal.h"

/* A pointer from cache_get is valid until the lock is dropped or the
 * cache is used again: kept longer, it may point at another table's
 * entry.  Under AddressSanitizer every entry's data is an allocation
 * of its own, replaced whenever the entry is given up (evicted,
 * forgotten), so that a stale pointer reads or writes freed memory and
 * fails at once (tests, fuzzer, crash simulator) instead of changing
 * the wrong table.  Elsewhere the entries are one array.
 */
#ifdef QCOW2_ASAN
#define CACHE_RELOCATE 1
#endif

#define CACHE_DEFAULT_MAX (32u << 20)   /* QEMU's default cap on Linux */
#define CACHE_DEFAULT_SLICE 4096
#define CACHE_MIN_SLICES 2
#define CACHE_GROW_FIRST_BYTES (64u << 10)
#define REFCOUNT_CACHE_BLOCKS 16
#define NO_ENTRY UINT32_MAX
#define NO_KEY UINT64_MAX

/* The low bits of img->dirty.dep_syncs an entry keeps: equal bits
 * may be a wrap (a sync taken that was not needed), different bits
 * always mean a sync since.
 */
#define CACHE_SYNCS_MASK ((UINT32_C (1) << 29) - 1)

struct cache_entry {
  uint64_t key;                 /* host offset of the entry, or NO_KEY */
  uint32_t hash_next;           /* chain in the hash bucket */
  uint32_t lru_prev, lru_next;  /* most recently used at lru_head */
  /* L2: dep_syncs when last changed (see cache_write_entry). */
  uint32_t syncs : 29;
  uint32_t dirty : 1;
  uint32_t loading : 1;         /* being read with img->lock released */
  uint32_t stale : 1;           /* loading, but dropped from the hash */
};

/* Chunks of a cache's entries (see struct meta_cache): enough to grow
 * from one entry to 2^31.
 */
#define CACHE_CHUNKS 33

struct meta_cache {
  const char *what;             /* "L2 slice", "refcount block" */
  bool is_l2;
  uint64_t entry_size;
  uint32_t n;                   /* entries now */
  uint32_t max;                 /* entries it may grow to (see cache_grow) */
  struct cache_entry *e;
#ifdef CACHE_RELOCATE
  uint8_t **data;               /* n entries, each its allocation */
#else
  /* The entries' data, in chunks that never move (a slice is read into
   * its entry with img->lock released): chunk 0 holds the first
   * first_n entries, chunk k > 0 the entries from first_n << (k - 1)
   * to first_n << k (or to max).
   */
  uint8_t *chunk[CACHE_CHUNKS];
  uint32_t nchunks, first_n;
#endif
  uint32_t *buckets;
  uint32_t bucket_mask;
  uint32_t lru_head, lru_tail;
  uint32_t ndirty;
  uint32_t nloading;            /* at most half the entries */
  pthread_cond_t loaded;        /* a loading entry is done */
  uint64_t hits, misses, evictions;
};

static uint32_t
cache_bucket (const struct meta_cache *c, uint64_t key)
{
  return (uint32_t) (((key >> 9) * UINT64_C (0x9e3779b97f4a7c15)) >> 32)
    & c->bucket_mask;
}

static void
cache_lru_unlink (struct meta_cache *c, uint32_t i)
{
  struct cache_entry *e = &c->e[i];

  if (e->lru_prev != NO_ENTRY)
    c->e[e->lru_prev].lru_next = e->lru_next;
  else
    c->lru_head = e->lru_next;
  if (e->lru_next != NO_ENTRY)
    c->e[e->lru_next].lru_prev = e->lru_prev;
  else
    c->lru_tail = e->lru_prev;
}

static void
cache_lru_push_head (struct meta_cache *c, uint32_t i)
{
  struct cache_entry *e = &c->e[i];

  e->lru_prev = NO_ENTRY;
  e->lru_next = c->lru_head;
  if (c->lru_head != NO_ENTRY)
    c->e[c->lru_head].lru_prev = i;
  c->lru_head = i;
  if (c->lru_tail == NO_ENTRY)
    c->lru_tail = i;
}

static void
cache_lru_push_tail (struct meta_cache *c, uint32_t i)
{
  struct cache_entry *e = &c->e[i];

  e->lru_next = NO_ENTRY;
  e->lru_prev = c->lru_tail;
  if (c->lru_tail != NO_ENTRY)
    c->e[c->lru_tail].lru_next = i;
  c->lru_tail = i;
  if (c->lru_head == NO_ENTRY)
    c->lru_head = i;
}

static void
cache_hash_remove (struct meta_cache *c, uint32_t i)
{
  uint32_t *p = &c->buckets[cache_bucket (c, c->e[i].key)];

  while (*p != i)
    p = &c->e[*p].hash_next;
  *p = c->e[i].hash_next;
}

static uint8_t *
cache_data (const struct meta_cache *c, uint32_t i)
{
#ifdef CACHE_RELOCATE
  return c->data[i];
#else
  uint32_t q = i / c->first_n;
  uint32_t k = q ? 32 - __builtin_clz (q) : 0;
  uint32_t base = k ? c->first_n << (k - 1) : 0;

  assert (k < c->nchunks);
  return c->chunk[k] + (uint64_t) (i - base) * c->entry_size;
#endif
}

/* Returns the entry whose data starts at p, asserted to be one. */
static uint32_t
cache_index (const struct meta_cache *c, const uint8_t *p)
{
  uint32_t i;

#ifdef CACHE_RELOCATE
  for (i = 0; i < c->n && c->data[i] != p; i++)
    ;
#else
  uint32_t k, base = 0, len = c->first_n;

  for (k = 0; k < c->nchunks; k++) {
    if (p >= c->chunk[k] &&
        (uint64_t) (p - c->chunk[k]) < (uint64_t) len * c->entry_size)
      break;
    base += len;
    len = c->first_n << k;
  }
  assert (k < c->nchunks &&
          (uint64_t) (p - c->chunk[k]) % c->entry_size == 0);
  i = base + (uint64_t) (p - c->chunk[k]) / c->entry_size;
#endif
  assert (i < c->n);
  return i;
}

/* Entry i holds nothing any more: a pointer to its data is stale. */
static void
cache_retire (struct meta_cache *c, uint32_t i)
{
  c->e[i].key = NO_KEY;
#ifdef CACHE_RELOCATE
  uint8_t *fresh = malloc (c->entry_size);

  /* Without memory, the entry keeps its data (unchecked, not wrong). */
  if (fresh) {
    free (c->data[i]);
    c->data[i] = fresh;
  }
#endif
}

/* Allocates the data for entries [c->n, n).  Returns 0, or -1 with
 * nothing changed.
 */
static int
cache_alloc_data (struct meta_cache *c, uint32_t n)
{
#ifdef CACHE_RELOCATE
  uint8_t **data = realloc (c->data, n * sizeof *c->data);

  if (!data)
    return -1;
  c->data = data;
  for (uint32_t i = c->n; i < n; i++)
    if (!(c->data[i] = malloc (c->entry_size))) {
      while (i-- > c->n)
        free (c->data[i]);
      return -1;
    }
  return 0;
#else
  uint8_t *chunk = malloc ((uint64_t) (n - c->n) * c->entry_size);

  if (!chunk)
    return -1;
  assert (c->nchunks < CACHE_CHUNKS);
  c->chunk[c->nchunks++] = chunk;
  return 0;
#endif
}

static void
cache_free_data (struct meta_cache *c)
{
#ifdef CACHE_RELOCATE
  for (uint32_t i = 0; c->data && i < c->n; i++)
    free (c->data[i]);
  free (c->data);
#else
  for (uint32_t k = 0; k < c->nchunks; k++)
    free (c->chunk[k]);
#endif
}

/* Entries [c->n, n) start free, at the LRU tail (taken first). */
static void
cache_add_entries (struct meta_cache *c, uint32_t n)
{
  for (uint32_t i = c->n; i < n; i++) {
    c->e[i] = (struct cache_entry) { .key = NO_KEY, .hash_next = NO_ENTRY };
    cache_lru_push_tail (c, i);
  }
  c->n = n;
}

static void
cache_hash_insert (struct meta_cache *c, uint32_t i)
{
  uint32_t b = cache_bucket (c, c->e[i].key);

  c->e[i].hash_next = c->buckets[b];
  c->buckets[b] = i;
}

/* Sizes the hash buckets for n entries (twice as many, a power of
 * two).  Returns 0, or -1 with the old ones kept.
 */
static int
cache_size_buckets (struct meta_cache *c, uint32_t n)
{
  uint64_t nbuckets = 1;
  uint32_t *b;

  while (nbuckets < (uint64_t) n * 2)
    nbuckets <<= 1;
  if (c->buckets && nbuckets == (uint64_t) c->bucket_mask + 1)
    return 0;
  if (!(b = malloc (nbuckets * sizeof *b)))
    return -1;
  free (c->buckets);
  c->buckets = b;
  c->bucket_mask = nbuckets - 1;
  memset (b, 0xff, nbuckets * sizeof *b);
  /* Entries in the hash: those holding a table, and those loading
   * that were not dropped.
   */
  for (uint32_t i = 0; i < c->n; i++)
    if (c->e[i].key != NO_KEY && !c->e[i].stale)
      cache_hash_insert (c, i);
  return 0;
}

/* A full cache that may grow doubles (up to max) instead of evicting,
 * so that a layer's cache costs what its use needs.  Without memory it
 * stays as it is and evicts.
 */
static void
cache_grow (struct meta_cache *c)
{
  uint32_t n = MIN ((uint64_t) c->max, (uint64_t) c->n * 2);
  struct cache_entry *e;

  assert (n > c->n);
  if (!(e = realloc (c->e, n * sizeof *e)))
    return;
  c->e = e;
  if (cache_alloc_data (c, n) < 0)
    return;
  cache_add_entries (c, n);
  /* Longer chains if this fails: slower, still right. */
  cache_size_buckets (c, n);
}

/* Returns a cache of first entries, growing up to max (see cache_grow). */
struct meta_cache *
cache_create_growing (enum cache_kind kind, uint64_t entry_size,
                      uint64_t first, uint64_t max)
{
  struct meta_cache *c;
  uint64_t bytes;

  assert (first >= 1 && first <= max);
  if (max > UINT32_MAX / 4 ||
      mul_overflow_u64 (entry_size, max, &bytes)) {
    errno = EFBIG;
    return NULL;
  }

  c = calloc (1, sizeof *c);
  if (!c)
    return NULL;
  lock_cond_init (&c->loaded);
  c->is_l2 = kind == CACHE_L2;
  c->what = c->is_l2 ? "L2 slice" : "refcount block";
  c->entry_size = entry_size;
  c->max = max;
#ifndef CACHE_RELOCATE
  c->first_n = first;
#endif
  c->lru_head = c->lru_tail = NO_ENTRY;
  c->e = malloc (first * sizeof *c->e);
  if (!c->e || cache_alloc_data (c, first) < 0) {
    cache_destroy (c);
    errno = ENOMEM;
    return NULL;
  }
  cache_add_entries (c, first);
  if (cache_size_buckets (c, first) < 0) {
    cache_destroy (c);
    errno = ENOMEM;
    return NULL;
  }
  return c;
}

struct meta_cache *
cache_create (enum cache_kind kind, uint64_t entry_size, uint64_t entries)
{
  return cache_create_growing (kind, entry_size, entries, entries);
}

void
cache_destroy (struct meta_cache *c)
{
  if (!c)
    return;
  pthread_cond_destroy (&c->loaded);
  free (c->e);
  cache_free_data (c);
  free (c->buckets);
  free (c);
}

/* The refcount block cache, made with the refcount table (its load):
 * an image that is only read has none (a megabyte at 64 KiB clusters,
 * which a fleet's every open would map and unmap).  0 or -ENOMEM.
 */
int
cache_setup_refcount (struct qcow2_image *img)
{
  if (!img->caches.refcount &&
      !(img->caches.refcount = cache_create (CACHE_REFCOUNT,
                                             img->geo.cluster_size,
                                             REFCOUNT_CACHE_BLOCKS)))
    return -ENOMEM;
  return 0;
}

/* The refcount block cache, after a rebuild of the refcounts. */
void
cache_replace_refcount (struct qcow2_image *img, struct meta_cache *c)
{
  cache_destroy (img->caches.refcount);
  img->caches.refcount = c;
}

uint64_t
cache_entry_size (const struct meta_cache *c)
{
  return c->entry_size;
}

uint32_t
cache_entries (const struct meta_cache *c)
{
  return c->n;
}

void
cache_stats (const struct meta_cache *c, struct qcow2_cache_stats *stats)
{
  memset (stats, 0, sizeof *stats);
  if (!c)
    return;
  stats->hits = c->hits;
  stats->misses = c->misses;
  stats->evictions = c->evictions;
  stats->slice_size = c->entry_size;
  stats->slices = c->n;
}

static int
cache_write_entry (struct qcow2_image *img, struct meta_cache *c, uint32_t i)
  TSA_REQUIRES (img->lock)
{
  int r;

  /* What an L2 slice points at must be durable first, unless a sync of
   * those dependencies was done since the slice last changed: every
   * dependency it has was made before that change (the refcount
   * counted, the data written), so that sync covered it.  Evicted in
   * LRU order, the slices changed before the latest sync go first, so
   * that one sync serves about as many evictions as the cache holds.
   */
  if (c->is_l2 &&
      c->e[i].syncs == (img->dirty.dep_syncs & CACHE_SYNCS_MASK) &&
      (r = flush_l2_dependencies (img)) < 0)
    return r;
  r = io_write_meta (img, cache_data (c, i), c->entry_size, c->e[i].key,
                     c->what, c->is_l2 ? OL (ACTIVE_L2) : OL (REFCOUNT_BLOCK));
  if (r < 0)
    return r;
  assert (c->e[i].dirty && c->ndirty > 0);
  c->e[i].dirty = false;
  c->ndirty--;
  return 0;
}

/* Take the least recently used entry, writing it back if dirty. */
static int
cache_evict (struct qcow2_image *img, struct meta_cache *c, uint32_t *out)
  TSA_REQUIRES (img->lock)
{
  uint32_t i = c->lru_tail;
  int r;

  /* Loading entries are out of the LRU list, which is never empty. */
  assert (i != NO_ENTRY && !c->e[i].loading);
  if (c->e[i].key != NO_KEY) {
    if (c->e[i].dirty && (r = cache_write_entry (img, c, i)) < 0)
      return r;
    c->evictions++;
    cache_hash_remove (c, i);
    if (img->caches.debug && c->is_l2)
      log_debug (img, "L2 cache evict: slice %#" PRIx64, c->e[i].key);
    cache_retire (c, i);
  }
  *out = i;
  return 0;
}

static uint32_t
cache_find (struct meta_cache *c, uint64_t key)
{
  uint32_t i;

  for (i = c->buckets[cache_bucket (c, key)]; i != NO_ENTRY;
       i = c->e[i].hash_next)
    if (c->e[i].key == key)
      return i;
  return NO_ENTRY;
}

/* A loading entry leaves the hash table: its reader will find it stale
 * and drop what it read.
 */
static void
cache_drop_loading (struct meta_cache *c, uint32_t i)
{
  cache_hash_remove (c, i);
  c->e[i].stale = true;
}

static void
cache_hit (struct qcow2_image *img, struct meta_cache *c, uint32_t i)
  TSA_REQUIRES (img->lock)
{
  c->hits++;
  if (img->caches.debug && c->is_l2)
    log_debug (img, "L2 cache hit: slice %#" PRIx64, c->e[i].key);
  if (c->lru_head != i) {
    cache_lru_unlink (c, i);
    cache_lru_push_head (c, i);
  }
}

/* Give entry i (evicted, out of the hash) the key host_offset. */
static void
cache_insert (struct meta_cache *c, uint32_t i, uint64_t host_offset)
{
  c->e[i].key = host_offset;
  cache_hash_insert (c, i);
}

/* Read into dst (an entry's data, found under img->lock: the cache may
 * grow meanwhile) what is at host_offset.
 */
static int
cache_read_entry (struct qcow2_image *img, const struct meta_cache *c,
                  uint8_t *dst, uint64_t host_offset)
{
  int r = img->io->ops->pread (img->io, dst, c->entry_size, host_offset);
  if (r < 0) {
    log_error (img, "reading %s at %#" PRIx64 ": %s", c->what,
               host_offset, errstr (-r));
    return io_errno (r);
  }
  return 0;
}

/* Find the entry at host_offset (entry aligned, already checked to lie
 * in the file), reading it on a miss, or zero-filling it if fresh.
 */
static inline __attribute__ ((always_inline)) int
cache_lookup (struct qcow2_image *img, struct meta_cache *c,
              uint64_t host_offset, bool fresh, uint8_t **data)
  TSA_REQUIRES (img->lock)
{
  uint32_t i = cache_find (c, host_offset);
  int r;

  ASSERT_LOCKED (img);
  /* This caller cannot release the lock to wait for a loading entry. */
  if (i != NO_ENTRY && c->e[i].loading) {
    cache_drop_loading (c, i);
    i = NO_ENTRY;
  }
  if (i != NO_ENTRY) {
    cache_hit (img, c, i);
    *data = cache_data (c, i);
    if (fresh)
      memset (*data, 0, c->entry_size);
    return 0;
  }

  c->misses++;
  if (c->n < c->max && c->e[c->lru_tail].key != NO_KEY)
    cache_grow (c);
  if ((r = cache_evict (img, c, &i)) < 0)
    return r;
  if (img->caches.debug && c->is_l2)
    log_debug (img, "L2 cache miss: slice %#" PRIx64, host_offset);
  *data = cache_data (c, i);
  if (fresh)
    memset (*data, 0, c->entry_size);
  else if ((r = cache_read_entry (img, c, *data, host_offset)) < 0)
    return r;
  cache_insert (c, i, host_offset);
  cache_lru_unlink (c, i);
  cache_lru_push_head (c, i);
  return 0;
}

/* The entry at host_offset, read on a miss.  *data stays valid until
 * the lock is dropped or the cache is used again.
 */
int
cache_get (struct qcow2_image *img, struct meta_cache *c,
           uint64_t host_offset, uint8_t **data)
{
  return cache_lookup (img, c, host_offset, false, data);
}

/* As cache_get, for a newly allocated table: the entry is zeros,
 * whatever the file holds there.
 */
int
cache_get_new (struct qcow2_image *img, struct meta_cache *c,
               uint64_t host_offset, uint8_t **data)
{
  return cache_lookup (img, c, host_offset, true, data);
}

/* As cache_get, for readers: a miss is read with img->lock
 * released, as is a wait for an entry another reader is loading.  Sets
 * *released if so: what the caller looked up under the lock before may
 * have changed.
 */
int
cache_get_may_unlock (struct qcow2_image *img, struct meta_cache *c,
                      uint64_t host_offset, uint8_t **data, bool *released)
{
  uint32_t i;
  int r;

  ASSERT_LOCKED (img);
  *released = false;
 again:
  i = cache_find (c, host_offset);
  if (i != NO_ENTRY && !c->e[i].loading) {
    cache_hit (img, c, i);
    *data = cache_data (c, i);
    return 0;
  }
  if (i != NO_ENTRY) {
    image_wait (img, &c->loaded);
    *released = true;
    goto again;
  }
  /* Half the entries stay in the LRU list, and a dirty victim is
   * written back under the lock: then read under the lock too.
   */
  if (c->n < c->max && c->e[c->lru_tail].key != NO_KEY)
    cache_grow (c);
  if (c->nloading >= c->n / 2 || c->e[c->lru_tail].dirty)
    return cache_get (img, c, host_offset, data);

  c->misses++;
  if ((r = cache_evict (img, c, &i)) < 0)
    return r;
  if (img->caches.debug && c->is_l2)
    log_debug (img, "L2 cache miss: slice %#" PRIx64 " (read unlocked)",
               host_offset);
  cache_insert (c, i, host_offset);
  cache_lru_unlink (c, i);
  c->e[i].loading = true;
  c->nloading++;
  assert (c->nloading <= c->n / 2);
  *data = cache_data (c, i);
  image_unlock (img);
  r = cache_read_entry (img, c, *data, host_offset);
  image_lock (img);
  *released = true;
  c->e[i].loading = false;
  c->nloading--;
  pthread_cond_broadcast (&c->loaded);
  if (r < 0 || c->e[i].stale) {
    if (!c->e[i].stale)
      cache_hash_remove (c, i);
    c->e[i].stale = false;
    cache_retire (c, i);
    cache_lru_push_tail (c, i);
    if (r < 0)
      return r;
    goto again;
  }
  cache_lru_push_head (c, i);
  *data = cache_data (c, i);
  return 0;
}

/* Mark the entry holding data (a pointer from cache_get) dirty. */
void
cache_mark_dirty (struct qcow2_image *img, struct meta_cache *c,
                  const uint8_t *data)
{
  uint32_t i = cache_index (c, data);

  /* A pointer from cache_get, still valid: its entry holds a table. */
  assert (c->e[i].key != NO_KEY && !c->e[i].loading);
  c->e[i].syncs = img->dirty.dep_syncs & CACHE_SYNCS_MASK;
  if (!c->e[i].dirty) {
    c->e[i].dirty = true;
    c->ndirty++;
  }
}

/* Write back every dirty entry, in host order so the writes are
 * sequential where the tables are.
 */
static int
cache_cmp_key (const void *a, const void *b, void *arg)
{
  const struct meta_cache *c = arg;
  uint64_t ka = c->e[*(const uint32_t *) a].key;
  uint64_t kb = c->e[*(const uint32_t *) b].key;
  return ka < kb ? -1 : ka > kb;
}

int
cache_writeback (struct qcow2_image *img, struct meta_cache *c)
{
  uint32_t *order, n = 0;
  int r = 0;

  ASSERT_LOCKED (img);
  if (!c || c->ndirty == 0)     /* no refcount cache made yet */
    return 0;
  order = malloc (c->ndirty * sizeof *order);
  if (!order)
    return -ENOMEM;
  for (uint32_t i = 0; i < c->n; i++)
    if (c->e[i].dirty)
      order[n++] = i;
  assert (n == c->ndirty);
  qsort_r (order, n, sizeof *order, cache_cmp_key, c);
  for (uint32_t j = 0; j < n && r == 0; j++)
    r = cache_write_entry (img, c, order[j]);
  free (order);
  return r;
}

/* Forget entries of a freed table in [offset, offset+len), so a later
 * allocation of the same clusters does not meet stale entries.
 */
void
cache_forget (struct meta_cache *c, uint64_t offset, uint64_t len)
{
  for (uint64_t k = offset; k < offset + len; k += c->entry_size) {
    uint32_t i = cache_find (c, k);
    if (i == NO_ENTRY)
      continue;
    if (c->e[i].loading) {
      cache_drop_loading (c, i);
      continue;
    }
    if (c->e[i].dirty) {
      c->e[i].dirty = false;
      c->ndirty--;
    }
    cache_hash_remove (c, i);
    cache_retire (c, i);
    cache_lru_unlink (c, i);
    cache_lru_push_tail (c, i);
  }
}

/* Size the L2 cache as QEMU does by default: enough to cover the whole
 * disk, capped; slices of the cluster size when everything fits (and
 * the caller did not ask for small ones), else small slices so that a
 * miss costs little.  A read-only layer's
 * default cache starts at 64 KiB and grows to that.  The refcount
 * cache is a few whole blocks.
 */
int
cache_setup (struct qcow2_image *img, const struct qcow2_options *opts)
{
  uint64_t clusters = div_round_up (img->size, img->geo.cluster_size);
  uint64_t full, size, slice, n, first;

  /* L2 bytes needed to map the whole disk, in whole clusters. */
  full = clusters * img->geo.l2_entry_size;
  full = div_round_up (full, img->geo.cluster_size) * img->geo.cluster_size;
  full = MAX (full, img->geo.cluster_size);

  size = opts->l2_cache_size ? opts->l2_cache_size
                             : MIN (full, CACHE_DEFAULT_MAX);
  size = MIN (size, full);

  if (opts->l2_slice_size) {
    slice = opts->l2_slice_size;
    if (!is_power_of_2 (slice) || slice < 512 ||
        slice > img->geo.cluster_size) {
      log_error (img, "l2-slice-size (l2-cache-entry-size) %" PRIu64
                 " must be a power of two "
                 "from 512 to the cluster size (%" PRIu64 ")",
                 slice, img->geo.cluster_size);
      return -EINVAL;
    }
  }
  else if (size >= full && !opts->small_l2_slices)
    slice = img->geo.cluster_size;
  else
    slice = MIN (CACHE_DEFAULT_SLICE, img->geo.cluster_size);

  n = MAX (size / slice, CACHE_MIN_SLICES);
  /* A read-only layer's default cache (a backing file's) grows with
   * use: a deep chain of large disks costs what is read of it.
   */
  first = opts->readonly && !opts->l2_cache_size
    ? MIN (n, MAX (CACHE_GROW_FIRST_BYTES / slice, CACHE_MIN_SLICES)) : n;
  img->caches.l2 = cache_create_growing (CACHE_L2, slice, first, n);
  if (!img->caches.l2) {
    int r = -errno;
    log_error (img, "cannot allocate the metadata caches (%" PRIu64
               " bytes of L2 cache): %s", size, errstr (-r));
    return r;
  }
  return 0;
}
