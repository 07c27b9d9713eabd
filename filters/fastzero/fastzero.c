/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdkit fastzero filter: nbdkit's nozero filter (zeromode=,
 * fastzeromode=, with the same meanings), plus fastzeromode=probe,
 * which answers fast zero requests from block status, and zerodetect=,
 * which turns all-zero writes into zero requests.
 */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

#include "iszero.h"

/* nbdkit's largest request: emulated zeroes are written in pieces of
 * this size, which every plugin accepts.
 */
#define MAX_WRITE (64 * 1024 * 1024)

#define ARRAY_SIZE(a) (sizeof (a) / sizeof ((a)[0]))

static enum {
  ZERO_NONE,                    /* the default, as in nozero */
  ZERO_EMULATE,
  ZERO_NOTRIM,
  ZERO_PLUGIN,
} zeromode;

static enum {
  FAST_DEFAULT,
  FAST_NONE,
  FAST_SLOW,
  FAST_IGNORE,
  FAST_PROBE,
} fastzeromode;

static enum {
  DETECT_OFF,
  DETECT_ON,
  DETECT_UNMAP,
} zerodetect;

static const char *const zeromode_names[] = {
  [ZERO_NONE] = "none", [ZERO_EMULATE] = "emulate",
  [ZERO_NOTRIM] = "notrim", [ZERO_PLUGIN] = "plugin",
};

/* Always zeroes; not const, so that it lives in .bss, not in the file. */
static char zero_buf[MAX_WRITE];

/* Returns VALUE's index in NAMES (N of them), or -1 after logging an
 * error naming KEY and listing CHOICES.
 */
static int
fastzero_lookup (const char *key, const char *value,
                 const char *const *names, size_t n, const char *choices)
{
  size_t i;

  for (i = 0; i < n; i++)
    if (strcmp (value, names[i]) == 0)
      return i;
  nbdkit_error ("unknown %s '%s' (expected %s)", key, value, choices);
  return -1;
}

static int
fastzero_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                 const char *key, const char *value)
{
  static const char *const fast_names[] = {
    [FAST_DEFAULT] = "default", [FAST_NONE] = "none", [FAST_SLOW] = "slow",
    [FAST_IGNORE] = "ignore", [FAST_PROBE] = "probe",
  };
  static const char *const detect_names[] = {
    [DETECT_OFF] = "off", [DETECT_ON] = "on", [DETECT_UNMAP] = "unmap",
  };
  int i;

  if (strcmp (key, "zeromode") == 0) {
    i = fastzero_lookup (key, value,
                         zeromode_names, ARRAY_SIZE (zeromode_names),
                         "none, emulate, notrim or plugin");
    if (i == -1)
      return -1;
    zeromode = i;
    return 0;
  }
  if (strcmp (key, "fastzeromode") == 0) {
    i = fastzero_lookup (key, value, fast_names, ARRAY_SIZE (fast_names),
                         "default, none, slow, ignore or probe");
    if (i == -1)
      return -1;
    fastzeromode = i;
    return 0;
  }
  if (strcmp (key, "zerodetect") == 0) {
    i = fastzero_lookup (key, value,
                         detect_names, ARRAY_SIZE (detect_names),
                         "off, on or unmap");
    if (i == -1)
      return -1;
    zerodetect = i;
    return 0;
  }
  return next (nxdata, key, value);
}

static int
fastzero_config_complete (nbdkit_next_config_complete *next,
                          nbdkit_backend *nxdata)
{
  if (fastzeromode == FAST_PROBE && zeromode == ZERO_NONE) {
    nbdkit_error ("fastzeromode=probe needs zeromode=emulate, notrim or "
                  "plugin: with zeromode=none (the default) clients "
                  "cannot zero at all");
    return -1;
  }
  /* emulate means the plugin's zero is never used: detected zeroes
   * would have to be written as they are.
   */
  if (zerodetect != DETECT_OFF && zeromode == ZERO_EMULATE) {
    nbdkit_error ("zerodetect=%s cannot be used with zeromode=emulate",
                  zerodetect == DETECT_ON ? "on" : "unmap");
    return -1;
  }
  return next (nxdata);
}

#define fastzero_config_help \
  "zeromode=<MODE>      'none' (default), 'emulate', 'notrim', 'plugin'.\n" \
  "fastzeromode=<MODE>  'default', 'none', 'slow', 'ignore', 'probe'.\n" \
  "zerodetect=<MODE>    'off' (default), 'on', 'unmap'."

/* As nozero: notrim and plugin need the plugin's zero. */
static int
fastzero_prepare (nbdkit_next *next, void *handle, int readonly)
{
  int r;

  if (readonly)
    return 0;
  if (zeromode == ZERO_NOTRIM || zeromode == ZERO_PLUGIN) {
    r = next->can_zero (next);
    if (r == -1)
      return -1;
    if (r == NBDKIT_ZERO_NONE) {
      nbdkit_error ("zeromode=%s requires plugin zero support",
                    zeromode_names[zeromode]);
      return -1;
    }
  }
  return 0;
}

/* Zero requests must reach fastzero_zero, so it says NATIVE where it
 * emulates (and where the plugin emulates, it lets the plugin do so):
 * for EMULATE nbdkit would write the zeroes at this level without
 * calling fastzero_zero, failing every fast zero, which ignore and
 * probe answer differently.
 */
static int
fastzero_can_zero (nbdkit_next *next, void *handle)
{
  int r;

  switch (zeromode) {
  case ZERO_NONE:
    return NBDKIT_ZERO_NONE;
  case ZERO_EMULATE:
    return NBDKIT_ZERO_NATIVE;
  default:
    r = next->can_zero (next);
    return r == NBDKIT_ZERO_EMULATE ? NBDKIT_ZERO_NATIVE : r;
  }
}

static int
fastzero_can_fast_zero (nbdkit_next *next, void *handle)
{
  if (zeromode == ZERO_NONE || fastzeromode == FAST_NONE)
    return 0;
  if (fastzeromode == FAST_DEFAULT && zeromode != ZERO_EMULATE)
    return next->can_fast_zero (next);
  return 1;
}

/* Write zeroes over [offset, offset+count) with the plugin's pwrite. */
static int
fastzero_emulate (nbdkit_next *next, uint32_t count, uint64_t offset,
                  uint32_t flags, int *err)
{
  uint32_t writeflags = 0, n;
  bool fua_last = false;

  /* Native FUA must go with every piece; emulated FUA is a flush
   * after the write, so on the last piece it covers them all.
   */
  if (flags & NBDKIT_FLAG_FUA) {
    if (next->can_fua (next) == NBDKIT_FUA_NATIVE)
      writeflags = NBDKIT_FLAG_FUA;
    else
      fua_last = true;
  }
  while (count > 0) {
    n = count < MAX_WRITE ? count : MAX_WRITE;
    if (n == count && fua_last)
      writeflags = NBDKIT_FLAG_FUA;
    if (next->pwrite (next, zero_buf, n, offset, writeflags, err) == -1)
      return -1;
    offset += n;
    count -= n;
  }
  return 0;
}

/* Returns 1 if block status says [offset, offset+count) reads as zeroes
 * (and, if ALLOCATED, that none of it is a hole), 0 if not or unknown,
 * -1 on error.
 */
static int
fastzero_reads_as_zero (nbdkit_next *next, uint32_t count, uint64_t offset,
                        bool allocated, int *err)
{
  const uint64_t end = offset + count;
  struct nbdkit_extents *extents;
  struct nbdkit_extent e;
  size_t i, n;
  int r;

  r = next->can_extents (next);
  if (r == -1) {
    *err = EIO;
    return -1;
  }
  if (r == 0)
    return 0;

  /* The plugin may describe only a prefix of the range: ask again
   * for the rest, and stop at the first extent that is not zero.
   */
  while (offset < end) {
    extents = nbdkit_extents_new (offset, end);
    if (extents == NULL) {
      *err = errno;
      return -1;
    }
    if (next->extents (next, end - offset, offset, 0, extents, err) == -1) {
      nbdkit_extents_free (extents);
      return -1;
    }
    n = nbdkit_extents_count (extents);
    r = n > 0;
    for (i = 0; r && i < n; i++) {
      e = nbdkit_get_extent (extents, i);
      /* (An extent that does not advance is a broken plugin: give
       * up rather than loop.)
       */
      if (!(e.type & NBDKIT_EXTENT_ZERO) ||
          (allocated && (e.type & NBDKIT_EXTENT_HOLE)) ||
          e.offset + e.length <= offset)
        r = 0;
      else
        offset = e.offset + e.length;
    }
    nbdkit_extents_free (extents);
    if (!r)
      return 0;
  }
  return 1;
}

/* fastzeromode=probe: a fast zero (FLAGS already adjusted for
 * zeromode) succeeds at once where the range already reads as zeroes,
 * goes to a plugin that zeroes natively and fast, and otherwise fails
 * at once.  It never writes data.
 */
static int
fastzero_probe (nbdkit_next *next, uint32_t count, uint64_t offset,
                uint32_t flags, int *err)
{
  /* Without MAY_TRIM the client wants the range allocated (NBD's
   * NO_HOLE): a hole that reads as zeroes is not enough.
   */
  int r = fastzero_reads_as_zero (next, count, offset,
                                  !(flags & NBDKIT_FLAG_MAY_TRIM), err);

  if (r == -1)
    return -1;
  if (r == 1) {
    /* Nothing to write; FUA still asks that the zeroes be stable. */
    if ((flags & NBDKIT_FLAG_FUA) && next->can_flush (next) == 1)
      return next->flush (next, 0, err);
    return 0;
  }
  if (zeromode != ZERO_EMULATE &&
      next->can_zero (next) == NBDKIT_ZERO_NATIVE &&
      next->can_fast_zero (next) == 1)
    return next->zero (next, count, offset, flags, err);
  *err = ENOTSUP;
  return -1;
}

static int
fastzero_zero (nbdkit_next *next, void *handle,
               uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  assert (zeromode != ZERO_NONE);

  if (zeromode == ZERO_NOTRIM)
    flags &= ~NBDKIT_FLAG_MAY_TRIM;

  if (flags & NBDKIT_FLAG_FAST_ZERO) {
    switch (fastzeromode) {
    case FAST_NONE:             /* not advertised: nbdkit refuses these */
    case FAST_SLOW:
      *err = ENOTSUP;
      return -1;
    case FAST_DEFAULT:
      if (zeromode == ZERO_EMULATE) {
        *err = ENOTSUP;
        return -1;
      }
      break;
    case FAST_IGNORE:
      flags &= ~NBDKIT_FLAG_FAST_ZERO;
      break;
    case FAST_PROBE:
      return fastzero_probe (next, count, offset, flags, err);
    }
  }

  if (zeromode == ZERO_EMULATE)
    return fastzero_emulate (next, count, offset, flags, err);
  return next->zero (next, count, offset, flags, err);
}

static int
fastzero_pwrite (nbdkit_next *next, void *handle,
                 const void *buf, uint32_t count, uint64_t offset,
                 uint32_t flags, int *err)
{
  uint32_t zflags;

  if (zerodetect != DETECT_OFF && count > 0 &&
      next->can_zero (next) > NBDKIT_ZERO_NONE &&
      is_zero (buf, count)) {
    zflags = flags & NBDKIT_FLAG_FUA;
    if (zerodetect == DETECT_UNMAP && zeromode != ZERO_NOTRIM)
      zflags |= NBDKIT_FLAG_MAY_TRIM;
    return next->zero (next, count, offset, zflags, err);
  }
  return next->pwrite (next, buf, count, offset, flags, err);
}

static struct nbdkit_filter filter = {
  .name              = "fastzero",
  .longname          = "nbdkit fastzero filter",
  .config            = fastzero_config,
  .config_complete   = fastzero_config_complete,
  .config_help       = fastzero_config_help,
  .prepare           = fastzero_prepare,
  .can_zero          = fastzero_can_zero,
  .can_fast_zero     = fastzero_can_fast_zero,
  .pwrite            = fastzero_pwrite,
  .zero              = fastzero_zero,
};

NBDKIT_REGISTER_FILTER (filter)
