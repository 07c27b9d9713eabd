/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit latency filter: delays each kind of request by its own time,
 * optionally varied by a seeded jitter, to try clients and other
 * filters against slow storage.  Sleeps hold no lock and end early
 * when the client goes away or nbdkit shuts down.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "boolword.h"
#include "lock.h"

/* -D latency.verbose=1: log every delay as it starts. */
NBDKIT_DLL_PUBLIC int latency_debug_verbose = 0;

#define NS_PER_S UINT64_C(1000000000)

/* A day: longer is surely a mistake, and keeps the arithmetic (and
 * nbdkit_nanosleep's seconds) far from overflow.
 */
#define MAX_DELAY_S 86400

enum latency_op {
  OP_READ, OP_WRITE, OP_ZERO, OP_TRIM, OP_EXTENTS, OP_CACHE, OP_FLUSH,
  OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
  "read", "write", "zero", "trim", "extents", "cache", "flush",
};

static uint64_t delay_ns[OP_COUNT];
static unsigned jitter_percent;
static bool seed_given;
static uint64_t seed;
static bool fast_zero_waits = true;

/* xoshiro256**, shared by all connections: with one client sending
 * one request at a time, a given seed gives the same delays.
 */
static struct lock rng_lock = LOCK_INITIALIZER;
static uint64_t rng[4] TSA_GUARDED_BY (rng_lock);

static uint64_t
latency_rotl (uint64_t x, int k)
{
  return (x << k) | (x >> (64 - k));
}

static uint64_t
latency_rng_next (void)
  TSA_REQUIRES (rng_lock)
{
  const uint64_t result = latency_rotl (rng[1] * 5, 7) * 9;
  const uint64_t t = rng[1] << 17;

  rng[2] ^= rng[0];
  rng[3] ^= rng[1];
  rng[1] ^= rng[2];
  rng[0] ^= rng[3];
  rng[2] ^= t;
  rng[3] = latency_rotl (rng[3], 45);
  return result;
}

/* splitmix64 spreads the seed over the whole state, as xoshiro's
 * authors advise (an all-zero state would stay zero).  Before any
 * connection, but under the lock all the same: the one rule for rng.
 */
static void
latency_rng_seed (uint64_t s)
  TSA_EXCLUDES (rng_lock)
{
  uint64_t z;
  int i;

  lock_acquire (&rng_lock);
  for (i = 0; i < 4; i++) {
    z = (s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    rng[i] = z ^ (z >> 31);
  }
  lock_release (&rng_lock);
}

/* Parses VALUE for KEY into *NS, at most a day: digits with an optional
 * fraction, then the unit: s (also when none is given), ms or us.
 */
static int
latency_parse_duration (const char *key, const char *value, uint64_t *ns)
{
  const char *p = value;
  uint64_t whole = 0, frac = 0, frac_scale = 1, unit;
  bool digits = false;

  for (; *p >= '0' && *p <= '9'; p++) {
    if (whole > MAX_DELAY_S * UINT64_C(1000000))
      goto too_long;
    whole = whole * 10 + (*p - '0');
    digits = true;
  }
  if (*p == '.') {
    p++;
    if (!(*p >= '0' && *p <= '9'))
      goto bad;
    /* Digits below a nanosecond cannot matter. */
    for (; *p >= '0' && *p <= '9'; p++) {
      if (frac_scale < NS_PER_S) {
        frac = frac * 10 + (*p - '0');
        frac_scale *= 10;
      }
      digits = true;
    }
  }
  if (!digits)
    goto bad;
  if (*p == '\0' || strcmp (p, "s") == 0)
    unit = NS_PER_S;
  else if (strcmp (p, "ms") == 0)
    unit = 1000000;
  else if (strcmp (p, "us") == 0)
    unit = 1000;
  else
    goto bad;

  if (whole > MAX_DELAY_S * NS_PER_S / unit)
    goto too_long;
  *ns = whole * unit + frac * unit / frac_scale;
  if (*ns > MAX_DELAY_S * NS_PER_S)
    goto too_long;
  return 0;

 bad:
  nbdkit_error ("%s: cannot parse '%s' as a delay: expected a number "
                "of seconds, or a number followed by s, ms or us "
                "(e.g. 1.5, 3s, 10ms, 250us)", key, value);
  return -1;
 too_long:
  nbdkit_error ("%s: delay '%s' is longer than the limit of %d s",
                key, value, MAX_DELAY_S);
  return -1;
}

/* Parses VALUE as a decimal number from 0 to MAX, digits only, into *R.
 * Returns 0, or -1 if it is not one.  (Not nbdkit_parse_*: their message
 * for a number out of range goes through strerror, which under
 * AddressSanitizer can leave glibc's locale lock held, and nbdkit then
 * hangs at exit.)
 */
static int
latency_parse_number (const char *value, uint64_t max, uint64_t *r)
{
  const char *p;
  uint64_t n = 0;
  unsigned d;

  if (*value == '\0')
    return -1;
  for (p = value; *p; p++) {
    if (*p < '0' || *p > '9')
      return -1;
    d = *p - '0';
    if (n > (max - d) / 10)
      return -1;
    n = n * 10 + d;
  }
  *r = n;
  return 0;
}

/* latency-jitter=PERCENT: a whole number from 0 to 100, with or
 * without a final '%'.
 */
static int
latency_parse_jitter (const char *key, const char *value)
{
  char num[8];
  size_t len = strlen (value);
  uint64_t r;

  if (len > 0 && value[len - 1] == '%')
    len--;
  if (len >= sizeof num)
    goto bad;
  memcpy (num, value, len);
  num[len] = '\0';
  if (latency_parse_number (num, 100, &r) == -1)
    goto bad;
  jitter_percent = r;
  return 0;

 bad:
  nbdkit_error ("%s: '%s' is not a percentage from 0 to 100",
                key, value);
  return -1;
}

static int
latency_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                const char *key, const char *value)
{
  uint64_t ns;
  int i, r;

  if (strncmp (key, "latency-", 8) == 0) {
    const char *what = key + 8;

    for (i = 0; i < OP_COUNT; i++) {
      if (strcmp (what, op_names[i]) == 0)
        return latency_parse_duration (key, value, &delay_ns[i]);
    }
    if (strcmp (what, "writes") == 0) {
      if (latency_parse_duration (key, value, &ns) == -1)
        return -1;
      delay_ns[OP_WRITE] = delay_ns[OP_ZERO] = delay_ns[OP_TRIM] = ns;
      return 0;
    }
    if (strcmp (what, "jitter") == 0)
      return latency_parse_jitter (key, value);
    if (strcmp (what, "seed") == 0) {
      if (latency_parse_number (value, UINT64_MAX, &seed) == -1) {
        nbdkit_error ("%s: '%s' is not a number from 0 to %" PRIu64,
                      key, value, UINT64_MAX);
        return -1;
      }
      seed_given = true;
      return 0;
    }
    if (strcmp (what, "fast-zero") == 0) {
      r = bool_word (value);
      if (r == -1) {
        nbdkit_error ("%s: expected true or false, not '%s'", key, value);
        return -1;
      }
      fast_zero_waits = r;
      return 0;
    }
  }
  return next (nxdata, key, value);
}

#define latency_config_help \
  "latency-read=<TIME>        Delay of each read (e.g. 3s, 10ms, 250us).\n" \
  "latency-write=<TIME>       Delay of each write.\n" \
  "latency-zero=<TIME>        Delay of each zero.\n" \
  "latency-trim=<TIME>        Delay of each trim.\n" \
  "latency-extents=<TIME>     Delay of each block status request.\n" \
  "latency-cache=<TIME>       Delay of each cache request.\n" \
  "latency-flush=<TIME>       Delay of each flush.\n" \
  "latency-writes=<TIME>      Write, zero and trim delays (not flush).\n" \
  "latency-jitter=<PERCENT>   Vary each delay by up to PERCENT (0-100).\n" \
  "latency-seed=<N>           Seed of the jitter, for repeatable runs.\n" \
  "latency-fast-zero=<BOOL>   Fast zeroes wait (true, the default) or\n" \
  "                           fail at once with ENOTSUP (false)."

static int
latency_config_complete (nbdkit_next_config_complete *next,
                         nbdkit_backend *nxdata)
{
  struct timespec now;

  if (jitter_percent > 0) {
    if (!seed_given) {
      clock_gettime (CLOCK_REALTIME, &now);
      seed = (uint64_t) now.tv_sec * NS_PER_S + now.tv_nsec;
      seed ^= (uint64_t) getpid () << 32;
    }
    /* So that a run with surprising delays can be repeated. */
    nbdkit_debug ("latency: jitter %u%%, latency-seed=%" PRIu64,
                  jitter_percent, seed);
    latency_rng_seed (seed);
  }
  return next (nxdata);
}

/* Sleep for OP's delay, jittered; fails (ESHUTDOWN) if the client
 * disconnects or nbdkit shuts down meanwhile.
 */
static int
latency_sleep (enum latency_op op, int *err)
  TSA_EXCLUDES (rng_lock)
{
  uint64_t ns = delay_ns[op], span;

  if (ns == 0)
    return 0;
  if (jitter_percent > 0) {
    span = ns * jitter_percent / 100;
    lock_acquire (&rng_lock);
    ns = ns - span + latency_rng_next () % (2 * span + 1);
    lock_release (&rng_lock);
  }
  if (latency_debug_verbose)
    nbdkit_debug ("latency: %s: delay %" PRIu64 ".%09" PRIu64 " s",
                  op_names[op], ns / NS_PER_S, ns % NS_PER_S);
  if (nbdkit_nanosleep (ns / NS_PER_S, ns % NS_PER_S) == -1) {
    *err = errno;
    return -1;
  }
  return 0;
}

/* Where the layer below emulates zero or cache, nbdkit would do it at
 * this level with writes or reads, delayed as such: say native, and
 * let next->zero and next->cache emulate them below, after the zero
 * or cache delay.
 */
static int
latency_can_zero (nbdkit_next *next, void *handle)
{
  int r = next->can_zero (next);

  return r == NBDKIT_ZERO_EMULATE ? NBDKIT_ZERO_NATIVE : r;
}

static int
latency_can_cache (nbdkit_next *next, void *handle)
{
  int r = next->can_cache (next);

  return r == NBDKIT_CACHE_EMULATE ? NBDKIT_CACHE_NATIVE : r;
}

/* latency-fast-zero=false: fast zeroes fail at once, which the
 * plugin need not support.
 */
static int
latency_can_fast_zero (nbdkit_next *next, void *handle)
{
  if (delay_ns[OP_ZERO] > 0 && !fast_zero_waits)
    return 1;
  return next->can_fast_zero (next);
}

static int
latency_pread (nbdkit_next *next, void *handle, void *buf,
               uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  if (latency_sleep (OP_READ, err) == -1)
    return -1;
  return next->pread (next, buf, count, offset, flags, err);
}

static int
latency_pwrite (nbdkit_next *next, void *handle, const void *buf,
                uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  if (latency_sleep (OP_WRITE, err) == -1)
    return -1;
  return next->pwrite (next, buf, count, offset, flags, err);
}

static int
latency_zero (nbdkit_next *next, void *handle,
              uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  if ((flags & NBDKIT_FLAG_FAST_ZERO) && delay_ns[OP_ZERO] > 0 &&
      !fast_zero_waits) {
    *err = ENOTSUP;
    return -1;
  }
  if (latency_sleep (OP_ZERO, err) == -1)
    return -1;
  return next->zero (next, count, offset, flags, err);
}

static int
latency_trim (nbdkit_next *next, void *handle,
              uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  if (latency_sleep (OP_TRIM, err) == -1)
    return -1;
  return next->trim (next, count, offset, flags, err);
}

static int
latency_extents (nbdkit_next *next, void *handle,
                 uint32_t count, uint64_t offset, uint32_t flags,
                 struct nbdkit_extents *extents, int *err)
{
  if (latency_sleep (OP_EXTENTS, err) == -1)
    return -1;
  return next->extents (next, count, offset, flags, extents, err);
}

static int
latency_cache (nbdkit_next *next, void *handle,
               uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  if (latency_sleep (OP_CACHE, err) == -1)
    return -1;
  return next->cache (next, count, offset, flags, err);
}

static int
latency_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  if (latency_sleep (OP_FLUSH, err) == -1)
    return -1;
  return next->flush (next, flags, err);
}

static struct nbdkit_filter filter = {
  .name              = "latency",
  .longname          = "nbdkit latency filter",
  .config            = latency_config,
  .config_complete   = latency_config_complete,
  .config_help       = latency_config_help,
  .can_zero          = latency_can_zero,
  .can_fast_zero     = latency_can_fast_zero,
  .can_cache         = latency_can_cache,
  .pread             = latency_pread,
  .pwrite            = latency_pwrite,
  .zero              = latency_zero,
  .trim              = latency_trim,
  .extents           = latency_extents,
  .cache             = latency_cache,
  .flush             = latency_flush,
};

NBDKIT_REGISTER_FILTER (filter)
