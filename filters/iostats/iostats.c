/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit iostats filter: per-operation counts, bytes, times, latency
 * percentiles and errors by errno, written as text or JSON when nbdkit
 * exits and, optionally, every few seconds while it serves.
 *
 * One set of counters for all connections, under one mutex: a request
 * holds it only to add its outcome.  Latencies go into a fixed
 * log-linear histogram, so memory does not grow with the number of
 * requests.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "boolword.h"
#include "errstr.h"
#include "lock.h"

enum iostats_op {
  OP_READ, OP_WRITE, OP_TRIM, OP_ZERO, OP_EXTENTS, OP_CACHE, OP_FLUSH,
  NR_OPS
};

/* In the order of nbdkit's stats filter. */
static const char *const op_names[NR_OPS] = {
  "read", "write", "trim", "zero", "extents", "cache", "flush"
};

/* Histogram of latencies in nanoseconds: one bucket per value below
 * 2^SUB_BITS, then 2^SUB_BITS buckets per power of two up to 2^64.  A
 * bucket is at most 1/32 of its lower bound wide, so its middle is
 * within 1/64 (1.6%) of any value in it.
 */
#define SUB_BITS 5
#define SUB_COUNT (1u << SUB_BITS)
#define NR_BUCKETS ((64 - SUB_BITS + 1) * SUB_COUNT)

/* errno values have a slot each; slot 0 is for values out of range. */
#define ERRNO_SLOTS 256

struct op_stats {
  uint64_t count;               /* requests that succeeded */
  uint64_t bytes;               /* ... their bytes */
  uint64_t fua;                 /* ... those with the FUA flag */
  uint64_t total_ns;            /* ... their time */
  uint64_t max_ns;
  uint64_t hist[NR_BUCKETS];
  uint64_t errors[ERRNO_SLOTS]; /* requests that failed, by errno */
};

struct stats {
  struct op_stats op[NR_OPS];
  /* Zero requests by the fast-zero flag ([1] with it): successes and
   * failures by errno, ENOTSUP meaning a fast zero was refused.
   */
  uint64_t zero_ok[2];
  uint64_t zero_errors[2][ERRNO_SLOTS];
};

static struct lock stats_lock = LOCK_INITIALIZER;
static struct stats stats TSA_GUARDED_BY (stats_lock);

/* Parameters. */
static char *filename;          /* NULL: standard error */
static bool append;
static bool json;
static uint64_t interval_ns;    /* 0: only at exit */

static FILE *fp;
static uint64_t start_ns;

/* Reports are written from the interval thread and at unload: one at a
 * time, each from its own copy of the counters taken under stats_lock.
 */
static struct lock report_lock = LOCK_INITIALIZER;
static struct stats snap TSA_GUARDED_BY (report_lock);
static bool reported TSA_GUARDED_BY (report_lock);

/* The interval thread. */
static pthread_t ticker;
static bool ticker_running;
static struct lock ticker_lock = LOCK_INITIALIZER;
static pthread_cond_t ticker_cond;
static bool ticker_stop TSA_GUARDED_BY (ticker_lock);

static uint64_t
iostats_now (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static unsigned
iostats_bucket (uint64_t ns)
{
  unsigned e;

  if (ns < SUB_COUNT)
    return ns;
  e = 63 - __builtin_clzll (ns);
  return (e - SUB_BITS + 1) * SUB_COUNT
    + (unsigned) (ns >> (e - SUB_BITS)) - SUB_COUNT;
}

/* Returns the middle of bucket b, the value reported for a percentile
 * there.
 */
static uint64_t
iostats_bucket_value (unsigned b)
{
  unsigned k = b / SUB_COUNT;
  uint64_t width;

  if (k == 0)
    return b;
  width = UINT64_C (1) << (k - 1);
  return (SUB_COUNT + b % SUB_COUNT) * width + width / 2;
}

/* Returns the nearest-rank percentile p (0 < p <= 100): the bucket holding
 * the ceil(p% * count)-th smallest latency, never above the largest seen.
 */
static uint64_t
iostats_percentile (const struct op_stats *s, unsigned p)
{
  uint64_t rank = (s->count * p + 99) / 100, seen = 0, v;
  unsigned b;

  if (s->count == 0)
    return 0;
  for (b = 0; b < NR_BUCKETS; b++) {
    seen += s->hist[b];
    if (seen >= rank)
      break;
  }
  v = iostats_bucket_value (b);
  return v < s->max_ns ? v : s->max_ns;
}

static unsigned
iostats_errno_slot (int err)
{
  return err > 0 && err < ERRNO_SLOTS ? (unsigned) err : 0;
}

/* NBD's names: Linux calls ENOTSUP EOPNOTSUPP. */
static const char *
iostats_errno_name (unsigned slot)
{
  const char *s;

  if (slot == ENOTSUP)
    return "ENOTSUP";
  s = slot ? strerrorname_np (slot) : NULL;
  return s ? s : "unknown";
}

/* *err is read only for a failed request: it is not set otherwise. */
static void
iostats_record (enum iostats_op op, uint64_t start, int r, const int *err,
                uint64_t bytes, uint32_t flags)
  TSA_EXCLUDES (stats_lock)
{
  uint64_t ns = iostats_now () - start;
  unsigned slot = r == 0 ? 0 : iostats_errno_slot (*err);
  bool fast = flags & NBDKIT_FLAG_FAST_ZERO;

  /* Each access is to stats itself, not through a pointer: clang checks
   * it is under the lock.
   */
  lock_acquire (&stats_lock);
  if (r == 0) {
    stats.op[op].count++;
    stats.op[op].bytes += bytes;
    stats.op[op].total_ns += ns;
    if (ns > stats.op[op].max_ns)
      stats.op[op].max_ns = ns;
    stats.op[op].hist[iostats_bucket (ns)]++;
    if (flags & NBDKIT_FLAG_FUA)
      stats.op[op].fua++;
  }
  else
    stats.op[op].errors[slot]++;
  if (op == OP_ZERO) {
    if (r == 0)
      stats.zero_ok[fast]++;
    else
      stats.zero_errors[fast][slot]++;
  }
  lock_release (&stats_lock);
}

static uint64_t
iostats_sum (const uint64_t *v, size_t n)
{
  uint64_t t = 0;
  size_t i;

  for (i = 0; i < n; i++)
    t += v[i];
  return t;
}

static double
iostats_secs (uint64_t ns)
{
  return ns / 1e9;
}

/* "12.50 MiB", as nbdkit's stats filter writes sizes and rates. */
static void
iostats_human (char *buf, size_t len, double bytes)
{
  static const char *const units[] = { "KiB", "MiB", "GiB", "TiB" };
  int i = -1;

  while (bytes >= 1024 && i < 3) {
    bytes /= 1024;
    i++;
  }
  if (i < 0)
    snprintf (buf, len, "%.0f bytes", bytes);
  else
    snprintf (buf, len, "%.2f %s", bytes, units[i]);
}

/* "EIO 2, ENOSPC 1" (text) or "\"EIO\": 2, \"ENOSPC\": 1" (JSON),
 * leaving out the slot skip (ERRNO_SLOTS: none).
 */
static void
iostats_print_errors (const uint64_t *errors, bool as_json, unsigned skip)
{
  const char *sep = "";
  unsigned i;

  for (i = 0; i < ERRNO_SLOTS; i++) {
    if (errors[i] == 0 || i == skip)
      continue;
    fprintf (fp, as_json ? "%s\"%s\": %" PRIu64 : "%s%s %" PRIu64,
             sep, iostats_errno_name (i), errors[i]);
    sep = ", ";
  }
}

static void
iostats_print_text (uint64_t elapsed)
  TSA_REQUIRES (report_lock)
{
  char size[32], oprate[32], rate[32];
  unsigned i;

  fprintf (fp, "elapsed time: %.6f s\n", iostats_secs (elapsed));
  for (i = 0; i < NR_OPS; i++) {
    const struct op_stats *s = &snap.op[i];
    uint64_t nerrors = iostats_sum (s->errors, ERRNO_SLOTS);

    if (s->count == 0 && nerrors == 0)
      continue;
    fprintf (fp, "%s: %" PRIu64 " ops, %.6f s", op_names[i], s->count,
             iostats_secs (s->total_ns));
    if (i != OP_FLUSH) {
      iostats_human (size, sizeof size, s->bytes);
      iostats_human (oprate, sizeof oprate,
                     s->total_ns ? s->bytes / iostats_secs (s->total_ns) : 0);
      iostats_human (rate, sizeof rate,
                     elapsed ? s->bytes / iostats_secs (elapsed) : 0);
      fprintf (fp, ", %" PRIu64 " bytes", s->bytes);
      if (s->bytes >= 1024)
        fprintf (fp, " (%s)", size);
      fprintf (fp, ", %s/s op, %s/s total", oprate, rate);
    }
    fputc ('\n', fp);
    if (s->count)
      fprintf (fp, "  latency: mean %.6f s, p50 %.6f s, p90 %.6f s, "
               "p99 %.6f s, max %.6f s\n",
               iostats_secs (s->total_ns / s->count),
               iostats_secs (iostats_percentile (s, 50)),
               iostats_secs (iostats_percentile (s, 90)),
               iostats_secs (iostats_percentile (s, 99)),
               iostats_secs (s->max_ns));
    if (s->fua)
      fprintf (fp, "  fua: %" PRIu64 " ops\n", s->fua);
    if (nerrors) {
      fputs ("  errors: ", fp);
      iostats_print_errors (s->errors, false, ERRNO_SLOTS);
      fputc ('\n', fp);
    }
    if (i == OP_ZERO) {
      int fast;

      for (fast = 1; fast >= 0; fast--) {
        if (snap.zero_ok[fast] == 0 &&
            iostats_sum (snap.zero_errors[fast], ERRNO_SLOTS) == 0)
          continue;
        fprintf (fp, "  %s: %" PRIu64 " ok", fast ? "fast" : "slow",
                 snap.zero_ok[fast]);
        if (iostats_sum (snap.zero_errors[fast], ERRNO_SLOTS)) {
          fputs (", ", fp);
          iostats_print_errors (snap.zero_errors[fast], false, ERRNO_SLOTS);
        }
        fputc ('\n', fp);
      }
    }
  }
}

/* One line per report, so that a file of reports parses line by line. */
static void
iostats_print_json (uint64_t elapsed, bool final)
  TSA_REQUIRES (report_lock)
{
  unsigned i;

  fprintf (fp, "{\"elapsed\": %.9f, \"final\": %s, \"ops\": {",
           iostats_secs (elapsed), final ? "true" : "false");
  for (i = 0; i < NR_OPS; i++) {
    const struct op_stats *s = &snap.op[i];

    fprintf (fp, "%s\"%s\": {\"count\": %" PRIu64 ", \"bytes\": %" PRIu64
             ", \"total_s\": %.9f, \"mean_s\": %.9f, \"p50_s\": %.9f"
             ", \"p90_s\": %.9f, \"p99_s\": %.9f, \"max_s\": %.9f",
             i ? ", " : "", op_names[i], s->count, s->bytes,
             iostats_secs (s->total_ns),
             iostats_secs (s->count ? s->total_ns / s->count : 0),
             iostats_secs (iostats_percentile (s, 50)),
             iostats_secs (iostats_percentile (s, 90)),
             iostats_secs (iostats_percentile (s, 99)),
             iostats_secs (s->max_ns));
    if (i == OP_WRITE || i == OP_TRIM || i == OP_ZERO)
      fprintf (fp, ", \"fua\": %" PRIu64, s->fua);
    fputs (", \"errors\": {", fp);
    iostats_print_errors (s->errors, true, ERRNO_SLOTS);
    fputc ('}', fp);
    if (i == OP_ZERO) {
      int fast;

      for (fast = 1; fast >= 0; fast--) {
        /* ENOTSUP always present: scripts compare it without a default. */
        fprintf (fp, ", \"%s\": {\"ok\": %" PRIu64 ", \"ENOTSUP\": %" PRIu64,
                 fast ? "fast" : "slow", snap.zero_ok[fast],
                 snap.zero_errors[fast][ENOTSUP]);
        if (iostats_sum (snap.zero_errors[fast], ERRNO_SLOTS)
            > snap.zero_errors[fast][ENOTSUP]) {
          fputs (", ", fp);
          iostats_print_errors (snap.zero_errors[fast], true, ENOTSUP);
        }
        fputc ('}', fp);
      }
    }
    fputc ('}', fp);
  }
  fputs ("}}\n", fp);
}

static void
iostats_report (bool final)
  TSA_EXCLUDES (report_lock, stats_lock)
{
  uint64_t elapsed = iostats_now () - start_ns;

  lock_acquire (&report_lock);
  lock_acquire (&stats_lock);
  snap = stats;
  lock_release (&stats_lock);

  /* Text reports in one file are apart by a blank line. */
  if (reported && !json)
    fputc ('\n', fp);
  reported = true;
  if (json)
    iostats_print_json (elapsed, final);
  else
    iostats_print_text (elapsed);
  if (fflush (fp) == EOF)
    nbdkit_error ("iostats: writing %s: %s",
                  filename ? filename : "standard error", errstr (errno));
  lock_release (&report_lock);
}

static void *
iostats_ticker (void *arg)
  TSA_EXCLUDES (ticker_lock)
{
  uint64_t now, next;
  struct timespec deadline;

  lock_acquire (&ticker_lock);
  for (;;) {
    /* The next point of a grid from the start, so that reports do not
     * drift; one that took longer than the interval skips points
     * rather than bursting.
     */
    now = iostats_now ();
    next = now + interval_ns - (now - start_ns) % interval_ns;
    deadline.tv_sec = next / 1000000000;
    deadline.tv_nsec = next % 1000000000;
    while (!ticker_stop &&
           !lock_wait_until (&ticker_lock, &ticker_cond, &deadline))
      ;
    if (ticker_stop)
      break;
    lock_release (&ticker_lock);
    iostats_report (false);
    lock_acquire (&ticker_lock);
  }
  lock_release (&ticker_lock);
  return NULL;
}

static int
iostats_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                const char *key, const char *value)
{
  int r;

  if (strcmp (key, "iostats-file") == 0) {
    free (filename);
    /* Absolute: nbdkit changes directory when it forks. */
    filename = nbdkit_absolute_path (value);
    return filename ? 0 : -1;
  }
  if (strcmp (key, "iostats-append") == 0) {
    r = bool_word (value);
    if (r == -1) {
      nbdkit_error ("iostats-append=%s: expected true or false", value);
      return -1;
    }
    append = r;
    return 0;
  }
  if (strcmp (key, "iostats-format") == 0) {
    if (strcmp (value, "text") == 0)
      json = false;
    else if (strcmp (value, "json") == 0)
      json = true;
    else {
      nbdkit_error ("iostats-format=%s: expected text or json", value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "iostats-interval") == 0) {
    char *end;
    double secs;

    errno = 0;
    secs = strtod (value, &end);
    /* Up to a year: any longer is no interval, and overflows nothing. */
    if (errno || end == value || *end || !(secs >= 0 && secs <= 31536000)) {
      nbdkit_error ("iostats-interval=%s: expected a number of seconds "
                    "from 0 to 31536000", value);
      return -1;
    }
    interval_ns = secs * 1e9;
    if (secs > 0 && interval_ns < 1000000) {
      nbdkit_error ("iostats-interval=%s: the shortest interval is "
                    "0.001 s", value);
      return -1;
    }
    return 0;
  }
  return next (nxdata, key, value);
}

#define iostats_config_help \
  "iostats-file=<FILE>       Where to write the statistics (default stderr).\n" \
  "iostats-append=<BOOL>     Append to the file (default false: replace it).\n" \
  "iostats-format=text|json  Output format (default text).\n" \
  "iostats-interval=<SECS>   Also report every SECS seconds (default 0: at exit only)."

/* The file is opened before nbdkit forks and changes directory, where
 * an error still reaches the user; the clock starts here too.
 */
static int
iostats_get_ready (int thread_model)
{
  if (filename) {
    int fd = open (filename, O_WRONLY | O_CREAT | O_CLOEXEC |
                   (append ? O_APPEND : O_TRUNC), 0666);

    if (fd == -1) {
      nbdkit_error ("iostats-file=%s: %s", filename, errstr (errno));
      return -1;
    }
    fp = fdopen (fd, append ? "a" : "w");
    if (fp == NULL) {
      nbdkit_error ("iostats-file=%s: %s", filename, errstr (errno));
      close (fd);
      return -1;
    }
  }
  else
    fp = stderr;
  start_ns = iostats_now ();
  return 0;
}

/* The thread must start after the fork into the background, which it
 * would not survive.
 */
static int
iostats_after_fork (nbdkit_backend *backend)
{
  int err;

  if (interval_ns == 0)
    return 0;
  lock_cond_init (&ticker_cond);
  err = pthread_create (&ticker, NULL, iostats_ticker, NULL);
  if (err) {
    nbdkit_error ("iostats: starting the interval thread: %s", errstr (err));
    return -1;
  }
  ticker_running = true;
  return 0;
}

static void
iostats_cleanup (nbdkit_backend *backend)
  TSA_EXCLUDES (ticker_lock)
{
  if (!ticker_running)
    return;
  lock_acquire (&ticker_lock);
  ticker_stop = true;
  pthread_cond_signal (&ticker_cond);
  lock_release (&ticker_lock);
  pthread_join (ticker, NULL);
  ticker_running = false;
}

static void
iostats_unload (void)
{
  if (fp) {
    iostats_report (true);
    if (fp != stderr)
      fclose (fp);
  }
  free (filename);
}

static int
iostats_pread (nbdkit_next *next, void *handle, void *buf, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  uint64_t start = iostats_now ();
  int r = next->pread (next, buf, count, offset, flags, err);

  iostats_record (OP_READ, start, r, err, count, flags);
  return r;
}

static int
iostats_pwrite (nbdkit_next *next, void *handle, const void *buf,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  uint64_t start = iostats_now ();
  int r = next->pwrite (next, buf, count, offset, flags, err);

  iostats_record (OP_WRITE, start, r, err, count, flags);
  return r;
}

static int
iostats_trim (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  uint64_t start = iostats_now ();
  int r = next->trim (next, count, offset, flags, err);

  iostats_record (OP_TRIM, start, r, err, count, flags);
  return r;
}

static int
iostats_zero (nbdkit_next *next, void *handle, uint32_t count,
              uint64_t offset, uint32_t flags, int *err)
{
  uint64_t start = iostats_now ();
  int r = next->zero (next, count, offset, flags, err);

  iostats_record (OP_ZERO, start, r, err, count, flags);
  return r;
}

/* The bytes of an extents request are those asked about, as in
 * nbdkit's stats filter.
 */
static int
iostats_extents (nbdkit_next *next, void *handle, uint32_t count,
                 uint64_t offset, uint32_t flags,
                 struct nbdkit_extents *extents, int *err)
{
  uint64_t start = iostats_now ();
  int r = next->extents (next, count, offset, flags, extents, err);

  iostats_record (OP_EXTENTS, start, r, err, count, flags);
  return r;
}

static int
iostats_cache (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  uint64_t start = iostats_now ();
  int r = next->cache (next, count, offset, flags, err);

  iostats_record (OP_CACHE, start, r, err, count, flags);
  return r;
}

static int
iostats_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  uint64_t start = iostats_now ();
  int r = next->flush (next, flags, err);

  iostats_record (OP_FLUSH, start, r, err, 0, flags);
  return r;
}

static struct nbdkit_filter filter = {
  .name = "iostats",
  .longname = "nbdkit iostats filter",
  .config = iostats_config,
  .config_help = iostats_config_help,
  .get_ready = iostats_get_ready,
  .after_fork = iostats_after_fork,
  .cleanup = iostats_cleanup,
  .unload = iostats_unload,
  .pread = iostats_pread,
  .pwrite = iostats_pwrite,
  .trim = iostats_trim,
  .zero = iostats_zero,
  .extents = iostats_extents,
  .cache = iostats_cache,
  .flush = iostats_flush,
};

NBDKIT_REGISTER_FILTER (filter)
