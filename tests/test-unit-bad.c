/* SPDX-License-Identifier: BSD-3-Clause */
/* Bad images through the engine's public interface: what bad L2
 * entries and bad header fields do (an error naming the field, never
 * a crash), and the overlap guard's corrupt mark and its keeping guest
 * data off a bitmap's table.
 */
#include <zlib.h>

#include "unit-engine.h"

/* A read of [off, off+len) gives zeros, and says nothing. */
static void
check_zero_read (struct qcow2_image *img, struct memenv *me, uint64_t off,
                 uint64_t len, const char *what)
{
  uint8_t *buf = malloc (len);
  uint64_t i = 0;

  memenv_clear_errors (me);
  if (CHECKF (buf && qcow2_read (img, buf, len, off) == 0,
              "%s: read at %#" PRIx64 " failed", what, off))
    for (i = 0; i < len && buf[i] == 0; i++)
      ;
  CHECKF (i == len, "%s: byte %" PRIu64 " is not zero", what, off + i);
  CHECKF (!*memenv_last_error (me), "%s: said \"%s\"", what,
          memenv_last_error (me));
  free (buf);
}

static void
test_bad_entries (void)
{
  struct memenv *me = memenv_new ();
  struct qcow2_image *img;
  struct qcow2_io *io = NULL;
  struct ib ib;
  const uint64_t cs = 65536, span = cs * 8192;
  uint64_t good, half, host;
  uint8_t buf[512];

  ib_init (&ib, 3, 16, 3 * span, false);
  ib_data (&ib, 0, 1);
  ib_set (&ib, 1, UINT64_C (1) << 63 | (100 * cs), 0);  /* past the end */
  good = ib_data (&ib, 9, 2);
  ib_set (&ib, 2, UINT64_C (1) << 63 | (good + 512), 0); /* unaligned */
  host = ib_alloc (&ib, 1);
  memset (ib.buf + host, 0xff, cs);                      /* not deflate */
  ib_set (&ib, 3, UINT64_C (1) << 62 | UINT64_C (3) << 54 | host, 0);
  ib_set (&ib, 4, UINT64_C (1) << 62 | 200 * cs, 0);     /* past the end */
  /* Deflate data of half a cluster only: make it, then break it. */
  half = ib_compressed (&ib, 6, 3, true, 0);
  ib_data (&ib, 5, 4);
  /* L2 tables past the end of the file, and unaligned. */
  be64_put (ib.buf + ib.l1_offset + 8, 1000 * cs);
  be64_put (ib.buf + ib.l1_offset + 16, ib.l1_offset + 512);
  ib_finish (&ib);
  {
    /* Recompress cluster 6 from half a cluster of input. */
    uint8_t *in = malloc (cs / 2);
    for (uint64_t i = 0; i < cs / 2; i++)
      in[i] = model_pattern (true, 3, 6 * cs + i);
    z_stream s;
    memset (&s, 0, sizeof s);
    deflateInit2 (&s, 6, Z_DEFLATED, -12, 9, Z_DEFAULT_STRATEGY);
    s.next_in = in;
    s.avail_in = cs / 2;
    s.next_out = ib.buf + half;
    s.avail_out = cs;
    CHECK (deflate (&s, Z_FINISH) == Z_STREAM_END);
    deflateEnd (&s);
    free (in);
  }
  ib_dump (&ib, "bad-entries.qcow2");

  img = open_ib (me, &ib, "bad.qcow2", NULL, &io);
  if (!CHECKF (img != NULL, "open: %s", memenv_last_error (me)))
    goto out;
  check_read (img, &ib.model, 0, cs, "good cluster");
  check_read (img, &ib.model, 5 * cs, cs, "good cluster");
  /* Past the end of the file reads as zeros, as in QEMU, and a read
   * writes nothing: data, an L2 table, a request with good data too.
   */
  check_zero_read (img, me, 1 * cs, 512, "data past the end");
  check_zero_read (img, me, span + 5 * cs, 512, "L2 table past the end");
  CHECK_INT (qcow2_read (img, buf, 512, cs - 256), 0);
  CHECK (buf[0] == model_pattern (false, 1, cs - 256) &&
         buf[256] == 0 && buf[511] == 0);
  CHECK_INT (qcow2_extents (img, span, 512, false, collect,
                            &(struct extents) { .n = 0 }), 0);
  check_no_writes (io, "reads past the end");
  check_bad_read (img, me, &ib.model, 3 * cs, 512, "compressed garbage",
                  "does not decompress to one cluster");
  check_bad_read (img, me, &ib.model, 4 * cs, 512,
                  "compressed past the end", "beyond the end of the file");
  check_bad_read (img, me, &ib.model, 6 * cs + 100, 512,
                  "compressed short", "does not decompress to one cluster");
  /* Bad compressed data is not a broken structure: no mark. */
  check_no_writes (io, "bad compressed clusters");
  check_bad_read (img, me, &ib.model, 2 * cs + 4096, 512,
                  "unaligned data", "unaligned data cluster offset");
  check_bad_read (img, me, &ib.model, 2 * span, 512, "unaligned L2 table",
                  "unaligned L2 table offset");
  /* A request that touches a bad entry fails as a whole. */
  check_bad_read (img, me, &ib.model, 0, 3 * cs, "good then bad",
                  "unaligned data cluster offset");
  check_read (img, &ib.model, 5 * cs, cs, "good cluster after errors");
  check_read (img, &ib.model, 7 * cs, 2 * cs, "good cluster after errors");

  /* Extents need the L2 tables, and see unaligned data offsets. */
  CHECK_INT (qcow2_extents (img, 2 * span + cs, 512, false, collect,
                            &(struct extents) { .n = 0 }), -EIO);
  CHECK_INT (qcow2_extents (img, 2 * cs, 512, false, collect,
                            &(struct extents) { .n = 0 }), -EIO);
  CHECK_INT (qcow2_read (img, buf, 512, 9 * cs), 0);
  qcow2_close (img);
  io->ops->close (io);
 out:
  ib_free (&ib);

  /* Invalid subcluster bitmaps. */
  ib_init (&ib, 3, 16, 16 * cs, true);
  ib_data (&ib, 0, 1);
  good = ib_data (&ib, 3, 2);
  ib_set (&ib, 1, UINT64_C (1) << 63 | good, 0x0000000100000001ULL);
  ib_set (&ib, 2, 0, 0x00000003);              /* allocated, no host */
  ib_finish (&ib);
  ib_dump (&ib, "bad-bitmaps.qcow2");
  img = open_ib (me, &ib, "badext.qcow2", NULL, NULL);
  if (CHECKF (img != NULL, "open: %s", memenv_last_error (me))) {
    check_bad_read (img, me, &ib.model, cs, 512, "allocated and zero",
                    "invalid subcluster bitmap");
    check_bad_read (img, me, &ib.model, 2 * cs + 4096, 512,
                    "allocated without a cluster",
                    "invalid subcluster bitmap");
    check_read (img, &ib.model, 3 * cs, cs, "good after bad bitmaps");
    qcow2_close (img);
  }
  ib_free (&ib);
  memenv_free (me);
}

/* One field of a header to overwrite. */
struct patch {
  uint32_t offset;
  uint8_t width;                /* 1, 4 or 8; 0 = no patch */
  uint64_t value;
};

struct bad_header {
  const char *name;
  struct patch p[2];
  int err;
  const char *phrase;
};

static void
patch_apply (uint8_t *buf, const struct patch *p)
{
  switch (p->width) {
  case 1: buf[p->offset] = p->value; break;
  case 4: be32_put (buf + p->offset, p->value); break;
  case 8: be64_put (buf + p->offset, p->value); break;
  }
}

static void
check_open_fails (struct memenv *me, const void *data, size_t len,
                  const char *name, int err, const char *phrase)
{
  struct qcow2_io *io = memio_new (data, len);
  struct qcow2_image *img;

  memenv_clear_errors (me);
  img = qcow2_open (memenv_env (me), io, "bad.qcow2", &no_opts);
  CHECKF (img == NULL, "%s: opened", name);
  CHECKF (errno == err, "%s: errno %d (%s), expected %d (%s)", name,
          errno, strerror (errno), err, strerror (err));
  CHECKF (strstr (memenv_last_error (me), phrase),
          "%s: message \"%s\" lacks \"%s\"", name,
          memenv_last_error (me), phrase);
  if (img)
    qcow2_close (img);
}

static void
test_bad_headers (void)
{
  struct memenv *me = memenv_new ();
  struct ib ib;
  const uint64_t cs = 65536;
  uint8_t *buf;
  struct qcow2_image *img;

  ib_init (&ib, 3, 16, 4 * cs, false);
  ib_data (&ib, 1, 1);
  ib_snapshot (&ib, "1", "snap", 0, true);
  ib_finish (&ib);
  ib_dump (&ib, "header-base.qcow2");

  const uint64_t eof = ib.len, l1 = ib.l1_offset;
  const uint64_t snaps = be64_get (ib.buf + 64);
  const struct bad_header cases[] = {
    { "magic", { { 0, 4, 0x514649fa } }, EMEDIUMTYPE,
      "not a qcow2 image" },
    { "vmdk magic", { { 0, 4, 0x4b444d56 } }, ENOTSUP,
      "a VMDK image (its signature at offset 0), not a qcow2 image" },
    { "version 1", { { 4, 4, 1 } }, ENOTSUP, "a qcow image, not qcow2" },
    { "version 4", { { 4, 4, 4 } }, ENOTSUP, "unsupported qcow2 version 4" },
    { "cluster_bits 8", { { 20, 4, 8 } }, EINVAL, "cluster_bits 8" },
    { "cluster_bits 22", { { 20, 4, 22 } }, EINVAL, "cluster_bits 22" },
    { "aes", { { 32, 4, 1 } }, ENOTSUP, "legacy AES method" },
    { "luks without its header", { { 32, 4, 2 } }, EINVAL,
      "no encryption header extension" },
    { "crypt method 3", { { 32, 4, 3 } }, ENOTSUP,
      "unknown encryption method 3" },
    { "l1_size 0", { { 36, 4, 0 } }, EINVAL, "L1 table is too small" },
    { "l1_size huge", { { 36, 4, 0x10000000 } }, EFBIG, "l1_size" },
    { "l1 unaligned", { { 40, 8, l1 + 512 } }, EINVAL, "not aligned" },
    { "l1 past the end", { { 40, 8, eof } }, EINVAL,
      "beyond the end of the file" },
    { "reftable unaligned", { { 48, 8, cs + 8 } }, EINVAL, "not aligned" },
    { "reftable past the end", { { 48, 8, eof } }, EINVAL,
      "beyond the end of the file" },
    { "reftable clusters 0", { { 56, 4, 0 } }, EINVAL,
      "refcount_table_clusters (header offset 0x38) is 0" },
    { "reftable clusters huge", { { 56, 4, 0x10000 } }, EFBIG,
      "refcount_table_clusters" },
    { "nb_snapshots huge", { { 60, 4, 65537 } }, EFBIG, "nb_snapshots" },
    { "snapshots past the end", { { 64, 8, eof } }, EINVAL,
      "snapshot table" },
    { "snapshot entries past the end", { { 60, 4, 60000 } }, EINVAL,
      "snapshot table entry" },
    { "snapshot extra data", { { snaps + 36, 4, 2000 } }, EINVAL,
      "extra data" },
    { "unknown incompatible bit", { { 72, 8, 1 << 5 } }, ENOTSUP,
      "bit 5" },
    { "data file without a name", { { 72, 8, 1 << 2 } }, EINVAL,
      "names none" },
    { "raw data without a data file", { { 88, 8, 1 << 1 } }, EINVAL,
      "raw external data" },
    { "compression type 2", { { 104, 1, 2 } }, ENOTSUP,
      "unknown compression type 2" },
    { "zstd without bit 3", { { 104, 1, 1 } }, EINVAL, "does not agree" },
    { "bit 3 with deflate", { { 72, 8, 1 << 3 } }, EINVAL,
      "does not agree" },
    { "header_length short", { { 100, 4, 100 } }, EINVAL,
      "shorter than the version 3 minimum" },
    { "header_length long", { { 100, 4, cs + 8 } }, EINVAL,
      "exceeds the cluster size" },
    { "refcount_order 7", { { 96, 4, 7 } }, EINVAL, "refcount_order 7" },
    { "extended L2, small clusters", { { 20, 4, 12 }, { 72, 8, 1 << 4 } },
      EINVAL, "at least 16 KiB" },
    { "backing name past the cluster", { { 8, 8, cs - 4 }, { 16, 4, 10 } },
      EINVAL, "does not fit" },
    { "backing name in the header", { { 8, 8, 40 }, { 16, 4, 10 } },
      EINVAL, "does not fit" },
    { "backing name too long", { { 8, 8, 512 }, { 16, 4, 2000 } },
      EINVAL, "does not fit" },
    { "extension too large", { { 112, 4, 0x12345678 }, { 116, 4, cs } },
      EINVAL, "too large" },
    { "bitmaps extension short", { { 112, 4, 0x23852875 }, { 116, 4, 8 } },
      EINVAL, "too short" },
    /* Not errors: an empty backing format without a backing file. */
    { "backing format", { { 112, 4, 0xe2792aca }, { 116, 4, 4 } }, 0, "" },
  };

  buf = malloc (ib.len);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const struct bad_header *c = &cases[i];

    memcpy (buf, ib.buf, ib.len);
    patch_apply (buf, &c->p[0]);
    patch_apply (buf, &c->p[1]);
    if (c->err == 0) {
      struct qcow2_io *io = memio_new (buf, ib.len);
      img = qcow2_open (memenv_env (me), io, "ok.qcow2", &no_opts);
      CHECKF (img != NULL, "%s: open: %s", c->name, memenv_last_error (me));
      if (img)
        qcow2_close (img);
      continue;
    }
    check_open_fails (me, buf, ib.len, c->name, c->err, c->phrase);
  }

  /* Truncated files. */
  check_open_fails (me, ib.buf, 0, "empty", ENODATA, "file is empty");
  check_open_fails (me, ib.buf, 71, "71 bytes", EINVAL, "too small");
  check_open_fails (me, ib.buf, 100, "100 bytes (v3)", EINVAL,
                    "too small (100 bytes) for a version 3 header");
  check_open_fails (me, ib.buf, 3 * cs, "cut short", EINVAL,
                    "beyond the end of the file");
  free (buf);
  ib_free (&ib);

  /* An unknown feature is named from the feature name table. */
  uint8_t table[48] = { 0, 9 };
  memcpy (table + 2, "frobnication", 12);
  ib_init (&ib, 3, 16, cs, false);
  ib.incompat = 1 << 9;
  ib.extra_ext_type = 0x6803f857;
  ib.extra_ext_data = table;
  ib.extra_ext_len = sizeof table;
  ib_finish (&ib);
  check_open_fails (me, ib.buf, ib.len, "feature table", ENOTSUP,
                    "bit 9 (frobnication)");
  ib_free (&ib);

  /* The corrupt bit: readable, but not writable. */
  ib_init (&ib, 3, 16, cs, false);
  ib.incompat = 1 << 1;
  ib_data (&ib, 0, 1);
  ib_finish (&ib);
  img = open_ib (me, &ib, "corrupt.qcow2", NULL, NULL);
  if (CHECK (img != NULL)) {
    check_read (img, &ib.model, 0, cs, "corrupt bit");
    memenv_clear_errors (me);
    CHECK_INT (qcow2_check_writable (img), -EPERM);
    CHECK (strstr (memenv_last_error (me), "corrupt"));
    qcow2_close (img);
  }
  ib_free (&ib);
  memenv_free (me);
}

/* Once the overlap guard marks the image corrupt, nothing more reaches
 * the disk but the mark: metadata made dirty before (here a zeroed L2
 * entry) is not written by a later flush, which fails.
 */
static void
test_corrupt_mark (void)
{
  const uint64_t cs = 4096, size = 64 * cs;
  struct memenv *me = memenv_new ();
  struct qcow2_image *img;
  struct qcow2_io *io;
  uint8_t *buf = calloc (1, cs), entry[8];
  uint64_t l2;
  struct ib ib;

  ib_init (&ib, 3, 12, size, false);
  ib_data (&ib, 0, 1);
  ib_data (&ib, 1, 2);
  ib_finish (&ib);
  /* The refcount block calls the L2 table free: the next allocation
   * takes it for guest data, which the guard refuses.
   */
  l2 = be64_get (ib.buf + ib.l1_offset) & UINT64_C (0x00fffffffffffe00);
  set_refcount (ib.buf, cs, l2, 0);
  img = open_ib (me, &ib, "corrupt-mark.qcow2", NULL, &io);
  if (CHECK (img != NULL)) {
    CHECK_INT (qcow2_zero (img, cs, cs, false, false, false), 0);
    CHECK_INT (qcow2_write (img, buf, cs, 10 * cs, false), -EIO);
    CHECK (qcow2_is_corrupt (img));
    CHECK_INT (qcow2_flush (img), -EIO);
    CHECK_INT (qcow2_write (img, buf, 512, 0, false), -EPERM);
    CHECK_INT (io->ops->pread (io, entry, 8, l2 + 8), 0);
    CHECK_EQ (be64_get (entry), be64_get (ib.buf + l2 + 8));
    CHECK_INT (io->ops->pread (io, entry, 8, 72), 0);
    CHECK (be64_get (entry) & 2);
    qcow2_close (img);
    io->ops->close (io);
  }
  free (buf);
  ib_free (&ib);
  memenv_free (me);
}

/* The overlap guard keeps guest data off a bitmap's table: a guest
 * cluster whose L2 entry points at it is refused, the image marked
 * corrupt, the table unchanged.
 */
static void
test_bitmap_guard (void)
{
  const uint64_t cs = 4096, size = 64 * cs;
  struct memenv *me = memenv_new ();
  struct qcow2_image *img;
  struct qcow2_io *io;
  uint8_t *buf = malloc (cs), *table = malloc (cs);
  struct ib ib;

  memset (buf, 0x5a, cs);
  ib_init (&ib, 3, 12, size, false);
  ib_data (&ib, 0, 1);
  ib_bitmap (&ib, "b", 12, 2, 7);
  ib_set (&ib, 2, ib.bitmaps[0].table_offset | UINT64_C (1) << 63, 0);
  ib_finish (&ib);
  img = open_ib (me, &ib, "bitmap-guard.qcow2", NULL, &io);
  if (CHECK (img != NULL)) {
    CHECK_INT (qcow2_write (img, buf, cs, 0, false), 0);
    CHECK_INT (qcow2_write (img, buf, 512, 2 * cs + 512, false), -EIO);
    CHECK (qcow2_is_corrupt (img));
    CHECK_INT (io->ops->pread (io, table, cs, ib.bitmaps[0].table_offset), 0);
    CHECK (memcmp (table, ib.buf + ib.bitmaps[0].table_offset, cs) == 0);
    qcow2_close (img);
    io->ops->close (io);
  }
  free (buf);
  free (table);
  ib_free (&ib);
  memenv_free (me);
}

int
main (void)
{
  test_bad_entries ();
  test_bad_headers ();
  test_corrupt_mark ();
  test_bitmap_guard ();
  return unit_finish ();
}
