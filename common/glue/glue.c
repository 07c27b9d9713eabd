/* SPDX-License-Identifier: BSD-3-Clause */
/* The nbdkit glue the qcow2 plugin and filter share (see glue.h). */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "checked.h"
#include "errstr.h"
#include "fileio.h"
#include "glue.h"

struct glue_state glue = {
  .engine.io_threads = GLUE_IO_THREADS, .create.size = -1,
  .max_request = 32 << 20,
};

NBDKIT_DLL_PUBLIC int qcow2_debug_cache = 0;
NBDKIT_DLL_PUBLIC int qcow2_debug_flush = 0;

/* Whether value goes on with ",KEY=" (a qemu-img -o list pasted as
 * one key's value).
 */
static bool
glue_holds_list (const char *value)
{
  for (const char *c = strchr (value, ','); c; c = strchr (c + 1, ',')) {
    size_t n = strspn (c + 1, "abcdefghijklmnopqrstuvwxyz0123456789_.-");

    if (n > 0 && c[1 + n] == '=')
      return true;
  }
  return false;
}

int
glue_config_rows (const struct glue_option *t, size_t n, const char *key,
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
  /* A table's row names where its value goes. */
  assert (o->kind == GLUE_FN ? o->fn != NULL
          : o->kind == GLUE_WORD ? o->words && o->set : o->dest != NULL);
  if (o->kind != GLUE_PATH && o->kind != GLUE_STRING && !o->any_value &&
      glue_holds_list (value)) {
    nbdkit_error ("%s: \"%s\" holds more options: a qemu-img -o list is "
                  "given as options=%s=%s", key, value, key, value);
    return -1;
  }
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
  uint64_t n;

  /* A few threads already keep a host file's queue full. */
  if (glue_parse_number (key, value, "a number of threads",
                         GLUE_IO_THREADS_MAX, &n) == -1)
    return -1;
  glue.engine.io_threads = n;
  return 0;
}

/* max-request=: nbdkit gives each of a connection's threads a buffer
 * as large as the largest request it served, held while the connection
 * lasts; clients that honour the maximum (QEMU's) cut theirs there.
 * qemu-nbd's 32 MiB unless told: libnbd 1.16 and later refuse to send
 * a write longer than the maximum (or 1 MiB).
 */
static int
glue_config_max_request (const char *key, const char *value)
{
  uint64_t n;

  if (glue_parse_size (key, value, false, &n) == -1)
    return -1;
  /* At least the preferred size; at most qemu-nbd's longest. */
  if (n < 4096 || n > 32 << 20) {
    nbdkit_error ("%s: %s is out of range (4K to 32M)", key, value);
    return -1;
  }
  glue.max_request = n;
  return 0;
}

/* As qemu-nbd advertises them: any byte range works (partial clusters
 * cost one read and one write), 4 KiB suits every cluster size, and a
 * request may be as long as max-request=.
 */
void
glue_block_size (uint32_t *minimum, uint32_t *preferred, uint32_t *maximum)
{
  *minimum = 1;
  *preferred = 4096;
  *maximum = glue.max_request;
}

/* overlap-check.NAME=on|off (see glue_config_complete). */
static int
glue_config_overlap_structure (const char *key, const char *value)
{
  int bit = qcow2_overlap_structure (key + strlen ("overlap-check."));
  bool on;

  if (bit == -1) {
    nbdkit_error ("%s: unknown structure", key);
    glue_hint ("the structures are main-header, active-l1, active-l2, "
               "refcount-table, refcount-block, snapshot-table, "
               "inactive-l1, inactive-l2 and bitmap-directory");
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

/* compress=off|on|zlib|zstd: on is the image's compression type. */
static void
glue_set_compress (unsigned i)
{
  glue.engine.compress = i > 0;
  glue.engine.compress_type = i >= 2 ? (int) i - 2 : -1;
}

static int
glue_config_remote_timeout (const char *key, const char *value)
{
  uint64_t n;

  if (glue_parse_range (key, value, "seconds", 1, 86400, &n) == -1)
    return -1;
  glue.remote_timeout = n;
  return 0;
}

static const struct glue_option glue_options[] = {
  { "snapshot", GLUE_STRING, .dest = &glue.snapshot },
  { "readonly", GLUE_BOOL, .dest = &glue.engine.readonly },
  { "discard", GLUE_WORD, .words = WORDS ("unmap", "ignore"),
    .set = glue_set_discard },
  { "repair", GLUE_WORD, .words = WORDS ("leaks", "off"),
    .set = glue_set_repair },
  { "overlap-check", GLUE_WORD, .words = overlap_modes,
    .set = glue_set_overlap_check },
  { "overlap-check.", GLUE_FN, .prefix = true,
    .fn = glue_config_overlap_structure },
  { "io-threads", GLUE_FN, .fn = glue_config_io_threads },
  { "max-request", GLUE_FN, .fn = glue_config_max_request },
  { "l2-cache-size", GLUE_SIZE, .dest = &glue.engine.l2_cache_size },
  { "l2-slice-size", GLUE_SIZE, .dest = &glue.engine.l2_slice_size },
  /* QEMU's name for it. */
  { "l2-cache-entry-size", GLUE_SIZE, .dest = &glue.engine.l2_slice_size },
  { "locking", GLUE_WORD, .words = WORDS ("on", "off", "auto"),
    .set = glue_set_locking },
  { "compress", GLUE_WORD, .words = WORDS ("off", "on", "zlib", "zstd"),
    .set = glue_set_compress },
  { "remote-timeout", GLUE_FN, .fn = glue_config_remote_timeout },
  /* The admin's policy for what images name (policy.c). */
  { "backing-protocols", GLUE_FN, .fn = glue_config_backing_protocols },
  { "backing-root", GLUE_FN, .fn = glue_config_backing_root },
  { "backing-insecure", GLUE_FN, .fn = glue_config_backing_insecure },
  { "backing-tls-certificates", GLUE_PATH,
    .dest = &glue.policy.tls_certificates },
  { "backing-tls-psk-file", GLUE_PATH, .dest = &glue.policy.tls_psk_file },
  { "backing-tls-username", GLUE_STRING, .dest = &glue.policy.tls_username },
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
    return glue_parse_number (key, value, "milliseconds", UINT64_MAX,
                              &l->iter_time);
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
  glue.create.opts.compat_v2 = i == 0 || i == 2;   /* 0.10 or v2 */
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
  uint64_t n;

  if (glue_parse_number (key, value, "bits (1, 2, 4, 8, 16, 32 or 64)", 64,
                         &n) == -1)
    return -1;
  glue.create.opts.refcount_bits = n;
  return 0;
}

static void
glue_set_preallocation (unsigned i)
{
  glue.create.opts.preallocation = i;   /* in the enum's order */
}

/* Each with qemu-img's spelling too (-o cluster_size=...). */
static const struct glue_option glue_create_options[] = {
  { "cluster-size", GLUE_SIZE, true, .dest = &glue.create.opts.cluster_size },
  { "cluster_size", GLUE_SIZE, true, .dest = &glue.create.opts.cluster_size },
  { "compat", GLUE_WORD, true, .words = WORDS ("0.10", "1.1", "v2", "v3"),
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
  { "preallocation", GLUE_WORD, true,
    .words = WORDS ("off", "metadata", "falloc", "full"),
    .set = glue_set_preallocation },
};

/* options=LIST: each KEY=VALUE of a qemu-img -o list (",," is a
 * comma; KEY alone is KEY=on, as QEMU reads it) as if given alone;
 * size= is the new image's size, whatever the module calls it.
 */
static int
glue_config_options (const struct glue_option *t, size_t n,
                     const char *list)
{
  char *copy = malloc (strlen (list) + 1);
  const char *p = list;
  int r = 0;

  if (!copy) {
    nbdkit_error ("options: %s", errstr (errno));
    return -1;
  }
  while (r == 0 && *p) {
    char *q = copy, *value;

    for (; *p && !(p[0] == ',' && p[1] != ','); p++) {
      *q++ = *p;
      if (p[0] == ',')
        p++;                    /* ",," */
    }
    assert (q - copy <= p - list);      /* never longer than the list */
    *q = '\0';
    if (*p)
      p++;
    if (!copy[0])
      continue;
    value = strchr (copy, '=');
    if (value)
      *value++ = '\0';
    if (strcmp (copy, "encrypt.key-secret") == 0) {
      nbdkit_error ("options: encrypt.key-secret names a QEMU secret "
                    "object: give the password itself with %s=",
                    glue_env.password_key ? glue_env.password_key
                                          : "password");
      r = -1;
    }
    else if (strcmp (copy, "size") == 0) {
      r = glue_config_create_size ("size", value ? value : "");
      if (r == 0 && !glue.create.first_key)
        glue.create.first_key = "size";
    }
    else if (strcmp (copy, "options") == 0 ||
             (r = glue_config (t, n, copy, value ? value : "on", NULL)) == 0) {
      nbdkit_error ("options: %s is not an option of a new image here "
                    "(the man page lists them)", copy);
      r = -1;
    }
    else
      r = r == 1 ? 0 : -1;
  }
  free (copy);
  return r;
}

int
glue_config (const struct glue_option *t, size_t n, const char *key,
             const char *value, const struct glue_option **row)
{
  const struct glue_option *o = NULL;
  char dashed[64];
  int r;

  if (strcmp (key, "options") == 0) {
    if (row)
      *row = NULL;
    return glue_config_options (t, n, value) == 0 ? 1 : -1;
  }

  /* qemu-img's encrypt.NAME, as encrypt-NAME. */
  if (strncmp (key, "encrypt.", 8) == 0 && strlen (key) < sizeof dashed) {
    strcpy (dashed, key);
    dashed[7] = '-';
    key = dashed;
  }
  r = glue_config_rows (glue_options,
                             sizeof glue_options / sizeof *glue_options,
                             key, value, NULL);

  if (r == 0)
    r = glue_config_rows (glue_create_options,
                           sizeof glue_create_options
                           / sizeof *glue_create_options, key, value, &o);
  if (r == 0)
    r = glue_config_rows (t, n, key, value, &o);
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

  assert (n < size);

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
glue_create_check_password (const char *when)
{
  if (!glue_password () || glue.create.opts.luks)
    return 0;
  nbdkit_error ("%s= with %s needs encrypt-format=luks: without it "
                "the image made is not encrypted",
                glue_env.password_key ? glue_env.password_key : "password",
                when);
  return -1;
}

int
glue_create_compare (struct qcow2_image *img, const char *name)
{
  const struct glue_create *c = &glue.create;
  const struct qcow2_create_options *o = &c->opts;
  struct qcow2_info i;
  /* wrong: what would serve another disk (refused); other: what only
   * the format differs in, or a disk grown since (logged, and served).
   */
  char wrong[1024] = "", other[1024] = "";
  uint64_t want = c->size >= 0 ? div_round_up (c->size, 512) : 0;

  qcow2_get_info (img, &i);
  /* Whole sectors, as create makes it (and QEMU serves it). */
  if (c->size >= 0 && want > div_round_up (i.size, 512))
    glue_differs (wrong, sizeof wrong, "its virtual size is %" PRIu64
                  " bytes, less than size=%" PRId64, i.size, c->size);
  else if (c->size >= 0 && want < div_round_up (i.size, 512))
    glue_differs (other, sizeof other, "its virtual size is %" PRIu64
                  " bytes, more than size=%" PRId64 " (grown since it was "
                  "made, as by qemu-img resize)", i.size, c->size);
  if (!o->luks != !i.encrypted)
    glue_differs (wrong, sizeof wrong, "it is %sencrypted%s", i.encrypted ?
                  "" : "not ", i.encrypted ? ", but encrypt-format= is not "
                  "given" : ", but encrypt-format=luks is given");
  if (o->backing && (!i.backing || strcmp (i.backing, o->backing) != 0))
    glue_differs (wrong, sizeof wrong, "its backing file is %s%s%s, not "
                  "backing=%s", i.backing ? "\"" : "", i.backing ? i.backing
                  : "none", i.backing ? "\"" : "", o->backing);
  if (o->cluster_size && o->cluster_size != i.cluster_size)
    glue_differs (other, sizeof other, "its clusters are %" PRIu64 " bytes, "
                  "not cluster-size=%" PRIu64, i.cluster_size,
                  o->cluster_size);
  glue_differs_flag (other, sizeof other, c->compat_set, i.version == 2,
                     o->compat_v2, "it is version 2", "it is version 3",
                     "compat", "0.10", "1.1");
  glue_differs_flag (other, sizeof other, c->extended_l2_set, i.extended_l2,
                     o->extended_l2, "its L2 entries are extended",
                     "its L2 entries are not extended", "extended-l2",
                     "on", "off");
  glue_differs_flag (other, sizeof other, c->lazy_refcounts_set,
                     i.lazy_refcounts, o->lazy_refcounts,
                     "lazy refcounts are on", "lazy refcounts are off",
                     "lazy-refcounts", "on", "off");
  if (o->refcount_bits && o->refcount_bits != i.refcount_bits)
    glue_differs (other, sizeof other, "its refcounts are %u bits, not "
                  "refcount-bits=%u", i.refcount_bits, o->refcount_bits);
  glue_differs_flag (other, sizeof other, c->compression_type_set, i.zstd,
                     o->zstd, "its compression type is zstd",
                     "its compression type is zlib", "compression-type",
                     "zstd", "zlib");
  glue_differs_flag (other, sizeof other, c->data_file_raw_set,
                     i.data_file_raw, o->data_file_raw,
                     "its data file is raw", "its data file is not raw",
                     "data-file-raw", "on", "off");
  if (wrong[0]) {
    nbdkit_error ("create=if-missing: %s is another disk: %s", name, wrong);
    glue_hint ("it is left as it is, and not served: give the options it "
               "has (or none, without create=) to serve it");
    return -1;
  }
  if (other[0])
    glue_noticef (name, "create=if-missing: the image there is served as "
                  "it is: %s", other);
  return 0;
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
  glue_policy_free ();
}

/* The engine's environment: files through the policy (policy.c),
 * messages to nbdkit's log (log.c).
 */
struct qcow2_env glue_env = {
  .opaque = &glue_file_options,
  .open = glue_policy_open,
  .identity = fileio_env_identity,
  .open_remote = glue_policy_open_remote,
  .error = glue_error,
  .hint = glue_env_hint,
  .debug = glue_debug,
  .notice = glue_notice,
};
