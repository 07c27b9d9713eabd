/* SPDX-License-Identifier: BSD-3-Clause */
/* The on-disk formats the engine shares between its files, each with
 * one codec: the header's fields (read by header.c, patched by
 * hostio.c, written by create.c) and L2 entries (standard, extended and
 * compressed, decoded by cluster.c, check.c, write.c, write-alloc.c
 * and zero.c, made by write.c, write-alloc.c and zero.c).  The numbers
 * are the spec's (docs/interop/qcow2.rst in qemu); the _Static_asserts
 * tie the named layout to them.  Not part of the engine's interface.
 */
#ifndef QCOW2_FORMAT_H
#define QCOW2_FORMAT_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "be.h"

#define QCOW2_MAGIC 0x514649fbU         /* "QFI\xfb" */
#define QCOW2_MIN_CLUSTER_BITS 9
#define QCOW2_MAX_CLUSTER_BITS 21
#define QCOW2_MAX_L1_BYTES (32u << 20)  /* as QEMU's QCOW_MAX_L1_SIZE */
#define QCOW2_MAX_REFTABLE_BYTES (8u << 20)
#define QCOW2_MAX_SNAPSHOTS 65536
#define QCOW2_MAX_BACKING_NAME 1023
#define QCOW2_MAX_CHAIN_DEPTH 2048

/* Feature bits. */
#define QCOW2_INCOMPAT_DIRTY         (1ULL << 0)
#define QCOW2_INCOMPAT_CORRUPT       (1ULL << 1)
#define QCOW2_INCOMPAT_DATA_FILE     (1ULL << 2)
#define QCOW2_INCOMPAT_COMPRESSION   (1ULL << 3)
#define QCOW2_INCOMPAT_EXTL2         (1ULL << 4)
#define QCOW2_INCOMPAT_KNOWN         0x1fULL
#define QCOW2_COMPAT_LAZY_REFCOUNTS  (1ULL << 0)
#define QCOW2_AUTOCLEAR_BITMAPS      (1ULL << 0)
#define QCOW2_AUTOCLEAR_DATA_RAW     (1ULL << 1)

/* Header extension types. */
#define QCOW2_EXT_END            0x00000000U
#define QCOW2_EXT_BACKING_FORMAT 0xe2792acaU
#define QCOW2_EXT_FEATURE_TABLE  0x6803f857U
#define QCOW2_EXT_BITMAPS        0x23852875U
#define QCOW2_EXT_CRYPTO         0x0537be77U
#define QCOW2_EXT_DATA_FILE      0x44415441U

/* Table entries. */
#define QCOW2_OFLAG_COPIED       (1ULL << 63)
#define QCOW2_OFLAG_COMPRESSED   (1ULL << 62)
#define QCOW2_OFLAG_ZERO         (1ULL << 0)
#define QCOW2_OFFSET_MASK        0x00fffffffffffe00ULL
#define QCOW2_SUBCLUSTERS        32

#define QCOW2_CRYPT_AES          1
#define QCOW2_CRYPT_LUKS         2
#define QCOW2_CRYPT_SECTOR       512
#define QCOW2_MAX_CRYPTO_HEADER  (32u << 20)

#define QCOW2_COMPRESSION_DEFLATE 0
#define QCOW2_COMPRESSION_ZSTD    1

/* The header's fields, big-endian on disk, as the spec's table (and
 * QEMU's QCowHeader).  Never read or written as a struct: it names the
 * offsets (HDR_*), which the code uses with be.h.
 */
struct qcow2_disk_header {
  uint32_t magic;
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
  /* Version 3. */
  uint64_t incompatible_features;
  uint64_t compatible_features;
  uint64_t autoclear_features;
  uint32_t refcount_order;
  uint32_t header_length;
  /* Optional: present if header_length says so. */
  uint8_t compression_type;
  uint8_t padding[7];
} __attribute__ ((__packed__));

#define HDR_FIELD(f) ((int) offsetof (struct qcow2_disk_header, f))
#define HDR_MAGIC HDR_FIELD (magic)
#define HDR_VERSION HDR_FIELD (version)
#define HDR_BACKING_OFFSET HDR_FIELD (backing_file_offset)
#define HDR_BACKING_SIZE HDR_FIELD (backing_file_size)
#define HDR_CLUSTER_BITS HDR_FIELD (cluster_bits)
#define HDR_SIZE HDR_FIELD (size)
#define HDR_CRYPT HDR_FIELD (crypt_method)
#define HDR_L1_SIZE HDR_FIELD (l1_size)
#define HDR_L1_OFFSET HDR_FIELD (l1_table_offset)
#define HDR_REFTABLE_OFFSET HDR_FIELD (refcount_table_offset)
#define HDR_REFTABLE_CLUSTERS HDR_FIELD (refcount_table_clusters)
#define HDR_NB_SNAPSHOTS HDR_FIELD (nb_snapshots)
#define HDR_SNAPSHOTS_OFFSET HDR_FIELD (snapshots_offset)
#define HDR_INCOMPAT HDR_FIELD (incompatible_features)
#define HDR_COMPAT HDR_FIELD (compatible_features)
#define HDR_AUTOCLEAR HDR_FIELD (autoclear_features)
#define HDR_REFCOUNT_ORDER HDR_FIELD (refcount_order)
#define HDR_HEADER_LENGTH HDR_FIELD (header_length)
#define HDR_COMPRESSION_TYPE HDR_FIELD (compression_type)
/* A version 2 header ends where version 3's fields start; version 3's
 * is at least 104 bytes, and QEMU writes 112 (with the compression
 * type, padded to 8).
 */
#define QCOW2_V2_HEADER_SIZE HDR_INCOMPAT
#define HDR_V3_MIN HDR_COMPRESSION_TYPE
#define HDR_V3_SIZE ((int) sizeof (struct qcow2_disk_header))

_Static_assert (HDR_VERSION == 4 && HDR_BACKING_OFFSET == 8 &&
                HDR_BACKING_SIZE == 16 && HDR_CLUSTER_BITS == 20 &&
                HDR_SIZE == 24 && HDR_CRYPT == 32 && HDR_L1_SIZE == 36 &&
                HDR_L1_OFFSET == 40 && HDR_REFTABLE_OFFSET == 48 &&
                HDR_REFTABLE_CLUSTERS == 56 && HDR_NB_SNAPSHOTS == 60 &&
                HDR_SNAPSHOTS_OFFSET == 64, "the spec's version 2 fields");
_Static_assert (HDR_INCOMPAT == 72 && HDR_COMPAT == 80 &&
                HDR_AUTOCLEAR == 88 && HDR_REFCOUNT_ORDER == 96 &&
                HDR_HEADER_LENGTH == 100 && HDR_COMPRESSION_TYPE == 104,
                "the spec's version 3 fields");
_Static_assert (QCOW2_V2_HEADER_SIZE == 72 && HDR_V3_MIN == 104 &&
                HDR_V3_SIZE == 112, "the header's sizes");

/* The sizes the header gives, fixed at open (header.c's part of struct
 * qcow2_image).
 */
struct image_geometry {
  uint32_t cluster_bits;
  uint64_t cluster_size;
  bool extended_l2;
  uint32_t l2_entry_size;       /* 8, or 16 with extended L2 */
  uint32_t l2_bits;             /* log2 of entries per L2 table */
  uint64_t subcluster_size;
  uint32_t subcluster_bits;
  uint32_t compressed_offset_bits;      /* "x" in the spec */
};

/* L2 entries: the one codec. */

/* An extended entry's subcluster bitmap: allocated bits low, zero bits
 * high.
 */
#define L2_ALL_ALLOC 0xffffffffULL
#define L2_ALL_ZERO (0xffffffffULL << 32)

/* An L2 entry decoded. */
struct l2_state {
  uint64_t entry, bitmap;       /* as stored (bitmap 0 if not extended) */
  uint64_t host;                /* host cluster, if normal */
  bool compressed;              /* see l2_compressed_range */
  bool normal;                  /* maps a host cluster */
  bool copied;                  /* refcount exactly one */
  bool zero_flag;               /* reads as zeros (not extended) */
};

/* Decode the entry at p.  external: the image has an external data
 * file, where cluster 0 is a host cluster like any other (the entry
 * says so with COPIED).
 */
static inline void
l2_decode (const struct image_geometry *geo, bool external, const uint8_t *p,
           struct l2_state *s)
{
  s->entry = be64_get (p);
  s->bitmap = geo->extended_l2 ? be64_get (p + 8) : 0;
  s->host = s->entry & QCOW2_OFFSET_MASK;
  s->compressed = s->entry & QCOW2_OFLAG_COMPRESSED;
  s->copied = s->entry & QCOW2_OFLAG_COPIED;
  s->normal = !s->compressed &&
    (s->host != 0 || (external && s->copied));
  s->zero_flag = !geo->extended_l2 && (s->entry & QCOW2_OFLAG_ZERO);
}

/* Store entry (and bitmap, if extended) at p. */
static inline void
l2_encode (const struct image_geometry *geo, uint8_t *p, uint64_t entry,
           uint64_t bitmap)
{
  /* Only extended entries have a bitmap, and never compressed ones. */
  assert (geo->extended_l2 || bitmap == 0);
  assert (!(entry & QCOW2_OFLAG_COMPRESSED) || bitmap == 0);
  be64_put (p, entry);
  if (geo->extended_l2)
    be64_put (p + 8, bitmap);
}

/* A compressed cluster's entry: its data starts at host offset *offset
 * and lies within the *len bytes from there to the end of its last
 * 512-byte sector (the sectors the entry counts).
 */
static inline void
l2_compressed_range (const struct image_geometry *geo, uint64_t entry,
                     uint64_t *offset, uint64_t *len)
{
  uint64_t x = geo->compressed_offset_bits;
  uint64_t sectors = (entry >> x) & ((UINT64_C (1) << (62 - x)) - 1);

  assert (entry & QCOW2_OFLAG_COMPRESSED);
  *offset = entry & ((UINT64_C (1) << x) - 1);
  *len = (sectors + 1) * 512 - (*offset & 511);
}

/* Whether a compressed cluster can start at host offset: its entry
 * has x bits for it.
 */
static inline bool
l2_compressed_fits (const struct image_geometry *geo, uint64_t offset)
{
  return offset < UINT64_C (1) << geo->compressed_offset_bits;
}

/* Returns the entry of a compressed cluster of len bytes at host offset
 * (which l2_compressed_fits).
 */
static inline uint64_t
l2_compressed_entry (const struct image_geometry *geo, uint64_t offset,
                     uint64_t len)
{
  uint64_t x = geo->compressed_offset_bits;
  uint64_t sectors = ((offset + len - 1) >> 9) - (offset >> 9);

  /* At most a cluster: the extra sectors fit in 62 - x bits. */
  assert (len > 0 && len <= geo->cluster_size);
  assert (l2_compressed_fits (geo, offset));
  assert (sectors < UINT64_C (1) << (62 - x));
  return offset | QCOW2_OFLAG_COMPRESSED | sectors << x;
}

#endif /* QCOW2_FORMAT_H */
