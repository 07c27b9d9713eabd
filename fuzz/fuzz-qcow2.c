/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: the qcow2 engine over in-memory storage.
 *
 * An input is an image followed by an 8-byte little-endian control
 * word (shorter inputs are an image with a control word of 0).  Keeping
 * the control word out of the image lets the fuzzer vary the options
 * and requests without breaking the image, and the seeds in corpus/
 * carry a control word too (see make-corpus.sh).  Control word bits:
 *
 *   0-1   L2 cache size: default, 1 KiB, 4 KiB, 64 KiB
 *   2-3   L2 slice size: default, 512, 2 KiB, default
 *   4     no_backing
 *   5     readonly
 *   6     discard_ignore
 *   7-8   snapshot: none, "snap1", "1", "nosuch"
 *   9     data_file = "dir/data.raw"
 *   10-11 sequential read chunk: 64 KiB, 4.5 KiB, 1 MiB + 512, 777
 *   12    preallocate (small disks only), 13: full preallocation
 *   14-15 overlap guard: default, none, constant, all
 *   16-63 seed of the offsets and lengths of the other requests; bit 16
 *         also: compress=on (compressed writes)
 *
 * Two other kinds of input, told by their first four bytes (which no
 * qcow2 image has):
 *
 *   "\0TPL" T RECORDS...  the image is template T (mod 3) with patches:
 *       the LUKS-encrypted images fuzz-env.c makes at start-up, so
 *       that the LUKS header, its key slots and the encryption header
 *       extension are fuzzed without whole images of a megabyte or two
 *       in the corpus.  A record: a flags byte (bit 0: the offset is
 *       from the start of the LUKS header; bit 1: set the file's size
 *       to the offset, modulo twice the template's), a 32-bit
 *       little-endian offset (modulo the file's size), a length byte
 *       and that many bytes, written there.  The templates: aes-256
 *       xts-plain64 sha256 over 512-byte clusters; cast5-128
 *       cbc-essiv:md5 sha1 over 4 KiB clusters;
 *       serpent-128 ecb-plain sha512 with an external data file
 *       ("data.raw"), its password "fuzz" followed by a newline (as
 *       QEMU keeps it, from a secret file).
 *   "\0CRT" BYTES...  create options (see fuzz_create): qcow2_create_check
 *       on them, and if they pass and ask no encryption (counting
 *       PBKDF2 iterations takes 50 ms), qcow2_create, then the new image
 *       opened, preallocated as asked, written and read back, opened
 *       again.
 *
 * Every image is opened with the password "fuzz" (and "fuzz\n", as
 * from a secret file), allowing at most FUZZ_PBKDF2_MAX iterations.
 *
 * The image is opened as "dir/disk.qcow2" beside other files that it
 * may name as backing or external data file: "dir/base.raw" (a small
 * raw file), "dir/base.qcow2" (a small valid qcow2 image backed by
 * base.raw, made by the engine at start-up), "dir/data.raw", and
 * "dir/disk.qcow2" (a copy of the input, so that an image naming
 * itself loops).  The harness opens the image, reads the start of the
 * disk and scattered ranges, asks for extents, writes a little if it
 * may, flushes, closes, then opens the result again.
 *
 * Results are not judged, since almost every input is a broken image;
 * only invariants that hold for any image are, by abort():
 *  - a range read twice, or read as part of a larger read, gives the
 *    same bytes each time (no write in between), and a range that
 *    extents report as reading as zeros reads as zeros; after writes,
 *    only while the overlap guard protects all metadata: without it a
 *    corrupt image's refcounts hand out a table's cluster as data, and
 *    a read that evicts a dirty L2 slice then rewrites another guest
 *    cluster (as in QEMU with overlap-check=none);
 *  - extents are contiguous, non-empty, inside the request, of known
 *    types, merged, and cover the request unless stopped early;
 *  - requests past the virtual size fail;
 *  - a successful write or zero inside one cluster reads back, while
 *    the overlap guard is on (see check_written);
 *  - the virtual size never changes, and qcow2_can_write agrees with
 *    qcow2_readonly_reason and qcow2_check_writable.
 * AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer catch
 * the rest.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-env.h"
#include "memio.h"
#include "qcow2.h"

/* Bounds that keep one input well under 100 ms. */
#define SEQ_MAX_BYTES (4u << 20)        /* sequential read of the start */
#define SEQ_MAX_REQUESTS 256
#define SCATTER_READS 16
#define SCATTER_MAX (128u << 10)
#define EXTENT_MAX (64u << 20)
#define WRITE_MAX (160u << 10)
#define ZERO_MAX (4u << 20)
#define PREALLOC_MAX (4u << 20)
#define FUZZ_PBKDF2_MAX 20000           /* a few ms per key slot tried */
#define CREATE_MAX_SIZE (1u << 20)      /* virtual size of a new image */

#define fail(...)                                                       \
  do {                                                                  \
    fprintf (stderr, "fuzz-qcow2: invariant violated: " __VA_ARGS__);   \
    fputc ('\n', stderr);                                               \
    abort ();                                                           \
  } while (0)

/* splitmix64: request offsets and lengths from the control word. */
static uint64_t
rng_next (uint64_t *s)
{
  uint64_t z = (*s += UINT64_C (0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C (0x94d049bb133111eb);
  return z ^ (z >> 31);
}

/* A value below n (0 if n is 0). */
static uint64_t
rng_below (uint64_t *s, uint64_t n)
{
  return n ? rng_next (s) % n : 0;
}

/* Offsets that find edge cases: cluster-aligned, 512-aligned or not. */
static uint64_t
rng_offset (uint64_t *s, uint64_t limit)
{
  uint64_t off = rng_below (s, limit);

  switch (rng_below (s, 4)) {
  case 0: return off & ~UINT64_C (0xffff);
  case 1: return off & ~UINT64_C (0x1ff);
  default: return off;
  }
}

static uint64_t
rng_length (uint64_t *s, uint64_t max)
{
  uint64_t len = 1 + rng_below (s, max);

  if (rng_below (s, 2) && len >= 512)
    len &= ~UINT64_C (0x1ff);
  return len;
}

static bool
all_zero (const uint8_t *p, size_t n)
{
  return n == 0 || (p[0] == 0 && memcmp (p, p + 1, n - 1) == 0);
}


/* The start of the disk as first read: which chunks read successfully,
 * so that later reads and extents are compared with it.
 */
struct seq {
  uint8_t *buf;
  uint64_t len, chunk;
  bool ok[SEQ_MAX_REQUESTS];
};

/* Whether [off, off+len) of the sequential read is known. */
static bool
seq_known (const struct seq *sq, uint64_t off, uint64_t len)
{
  if (off >= sq->len || len > sq->len - off)
    return false;
  for (uint64_t c = off / sq->chunk;
       len > 0 && c <= (off + len - 1) / sq->chunk; c++)
    if (!sq->ok[c])
      return false;
  return true;
}

static void
seq_read (struct qcow2_image *img, struct seq *sq)
{
  for (uint64_t off = 0, i = 0; off < sq->len; off += sq->chunk, i++) {
    uint64_t n = sq->len - off < sq->chunk ? sq->len - off : sq->chunk;
    sq->ok[i] = qcow2_read (img, sq->buf + off, n, off) == 0;
  }
}

/* Read [off, off+len) twice: both reads, and the sequential read where
 * it covers the range, must agree.  Without sq, only read.
 */
static void
check_read (struct qcow2_image *img, const struct seq *sq, uint64_t off,
            uint64_t len)
{
  uint8_t *a = malloc (len ? len : 1), *b = malloc (len ? len : 1);

  if (!a || !b)
    abort ();
  if (qcow2_read (img, a, len, off) == 0 && sq) {
    if (qcow2_read (img, b, len, off) == 0 && memcmp (a, b, len) != 0)
      fail ("two reads of %" PRIu64 " bytes at %" PRIu64 " differ",
            len, off);
    if (seq_known (sq, off, len) && memcmp (a, sq->buf + off, len) != 0)
      fail ("read of %" PRIu64 " bytes at %" PRIu64 " differs from the "
            "sequential read", len, off);
  }
  free (a);
  free (b);
}

struct ext_check {
  const struct seq *sq;         /* to check zero extents, or NULL */
  uint64_t next, end;
  uint32_t last_type;
  unsigned calls, stop_after;   /* return 1 at call stop_after (0 = never) */
  bool req_one, stopped;
};

static int
ext_add (void *opaque, uint64_t offset, uint64_t length, uint32_t type)
{
  struct ext_check *x = opaque;

  if (x->stopped)
    fail ("extent at %" PRIu64 " after the callback asked to stop", offset);
  if (x->req_one && x->calls > 0)
    fail ("a second extent at %" PRIu64 " with req_one", offset);
  if (offset != x->next)
    fail ("extent at %" PRIu64 " but the previous one ended at %" PRIu64,
          offset, x->next);
  if (length == 0 || length > x->end - offset)
    fail ("extent of %" PRIu64 " bytes at %" PRIu64 " outside the request "
          "(ending at %" PRIu64 ")", length, offset, x->end);
  if (type & ~(uint32_t) (QCOW2_EXTENT_HOLE | QCOW2_EXTENT_ZERO))
    fail ("extent type %#" PRIx32 " at %" PRIu64, type, offset);
  if (x->calls > 0 && type == x->last_type)
    fail ("adjacent extents of type %" PRIu32 " at %" PRIu64 " not merged",
          type, offset);
  if ((type & QCOW2_EXTENT_ZERO) && x->sq && seq_known (x->sq, offset, length)
      && !all_zero (x->sq->buf + offset, length))
    fail ("extent of %" PRIu64 " bytes at %" PRIu64 " reported as zero "
          "(type %" PRIu32 ") reads as data", length, offset, type);
  x->next = offset + length;
  x->last_type = type;
  x->calls++;
  if (x->stop_after && x->calls == x->stop_after) {
    x->stopped = true;
    return 1;
  }
  return 0;
}

static int
ext_ignore (void *opaque, uint64_t offset, uint64_t length, uint32_t type)
{
  return 0;
}

static void
check_extents (struct qcow2_image *img, const struct seq *sq, uint64_t off,
               uint64_t len, bool req_one, unsigned stop_after)
{
  struct ext_check x = {
    .sq = sq, .next = off, .end = off + len,
    .req_one = req_one, .stop_after = stop_after,
  };

  if (qcow2_extents (img, off, len, req_one, ext_add, &x) == 0 &&
      !req_one && !x.stopped && x.next != x.end)
    fail ("extents of [%" PRIu64 ", %" PRIu64 ") stop at %" PRIu64,
          off, x.end, x.next);
}

static void
check_state (struct qcow2_image *img, uint64_t size)
{
  bool can = qcow2_can_write (img);

  if (qcow2_get_size (img) != size)
    fail ("virtual size changed from %" PRIu64 " to %" PRIu64,
          size, qcow2_get_size (img));
  if (can != (qcow2_readonly_reason (img) == NULL))
    fail ("qcow2_can_write says %d but the read-only reason is %s", can,
          qcow2_readonly_reason (img) ? qcow2_readonly_reason (img) : "NULL");
  if (can != (qcow2_check_writable (img) == 0))
    fail ("qcow2_can_write says %d, qcow2_check_writable disagrees", can);
  if (qcow2_can_trim (img) && !can)
    fail ("qcow2_can_trim without qcow2_can_write");
}

/* Requests that end past the virtual size (or wrap) must fail. */
static void
check_out_of_range (struct qcow2_image *img, uint64_t size, uint64_t *rng)
{
  uint8_t buf[512];
  uint64_t off = size - rng_below (rng, sizeof buf - 1);
  uint64_t wrap = UINT64_MAX - rng_below (rng, 1024);

  if (qcow2_read (img, buf, sizeof buf, off) == 0 ||
      qcow2_read (img, buf, sizeof buf, wrap) == 0)
    fail ("a read past the virtual size %" PRIu64 " succeeded", size);
  if (qcow2_extents (img, off, sizeof buf, false, ext_ignore, NULL) == 0 ||
      qcow2_extents (img, wrap, sizeof buf, false, ext_ignore, NULL) == 0)
    fail ("extents past the virtual size %" PRIu64 " succeeded", size);
  if (!qcow2_can_write (img))
    return;
  memset (buf, 0x55, sizeof buf);
  if (qcow2_write (img, buf, sizeof buf, off, false) == 0 ||
      qcow2_write (img, buf, sizeof buf, wrap, false) == 0 ||
      qcow2_zero (img, sizeof buf, off, true, false, false) == 0 ||
      qcow2_trim (img, sizeof buf, wrap, false) == 0)
    fail ("a write past the virtual size %" PRIu64 " succeeded", size);
}

/* Bytes from off to write or zero: half the time inside one cluster,
 * where the result is checked, at most max, and never past the end.
 */
static uint64_t
write_length (uint64_t *rng, uint64_t off, uint64_t max, uint64_t cluster,
              uint64_t size)
{
  uint64_t left = cluster - (off & (cluster - 1));
  uint64_t len = rng_below (rng, 2)
    ? 1 + rng_below (rng, left < max ? left : max)
    : rng_length (rng, max);

  return len < size - off ? len : size - off;
}

/* A successful write or zero inside one cluster reads back, if the
 * overlap guard protects the metadata (verify).  Across clusters it
 * need not: a corrupt image may map two guest clusters to one host
 * cluster, and without the guard data may land on a table.
 */
static void
check_written (struct qcow2_image *img, const uint8_t *want, uint64_t len,
               uint64_t off, uint64_t cluster, bool verify)
{
  uint8_t *back;

  if (!verify || len == 0 || off / cluster != (off + len - 1) / cluster)
    return;
  back = malloc (len);
  if (!back)
    abort ();
  if (qcow2_read (img, back, len, off) == 0 &&
      (want ? memcmp (back, want, len) != 0 : !all_zero (back, len)))
    fail ("%s of %" PRIu64 " bytes at %" PRIu64 " succeeded but reads "
          "back differently", want ? "write" : "zero", len, off);
  free (back);
}

/* A few writes, zeroes and trims, which may fail: the image may be
 * broken in any way.
 */
static void
do_writes (struct qcow2_image *img, uint64_t size, uint64_t near,
           uint64_t cluster, bool verify, uint64_t *rng)
{
  unsigned n = 1 + rng_below (rng, 8);
  uint8_t *buf = malloc (WRITE_MAX);

  if (!buf)
    abort ();
  for (unsigned i = 0; i < n; i++) {
    /* Mostly near the start, where the reads looked. */
    uint64_t limit = rng_below (rng, 4) ? near : size;
    uint64_t off = rng_offset (rng, limit), len;
    bool fua = rng_below (rng, 8) == 0;

    switch (rng_below (rng, 8)) {
    case 0: case 1: case 2: case 3:
      len = write_length (rng, off, WRITE_MAX, cluster, size);
      fuzz_env_fill_pattern (buf, len, rng_next (rng));
      if (qcow2_write (img, buf, len, off, fua) == 0)
        check_written (img, buf, len, off, cluster, verify);
      break;
    case 4:
      len = write_length (rng, off, ZERO_MAX, cluster, size);
      if (qcow2_zero (img, len, off, rng_below (rng, 2), rng_below (rng, 2),
                      fua) == 0)
        check_written (img, NULL, len, off, cluster, verify);
      break;
    case 5:
      /* The whole start, as qemu-img convert does to a new disk. */
      qcow2_zero (img, near, 0, true, false, fua);
      break;
    case 6:
      len = write_length (rng, off, ZERO_MAX, cluster, size);
      qcow2_trim (img, len, off, fua);
      break;
    default:
      qcow2_flush (img);
      break;
    }
  }
  free (buf);
}

/* Open the result of the writes again, read-only, and read it. */
static void
reopen (const struct qcow2_env *env, struct qcow2_io *io, uint64_t *rng)
{
  struct qcow2_options opts = {
    .readonly = true,
    .no_backing = rng_below (rng, 2),
    .passwords = &fuzz_env_password,
    .passwords_len = 1,
    .max_pbkdf2_iterations = FUZZ_PBKDF2_MAX,
  };
  struct qcow2_image *img;
  struct seq sq = { .chunk = 64 << 10 };

  img = qcow2_open (env, fuzz_env_capio (memio_ref (io)), "dir/disk.qcow2",
                    &opts);
  if (!img)
    return;
  sq.len = qcow2_get_size (img) < (1 << 20) ? qcow2_get_size (img) : 1 << 20;
  sq.buf = malloc (sq.len ? sq.len : 1);
  if (!sq.buf)
    abort ();
  seq_read (img, &sq);
  check_extents (img, &sq, 0, sq.len, false, 0);
  free (sq.buf);
  qcow2_close (img);
}

/* A byte of p (n bytes), or 0 past its end. */
static uint8_t
byte_at (const uint8_t *p, size_t n, size_t i)
{
  return i < n ? p[i] : 0;
}

/* One of the first n words, chosen by b; NULL as often as a word. */
static const char *
pick (const char *const *words, size_t n, uint8_t b)
{
  return b % (n + 1) < n ? words[b % (n + 1)] : NULL;
}
#define PICK(words, b) pick (words, sizeof words / sizeof *words, b)

/* A "\0CRT" input: the create options of p (n bytes), checked, and an
 * unencrypted image made with them, served and opened again.  Bytes:
 *   0      cluster size: 1 << (b % 24)
 *   1-3    virtual size, in units of 64 bytes (little-endian)
 *   4      bit 0 compat=0.10, 1 extended L2, 2 lazy refcounts, 3 zstd,
 *          4 data file "data.raw", 5 raw data file, 6 backing file,
 *          7 encrypted
 *   5      refcount width, as is (0: the default)
 *   6      backing file: base.qcow2, base.raw, raw without its format,
 *          a missing file, a name too long for the header
 *   7      preallocation (mod 4)
 *   8-12   LUKS: cipher, mode, IV generator, its hash, the hash (NULL
 *          for some values: the default); bit 0 of byte 13: no password
 */
static void
fuzz_create (const struct qcow2_env *env, struct memenv *me,
             const uint8_t *p, size_t n, uint64_t *rng)
{
  static const char *const ciphers[] = {
    "aes-128", "aes-192", "aes-256", "cast5-128", "serpent-128",
    "serpent-192", "serpent-256", "twofish-128", "twofish-192",
    "twofish-256", "aes-512", "des",
  };
  static const char *const modes[] = { "xts", "cbc", "ecb", "ctr", "gcm" };
  static const char *const ivgens[] = { "plain", "plain64", "essiv", "lmk" };
  static const char *const hashes[] = {
    "sha256", "sha1", "sha224", "sha384", "sha512", "md5", "ripemd160",
    "sha3-256",
  };
  static char long_name[1100];
  const uint8_t flags = byte_at (p, n, 4), backing = byte_at (p, n, 6) % 5;
  const struct qcow2_luks_options luks = {
    .password = byte_at (p, n, 13) & 1 ? NULL : "fuzz",
    .cipher_alg = PICK (ciphers, byte_at (p, n, 8)),
    .cipher_mode = PICK (modes, byte_at (p, n, 9)),
    .ivgen_alg = PICK (ivgens, byte_at (p, n, 10)),
    .ivgen_hash_alg = PICK (hashes, byte_at (p, n, 11)),
    .hash_alg = PICK (hashes, byte_at (p, n, 12)),
  };
  const char *const backing_names[] = {
    "base.qcow2", "base.raw", "base.raw", "nosuch.qcow2", long_name,
  };
  const struct qcow2_create_options co = {
    .cluster_size = UINT64_C (1) << (byte_at (p, n, 0) % 24),
    .size = ((uint64_t) byte_at (p, n, 1) | byte_at (p, n, 2) << 8 |
             (uint64_t) byte_at (p, n, 3) << 16) * 64,
    .compat_v2 = flags & 1,
    .extended_l2 = flags & 2,
    .lazy_refcounts = flags & 4,
    .zstd = flags & 8,
    .data_file = flags & 16 ? "data.raw" : NULL,
    .data_file_raw = flags & 32,
    .backing = flags & 64 ? backing_names[backing] : NULL,
    .backing_format = !(flags & 64) ? NULL : backing == 0 ? "qcow2"
      : backing == 1 ? "raw" : NULL,
    .refcount_bits = byte_at (p, n, 5),
    .preallocation = byte_at (p, n, 7) % 4,
    .luks = flags & 128 ? &luks : NULL,
  };
  const struct qcow2_options opts = {
    .passwords = &fuzz_env_password, .passwords_len = 1,
    .max_pbkdf2_iterations = FUZZ_PBKDF2_MAX,
  };
  struct qcow2_io *io;
  struct qcow2_image *img;

  memset (long_name, 'a', sizeof long_name - 1);
  /* Encrypted, the check only: making the key slot takes 100 ms of
   * PBKDF2 timing.
   */
  if (qcow2_create_check (env, &co) < 0 || co.luks)
    return;
  io = memio_new (NULL, 0);
  if (!io || memenv_add (me, "dir/disk.qcow2", io) < 0)
    abort ();
  if (qcow2_create (env, io, &co) == 0 &&
      (img = qcow2_open (env, fuzz_env_capio (memio_ref (io)),
                         "dir/disk.qcow2", &opts))) {
    uint64_t vsize = qcow2_get_size (img);

    check_state (img, vsize);
    if (vsize <= CREATE_MAX_SIZE && qcow2_can_write (img)) {
      qcow2_preallocate (img, co.preallocation);
      do_writes (img, vsize, vsize, co.cluster_size, true, rng);
      check_state (img, vsize);
    }
    qcow2_close (img);
    reopen (env, io, rng);
  }
  io->ops->close (io);
}

int LLVMFuzzerInitialize (int *argc, char ***argv);

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  fuzz_env_setup ();
  return 0;
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  static const uint64_t cache_sizes[] = { 0, 1 << 10, 4 << 10, 64 << 10 };
  static const uint64_t slice_sizes[] = { 0, 512, 2 << 10, 0 };
  static const char *const snapshots[] = { NULL, "snap1", "1", "nosuch" };
  static const uint64_t chunks[] = { 64 << 10, 4608, (1 << 20) + 512, 777 };
  static const uint32_t overlap_masks[] = {
    0, 0, QCOW2_OL_CONSTANT, QCOW2_OL_ALL
  };
  uint64_t ctl = 0, rng, vsize, near;
  uint8_t *made = NULL;
  struct qcow2_options opts;
  struct memenv *me;
  struct fuzz_env fe;
  struct qcow2_io *io;
  struct qcow2_image *img;
  struct seq sq;

  if (size >= 8) {
    size -= 8;
    for (int i = 7; i >= 0; i--)
      ctl = ctl << 8 | data[size + i];
  }
  rng = ctl >> 16;

  me = memenv_new ();
  if (!me)
    abort ();
  fuzz_env_add_base_files (me);
  fuzz_env_init (&fe, me);
  if (size >= 4 && memcmp (data, "\0CRT", 4) == 0) {
    fuzz_create (&fe.env, me, data + 4, size - 4, &rng);
    memenv_free (me);
    return 0;
  }
  if (size >= 4 && memcmp (data, "\0TPL", 4) == 0) {
    made = fuzz_env_template_image (data + 4, size - 4, &size);
    data = made;
  }
  io = memio_new (data, size);
  if (!io)
    abort ();
  fuzz_env_add_file (me, "dir/disk.qcow2", data, size);

  opts = (struct qcow2_options) {
    .l2_cache_size = cache_sizes[ctl & 3],
    .l2_slice_size = slice_sizes[(ctl >> 2) & 3],
    .no_backing = ctl & (1 << 4),
    .readonly = ctl & (1 << 5),
    .discard_ignore = ctl & (1 << 6),
    .snapshot = snapshots[(ctl >> 7) & 3],
    .data_file = ctl & (1 << 9) ? "dir/data.raw" : NULL,
    .overlap_set = (ctl >> 14) & 3,
    .overlap_mask = overlap_masks[(ctl >> 14) & 3],
    .compress = ctl & (1 << 16),
    .compress_type = -1,
    .passwords = &fuzz_env_password,
    .passwords_len = 1,
    .max_pbkdf2_iterations = FUZZ_PBKDF2_MAX,
  };
  /* qcow2_open takes a reference; ours opens the result again. */
  img = qcow2_open (&fe.env, fuzz_env_capio (memio_ref (io)), "dir/disk.qcow2",
                    &opts);
  if (!img)
    goto out;

  vsize = qcow2_get_size (img);
  check_state (img, vsize);

  /* The start of the disk, in chunks of one size. */
  sq = (struct seq) { .chunk = chunks[(ctl >> 10) & 3] };
  sq.len = vsize < SEQ_MAX_BYTES ? vsize : SEQ_MAX_BYTES;
  if (sq.len > sq.chunk * SEQ_MAX_REQUESTS)
    sq.len = sq.chunk * SEQ_MAX_REQUESTS;
  sq.buf = malloc (sq.len ? sq.len : 1);
  if (!sq.buf)
    abort ();
  seq_read (img, &sq);
  near = sq.len ? sq.len : vsize;

  check_extents (img, &sq, 0, sq.len, false, 0);
  check_extents (img, &sq, 0, sq.len, false, 1 + rng_below (&rng, 4));
  for (int i = 0; i < 4; i++) {
    uint64_t off = rng_offset (&rng, vsize);
    uint64_t len = rng_length (&rng, EXTENT_MAX);
    check_extents (img, &sq, off, len < vsize - off ? len : vsize - off,
                   i == 0, 0);
  }

  /* Scattered reads, over the start and anywhere. */
  for (int i = 0; i < SCATTER_READS; i++) {
    uint64_t off = rng_offset (&rng, i & 1 ? vsize : near);
    uint64_t len = rng_length (&rng, SCATTER_MAX);
    check_read (img, &sq, off, len < vsize - off ? len : vsize - off);
  }
  check_out_of_range (img, vsize, &rng);

  if (qcow2_can_write (img)) {
    if ((ctl & (1 << 12)) && vsize <= PREALLOC_MAX)
      qcow2_preallocate (img, ctl & (1 << 13) ? QCOW2_PREALLOC_FULL
                                              : QCOW2_PREALLOC_METADATA);
    /* The header was valid, so its cluster_bits field is. */
    uint32_t cluster_bits = (uint32_t) data[20] << 24 | data[21] << 16
      | data[22] << 8 | data[23];

    bool guarded = !opts.overlap_set || opts.overlap_mask == QCOW2_OL_ALL;

    do_writes (img, vsize, near, UINT64_C (1) << cluster_bits, guarded,
               &rng);
    check_state (img, vsize);

    /* After the writes: reads still repeat, and agree with extents, if
     * the guard kept the metadata whole.
     */
    sq.len = near < (1 << 20) ? near : 1 << 20;
    sq.chunk = 64 << 10;
    seq_read (img, &sq);
    check_extents (img, guarded ? &sq : NULL, 0, sq.len, false, 0);
    for (int i = 0; i < 4; i++) {
      uint64_t off = rng_offset (&rng, near);
      uint64_t len = rng_length (&rng, SCATTER_MAX);
      check_read (img, guarded ? &sq : NULL, off,
                  len < vsize - off ? len : vsize - off);
    }
    qcow2_flush (img);
  }
  free (sq.buf);
  {
    bool written = qcow2_can_write (img);
    qcow2_close (img);
    if (written)
      reopen (&fe.env, io, &rng);
  }

 out:
  io->ops->close (io);
  memenv_free (me);
  free (made);
  return 0;
}
