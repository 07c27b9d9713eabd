/* SPDX-License-Identifier: BSD-3-Clause */
/* LUKS1 encryption (crypt_method 2), as QEMU writes it: the ciphers,
 * their IVs and the key derivation (the header and its key slots are
 * luks-header.c's).  Guest data is encrypted in 512-byte sectors
 * numbered by their host offset.  A key slot holds the master key split
 * into 4000 stripes (the anti-forensic split) and encrypted with a key
 * PBKDF2 derives from the password.
 *
 * Every cipher, hash and PBKDF2 is nettle's, as QEMU uses them.  The
 * contexts are read-only once keyed, so that threads share them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <nettle/cbc.h>
#include <nettle/ctr.h>
#include <nettle/hmac.h>
#include <nettle/nettle-meta.h>
#include <nettle/pbkdf2.h>
#include <nettle/xts.h>

#include "be.h"
#include "internal.h"
#include "luks.h"

/* The ciphers, hashes, modes and IV generators LUKS names that we take
 * (all nettle has of them).
 */
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

const char *const luks_modes[] = { "ecb", "cbc", "xts", "ctr" };
const char *const luks_ivgens[] = { "plain", "plain64", "essiv" };

/* A keyed setup: the master key's (data) or a key slot's. */
struct luks_key {
  struct luks_setup s;
  void *enc, *dec, *twk, *essiv;        /* nettle contexts, in mem */
  uint8_t *mem;
  size_t mem_len;
};

const struct luks_cipher *
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

/* Check a setup: which combinations exist.  Returns NULL, or an error
 * message.
 */
const char *
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

/* What is logged of a part not supported (luks_lookup). */
#define LUKS_HASHES "md5, sha1, sha224, sha256, sha384, sha512, ripemd160"
const struct luks_part luks_parts[] = {
  [PART_MODE] = { "the cipher mode", "encrypt-cipher-mode",
                  "ecb, cbc, xts, ctr" },
  [PART_IVGEN] = { "the IV generator", "encrypt-ivgen-alg",
                   "plain, plain64, essiv" },
  [PART_IVHASH] = { "the IV hash", "encrypt-ivgen-hash-alg", LUKS_HASHES },
  [PART_HASH] = { "the hash", "encrypt-hash-alg", LUKS_HASHES },
};

/* Looks up the mode, the IV generator (with its hash, for ESSIV) and
 * the hash of a setup by name.  Returns -1, or the part (PART_*) not
 * supported.
 */
int
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

void
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
struct luks_key *
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

int
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

/* The anti-forensic split of key (len bytes) into LUKS_STRIPES
 * stripes, either way.
 */
int
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

/* The setup the create options name, with QEMU's defaults. */
int
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
