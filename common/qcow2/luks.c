/* SPDX-License-Identifier: BSD-3-Clause */
/* LUKS1 encryption (crypt_method 2), as QEMU writes it: a LUKS header
 * with its key slots in the clusters the full disk encryption header
 * extension points at, and guest data encrypted in 512-byte sectors
 * numbered by their host offset.  A key slot holds the master key
 * split into 4000 stripes (the anti-forensic split) and encrypted with
 * a key PBKDF2 derives from the password; a PBKDF2 digest of the
 * master key tells which slot the password opens.
 *
 * Every cipher, hash and PBKDF2 is nettle's, as QEMU uses them.  The
 * contexts are read-only once keyed, so that threads share them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <nettle/cbc.h>
#include <nettle/ctr.h>
#include <nettle/hmac.h>
#include <nettle/nettle-meta.h>
#include <nettle/pbkdf2.h>
#include <nettle/xts.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

#define LUKS_MAGIC "LUKS\xba\xbe"
#define LUKS_HEADER_SIZE 592
#define LUKS_NAME_LEN 32
#define LUKS_DIGEST_LEN 20
#define LUKS_SALT_LEN 32
#define LUKS_UUID_LEN 40
#define LUKS_SLOTS 8
#define LUKS_STRIPES 4000
#define LUKS_SLOT_ENABLED 0x00AC71F3U
#define LUKS_SLOT_DISABLED 0x0000DEADU
#define LUKS_KEY_SLOT_OFFSET 4096
#define LUKS_MIN_ITERS 1000
/* encrypt-iter-time= above which create's checks measure PBKDF2 (no
 * machine counts 2^32 iterations in less).
 */
#define LUKS_ITER_TIME_CHECK 10000
#define LUKS_MAX_KEY 64

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

/* The block ciphers LUKS names, by name and key length. */
struct luks_cipher {
  const char *name;             /* in the header */
  const char *alg;              /* qemu-img's encrypt.cipher-alg */
  const struct nettle_cipher *nc;
};
static const struct luks_cipher luks_ciphers[] = {
  { "aes", "aes-128", &nettle_aes128 },
  { "aes", "aes-192", &nettle_aes192 },
  { "aes", "aes-256", &nettle_aes256 },
  { "cast5", "cast5-128", &nettle_cast128 },
  { "serpent", "serpent-128", &nettle_serpent128 },
  { "serpent", "serpent-192", &nettle_serpent192 },
  { "serpent", "serpent-256", &nettle_serpent256 },
  { "twofish", "twofish-128", &nettle_twofish128 },
  { "twofish", "twofish-192", &nettle_twofish192 },
  { "twofish", "twofish-256", &nettle_twofish256 },
};
#define N_CIPHERS (sizeof luks_ciphers / sizeof luks_ciphers[0])

static const struct nettle_hash *const luks_hashes[] = {
  &nettle_md5, &nettle_sha1, &nettle_sha224, &nettle_sha256,
  &nettle_sha384, &nettle_sha512, &nettle_ripemd160,
};
#define N_HASHES (sizeof luks_hashes / sizeof luks_hashes[0])

enum luks_mode { MODE_ECB, MODE_CBC, MODE_XTS, MODE_CTR };
static const char *const luks_modes[] = { "ecb", "cbc", "xts", "ctr" };
enum luks_ivgen { IV_PLAIN, IV_PLAIN64, IV_ESSIV };
static const char *const luks_ivgens[] = { "plain", "plain64", "essiv" };

/* A cipher setup: what the header's strings say. */
struct luks_setup {
  const struct luks_cipher *cipher;
  enum luks_mode mode;
  enum luks_ivgen ivgen;
  const struct nettle_hash *ivhash;     /* ESSIV's, or NULL */
  const struct luks_cipher *essiv;      /* ESSIV's cipher */
  const struct nettle_hash *hash;       /* PBKDF2's and the split's */
  uint32_t key_bytes;                   /* twice the cipher's for XTS */
};

/* A keyed setup: the master key's (data) or a key slot's. */
struct luks_key {
  struct luks_setup s;
  void *enc, *dec, *twk, *essiv;        /* nettle contexts, in mem */
  uint8_t *mem;
  size_t mem_len;
};

static const struct luks_cipher *
luks_find_cipher (const char *name, size_t key_len)
{
  for (size_t i = 0; i < N_CIPHERS; i++)
    if (strcmp (luks_ciphers[i].name, name) == 0 &&
        luks_ciphers[i].nc->key_size == key_len)
      return &luks_ciphers[i];
  return NULL;
}

static const struct nettle_hash *
luks_find_hash (const char *name)
{
  for (size_t i = 0; i < N_HASHES; i++)
    if (strcmp (luks_hashes[i]->name, name) == 0)
      return luks_hashes[i];
  return NULL;
}

static int
luks_find_name (const char *const *names, size_t n, const char *name)
{
  for (size_t i = 0; i < n; i++)
    if (strcmp (names[i], name) == 0)
      return i;
  return -1;
}

/* dm-crypt keys ESSIV's cipher with the whole digest: AES-128 with
 * sha256 uses AES-256 for the IVs.
 */
static const struct luks_cipher *
luks_essiv_cipher (const struct luks_cipher *c, const struct nettle_hash *h)
{
  return luks_find_cipher (c->name, h->digest_size);
}

/* Check a setup: which combinations exist; 0 or an error message. */
static const char *
luks_check_setup (struct luks_setup *s)
{
  if (s->mode == MODE_XTS && s->cipher->nc->block_size != 16)
    return "XTS needs a cipher with 16-byte blocks";
  if (s->ivgen == IV_ESSIV) {
    if (!s->ivhash)
      return "the ESSIV IV generator needs a hash";
    if (!(s->essiv = luks_essiv_cipher (s->cipher, s->ivhash)))
      return "no cipher of this family takes the ESSIV hash's digest as key";
  }
  return NULL;
}

static const char *
luks_password_key (const struct qcow2_env *env)
{
  return env->password_key ? env->password_key : "password";
}

static const char *
luks_backing_password_key (const struct qcow2_env *env)
{
  return env->backing_password_key ? env->backing_password_key
                                   : "backing-password";
}

/* The parts of a setup looked up by name: what each is, the create
 * option that names it, and the names supported.
 */
struct luks_part {
  const char *what, *option, *known;
};
#define LUKS_HASHES "md5, sha1, sha224, sha256, sha384, sha512, ripemd160"
enum { PART_MODE, PART_IVGEN, PART_IVHASH, PART_HASH };
static const struct luks_part luks_parts[] = {
  [PART_MODE] = { "the cipher mode", "encrypt-cipher-mode",
                  "ecb, cbc, xts, ctr" },
  [PART_IVGEN] = { "the IV generator", "encrypt-ivgen-alg",
                   "plain, plain64, essiv" },
  [PART_IVHASH] = { "the IV hash", "encrypt-ivgen-hash-alg", LUKS_HASHES },
  [PART_HASH] = { "the hash", "encrypt-hash-alg", LUKS_HASHES },
};

/* The mode, the IV generator (with its hash, for ESSIV) and the hash
 * of a setup, by name: -1, or the part (PART_*) not supported.
 */
static int
luks_lookup (struct luks_setup *s, const char *mode, const char *ivgen,
             const char *ivhash, const char *hash)
{
  int m = luks_find_name (luks_modes, 4, mode);
  int g = luks_find_name (luks_ivgens, 3, ivgen);

  if (m < 0)
    return PART_MODE;
  if (g < 0)
    return PART_IVGEN;
  s->mode = m;
  s->ivgen = g;
  /* A hash with plain or plain64 is ignored, as by dm-crypt. */
  if (ivhash && g == IV_ESSIV && !(s->ivhash = luks_find_hash (ivhash)))
    return PART_IVHASH;
  if (!(s->hash = luks_find_hash (hash)))
    return PART_HASH;
  return -1;
}

static void
luks_key_free (struct luks_key *k)
{
  if (!k)
    return;
  if (k->mem) {
    explicit_bzero (k->mem, k->mem_len);
    free (k->mem);
  }
  explicit_bzero (k, sizeof *k);
  free (k);
}

/* Key a setup with key (s->key_bytes bytes). */
static struct luks_key *
luks_key_new (const struct luks_setup *s, const uint8_t *key)
{
  const struct nettle_cipher *nc = s->cipher->nc;
  size_t cs = (nc->context_size + 15) & ~(size_t) 15;
  size_t es = s->essiv ? s->essiv->nc->context_size : 0;
  struct luks_key *k = calloc (1, sizeof *k);

  if (!k)
    return NULL;
  k->s = *s;
  k->mem_len = 3 * cs + es;
  if (!(k->mem = calloc (1, k->mem_len))) {
    free (k);
    return NULL;
  }
  k->enc = k->mem;
  k->dec = k->mem + cs;
  k->twk = k->mem + 2 * cs;
  nc->set_encrypt_key (k->enc, key);
  nc->set_decrypt_key (k->dec, key);
  if (s->mode == MODE_XTS)
    nc->set_encrypt_key (k->twk, key + nc->key_size);
  if (s->essiv) {
    uint8_t digest[LUKS_MAX_KEY];
    void *hctx = malloc (s->ivhash->context_size);

    if (!hctx) {
      luks_key_free (k);
      return NULL;
    }
    s->ivhash->init (hctx);
    s->ivhash->update (hctx, s->key_bytes, key);
    s->ivhash->digest (hctx, s->ivhash->digest_size, digest);
    explicit_bzero (hctx, s->ivhash->context_size);
    free (hctx);
    k->essiv = k->mem + 3 * cs;
    s->essiv->nc->set_encrypt_key (k->essiv, digest);
    explicit_bzero (digest, sizeof digest);
  }
  return k;
}

/* The IV of a sector, as QEMU's IV generators make it. */
static void
luks_iv (const struct luks_key *k, uint64_t sector, uint8_t *iv)
{
  unsigned niv = k->s.cipher->nc->block_size;
  uint8_t le[16] = { 0 };

  for (int i = 0; i < 8; i++)
    le[i] = sector >> (8 * i);
  switch (k->s.ivgen) {
  case IV_PLAIN:
    memset (le + 4, 0, 4);
    memcpy (iv, le, niv);
    break;
  case IV_PLAIN64:
    memcpy (iv, le, niv);
    break;
  case IV_ESSIV: {
    unsigned nb = k->s.essiv->nc->block_size;
    k->s.essiv->nc->encrypt (k->essiv, nb, le, le);
    memcpy (iv, le, niv);
    break;
  }
  }
}

/* Encrypt or decrypt len bytes in place, from sector on: whole
 * sectors, but for a last part sector of whole cipher blocks (key
 * material).
 */
static void
luks_crypt (const struct luks_key *k, bool encrypt, uint64_t sector,
            uint8_t *buf, size_t len)
{
  const struct nettle_cipher *nc = k->s.cipher->nc;
  unsigned bs = nc->block_size;

  for (; len > 0; sector++) {
    size_t n = MIN (len, QCOW2_CRYPT_SECTOR);
    uint8_t iv[16];

    luks_iv (k, sector, iv);
    switch (k->s.mode) {
    case MODE_ECB:
      if (encrypt)
        nc->encrypt (k->enc, n, buf, buf);
      else
        nc->decrypt (k->dec, n, buf, buf);
      break;
    case MODE_CBC:
      if (encrypt)
        cbc_encrypt (k->enc, nc->encrypt, bs, iv, n, buf, buf);
      else
        cbc_decrypt (k->dec, nc->decrypt, bs, iv, n, buf, buf);
      break;
    case MODE_XTS:
      if (encrypt)
        xts_encrypt_message (k->enc, k->twk, nc->encrypt, iv, n, buf, buf);
      else
        xts_decrypt_message (k->dec, k->twk, nc->decrypt, nc->encrypt, iv,
                             n, buf, buf);
      break;
    case MODE_CTR:
      ctr_crypt (k->enc, nc->encrypt, bs, iv, n, buf, buf);
      break;
    }
    buf += n;
    len -= n;
  }
}

void
luks_encrypt (const struct luks_key *k, uint64_t sector, uint8_t *buf,
              size_t len)
{
  luks_crypt (k, true, sector, buf, len);
}

void
luks_decrypt (const struct luks_key *k, uint64_t sector, uint8_t *buf,
              size_t len)
{
  luks_crypt (k, false, sector, buf, len);
}

/* PBKDF2 with HMAC over any of the hashes. */
struct luks_mac {
  const struct nettle_hash *h;
  uint8_t *outer, *inner, *state;
};

static void
luks_mac_update (void *ctx, size_t len, const uint8_t *data)
{
  struct luks_mac *m = ctx;
  hmac_update (m->state, m->h, len, data);
}

static void
luks_mac_digest (void *ctx, size_t len, uint8_t *digest)
{
  struct luks_mac *m = ctx;
  hmac_digest (m->outer, m->inner, m->state, m->h, len, digest);
}

static int
luks_pbkdf2 (const struct nettle_hash *h, const uint8_t *pw, size_t pw_len,
             const uint8_t *salt, uint32_t iters, uint8_t *out, size_t len)
{
  size_t cs = h->context_size;
  uint8_t *mem = malloc (3 * cs);
  struct luks_mac m = { h, mem, mem + cs, mem + 2 * cs };

  if (!mem)
    return -ENOMEM;
  hmac_set_key (m.outer, m.inner, m.state, h, pw_len, pw);
  pbkdf2 (&m, luks_mac_update, luks_mac_digest, h->digest_size, iters,
          LUKS_SALT_LEN, salt, len, out);
  explicit_bzero (mem, 3 * cs);
  free (mem);
  return 0;
}

/* The anti-forensic split's diffusion: each digest-sized piece of
 * block replaced by the hash of its index and itself.
 */
static int
luks_diffuse (const struct nettle_hash *h, uint8_t *block, size_t len)
{
  uint8_t digest[LUKS_MAX_KEY];
  void *ctx = malloc (h->context_size);

  if (!ctx)
    return -ENOMEM;
  for (uint32_t i = 0; (size_t) i * h->digest_size < len; i++) {
    size_t at = (size_t) i * h->digest_size;
    size_t n = MIN (h->digest_size, len - at);
    uint8_t be[4];

    be32_put (be, i);
    h->init (ctx);
    h->update (ctx, 4, be);
    h->update (ctx, n, block + at);
    h->digest (ctx, h->digest_size, digest);
    memcpy (block + at, digest, n);
  }
  explicit_bzero (digest, sizeof digest);
  free (ctx);
  return 0;
}

/* What luks_af does with the stripes. */
enum luks_af_how {
  LUKS_AF_MERGE,        /* merge the split key material into key */
  LUKS_AF_SPLIT,        /* make the last stripe so that they merge into key */
};

/* The anti-forensic split of key (len bytes) into LUKS_STRIPES
 * stripes, either way.
 */
static int
luks_af (const struct nettle_hash *h, uint8_t *stripes, size_t len,
         uint8_t *key, enum luks_af_how how)
{
  uint8_t block[LUKS_MAX_KEY] = { 0 };
  uint8_t *last = stripes + (LUKS_STRIPES - 1) * len;
  int r = 0;

  for (unsigned i = 0; i < LUKS_STRIPES - 1 && r == 0; i++) {
    for (size_t j = 0; j < len; j++)
      block[j] ^= stripes[i * len + j];
    r = luks_diffuse (h, block, len);
  }
  for (size_t j = 0; r == 0 && j < len; j++) {
    if (how == LUKS_AF_SPLIT)
      last[j] = key[j] ^ block[j];
    else
      key[j] = last[j] ^ block[j];
  }
  explicit_bzero (block, sizeof block);
  return r;
}

/* A NUL-terminated copy of a header string field. */
static void
luks_field (char *dst, const uint8_t *hdr, unsigned at)
{
  memcpy (dst, hdr + at, LUKS_NAME_LEN);
  dst[LUKS_NAME_LEN] = '\0';
}

/* The setup the header names; an error for what we cannot use. */
static int
luks_parse_setup (const struct luks_area *where, const uint8_t *hdr,
                  struct luks_setup *s)
{
  char name[LUKS_NAME_LEN + 1], mode[LUKS_NAME_LEN + 1];
  char hash[LUKS_NAME_LEN + 1], *ivgen, *ivhash;
  const char *why;
  int part;

  luks_field (name, hdr, LH_CIPHER_NAME);
  luks_field (mode, hdr, LH_CIPHER_MODE);
  luks_field (hash, hdr, LH_HASH_SPEC);
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

/* Try the password on one key slot: 1 if it opens it (key is then the
 * master key), 0 if not, or -errno.
 */
static int
luks_try_slot (const struct luks_setup *s, const uint8_t *hdr,
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

/* Why key slot i cannot be used, or NULL: a slot QEMU would refuse
 * (qcrypto_block_luks_check_header), or one PBKDF2 cannot run.
 */
static const char *
luks_check_slot (const struct luks_setup *s, const uint8_t *area,
                 uint64_t len, unsigned i, uint32_t max_iters, char *why,
                 size_t size)
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

/* Try password on every active key slot: 1 and key if one opens, 0
 * if none, or -errno.
 */
static int
luks_find_key (const struct luks_setup *s, const uint8_t *area,
               const char *password, uint8_t *key, unsigned *slot)
{
  for (unsigned i = 0; i < LUKS_SLOTS; i++) {
    const uint8_t *p = area + LH_SLOT (i);
    int r;

    if (be32_get (p + LS_ACTIVE) != LUKS_SLOT_ENABLED)
      continue;
    r = luks_try_slot (s, area, p, area + (uint64_t) be32_get (
                         p + LS_KEY_OFFSET) * QCOW2_CRYPT_SECTOR,
                       password, key);
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
  if ((r = luks_parse_setup (where, area, &s)) < 0)
    goto out;
  if (!pw) {
    luks_error (where, "the image is encrypted (LUKS, %s-%s): give its "
                "password with %s=", s.cipher->alg, luks_modes[s.mode],
                luks_password_key (where->env));
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
    if (luks_check_slot (&s, area, len, i, max_iters, why, sizeof why)) {
      luks_error (where, "LUKS key slot %u is corrupt: %s", i, why);
      r = -EINVAL;
      goto out;
    }
  }
  r = luks_find_key (&s, area, pw->text, key, &slot);
  if (r == 0 && pw->whole_file)
    r = luks_find_key (&s, area, pw->whole_file, key, &slot);
  if (r < 0)
    goto out;
  if (r == 0) {
    luks_error (where, "wrong password: it opens none of the image's %u "
                "active LUKS key slots%s%s%s%s", active, pw->whole_file ?
                " (nor does the whole file it was read from, as QEMU reads "
                "a secret file)" : "", where->below ? "\na backing file's "
                "own password is given with " : "", where->below ?
                luks_backing_password_key (where->env) : "",
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
luks_random (void *buf, size_t len)
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
luks_cpu_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * UINT64_C (1000000000) + ts.tv_nsec;
}

/* PBKDF2 iterations that take iter_ms of this thread's CPU time, as
 * QEMU measures them, at least LUKS_MIN_ITERS; -ERANGE, said, if more
 * than a key slot can count (qemu-img refuses them too, where it would
 * otherwise run PBKDF2 for hours).
 */
static int
luks_count_iters (const struct qcow2_env *env, const struct nettle_hash *h,
                  const uint8_t *pw, size_t pw_len, size_t out_len,
                  uint64_t iter_ms, uint32_t divisor, uint32_t *iters)
{
  uint8_t salt[LUKS_SALT_LEN] = { 0 }, out[LUKS_MAX_KEY];
  uint64_t n = 1 << 10, ns, per_ms, total;
  bool overflow;
  int r;

  for (;;) {
    uint64_t t0 = luks_cpu_ns ();
    if ((r = luks_pbkdf2 (h, pw, pw_len, salt, n, out, out_len)) < 0)
      return r;
    ns = luks_cpu_ns () - t0;
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

/* The setup the create options name, with QEMU's defaults. */
static int
luks_setup_from (const struct qcow2_env *env,
                 const struct qcow2_luks_options *o, struct luks_setup *s)
{
  const char *alg = o->cipher_alg ? o->cipher_alg : "aes-256";
  const char *mode = o->cipher_mode ? o->cipher_mode : "xts";
  const char *ivgen = o->ivgen_alg ? o->ivgen_alg : "plain64";
  const char *hash = o->hash_alg ? o->hash_alg : "sha256";
  const char *ivhash = o->ivgen_hash_alg ? o->ivgen_hash_alg : "sha256";
  const char *value[] = {
    [PART_MODE] = mode, [PART_IVGEN] = ivgen, [PART_IVHASH] = ivhash,
    [PART_HASH] = hash,
  };
  const char *why;
  int part;

  memset (s, 0, sizeof *s);
  for (size_t j = 0; j < N_CIPHERS; j++)
    if (strcmp (luks_ciphers[j].alg, alg) == 0)
      s->cipher = &luks_ciphers[j];
  if (!s->cipher) {
    env_err (env, "encrypt-cipher-alg=%s is not supported\n"
             "supported: aes-128, aes-192, aes-256, cast5-128, "
             "serpent-128/192/256, twofish-128/192/256", alg);
    return -ENOTSUP;
  }
  if ((part = luks_lookup (s, mode, ivgen, ivhash, hash)) < 0 &&
      o->ivgen_hash_alg && !s->ivhash &&
      !(s->ivhash = luks_find_hash (o->ivgen_hash_alg)))
    part = PART_IVHASH;   /* recorded with any IV generator, as qemu-img */
  if (part >= 0) {
    env_err (env, "%s=%s is not supported (%s are)", luks_parts[part].option,
             value[part], luks_parts[part].known);
    return -ENOTSUP;
  }
  s->key_bytes = s->cipher->nc->key_size * (s->mode == MODE_XTS ? 2 : 1);
  /* QEMU (7.2) fails an assertion on key material of part sectors. */
  if ((uint64_t) s->key_bytes * LUKS_STRIPES % QCOW2_CRYPT_SECTOR) {
    env_err (env, "encryption %s-%s: QEMU cannot open an image whose key "
             "material is not whole sectors (%" PRIu32 "-byte keys)\n"
             "use xts, or a 128- or 256-bit cipher", alg, mode,
             s->key_bytes);
    return -ENOTSUP;
  }
  if ((why = luks_check_setup (s))) {
    env_err (env, "encryption %s-%s-%s: %s", alg, mode, ivgen, why);
    return -ENOTSUP;
  }
  return 0;
}

/* The bytes the LUKS header and its 8 key slots take. */
static uint64_t
luks_slot_sectors (const struct luks_setup *s)
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
             luks_password_key (env));
    return -EINVAL;
  }
  /* A time long enough to need more iterations than a key slot counts
   * is refused before anything is written: measured once here.
   */
  if (o->iter_time > LUKS_ITER_TIME_CHECK) {
    uint32_t iters;
    uint8_t key[LUKS_MAX_KEY] = { 0 };

    if ((r = luks_count_iters (env, s.hash, key, s.key_bytes, s.key_bytes,
                               o->iter_time, 1, &iters)) < 0)
      return r;
  }
  *len = (LUKS_KEY_SLOT_OFFSET / QCOW2_CRYPT_SECTOR +
          LUKS_SLOTS * luks_slot_sectors (&s)) * QCOW2_CRYPT_SECTOR;
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
  if ((r = luks_random (uuid, sizeof uuid)) < 0)
    return r;
  uuid[6] = (uuid[6] & 0x0f) | 0x40;    /* version 4, random */
  uuid[8] = (uuid[8] & 0x3f) | 0x80;
  snprintf ((char *) area + LH_UUID, LUKS_UUID_LEN,
            "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
            "%02x%02x%02x%02x%02x%02x", uuid[0], uuid[1], uuid[2], uuid[3],
            uuid[4], uuid[5], uuid[6], uuid[7], uuid[8], uuid[9], uuid[10],
            uuid[11], uuid[12], uuid[13], uuid[14], uuid[15]);

  /* The master key and its digest. */
  if ((r = luks_random (key, s.key_bytes)) < 0 ||
      (r = luks_random (area + LH_MK_SALT, LUKS_SALT_LEN)) < 0 ||
      (r = luks_count_iters (env, s.hash, key, s.key_bytes,
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
              i * luks_slot_sectors (&s));
    be32_put (area + LH_SLOT (i) + LS_STRIPES, LUKS_STRIPES);
  }
  if ((r = luks_random (slot + LS_SALT, LUKS_SALT_LEN)) < 0 ||
      (r = luks_count_iters (env, s.hash, pw, pw_len, s.key_bytes, iter_ms,
                             1, &iters)) < 0)
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
  if ((r = luks_random (split, split_len - s.key_bytes)) < 0 ||
      (r = luks_af (s.hash, split, s.key_bytes, key, LUKS_AF_SPLIT)) < 0)
    goto out;
  luks_encrypt (k, 0, split, split_len);
 out:
  if (r < 0 && r != -ERANGE)           /* luks_count_iters said why */
    env_err (env, "making the LUKS header: %s", errstr (-r));
  luks_key_free (k);
  explicit_bzero (key, sizeof key);
  explicit_bzero (slot_key, sizeof slot_key);
  return r;
}
