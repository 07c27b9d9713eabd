/* SPDX-License-Identifier: BSD-3-Clause */
/* The world the qcow2 fuzz target opens its images in (fuzz-env.c):
 * storage of bounded size, an environment over a memenv that opens
 * every file through it, the files every input sees beside its image,
 * and the LUKS templates that "\0TPL" inputs patch (their format is in
 * fuzz-qcow2.c).
 */
#ifndef FUZZ_ENV_H
#define FUZZ_ENV_H

#include <stddef.h>
#include <stdint.h>

#include "memio.h"
#include "qcow2.h"

/* Every image is opened with this password. */
extern const struct qcow2_password fuzz_env_password;

/* The memenv's files, each opened through storage of bounded size. */
struct fuzz_env {
  struct qcow2_env env;
  const struct qcow2_env *mem;
};

extern void fuzz_env_init (struct fuzz_env *fe, struct memenv *me);

/* Wrap inner in storage of bounded size (taking its reference). */
extern struct qcow2_io *fuzz_env_capio (struct qcow2_io *inner);

/* Make the base files and the LUKS templates, once. */
extern void fuzz_env_setup (void);

/* Add a copy of data as file name of me. */
extern void fuzz_env_add_file (struct memenv *me, const char *name,
                               const void *data, size_t len);

/* Add the files every input sees: dir/base.raw, dir/base.qcow2,
 * dir/data.raw.
 */
extern void fuzz_env_add_base_files (struct memenv *me);

/* The image of a "\0TPL" input (data, size: after the four bytes), in
 * a new buffer (*len bytes).
 */
extern uint8_t *fuzz_env_template_image (const uint8_t *data, size_t size,
                                         size_t *len);

/* Fill p with a pattern of seed, no byte of it zero. */
extern void fuzz_env_fill_pattern (uint8_t *p, size_t n, uint64_t seed);

#endif /* FUZZ_ENV_H */
