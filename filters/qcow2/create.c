/* SPDX-License-Identifier: BSD-3-Clause */
/* The qcow2 filter's create=true: a new image made in the plugin's
 * export, once it is known to hold nothing anyone would miss, and the
 * hint naming create=true for an export that holds no image yet.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "checked.h"
#include "errstr.h"
#include "filter.h"
#include "glue.h"
#include "iszero.h"
#include "qcow2.h"

/* create=true reads at most this much of the export to check that it
 * is empty: what the plugin's block status does not report as zeros
 * (all of it, for a plugin without block status).  Past it the export
 * is refused: reading a whole large disk, maybe over a network, before
 * serving it would take long.  The man page and the hint say it.
 */
#define CREATE_READ_MAX (UINT64_C (1) << 30)
#define CREATE_READ_MAX_TEXT "1 GiB"

/* Checks whether the export, read through scan, is empty, for
 * create=true: every run that block status does not report as zeros
 * is read, in the order of the disk.  Returns 0 if it is, else -1
 * after logging an error (the first byte of data, or too much to
 * read).
 */
static int
create_check_empty (struct qcow2_io *scan, const char *name, uint64_t size)
{
  const size_t chunk = 1u << 20;
  uint64_t offset = 0, nread = 0;
  uint8_t *buf;
  int r = 0;

  if (!(buf = malloc (chunk))) {
    nbdkit_error ("malloc: %s", errstr (errno));
    return -1;
  }
  while (r == 0 && offset < size) {
    uint32_t type;
    uint64_t run;

    r = scan->ops->status (scan, offset, size - offset, &type, &run);
    if (r < 0) {
      nbdkit_error ("create=true: block status of %s at offset %" PRIu64
                    ": %s", name, offset, errstr (-r));
      break;
    }
    run = MIN (run, size - offset);
    if (type & QCOW2_EXTENT_ZERO) {
      offset += run;
      continue;
    }
    for (uint64_t end = offset + run; r == 0 && offset < end; ) {
      size_t len = MIN (chunk, end - offset);

      if (nread + len > CREATE_READ_MAX) {
        nbdkit_error ("create=true: %s may hold data: block status "
                      "reports more than " CREATE_READ_MAX_TEXT " of it "
                      "as data, of which " CREATE_READ_MAX_TEXT " was read, "
                      "all zeros (to offset %" PRIu64 "): only an export "
                      "known to be empty is formatted", name, offset);
        glue_hint ("if it holds nothing you need, \"qemu-img create -f "
                   "qcow2\" formats it without this check; an export "
                   "whose free space block status reports as zeros (a "
                   "sparse file) is checked whatever its size");
        r = -1;
        break;
      }
      r = scan->ops->pread (scan, buf, len, offset);
      if (r < 0) {
        nbdkit_error ("create=true: reading %s at offset %" PRIu64 ": %s",
                      name, offset, errstr (-r));
        break;
      }
      nread += len;
      if (!is_zero (buf, len)) {
        size_t i = 0;

        while (buf[i] == 0)
          i++;
        nbdkit_error ("create=true: %s is not empty (data at offset %"
                      PRIu64 "): only an empty export is formatted",
                      name, offset + i);
        r = -1;
        break;
      }
      offset += len;
    }
  }
  free (buf);
  return r < 0 ? -1 : 0;
}

/* It must be writable, empty (no data anywhere: not an image, a
 * partition table or a file system someone would miss) and large
 * enough.
 */
int
create_check (struct qcow2_io *scan, const char *name, bool readonly)
{
  uint64_t size = scan->ops->size (scan), need;

  if (readonly) {
    nbdkit_error ("create=true: the export is read-only");
    glue_hint ("it is made read-only by nbdkit -r, readonly=true, or a "
               "plugin that cannot write");
    return -1;
  }
  if (qcow2_create_bytes (&glue_env, &glue.create.opts,
                          glue.create.opts.preallocation != QCOW2_PREALLOC_OFF,
                          &need) < 0)
    return -1;
  if (need > size) {
    nbdkit_error ("create=true: %s is %" PRIu64 " bytes, and the image's "
                  "metadata%s needs %" PRIu64 " (virtual-size=%" PRIu64
                  ", %" PRIu64 "-byte clusters)", name, size,
                  glue.create.opts.preallocation != QCOW2_PREALLOC_OFF ?
                  " with its data preallocated" : "", need,
                  glue.create.opts.size,
                  glue.create.opts.cluster_size ? glue.create.opts.cluster_size
                                                : 65536);
    glue_hint ("give the export more, or the disk less");
    return -1;
  }
  return create_check_empty (scan, name, size);
}

int
create_make (struct qcow2_io *io, const char *name, int64_t size,
             bool readonly)
{
  /* An io of its own, whose status answers from the plugin's extents
   * (the image's io is made without them).
   */
  struct qcow2_io *scan = below_nextio_new (size,
                                            NEXTIO_READONLY | NEXTIO_EXTENTS);
  int r;

  if (!scan)
    return -1;
  r = create_check (scan, name, readonly);
  scan->ops->close (scan);
  if (r == -1)
    return -1;
  if (qcow2_create (&glue_env, io, &glue.create.opts) < 0)
    return -1;
  nbdkit_debug ("create: a %" PRIu64 "-byte image made in %s",
                glue.create.opts.size, name);
  return 0;
}

/* If it starts with zeros, it is likely a new one, for create=true
 * (which checks all of it).
 */
void
create_hint_empty (struct qcow2_io *io, const char *name)
{
  char buf[4096];
  int64_t size = io->ops->size (io);
  uint32_t len = MIN (size, (int64_t) sizeof buf);
  int r = size < 0 ? -1 : io->ops->pread (io, buf, len, 0);

  if (r == 0 && (len == 0 || (buf[0] == 0 &&
                              memcmp (buf, buf + 1, len - 1) == 0)))
    glue_hint ("%s holds no image yet (it starts with zeros): "
               "create=true virtual-size=SIZE makes one in it if no data "
               "is found (it reads what block status does not report as "
               "zeros, up to " CREATE_READ_MAX_TEXT ")", name);
}
