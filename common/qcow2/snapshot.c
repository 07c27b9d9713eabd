/* SPDX-License-Identifier: BSD-3-Clause */
/* Internal snapshots: the snapshot table, and serving a snapshot's L1
 * table read-only instead of the active one.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "internal.h"

#define SNAPSHOT_ENTRY_FIXED 40
#define SNAPSHOT_MAX_EXTRA 1024
#define SNAPSHOT_MAX_TABLE (64u << 20)

void
snapshot_free_table (struct qcow2_image *img)
{
  for (uint32_t i = 0; i < img->nb_snapshots; i++) {
    free (img->snapshots[i].id);
    free (img->snapshots[i].name);
  }
  free (img->snapshots);
  img->snapshots = NULL;
  img->nb_snapshots = 0;
}

/* Read len bytes of the snapshot table at *off, advancing *off. */
static int
snapshot_read_bytes (struct qcow2_image *img, uint32_t index, void *buf,
                     uint64_t len, uint64_t *off)
{
  int r;

  if (range_exceeds (*off, len, img->file_size) ||
      *off + len - img->h.snapshots_offset > SNAPSHOT_MAX_TABLE) {
    log_error (img, "snapshot table entry %" PRIu32 " at %#" PRIx64 " runs "
               "beyond the end of the file or the %u byte table limit",
               index, *off, SNAPSHOT_MAX_TABLE);
    return -EINVAL;
  }
  r = img->io->ops->pread (img->io, buf, len, *off);
  if (r < 0) {
    log_error (img, "reading snapshot table at %#" PRIx64 ": %s", *off,
               errstr (-r));
    return r;
  }
  *off += len;
  return 0;
}

static int
snapshot_read_string (struct qcow2_image *img, uint32_t index, uint16_t len,
                      uint64_t *off, char **out)
{
  int r;

  *out = malloc ((size_t) len + 1);
  if (!*out)
    return -ENOMEM;
  r = snapshot_read_bytes (img, index, *out, len, off);
  (*out)[len] = '\0';
  return r;
}

static int
snapshot_read_entry (struct qcow2_image *img, uint32_t index, uint64_t *off,
                     struct qcow2_snapshot *sn)
{
  uint8_t fixed[SNAPSHOT_ENTRY_FIXED], extra[SNAPSHOT_MAX_EXTRA];
  uint64_t start = *off;
  uint32_t extra_size;
  uint16_t id_size, name_size;
  int r;

  r = snapshot_read_bytes (img, index, fixed, sizeof fixed, off);
  if (r < 0)
    return r;
  sn->l1_table_offset = be64_get (fixed);
  sn->l1_size = be32_get (fixed + 8);
  id_size = be16_get (fixed + 12);
  name_size = be16_get (fixed + 14);
  extra_size = be32_get (fixed + 36);
  if (extra_size > SNAPSHOT_MAX_EXTRA) {
    log_error (img, "snapshot table entry %" PRIu32 " at %#" PRIx64 " has "
               "%" PRIu32 " bytes of extra data (at most %d)",
               index, start, extra_size, SNAPSHOT_MAX_EXTRA);
    return -EINVAL;
  }
  r = snapshot_read_bytes (img, index, extra, extra_size, off);
  if (r < 0)
    return r;
  /* Without the disk size in the extra data, the snapshot has the
   * image's size.
   */
  sn->disk_size = extra_size >= 16 ? be64_get (extra + 8) : img->h.size;

  if ((r = snapshot_read_string (img, index, id_size, off, &sn->id)) < 0 ||
      (r = snapshot_read_string (img, index, name_size, off, &sn->name)) < 0)
    return r;
  *off = (*off + 7) & ~UINT64_C (7);
  return 0;
}

int
snapshot_read_table (struct qcow2_image *img)
{
  uint64_t off = img->h.snapshots_offset;
  int r;

  if (img->h.nb_snapshots == 0)
    return 0;
  img->snapshots = calloc (img->h.nb_snapshots, sizeof *img->snapshots);
  if (!img->snapshots)
    return -ENOMEM;
  img->nb_snapshots = img->h.nb_snapshots;
  for (uint32_t i = 0; i < img->nb_snapshots; i++) {
    r = snapshot_read_entry (img, i, &off, &img->snapshots[i]);
    if (r < 0)
      return r;
  }
  img->snapshot_table_bytes = off - img->h.snapshots_offset;
  return 0;
}

/* Serve the snapshot whose ID, or else whose name, is which. */
int
snapshot_select (struct qcow2_image *img, const char *which)
{
  const struct qcow2_snapshot *sn = NULL;
  uint64_t span, needed;
  char what[64];
  int r;

  for (uint32_t i = 0; !sn && i < img->nb_snapshots; i++)
    if (strcmp (img->snapshots[i].id, which) == 0)
      sn = &img->snapshots[i];
  for (uint32_t i = 0; !sn && i < img->nb_snapshots; i++)
    if (strcmp (img->snapshots[i].name, which) == 0)
      sn = &img->snapshots[i];
  if (!sn) {
    log_error (img, "no snapshot with ID or name \"%s\" (the image has %"
               PRIu32 " snapshots)", which, img->nb_snapshots);
    return -ENOENT;
  }

  span = img->geo.cluster_size << img->geo.l2_bits;
  needed = div_round_up (sn->disk_size, span);
  if ((uint64_t) sn->l1_size * 8 > QCOW2_MAX_L1_BYTES ||
      sn->l1_size < needed) {
    log_error (img, "snapshot \"%s\": L1 size %" PRIu32 " does not fit its "
               "disk size %" PRIu64, sn->id, sn->l1_size, sn->disk_size);
    return -EINVAL;
  }
  snprintf (what, sizeof what, "L1 table of snapshot %.32s", sn->id);
  r = l1_load (img, sn->l1_table_offset, sn->l1_size, what);
  if (r < 0)
    return r;
  img->served_snapshot = sn;
  img->size = sn->disk_size & ~UINT64_C (511);
  return 0;
}
