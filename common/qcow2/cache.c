/* The L2 slice cache.
 *
 * Caches slices of L2 tables (l2-slice-size bytes, down to 512) rather
 * than whole tables, so that a small cache covers a large disk: a miss
 * reads one slice, not a whole cluster.  Fixed number of entries, a hash
 * table keyed by the host offset of the slice, LRU eviction.
 *
 * All functions are called with img->lock held.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "internal.h"

#define CACHE_DEFAULT_MAX (32u << 20)   /* QEMU's default cap on Linux */
#define CACHE_DEFAULT_SLICE 4096
#define CACHE_MIN_SLICES 2
#define NO_ENTRY UINT32_MAX
#define NO_KEY UINT64_MAX

struct cache_entry {
  uint64_t key;                 /* host offset of the slice, or NO_KEY */
  uint32_t hash_next;           /* chain in the hash bucket */
  uint32_t lru_prev, lru_next;  /* most recently used at lru_head */
};

struct l2_cache {
  uint64_t slice_size;
  uint32_t n;
  struct cache_entry *e;
  uint8_t *data;                /* n slices of slice_size bytes */
  uint32_t *buckets;
  uint32_t bucket_mask;
  uint32_t lru_head, lru_tail;
  uint64_t hits, misses, evictions;
};

static uint32_t
cache_bucket (const struct l2_cache *c, uint64_t key)
{
  return (uint32_t) (((key >> 9) * UINT64_C (0x9e3779b97f4a7c15)) >> 32)
    & c->bucket_mask;
}

static void
cache_lru_unlink (struct l2_cache *c, uint32_t i)
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
cache_lru_push_head (struct l2_cache *c, uint32_t i)
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
cache_hash_remove (struct l2_cache *c, uint32_t i)
{
  uint32_t *p = &c->buckets[cache_bucket (c, c->e[i].key)];

  while (*p != i)
    p = &c->e[*p].hash_next;
  *p = c->e[i].hash_next;
}

struct l2_cache *
cache_create (uint64_t slice_size, uint64_t slices)
{
  struct l2_cache *c;
  uint64_t bytes, nbuckets = 1;

  if (slices > UINT32_MAX / 4 ||
      mul_overflow_u64 (slice_size, slices, &bytes)) {
    errno = EFBIG;
    return NULL;
  }
  while (nbuckets < slices * 2)
    nbuckets <<= 1;

  c = calloc (1, sizeof *c);
  if (!c)
    return NULL;
  c->slice_size = slice_size;
  c->n = slices;
  c->e = calloc (slices, sizeof *c->e);
  c->data = malloc (bytes);
  c->buckets = malloc (nbuckets * sizeof *c->buckets);
  if (!c->e || !c->data || !c->buckets) {
    cache_destroy (c);
    errno = ENOMEM;
    return NULL;
  }
  c->bucket_mask = nbuckets - 1;
  memset (c->buckets, 0xff, nbuckets * sizeof *c->buckets);
  c->lru_head = c->lru_tail = NO_ENTRY;
  for (uint32_t i = 0; i < c->n; i++) {
    c->e[i].key = NO_KEY;
    c->e[i].hash_next = NO_ENTRY;
    cache_lru_push_head (c, i);
  }
  return c;
}

void
cache_destroy (struct l2_cache *c)
{
  if (!c)
    return;
  free (c->e);
  free (c->data);
  free (c->buckets);
  free (c);
}

uint64_t
cache_slice_size (const struct l2_cache *c)
{
  return c->slice_size;
}

void
cache_stats (const struct l2_cache *c, struct qcow2_cache_stats *stats)
{
  memset (stats, 0, sizeof *stats);
  if (!c)
    return;
  stats->hits = c->hits;
  stats->misses = c->misses;
  stats->evictions = c->evictions;
  stats->slice_size = c->slice_size;
  stats->slices = c->n;
}

/* Find the slice at host_offset (slice aligned, already checked to lie
 * in the file), reading it on a miss.  *slice stays valid until the lock
 * is dropped or the cache is used again.
 */
int
cache_get_slice (struct qcow2_image *img, uint64_t host_offset,
                 const uint8_t **slice)
{
  struct l2_cache *c = img->cache;
  uint32_t b = cache_bucket (c, host_offset);
  uint32_t i;
  int r;

  for (i = c->buckets[b]; i != NO_ENTRY; i = c->e[i].hash_next) {
    if (c->e[i].key == host_offset) {
      c->hits++;
      if (img->debug_cache)
        qcow2_dbg (img, "L2 cache hit: slice %#" PRIx64, host_offset);
      if (c->lru_head != i) {
        cache_lru_unlink (c, i);
        cache_lru_push_head (c, i);
      }
      *slice = c->data + (uint64_t) i * c->slice_size;
      return 0;
    }
  }

  /* Miss: reuse the least recently used entry. */
  c->misses++;
  i = c->lru_tail;
  if (c->e[i].key != NO_KEY) {
    c->evictions++;
    cache_hash_remove (c, i);
    if (img->debug_cache)
      qcow2_dbg (img, "L2 cache evict: slice %#" PRIx64, c->e[i].key);
    c->e[i].key = NO_KEY;
  }
  if (img->debug_cache)
    qcow2_dbg (img, "L2 cache miss: slice %#" PRIx64, host_offset);

  uint8_t *data = c->data + (uint64_t) i * c->slice_size;
  r = img->io->ops->pread (img->io, data, c->slice_size, host_offset);
  if (r < 0) {
    qcow2_err (img, "reading L2 slice at %#" PRIx64 ": %s", host_offset,
               strerror (-r));
    return r;
  }
  c->e[i].key = host_offset;
  c->e[i].hash_next = c->buckets[b];
  c->buckets[b] = i;
  cache_lru_unlink (c, i);
  cache_lru_push_head (c, i);
  *slice = data;
  return 0;
}

/* Size the cache as QEMU does by default: enough to cover the whole
 * disk, capped; slices of the cluster size when everything fits, else
 * small slices so that a miss costs little.
 */
int
cache_setup (struct qcow2_image *img, const struct qcow2_options *opts)
{
  uint64_t clusters = div_round_up (img->size, img->cluster_size);
  uint64_t full, size, slice;

  /* L2 bytes needed to map the whole disk, in whole clusters. */
  full = clusters * img->l2_entry_size;
  full = div_round_up (full, img->cluster_size) * img->cluster_size;
  full = MAX (full, img->cluster_size);

  size = opts->l2_cache_size ? opts->l2_cache_size
                             : MIN (full, CACHE_DEFAULT_MAX);
  size = MIN (size, full);

  if (opts->l2_slice_size) {
    slice = opts->l2_slice_size;
    if (!is_power_of_2 (slice) || slice < 512 || slice > img->cluster_size) {
      qcow2_err (img, "l2-slice-size %" PRIu64 " must be a power of two "
                 "from 512 to the cluster size (%" PRIu64 ")",
                 slice, img->cluster_size);
      return -EINVAL;
    }
  }
  else if (size >= full)
    slice = img->cluster_size;
  else
    slice = MIN (CACHE_DEFAULT_SLICE, img->cluster_size);

  img->cache = cache_create (slice, MAX (size / slice, CACHE_MIN_SLICES));
  if (!img->cache) {
    int r = -errno;
    qcow2_err (img, "cannot allocate the L2 cache (%" PRIu64 " bytes): %s",
               size, strerror (-r));
    return r;
  }
  if (img->debug_cache)
    qcow2_dbg (img, "L2 cache: %" PRIu32 " slices of %" PRIu64 " bytes",
               img->cache->n, slice);
  return 0;
}
