/* SPDX-License-Identifier: BSD-3-Clause */
/* What every image a crash or a failing disk leaves must pass, shared
 * by the crash simulator and the fault injection test: it opens and
 * reads back what the model allows, our check and (on a sample)
 * qemu-img check find no corruption, and a read-write open repairs it
 * without changing data, after which it takes more writes and is clean
 * after a clean close.
 */
#ifndef QCOW2_CRASHCHECK_H
#define QCOW2_CRASHCHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workload.h"

/* Under AddressSanitizer each image costs four times as much (large
 * buffers are mapped anew): the tests do less by default there, since
 * the point is memory errors rather than more crash orderings.
 */
#if defined (__SANITIZE_ADDRESS__)
#define CRASHCHECK_SANITIZED 1
#elif defined (__has_feature)
#if __has_feature (address_sanitizer)
#define CRASHCHECK_SANITIZED 1
#endif
#endif

struct failure {
  char cls[32];                 /* what failed: open, data, check, ... */
  char why[1024];
};

extern void crashcheck_fail (struct failure *f, const char *cls,
                             const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));

/* Totals, for the summaries. */
struct crashcheck_stats {
  uint64_t images, points, dirty, leaky, qemu, qemu_after, workloads;
  uint64_t qemu_repairs;        /* dirty images qemu-img repaired */
  /* Images killed after a flush; the most leaked against its bound. */
  uint64_t kill_checks, kill_leaks_max, kill_leaks_limit;
};
extern struct crashcheck_stats crashcheck_stats;

extern unsigned crashcheck_qemu_every;  /* qemu-img on every Nth image */
extern bool crashcheck_trace;           /* print requests as they run */

/* Whether an image is left dirty by lazy refcounts. */
extern bool crashcheck_dirty (const uint8_t *buf, size_t len);

/* The image a process killed right after a flush leaves (files: all
 * it wrote) leaks at most the engine's bound.
 */
extern bool crashcheck_kill_leaks (const struct wl_setup *setup,
                                   struct wl_files files, struct failure *f);

/* Look for qemu-img (the test exits 77, skipped, without it), and make
 * a directory for its images (removed at exit).
 */
extern void crashcheck_init (void);

/* Put the configuration's backing file beside the images qemu-img
 * checks.
 */
extern void crashcheck_write_backing (const struct wl_setup *s);

/* qemu-img check of an image (and its data file): its exit status,
 * its output in out.
 */
extern int crashcheck_qemu (struct wl_files files, char *out,
                            size_t outlen);

/* Verify the files that a crash left, with m saying what the guest may
 * read; seed chooses the writes after the repair.
 */
extern bool crashcheck_verify (const struct wl_setup *setup,
                               const struct wl_model *m,
                               struct wl_files files, uint64_t seed,
                               struct failure *f);

/* With data_file_raw, whether the data file of files holds the guest
 * (which img, opened on files, reads as guest): everywhere, or if the
 * image crashed, where img maps data.
 */
extern bool crashcheck_raw_data_file (const struct wl_setup *setup,
                                      struct qcow2_image *img,
                                      struct wl_files files,
                                      const uint8_t *guest, bool crashed,
                                      struct failure *f);

extern uint64_t crashcheck_first_difference (const uint8_t *a,
                                             const uint8_t *b, uint64_t len);
extern void crashcheck_write_file (const char *path, const void *data,
                                   size_t len);

#endif /* QCOW2_CRASHCHECK_H */
