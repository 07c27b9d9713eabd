/* SPDX-License-Identifier: BSD-3-Clause */
/* LUKS1 headers, as QEMU writes them in the clusters the full disk
 * encryption header extension points at: read, checked and opened with
 * a password (a PBKDF2 digest of the master key tells which key slot
 * it opens), and made for a new image with key slot 0.  The ciphers and
 * the key derivation are luks.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"
#include "luks.h"

#define LUKS_MIN_ITERS 1000
/* encrypt-iter-time= above which create's checks measure PBKDF2 (no
 * machine counts 2^32 iterations in less).
 */
#define LUKS_ITER_TIME_CHECK 10000

/* The LUKS1 header (the spec's "phdr"), big-endian on disk.  Never read
 * or written as a struct: it names the offsets (LH_*, LS_*), which the
 * code uses with be.h.
 */
struct luks_disk_slot {
  uint32_t active;
  uint32_t iterations;
  uint8_t salt[LUKS_SALT_LEN];
  uint32_t key_material_offset; /* in 512-byte sectors */
  uint32_t stripes;
} __attribute__ ((__packed__));

struct luks_disk_header {
  uint8_t magic[6];
  uint16_t version;
  char cipher_name[LUKS_NAME_LEN];
  char cipher_mode[LUKS_NAME_LEN];
  char hash_spec[LUKS_NAME_LEN];
  uint32_t payload_offset;
  uint32_t key_bytes;
  uint8_t mk_digest[LUKS_DIGEST_LEN];
  uint8_t mk_digest_salt[LUKS_SALT_LEN];
  uint32_t mk_digest_iterations;
  char uuid[LUKS_UUID_LEN];
  struct luks_disk_slot slots[LUKS_SLOTS];
} __attribute__ ((__packed__));

#define LH_FIELD(f) offsetof (struct luks_disk_header, f)
#define LH_VERSION LH_FIELD (version)
#define LH_CIPHER_NAME LH_FIELD (cipher_name)
#define LH_CIPHER_MODE LH_FIELD (cipher_mode)
#define LH_HASH_SPEC LH_FIELD (hash_spec)
#define LH_PAYLOAD_OFFSET LH_FIELD (payload_offset)
#define LH_KEY_BYTES LH_FIELD (key_bytes)
#define LH_MK_DIGEST LH_FIELD (mk_digest)
#define LH_MK_SALT LH_FIELD (mk_digest_salt)
#define LH_MK_ITERS LH_FIELD (mk_digest_iterations)
#define LH_UUID LH_FIELD (uuid)
#define LH_SLOT(i) (LH_FIELD (slots) + (i) * sizeof (struct luks_disk_slot))
#define LS_FIELD(f) offsetof (struct luks_disk_slot, f)
#define LS_ACTIVE LS_FIELD (active)
#define LS_ITERS LS_FIELD (iterations)
#define LS_SALT LS_FIELD (salt)
#define LS_KEY_OFFSET LS_FIELD (key_material_offset)
#define LS_STRIPES LS_FIELD (stripes)

/* The offsets and sizes of the LUKS1 on-disk format specification. */
_Static_assert (LH_VERSION == 6 && LH_CIPHER_NAME == 8 &&
                LH_CIPHER_MODE == 40 && LH_HASH_SPEC == 72 &&
                LH_PAYLOAD_OFFSET == 104 && LH_KEY_BYTES == 108 &&
                LH_MK_DIGEST == 112 && LH_MK_SALT == 132 &&
                LH_MK_ITERS == 164 && LH_UUID == 168 && LH_SLOT (0) == 208,
                "LUKS1 header fields");
_Static_assert (LS_ACTIVE == 0 && LS_ITERS == 4 && LS_SALT == 8 &&
                LS_KEY_OFFSET == 40 && LS_STRIPES == 44 &&
                sizeof (struct luks_disk_slot) == 48, "LUKS1 key slots");
_Static_assert (sizeof (struct luks_disk_header) == LUKS_HEADER_SIZE,
                "the LUKS1 header is 592 bytes");

/* Messages name the file the header is in. */
#define luks_error(where, ...) \
  log_named_error ((where)->env, (where)->name, __VA_ARGS__)
#define luks_debug(where, ...) \
  log_named_debug ((where)->env, (where)->name, __VA_ARGS__)

static const char *
luks_header_password_key (const struct qcow2_env *env)
{
  return env->password_key ? env->password_key : "password";
}

static const char *
luks_header_backing_password_key (const struct qcow2_env *env)
{
  return env->backing_password_key ? env->backing_password_key
                                   : "backing-password";
}

/* A NUL-terminated copy of a header string field. */
static void
luks_header_field (char *dst, const uint8_t *hdr, unsigned at)
{
  memcpy (dst, hdr + at, LUKS_NAME_LEN);
  dst[LUKS_NAME_LEN] = '\0';
}

/* The setup the header names; an error for what we cannot use. */
static int
luks_header_parse_setup (const struct luks_area *where, const uint8_t *hdr,
                         struct luks_setup *s)
{
  char name[LUKS_NAME_LEN + 1], mode[LUKS_NAME_LEN + 1];
  char hash[LUKS_NAME_LEN + 1], *ivgen, *ivhash;
  const char *why;
  int part;

  luks_header_field (name, hdr, LH_CIPHER_NAME);
  luks_header_field (mode, hdr, LH_CIPHER_MODE);
  luks_header_field (hash, hdr, LH_HASH_SPEC);
  memset (s, 0, sizeof *s);
  s->key_bytes = be32_get (hdr + LH_KEY_BYTES);

  /* mode-ivgen[:ivhash], as "xts-plain64" or "cbc-essiv:sha256" */
  if (!(ivgen = strchr (mode, '-'))) {
    luks_error (where, "LUKS header: cipher mode \"%s\" is not MODE-IVGEN",
                mode);
    return -EINVAL;
  }
  *ivgen++ = '\0';
  if ((ivhash = strchr (ivgen, ':')))
    *ivhash++ = '\0';
  if ((part = luks_lookup (s, mode, ivgen, ivhash, hash)) >= 0) {
    luks_error (where, "LUKS header: cipher mode \"%s-%s%s%s\", hash \"%s\": "
                "%s (%s are) not supported", mode, ivgen, ivhash ? ":" : "",
                ivhash ? ivhash : "", hash, luks_parts[part].what,
                luks_parts[part].known);
    return -ENOTSUP;
  }
  if (s->key_bytes == 0 || s->key_bytes > LUKS_MAX_KEY ||
      (s->mode == MODE_XTS && s->key_bytes % 2) ||
      !(s->cipher = luks_find_cipher (name, s->mode == MODE_XTS
                                      ? s->key_bytes / 2 : s->key_bytes))) {
    luks_error (where, "LUKS header: cipher \"%s\" with %" PRIu32 "-byte keys "
                "in mode %s is not supported", name, s->key_bytes, mode);
    return -ENOTSUP;
  }
  if ((why = luks_check_setup (s))) {
    luks_error (where, "LUKS header: %s-%s-%s: %s", name, mode, ivgen, why);
    return -ENOTSUP;
  }
  return 0;
}

/* Try the password on one key slot.  Returns 1 if it opens it (key is
 * then the master key), 0 if not, or -errno.
 */
static int
luks_header_try_slot (const struct luks_setup *s, const uint8_t *hdr,
                      const uint8_t *slot, const uint8_t *material,
                      const char *password, uint8_t *key)
{
  size_t len = (size_t) s->key_bytes * LUKS_STRIPES;
  uint8_t slot_key[LUKS_MAX_KEY], digest[LUKS_DIGEST_LEN];
  uint8_t *split = malloc (len);
  struct luks_key *k = NULL;
  int r;

  if (!split)
    return -ENOMEM;
  memcpy (split, material, len);
  r = luks_pbkdf2 (s->hash, (const uint8_t *) password, strlen (password),
                   slot + LS_SALT, be32_get (slot + LS_ITERS), slot_key,
                   s->key_bytes);
  if (r == 0 && !(k = luks_key_new (s, slot_key)))
    r = -ENOMEM;
  if (r == 0) {
    luks_decrypt (k, 0, split, len);
    r = luks_af (s->hash, split, s->key_bytes, key, LUKS_AF_MERGE);
  }
  if (r == 0)
    r = luks_pbkdf2 (s->hash, key, s->key_bytes, hdr + LH_MK_SALT,
                     be32_get (hdr + LH_MK_ITERS), digest, LUKS_DIGEST_LEN);
  if (r == 0)
    r = memcmp (digest, hdr + LH_MK_DIGEST, LUKS_DIGEST_LEN) == 0;
  luks_key_free (k);
  explicit_bzero (slot_key, sizeof slot_key);
  explicit_bzero (split, len);
  free (split);
  return r;
}

/* Returns why key slot i cannot be used, or NULL: a slot QEMU would refuse
 * (qcrypto_block_luks_check_header), or one PBKDF2 cannot run.
 */
static const char *
luks_header_check_slot (const struct luks_setup *s, const uint8_t *area,
                        uint64_t len, unsigned i, uint32_t max_iters,
                        char *why, size_t size)
{
  const uint8_t *slot = area + LH_SLOT (i);
  uint64_t at = (uint64_t) be32_get (slot + LS_KEY_OFFSET)
    * QCOW2_CRYPT_SECTOR;
  uint64_t bytes = (uint64_t) s->key_bytes * LUKS_STRIPES;
  uint32_t stripes = be32_get (slot + LS_STRIPES);

  if (stripes != LUKS_STRIPES)
    snprintf (why, size, "%" PRIu32 " stripes, not %d", stripes,
              LUKS_STRIPES);
  else if (be32_get (slot + LS_ITERS) == 0)
    snprintf (why, size, "0 PBKDF2 iterations");
  else if (max_iters && be32_get (slot + LS_ITERS) > max_iters)
    snprintf (why, size, "%" PRIu32 " PBKDF2 iterations, more than the %"
              PRIu32 " allowed", be32_get (slot + LS_ITERS), max_iters);
  else if (at < LUKS_KEY_SLOT_OFFSET)
    snprintf (why, size, "its key material (at %#" PRIx64 ") overlaps the "
              "LUKS header", at);
  else if (range_exceeds (at, bytes, len))
    snprintf (why, size, "its key material (%" PRIu64 " bytes at %#" PRIx64
              ") lies outside the encryption header (%" PRIu64 " bytes)",
              bytes, at, len);
  else
    return NULL;
  return why;
}

/* Try password on every active key slot.  Returns 1, with key, if one
 * opens, 0 if none, or -errno.
 */
static int
luks_header_find_key (const struct luks_setup *s, const uint8_t *area,
                      const char *password, uint8_t *key, unsigned *slot)
{
  for (unsigned i = 0; i < LUKS_SLOTS; i++) {
    const uint8_t *p = area + LH_SLOT (i);
    int r;

    if (be32_get (p + LS_ACTIVE) != LUKS_SLOT_ENABLED)
      continue;
    r = luks_header_try_slot (s, area, p,
                              area + (uint64_t) be32_get (p + LS_KEY_OFFSET)
                              * QCOW2_CRYPT_SECTOR, password, key);
    if (r != 0) {
      *slot = i;
      return r;
    }
  }
  return 0;
}

int
luks_open (const struct luks_area *where, const struct qcow2_password *pw,
           uint32_t max_iters, struct luks_key **keyp)
{
  uint64_t off = where->offset, len = where->length;
  uint8_t *area = NULL, key[LUKS_MAX_KEY];
  struct luks_setup s;
  unsigned active = 0, slot = 0;
  char why[160];
  int r;

  *keyp = NULL;
  if (len < LUKS_HEADER_SIZE || len > QCOW2_MAX_CRYPTO_HEADER) {
    luks_error (where, "the encryption header (%" PRIu64 " bytes at %#" PRIx64
                ") is too %s for a LUKS header", len, off,
                len < LUKS_HEADER_SIZE ? "small" : "large");
    return -EINVAL;
  }
  if (!(area = malloc (len)))
    return -ENOMEM;
  /* Past the end of the file it reads as zeros, as QEMU reads it. */
  if ((r = where->io->ops->pread (where->io, area, len, off)) < 0) {
    luks_error (where, "reading the encryption header at %#" PRIx64 ": %s",
                off, errstr (-r));
    goto out;
  }
  if (memcmp (area, LUKS_MAGIC, 6) != 0 ||
      be16_get (area + LH_VERSION) != 1) {
    luks_error (where, "the encryption header at %#" PRIx64 " is not a LUKS1 "
                "header (magic or version 1 missing)", off);
    r = -EINVAL;
    goto out;
  }
  if ((r = luks_header_parse_setup (where, area, &s)) < 0)
    goto out;
  if (!pw) {
    luks_error (where, "the image is encrypted (LUKS, %s-%s): give its "
                "password with %s=", s.cipher->alg, luks_modes[s.mode],
                luks_header_password_key (where->env));
    r = -EACCES;
    goto out;
  }
  if (be32_get (area + LH_MK_ITERS) == 0 ||
      (max_iters && be32_get (area + LH_MK_ITERS) > max_iters)) {
    luks_error (where, "LUKS header: the master key digest has %" PRIu32
                " PBKDF2 iterations%s", be32_get (area + LH_MK_ITERS),
                max_iters ? ", outside those allowed" : "");
    r = -EINVAL;
    goto out;
  }
  for (unsigned i = 0; i < LUKS_SLOTS; i++) {
    if (be32_get (area + LH_SLOT (i) + LS_ACTIVE) != LUKS_SLOT_ENABLED)
      continue;
    active++;
    if (luks_header_check_slot (&s, area, len, i, max_iters, why,
                                sizeof why)) {
      luks_error (where, "LUKS key slot %u is corrupt: %s", i, why);
      r = -EINVAL;
      goto out;
    }
  }
  r = luks_header_find_key (&s, area, pw->text, key, &slot);
  if (r == 0 && pw->whole_file)
    r = luks_header_find_key (&s, area, pw->whole_file, key, &slot);
  if (r < 0)
    goto out;
  if (r == 0) {
    luks_error (where, "wrong password: it opens none of the image's %u "
                "active LUKS key slots%s%s%s%s", active, pw->whole_file ?
                " (nor does the whole file it was read from, as QEMU reads "
                "a secret file)" : "", where->below ? "\na backing file's "
                "own password is given with " : "", where->below ?
                luks_header_backing_password_key (where->env) : "",
                where->below ? "=" : "");
    r = -EACCES;
    goto out;
  }
  luks_debug (where, "LUKS %s-%s-%s, %s: key slot %u opened", s.cipher->alg,
              luks_modes[s.mode], luks_ivgens[s.ivgen], s.hash->name, slot);
  r = (*keyp = luks_key_new (&s, key)) ? 0 : -ENOMEM;
 out:
  explicit_bzero (key, sizeof key);
  free (area);
  return r;
}

void
luks_close (struct luks_key *key)
{
  luks_key_free (key);
}

/* Creating. */

static int
luks_header_random (void *buf, size_t len)
{
  for (uint8_t *p = buf; len > 0;) {
    ssize_t n = getrandom (p, len, 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += n;
    len -= n;
  }
  return 0;
}

static uint64_t
luks_header_cpu_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * UINT64_C (1000000000) + ts.tv_nsec;
}

/* Counts into *iters the PBKDF2 iterations that take iter_ms of this
 * thread's CPU time, as QEMU measures them, at least LUKS_MIN_ITERS.
 * Returns 0, -errno, or -ERANGE (logged) if more than a key slot can
 * count (qemu-img refuses them too, where it would
 * otherwise run PBKDF2 for hours).
 */
static int
luks_header_count_iters (const struct qcow2_env *env,
                         const struct nettle_hash *h, const uint8_t *pw,
                         size_t pw_len, size_t out_len, uint64_t iter_ms,
                         uint32_t divisor, uint32_t *iters)
{
  uint8_t salt[LUKS_SALT_LEN] = { 0 }, out[LUKS_MAX_KEY];
  uint64_t n = 1 << 10, ns, per_ms, total;
  bool overflow;
  int r;

  for (;;) {
    uint64_t t0 = luks_header_cpu_ns ();
    if ((r = luks_pbkdf2 (h, pw, pw_len, salt, n, out, out_len)) < 0)
      return r;
    ns = luks_header_cpu_ns () - t0;
    if (ns >= 50000000 || n >= (UINT64_C (1) << 30))
      break;
    n *= 2;
  }
  explicit_bzero (out, sizeof out);
  per_ms = n * 1000000 / (ns ? ns : 1);
  overflow = mul_overflow_u64 (per_ms, iter_ms, &total);
  if (overflow || total / divisor > UINT32_MAX) {
    env_err (env, "encrypt-iter-time=%" PRIu64 " would take %s%" PRIu64
             " PBKDF2 iterations on this machine, more than a LUKS key "
             "slot counts (%" PRIu32 ")", iter_ms, overflow ? "over " : "",
             overflow ? UINT64_MAX : total / divisor, UINT32_MAX);
    return -ERANGE;
  }
  *iters = MAX (total / divisor, LUKS_MIN_ITERS);
  return 0;
}

/* Returns the bytes the LUKS header and its 8 key slots take. */
static uint64_t
luks_header_slot_sectors (const struct luks_setup *s)
{
  uint64_t sectors = div_round_up ((uint64_t) s->key_bytes * LUKS_STRIPES,
                                   QCOW2_CRYPT_SECTOR);
  uint64_t align = LUKS_KEY_SLOT_OFFSET / QCOW2_CRYPT_SECTOR;

  return div_round_up (sectors, align) * align;
}

int
luks_format_check (const struct qcow2_env *env,
                   const struct qcow2_luks_options *o, uint64_t *len)
{
  struct luks_setup s;
  int r;

  if ((r = luks_setup_from (env, o, &s)) < 0)
    return r;
  if (!o->password) {
    env_err (env, "encrypt-format=luks needs a password (%s=)",
             luks_header_password_key (env));
    return -EINVAL;
  }
  /* A time long enough to need more iterations than a key slot counts
   * is refused before anything is written: measured once here.
   */
  if (o->iter_time > LUKS_ITER_TIME_CHECK) {
    uint32_t iters;
    uint8_t key[LUKS_MAX_KEY] = { 0 };

    if ((r = luks_header_count_iters (env, s.hash, key, s.key_bytes,
                                      s.key_bytes, o->iter_time, 1,
                                      &iters)) < 0)
      return r;
  }
  *len = (LUKS_KEY_SLOT_OFFSET / QCOW2_CRYPT_SECTOR +
          LUKS_SLOTS * luks_header_slot_sectors (&s)) * QCOW2_CRYPT_SECTOR;
  return 0;
}

int
luks_format (const struct qcow2_env *env, const struct qcow2_luks_options *o,
             uint8_t *area, uint64_t len)
{
  const uint8_t *pw = (const uint8_t *) o->password;
  size_t pw_len = strlen (o->password);
  uint64_t iter_ms = o->iter_time ? o->iter_time : 2000;
  uint8_t key[LUKS_MAX_KEY], slot_key[LUKS_MAX_KEY], uuid[16];
  uint8_t *slot = area + LH_SLOT (0), *split;
  struct luks_setup s;
  struct luks_key *k = NULL;
  uint32_t iters;
  char mode[LUKS_NAME_LEN + 8];
  size_t split_len;
  int r;

  if ((r = luks_setup_from (env, o, &s)) < 0)
    return r;
  split_len = (size_t) s.key_bytes * LUKS_STRIPES;
  memset (area, 0, len);
  memcpy (area, LUKS_MAGIC, 6);
  be16_put (area + LH_VERSION, 1);
  strcpy ((char *) area + LH_CIPHER_NAME, s.cipher->name);
  if (s.ivhash)
    snprintf (mode, sizeof mode, "%s-%s:%s", luks_modes[s.mode],
              luks_ivgens[s.ivgen], s.ivhash->name);
  else
    snprintf (mode, sizeof mode, "%s-%s", luks_modes[s.mode],
              luks_ivgens[s.ivgen]);
  memcpy (area + LH_CIPHER_MODE, mode, MIN (strlen (mode), LUKS_NAME_LEN - 1));
  strcpy ((char *) area + LH_HASH_SPEC, s.hash->name);
  be32_put (area + LH_PAYLOAD_OFFSET, len / QCOW2_CRYPT_SECTOR);
  be32_put (area + LH_KEY_BYTES, s.key_bytes);
  if ((r = luks_header_random (uuid, sizeof uuid)) < 0)
    return r;
  uuid[6] = (uuid[6] & 0x0f) | 0x40;    /* version 4, random */
  uuid[8] = (uuid[8] & 0x3f) | 0x80;
  snprintf ((char *) area + LH_UUID, LUKS_UUID_LEN,
            "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
            "%02x%02x%02x%02x%02x%02x", uuid[0], uuid[1], uuid[2], uuid[3],
            uuid[4], uuid[5], uuid[6], uuid[7], uuid[8], uuid[9], uuid[10],
            uuid[11], uuid[12], uuid[13], uuid[14], uuid[15]);

  /* The master key and its digest. */
  if ((r = luks_header_random (key, s.key_bytes)) < 0 ||
      (r = luks_header_random (area + LH_MK_SALT, LUKS_SALT_LEN)) < 0 ||
      (r = luks_header_count_iters (env, s.hash, key, s.key_bytes,
                             LUKS_DIGEST_LEN, iter_ms, 8, &iters)) < 0)
    goto out;
  be32_put (area + LH_MK_ITERS, iters);
  if ((r = luks_pbkdf2 (s.hash, key, s.key_bytes, area + LH_MK_SALT, iters,
                        area + LH_MK_DIGEST, LUKS_DIGEST_LEN)) < 0)
    goto out;

  /* Slot 0 holds it; all 8 have their place. */
  for (unsigned i = 0; i < LUKS_SLOTS; i++) {
    be32_put (area + LH_SLOT (i) + LS_ACTIVE,
              i == 0 ? LUKS_SLOT_ENABLED : LUKS_SLOT_DISABLED);
    be32_put (area + LH_SLOT (i) + LS_KEY_OFFSET,
              LUKS_KEY_SLOT_OFFSET / QCOW2_CRYPT_SECTOR +
              i * luks_header_slot_sectors (&s));
    be32_put (area + LH_SLOT (i) + LS_STRIPES, LUKS_STRIPES);
  }
  if ((r = luks_header_random (slot + LS_SALT, LUKS_SALT_LEN)) < 0 ||
      (r = luks_header_count_iters (env, s.hash, pw, pw_len, s.key_bytes,
                                    iter_ms, 1, &iters)) < 0)
    goto out;
  be32_put (slot + LS_ITERS, iters);
  if ((r = luks_pbkdf2 (s.hash, pw, pw_len, slot + LS_SALT, iters, slot_key,
                        s.key_bytes)) < 0)
    goto out;
  if (!(k = luks_key_new (&s, slot_key))) {
    r = -ENOMEM;
    goto out;
  }
  split = area + LUKS_KEY_SLOT_OFFSET;
  if ((r = luks_header_random (split, split_len - s.key_bytes)) < 0 ||
      (r = luks_af (s.hash, split, s.key_bytes, key, LUKS_AF_SPLIT)) < 0)
    goto out;
  luks_encrypt (k, 0, split, split_len);
 out:
  if (r < 0 && r != -ERANGE)   /* luks_header_count_iters logged why */
    env_err (env, "making the LUKS header: %s", errstr (-r));
  luks_key_free (k);
  explicit_bzero (key, sizeof key);
  explicit_bzero (slot_key, sizeof slot_key);
  return r;
}
