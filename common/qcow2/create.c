/* SPDX-License-Identifier: BSD-3-Clause */
/* Creating a new image: a header, a refcount table and blocks that
 * count the metadata, and an empty L1 table, laid out as QEMU does
 * (header, refcount table, refcount blocks, L1), so that qemu-img check
 * finds it clean.  Preallocation then goes through the engine.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

#define CREATE_REFCOUNT_BITS 16 /* QEMU's default */

static uint32_t
create_refcount_order (const struct qcow2_create_options *o)
{
  return __builtin_ctz (o->refcount_bits ? o->refcount_bits
                                         : CREATE_REFCOUNT_BITS);
}

static int
create_put_ext (uint8_t *buf, uint64_t *off, uint64_t limit, uint32_t type,
                const void *data, uint32_t len)
{
  uint64_t padded = ((uint64_t) len + 7) & ~UINT64_C (7);

  if (*off + 8 + padded > limit)
    return -ENAMETOOLONG;
  be32_put (buf + *off, type);
  be32_put (buf + *off + 4, len);
  memcpy (buf + *off + 8, data, len);
  *off += 8 + padded;
  return 0;
}

/* Fills in the header cluster: fields, extensions, then the backing
 * file name.
 */
static int
create_header (const struct qcow2_create_options *o, uint8_t *buf,
               uint64_t cs, uint32_t cluster_bits, uint32_t l1_size,
               uint64_t reftable_clusters, uint64_t l1_offset,
               uint64_t crypto_offset, uint64_t crypto_len)
{
  bool v3 = !o->compat_v2;
  uint64_t off = v3 ? HDR_V3_SIZE : QCOW2_V2_HEADER_SIZE;
  int r;

  be32_put (buf + HDR_MAGIC, QCOW2_MAGIC);
  be32_put (buf + HDR_VERSION, v3 ? 3 : 2);
  be32_put (buf + HDR_CLUSTER_BITS, cluster_bits);
  be64_put (buf + HDR_SIZE, o->size);
  be32_put (buf + HDR_L1_SIZE, l1_size);
  be64_put (buf + HDR_L1_OFFSET, l1_offset);
  be64_put (buf + HDR_REFTABLE_OFFSET, cs);     /* cluster 1 */
  be32_put (buf + HDR_REFTABLE_CLUSTERS, reftable_clusters);
  if (v3) {
    be64_put (buf + HDR_INCOMPAT,
              (o->extended_l2 ? QCOW2_INCOMPAT_EXTL2 : 0) |
              (o->zstd ? QCOW2_INCOMPAT_COMPRESSION : 0) |
              (o->data_file ? QCOW2_INCOMPAT_DATA_FILE : 0));
    be64_put (buf + HDR_COMPAT,
              o->lazy_refcounts ? QCOW2_COMPAT_LAZY_REFCOUNTS : 0);
    be64_put (buf + HDR_AUTOCLEAR,
              o->data_file_raw ? QCOW2_AUTOCLEAR_DATA_RAW : 0);
    be32_put (buf + HDR_REFCOUNT_ORDER, create_refcount_order (o));
    be32_put (buf + HDR_HEADER_LENGTH, HDR_V3_SIZE);
    buf[HDR_COMPRESSION_TYPE] = o->zstd ? QCOW2_COMPRESSION_ZSTD
                                        : QCOW2_COMPRESSION_DEFLATE;
  }
  if (o->luks) {
    uint8_t ext[16];

    be32_put (buf + HDR_CRYPT, QCOW2_CRYPT_LUKS);
    be64_put (ext, crypto_offset);
    be64_put (ext + 8, crypto_len);
    if ((r = create_put_ext (buf, &off, cs, QCOW2_EXT_CRYPTO, ext,
                             sizeof ext)) < 0)
      return r;
  }
  if (o->data_file &&
      (r = create_put_ext (buf, &off, cs, QCOW2_EXT_DATA_FILE, o->data_file,
                           strlen (o->data_file))) < 0)
    return r;
  if (o->backing && o->backing_format &&
      (r = create_put_ext (buf, &off, cs, QCOW2_EXT_BACKING_FORMAT,
                           o->backing_format,
                           strlen (o->backing_format))) < 0)
    return r;
  off += 8;                             /* end of extensions */
  if (o->backing) {
    uint64_t len = strlen (o->backing);
    if (len > QCOW2_MAX_BACKING_NAME || off + len > cs)
      return -ENAMETOOLONG;
    be64_put (buf + HDR_BACKING_OFFSET, off);
    be32_put (buf + HDR_BACKING_SIZE, len);
    memcpy (buf + off, o->backing, len);
  }
  return 0;
}

/* Returns the header area the extensions and the backing file name
 * take.
 */
static uint64_t
create_header_bytes (const struct qcow2_create_options *o)
{
  uint64_t off = o->compat_v2 ? QCOW2_V2_HEADER_SIZE : HDR_V3_SIZE;

  if (o->backing && o->backing_format)
    off += 8 + ((strlen (o->backing_format) + 7) & ~(size_t) 7);
  if (o->data_file)
    off += 8 + ((strlen (o->data_file) + 7) & ~(size_t) 7);
  if (o->luks)
    off += 8 + 16;
  off += 8;
  if (o->backing)
    off += strlen (o->backing);
  return off;
}

int
qcow2_create_check (const struct qcow2_env *env,
                    const struct qcow2_create_options *o)
{
  uint64_t cs = o->cluster_size ? o->cluster_size : 65536;
  uint32_t cluster_bits = __builtin_ctzll (cs);
  uint64_t l2_entries = cs / (o->extended_l2 ? 16 : 8);
  uint64_t crypto_len;
  int r;

  if (!is_power_of_2 (cs) || cluster_bits < QCOW2_MIN_CLUSTER_BITS ||
      cluster_bits > QCOW2_MAX_CLUSTER_BITS) {
    env_err (env, "cluster-size %" PRIu64 " must be a power of two from 512 "
             "to 2M", cs);
    return -EINVAL;
  }
  if (o->extended_l2 && (o->compat_v2 || cs < 16384)) {
    env_err (env, "extended L2 entries need compat=1.1 and clusters of at "
             "least 16K");
    return -EINVAL;
  }
  if (o->lazy_refcounts && o->compat_v2) {
    env_err (env, "lazy refcounts need compat=1.1");
    return -EINVAL;
  }
  if (o->refcount_bits && (!is_power_of_2 (o->refcount_bits) ||
                           o->refcount_bits > 64)) {
    env_err (env, "refcount-bits %u must be a power of two from 1 to 64",
             o->refcount_bits);
    return -EINVAL;
  }
  if (o->compat_v2 && o->refcount_bits &&
      o->refcount_bits != CREATE_REFCOUNT_BITS) {
    env_err (env, "refcount widths other than 16 bits need compat=1.1");
    return -EINVAL;
  }
  if (o->compat_v2 && (o->zstd || o->data_file)) {
    env_err (env, "%s needs compat=1.1", o->zstd ? "compression-type=zstd"
             : "an external data file");
    return -EINVAL;
  }
  if (o->data_file_raw && !o->data_file) {
    env_err (env, "data-file-raw needs data-file");
    return -EINVAL;
  }
  if (o->data_file && o->backing && o->data_file_raw) {
    env_err (env, "a raw external data file cannot have a backing file");
    return -EINVAL;
  }
  if (o->luks && o->data_file_raw) {
    env_err (env, "an encrypted image's data file cannot be raw: "
             "encrypted data is not an image of the disk");
    return -EINVAL;
  }
  /* Preallocated clusters would hide the backing file, but for the
   * subclusters of extended L2 entries, which stay unallocated.
   */
  if (o->backing && o->preallocation != QCOW2_PREALLOC_OFF &&
      !o->extended_l2) {
    env_err (env, "a backing file and preallocation can only be used "
             "together with extended-l2=on (as in qemu-img)\n"
             "else the preallocated clusters would hide the backing file's "
             "data");
    return -EINVAL;
  }
  if (o->luks && (r = luks_format_check (env, o->luks, &crypto_len)) < 0)
    return r;
  if (div_round_up (div_round_up (o->size, cs), l2_entries) * 8 >
      QCOW2_MAX_L1_BYTES) {
    env_err (env, "size %" PRIu64 " is too large for %" PRIu64 "-byte "
             "clusters", o->size, cs);
    return -EFBIG;
  }
  if ((o->backing && strlen (o->backing) > QCOW2_MAX_BACKING_NAME) ||
      create_header_bytes (o) > cs) {
    env_err (env, "the file names (backing \"%s\", data file \"%s\") do "
             "not fit in the header of %" PRIu64 "-byte clusters",
             o->backing ? o->backing : "", o->data_file ? o->data_file : "",
             cs);
    return -ENAMETOOLONG;
  }
  return 0;
}

/* Where a new image's clusters go: header, refcount table, refcount
 * blocks, L1, the LUKS header (as QEMU lays them out), and extra
 * clusters after them (what preallocation adds) that the blocks count
 * too.
 */
struct create_layout {
  uint64_t cs, l1_size, l1_clusters, blocks, tclusters;
  uint64_t crypto_len, crypto_clusters, total;
};

static void
create_layout (const struct qcow2_create_options *o, uint64_t crypto_len,
               uint64_t extra, struct create_layout *l)
{
  uint64_t l2_entries;
  uint64_t per_block;

  l->cs = o->cluster_size ? o->cluster_size : 65536;
  l2_entries = l->cs / (o->extended_l2 ? 16 : 8);
  per_block = l->cs * 8 >> create_refcount_order (o);
  l->crypto_len = crypto_len;
  l->crypto_clusters = div_round_up (crypto_len, l->cs);
  l->l1_size = div_round_up (div_round_up (o->size, l->cs), l2_entries);
  l->l1_clusters = MAX (div_round_up (l->l1_size * 8, l->cs), 1);
  l->blocks = l->tclusters = 1;
  /* The blocks count every cluster, and the table holds the blocks. */
  for (;;) {
    l->total = 1 + l->tclusters + l->blocks + l->l1_clusters +
      l->crypto_clusters + extra;
    uint64_t b = div_round_up (l->total, per_block);
    uint64_t t = div_round_up (b * 8, l->cs);
    if (b == l->blocks && t == l->tclusters)
      break;
    l->blocks = b;
    l->tclusters = t;
  }
  l->total -= extra;
}

/* Checks the options and plans the layout of the new image.  Returns 0,
 * or -errno after logging an error.
 */
static int
create_plan (const struct qcow2_env *env, const struct qcow2_create_options *o,
             struct create_layout *l)
{
  uint64_t crypto_len = 0;
  int r;

  if ((r = qcow2_create_check (env, o)) < 0)
    return r;
  if (o->luks && (r = luks_format_check (env, o->luks, &crypto_len)) < 0)
    return r;
  create_layout (o, crypto_len, 0, l);
  return 0;
}

int
qcow2_create_bytes (const struct qcow2_env *env,
                    const struct qcow2_create_options *o, bool preallocated,
                    uint64_t *bytes)
{
  struct create_layout l;
  uint64_t extra = 0;
  int r;

  if ((r = create_plan (env, o, &l)) < 0)
    return r;
  /* Preallocation: every L2 table, and every data cluster but in an
   * external data file.
   */
  if (preallocated) {
    extra = l.l1_size + (o->data_file ? 0 : div_round_up (o->size, l.cs));
    create_layout (o, l.crypto_len, extra, &l);
  }
  *bytes = (l.total + extra) * l.cs;
  return 0;
}

int
qcow2_create (const struct qcow2_env *env, struct qcow2_io *io,
              const struct qcow2_create_options *o)
{
  uint32_t refcount_order = create_refcount_order (o);
  struct create_layout l;
  uint64_t cs, per_block, meta;
  uint8_t *area;
  int r;

  if ((r = create_plan (env, o, &l)) < 0)
    return r;
  cs = l.cs;
  per_block = cs * 8 >> refcount_order;
  meta = 1 + l.tclusters + l.blocks;

  area = calloc (l.total, cs);
  if (!area)
    return -ENOMEM;
  r = create_header (o, area, cs, __builtin_ctzll (cs), l.l1_size,
                     l.tclusters, meta * cs, (meta + l.l1_clusters) * cs,
                     l.crypto_len);
  assert (r == 0);              /* qcow2_create_check: the name fits */
  if (o->luks &&
      (r = luks_format (env, o->luks, area + (meta + l.l1_clusters) * cs,
                        l.crypto_len)) < 0) {
    free (area);
    return r;
  }
  for (uint64_t i = 0; i < l.blocks; i++)
    be64_put (area + cs + i * 8, (1 + l.tclusters + i) * cs);
  for (uint64_t c = 0; c < l.total; c++)
    refcount_entry_set (area + (1 + l.tclusters + c / per_block) * cs,
                        refcount_order, c % per_block, 1);

  r = io->ops->pwrite (io, area, l.total * cs, 0);
  if (r == 0)
    r = io->ops->flush (io);
  if (r < 0)
    env_err (env, "writing the new image: %s", errstr (-r));
  free (area);
  return r;
}
