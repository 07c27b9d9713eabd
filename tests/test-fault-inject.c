/* SPDX-License-Identifier: BSD-3-Clause */
/* Fault injection: the workloads of the crash simulator, with the n-th
 * host read, write, flush or punch failing (EIO), or the n-th write
 * that grows the file failing with ENOSPC (a full disk), alone or in a
 * burst of failures, for every n up to a limit per kind.
 *
 *  - The request that met the fault fails with that error (or succeeds:
 *    a failed punch only leaves data in a free cluster); a request that
 *    met none succeeds.  A request that failed left, where it wrote,
 *    the old data or the new, nothing else.
 *  - The server keeps serving: once the fault clears, reads, writes and
 *    flushes work again, and a clean close leaves no corruption and
 *    exactly what was written.  A failed host flush is the exception:
 *    the writes before it may be lost while the file still shows them,
 *    so no flush may succeed again before the image is reopened (as in
 *    QEMU); the image is marked dirty, and requests may fail with EIO
 *    meanwhile.
 *  - A crash after the fault (images built from the flushed state and
 *    any subset of the writes since, those a failed flush lost
 *    included) leaves an image that passes the crash simulator's
 *    checks (crashcheck.c): no corruption, flushed data intact, and a
 *    dirty image repaired on its next read-write open.
 *
 * FAULT_MAX=N (default 6, 3 under AddressSanitizer; 0: all) faults
 * tried per kind and configuration, spread over the workload (every
 * n-th operation when there are no more than that);
 * FAULT_CONFIG=NAME one configuration; FAULT_CASE=KIND:NTH:BURST one
 * case, as a failure names it (KIND 0 to 4: read, write, flush, punch,
 * growing write); FAULT_TRACE=1 prints every request.
 */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checked.h"
#include "errstr.h"
#include "crashcheck.h"

/* The configurations faults are injected in: every path that writes
 * metadata (evictions, new L2 tables, copied L2 tables, new refcount
 * blocks, a growing refcount table, lazy refcounts, bitmaps, external
 * data files, copy-on-read fills).
 */
static const char *const fault_configs[] = {
  "alloc-4k-evict", "backing-qcow2-v2-4k-evict", "extl2-32k-backing",
  "lazy-4k", "snapshot-compressed-64k-evict", "blocks-512-rc64",
  "grow-512-rc64", "bitmaps-snapshot-512-evict", "datafile-backing-4k-evict",
  "datafile-raw-64k", "cor-raw-4k-evict", "cor-extl2-32k-qcow2",
};

enum fault_kind { F_PREAD, F_PWRITE, F_FLUSH, F_PUNCH, F_GROW, F_KINDS };

static const struct {
  const char *name;
  enum crashio_op op;
  int err;
} kinds[F_KINDS] = {
  [F_PREAD] = { "read EIO", CRASHIO_PREAD, EIO },
  [F_PWRITE] = { "write EIO", CRASHIO_PWRITE, EIO },
  [F_FLUSH] = { "flush EIO", CRASHIO_FLUSH, EIO },
  [F_PUNCH] = { "punch EIO", CRASHIO_PUNCH, EIO },
  [F_GROW] = { "growing write ENOSPC", CRASHIO_PWRITE, ENOSPC },
};

#define OPS_PER_WORKLOAD 60
#ifdef CRASHCHECK_SANITIZED
#define DEFAULT_MAX 3
#else
#define DEFAULT_MAX 6
#endif
#define IMAGES_PER_POINT 2

struct inj;

/* The hook's view of one file: the image or its data file. */
struct inj_file {
  struct inj *in;
  struct crashio *c;
};

struct inj {
  struct wl_run run;
  struct inj_file files[2];
  enum fault_kind kind;
  uint64_t nth, burst;          /* fail operations nth to nth+burst-1 */
  uint64_t seen[F_KINDS];       /* operations of each kind so far */
  uint64_t injected;
  bool active;
};

static struct {
  uint64_t runs, failed_requests, sticky, leaky;
} totals;

/* Whether op (of the file c) counts as one of kind k. */
static bool
inj_matches (struct crashio *c, enum fault_kind k, enum crashio_op op,
             uint64_t offset, uint64_t count)
{
  size_t len;

  if (kinds[k].op != op)
    return false;
  if (k != F_GROW)
    return true;
  crashio_data (c, &len);
  return offset + count > len;
}

static int
inj_hook (void *opaque, enum crashio_op op, uint64_t offset, uint64_t count)
{
  struct inj_file *file = opaque;
  struct inj *in = file->in;
  uint64_t n;

  for (enum fault_kind k = 0; k < F_KINDS; k++)
    if (inj_matches (file->c, k, op, offset, count))
      in->seen[k]++;
  if (crashcheck_trace && op != CRASHIO_PREAD)
    fprintf (stderr, "  host %s %#" PRIx64 " +%" PRIu64 "\n",
             crashio_op_name (op), offset, count);
  if (!in->active || !inj_matches (file->c, in->kind, op, offset, count))
    return 0;
  n = in->seen[in->kind];
  if (n < in->nth || n >= in->nth + in->burst)
    return 0;
  in->injected++;
  if (crashcheck_trace)
    fprintf (stderr, "  (fails)\n");
  return kinds[in->kind].err;
}

/* Crash images of the state now: the flushed state plus subsets of
 * the writes since (whole writes or torn sectors).
 */
static bool
inj_crash_images (struct inj *in, struct wl_rng *rng, struct failure *f)
{
  static struct wl_buf image, dimage;
  struct crashio *c = in->run.cio, *dc = in->run.dcio;
  size_t n = crashio_nr_pieces (c), dn = dc ? crashio_nr_pieces (dc) : 0;
  uint8_t *keep = calloc (1, n / 8 + 1), *dkeep = calloc (1, dn / 8 + 1);
  bool ok = true;

  if (!keep || !dkeep)
    abort ();
  for (int i = 0; i < IMAGES_PER_POINT && ok; i++) {
    unsigned pct = i == 0 ? 100 : wl_below (rng, 101);
    struct wl_files files = { 0 };

    for (size_t k = 0; k < n; k++)
      crashio_set_bit (keep, k, wl_below (rng, 100) < pct);
    crashio_crash_image (c, keep, &image.p, &image.cap, &files.len);
    files.image = image.p;
    if (dc) {
      for (size_t k = 0; k < dn; k++)
        crashio_set_bit (dkeep, k, wl_below (rng, 100) < pct);
      crashio_crash_image (dc, dkeep, &dimage.p, &dimage.cap, &files.dlen);
      files.data = dimage.p;
    }
    ok = crashcheck_verify (in->run.setup, &in->run.model, files,
                            wl_rand (rng), f);
  }
  crashcheck_stats.points++;
  free (keep);
  free (dkeep);
  return ok;
}

/* Whether the file (as reads see it) has the dirty bit set. */
static bool
inj_marked_dirty (struct inj *in)
{
  size_t len;
  const uint8_t *data = crashio_data (in->run.cio, &len);

  return len >= 80 && (data[79] & 1);
}

/* Read back what a failed request touched: the old data or the new. */
static bool
inj_adopt (struct inj *in, const struct wl_op *op, struct failure *f)
{
  uint64_t offset = op->offset, len = op->len;
  char why[sizeof f->why];
  uint8_t *buf;
  int r;

  if (op->kind != WL_WRITE && op->kind != WL_ZERO && op->kind != WL_TRIM)
    return true;
  buf = malloc (len);
  if (!buf)
    abort ();
  r = qcow2_read (in->run.img, buf, len, offset);
  if (r < 0)
    crashcheck_fail (f, "serving", "a read after the failed request "
                     "failed: %s", errstr (-r));
  else if (!wl_model_adopt (&in->run.model, buf, offset, len, why,
                            sizeof why))
    crashcheck_fail (f, "data", "after the failed request: %s", why);
  free (buf);
  return r == 0 && !f->cls[0];
}

/* After the fault: write, flush, and close cleanly; the image must then
 * be without corruption and hold exactly what was written.
 */
static bool
inj_recovered (struct inj *in, struct wl_rng *rng, struct failure *f)
{
  struct wl_model *m = &in->run.model;
  struct wl_op op = { .kind = WL_WRITE, .seed = wl_rand (rng) };
  struct qcow2_check_result res;
  static struct wl_buf got;
  struct qcow2_image *img;
  struct wl_files files;
  char out[4096];
  int r;

  op.offset = wl_below (rng, m->size / 2);
  op.len = 1 + wl_below (rng, 3 * m->cluster_size);
  op.len = MIN (op.len, m->size - op.offset);
  if ((r = wl_exec (&in->run, &op)) < 0 ||
      (r = wl_exec (&in->run, &(struct wl_op) { .kind = WL_FLUSH })) < 0 ||
      (r = wl_exec (&in->run, &(struct wl_op) { .kind = WL_CHECK })) < 0) {
    crashcheck_fail (f, "recovery", "once the fault cleared, a write, "
                     "flush or check failed: %s", errstr (-r));
    return false;
  }
  r = qcow2_close (in->run.img);
  in->run.img = NULL;
  if (r < 0) {
    crashcheck_fail (f, "recovery", "once the fault cleared, the close "
                     "failed: %s", errstr (-r));
    return false;
  }
  files = wl_run_files (&in->run);
  img = wl_open_copy (in->run.setup, files, true);
  if (!img) {
    crashcheck_fail (f, "recovery", "the image does not open after a "
                     "clean close: %s",
                     memenv_last_error (in->run.setup->me));
    return false;
  }
  if ((r = qcow2_check (img, false, &res)) < 0 || res.corruptions)
    crashcheck_fail (f, "recovery", "after a clean close: check %s, %"
                     PRIu64 " corruptions", errstr (-r), res.corruptions);
  else if (!wl_read_all (img, &got))
    crashcheck_fail (f, "recovery", "reading after a clean close: %s",
                     errstr (errno));
  else if (memcmp (got.p, m->acked, m->size) != 0) {
    uint64_t i = crashcheck_first_difference (got.p, m->acked, m->size);
    crashcheck_fail (f, "recovery", "after a clean close, guest byte %#"
                     PRIx64 " reads %#x, not %#x", i, got.p[i],
                     m->acked[i]);
  }
  totals.leaky += !f->cls[0] && res.leaks > 0;
  qcow2_close (img);
  if (!f->cls[0] &&
      (r = crashcheck_qemu (files, out, sizeof out)) != 0 && r != 3)
    crashcheck_fail (f, "qemu-img", "qemu-img check exit %d after a clean "
                     "close:\n%s", r, out);
  return !f->cls[0];
}

/* One workload with one fault (or burst): false with f set if any
 * promise was broken.
 */
static bool
inj_run (const struct wl_config *cfg, uint64_t seed, const struct wl_op *ops,
         size_t nops, struct inj *in, struct failure *f)
{
  struct wl_rng rng = { seed ^ in->nth * 7919 ^ in->kind };
  struct wl_setup setup;
  struct qcow2_image *img;
  struct wl_buf initial = { 0 };
  bool sticky = false, closed = false, ok = true;
  char line[256];

  memset (f, 0, sizeof *f);
  wl_setup (cfg, seed, &setup);
  crashcheck_write_backing (&setup);
  img = wl_open_copy (&setup, wl_setup_files (&setup), true);
  if (!img || !wl_read_all (img, &initial) ||
      wl_run_start (&in->run, &setup, wl_setup_files (&setup),
                    initial.p) < 0) {
    fprintf (stderr, "%s: the initial image does not open\n", cfg->name);
    exit (EXIT_FAILURE);
  }
  qcow2_close (img);
  free (initial.p);
  /* Faults in the data file's operations too, counted with the image's. */
  in->files[0] = (struct inj_file) { in, in->run.cio };
  in->files[1] = (struct inj_file) { in, in->run.dcio };
  crashio_set_hook (in->run.cio, inj_hook, &in->files[0]);
  if (in->run.dcio)
    crashio_set_hook (in->run.dcio, inj_hook, &in->files[1]);
  in->active = true;

  for (size_t i = 0; i < nops && ok; i++) {
    uint64_t before = in->injected;
    int r;

    /* Reopening after a failed flush would trust writes that may be
     * lost (Linux's page cache shows them): the run ends there.
     */
    if (sticky && ops[i].kind == WL_REOPEN)
      break;
    r = wl_exec (&in->run, &ops[i]);
    wl_format_op (&ops[i], line, sizeof line);
    if (crashcheck_trace)
      fprintf (stderr, "request %zu: %s: %s\n", i, line,
               r < 0 ? errstr (-r) : "ok");
    if (r == 0)
      continue;
    totals.failed_requests++;
    if (r == -EUCLEAN) {
      crashcheck_fail (f, "check", "request %zu (%s) found %" PRIu64
                       " corruptions in memory", i, line,
                       in->run.check.corruptions);
      ok = false;
    }
    else if (!(in->injected > before && r == -kinds[in->kind].err) &&
             !(sticky && r == -EIO)) {
      crashcheck_fail (f, "serving", "request %zu (%s) failed with %s "
                       "(%" PRIu64 " faults injected during it)", i, line,
                       errstr (-r), in->injected - before);
      ok = false;
    }
    if (!ok)
      break;
    sticky = in->kind == F_FLUSH && in->injected > 0;
    /* A close that failed ends the server's life (nbdkit closes at
     * exit): a new server's flushes do not cover what this one wrote
     * without a successful flush, so only a crash is checked.
     */
    if (ops[i].kind == WL_REOPEN) {
      closed = true;
      break;
    }
    /* A crash now, and what the failed request left. */
    in->active = false;
    ok = inj_crash_images (in, &rng, f) &&
      (sticky || inj_adopt (in, &ops[i], f));
    in->active = true;
  }
  in->active = false;
  if (ok && sticky && !cfg->v2 && !inj_marked_dirty (in)) {
    crashcheck_fail (f, "dirty", "after a failed flush, the image is not "
                     "marked dirty");
    ok = false;
  }
  if (ok)
    ok = inj_crash_images (in, &rng, f);
  if (ok && !sticky && !closed)
    ok = inj_recovered (in, &rng, f);
  totals.sticky += sticky;
  crashio_set_hook (in->run.cio, NULL, NULL);
  if (in->run.dcio)
    crashio_set_hook (in->run.dcio, NULL, NULL);
  wl_run_end (&in->run);
  wl_setup_free (&setup);
  return ok;
}

int
main (void)
{
  const char *only = getenv ("FAULT_CONFIG"), *e;
  unsigned case_kind = F_KINDS;
  uint64_t case_nth = 0, case_burst = 0;
  uint64_t max = DEFAULT_MAX, seed = 1;
  unsigned failures = 0;
  time_t start = time (NULL);

  mallopt (M_MMAP_THRESHOLD, 256 << 20);
  mallopt (M_TRIM_THRESHOLD, 512 << 20);
  if ((e = getenv ("FAULT_MAX")))
    max = strtoull (e, NULL, 10);
  crashcheck_trace = getenv ("FAULT_TRACE") != NULL;
  if ((e = getenv ("FAULT_CASE")) &&
      sscanf (e, "%u:%" SCNu64 ":%" SCNu64, &case_kind, &case_nth,
              &case_burst) != 3) {
    fprintf (stderr, "FAULT_CASE=%s: expected KIND:NTH:BURST\n", e);
    return EXIT_FAILURE;
  }
  crashcheck_init ();

  for (size_t ci = 0; ci < sizeof fault_configs / sizeof *fault_configs;
       ci++) {
    const struct wl_config *cfg = wl_config_find (fault_configs[ci]);
    struct wl_config short_cfg;
    struct wl_op *ops;
    size_t nops;

    if (!cfg)
      abort ();
    if (only && strcmp (only, cfg->name) != 0)
      continue;
    short_cfg = *cfg;
    short_cfg.ops = OPS_PER_WORKLOAD;
    wl_generate (&short_cfg, seed + ci, &ops, &nops);

    /* Count each kind of host operation in the workload. */
    struct inj count = { .nth = UINT64_MAX };
    struct failure f;
    if (!inj_run (cfg, seed + ci, ops, nops, &count, &f)) {
      fprintf (stderr, "FAIL: %s without faults: %s: %s\n", cfg->name,
               f.cls, f.why);
      failures++;
      free (ops);
      continue;
    }
    for (enum fault_kind k = 0; k < F_KINDS; k++) {
      uint64_t n = count.seen[k], tried = max ? MIN (n, max) : n;
      uint64_t images = crashcheck_stats.images;
      unsigned kind_failures = 0;

      for (uint64_t t = 0; t < tried; t++) {
        /* Spread over the workload: every n-th when there are few. */
        struct inj in = {
          .kind = k, .nth = 1 + t * n / tried,
          .burst = t % 2 ? 1 + t % 17 : 1,
        };
        if (case_kind < F_KINDS) {
          if (case_kind != k || t > 0)
            break;
          in.nth = case_nth;
          in.burst = case_burst;
        }
        totals.runs++;
        if (crashcheck_trace)
          fprintf (stderr, "%s: %s at operation %" PRIu64 " (burst %"
                   PRIu64 ")\n", cfg->name, kinds[k].name, in.nth,
                   in.burst);
        if (!inj_run (cfg, seed + ci, ops, nops, &in, &f)) {
          fprintf (stderr, "FAIL: %s: %s at operation %" PRIu64 " of %"
                   PRIu64 " (burst %" PRIu64 "; FAULT_CONFIG=%s FAULT_CASE="
                   "%u:%" PRIu64 ":%" PRIu64 "): %s: %s\n", cfg->name,
                   kinds[k].name, in.nth, n, in.burst, cfg->name, k, in.nth,
                   in.burst, f.cls, f.why);
          failures++;
          if (++kind_failures >= 3)
            break;
        }
      }
      printf ("%-30s %-21s %4" PRIu64 " of %5" PRIu64 " operations failed, "
              "%5" PRIu64 " crash images\n", cfg->name, kinds[k].name,
              tried, n, crashcheck_stats.images - images);
      fflush (stdout);
    }
    free (ops);
  }
  printf ("fault-inject: %" PRIu64 " runs, %" PRIu64 " requests failed, %"
          PRIu64 " runs after a failed flush, %" PRIu64 " runs left "
          "leaks; %" PRIu64 " crash images, %" PRIu64 " qemu-img checks; "
          "%u failures; %lds\n", totals.runs, totals.failed_requests,
          totals.sticky, totals.leaky, crashcheck_stats.images,
          crashcheck_stats.qemu + crashcheck_stats.qemu_after, failures,
          (long) (time (NULL) - start));
  return failures ? EXIT_FAILURE : EXIT_SUCCESS;
}
