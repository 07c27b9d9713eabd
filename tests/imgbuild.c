/* SPDX-License-Identifier: BSD-3-Clause */
/* Building qcow2 images by hand, following the specification
 * (docs/interop/qcow2.txt in QEMU) rather than the engine, and the
 * model of what they read as.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>
#include <zstd.h>

#include "be.h"
#include "checked.h"
#include "qcow2.h"
#include "imgbuild.h"
#include "xalloc.h"

#define OFLAG_COPIED     (UINT64_C (1) << 63)
#define OFLAG_COMPRESSED (UINT64_C (1) << 62)
#define OFLAG_ZERO       UINT64_C (1)
#define OFFSET_MASK      UINT64_C (0x00fffffffffffe00)
#define HOLE_ZERO        (QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO)

uint8_t
model_pattern (bool compressible, uint32_t seed, uint64_t o)
{
  uint64_t h;

  if (compressible)
    return (uint8_t) (o ^ (o >> 12) ^ seed);
  h = (o >> 8) * UINT64_C (0x9e3779b97f4a7c15) ^
      (seed + 1) * UINT64_C (0xff51afd7ed558ccd);
  h ^= h >> 29;
  return (uint8_t) (o ^ (h >> 56));
}

void
model_pattern_fill (bool compressible, uint32_t seed, uint64_t o,
                    uint8_t *buf, size_t len)
{
  /* model_pattern, with the hash computed once per 256 bytes. */
  for (size_t i = 0; i < len; ) {
    uint64_t h = ((o + i) >> 8) * UINT64_C (0x9e3779b97f4a7c15) ^
      (seed + 1) * UINT64_C (0xff51afd7ed558ccd);
    size_t end = MIN (len, i + 256 - ((o + i) & 255));
    h ^= h >> 29;
    if (compressible)
      for (; i < end; i++)
        buf[i] = (uint8_t) ((o + i) ^ ((o + i) >> 12) ^ seed);
    else
      for (; i < end; i++)
        buf[i] = (uint8_t) ((o + i) ^ (h >> 56));
  }
}

static struct model_cluster *
model_find (const struct model *m, uint64_t c)
{
  for (size_t i = 0; i < m->n; i++)
    if (m->v[i].cluster == c)
      return &m->v[i];
  return NULL;
}

/* The first cluster at or after c that the model has, or UINT64_MAX. */
static uint64_t
model_next (const struct model *m, uint64_t c)
{
  uint64_t next = UINT64_MAX;

  for (size_t i = 0; i < m->n; i++)
    if (m->v[i].cluster >= c && m->v[i].cluster < next)
      next = m->v[i].cluster;
  return next;
}

void
model_set (struct model *m, uint64_t cluster, enum model_kind kind,
           bool compressible, uint32_t seed, uint32_t alloc, uint32_t zero)
{
  struct model_cluster *mc = model_find (m, cluster);

  if (!mc) {
    m->v = test_grow (m->v, &m->cap, m->n + 1, sizeof *m->v);
    mc = &m->v[m->n++];
  }
  *mc = (struct model_cluster) {
    .cluster = cluster, .kind = kind, .compressible = compressible,
    .seed = seed, .alloc = alloc, .zero = zero,
  };
}

void
model_copy (struct model *dst, const struct model *src)
{
  *dst = *src;
  dst->cap = src->n;
  dst->v = test_xrealloc (NULL, src->n * sizeof *src->v);
  if (src->n)
    memcpy (dst->v, src->v, src->n * sizeof *src->v);
}

void
model_free (struct model *m)
{
  free (m->v);
  m->v = NULL;
  m->n = m->cap = 0;
}

enum what { W_ZERO, W_DATA, W_BACKING };

/* What guest offset o (below m->size, not raw) holds, and for how many
 * bytes at most.
 */
static enum what
model_locate (const struct model *m, uint64_t o,
              const struct model_cluster **mcp, uint64_t *run)
{
  uint64_t cs = UINT64_C (1) << m->cluster_bits;
  uint64_t c = o >> m->cluster_bits, in = o & (cs - 1);
  const struct model_cluster *mc = model_find (m, c);
  enum what w;

  *mcp = mc;
  if (!mc) {
    uint64_t next = model_next (m, c);
    *run = next == UINT64_MAX ? m->size - o : (next << m->cluster_bits) - o;
    w = W_BACKING;
  }
  else if (mc->kind != M_EXT) {
    *run = cs - in;
    w = mc->kind == M_DATA ? W_DATA : W_ZERO;
  }
  else {
    uint64_t scs = cs / 32;
    unsigned sc = in / scs;

    *run = scs - in % scs;
    if (mc->zero & (UINT32_C (1) << sc))
      w = W_ZERO;
    else if (mc->alloc & (UINT32_C (1) << sc))
      w = W_DATA;
    else
      w = W_BACKING;
  }
  if (*run > m->size - o)
    *run = m->size - o;
  return w;
}

void
model_fill (const struct model *m, uint8_t *buf, uint64_t len, uint64_t o)
{
  while (len > 0) {
    const struct model_cluster *mc;
    uint64_t n;

    if (o >= m->size) {
      memset (buf, 0, len);
      return;
    }
    if (m->raw) {
      n = len < m->size - o ? len : m->size - o;
      memcpy (buf, m->raw + o, n);
    }
    else {
      enum what w = model_locate (m, o, &mc, &n);
      if (n > len)
        n = len;
      switch (w) {
      case W_ZERO:
        memset (buf, 0, n);
        break;
      case W_DATA:
        model_pattern_fill (mc->compressible, mc->seed, o, buf, n);
        break;
      case W_BACKING:
        if (m->backing)
          model_fill (m->backing, buf, n, o);
        else
          memset (buf, 0, n);
        break;
      }
    }
    buf += n;
    o += n;
    len -= n;
  }
}

uint32_t
model_extent (const struct model *m, uint64_t o, uint64_t *run)
{
  const struct model_cluster *mc;
  uint64_t brun;
  uint32_t type;

  if (o >= m->size) {
    *run = UINT64_MAX - o;
    return HOLE_ZERO;
  }
  if (m->raw) {                 /* memio has no holes: all data */
    *run = m->size - o;
    return 0;
  }
  switch (model_locate (m, o, &mc, run)) {
  case W_ZERO:
    return HOLE_ZERO;
  case W_DATA:
    return 0;
  case W_BACKING:
  default:
    if (!m->backing)
      return HOLE_ZERO;
    type = model_extent (m->backing, o, &brun);
    if (brun < *run)
      *run = brun;
    return type;
  }
}

void
ib_init (struct ib *ib, unsigned version, unsigned cluster_bits,
         uint64_t size, bool ext_l2)
{
  uint64_t span, l1_clusters;

  memset (ib, 0, sizeof *ib);
  ib->version = version;
  ib->cluster_bits = cluster_bits;
  ib->cs = UINT64_C (1) << cluster_bits;
  ib->size = size;
  ib->ext_l2 = ext_l2;
  ib->entry_size = ext_l2 ? 16 : 8;
  ib->l2_entries = ib->cs / ib->entry_size;
  if (ext_l2)
    ib->incompat |= UINT64_C (1) << 4;
  span = ib->cs * ib->l2_entries;
  ib->l1_size = (size + span - 1) / span;
  ib->model.cluster_bits = cluster_bits;
  ib->model.size = size;

  /* Header, refcount table, L1 table; the rest as needed. */
  ib_alloc (ib, 2);
  l1_clusters = ((uint64_t) ib->l1_size * 8 + ib->cs - 1) / ib->cs;
  ib->l1_offset = ib_alloc (ib, l1_clusters ? l1_clusters : 1);
}

void
ib_free (struct ib *ib)
{
  free (ib->buf);
  model_free (&ib->model);
  for (unsigned i = 0; i < ib->nb_snaps; i++)
    model_free (&ib->snaps[i].model);
  memset (ib, 0, sizeof *ib);
}

uint64_t
ib_alloc (struct ib *ib, uint64_t n)
{
  uint64_t off = ib->len;

  ib->buf = test_grow (ib->buf, &ib->cap, ib->len + n * ib->cs, 1);
  memset (ib->buf + off, 0, n * ib->cs);
  ib->len += n * ib->cs;
  return off;
}

uint64_t
ib_l2_entry (struct ib *ib, uint64_t c)
{
  uint64_t l1_index = c / ib->l2_entries;
  uint8_t *l1e = ib->buf + ib->l1_offset + l1_index * 8;
  uint64_t l2 = be64_get (l1e) & OFFSET_MASK;

  if (l2 == 0) {
    l2 = ib_alloc (ib, 1);
    /* ib_alloc moved buf. */
    be64_put (ib->buf + ib->l1_offset + l1_index * 8, l2 | OFLAG_COPIED);
  }
  return l2 + (c % ib->l2_entries) * ib->entry_size;
}

void
ib_set (struct ib *ib, uint64_t c, uint64_t entry, uint64_t bitmap)
{
  uint64_t e = ib_l2_entry (ib, c);

  be64_put (ib->buf + e, entry);
  if (ib->ext_l2)
    be64_put (ib->buf + e + 8, bitmap);
}

static void
ib_fill (const struct ib *ib, uint8_t *p, uint64_t c, bool compressible,
         uint32_t seed)
{
  model_pattern_fill (compressible, seed, c * ib->cs, p, ib->cs);
}

uint64_t
ib_data (struct ib *ib, uint64_t c, uint32_t seed)
{
  uint64_t host = ib_alloc (ib, 1);

  ib_fill (ib, ib->buf + host, c, false, seed);
  ib_set (ib, c, host | OFLAG_COPIED, 0xffffffff);
  model_set (&ib->model, c, M_DATA, false, seed, 0, 0);
  return host;
}

void
ib_zero (struct ib *ib, uint64_t c)
{
  if (ib->ext_l2)
    ib_set (ib, c, 0, UINT64_C (0xffffffff) << 32);
  else
    ib_set (ib, c, OFLAG_ZERO, 0);
  model_set (&ib->model, c, M_ZERO, false, 0, 0, 0);
}

void
ib_ext (struct ib *ib, uint64_t c, uint32_t seed, uint32_t alloc,
        uint32_t zero)
{
  uint64_t host = 0;

  if (alloc) {
    host = ib_alloc (ib, 1);
    ib_fill (ib, ib->buf + host, c, false, seed);
    host |= OFLAG_COPIED;
  }
  ib_set (ib, c, host, (uint64_t) zero << 32 | alloc);
  model_set (&ib->model, c, M_EXT, false, seed, alloc, zero);
}

uint64_t
ib_compressed (struct ib *ib, uint64_t c, uint32_t seed, bool compressible,
               unsigned gap)
{
  uint8_t *in = test_xrealloc (NULL, ib->cs);
  size_t cap = ib->cs * 2 + 1024, clen;
  uint8_t *out = test_xrealloc (NULL, cap);
  uint64_t host, x, sectors;

  ib_fill (ib, in, c, compressible, seed);
  if (ib->compression_type == 1) {
    clen = ZSTD_compress (out, cap, in, ib->cs, 3);
    if (ZSTD_isError (clen))
      abort ();
  }
  else {
    /* Raw deflate with a 4 KiB window, as QEMU writes it. */
    z_stream s;
    memset (&s, 0, sizeof s);
    if (deflateInit2 (&s, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -12, 9,
                      Z_DEFAULT_STRATEGY) != Z_OK)
      abort ();
    s.next_in = in;
    s.avail_in = ib->cs;
    s.next_out = out;
    s.avail_out = cap;
    if (deflate (&s, Z_FINISH) != Z_STREAM_END)
      abort ();
    clen = s.total_out;
    deflateEnd (&s);
  }

  host = ib_alloc (ib, (gap + clen + ib->cs - 1) / ib->cs) + gap;
  memcpy (ib->buf + host, out, clen);
  x = 62 - (ib->cluster_bits - 8);
  sectors = ((host + clen - 1) >> 9) - (host >> 9);
  ib_set (ib, c, OFLAG_COMPRESSED | sectors << x | host, 0);
  model_set (&ib->model, c, M_DATA, compressible, seed, 0, 0);
  free (in);
  free (out);
  return host;
}

void
ib_snapshot (struct ib *ib, const char *id, const char *name,
             uint64_t disk_size, bool extra)
{
  struct ib_snapshot *sn;
  uint64_t l1_bytes = (uint64_t) ib->l1_size * 8;

  if (ib->nb_snaps >= sizeof ib->snaps / sizeof ib->snaps[0])
    abort ();
  sn = &ib->snaps[ib->nb_snaps++];
  sn->l1_size = ib->l1_size;
  /* Without the extra data, a snapshot has the image's size. */
  sn->disk_size = disk_size && extra ? disk_size : ib->size;
  sn->extra = extra;
  snprintf (sn->id, sizeof sn->id, "%s", id);
  snprintf (sn->name, sizeof sn->name, "%s", name);
  model_copy (&sn->model, &ib->model);
  sn->model.size = sn->disk_size;

  sn->l1_offset = ib_alloc (ib, (l1_bytes + ib->cs - 1) / ib->cs);
  for (uint32_t i = 0; i < ib->l1_size; i++) {
    uint64_t l2 = be64_get (ib->buf + ib->l1_offset + i * 8) & OFFSET_MASK;
    uint64_t copy;

    if (!l2)
      continue;
    if (ib->share_l2) {
      copy = l2;
      be64_put (ib->buf + ib->l1_offset + i * 8, l2);
    }
    else {
      copy = ib_alloc (ib, 1);
      memcpy (ib->buf + copy, ib->buf + l2, ib->cs);
    }
    be64_put (ib->buf + sn->l1_offset + i * 8, copy);
    /* Data clusters are now shared, so neither copy may say COPIED. */
    for (uint32_t j = 0; j < ib->l2_entries; j++) {
      for (int k = 0; k < 2; k++) {
        uint8_t *e = ib->buf + (k ? copy : l2) + j * ib->entry_size;
        be64_put (e, be64_get (e) & ~OFLAG_COPIED);
      }
    }
  }
}

/* Count a reference to the host cluster at offset, if in the file. */
static void
ib_ref (const struct ib *ib, uint16_t *rc, uint64_t n, uint64_t offset)
{
  if (offset / ib->cs < n)
    rc[offset / ib->cs]++;
}

static void
ib_ref_l1 (const struct ib *ib, uint16_t *rc, uint64_t n, uint64_t l1,
           uint32_t l1_size)
{
  uint64_t x = 62 - (ib->cluster_bits - 8);

  for (uint64_t off = l1; off < l1 + (uint64_t) l1_size * 8; off += ib->cs)
    ib_ref (ib, rc, n, off);
  for (uint32_t i = 0; i < l1_size; i++) {
    uint64_t l2 = be64_get (ib->buf + l1 + i * 8) & OFFSET_MASK;

    if (!l2 || l2 + ib->cs > ib->len)
      continue;
    ib_ref (ib, rc, n, l2);
    for (uint32_t j = 0; j < ib->l2_entries; j++) {
      uint64_t e = be64_get (ib->buf + l2 + j * ib->entry_size);

      if (e & OFLAG_COMPRESSED) {
        uint64_t host = e & ((UINT64_C (1) << x) - 1);
        uint64_t sectors = (e >> x) & ((UINT64_C (1) << (62 - x)) - 1);
        uint64_t end = (host & ~UINT64_C (511)) + (sectors + 1) * 512;
        for (uint64_t c = host / ib->cs; c * ib->cs < end; c++)
          ib_ref (ib, rc, n, c * ib->cs);
      }
      else if ((e & OFFSET_MASK) && !(ib->incompat & (UINT64_C (1) << 2)))
        ib_ref (ib, rc, n, e & OFFSET_MASK);    /* not in a data file */
    }
  }
}

static uint64_t
ib_write_snapshots (struct ib *ib)
{
  size_t len = 0, off = 0;
  uint8_t *t = NULL;
  uint64_t host;

  for (unsigned i = 0; i < ib->nb_snaps; i++) {
    const struct ib_snapshot *sn = &ib->snaps[i];
    size_t idl = strlen (sn->id), nl = strlen (sn->name);
    size_t extra = sn->extra ? 16 : 0;

    len = (off + 40 + extra + idl + nl + 7) & ~(size_t) 7;
    t = test_xrealloc (t, len);
    memset (t + off, 0, len - off);
    be64_put (t + off, sn->l1_offset);
    be32_put (t + off + 8, sn->l1_size);
    be16_put (t + off + 12, idl);
    be16_put (t + off + 14, nl);
    be32_put (t + off + 36, extra);
    if (extra)
      be64_put (t + off + 48, sn->disk_size);
    memcpy (t + off + 40 + extra, sn->id, idl);
    memcpy (t + off + 40 + extra + idl, sn->name, nl);
    off = len;
  }
  host = ib_alloc (ib, (len + ib->cs - 1) / ib->cs);
  memcpy (ib->buf + host, t, len);
  free (t);
  return host;
}

void
ib_bitmap (struct ib *ib, const char *name, unsigned granularity_bits,
           uint32_t flags, uint32_t seed)
{
  struct ib_bitmap *b = &ib->bitmaps[ib->nb_bitmaps++];
  uint64_t granules = (ib->size + (UINT64_C (1) << granularity_bits) - 1)
    >> granularity_bits;
  uint64_t bytes = (granules + 7) / 8;
  uint32_t x = seed;

  if (ib->nb_bitmaps > 4)
    abort ();
  snprintf (b->name, sizeof b->name, "%s", name);
  b->granularity_bits = granularity_bits;
  b->flags = flags;
  b->table_size = (bytes + ib->cs - 1) / ib->cs;
  b->table_offset = ib_alloc (ib, (b->table_size * 8 + ib->cs - 1) / ib->cs);
  for (uint32_t i = 0; i < b->table_size; i++) {
    uint64_t entry = 0;
    uint8_t *data;

    x = x * 1103515245 + 12345;
    if (b->table_size > 1 && i == b->table_size - 1)
      entry = 1;                /* all ones */
    else if ((x >> 16) % 3) {
      entry = ib_alloc (ib, 1);
      data = ib->buf + entry;
      /* A few granules dirty, the bytes past the last granule zero. */
      for (uint64_t j = 0; j < ib->cs && i * ib->cs + j < bytes; j++) {
        x = x * 1103515245 + 12345;
        data[j] = (x >> 16) % 4 == 0 ? x >> 24 : 0;
      }
      if ((i + 1) * ib->cs >= bytes && granules % 8)
        data[bytes - 1 - i * ib->cs] &= (1u << granules % 8) - 1;
    }
    be64_put (ib->buf + b->table_offset + (uint64_t) i * 8, entry);
  }
}

/* The bitmap directory; returns its offset, and its size in *size. */
static uint64_t
ib_write_bitmap_directory (struct ib *ib, uint64_t *size)
{
  size_t len = 0;
  uint8_t *d = NULL;
  uint64_t host;

  for (unsigned i = 0; i < ib->nb_bitmaps; i++) {
    const struct ib_bitmap *b = &ib->bitmaps[i];
    size_t nl = strlen (b->name), off = len;

    len = (off + 24 + nl + 7) & ~(size_t) 7;
    d = test_xrealloc (d, len);
    memset (d + off, 0, len - off);
    be64_put (d + off, b->table_offset);
    be32_put (d + off + 8, b->table_size);
    be32_put (d + off + 12, b->flags);
    d[off + 16] = 1;            /* dirty tracking */
    d[off + 17] = b->granularity_bits;
    be16_put (d + off + 18, nl);
    memcpy (d + off + 24, b->name, nl);
  }
  host = ib_alloc (ib, (len + ib->cs - 1) / ib->cs);
  memcpy (ib->buf + host, d, len);
  free (d);
  *size = len;
  return host;
}

/* Refcount entry i of a block, at 1 << order bits (3 to 6). */
static void
ib_put_refcount (uint8_t *block, unsigned order, uint64_t i, uint64_t v)
{
  switch (order) {
  case 3: block[i] = v; break;
  case 4: be16_put (block + i * 2, v); break;
  case 5: be32_put (block + i * 4, v); break;
  default: be64_put (block + i * 8, v); break;
  }
}

static void
ib_write_refcounts (struct ib *ib)
{
  unsigned order = ib->refcount_order ? ib->refcount_order : 4;
  uint64_t per_block = ib->cs * 8 >> order;
  uint64_t n = ib->len / ib->cs, blocks = 0, first;
  uint16_t *rc;

  /* The blocks must count themselves too. */
  while (blocks * per_block < n + blocks)
    blocks++;
  first = ib_alloc (ib, blocks);
  n = ib->len / ib->cs;
  if (blocks > ib->cs / 8)
    abort ();                   /* more than one refcount table cluster */

  rc = calloc (n, sizeof *rc);
  if (!rc)
    abort ();
  rc[0] = rc[1] = 1;            /* header, refcount table */
  for (uint64_t b = 0; b < blocks; b++) {
    rc[first / ib->cs + b] = 1;
    be64_put (ib->buf + ib->cs + b * 8, first + b * ib->cs);
  }
  ib_ref_l1 (ib, rc, n, ib->l1_offset, ib->l1_size);
  for (unsigned i = 0; i < ib->nb_snaps; i++)
    ib_ref_l1 (ib, rc, n, ib->snaps[i].l1_offset, ib->snaps[i].l1_size);
  /* Whatever else was allocated (the snapshot table) is in use. */
  for (uint64_t c = 0; c < n; c++) {
    if (rc[c] == 0)
      rc[c] = 1;
    ib_put_refcount (ib->buf + first + c / per_block * ib->cs, order,
                     c % per_block, rc[c]);
  }
  free (rc);
}

static void
ib_write_ext (uint8_t *h, uint64_t *off, uint32_t type, const void *data,
              uint32_t len)
{
  be32_put (h + *off, type);
  be32_put (h + *off + 4, len);
  if (len)
    memcpy (h + *off + 8, data, len);
  *off += 8 + ((len + 7) & ~UINT32_C (7));
}

void
ib_finish (struct ib *ib)
{
  uint64_t snapshots_offset = 0, off, dir_offset = 0, dir_size = 0;
  uint32_t header_length = ib->version >= 3 ? 112 : 72;
  uint8_t *h;

  if (ib->nb_snaps)
    snapshots_offset = ib_write_snapshots (ib);
  if (ib->nb_bitmaps) {
    dir_offset = ib_write_bitmap_directory (ib, &dir_size);
    ib->autoclear |= 1;         /* the bitmaps extension is valid */
  }
  ib_write_refcounts (ib);

  h = ib->buf;
  be32_put (h + 0, 0x514649fb);
  be32_put (h + 4, ib->version);
  be32_put (h + 20, ib->cluster_bits);
  be64_put (h + 24, ib->size);
  be32_put (h + 36, ib->l1_size);
  be64_put (h + 40, ib->l1_offset);
  be64_put (h + 48, ib->cs);
  be32_put (h + 56, 1);
  be32_put (h + 60, ib->nb_snaps);
  be64_put (h + 64, snapshots_offset);
  if (ib->version >= 3) {
    uint64_t incompat = ib->incompat;
    if (ib->compression_type)
      incompat |= UINT64_C (1) << 3;
    be64_put (h + 72, incompat);
    be64_put (h + 80, ib->compat);
    be64_put (h + 88, ib->autoclear);
    be32_put (h + 96, ib->refcount_order ? ib->refcount_order : 4);
    be32_put (h + 100, header_length);
    h[104] = ib->compression_type;
  }

  off = header_length;
  if (ib->backing_format)
    ib_write_ext (h, &off, 0xe2792aca, ib->backing_format,
                  strlen (ib->backing_format));
  if (ib->extra_ext_len)
    ib_write_ext (h, &off, ib->extra_ext_type, ib->extra_ext_data,
                  ib->extra_ext_len);
  if (ib->nb_bitmaps) {
    uint8_t ext[24] = { 0 };

    be32_put (ext, ib->nb_bitmaps);
    be64_put (ext + 8, dir_size);
    be64_put (ext + 16, dir_offset);
    ib_write_ext (h, &off, 0x23852875, ext, sizeof ext);
  }
  ib_write_ext (h, &off, 0, NULL, 0);
  if (ib->backing) {
    be64_put (h + 8, off);
    be32_put (h + 16, strlen (ib->backing));
    memcpy (h + off, ib->backing, strlen (ib->backing));
  }
}

void
ib_dump_bytes (const char *name, const void *data, size_t len)
{
  const char *dir = getenv ("IB_DUMP_DIR");
  char path[4096];
  FILE *fp;

  if (!dir)
    return;
  snprintf (path, sizeof path, "%s/%s", dir, name);
  fp = fopen (path, "w");
  if (!fp || fwrite (data, 1, len, fp) != len || fclose (fp)) {
    perror (path);
    exit (EXIT_FAILURE);
  }
}

void
ib_dump (const struct ib *ib, const char *name)
{
  char expected[256];
  uint8_t *buf;

  if (!getenv ("IB_DUMP_DIR"))
    return;
  ib_dump_bytes (name, ib->buf, ib->len);
  /* What the model says the guest reads as, when that is small. */
  if (ib->model.size > (64 << 20))
    return;
  buf = test_xrealloc (NULL, ib->model.size);
  model_fill (&ib->model, buf, ib->model.size, 0);
  snprintf (expected, sizeof expected, "%s.expected", name);
  ib_dump_bytes (expected, buf, ib->model.size);
  free (buf);
}
