/* SPDX-License-Identifier: BSD-3-Clause */
/* Small qcow2 images built by hand in memory for the unit tests, each
 * with a model of what its guest should read as, so that tests compare
 * the engine against an independent description of the image rather
 * than against the engine's own idea of it.
 */
#ifndef QCOW2_IMGBUILD_H
#define QCOW2_IMGBUILD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What one guest cluster holds, as the model sees it.  Clusters not in
 * the model are unallocated: they show the backing layer, or zeros.
 */
enum model_kind {
  M_DATA,                       /* data, model_pattern of seed */
  M_ZERO,                       /* reads as zeros */
  M_EXT,                        /* per subcluster, from the bitmaps */
};

struct model_cluster {
  uint64_t cluster;             /* guest cluster index */
  enum model_kind kind;
  bool compressible;            /* which data pattern */
  uint32_t seed;
  uint32_t alloc, zero;         /* M_EXT: extended L2 bitmaps */
};

struct model {
  unsigned cluster_bits;
  uint64_t size;                /* guest size */
  struct model_cluster *v;
  size_t n, cap;
  const uint8_t *raw;           /* a raw layer: its size bytes */
  const struct model *backing;
};

/* The data byte at guest offset o.  The compressible pattern deflates
 * well; the other differs at every shift, so misplaced data shows.
 */
extern uint8_t model_pattern (bool compressible, uint32_t seed, uint64_t o);
/* The same for guest bytes [o, o+len), faster. */
extern void model_pattern_fill (bool compressible, uint32_t seed, uint64_t o,
                                uint8_t *buf, size_t len);
extern void model_set (struct model *m, uint64_t cluster,
                       enum model_kind kind, bool compressible,
                       uint32_t seed, uint32_t alloc, uint32_t zero);
extern void model_copy (struct model *dst, const struct model *src);
extern void model_free (struct model *m);

/* What guest [o, o+len) of the layer reads as. */
extern void model_fill (const struct model *m, uint8_t *buf, uint64_t len,
                        uint64_t o);

/* The extent type (QCOW2_EXTENT_*) at guest offset o, and in *run how
 * far from o the answer is certainly the same (at least 1).
 */
extern uint32_t model_extent (const struct model *m, uint64_t o,
                              uint64_t *run);

/* A persistent dirty bitmap (the bitmaps extension). */
struct ib_bitmap {
  char name[16];
  unsigned granularity_bits;
  uint32_t flags;               /* 1: in use, 2: auto (enabled) */
  uint64_t table_offset;
  uint32_t table_size;
};

struct ib_snapshot {
  uint64_t l1_offset;
  uint32_t l1_size;
  uint64_t disk_size;
  bool extra;                   /* write the extra data with disk_size */
  char id[16], name[32];
  struct model model;
};

/* An image under construction.  The fields after the layout may be
 * changed between ib_init and ib_finish.
 */
struct ib {
  uint8_t *buf;
  size_t len;                   /* always whole clusters */
  size_t cap;                   /* bytes at buf */
  unsigned version, cluster_bits;
  uint64_t cs;                  /* cluster size */
  uint64_t size;
  bool ext_l2;
  uint32_t l2_entries;          /* entries per L2 table */
  uint32_t entry_size;          /* 8 or 16 */
  uint64_t l1_offset;
  uint32_t l1_size;

  uint64_t incompat, compat, autoclear;
  uint8_t compression_type;     /* 0 deflate, 1 zstd */
  const char *backing, *backing_format;
  uint32_t extra_ext_type;      /* an extra header extension, if len */
  const void *extra_ext_data;
  uint32_t extra_ext_len;

  struct ib_snapshot snaps[4];
  unsigned nb_snaps;
  /* Snapshots share the L2 tables with the active image, as qemu-img
   * snapshot makes them, instead of getting copies (the active image
   * must then not be changed through ib_data and the like).
   */
  bool share_l2;
  struct ib_bitmap bitmaps[4];
  unsigned nb_bitmaps;
  unsigned refcount_order;      /* 3 to 6; 0 means 4 (16 bits) */

  struct model model;           /* what the active image reads as */
};

extern void ib_init (struct ib *ib, unsigned version, unsigned cluster_bits,
                     uint64_t size, bool ext_l2);
extern void ib_free (struct ib *ib);

/* Append n zeroed clusters; returns the host offset of the first. */
extern uint64_t ib_alloc (struct ib *ib, uint64_t n);
/* The byte offset in buf of guest cluster c's L2 entry, allocating the
 * L2 table if needed.
 */
extern uint64_t ib_l2_entry (struct ib *ib, uint64_t c);
/* Write an L2 entry as given, leaving the model alone (bad entries). */
extern void ib_set (struct ib *ib, uint64_t c, uint64_t entry,
                    uint64_t bitmap);

/* Allocate guest cluster c as data; returns its host offset. */
extern uint64_t ib_data (struct ib *ib, uint64_t c, uint32_t seed);
extern void ib_zero (struct ib *ib, uint64_t c);
/* Extended L2 only: c with the given subcluster bitmaps (a host
 * cluster only if alloc is not 0).
 */
extern void ib_ext (struct ib *ib, uint64_t c, uint32_t seed,
                    uint32_t alloc, uint32_t zero);
/* c as a compressed cluster (deflate or zstd, as compression_type
 * says) stored gap bytes into a fresh host cluster; returns the host
 * offset of the compressed data.
 */
extern uint64_t ib_compressed (struct ib *ib, uint64_t c, uint32_t seed,
                               bool compressible, unsigned gap);

/* Take an internal snapshot of the active state (copies of the L1 and
 * L2 tables, sharing data clusters).  disk_size 0 means the image size.
 */
extern void ib_snapshot (struct ib *ib, const char *id, const char *name,
                         uint64_t disk_size, bool extra);

/* Add a bitmap whose bits are random (from seed): some of its clusters
 * all zeros (a table entry of 0), one all ones if it has several.
 */
extern void ib_bitmap (struct ib *ib, const char *name,
                       unsigned granularity_bits, uint32_t flags,
                       uint32_t seed);

/* Write the snapshot table, bitmap directory, refcounts and header.
 * Call once.
 */
extern void ib_finish (struct ib *ib);

/* If $IB_DUMP_DIR is set, write the image there as name, and what the
 * model says it reads as (if small) as name.expected, so the builder
 * can be checked with qemu-img.
 */
extern void ib_dump (const struct ib *ib, const char *name);
extern void ib_dump_bytes (const char *name, const void *data, size_t len);

#endif /* QCOW2_IMGBUILD_H */
