/* The read path: each mapped run of a request is read from where it
 * lives (data file, backing layer, compressed cluster, or zeros).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "errstr.h"
#include "internal.h"

/* Read from a backing layer; past its end, or with none, zeros. */
static int
read_backing (struct qcow2_image *img, uint8_t *buf, uint64_t count,
              uint64_t offset)
{
  struct qcow2_image *b = img->backing;
  uint64_t n = 0;

  if (b && offset < b->size) {
    int r;
    n = MIN (count, b->size - offset);
    r = layer_read (b, buf, n, offset);
    if (r < 0)
      return r;
  }
  memset (buf + n, 0, count - n);
  return 0;
}

static int
read_compressed (struct qcow2_image *img, uint8_t *buf, const
                 struct qcow2_run *run, uint64_t offset)
{
  uint64_t in_cluster = offset & (img->cluster_size - 1);
  uint8_t *cluster = malloc (img->cluster_size);
  int r;

  if (!cluster)
    return -ENOMEM;
  r = compress_read_cluster (img, run->comp_offset, run->comp_size, cluster);
  if (r == 0)
    memcpy (buf, cluster + in_cluster, run->length);
  free (cluster);
  return r;
}

static int
read_data (struct qcow2_image *img, uint8_t *buf, const struct qcow2_run *run)
{
  int r = cluster_check_data_offset (img, run->host_offset, run->length);
  if (r < 0)
    return r;
  r = img->data_io->ops->pread (img->data_io, buf, run->length,
                                run->host_offset);
  if (r < 0)
    qcow2_err (img, "reading %" PRIu64 " bytes of data at host offset %#"
               PRIx64 ": %s", run->length, run->host_offset, errstr (-r));
  return r;
}

static int
read_common (struct qcow2_image *img, uint8_t *buf, uint64_t count,
             uint64_t offset, bool locked)
{
  if (img->raw) {
    int r = img->io->ops->pread (img->io, buf, count, offset);
    if (r < 0)
      qcow2_err (img, "reading %" PRIu64 " bytes at %#" PRIx64 ": %s",
                 count, offset, errstr (-r));
    return r;
  }

  while (count > 0) {
    struct qcow2_run run;
    int r;

    if (!locked)
      pthread_mutex_lock (&img->lock);
    r = cluster_map (img, offset, count, &run);
    if (!locked)
      pthread_mutex_unlock (&img->lock);
    if (r < 0)
      return r;

    switch (run.kind) {
    case RUN_UNALLOCATED:
      r = read_backing (img, buf, run.length, offset);
      break;
    case RUN_ZERO:
      memset (buf, 0, run.length);
      break;
    case RUN_DATA:
      r = read_data (img, buf, &run);
      break;
    case RUN_COMPRESSED:
      r = read_compressed (img, buf, &run, offset);
      break;
    }
    if (r < 0)
      return r;
    buf += run.length;
    offset += run.length;
    count -= run.length;
  }
  return 0;
}

int
layer_read (struct qcow2_image *img, uint8_t *buf, uint64_t count,
            uint64_t offset)
{
  return read_common (img, buf, count, offset, false);
}

/* What the guest sees now, for copy-on-write: called with img->lock
 * held (backing layers take their own).
 */
int
read_locked (struct qcow2_image *img, uint8_t *buf, uint64_t count,
             uint64_t offset)
{
  return read_common (img, buf, count, offset, true);
}
