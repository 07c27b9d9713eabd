/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdio's bottom (see nbdio.c): messages, through the options'
 * callbacks, and the clock its timeouts and counts are measured on.
 * It calls no other file of nbdio.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "monotonic.h"
#include "nbdio-internal.h"

void
nbdio_say (struct nbdio *io, enum nbdio_level level, const char *fmt, ...)
{
  void (*fn) (const char *) =
    level == NBDIO_DEBUG ? io->opts.debug : io->opts.error;
  char msg[1024];
  va_list ap;

  if (!fn && !(level == NBDIO_NOTICE && io->opts.notice))
    return;
  va_start (ap, fmt);
  vsnprintf (msg, sizeof msg, fmt, ap);
  va_end (ap);
  if (level == NBDIO_NOTICE && io->opts.notice)
    io->opts.notice (io->name, msg);
  else if (level == NBDIO_NOTICE) {
    char *named;
    if (asprintf (&named, "%s: %s", io->name, msg) >= 0) {
      fn (named);
      free (named);
    }
  }
  else
    fn (msg);
}

uint64_t
nbdio_now_ms (void)
{
  return monotonic_ns () / 1000000;
}
