/* SPDX-License-Identifier: BSD-3-Clause */
/* The crash simulator's runs (see crashsim.h): where each mode
 * crashes, the crash images built there and verified, and the
 * workload run on a fresh image.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errstr.h"
#include "crashsim.h"

/* Reused from one image to the next. */
static struct wl_buf buf_image, buf_dimage, buf_read;

/* Which pieces written since the last flush a crash keeps. */
static void
crashsim_pick_keep (struct wl_rng *r, struct crashio *c, uint8_t *keep)
{
  size_t n = crashio_nr_pieces (c), ne = crashio_nr_entries (c);
  size_t first, np, k, skip;
  unsigned pct;

  memset (keep, 0, (n + 7) / 8);
  switch (wl_below (r, 20)) {
  case 0: case 1: case 2: case 3: case 4: case 5: case 6:
    for (size_t i = 0; i < n; i++)
      crashio_set_bit (keep, i, wl_below (r, 2));
    break;
  case 7: case 8: case 9:
    pct = wl_below (r, 101);
    for (size_t i = 0; i < n; i++)
      crashio_set_bit (keep, i, wl_below (r, 100) < pct);
    break;
  case 10: case 11: case 12:         /* whole writes, none torn */
    for (size_t e = 0; e < ne; e++) {
      bool on = wl_below (r, 2);
      np = crashio_entry_pieces (c, e, &first);
      for (size_t i = first; i < first + np; i++)
        crashio_set_bit (keep, i, on);
    }
    break;
  case 13: case 14:                  /* in order, up to a point */
    k = wl_below (r, n + 1);
    for (size_t i = 0; i < k; i++)
      crashio_set_bit (keep, i, true);
    break;
  case 15: case 16:                  /* all writes but one */
    skip = wl_below (r, ne);
    for (size_t e = 0; e < ne; e++) {
      np = crashio_entry_pieces (c, e, &first);
      for (size_t i = first; i < first + np; i++)
        crashio_set_bit (keep, i, e != skip);
    }
    break;
  case 17:                           /* a single write */
    if (ne) {
      np = crashio_entry_pieces (c, wl_below (r, ne), &first);
      for (size_t i = first; i < first + np; i++)
        crashio_set_bit (keep, i, true);
    }
    break;
  case 18:
    memset (keep, 0xff, (n + 7) / 8);
    break;
  default:
    break;
  }
}

/* Build the image of keep at the current point and verify it; record
 * the first failure.
 */
static bool
crashsim_try (struct crashsim *s, const uint8_t *keep)
{
  struct crashio *c = s->run.cio;
  size_t n = crashio_nr_pieces (c), len;
  uint64_t seed = s->calls * UINT64_C (0x100000001b3);
  uint8_t *buf;
  struct wl_files files;
  struct failure f;
  bool ok;

  /* What happens after the repair depends on the image only, so that
   * a reproducer replays it.
   */
  for (size_t i = 0; i < (n + 7) / 8; i++) {
    uint8_t bits = keep[i];
    if (i == n / 8)
      bits &= (1u << (n % 8)) - 1;
    seed = (seed ^ bits) * UINT64_C (0x100000001b3);
  }
  crashio_crash_image (c, keep, &buf_image.p, &buf_image.cap, &len);
  buf = buf_image.p;
  if (s->save_image)
    crashcheck_write_file (s->save_image, buf, len);
  files = (struct wl_files) { .image = buf, .len = len };
  if (s->run.dcio) {
    /* The data file's writes since its flush, a subset chosen by the
     * image's, so that a reproducer (which keeps only the image's)
     * makes the same data file again.
     */
    struct crashio *dc = s->run.dcio;
    struct wl_rng r = { seed };
    uint8_t *dkeep = calloc (1, crashio_nr_pieces (dc) / 8 + 1);

    if (!dkeep)
      abort ();
    crashsim_pick_keep (&r, dc, dkeep);
    crashio_crash_image (dc, dkeep, &buf_dimage.p, &buf_dimage.cap,
                         &files.dlen);
    files.data = buf_dimage.p;
    free (dkeep);
  }
  ok = crashcheck_verify (s->setup, &s->run.model, files, seed, &f);
  if (!ok && !s->failed && (!s->want || strcmp (s->want, f.cls) == 0)) {
    s->failed = true;
    s->f = f;
    s->fail_at = s->calls;
    s->fail_npieces = n;
    s->fail_keep = malloc ((n + 7) / 8 + 1);
    memcpy (s->fail_keep, keep, (n + 7) / 8);
  }
  return ok;
}

/* keep = the pieces of the entries in set (a bitmask of entries,
 * counted from the last one written).
 */
static void
crashsim_keep_entries (struct crashio *c, uint8_t *keep, uint64_t set)
{
  size_t ne = crashio_nr_entries (c), first, np;

  memset (keep, 0, (crashio_nr_pieces (c) + 7) / 8);
  for (size_t k = 0; k < 64 && k < ne; k++) {
    np = crashio_entry_pieces (c, ne - 1 - k, &first);
    for (size_t i = first; i < first + np; i++)
      crashio_set_bit (keep, i, set >> k & 1);
  }
}

/* The images a crash here could leave: every subset of the writes
 * since the flush when they are few, else the likely culprits (the
 * last write alone, or all but one of the last writes) and random
 * subsets.
 */
static void
crashsim_regress (struct crashsim *s, uint8_t *keep)
{
  struct crashio *c = s->run.cio;
  size_t ne = crashio_nr_entries (c);
  uint64_t all = ne >= 64 ? UINT64_MAX : (UINT64_C (1) << ne) - 1;

  if (ne <= 5) {
    for (uint64_t set = 0; set <= all && !s->failed; set++) {
      crashsim_keep_entries (c, keep, set);
      crashsim_try (s, keep);
    }
    return;
  }
  crashsim_keep_entries (c, keep, 1);
  crashsim_try (s, keep);
  for (unsigned k = 0; k < 3 && !s->failed; k++) {
    crashsim_keep_entries (c, keep, all & ~(UINT64_C (1) << k));
    crashsim_try (s, keep);
  }
  for (unsigned k = 0; k < 2 && !s->failed; k++) {
    crashsim_pick_keep (&s->rng, c, keep);
    crashsim_try (s, keep);
  }
}

static int
crashsim_hook (void *opaque, enum crashio_op op, uint64_t offset,
               uint64_t count)
{
  struct crashsim *s = opaque;
  struct crashio *c = s->run.cio;
  size_t n = crashio_nr_pieces (c);
  uint8_t *keep;

  if (op == CRASHIO_PREAD || s->failed)
    return 0;
  if (crashcheck_trace)
    fprintf (stderr, "host op %" PRIu64 ": %s %#" PRIx64 " +%" PRIu64
             " (%zu pieces since the flush)\n", s->calls,
             crashio_op_name (op), offset, count, n);
  keep = calloc (1, (n + 7) / 8 + 1);
  if (!keep)
    abort ();
  switch (s->mode) {
  case CRASHSIM_COUNT:
    break;
  case CRASHSIM_SAMPLE:
    if (s->images_left && wl_below (&s->rng, 1000000) < s->p * 1000000) {
      crashcheck_stats.points++;
      for (unsigned i = 0; i < s->per_point && !s->failed &&
             s->images_left; i++, s->images_left--) {
        crashsim_pick_keep (&s->rng, c, keep);
        crashsim_try (s, keep);
      }
    }
    break;
  case CRASHSIM_AT:
    if (s->calls == s->crash_at) {
      for (size_t i = 0; i < n && i < s->nkeep; i++)
        crashio_set_bit (keep, i, crashio_bit (s->keep, i));
      crashsim_try (s, keep);
    }
    break;
  case CRASHSIM_REGRESS:
    crashsim_regress (s, keep);
    break;
  case CRASHSIM_SEARCH:
    crashsim_try (s, keep);
    memset (keep, 0xff, (n + 7) / 8);
    if (!s->failed)
      crashsim_try (s, keep);
    for (int i = 0; i < 3 && !s->failed; i++) {
      crashsim_pick_keep (&s->rng, c, keep);
      crashsim_try (s, keep);
    }
    break;
  }
  free (keep);
  s->calls++;
  return 0;
}

bool
crashsim_run (struct crashsim *s, const struct wl_config *cfg,
              uint64_t seed, const struct wl_op *ops, size_t nops,
              size_t *failed_op)
{
  struct wl_setup setup;
  struct qcow2_image *img;
  uint8_t *initial;
  char line[256];
  int r;

  wl_setup (cfg, seed, &setup);
  s->setup = &setup;
  crashcheck_write_backing (&setup);
  if (s->mode == CRASHSIM_COUNT &&
      (r = crashcheck_qemu (wl_setup_files (&setup), line,
                            sizeof line)) != 0) {
    fprintf (stderr, "%s: the initial image is not clean: qemu-img check "
             "exit %d:\n%s\n", cfg->name, r, line);
    exit (EXIT_FAILURE);
  }
  img = wl_open_copy (&setup, wl_setup_files (&setup), true);
  if (!img || !(initial = wl_read_all (img, &buf_read))) {
    fprintf (stderr, "%s: the initial image does not open: %s\n", cfg->name,
             memenv_last_error (setup.me));
    exit (EXIT_FAILURE);
  }
  qcow2_close (img);
  if ((r = wl_run_start (&s->run, &setup, wl_setup_files (&setup),
                         initial)) < 0) {
    fprintf (stderr, "%s: cannot open the initial image: %s\n", cfg->name,
             memenv_last_error (setup.me));
    exit (EXIT_FAILURE);
  }
  /* Host operations on the data file are crash points too. */
  crashio_set_hook (s->run.cio, crashsim_hook, s);
  if (s->run.dcio)
    crashio_set_hook (s->run.dcio, crashsim_hook, s);
  *failed_op = nops;
  for (size_t i = 0; i < nops && !s->failed; i++) {
    if (crashcheck_trace) {
      wl_format_op (&ops[i], line, sizeof line);
      fprintf (stderr, "request %zu: %s\n", i, line);
    }
    r = wl_exec (&s->run, &ops[i]);
    if (r == 0 && ops[i].kind == WL_CHECK && s->run.check.leaks)
      r = -EUCLEAN;
    if (r == 0 && ops[i].kind == WL_REPAIR && s->run.check.leaks_fixed)
      r = -EUCLEAN;
    if (r == 0 && ops[i].kind == WL_FLUSH && s->mode == CRASHSIM_SAMPLE &&
        !s->failed &&
        !crashcheck_kill_leaks (&setup, wl_run_files (&s->run), &s->f)) {
      s->failed = true;
      s->fail_at = UINT64_MAX;
      *failed_op = i;
      break;
    }
    if (r < 0 && !s->failed) {
      wl_format_op (&ops[i], line, sizeof line);
      s->failed = true;
      s->fail_at = UINT64_MAX;
      crashcheck_fail (&s->f, "live", "request %zu (%s) failed: %s (check: %"
                PRIu64 " corruptions, %" PRIu64 " leaks, %" PRIu64
                " leaks fixed): %s", i, line, errstr (-r),
                s->run.check.corruptions, s->run.check.leaks,
                s->run.check.leaks_fixed, memenv_last_error (setup.me));
    }
    if (s->failed)
      *failed_op = i;
  }

  /* A clean close leaves every write durable and no leak. */
  if (!s->failed && s->mode == CRASHSIM_SAMPLE) {
    struct qcow2_check_result res;
    struct wl_files files;
    uint8_t *got = NULL;
    char out[4096];

    r = qcow2_close (s->run.img);
    s->run.img = NULL;
    files = wl_run_files (&s->run);
    img = wl_open_copy (&setup, files, true);
    if (r < 0 || !img)
      crashcheck_fail (&s->f, "live", "clean close, open: %s",
                memenv_last_error (setup.me));
    else if ((r = qcow2_check (img, false, &res)) < 0 || res.corruptions ||
             res.leaks)
      crashcheck_fail (&s->f, "live", "after a clean close: %" PRIu64
                " corruptions, %" PRIu64 " leaks", res.corruptions,
                res.leaks);
    else if (!(got = wl_read_all (img, &buf_read)))
      crashcheck_fail (&s->f, "live", "read after a clean close: %s",
                memenv_last_error (setup.me));
    else if (memcmp (got, s->run.model.acked, s->run.model.size) != 0) {
      uint64_t i = crashcheck_first_difference (got, s->run.model.acked,
                                     s->run.model.size);
      crashcheck_fail (&s->f, "live", "after a clean close, guest byte %#" PRIx64
                " reads %#x, not %#x", i, got[i], s->run.model.acked[i]);
    }
    else if (!crashcheck_raw_data_file (&setup, img, files, got, false,
                                        &s->f))
      r = -1;
    else if ((r = crashcheck_qemu (files, out, sizeof out)) != 0)
      crashcheck_fail (&s->f, "live", "qemu-img check exit %d after a clean "
                "close:\n%s", r, out);
    else
      r = 0;
    if (r != 0 || !img || !got) {
      s->failed = true;
      s->fail_at = UINT64_MAX;
    }
    qcow2_close (img);
  }
  crashio_set_hook (s->run.cio, NULL, NULL);
  if (s->run.dcio)
    crashio_set_hook (s->run.dcio, NULL, NULL);
  wl_run_end (&s->run);
  wl_setup_free (&setup);
  return s->failed;
}
