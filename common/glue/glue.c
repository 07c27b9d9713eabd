/* SPDX-License-Identifier: BSD-3-Clause */
/* The nbdkit glue the qcow2 plugin and filter share (see glue.h). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "checked.h"
#include "fileio.h"
#include "glue.h"

struct glue_state glue = {
  .engine.io_threads = GLUE_IO_THREADS, .create.size = -1,
};

int
glue_parse_size (const char *key, const char *value, bool zero_ok,
                 uint64_t *out)
{
  int64_t r = nbdkit_parse_size (value);

  if (r == -1) {
    nbdkit_error ("%s: expected a size such as 512, 64K or 1G, not \"%s\"",
                  key, value);
    return -1;
  }
  if (r == 0 && !zero_ok) {
    nbdkit_error ("%s must not be zero", key);
    return -1;
  }
  *out = r;
  return 0;
}

int
glue_parse_bool (const char *key, const char *value, bool *out)
{
  int r = nbdkit_parse_bool (value);

  if (r == -1) {
    nbdkit_error ("%s: expected true or false (on/off, yes/no, 1/0), not "
                  "\"%s\"", key, value);
    return -1;
  }
  *out = r;
  return 0;
}

/* One of a few words: its index in words (NULL-terminated), or -1
 * with an error listing them.
 */
static int
glue_parse_word (const char *key, const char *value,
                 const char *const *words)
{
  char list[256] = "";
  size_t n = 0;

  for (size_t i = 0; words[i]; i++) {
    if (strcmp (value, words[i]) == 0)
      return i;
    n = i + 1;
  }
  for (size_t i = 0; i < n; i++)
    snprintf (list + strlen (list), sizeof list - strlen (list), "%s%s",
              i == 0 ? "" : i + 1 < n ? ", " : " or ", words[i]);
  nbdkit_error ("%s: expected %s, not \"%s\"", key, list, value);
  return -1;
}

/* key=value by the table t of n rows: 1 if done, 0 if the table has no
 * such key, -1 on error (said, naming the key).  *row: the row used.
 */
static int
glue_config_table (const struct glue_option *t, size_t n, const char *key,
                   const char *value, const struct glue_option **row)
{
  const struct glue_option *o = NULL;
  int i;

  for (size_t k = 0; k < n && !o; k++)
    if (t[k].prefix ? strncmp (key, t[k].key, strlen (t[k].key)) == 0
                    : strcmp (key, t[k].key) == 0)
      o = &t[k];
  if (row)
    *row = o;
  if (!o)
    return 0;
  if (o->given)
    *o->given = true;
  switch (o->kind) {
  case GLUE_PATH:
  case GLUE_STRING: {
    char **dest = o->dest;

    free (*dest);
    *dest = o->kind == GLUE_PATH ? nbdkit_absolute_path (value)
                                 : strdup (value);
    return *dest ? 1 : -1;
  }
  case GLUE_BOOL:
    return glue_parse_bool (key, value, o->dest) == 0 ? 1 : -1;
  case GLUE_SIZE:
    return glue_parse_size (key, value, false, o->dest) == 0 ? 1 : -1;
  case GLUE_WORD:
    if ((i = glue_parse_word (key, value, o->words)) == -1)
      return -1;
    o->set (i);
    return 1;
  case GLUE_FN:
    return o->fn (key, value) == 0 ? 1 : -1;
  }
  abort ();
}

static void
glue_set_discard (unsigned i)
{
  glue.engine.discard_ignore = i == 1;
}

static void
glue_set_repair (unsigned i)
{
  glue.repair_leaks = i == 0;
}

static void
glue_set_locking (unsigned i)
{
  glue_file_options.locking = i == 0 ? FILEIO_LOCKING_ON
    : i == 1 ? FILEIO_LOCKING_OFF : FILEIO_LOCKING_AUTO;
}

static const char *const overlap_modes[] = {
  "none", "constant", "cached", "all", NULL
};

static void
glue_set_overlap_check (unsigned i)
{
  glue.engine.overlap_mask = qcow2_overlap_mode (overlap_modes[i]);
  glue.engine.overlap_set = true;
}

static int
glue_config_io_threads (const char *key, const char *value)
{
  if (nbdkit_parse_unsigned (key, value, &glue.engine.io_threads) == -1)
    return -1;
  if (glue.engine.io_threads > GLUE_IO_THREADS_MAX) {
    nbdkit_error ("io-threads: at most %d, not %u (a few threads already "
                  "keep a host file's queue full)", GLUE_IO_THREADS_MAX,
                  glue.engine.io_threads);
    return -1;
  }
  return 0;
}

/* overlap-check.NAME=on|off (see glue_config_complete). */
static int
glue_config_overlap_structure (const char *key, const char *value)
{
  int bit = qcow2_overlap_structure (key + strlen ("overlap-check."));
  bool on;

  if (bit == -1) {
    nbdkit_error ("%s: unknown structure (main-header, active-l1, "
                  "active-l2, refcount-table, refcount-block, "
                  "snapshot-table, inactive-l1, inactive-l2, "
                  "bitmap-directory)", key);
    return -1;
  }
  if (glue_parse_bool (key, value, &on) == -1)
    return -1;
  glue.overlap_on = on ? glue.overlap_on | 1u << bit
                       : glue.overlap_on & ~(1u << bit);
  glue.overlap_off = on ? glue.overlap_off & ~(1u << bit)
                        : glue.overlap_off | 1u << bit;
  return 0;
}

#define WORDS(...) (const char *const []) { __VA_ARGS__, NULL }

/* Wipe and free a string holding a secret. */
static void
glue_wipe (const char *p)
{
  if (p) {
    explicit_bzero ((char *) p, strlen (p));
    free ((char *) p);
  }
}

/* The whole of the file a +FILE password came from, if it holds more
 * than nbdkit read (its first line, without the newline): NULL if not,
 * or if it cannot be read (nbdkit's reading stands).
 */
static char *
glue_read_whole_file (const char *path, const char *text)
{
  char buf[4096];
  size_t n = 0;
  FILE *fp = fopen (path, "r");
  char *whole = NULL;

  if (!fp)
    return NULL;
  n = fread (buf, 1, sizeof buf - 1, fp);
  if (!ferror (fp) && feof (fp)) {
    buf[n] = '\0';
    if (strlen (buf) == n && strcmp (buf, text) != 0)
      whole = strdup (buf);
  }
  fclose (fp);
  explicit_bzero (buf, sizeof buf);
  return whole;
}

/* Read a password (SECRET, -, +FILE or -FD) into layer i's. */
static int
glue_read_password (const char *value, unsigned i)
{
  struct qcow2_password *pw;
  char *text, *whole = NULL;

  if (nbdkit_read_password (value, &text) == -1)
    return -1;
  if (value[0] == '+')
    whole = glue_read_whole_file (value + 1, text);
  if (i >= glue.passwords_len) {
    pw = realloc (glue.passwords, (i + 1) * sizeof *pw);
    if (!pw) {
      nbdkit_error ("%s: out of memory", value);
      glue_wipe (text);
      glue_wipe (whole);
      return -1;
    }
    memset (pw + glue.passwords_len, 0,
            (i + 1 - glue.passwords_len) * sizeof *pw);
    glue.passwords = pw;
    glue.passwords_len = i + 1;
  }
  pw = &glue.passwords[i];
  glue_wipe (pw->text);
  glue_wipe (pw->whole_file);
  pw->text = text;
  pw->whole_file = whole;
  return 0;
}

int
glue_config_password (const char *key, const char *value)
{
  return glue_read_password (value, 0);
}

int
glue_config_backing_password (const char *key, const char *value)
{
  return glue_read_password (value, MAX (glue.passwords_len, 1));
}

/* compress=off|on|zlib|zstd: on is the image's compression type. */
static void
glue_set_compress (unsigned i)
{
  glue.engine.compress = i > 0;
  glue.engine.compress_type = i >= 2 ? (int) i - 2 : -1;
}

static const struct glue_option glue_options[] = {
  { "snapshot", GLUE_STRING, .dest = &glue.snapshot },
  { "discard", GLUE_WORD, .words = WORDS ("unmap", "ignore"),
    .set = glue_set_discard },
  { "repair", GLUE_WORD, .words = WORDS ("leaks", "off"),
    .set = glue_set_repair },
  { "overlap-check", GLUE_WORD, .words = overlap_modes,
    .set = glue_set_overlap_check },
  { "overlap-check.", GLUE_FN, .prefix = true,
    .fn = glue_config_overlap_structure },
  { "io-threads", GLUE_FN, .fn = glue_config_io_threads },
  { "l2-cache-size", GLUE_SIZE, .dest = &glue.engine.l2_cache_size },
  { "l2-slice-size", GLUE_SIZE, .dest = &glue.engine.l2_slice_size },
  /* QEMU's name for it. */
  { "l2-cache-entry-size", GLUE_SIZE, .dest = &glue.engine.l2_slice_size },
  { "locking", GLUE_WORD, .words = WORDS ("on", "off", "auto"),
    .set = glue_set_locking },
  { "compress", GLUE_WORD, .words = WORDS ("off", "on", "zlib", "zstd"),
    .set = glue_set_compress },
};

static void
glue_set_encrypt_format (unsigned i)
{
  glue.create.opts.luks = &glue.create.luks;
}

/* encrypt-* keys but the format: strings, and the PBKDF2 time. */
static int
glue_config_encrypt (const char *key, const char *value)
{
  const char *name = key + strlen ("encrypt-");
  struct qcow2_luks_options *l = &glue.create.luks;
  const char **dest =
    strcmp (name, "cipher-alg") == 0 ? &l->cipher_alg :
    strcmp (name, "cipher-mode") == 0 ? &l->cipher_mode :
    strcmp (name, "ivgen-alg") == 0 ? &l->ivgen_alg :
    strcmp (name, "ivgen-hash-alg") == 0 ? &l->ivgen_hash_alg :
    strcmp (name, "hash-alg") == 0 ? &l->hash_alg : NULL;
  char *copy;

  if (strcmp (name, "iter-time") == 0)
    return nbdkit_parse_uint64_t (key, value, &l->iter_time);
  if (!dest || !(copy = strdup (value))) {
    nbdkit_error ("%s: %s", key, dest ? "out of memory" : "unknown key");
    return -1;
  }
  free ((char *) *dest);
  *dest = copy;
  return 0;
}

static void
glue_set_compat (unsigned i)
{
  glue.create.opts.compat_v2 = i == 0;
}

int
glue_config_create_size (const char *key, const char *value)
{
  uint64_t size;

  if (glue_parse_size (key, value, true, &size) == -1)
    return -1;
  if (size > INT64_MAX - 511) {
    nbdkit_error ("%s: %" PRIu64 " is too large", key, size);
    return -1;
  }
  glue.create.size = size;
  return 0;
}

static void
glue_set_compression_type (unsigned i)
{
  glue.create.opts.zstd = i == 1;
  glue.create.compression_type_set = true;
}

static int
glue_config_refcount_bits (const char *key, const char *value)
{
  return nbdkit_parse_unsigned (key, value, &glue.create.opts.refcount_bits);
}

/* Each with qemu-img's spelling too (-o cluster_size=...). */
static const struct glue_option glue_create_options[] = {
  { "cluster-size", GLUE_SIZE, true, .dest = &glue.create.opts.cluster_size },
  { "cluster_size", GLUE_SIZE, true, .dest = &glue.create.opts.cluster_size },
  { "compat", GLUE_WORD, true, .words = WORDS ("0.10", "1.1"),
    .set = glue_set_compat, .given = &glue.create.compat_set },
  { "extended-l2", GLUE_BOOL, true, .dest = &glue.create.opts.extended_l2,
    .given = &glue.create.extended_l2_set },
  { "extended_l2", GLUE_BOOL, true, .dest = &glue.create.opts.extended_l2,
    .given = &glue.create.extended_l2_set },
  { "lazy-refcounts", GLUE_BOOL, true,
    .dest = &glue.create.opts.lazy_refcounts,
    .given = &glue.create.lazy_refcounts_set },
  { "lazy_refcounts", GLUE_BOOL, true,
    .dest = &glue.create.opts.lazy_refcounts,
    .given = &glue.create.lazy_refcounts_set },
  { "refcount-bits", GLUE_FN, true, .fn = glue_config_refcount_bits },
  { "refcount_bits", GLUE_FN, true, .fn = glue_config_refcount_bits },
  { "compression-type", GLUE_WORD, true, .words = WORDS ("zlib", "zstd"),
    .set = glue_set_compression_type },
  { "compression_type", GLUE_WORD, true, .words = WORDS ("zlib", "zstd"),
    .set = glue_set_compression_type },
  { "encrypt-format", GLUE_WORD, true, .words = WORDS ("luks"),
    .set = glue_set_encrypt_format },
  { "encrypt-cipher-alg", GLUE_FN, true, .fn = glue_config_encrypt },
  { "encrypt-cipher-mode", GLUE_FN, true, .fn = glue_config_encrypt },
  { "encrypt-ivgen-alg", GLUE_FN, true, .fn = glue_config_encrypt },
  { "encrypt-ivgen-hash-alg", GLUE_FN, true, .fn = glue_config_encrypt },
  { "encrypt-hash-alg", GLUE_FN, true, .fn = glue_config_encrypt },
  { "encrypt-iter-time", GLUE_FN, true, .fn = glue_config_encrypt },
};

int
glue_config (const struct glue_option *t, size_t n, const char *key,
             const char *value, const struct glue_option **row)
{
  const struct glue_option *o = NULL;
  char dashed[64];
  int r;

  /* qemu-img's encrypt.NAME, as encrypt-NAME. */
  if (strncmp (key, "encrypt.", 8) == 0 && strlen (key) < sizeof dashed) {
    strcpy (dashed, key);
    dashed[7] = '-';
    key = dashed;
  }
  r = glue_config_table (glue_options,
                             sizeof glue_options / sizeof *glue_options,
                             key, value, NULL);

  if (r == 0)
    r = glue_config_table (glue_create_options,
                           sizeof glue_create_options
                           / sizeof *glue_create_options, key, value, &o);
  if (r == 0)
    r = glue_config_table (t, n, key, value, &o);
  if (r == 1 && o && o->create_only && !glue.create.first_key)
    glue.create.first_key = o->key;
  if (row)
    *row = o;
  return r;
}

/* Append ", what" to the list of differences in buf. */
static void
glue_differs (char *buf, size_t size, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));
static void
glue_differs (char *buf, size_t size, const char *fmt, ...)
{
  size_t n = strlen (buf);
  va_list ap;

  if (n + 2 >= size)
    return;
  if (n)
    strcpy (buf + n, "; "), n += 2;
  va_start (ap, fmt);
  vsnprintf (buf + n, size - n, fmt, ap);
  va_end (ap);
}

/* A yes-or-no option given (key=on or off) that the image contradicts:
 * what it has, and what was asked.
 */
static void
glue_differs_flag (char *buf, size_t size, bool given, bool have, bool want,
                   const char *has_on, const char *has_off, const char *key,
                   const char *on, const char *off)
{
  if (given && have != want)
    glue_differs (buf, size, "%s, not %s=%s", have ? has_on : has_off, key,
                  want ? on : off);
}

int
glue_create_compare (struct qcow2_image *img, const char *name)
{
  const struct glue_create *c = &glue.create;
  const struct qcow2_create_options *o = &c->opts;
  struct qcow2_info i;
  char why[1024] = "";

  qcow2_get_info (img, &i);
  /* Whole sectors, as create makes it (and QEMU serves it). */
  if (c->size >= 0 && div_round_up (c->size, 512) !=
      div_round_up (i.size, 512))
    glue_differs (why, sizeof why, "its virtual size is %" PRIu64 " bytes, "
                  "not size=%" PRId64, i.size, c->size);
  if (!o->luks != !i.encrypted)
    glue_differs (why, sizeof why, "it is %sencrypted%s", i.encrypted ? ""
                  : "not ", i.encrypted ? ", but encrypt-format= is not "
                  "given" : ", but encrypt-format=luks is given");
  if (o->cluster_size && o->cluster_size != i.cluster_size)
    glue_differs (why, sizeof why, "its clusters are %" PRIu64 " bytes, not "
                  "cluster-size=%" PRIu64, i.cluster_size, o->cluster_size);
  glue_differs_flag (why, sizeof why, c->compat_set, i.version == 2,
                     o->compat_v2, "it is version 2", "it is version 3",
                     "compat", "0.10", "1.1");
  glue_differs_flag (why, sizeof why, c->extended_l2_set, i.extended_l2,
                     o->extended_l2, "its L2 entries are extended",
                     "its L2 entries are not extended", "extended-l2",
                     "on", "off");
  glue_differs_flag (why, sizeof why, c->lazy_refcounts_set,
                     i.lazy_refcounts, o->lazy_refcounts,
                     "lazy refcounts are on", "lazy refcounts are off",
                     "lazy-refcounts", "on", "off");
  if (o->refcount_bits && o->refcount_bits != i.refcount_bits)
    glue_differs (why, sizeof why, "its refcounts are %u bits, not "
                  "refcount-bits=%u", i.refcount_bits, o->refcount_bits);
  glue_differs_flag (why, sizeof why, c->compression_type_set, i.zstd,
                     o->zstd, "its compression type is zstd",
                     "its compression type is zlib", "compression-type",
                     "zstd", "zlib");
  glue_differs_flag (why, sizeof why, c->data_file_raw_set, i.data_file_raw,
                     o->data_file_raw, "its data file is raw",
                     "its data file is not raw", "data-file-raw", "on",
                     "off");
  if (o->backing && (!i.backing || strcmp (i.backing, o->backing) != 0))
    glue_differs (why, sizeof why, "its backing file is %s%s%s, not "
                  "backing=%s", i.backing ? "\"" : "", i.backing ? i.backing
                  : "none", i.backing ? "\"" : "", o->backing);
  if (!why[0])
    return 0;
  nbdkit_error ("create=if-missing: %s exists, but it is not the image the "
                "options describe: %s.  It is left as it is: drop the "
                "options that differ to serve it, or remove it to make a "
                "new one", name, why);
  return -1;
}

int
glue_config_complete (void)
{
  const struct qcow2_luks_options *l = &glue.create.luks;

  if (!glue.create.opts.luks &&
      (l->cipher_alg || l->cipher_mode || l->ivgen_alg || l->ivgen_hash_alg ||
       l->hash_alg || l->iter_time)) {
    nbdkit_error ("the encrypt-* keys describe encryption: they need "
                  "encrypt-format=luks");
    return -1;
  }
  /* A new image compresses as compress= says. */
  if (glue.engine.compress && glue.engine.compress_type >= 0) {
    bool zstd = glue.engine.compress_type == QCOW2_COMPRESS_ZSTD;
    if (glue.create.compression_type_set && glue.create.opts.zstd != zstd) {
      nbdkit_error ("compress=%s and compression-type=%s disagree",
                    zstd ? "zstd" : "zlib", zstd ? "zlib" : "zstd");
      return -1;
    }
    glue.create.opts.zstd = zstd;
  }
  glue.engine.passwords = glue.passwords;
  glue.engine.passwords_len = glue.passwords_len;
  glue.create.luks.password = glue_password ();
  glue.engine.snapshot = glue.snapshot;
  if (glue.overlap_on | glue.overlap_off) {
    if (!glue.engine.overlap_set)
      glue.engine.overlap_mask = qcow2_overlap_mode ("cached");
    glue.engine.overlap_mask =
      (glue.engine.overlap_mask | glue.overlap_on) & ~glue.overlap_off;
    glue.engine.overlap_set = true;
  }
  return 0;
}

void
glue_forget_password (void)
{
  for (unsigned i = 0; i < glue.passwords_len; i++) {
    glue_wipe (glue.passwords[i].text);
    glue_wipe (glue.passwords[i].whole_file);
  }
  free (glue.passwords);
  glue.passwords = NULL;
  glue.passwords_len = 0;
  glue.engine.passwords = NULL;
  glue.engine.passwords_len = 0;
  glue.create.luks.password = NULL;
}

void
glue_unload (void)
{
  struct qcow2_luks_options *l = &glue.create.luks;

  glue_forget_password ();
  free ((char *) l->cipher_alg);
  free ((char *) l->cipher_mode);
  free ((char *) l->ivgen_alg);
  free ((char *) l->ivgen_hash_alg);
  free ((char *) l->hash_alg);
  free (glue.snapshot);
}

void
glue_error (void *opaque, const char *msg)
{
  nbdkit_error ("%s", msg);
}

void
glue_debug (void *opaque, const char *msg)
{
  nbdkit_debug ("%s", msg);
}

void
glue_notice (void *opaque, const char *path, const char *msg)
{
  nbdkit_error ("%s: %s", path, msg);
}

/* Leaked clusters (a crash leaves some) are reclaimed, and a dirty
 * image gets its refcounts rebuilt, before any client connects; what
 * qcow2_check cannot repair is refused.
 */
int
glue_repair (struct qcow2_image *img, const char *name)
{
  struct qcow2_check_result res;

  if (!qcow2_can_write (img)) {
    nbdkit_error ("repair=leaks: %s cannot be written: %s", name,
                  qcow2_readonly_reason (img));
    return -1;
  }
  if (qcow2_check (img, true, &res) < 0)
    return -1;
  if (res.corruptions) {
    nbdkit_error ("repair=leaks: %s: %" PRIu64 " errors remain that a leak "
                  "repair cannot fix (\"qemu-img check\" tells more): not "
                  "served", name, res.corruptions);
    return -1;
  }
  nbdkit_debug ("repair=leaks: %" PRIu64 " leaked clusters reclaimed",
                res.leaks_fixed);
  return 0;
}

bool
glue_server_readonly (void)
{
  char buf[8192];
  size_t n = 0;
  bool ro = false;
  FILE *fp = fopen ("/proc/self/cmdline", "r");

  if (!fp)
    return false;
  n = fread (buf, 1, sizeof buf - 1, fp);
  fclose (fp);
  buf[n] = '\0';
  for (size_t i = 0; i < n; i += strlen (buf + i) + 1) {
    const char *a = buf + i;

    if (strcmp (a, "--") == 0)
      break;
    if (strcmp (a, "--readonly") == 0 || strcmp (a, "--read-only") == 0)
      ro = true;
    /* Short flags that take no argument, grouped: -r, -fr, -rv ... */
    else if (a[0] == '-' && a[1] != '-' && a[1] &&
             strspn (a + 1, "fnrsv") == strlen (a + 1) && strchr (a, 'r'))
      ro = true;
  }
  return ro;
}

/* Files not locked where locking=auto finds no OFD locks. */
static void
glue_lock_notice (const char *path, const char *msg)
{
  glue_notice (NULL, path, msg);
}

static void
glue_lock_debug (const char *path, const char *msg)
{
  nbdkit_debug ("%s: %s", path, msg);
}

struct fileio_options glue_file_options = {
  .notice = glue_lock_notice,
  .debug = glue_lock_debug,
};

const struct qcow2_env glue_env = {
  .opaque = &glue_file_options,
  .open = fileio_env_open,
  .identity = fileio_env_identity,
  .error = glue_error,
  .debug = glue_debug,
  .notice = glue_notice,
};
