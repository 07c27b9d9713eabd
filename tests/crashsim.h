/* SPDX-License-Identifier: BSD-3-Clause */
/* The crash simulator's runs (crashsim.c): a workload on a fresh image
 * over a crashio, with the images a crash could leave built and
 * verified (crashcheck.h) at host operations chosen by the mode.
 * test-crash-sim.c drives them, shrinks failures and says what every
 * crash image must pass.
 */
#ifndef QCOW2_CRASHSIM_H
#define QCOW2_CRASHSIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "crashcheck.h"

enum crashsim_mode {
  CRASHSIM_COUNT,               /* only count the host operations */
  CRASHSIM_SAMPLE,              /* crash images at random points */
  CRASHSIM_AT,                  /* one image: crash_at and keep */
  CRASHSIM_SEARCH,              /* a few images at every point */
  CRASHSIM_REGRESS,             /* many images at every point */
};

struct crashsim {
  const struct wl_setup *setup;
  struct wl_run run;
  enum crashsim_mode mode;
  struct wl_rng rng;
  double p;                     /* CRASHSIM_SAMPLE: chance of a crash point */
  unsigned per_point;           /* CRASHSIM_SAMPLE: images per crash point */
  uint64_t images_left;         /* CRASHSIM_SAMPLE: images still wanted */
  uint64_t calls;               /* host writes, punches, flushes so far */
  const char *want;             /* CRASHSIM_SEARCH: failure class wanted */
  uint64_t crash_at;            /* CRASHSIM_AT */
  const uint8_t *keep;
  size_t nkeep;
  const char *save_image;       /* CRASHSIM_AT: write the image here */
  bool failed;
  uint64_t fail_at;
  uint8_t *fail_keep;
  size_t fail_npieces;
  struct failure f;
};

/* Run ops on a fresh image of cfg; true if a failure was found (in s). */
extern bool crashsim_run (struct crashsim *s, const struct wl_config *cfg,
                          uint64_t seed, const struct wl_op *ops,
                          size_t nops, size_t *failed_op);

#endif /* QCOW2_CRASHSIM_H */
