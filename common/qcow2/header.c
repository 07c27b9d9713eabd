/* SPDX-License-Identifier: BSD-3-Clause */
/* Reading and validating the qcow2 header and its extensions.  Every
 * field is checked before anything trusts it; errors name the field and
 * its offset in the file.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

int
qcow2_probe (struct qcow2_io *io)
{
  uint8_t magic[4];
  int64_t size = io->ops->size (io);
  int r;

  if (size < 0)
    return size;
  if ((uint64_t) size < sizeof magic)
    return 0;
  if ((r = io->ops->pread (io, magic, sizeof magic, HDR_MAGIC)) < 0)
    return r;
  return be32_get (magic) == QCOW2_MAGIC;
}

void
header_free (struct qcow2_header *h)
{
  free (h->backing_file);
  free (h->backing_format);
  free (h->data_file);
  h->backing_file = h->backing_format = h->data_file = NULL;
}

/* A table of n bytes at offset must be cluster aligned and inside the
 * file.
 */
static int
header_check_table (struct qcow2_image *img, const char *what,
                    uint64_t offset, uint64_t bytes, uint64_t field)
{
  if (offset & (img->geo.cluster_size - 1)) {
    log_error (img, "%s offset %#" PRIx64 " (header offset %#" PRIx64 ") is not "
               "aligned to the cluster size %" PRIu64,
               what, offset, field, img->geo.cluster_size);
    return -EINVAL;
  }
  if (bytes && range_exceeds (offset, bytes, img->file_size)) {
    log_error (img, "%s at %#" PRIx64 " (%" PRIu64 " bytes, header offset "
               "%#" PRIx64 ") lies beyond the end of the file (the file ends "
               "at %#" PRIx64 ")", what, offset, bytes, field, img->file_size);
    return -EINVAL;
  }
  return 0;
}

/* Names of unknown incompatible features, from the feature name table
 * where the image has one, so the error says what the image needs.
 */
static void
header_report_unknown (struct qcow2_image *img, uint64_t bits,
                       const uint8_t *table, uint32_t table_len)
{
  char msg[512];
  size_t n = 0;

  msg[0] = '\0';
  for (unsigned bit = 0; bit < 64; bit++) {
    if (!(bits & (1ULL << bit)))
      continue;
    char name[47] = "";
    for (uint32_t i = 0; table && i + 48 <= table_len; i += 48) {
      if (table[i] == 0 && table[i + 1] == bit) {
        memcpy (name, &table[i + 2], 46);
        name[46] = '\0';
        break;
      }
    }
    int r = snprintf (msg + n, sizeof msg - n, "%sbit %u%s%s%s",
                      n ? ", " : "", bit,
                      name[0] ? " (" : "", name, name[0] ? ")" : "");
    if (r < 0 || (size_t) r >= sizeof msg - n)
      break;
    n += r;
  }
  log_error (img, "image uses unsupported incompatible feature(s): %s "
             "(incompatible_features %#" PRIx64 " at header offset %#x)",
             msg, img->h.incompatible_features, HDR_INCOMPAT);
}

static char *
header_strndup (const uint8_t *p, size_t len)
{
  char *s = malloc (len + 1);
  if (s) {
    memcpy (s, p, len);
    s[len] = '\0';
  }
  return s;
}

/* Walk the header extensions in buf[start, end), of which the first
 * avail bytes of buf are read: -EAGAIN if they reach past that (walked
 * again once more is read: what a walk sets, a second one sets alike).
 */
static int
header_read_extensions (struct qcow2_image *img, const uint8_t *buf,
                        uint64_t start, uint64_t end, uint64_t avail,
                        const uint8_t **feature_table, uint32_t *ft_len)
{
  struct qcow2_header *h = &img->h;
  uint64_t off = start;

  while (off < end) {
    if (end - off < 8) {
      log_error (img, "header extension at offset %#" PRIx64 " is "
                 "truncated", off);
      return -EINVAL;
    }
    if (off > avail || avail - off < 8)
      return -EAGAIN;
    uint32_t type = be32_get (buf + off);
    uint32_t len = be32_get (buf + off + 4);
    off += 8;
    if (type == QCOW2_EXT_END) {
      h->names_end = MAX (h->names_end, off);
      return 0;
    }
    if (len > end - off) {
      log_error (img, "header extension %#" PRIx32 " at offset %#" PRIx64
                 " is too large (%" PRIu32 " bytes, only %" PRIu64
                 " left before offset %#" PRIx64 ")",
                 type, off - 8, len, end - off, end);
      return -EINVAL;
    }
    if (len > avail - off)
      return -EAGAIN;
    const uint8_t *data = buf + off;

    switch (type) {
    case QCOW2_EXT_BACKING_FORMAT:
      h->backing_format_ext = off - 8;
      free (h->backing_format);
      h->backing_format = header_strndup (data, MIN (len, 64));
      if (!h->backing_format)
        return -errno;
      break;
    case QCOW2_EXT_FEATURE_TABLE:
      *feature_table = data;
      *ft_len = len;
      break;
    case QCOW2_EXT_DATA_FILE:
      free (h->data_file);
      h->data_file = header_strndup (data, len);
      if (!h->data_file)
        return -errno;
      break;
    case QCOW2_EXT_CRYPTO:
      if (len < 16) {
        log_error (img, "encryption header extension at offset %#" PRIx64
                   " is too short (%" PRIu32 " bytes)", off - 8, len);
        return -EINVAL;
      }
      h->has_crypto_ext = true;
      h->crypto_offset = be64_get (data);
      h->crypto_length = be64_get (data + 8);
      break;
    case QCOW2_EXT_BITMAPS:
      if (len < 24) {
        log_error (img, "bitmaps header extension at offset %#" PRIx64
                   " is too short (%" PRIu32 " bytes)", off - 8, len);
        return -EINVAL;
      }
      /* Only meaningful while the autoclear bit says it is valid. */
      if (h->autoclear_features & QCOW2_AUTOCLEAR_BITMAPS) {
        h->has_bitmaps_ext = true;
        h->nb_bitmaps = be32_get (data);
        h->bitmap_directory_size = be64_get (data + 8);
        h->bitmap_directory_offset = be64_get (data + 16);
        h->bitmaps_field_offset = off + 16;
      }
      break;
    default:
      /* Unknown extensions are ignored, as the spec allows. */
      break;
    }

    /* Extension data is padded to 8 bytes. */
    off += ((uint64_t) len + 7) & ~UINT64_C (7);
  }
  h->names_end = MAX (h->names_end, off);
  return 0;
}

static int
header_check_v3 (struct qcow2_image *img, const uint8_t *buf)
{
  struct qcow2_header *h = &img->h;

  h->incompatible_features = be64_get (buf + HDR_INCOMPAT);
  h->compatible_features = be64_get (buf + HDR_COMPAT);
  h->autoclear_features = be64_get (buf + HDR_AUTOCLEAR);
  h->refcount_order = be32_get (buf + HDR_REFCOUNT_ORDER);
  h->header_length = be32_get (buf + HDR_HEADER_LENGTH);

  if (h->header_length < HDR_V3_MIN) {
    log_error (img, "header_length %" PRIu32 " (header offset %#x) is "
               "shorter than the version 3 minimum of %d",
               h->header_length, HDR_HEADER_LENGTH, HDR_V3_MIN);
    return -EINVAL;
  }
  if (h->header_length > img->geo.cluster_size) {
    log_error (img, "header_length %" PRIu32 " (header offset %#x) exceeds "
               "the cluster size %" PRIu64,
               h->header_length, HDR_HEADER_LENGTH, img->geo.cluster_size);
    return -EINVAL;
  }
  if (h->refcount_order > 6) {
    log_error (img, "refcount_order %" PRIu32 " (header offset %#x) is out "
               "of range (0 to 6)", h->refcount_order, HDR_REFCOUNT_ORDER);
    return -EINVAL;
  }
  return 0;
}

static int
header_check_compression (struct qcow2_image *img)
{
  struct qcow2_header *h = &img->h;
  bool bit = h->incompatible_features & QCOW2_INCOMPAT_COMPRESSION;

  if (h->compression_type > QCOW2_COMPRESSION_ZSTD) {
    log_error (img, "unknown compression type %u (header offset %#x)",
               h->compression_type, HDR_COMPRESSION_TYPE);
    return -ENOTSUP;
  }
  if (bit != (h->compression_type != QCOW2_COMPRESSION_DEFLATE)) {
    log_error (img, "compression type %u (header offset %#x) does not agree "
               "with incompatible feature bit 3 (%s)", h->compression_type,
               HDR_COMPRESSION_TYPE, bit ? "set" : "clear");
    return -EINVAL;
  }
  return 0;
}

static int
header_check_tables (struct qcow2_image *img)
{
  struct qcow2_header *h = &img->h;
  uint64_t l2_coverage, l1_needed, bytes;
  int r;

  /* Guest bytes covered by one L2 table, and so L1 entries needed. */
  l2_coverage = img->geo.cluster_size << img->geo.l2_bits;
  l1_needed = div_round_up (h->size, l2_coverage);
  if ((uint64_t) h->l1_size * 8 > QCOW2_MAX_L1_BYTES) {
    log_error (img, "l1_size %" PRIu32 " (header offset %#x) is too large "
               "(at most %u entries)", h->l1_size, HDR_L1_SIZE,
               QCOW2_MAX_L1_BYTES / 8);
    return -EFBIG;
  }
  if (h->l1_size < l1_needed) {
    log_error (img, "L1 table is too small: l1_size %" PRIu32 " (header "
               "offset %#x) but the virtual size %" PRIu64 " needs %" PRIu64
               " entries", h->l1_size, HDR_L1_SIZE, h->size, l1_needed);
    return -EINVAL;
  }
  r = header_check_table (img, "L1 table", h->l1_table_offset,
                          (uint64_t) h->l1_size * 8, HDR_L1_OFFSET);
  if (r < 0)
    return r;

  if (h->refcount_table_clusters == 0) {
    log_error (img, "refcount_table_clusters (header offset %#x) is 0",
               HDR_REFTABLE_CLUSTERS);
    return -EINVAL;
  }
  if (mul_overflow_u64 (h->refcount_table_clusters, img->geo.cluster_size,
                        &bytes) ||
      bytes > QCOW2_MAX_REFTABLE_BYTES) {
    log_error (img, "refcount_table_clusters %" PRIu32 " (header offset %#x)"
               " is too large", h->refcount_table_clusters,
               HDR_REFTABLE_CLUSTERS);
    return -EFBIG;
  }
  r = header_check_table (img, "refcount table", h->refcount_table_offset,
                          bytes, HDR_REFTABLE_OFFSET);
  if (r < 0)
    return r;

  if (h->nb_snapshots > QCOW2_MAX_SNAPSHOTS) {
    log_error (img, "nb_snapshots %" PRIu32 " (header offset %#x) is too "
               "large (at most %d)", h->nb_snapshots, HDR_NB_SNAPSHOTS,
               QCOW2_MAX_SNAPSHOTS);
    return -EFBIG;
  }
  if (h->nb_snapshots) {
    r = header_check_table (img, "snapshot table", h->snapshots_offset,
                            1, HDR_SNAPSHOTS_OFFSET);
    if (r < 0)
      return r;
  }

  if (h->crypt_method == QCOW2_CRYPT_LUKS) {
    if (!h->has_crypto_ext) {
      log_error (img, "image is LUKS-encrypted (crypt_method 2) but has no "
                 "encryption header extension (%#x)", QCOW2_EXT_CRYPTO);
      return -EINVAL;
    }
    /* Its length may run past the end of the file, as QEMU allows:
     * what lies there reads as zeros (luks-header.c says if it must not).
     */
    r = header_check_table (img, "encryption header", h->crypto_offset,
                            0, h->header_length);
    if (r < 0)
      return r;
  }
  if (h->has_bitmaps_ext && h->nb_bitmaps) {
    r = header_check_table (img, "bitmap directory",
                            h->bitmap_directory_offset,
                            h->bitmap_directory_size,
                            h->bitmaps_field_offset);
    if (r < 0)
      return r;
  }
  return 0;
}

/* Images of the other formats qemu-img makes, by their signature
 * (QEMU's probes), so that one is called what it is, with what
 * converts and serves it, rather than "not a qcow2 image" taken for a
 * raw disk.
 */
static const struct {
  const char *magic;
  unsigned offset, len;         /* within the HDR_V3_MIN bytes read */
  const char *name;             /* in "a NAME image" */
  const char *format;           /* qemu-img's -f */
} header_foreign[] = {
  { "KDMV", 0, 4, "VMDK", "vmdk" },
  { "COWD", 0, 4, "VMDK (COWD)", "vmdk" },
  { "# Disk DescriptorFile", 0, 21, "VMDK (descriptor file)", "vmdk" },
  { "conectix", 0, 8, "VHD (vpc)", "vpc" },
  { "vhdxfile", 0, 8, "VHDX", "vhdx" },
  { "\x7f\x10\xda\xbe", 64, 4, "VDI", "vdi" },
  { "QED\0", 0, 4, "QED", "qed" },
  { "LUKS\xba\xbe", 0, 6, "LUKS", "luks" },
  { "WithoutFreeSpace", 0, 16, "Parallels", "parallels" },
  { "WithouFreSpacExt", 0, 16, "Parallels", "parallels" },
  { "Bochs Virtual HD Image", 0, 22, "Bochs", "bochs" },
};

/* Say what the file is if fixed (its first bytes) is another format's
 * header: -ENOTSUP, else 0.
 */
static int
header_foreign_format (struct qcow2_image *img,
                       const uint8_t fixed[HDR_V3_MIN])
{
  for (size_t i = 0;
       i < sizeof header_foreign / sizeof header_foreign[0]; i++) {
    const char *fmt = header_foreign[i].format, *path = img->path;
    char remedy[1024];

    assert (header_foreign[i].offset + header_foreign[i].len <= HDR_V3_MIN);
    if (memcmp (fixed + header_foreign[i].offset, header_foreign[i].magic,
                header_foreign[i].len) != 0)
      continue;
    /* A LUKS payload is a raw disk: nbdkit decrypts it itself. */
    if (strcmp (fmt, "luks") == 0)
      snprintf (remedy, sizeof remedy, "nbdkit's luks filter serves it: "
                "nbdkit file %s --filter=luks passphrase=+PASSWORD-FILE",
                path);
    else
      snprintf (remedy, sizeof remedy, "qemu-img convert -f %s -O qcow2 %s "
                "NEW.qcow2 makes a qcow2 image of it; qemu-nbd -f %s %s "
                "serves it as it is", fmt, path, fmt, path);
    log_error (img, "a %s image (its signature at offset %#x), not a qcow2 "
               "image\n%s", header_foreign[i].name, header_foreign[i].offset,
               remedy);
    return -ENOTSUP;
  }
  return 0;
}

/* The file's first bytes read at once: the fixed fields and, with
 * clusters of up to this size (the default), the whole header cluster
 * in one read, which over a remote base is one round trip less.  From
 * a local file, a page: what qemu-img writes there fits in it, and an
 * open (one a client, in a fleet of images) then neither copies nor
 * maps the rest of the cluster.  Either way the rest of the cluster is
 * read only if what is parsed reaches into it (-EAGAIN from
 * header_read_names).
 */
#define HEADER_FIRST_READ 65536
#define HEADER_FIRST_READ_LOCAL 4096

/* Reading: the fixed fields, checked, from the file's first bytes,
 * read into fixed (size bytes, zeroed; *got: how many were read); the
 * cluster size, which the rest depends on.
 */
static int
header_read_fields (struct qcow2_image *img, uint8_t *fixed, uint64_t size,
                    uint64_t *got)
{
  struct qcow2_header *h = &img->h;
  int r;

  if (img->file_size == 0) {
    log_error (img, "file is empty: not a qcow2 image");
    return -ENODATA;
  }
  if (img->file_size < QCOW2_V2_HEADER_SIZE) {
    log_error (img, "file is too small (%" PRIu64 " bytes) to be a qcow2 "
               "image: truncated?", img->file_size);
    return -EINVAL;
  }
  /* At least the fixed fields, as many as a version 3 header has. */
  *got = MAX (MIN (img->file_size, size), HDR_V3_MIN);
  r = img->io->ops->pread (img->io, fixed, *got, 0);
  if (r < 0) {
    log_error (img, "reading the header: %s", errstr (-r));
    return r;
  }
  if (be32_get (fixed + HDR_MAGIC) != QCOW2_MAGIC) {
    if ((r = header_foreign_format (img, fixed)) < 0)
      return r;
    log_error (img, "not a qcow2 image (magic %#" PRIx32 " at offset 0, "
               "expected %#x)", be32_get (fixed), QCOW2_MAGIC);
    return -EMEDIUMTYPE;
  }
  h->version = be32_get (fixed + HDR_VERSION);
  if (h->version == 1) {
    /* QEMU's qcow format, qcow2's predecessor. */
    log_error (img, "unsupported qcow2 version 1 (header offset %#x): a qcow "
               "image, not qcow2\n"
               "qemu-img convert -f qcow -O qcow2 %s NEW.qcow2 makes a qcow2 "
               "image of it", HDR_VERSION, img->path);
    return -ENOTSUP;
  }
  if (h->version != 2 && h->version != 3) {
    log_error (img, "unsupported qcow2 version %" PRIu32 " (header offset "
               "%#x)", h->version, HDR_VERSION);
    return -ENOTSUP;
  }
  if (h->version == 3 && img->file_size < HDR_V3_MIN) {
    log_error (img, "file is too small (%" PRIu64 " bytes) for a version 3 "
               "header: truncated?", img->file_size);
    return -EINVAL;
  }

  h->backing_file_offset = be64_get (fixed + HDR_BACKING_OFFSET);
  h->backing_file_size = be32_get (fixed + HDR_BACKING_SIZE);
  h->cluster_bits = be32_get (fixed + HDR_CLUSTER_BITS);
  h->size = be64_get (fixed + HDR_SIZE);
  h->crypt_method = be32_get (fixed + HDR_CRYPT);
  h->l1_size = be32_get (fixed + HDR_L1_SIZE);
  h->l1_table_offset = be64_get (fixed + HDR_L1_OFFSET);
  h->refcount_table_offset = be64_get (fixed + HDR_REFTABLE_OFFSET);
  h->refcount_table_clusters = be32_get (fixed + HDR_REFTABLE_CLUSTERS);
  h->nb_snapshots = be32_get (fixed + HDR_NB_SNAPSHOTS);
  h->snapshots_offset = be64_get (fixed + HDR_SNAPSHOTS_OFFSET);

  if (h->cluster_bits < QCOW2_MIN_CLUSTER_BITS ||
      h->cluster_bits > QCOW2_MAX_CLUSTER_BITS) {
    log_error (img, "cluster_bits %" PRIu32 " (header offset %#x) is out of "
               "range (%d to %d)", h->cluster_bits, HDR_CLUSTER_BITS,
               QCOW2_MIN_CLUSTER_BITS, QCOW2_MAX_CLUSTER_BITS);
    return -EINVAL;
  }
  img->geo.cluster_bits = h->cluster_bits;
  img->geo.cluster_size = UINT64_C (1) << h->cluster_bits;

  if (h->crypt_method == QCOW2_CRYPT_AES) {
    log_error (img, "legacy AES method (crypt_method 1 at header offset "
               "%#x) is not supported\n"
               "convert the image to LUKS: qemu-img convert "
               "--object secret,id=s0,data=PASSWORD --image-opts "
               "driver=qcow2,file.filename=IMAGE,encrypt.key-secret=s0 "
               "-O qcow2 -o encrypt.format=luks,encrypt.key-secret=s0 "
               "NEW.qcow2", HDR_CRYPT);
    return -ENOTSUP;
  }
  if (h->crypt_method != 0 && h->crypt_method != QCOW2_CRYPT_LUKS) {
    log_error (img, "unknown encryption method %" PRIu32 " (crypt_method "
               "at header offset %#x)", h->crypt_method, HDR_CRYPT);
    return -ENOTSUP;
  }

  if (h->version == 2) {
    h->refcount_order = 4;
    h->header_length = QCOW2_V2_HEADER_SIZE;
    return 0;
  }
  return header_check_v3 (img, fixed);
}

/* Names: what the header cluster (buf, of which the first avail bytes
 * are read) says after the fixed fields, the backing file's name and
 * the extensions; *feature_table points into buf.  -EAGAIN if they
 * reach past avail.
 */
static int
header_read_names (struct qcow2_image *img, const uint8_t *buf,
                   uint64_t avail, const uint8_t **feature_table,
                   uint32_t *ft_len)
{
  struct qcow2_header *h = &img->h;
  uint64_t ext_start, ext_end;

  if (h->version == 3 && h->header_length > HDR_COMPRESSION_TYPE)
    h->compression_type = buf[HDR_COMPRESSION_TYPE];

  /* An empty name means no backing file, as QEMU reads it. */
  if (h->backing_file_offset && h->backing_file_size) {
    if (h->backing_file_size > QCOW2_MAX_BACKING_NAME ||
        h->backing_file_offset < h->header_length ||
        range_exceeds (h->backing_file_offset, h->backing_file_size,
                       img->geo.cluster_size)) {
      log_error (img, "backing file name at offset %#" PRIx64 " (%" PRIu32
                 " bytes, header offsets %#x and %#x) does not fit in the "
                 "first cluster after the header", h->backing_file_offset,
                 h->backing_file_size, HDR_BACKING_OFFSET, HDR_BACKING_SIZE);
      return -EINVAL;
    }
    if (range_exceeds (h->backing_file_offset, h->backing_file_size, avail))
      return -EAGAIN;
    free (h->backing_file);
    h->backing_file = header_strndup (buf + h->backing_file_offset,
                                      h->backing_file_size);
    h->names_end = h->backing_file_offset + h->backing_file_size;
    if (!h->backing_file)
      return -errno;
  }

  ext_start = h->header_length;
  /* Extensions end where the backing file name starts, and never past
   * the first cluster (the name may be empty and its offset anything).
   */
  ext_end = h->backing_file_offset ? MIN (h->backing_file_offset,
                                          img->geo.cluster_size)
                                   : img->geo.cluster_size;
  return header_read_extensions (img, buf, ext_start, ext_end, avail,
                                 feature_table, ft_len);
}

/* Derived geometry: what the features make of the cluster size. */
static int
header_derive_geometry (struct qcow2_image *img,
                        const uint8_t *feature_table, uint32_t ft_len)
{
  struct qcow2_header *h = &img->h;
  struct image_geometry *geo = &img->geo;
  int r;

  if (h->incompatible_features & ~QCOW2_INCOMPAT_KNOWN) {
    header_report_unknown (img, h->incompatible_features
                                & ~QCOW2_INCOMPAT_KNOWN,
                           feature_table, ft_len);
    return -ENOTSUP;
  }
  if ((r = header_check_compression (img)) < 0)
    return r;

  geo->extended_l2 = h->incompatible_features & QCOW2_INCOMPAT_EXTL2;
  geo->l2_entry_size = geo->extended_l2 ? 16 : 8;
  geo->l2_bits = geo->cluster_bits - (geo->extended_l2 ? 4 : 3);
  geo->subcluster_size = geo->extended_l2
    ? geo->cluster_size / QCOW2_SUBCLUSTERS : geo->cluster_size;
  geo->subcluster_bits = geo->extended_l2
    ? geo->cluster_bits - 5 : geo->cluster_bits;
  geo->compressed_offset_bits = 62 - (geo->cluster_bits - 8);
  img->data_file_raw = h->autoclear_features & QCOW2_AUTOCLEAR_DATA_RAW;
  if (geo->extended_l2 && geo->cluster_bits < 14) {
    /* Subclusters would be smaller than a sector. */
    log_error (img, "extended L2 entries need clusters of at least 16 KiB "
               "(cluster_bits is %" PRIu32 ")", geo->cluster_bits);
    return -EINVAL;
  }
  /* What the rest of the engine relies on. */
  assert (geo->cluster_size == UINT64_C (1) << geo->cluster_bits);
  assert (geo->subcluster_size == UINT64_C (1) << geo->subcluster_bits);
  assert (geo->subcluster_size >= 512);
  assert ((UINT64_C (1) << geo->l2_bits) * geo->l2_entry_size ==
          geo->cluster_size);
  return 0;
}

/* Read and check the header: its fields, the names in its cluster,
 * then the geometry they give and the tables they point at.
 */
int
header_read (struct qcow2_image *img)
{
  CLEANUP_FREE uint8_t *buf = NULL;
  const uint8_t *feature_table = NULL;
  uint32_t ft_len = 0;
  uint64_t size = img->io->ops->pread_many ? HEADER_FIRST_READ
                                           : HEADER_FIRST_READ_LOCAL;
  uint64_t cs, got, want;
  uint8_t *bigger;
  int r;

  if (!(buf = calloc (1, size)))
    return -errno;
  if ((r = header_read_fields (img, buf, size, &got)) < 0)
    return r;
  /* The extensions and backing name live in the first cluster: parsed
   * from what was read, else from the whole cluster (zeros past the
   * file's end), as they always were.
   */
  r = header_read_names (img, buf, got, &feature_table, &ft_len);
  if (r == -EAGAIN) {
    cs = img->geo.cluster_size;
    if (cs > size) {
      if (!(bigger = realloc (buf, cs)))
        return -errno;
      buf = bigger;
      memset (buf + size, 0, cs - size);
    }
    want = MIN (cs, img->file_size);
    if (want > got &&
        (r = img->io->ops->pread (img->io, buf + got, want - got, got)) < 0) {
      log_error (img, "reading the header cluster: %s", errstr (-r));
      return r;
    }
    r = header_read_names (img, buf, cs, &feature_table, &ft_len);
    assert (r != -EAGAIN);
  }
  if (r < 0 || (r = header_derive_geometry (img, feature_table, ft_len)) < 0)
    return r;
  return header_check_tables (img);
}

void
qcow2_get_info (const struct qcow2_image *img, struct qcow2_info *info)
{
  const struct qcow2_header *h = &img->h;

  *info = (struct qcow2_info) {
    .size = h->size,
    .cluster_size = img->geo.cluster_size,
    .version = h->version,
    .refcount_bits = 1u << h->refcount_order,
    .extended_l2 = img->geo.extended_l2,
    .lazy_refcounts = h->compatible_features & QCOW2_COMPAT_LAZY_REFCOUNTS,
    .zstd = h->compression_type == QCOW2_COMPRESSION_ZSTD,
    .encrypted = h->crypt_method != 0,
    .data_file_raw = img->data_file_raw,
    .backing = h->backing_file,
    .backing_format = h->backing_format,
  };
}
