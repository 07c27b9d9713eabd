/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit flush-coalesce filter: a flush with nothing new to make
 * durable returns at once, and flushes that arrive together share one
 * flush of the plugin.
 *
 * Writes, zeroes and trims are counted as they complete, under one
 * mutex, so the count orders them.  A client flush must cover the
 * writes completed when it arrives: the first `need` of them.  A plugin
 * flush covers the writes completed when it started: the first `gen`.
 * So a client flush can use a plugin flush that succeeded, or wait for
 * one in progress, whose gen >= need; otherwise it starts its own once
 * the one in progress (which started too early for it) ends.  Writes
 * still in progress when a flush arrives need not be covered: the
 * client has no reply for them yet.
 *
 * One plugin flush covers the writes of every connection only if the
 * plugin says so (multi-conn); otherwise each connection coalesces
 * its own flushes only.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "boolword.h"
#include "errstr.h"
#include "lock.h"

/* One plugin flush, shared by the client flushes waiting on it; freed
 * by the last of them (or the flush that started it) to read its result.
 */
struct round {
  uint64_t gen;                 /* writes completed when it started */
  bool done;
  int err;                      /* when done: 0 if it succeeded */
  unsigned refs;
};

/* The writes that one plugin flush makes durable. */
struct domain {
  bool used;                    /* a slot of domains[] in use */
  uint64_t completed;           /* writes, zeroes and trims completed */
  uint64_t durable;             /* the first `durable` of them are durable */
  struct round *current;        /* the plugin flush in progress, or NULL */
};

struct handle {
  size_t domain;                /* its domain: a slot of domains[] */
};

static bool fua_by_flush;       /* coalesce-fua=true */

/* The state below is under this lock, and kept in variables at file
 * scope, which clang checks every access to (it cannot check a field
 * of a connection's handle): the domains are slots of one table,
 * domains[0] shared by every connection (the plugin is multi-conn),
 * the others each a connection's own, reused once it closes.  A round
 * is reached through its domain or by its waiters, under the lock too
 * (clang does not see its fields).
 */
static struct lock lock = LOCK_INITIALIZER;
static pthread_cond_t round_done = PTHREAD_COND_INITIALIZER;
static struct domain *domains TSA_GUARDED_BY (lock) TSA_PT_GUARDED_BY (lock);
static size_t ndomains TSA_GUARDED_BY (lock);

static uint64_t flushes_received TSA_GUARDED_BY (lock); /* client flushes */
static uint64_t fua_received TSA_GUARDED_BY (lock); /* FUA turned into them */
static uint64_t at_once TSA_GUARDED_BY (lock); /* ... returned at once */
static uint64_t joined TSA_GUARDED_BY (lock); /* ... used another's flush */
static uint64_t issued TSA_GUARDED_BY (lock); /* plugin flushes */
static uint64_t issued_failed TSA_GUARDED_BY (lock);

static int
coalesce_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                 const char *key, const char *value)
{
  if (strcmp (key, "coalesce-fua") == 0) {
    int r = bool_word (value);

    if (r == -1) {
      nbdkit_error ("coalesce-fua=%s: expected true or false", value);
      return -1;
    }
    fua_by_flush = r;
    return 0;
  }
  return next (nxdata, key, value);
}

#define coalesce_config_help \
  "coalesce-fua=<BOOL>  Turn FUA requests into a write and a coalesced\n" \
  "                     flush (default false: pass FUA to the plugin)."

static void
coalesce_unload (void)
  TSA_EXCLUDES (lock)
{
  lock_acquire (&lock);
  nbdkit_debug ("flush-coalesce: %" PRIu64 " flushes and %" PRIu64
                " FUA requests received; %" PRIu64 " returned at once, %"
                PRIu64 " shared a plugin flush; %" PRIu64
                " plugin flushes issued, %" PRIu64 " failed",
                flushes_received, fua_received, at_once, joined,
                issued, issued_failed);
  free (domains);
  domains = NULL;
  ndomains = 0;
  lock_release (&lock);
}

static void *
coalesce_open (nbdkit_next_open *next, nbdkit_context *nxdata,
               int readonly, const char *exportname, int is_tls)
{
  struct handle *h;

  if (next (nxdata, readonly, exportname) == -1)
    return NULL;
  h = calloc (1, sizeof *h);
  if (h == NULL) {
    nbdkit_error ("calloc: %s", errstr (errno));
    return NULL;
  }
  return h;
}

static void
coalesce_close (void *handle)
  TSA_EXCLUDES (lock)
{
  struct handle *h = handle;

  lock_acquire (&lock);
  if (h->domain > 0)
    domains[h->domain].used = false;
  lock_release (&lock);
  free (h);
}

/* Makes room in domains[] for more (domains[0], the shared one, is
 * in use from the start).  Returns false with no memory (logged).
 */
static bool
coalesce_grow (void)
  TSA_REQUIRES (lock)
{
  size_t n = ndomains ? 2 * ndomains : 16;
  struct domain *t = realloc (domains, n * sizeof *t);

  if (t == NULL) {
    nbdkit_error ("realloc: %s", errstr (errno));
    return false;
  }
  memset (&t[ndomains], 0, (n - ndomains) * sizeof *t);
  t[0].used = true;
  domains = t;
  ndomains = n;
  return true;
}

/* Returns a connection's own domain, a free slot of domains[] (never
 * 0), or 0 with no memory for one (logged).
 */
static size_t
coalesce_new_domain (void)
  TSA_REQUIRES (lock)
{
  size_t i;

  for (i = 1; i < ndomains && domains[i].used; i++)
    ;
  if (i >= ndomains && !coalesce_grow ())
    return 0;
  domains[i] = (struct domain) { .used = true };
  return i;
}

static int
coalesce_prepare (nbdkit_next *next, void *handle, int readonly)
  TSA_EXCLUDES (lock)
{
  struct handle *h = handle;
  int r = next->can_multi_conn (next);
  bool ok;

  if (r == -1)
    return -1;
  lock_acquire (&lock);
  if (r)
    ok = ndomains > 0 || coalesce_grow ();      /* h->domain is 0 */
  else
    ok = (h->domain = coalesce_new_domain ()) > 0;
  lock_release (&lock);
  return ok ? 0 : -1;
}

/* With coalesce-fua=true and a plugin that can flush, FUA is ours to
 * do: the plugin gets the request without it, then a flush.
 */
static int
coalesce_can_fua (nbdkit_next *next, void *handle)
{
  if (fua_by_flush) {
    int r = next->can_flush (next);

    if (r == -1)
      return -1;
    if (r)
      return NBDKIT_FUA_NATIVE;
  }
  return next->can_fua (next);
}

static bool
coalesce_takes_fua (nbdkit_next *next, uint32_t flags)
{
  return fua_by_flush && (flags & NBDKIT_FLAG_FUA) &&
    next->can_flush (next) == 1;
}

static void
coalesce_unref (struct round *r)
  TSA_REQUIRES (lock)
{
  if (--r->refs == 0)
    free (r);
}

/* Make durable every write of domains[d] completed before now.  The
 * table may move while the lock is not held: d is an index.
 */
static int
coalesce_flush_domain (nbdkit_next *next, size_t d, uint32_t flags,
                       int *err)
  TSA_EXCLUDES (lock)
{
  struct round *r;
  uint64_t need;
  bool waited = false;
  int ret;

  lock_acquire (&lock);
  need = domains[d].completed;
  for (;;) {
    if (domains[d].durable >= need) {
      /* A plugin flush that ended while this one waited still counts
       * as shared.
       */
      if (waited)
        joined++;
      else
        at_once++;
      lock_release (&lock);
      return 0;
    }
    r = domains[d].current;
    if (r == NULL)
      break;
    if (r->gen >= need) {
      r->refs++;
      joined++;
      while (!r->done)
        lock_wait (&lock, &round_done);
      ret = r->err ? -1 : 0;
      if (ret == -1)
        *err = r->err;
      coalesce_unref (r);
      lock_release (&lock);
      return ret;
    }
    /* That one started too early for us: wait for its end. */
    lock_wait (&lock, &round_done);
    waited = true;
  }

  r = malloc (sizeof *r);
  if (r == NULL) {
    *err = errno;
    lock_release (&lock);
    nbdkit_error ("malloc: %s", errstr (*err));
    return -1;
  }
  r->gen = domains[d].completed;
  r->done = false;
  r->refs = 1;
  domains[d].current = r;
  issued++;
  lock_release (&lock);

  ret = next->flush (next, flags, err);

  lock_acquire (&lock);
  r->done = true;
  if (ret == 0) {
    r->err = 0;
    if (r->gen > domains[d].durable)
      domains[d].durable = r->gen;
  }
  else {
    r->err = *err ? *err : EIO;
    issued_failed++;
  }
  domains[d].current = NULL;
  pthread_cond_broadcast (&round_done);
  coalesce_unref (r);
  lock_release (&lock);
  return ret;
}

/* A write, zero or trim ended: count it, failed or not (it may have
 * changed part of the disk), then do its FUA if it is ours.
 */
static int
coalesce_completed (nbdkit_next *next, struct handle *h, int r, bool fua,
                    int *err)
  TSA_EXCLUDES (lock)
{
  lock_acquire (&lock);
  domains[h->domain].completed++;
  if (r == 0 && fua)
    fua_received++;
  lock_release (&lock);
  if (r == 0 && fua)
    return coalesce_flush_domain (next, h->domain, 0, err);
  return r;
}

static int
coalesce_pwrite (nbdkit_next *next, void *handle, const void *buf,
                 uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  bool fua = coalesce_takes_fua (next, flags);
  int r;

  if (fua)
    flags &= ~NBDKIT_FLAG_FUA;
  r = next->pwrite (next, buf, count, offset, flags, err);
  return coalesce_completed (next, handle, r, fua, err);
}

static int
coalesce_zero (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  bool fua = coalesce_takes_fua (next, flags);
  int r;

  if (fua)
    flags &= ~NBDKIT_FLAG_FUA;
  r = next->zero (next, count, offset, flags, err);
  return coalesce_completed (next, handle, r, fua, err);
}

static int
coalesce_trim (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags, int *err)
{
  bool fua = coalesce_takes_fua (next, flags);
  int r;

  if (fua)
    flags &= ~NBDKIT_FLAG_FUA;
  r = next->trim (next, count, offset, flags, err);
  return coalesce_completed (next, handle, r, fua, err);
}

static int
coalesce_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  struct handle *h = handle;

  lock_acquire (&lock);
  flushes_received++;
  lock_release (&lock);
  return coalesce_flush_domain (next, h->domain, flags, err);
}

static struct nbdkit_filter filter = {
  .name = "flush-coalesce",
  .longname = "nbdkit flush-coalesce filter",
  .config = coalesce_config,
  .config_help = coalesce_config_help,
  .unload = coalesce_unload,
  .open = coalesce_open,
  .close = coalesce_close,
  .prepare = coalesce_prepare,
  .can_fua = coalesce_can_fua,
  .pwrite = coalesce_pwrite,
  .zero = coalesce_zero,
  .trim = coalesce_trim,
  .flush = coalesce_flush,
};

NBDKIT_REGISTER_FILTER (filter)
