/* Refcounts: the refcount table, and reading a cluster's refcount at
 * any width from 1 to 64 bits.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "internal.h"

#define REFTABLE_OFFSET_MASK 0xfffffffffffffe00ULL

int
refcount_load_table (struct qcow2_image *img)
{
  uint64_t n = (uint64_t) img->h.refcount_table_clusters
    * img->cluster_size / 8;
  uint8_t *buf = malloc (n * 8);
  int r;

  img->reftable = malloc (n * sizeof *img->reftable);
  if (!buf || !img->reftable) {
    free (buf);
    return -ENOMEM;
  }
  r = img->io->ops->pread (img->io, buf, n * 8, img->h.refcount_table_offset);
  if (r < 0) {
    qcow2_err (img, "reading the refcount table at %#" PRIx64 ": %s",
               img->h.refcount_table_offset, strerror (-r));
    free (buf);
    return r;
  }
  for (uint64_t i = 0; i < n; i++)
    img->reftable[i] = be64_get (buf + i * 8);
  img->reftable_size = n;
  free (buf);
  return 0;
}

/* Entry index of a refcount block, at width 1 << order bits. */
uint64_t
refcount_entry_get (const uint8_t *block, uint32_t order, uint64_t index)
{
  switch (order) {
  case 0: case 1: case 2: {
    unsigned bits = 1u << order;
    unsigned per_byte = 8 / bits;
    return (block[index / per_byte] >> (bits * (index % per_byte)))
      & ((1u << bits) - 1);
  }
  case 3: return block[index];
  case 4: return be16_get (block + index * 2);
  case 5: return be32_get (block + index * 4);
  default: return be64_get (block + index * 8);
  }
}

/* A cursor over refcount blocks, so that a scan of many clusters reads
 * each block once.  Not a cache: the caller owns it.
 */
void
refcount_cursor_init (struct refcount_cursor *cur)
{
  memset (cur, 0, sizeof *cur);
  cur->block_offset = UINT64_MAX;
}

void
refcount_cursor_free (struct refcount_cursor *cur)
{
  free (cur->block);
  cur->block = NULL;
}

int
refcount_get (struct qcow2_image *img, struct refcount_cursor *cur,
              uint64_t cluster, uint64_t *refcount)
{
  uint64_t per_block_bits = img->cluster_bits + 3 - img->h.refcount_order;
  uint64_t idx = cluster >> per_block_bits;
  uint64_t block;
  int r;

  if (idx >= img->reftable_size ||
      (block = img->reftable[idx] & REFTABLE_OFFSET_MASK) == 0) {
    *refcount = 0;
    return 0;
  }
  if (block & (img->cluster_size - 1) ||
      range_exceeds (block, img->cluster_size, img->file_size)) {
    qcow2_err (img, "corrupt image: refcount block offset %#" PRIx64
               " (refcount table entry %" PRIu64 ") is misaligned or beyond "
               "the end of the file", block, idx);
    return -EIO;
  }
  if (cur->block_offset != block) {
    if (!cur->block && !(cur->block = malloc (img->cluster_size)))
      return -ENOMEM;
    r = img->io->ops->pread (img->io, cur->block, img->cluster_size, block);
    if (r < 0) {
      qcow2_err (img, "reading refcount block at %#" PRIx64 ": %s", block,
                 strerror (-r));
      cur->block_offset = UINT64_MAX;
      return r;
    }
    cur->block_offset = block;
  }
  *refcount = refcount_entry_get (cur->block, img->h.refcount_order,
                                  cluster & ((UINT64_C (1) << per_block_bits)
                                             - 1));
  return 0;
}

/* Whether the image was made with preallocation=metadata, decided as
 * QEMU decides it (qcow2_detect_metadata_preallocation): many more
 * clusters have a refcount than the file has space allocated.  QEMU
 * then reports holes in such data clusters as zeros, and so do we.
 */
int
refcount_detect_metadata_prealloc (struct qcow2_image *img, bool *prealloc)
{
  struct refcount_cursor cur;
  uint64_t real_clusters, threshold, end, count = 0;
  int64_t allocated;
  int r = 0;

  *prealloc = false;
  if (!img->io->ops->allocated)
    return 0;
  allocated = img->io->ops->allocated (img->io);
  if (allocated < 0)
    return 0;
  real_clusters = allocated / img->cluster_size;
  threshold = MAX (real_clusters * 10 / 9, real_clusters + 2);
  end = div_round_up (img->file_size, img->cluster_size);

  refcount_cursor_init (&cur);
  for (uint64_t i = 0; i < end && count < threshold; i++) {
    uint64_t rc;
    if ((r = refcount_get (img, &cur, i, &rc)) < 0)
      break;
    count += rc != 0;
  }
  refcount_cursor_free (&cur);
  if (r == 0)
    *prealloc = count >= threshold;
  return r;
}
