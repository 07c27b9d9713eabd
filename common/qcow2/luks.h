/* SPDX-License-Identifier: BSD-3-Clause */
/* What luks.c (the ciphers and key derivation) and luks-header.c (the
 * header and its key slots) share of LUKS1: the format's numbers and a
 * cipher setup.  Included by those two files only (it needs nettle's
 * types); the engine's interface to LUKS is in internal.h.
 */
#ifndef QCOW2_LUKS_H
#define QCOW2_LUKS_H

#include <stdint.h>

#include <nettle/nettle-meta.h>

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
#define LUKS_MAX_KEY 64

/* The block ciphers LUKS names, by name and key length. */
struct luks_cipher {
  const char *name;             /* in the header */
  const char *alg;              /* qemu-img's encrypt.cipher-alg */
  const struct nettle_cipher *nc;
};
enum luks_mode { MODE_ECB, MODE_CBC, MODE_XTS, MODE_CTR };
enum luks_ivgen { IV_PLAIN, IV_PLAIN64, IV_ESSIV };
extern const char *const luks_modes[4], *const luks_ivgens[3];

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

/* The parts of a setup looked up by name: what each is, the create
 * option that names it, and the names supported.
 */
struct luks_part {
  const char *what, *option, *known;
};
enum { PART_MODE, PART_IVGEN, PART_IVHASH, PART_HASH };
extern const struct luks_part luks_parts[4];

/* What luks_af does with the stripes. */
enum luks_af_how {
  LUKS_AF_MERGE,        /* merge the split key material into key */
  LUKS_AF_SPLIT,        /* make the last stripe so that they merge into key */
};

/* luks.c: what luks-header.c uses of it (described where it is
 * defined).
 */
extern const struct luks_cipher *luks_find_cipher (const char *name,
                                                   size_t key_len);
extern int luks_lookup (struct luks_setup *s, const char *mode,
                        const char *ivgen, const char *ivhash,
                        const char *hash);
extern const char *luks_check_setup (struct luks_setup *s);
extern int luks_setup_from (const struct qcow2_env *env,
                            const struct qcow2_luks_options *o,
                            struct luks_setup *s);
extern struct luks_key *luks_key_new (const struct luks_setup *s,
                                      const uint8_t *key);
extern void luks_key_free (struct luks_key *k);
extern int luks_pbkdf2 (const struct nettle_hash *h, const uint8_t *pw,
                        size_t pw_len, const uint8_t *salt, uint32_t iters,
                        uint8_t *out, size_t len);
extern int luks_af (const struct nettle_hash *h, uint8_t *stripes,
                    size_t len, uint8_t *key, enum luks_af_how how);

#endif /* QCOW2_LUKS_H */
