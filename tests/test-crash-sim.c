/* SPDX-License-Identifier: BSD-3-Clause */
/* The crash simulator.  Random workloads (workload.c) run against the
 * engine over a crashio, which records every host write, punch and
 * flush.  At random host operations, the images a crash there could
 * leave are built: the state at the last flush plus a subset of the
 * writes since, torn into sectors.  Each must:
 *
 *  - open, and read back what the model allows: every byte a completed
 *    flush, FUA request or clean close covered as it was written, every
 *    other byte as some request wrote it;
 *  - have no corruption by our check (leaks are allowed), and by
 *    qemu-img check on a sample (exit 0 or 3) -- an image left dirty
 *    under lazy refcounts excepted: the spec says to repair it first,
 *    and on the sample qemu-img check -r all does, leaving it clean
 *    and every guest byte as we read it;
 *  - right after each flush, with all the engine wrote kept (a process
 *    killed there), leak at most 4 MiB or 64 clusters, whichever is
 *    more;
 *  - open read-write and be repaired (qcow2_check fixing leaks, which
 *    rebuilds the refcounts of a dirty image) without a change of data,
 *    leaving no leak and no corruption; then take more writes, and be
 *    clean after a clean close (qemu-img check exit 0 on the sample).
 *
 * A failure is shrunk (fewer requests, fewer kept writes) and the
 * reproducer printed, saved as crash-sim-failure-CONFIG.txt with the
 * image in crash-sim-failure-CONFIG.qcow2.  Before the random workloads,
 * short regression workloads (reproducers of engine bugs found so far)
 * are checked with many crash images at every host operation.
 *
 * Environment:
 *  CRASH_IMAGES=N      crash images of random workloads (default 4000;
 *                      1200 under AddressSanitizer, where an image costs
 *                      four times as much and the point is memory
 *                      errors, not crash orderings)
 *  CRASH_SEED=N|random the workloads (default 1)
 *  CRASH_CONFIG=NAME   one configuration only (see workload-gen.c)
 *  CRASH_QEMU_EVERY=N  qemu-img check on every Nth image (default 10;
 *                      0: never)
 *  CRASH_REPLAY=FILE   run a saved reproducer; with CRASH_REPLAY_ALL=1,
 *                      its requests with many crash images at every host
 *                      operation, as the regression workloads
 *  CRASH_TRACE=1       print every request and host operation
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "crashsim.h"

#ifdef CRASHCHECK_SANITIZED
#define DEFAULT_IMAGES 1200
#else
#define DEFAULT_IMAGES 4000
#endif

/* Save the crash image here (CRASHSIM_AT). */
static const char *save_image;

/* Everything needed to build the failing image again. */
struct repro {
  const struct wl_config *cfg;
  uint64_t seed;                /* of the initial image */
  struct wl_op *ops;
  size_t nops;
  uint64_t crash_at;            /* which host write, punch or flush */
  uint8_t *keep;                /* pieces kept, at that point */
  size_t npieces;
  struct failure f;
};

static void
repro_print (FILE *fp, const struct repro *rp)
{
  char line[256];

  fprintf (fp, "# %s: %s\n", rp->f.cls, rp->f.why);
  fprintf (fp, "config %s\nseed %" PRIu64 "\n", rp->cfg->name, rp->seed);
  for (size_t i = 0; i < rp->nops; i++) {
    wl_format_op (&rp->ops[i], line, sizeof line);
    fprintf (fp, "op %s\n", line);
  }
  if (rp->crash_at == UINT64_MAX)
    return;
  fprintf (fp, "crash-at %" PRIu64 "\nkeep", rp->crash_at);
  for (size_t i = 0; i < rp->npieces; ) {
    size_t j = i;
    if (!crashio_bit (rp->keep, i)) {
      i++;
      continue;
    }
    while (j + 1 < rp->npieces && crashio_bit (rp->keep, j + 1))
      j++;
    fprintf (fp, j > i ? " %zu-%zu" : " %zu", i, j);
    i = j + 1;
  }
  fprintf (fp, " of %zu\n", rp->npieces);
}

/* Run a case once, in mode: whether it fails (with class want, if
 * given); the failure goes to rp.
 */
static bool
repro_fails (struct repro *rp, enum crashsim_mode mode, const char *want,
             uint64_t rng_seed)
{
  struct crashsim s = {
    .mode = mode, .want = want, .rng = { rng_seed },
    .crash_at = rp->crash_at, .keep = rp->keep, .nkeep = rp->npieces,
    .save_image = save_image,
  };
  size_t failed_op;

  if (!crashsim_run (&s, rp->cfg, rp->seed, rp->ops, rp->nops, &failed_op))
    return false;
  if (want && strcmp (s.f.cls, want) != 0) {
    free (s.fail_keep);
    return false;
  }
  rp->f = s.f;
  if (mode != CRASHSIM_AT || s.fail_at == UINT64_MAX) {
    rp->crash_at = s.fail_at;
    free (rp->keep);
    rp->keep = s.fail_keep;
    rp->npieces = s.fail_npieces;
    rp->nops = failed_op + 1;
  }
  else
    free (s.fail_keep);
  return true;
}

/* Shrink a failing case: drop requests while the same kind of failure
 * still happens somewhere, then drop kept writes.
 */
static void
shrink (struct repro *rp, double budget)
{
  time_t end = time (NULL) + (time_t) budget;
  char want[32];
  size_t runs = 0;

  snprintf (want, sizeof want, "%s", rp->f.cls);
  for (size_t chunk = rp->nops / 2; chunk >= 1 && time (NULL) < end;
       chunk /= 2) {
    for (size_t i = 0; i + 1 < rp->nops && time (NULL) < end; ) {
      struct repro c = *rp;
      size_t n = MIN (chunk, rp->nops - 1 - i);
      c.ops = malloc (rp->nops * sizeof *c.ops);
      c.keep = NULL;
      memcpy (c.ops, rp->ops, i * sizeof *c.ops);
      memcpy (c.ops + i, rp->ops + i + n,
              (rp->nops - i - n) * sizeof *c.ops);
      c.nops = rp->nops - n;
      runs++;
      if (repro_fails (&c, CRASHSIM_SEARCH, want, runs)) {
        free (rp->ops);
        free (rp->keep);
        *rp = c;
      }
      else {
        free (c.ops);
        free (c.keep);
        i += n;
      }
    }
    if (chunk == 1)
      break;
  }
  /* Fewer kept pieces: whole writes first, then single sectors. */
  if (rp->crash_at != UINT64_MAX)
    for (size_t i = 0; i < rp->npieces && time (NULL) < end; i++) {
      if (!crashio_bit (rp->keep, i))
        continue;
      crashio_set_bit (rp->keep, i, false);
      runs++;
      if (!repro_fails (rp, CRASHSIM_AT, want, runs))
        crashio_set_bit (rp->keep, i, true);
    }
  /* The message of the final case. */
  repro_fails (rp, rp->crash_at == UINT64_MAX ? CRASHSIM_SAMPLE
                                              : CRASHSIM_AT, want, 1);
  fprintf (stderr, "shrunk in %zu runs\n", runs);
}

/* Save the reproducer and its image for the test's output. */
static void
repro_save (struct repro *rp)
{
  char txt[256], image[256];
  FILE *fp;

  snprintf (txt, sizeof txt, "crash-sim-failure-%s.txt", rp->cfg->name);
  snprintf (image, sizeof image, "crash-sim-failure-%s.qcow2",
            rp->cfg->name);
  repro_print (stderr, rp);
  if ((fp = fopen (txt, "w"))) {
    repro_print (fp, rp);
    fclose (fp);
    fprintf (stderr, "saved as %s (CRASH_REPLAY=%s runs it)\n", txt, txt);
  }
  if (rp->crash_at != UINT64_MAX) {
    save_image = image;
    repro_fails (rp, CRASHSIM_AT, NULL, 1);
    save_image = NULL;
    fprintf (stderr, "the crash image: %s\n", image);
  }
}

/* Short workloads that found engine bugs (shrunk reproducers), each
 * checked at every host operation with many crash images.
 */
static const struct regression {
  const char *what, *config;
  uint64_t seed;
  const char *ops;
} regressions[] = {
  /* A new cluster past the end of the file got its L2 entry without a
   * flush after its data: a crash could leave the entry pointing past
   * the end of the file (corruption to qemu-img check), from the
   * reserve or, with lazy refcounts, from the end of the file.
   */
  { "an L2 entry pointing past the end of the file (reserve)",
    "alloc-64k", 1,
    "write 0 65536 seed=1 fua=1\n"
    "write 131072 65536 seed=2 fua=0\n"
    "write 262144 65536 seed=3 fua=1\n" },
  { "an L2 entry pointing past the end of the file (lazy refcounts)",
    "lazy-4k", 1,
    "write 0 4096 seed=1 fua=1\n"
    "write 131072 4096 seed=2 fua=0\n"
    "write 262144 4096 seed=3 fua=1\n" },
  /* The same where the file is not extended ahead (O_DIRECT). */
  { "an L2 entry pointing past the end of the file (reserve, direct)",
    "alloc-64k-direct", 1,
    "write 0 65536 seed=1 fua=1\n"
    "write 131072 65536 seed=2 fua=0\n"
    "write 262144 65536 seed=3 fua=1\n" },
  { "an L2 entry pointing past the end of the file (lazy, direct)",
    "lazy-4k-direct", 1,
    "write 0 4096 seed=1 fua=1\n"
    "write 131072 4096 seed=2 fua=0\n"
    "write 262144 4096 seed=3 fua=1\n" },
  /* The table entry of a new refcount block was written after the
   * block, but with the L2 entries pointing at clusters it counts.
   */
  { "a new refcount block's table entry durable before the L2 entries",
    "blocks-512-rc64", 1,
    "write 600000 40000 seed=1 fua=1\n" },
  /* A run of new clusters that started in a free gap inside the file
   * and ended past it (the reserve released by a clean close leaves
   * one) did not move file_size: the L2 entries pointed past the end
   * of the file as the engine saw it, and in-place writes there failed.
   */
  { "a run of new clusters straddling the end of the file",
    "alloc-4k-evict", 1,
    "write 0 65536 seed=1 fua=1\n"
    "reopen\n"
    "write 131072 262144 seed=2 fua=0\n"
    "write 135168 4096 seed=3 fua=0\n"
    "check\n" },
  /* Copy-on-read fills (whole clusters from the backing file) among
   * writes, zeroes and trims of the clusters they fill.
   */
  { "copy-on-read fills among writes, zeroes and trims",
    "cor-raw-4k-evict", 1,
    "fill 0 65536\n"
    "write 4096 100 seed=1 fua=0\n"
    "read 60000 20000\n"
    "zero 65536 8192 may_trim=0 fua=0\n"
    "fill 0 200000\n"
    "flush\n"
    "trim 0 8192 fua=0\n"
    "read 0 300000\n"
    "write 290000 5000 seed=2 fua=1\n"
    "fill 1200000 100000\n"
    "flush\n" },
  { .what = NULL },
};

static unsigned
run_regressions (const char *only)
{
  unsigned failures = 0;

  for (const struct regression *rg = regressions; rg->what; rg++) {
    struct repro rp = { .cfg = wl_config_find (rg->config),
                        .seed = rg->seed };
    uint64_t images = crashcheck_stats.images;
    size_t cap = 0;
    char *copy = strdup (rg->ops);

    if (!rp.cfg || !copy)
      abort ();
    if (only && strcmp (only, rg->config) != 0) {
      free (copy);
      continue;
    }
    for (char *line = strtok (copy, "\n"); line; line = strtok (NULL, "\n")) {
      if (rp.nops == cap) {
        cap = cap ? cap * 2 : 16;
        rp.ops = realloc (rp.ops, cap * sizeof *rp.ops);
      }
      if (!rp.ops || wl_parse_op (line, &rp.ops[rp.nops++]) < 0)
        abort ();
    }
    free (copy);
    rp.crash_at = UINT64_MAX;
    if (repro_fails (&rp, CRASHSIM_REGRESS, NULL, rp.seed)) {
      fprintf (stderr, "FAIL: regression \"%s\": %s: %s\n", rg->what,
               rp.f.cls, rp.f.why);
      repro_save (&rp);
      failures++;
    }
    printf ("regression: %-58.58s %5" PRIu64 " images\n", rg->what,
            crashcheck_stats.images - images);
    free (rp.keep);
    free (rp.ops);
  }
  return failures;
}

static int
replay (const char *path)
{
  struct repro rp = { .crash_at = UINT64_MAX };
  FILE *fp = fopen (path, "r");
  char line[1024], name[128];
  size_t cap = 0;

  if (!fp) {
    fprintf (stderr, "%s: %s\n", path, errstr (errno));
    return EXIT_FAILURE;
  }
  while (fgets (line, sizeof line, fp)) {
    struct wl_op op;
    char *p;
    if (line[0] == '#')
      continue;
    if (sscanf (line, "config %127s", name) == 1) {
      if (!(rp.cfg = wl_config_find (name))) {
        fprintf (stderr, "%s: no configuration %s\n", path, name);
        return EXIT_FAILURE;
      }
    }
    else if (sscanf (line, "seed %" SCNu64, &rp.seed) == 1)
      ;
    else if (strncmp (line, "op ", 3) == 0 && wl_parse_op (line + 3, &op) == 0) {
      if (rp.nops == cap) {
        cap = cap ? cap * 2 : 64;
        rp.ops = realloc (rp.ops, cap * sizeof *rp.ops);
      }
      rp.ops[rp.nops++] = op;
    }
    else if (sscanf (line, "crash-at %" SCNu64, &rp.crash_at) == 1)
      ;
    else if (strncmp (line, "keep", 4) == 0 && (p = strstr (line, " of "))) {
      rp.npieces = strtoull (p + 4, NULL, 10);
      rp.keep = calloc (1, rp.npieces / 8 + 1);
      *p = '\0';
      for (char *t = strtok (line + 4, " \n"); t; t = strtok (NULL, " \n")) {
        size_t a, b;
        int k = sscanf (t, "%zu-%zu", &a, &b);
        if (k == 1)
          b = a;
        for (size_t i = a; k >= 1 && i <= b && i < rp.npieces; i++)
          crashio_set_bit (rp.keep, i, true);
      }
    }
  }
  fclose (fp);
  if (!rp.cfg) {
    fprintf (stderr, "%s: no configuration\n", path);
    return EXIT_FAILURE;
  }
  if (repro_fails (&rp, rp.crash_at != UINT64_MAX ? CRASHSIM_AT
                   : getenv ("CRASH_REPLAY_ALL") ? CRASHSIM_REGRESS
                   : CRASHSIM_SAMPLE, NULL, 1)) {
    fprintf (stderr, "replay: FAIL: %s: %s\n", rp.f.cls, rp.f.why);
    return EXIT_FAILURE;
  }
  printf ("replay: no failure\n");
  return EXIT_SUCCESS;
}

int
main (void)
{
  const char *e;
  uint64_t total = DEFAULT_IMAGES, seed = 1;
  const char *only = getenv ("CRASH_CONFIG");
  size_t nconfigs = only ? 1 : wl_nr_configs;
  unsigned failures = 0;
  time_t start = time (NULL);

  /* Each image allocates and frees buffers the size of the disk: keep
   * them in the heap rather than mapping and faulting them in anew.
   */
  mallopt (M_MMAP_THRESHOLD, 256 << 20);
  mallopt (M_TRIM_THRESHOLD, 512 << 20);
  if ((e = getenv ("CRASH_IMAGES")))
    total = strtoull (e, NULL, 10);
  if ((e = getenv ("CRASH_QEMU_EVERY")))
    crashcheck_qemu_every = strtoul (e, NULL, 10);
  crashcheck_trace = getenv ("CRASH_TRACE") != NULL;
  if ((e = getenv ("CRASH_SEED")))
    seed = strcmp (e, "random") == 0 ? (uint64_t) time (NULL) ^ getpid ()
                                     : strtoull (e, NULL, 10);
  crashcheck_init ();
  if ((e = getenv ("CRASH_REPLAY")))
    return replay (e);
  if (only && !wl_config_find (only)) {
    fprintf (stderr, "CRASH_CONFIG=%s: no such configuration\n", only);
    return EXIT_FAILURE;
  }
  printf ("crash-sim: %" PRIu64 " crash images, seed %" PRIu64
          ", qemu-img check on every %u\n", total, seed, crashcheck_qemu_every);
  failures += run_regressions (only);

  for (size_t ci = 0; ci < wl_nr_configs; ci++) {
    const struct wl_config *cfg = &wl_configs[ci];
    uint64_t quota = (total + nconfigs - 1) / nconfigs;
    uint64_t first = crashcheck_stats.images;
    uint64_t dirty0 = crashcheck_stats.dirty, leaky0 = crashcheck_stats.leaky;
    uint64_t qemu0 = crashcheck_stats.qemu + crashcheck_stats.qemu_after;
    time_t t0 = time (NULL);
    unsigned w;

    if (only && strcmp (only, cfg->name) != 0)
      continue;
    for (w = 0; crashcheck_stats.images - first < quota; w++) {
      uint64_t wseed = seed * 1000003 + ci * 7919 + w;
      uint64_t want = MIN (quota - (crashcheck_stats.images - first), 150);
      struct crashsim count = { .mode = CRASHSIM_COUNT };
      struct crashsim s = {
        .mode = CRASHSIM_SAMPLE, .rng = { wseed }, .per_point = 3,
        .images_left = want,
      };
      struct wl_op *ops;
      size_t nops, failed_op;

      /* Spread the crash points over the whole workload. */
      wl_generate (cfg, wseed, &ops, &nops);
      crashsim_run (&count, cfg, wseed, ops, nops, &failed_op);
      s.p = (double) want / s.per_point / MAX (count.calls, 1);
      crashcheck_stats.workloads++;
      if (crashsim_run (&s, cfg, wseed, ops, nops, &failed_op)) {
        struct repro rp = {
          .cfg = cfg, .seed = wseed, .ops = ops, .nops = failed_op + 1,
          .crash_at = s.fail_at, .keep = s.fail_keep,
          .npieces = s.fail_npieces, .f = s.f,
        };
        fprintf (stderr, "FAIL: %s (workload seed %" PRIu64 "): %s: %s\n",
                 cfg->name, wseed, s.f.cls, s.f.why);
        shrink (&rp, 120);
        repro_save (&rp);
        free (rp.keep);
        free (rp.ops);
        failures++;
        break;
      }
      free (ops);
    }
    printf ("%-32s %3u workloads %6" PRIu64 " images (%" PRIu64 " dirty, %"
            PRIu64 " with leaks) %4" PRIu64 " qemu-img checks %4lds\n",
            cfg->name, w, crashcheck_stats.images - first, crashcheck_stats.dirty - dirty0,
            crashcheck_stats.leaky - leaky0, crashcheck_stats.qemu + crashcheck_stats.qemu_after - qemu0,
            (long) (time (NULL) - t0));
    fflush (stdout);
  }
  printf ("crash-sim: %" PRIu64 " crash images at %" PRIu64 " points of %"
          PRIu64 " workloads; %" PRIu64 " qemu-img checks of crash images, %"
          PRIu64 " after repair, %" PRIu64 " repairs of dirty ones; %u "
          "failures; %lds\n", crashcheck_stats.images,
          crashcheck_stats.points, crashcheck_stats.workloads, crashcheck_stats.qemu, crashcheck_stats.qemu_after,
          crashcheck_stats.qemu_repairs, failures, (long) (time (NULL) - start));
  printf ("crash-sim: %" PRIu64 " images of a process killed after a flush; "
          "leaks at most %" PRIu64 " clusters of the %" PRIu64 " allowed\n",
          crashcheck_stats.kill_checks, crashcheck_stats.kill_leaks_max,
          crashcheck_stats.kill_leaks_limit);
  return failures ? EXIT_FAILURE : EXIT_SUCCESS;
}
