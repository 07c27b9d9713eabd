/* SPDX-License-Identifier: BSD-3-Clause */
/* Verifying the images a crash or a failing disk leaves (see
 * crashcheck.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "be.h"
#include "checked.h"
#include "errstr.h"
#include "crashcheck.h"

extern char **environ;

struct crashcheck_stats crashcheck_stats;
unsigned crashcheck_qemu_every = 10;
bool crashcheck_trace;

static char *workdir;           /* image files for qemu-img */
/* Reused from one image to the next: large allocations are slow under
 * AddressSanitizer.
 */
static struct wl_buf buf_data, buf_again, buf_got, buf_qemu;

void
crashcheck_fail (struct failure *f, const char *cls, const char *fmt, ...)
{
  va_list ap;

  snprintf (f->cls, sizeof f->cls, "%s", cls);
  va_start (ap, fmt);
  vsnprintf (f->why, sizeof f->why, fmt, ap);
  va_end (ap);
}

/* Where two guest images differ, for messages. */
uint64_t
crashcheck_first_difference (const uint8_t *a, const uint8_t *b, uint64_t len)
{
  uint64_t i = 0;

  while (i < len && a[i] == b[i])
    i++;
  return i;
}

bool
crashcheck_dirty (const uint8_t *buf, size_t len)
{
  return len >= 80 && be32_get (buf + 4) >= 3 && (be64_get (buf + 72) & 1);
}

void
crashcheck_write_file (const char *path, const void *data, size_t len)
{
  FILE *fp = fopen (path, "w");

  if (!fp || (len && fwrite (data, 1, len, fp) != len) || fclose (fp) != 0) {
    fprintf (stderr, "%s: %s\n", path, errstr (errno));
    exit (EXIT_FAILURE);
  }
}

/* The backing file of the configuration, beside the images qemu-img
 * checks.
 */
void
crashcheck_write_backing (const struct wl_setup *s)
{
  const struct qcow2_env *env = memenv_env (s->me);
  char path[4096], *id;
  struct qcow2_io *io;
  int64_t size;
  uint8_t *buf;

  if (!s->cfg->backing || !workdir)
    return;
  io = env->open (env->opaque, "backing.img", true, &id);
  if (!io)
    abort ();
  free (id);
  size = io->ops->size (io);
  buf = malloc (size ? size : 1);
  if (!buf || io->ops->pread (io, buf, size, 0) < 0)
    abort ();
  snprintf (path, sizeof path, "%s/backing.img", workdir);
  crashcheck_write_file (path, buf, size);
  free (buf);
  io->ops->close (io);
}

/* qemu-img check of an image, with -r all if repair: its exit status,
 * its output in out.  The image is left in the work folder.
 */
static int
crashcheck_qemu_img (struct wl_files files, bool repair, char *out,
                     size_t outlen)
{
  char path[4096], log[4096], data[4096];
  char *argv[] = { "qemu-img", "check", "-f", "qcow2", path, NULL, NULL,
                   NULL };
  posix_spawn_file_actions_t fa;
  int status, fd;
  ssize_t n;
  pid_t pid;

  if (repair) {
    argv[4] = "-r";
    argv[5] = "all";
    argv[6] = path;
  }
  snprintf (path, sizeof path, "%s/crash.qcow2", workdir);
  snprintf (log, sizeof log, "%s/check.out", workdir);
  snprintf (data, sizeof data, "%s/data.raw", workdir);
  crashcheck_write_file (path, files.image, files.len);
  /* The data file the image names, if any (QEMU resolves its relative
   * name against the current directory).
   */
  crashcheck_write_file (data, files.data, files.dlen);
  fflush (NULL);
  /* posix_spawn, not fork: the heap is large. */
  posix_spawn_file_actions_init (&fa);
  posix_spawn_file_actions_addopen (&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC,
                                    0644);
  posix_spawn_file_actions_adddup2 (&fa, 1, 2);
  posix_spawn_file_actions_addchdir_np (&fa, workdir);
  errno = posix_spawnp (&pid, "qemu-img", &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy (&fa);
  if (errno) {
    fprintf (stderr, "running qemu-img: %s\n", errstr (errno));
    exit (EXIT_FAILURE);
  }
  if (waitpid (pid, &status, 0) == -1) {
    fprintf (stderr, "waitpid: %s\n", errstr (errno));
    exit (EXIT_FAILURE);
  }
  out[0] = '\0';
  fd = open (log, O_RDONLY);
  if (fd >= 0) {
    n = read (fd, out, outlen - 1);
    out[n > 0 ? n : 0] = '\0';
    close (fd);
  }
  return WIFEXITED (status) ? WEXITSTATUS (status) : 128;
}

int
crashcheck_qemu (struct wl_files files, char *out, size_t outlen)
{
  return crashcheck_qemu_img (files, false, out, outlen);
}

/* An image left dirty by lazy refcounts (its refcount blocks stale),
 * repaired by qemu-img check -r all instead of by us: the repair must
 * succeed, clear the dirty bit, and change no guest byte of data (as we
 * read the image before).
 */
static bool
crashcheck_qemu_repair (const struct wl_setup *setup, struct wl_files files,
                        const uint8_t *data, uint64_t size, struct failure *f)
{
  struct wl_files repaired = files;
  struct qcow2_image *img;
  char path[4096], out[4096];
  uint8_t *image = NULL, *got;
  bool ok = false;
  FILE *fp;
  long len;
  int r;

  crashcheck_stats.qemu_repairs++;
  if ((r = crashcheck_qemu_img (files, true, out, sizeof out)) != 0) {
    crashcheck_fail (f, "qemu-img-repair", "qemu-img check -r all of the "
                     "dirty image: exit %d:\n%s", r, out);
    return false;
  }
  snprintf (path, sizeof path, "%s/crash.qcow2", workdir);
  if (!(fp = fopen (path, "r")) || fseek (fp, 0, SEEK_END) != 0 ||
      (len = ftell (fp)) < 0 || fseek (fp, 0, SEEK_SET) != 0 ||
      !(image = malloc (len ? len : 1)) ||
      fread (image, 1, len, fp) != (size_t) len) {
    fprintf (stderr, "%s: %s\n", path, errstr (errno));
    exit (EXIT_FAILURE);
  }
  fclose (fp);
  repaired.image = image;
  repaired.len = len;
  if (crashcheck_dirty (image, len))
    crashcheck_fail (f, "qemu-img-repair", "qemu-img check -r all left the "
                     "image dirty");
  else if (!(img = wl_open_copy (setup, repaired, true)))
    crashcheck_fail (f, "qemu-img-repair", "the image qemu-img repaired "
                     "does not open: %s", memenv_last_error (setup->me));
  else {
    if (!(got = wl_read_all (img, &buf_qemu)))
      crashcheck_fail (f, "qemu-img-repair", "reading the image qemu-img "
                       "repaired: %s", memenv_last_error (setup->me));
    else if (memcmp (got, data, size) != 0) {
      uint64_t i = crashcheck_first_difference (got, data, size);
      crashcheck_fail (f, "qemu-img-repair", "qemu-img's repair changed "
                       "guest byte %#" PRIx64 " from %#x to %#x", i, data[i],
                       got[i]);
    }
    else
      ok = true;
    qcow2_close (img);
  }
  free (image);
  return ok;
}

static bool
crashcheck_sampled (void)
{
  return crashcheck_qemu_every && crashcheck_stats.images % crashcheck_qemu_every == 0;
}

/* A persistent bitmap as found in an image, parsed here rather than by
 * the engine, so that the engine is checked against the spec.
 */
struct found_bitmap {
  char name[64];
  uint32_t flags;               /* 1: in use, 2: auto */
  unsigned granularity_bits;
  uint8_t *bits;                /* bit i: byte i / 8, bit i % 8 */
  uint64_t nbytes;
};
#define MAX_FOUND_BITMAPS 8

static void
crashcheck_free_bitmaps (struct found_bitmap *b, unsigned n)
{
  for (unsigned i = 0; i < n; i++)
    free (b[i].bits);
}

/* The bitmaps of image buf[0, len) (none if its extension is absent
 * or not valid, autoclear bit 0 clear): false with why if malformed.
 */
static bool
crashcheck_read_bitmaps (const uint8_t *buf, size_t len,
                         struct found_bitmap *b, unsigned *n, bool *valid,
                         char *why, size_t whylen)
{
  uint64_t cs = UINT64_C (1) << be32_get (buf + 20);
  uint64_t off = be32_get (buf + 100), dir_off = 0, dir_size = 0, pos = 0;
  uint32_t nb = 0;

  *n = 0;
  *valid = be64_get (buf + 88) & 1;
  while (off + 8 <= len && off < cs) {
    uint32_t type = be32_get (buf + off), elen = be32_get (buf + off + 4);

    if (type == 0)
      break;
    if (type == 0x23852875 && elen >= 24 && off + 32 <= len) {
      nb = be32_get (buf + off + 8);
      dir_size = be64_get (buf + off + 16);
      dir_off = be64_get (buf + off + 24);
    }
    off += 8 + ((elen + UINT64_C (7)) & ~UINT64_C (7));
  }
  if (!*valid || nb == 0)
    return true;
  if (nb > MAX_FOUND_BITMAPS || range_exceeds (dir_off, dir_size, len)) {
    snprintf (why, whylen, "bitmap extension: %" PRIu32 " bitmaps, "
              "directory at %#" PRIx64, nb, dir_off);
    return false;
  }
  for (uint32_t i = 0; i < nb; i++) {
    const uint8_t *e = buf + dir_off + pos;
    struct found_bitmap *f = &b[i];
    uint64_t table, tsize;
    unsigned name_size;

    if (pos + 24 > dir_size) {
      snprintf (why, whylen, "bitmap directory too short");
      return false;
    }
    table = be64_get (e);
    tsize = be32_get (e + 8);
    f->flags = be32_get (e + 12);
    f->granularity_bits = e[17];
    name_size = be16_get (e + 18);
    if (pos + 24 + be32_get (e + 20) + name_size > dir_size ||
        name_size >= sizeof f->name ||
        range_exceeds (table, tsize * 8, len)) {
      snprintf (why, whylen, "bitmap directory entry %" PRIu32 " is bad", i);
      return false;
    }
    memcpy (f->name, e + 24 + be32_get (e + 20), name_size);
    f->name[name_size] = 0;
    f->nbytes = tsize * cs;
    f->bits = calloc (1, f->nbytes ? f->nbytes : 1);
    if (!f->bits)
      abort ();
    *n = i + 1;
    for (uint64_t t = 0; t < tsize; t++) {
      uint64_t entry = be64_get (buf + table + t * 8);
      uint64_t data = entry & UINT64_C (0x00fffffffffffe00);

      if (entry == 1)
        memset (f->bits + t * cs, 0xff, cs);
      else if (data) {
        if (range_exceeds (data, cs, len)) {
          snprintf (why, whylen, "bitmap %s: data cluster %#" PRIx64
                    " beyond the end", f->name, data);
          return false;
        }
        memcpy (f->bits + t * cs, buf + data, cs);
      }
    }
    pos = (pos + 24 + be32_get (e + 20) + name_size + 7) & ~UINT64_C (7);
  }
  return true;
}

/* The bitmaps of image buf[0, len), whose guest reads as data, against
 * those of the initial image: a disabled bitmap unchanged; an enabled
 * one either marked in use (inconsistent, never trusted) or with every
 * bit it had and a bit for every granule whose data changed.
 */
static bool
crashcheck_bitmaps (const struct wl_setup *setup, const uint8_t *buf,
                    size_t len, const uint8_t *data, struct failure *f)
{
  struct found_bitmap was[MAX_FOUND_BITMAPS] = { 0 };
  struct found_bitmap now[MAX_FOUND_BITMAPS] = { 0 };
  unsigned nwas = 0, nnow = 0;
  bool vwas, vnow, ok = false;
  uint64_t size = setup->cfg->size;
  char why[256];

  if (!setup->initial)
    return true;
  if (!crashcheck_read_bitmaps (setup->image, setup->len, was, &nwas, &vwas,
                                why, sizeof why))
    abort ();                   /* the builder's fault */
  if (!crashcheck_read_bitmaps (buf, len, now, &nnow, &vnow, why,
                                sizeof why)) {
    crashcheck_fail (f, "bitmaps", "%s", why);
    goto out;
  }
  if (!vnow || nnow != nwas) {
    crashcheck_fail (f, "bitmaps", "%u bitmaps (extension %s), not %u", nnow,
                     vnow ? "valid" : "not valid", nwas);
    goto out;
  }
  for (unsigned i = 0; i < nwas; i++) {
    const struct found_bitmap *w = &was[i], *b = &now[i];
    uint64_t g = UINT64_C (1) << w->granularity_bits;

    if (strcmp (w->name, b->name) != 0 || w->nbytes != b->nbytes ||
        w->granularity_bits != b->granularity_bits) {
      crashcheck_fail (f, "bitmaps", "bitmap %u is %s, not %s", i, b->name,
                       w->name);
      goto out;
    }
    if (!(w->flags & 2)) {
      if (b->flags != w->flags || memcmp (b->bits, w->bits, w->nbytes)) {
        crashcheck_fail (f, "bitmaps", "disabled bitmap %s changed", w->name);
        goto out;
      }
      continue;
    }
    if ((w->flags & 1) || (b->flags & 1))
      continue;
    for (uint64_t k = 0; k * g < size; k++) {
      bool set = b->bits[k / 8] & (1u << k % 8);
      bool was_set = w->bits[k / 8] & (1u << k % 8);
      uint64_t n = MIN (g, size - k * g);

      if (set)
        continue;
      if (was_set || memcmp (data + k * g, setup->initial + k * g, n)) {
        crashcheck_fail (f, "bitmaps", "bitmap %s, not in use, has no bit "
                         "for guest %#" PRIx64 ", which %s", w->name, k * g,
                         was_set ? "it had" : "changed");
        goto out;
      }
    }
  }
  ok = true;
 out:
  crashcheck_free_bitmaps (was, nwas);
  crashcheck_free_bitmaps (now, nnow);
  return ok;
}

/* With data_file_raw, the data file is the guest; after a crash, only
 * where the image maps data (an interrupted write may leave its bytes
 * in the raw file where the image maps none, as in QEMU).
 */
struct raw_check {
  const struct wl_files *files;
  const uint8_t *guest;
  bool strict;
  struct failure *f;
  bool failed;
};

static int
crashcheck_raw_extent (void *opaque, uint64_t offset, uint64_t length,
                       uint32_t type)
{
  struct raw_check *rc = opaque;

  if ((type & QCOW2_EXTENT_ZERO) && !rc->strict)
    return 0;
  for (uint64_t i = offset; i < offset + length; i++) {
    uint8_t b = i < rc->files->dlen ? rc->files->data[i] : 0;

    if (b != rc->guest[i]) {
      crashcheck_fail (rc->f, "raw-data-file", "after a clean close, byte %#"
                       PRIx64 " of the raw data file is %#x, the guest's %#x",
                       i, b, rc->guest[i]);
      rc->failed = true;
      return -1;
    }
  }
  return 0;
}

bool
crashcheck_raw_data_file (const struct wl_setup *setup,
                          struct qcow2_image *img, struct wl_files files,
                          const uint8_t *guest, bool crashed,
                          struct failure *f)
{
  struct raw_check rc = { &files, guest, !crashed, f, false };

  if (!setup->cfg->data_file_raw)
    return true;
  if (qcow2_extents (img, 0, setup->cfg->size, false, crashcheck_raw_extent,
                     &rc) < 0 && !rc.failed) {
    crashcheck_fail (f, "raw-data-file", "extents of the image failed");
    return false;
  }
  return !rc.failed;
}

/* After a repair: more writes, then a clean close must leave an image
 * without leak or corruption that reads as the model says.
 */
static bool
crashcheck_after_repair (struct wl_run *run, struct wl_rng *rng, bool qemu,
                     struct failure *f)
{
  const struct wl_config *cfg = run->setup->cfg;
  uint64_t cs = UINT64_C (1) << cfg->cluster_bits;
  struct qcow2_check_result res;
  struct qcow2_image *img;
  struct wl_files files;
  uint8_t *got = NULL;
  char out[4096];
  bool ok = false;
  int r;

  for (int i = 0; i < 5; i++) {
    struct wl_op op = { .kind = i == 3 ? WL_TRIM : WL_WRITE,
                        .seed = wl_rand (rng) };
    op.offset = wl_below (rng, run->model.size / cs) * cs
      + (i == 3 ? 0 : wl_below (rng, cs));
    op.len = 1 + wl_below (rng, 3 * cs);
    op.len = MIN (op.len, run->model.size - op.offset);
    if (crashcheck_trace) {
      char line[256];
      wl_format_op (&op, line, sizeof line);
      fprintf (stderr, "after the repair: %s\n", line);
    }
    if ((r = wl_exec (run, &op)) < 0) {
      crashcheck_fail (f, "after-repair", "request %d after the repair failed: %s",
                i, errstr (-r));
      return false;
    }
  }
  r = qcow2_close (run->img);
  run->img = NULL;
  if (r < 0) {
    crashcheck_fail (f, "after-repair", "close after the repair: %s", errstr (-r));
    return false;
  }
  files = wl_run_files (run);
  img = wl_open_copy (run->setup, files, true);
  if (!img) {
    crashcheck_fail (f, "after-repair", "open after the repair: %s",
              memenv_last_error (run->setup->me));
    return false;
  }
  if ((r = qcow2_check (img, false, &res)) < 0 || res.corruptions ||
      res.leaks)
    crashcheck_fail (f, "after-repair", "after the repair, more writes and a clean "
              "close: check: %s, %" PRIu64 " corruptions, %" PRIu64 " leaks",
              errstr (-r), res.corruptions, res.leaks);
  else if (!(got = wl_read_all (img, &buf_got)))
    crashcheck_fail (f, "after-repair", "read after the repair: %s",
              errstr (errno));
  else if (memcmp (got, run->model.acked, run->model.size) != 0) {
    uint64_t i = crashcheck_first_difference (got, run->model.acked, run->model.size);
    crashcheck_fail (f, "after-repair", "after the repair, more writes and a clean "
              "close, guest byte %#" PRIx64 " reads %#x, not %#x", i, got[i],
              run->model.acked[i]);
  }
  else if (!crashcheck_raw_data_file (run->setup, img, files, got, true, f))
    ;
  else
    ok = crashcheck_bitmaps (run->setup, files.image, files.len, got, f);
  qcow2_close (img);
  if (ok && qemu) {
    crashcheck_stats.qemu_after++;
    if ((r = crashcheck_qemu (files, out, sizeof out)) != 0) {
      crashcheck_fail (f, "qemu-img-after", "qemu-img check exit %d after the "
                "repair, more writes and a clean close:\n%s", r, out);
      ok = false;
    }
  }
  return ok;
}

/* A process killed right after a flush, everything it wrote in the
 * host's page cache, leaks at most what the engine counted ahead of
 * need: 4 MiB or 64 clusters, whichever is more, as its manual says.
 */
bool
crashcheck_kill_leaks (const struct wl_setup *setup, struct wl_files files,
                       struct failure *f)
{
  uint64_t limit = (UINT64_C (4) << 20) >> setup->cfg->cluster_bits;
  struct qcow2_check_result res = { 0 };
  struct qcow2_image *img;
  bool ok;
  int r;

  if (limit < 64)
    limit = 64;
  if (crashcheck_dirty (files.image, files.len))
    return true;
  img = wl_open_copy (setup, files, true);
  if (!img) {
    crashcheck_fail (f, "kill-leaks", "the image after a flush does not "
                     "open: %s", memenv_last_error (setup->me));
    return false;
  }
  r = qcow2_check (img, false, &res);
  ok = r == 0 && !res.corruptions && res.leaks <= limit;
  if (!ok)
    crashcheck_fail (f, "kill-leaks", "killed after a flush: %s, %" PRIu64
                     " corruptions, %" PRIu64 " clusters leaked (at most %"
                     PRIu64 " allowed)", errstr (-r), res.corruptions,
                     res.leaks, limit);
  crashcheck_stats.kill_checks++;
  if (crashcheck_stats.kill_leaks_limit == 0 ||
      res.leaks * crashcheck_stats.kill_leaks_limit >
      crashcheck_stats.kill_leaks_max * limit) {
    crashcheck_stats.kill_leaks_max = res.leaks;
    crashcheck_stats.kill_leaks_limit = limit;
  }
  qcow2_close (img);
  return ok;
}

/* Everything a crash image must pass (see the top of the file). */
bool
crashcheck_verify (const struct wl_setup *setup, const struct wl_model *m,
                   struct wl_files files, uint64_t seed, struct failure *f)
{
  const uint8_t *buf = files.image;
  size_t len = files.len;
  bool dirty = crashcheck_dirty (buf, len), qemu = crashcheck_sampled ();
  struct qcow2_check_result res = { 0 };
  struct qcow2_image *img;
  uint8_t *data = NULL, *again = NULL;
  struct wl_run run;
  struct wl_rng rng = { seed };
  char why[sizeof f->why], out[4096];
  bool ok = false;
  int r;

  crashcheck_stats.images++;
  crashcheck_stats.dirty += dirty;
  memenv_clear_errors (setup->me);
  img = wl_open_copy (setup, files, true);
  if (!img) {
    crashcheck_fail (f, "open", "the crash image does not open: %s",
              memenv_last_error (setup->me));
    return false;
  }
  if (!(data = wl_read_all (img, &buf_data)))
    crashcheck_fail (f, "read", "reading the crash image: %s",
              memenv_last_error (setup->me));
  else if (!wl_model_check (m, data, why, sizeof why))
    crashcheck_fail (f, "data", "%s", why);
  else if (!crashcheck_bitmaps (setup, buf, len, data, f))
    ;
  else if (!dirty && ((r = qcow2_check (img, false, &res)) < 0 ||
                      res.corruptions))
    crashcheck_fail (f, "check", "our check: %s, %" PRIu64 " corruptions",
              errstr (-r), res.corruptions);
  else
    ok = true;
  crashcheck_stats.leaky += ok && !dirty && res.leaks > 0;
  qcow2_close (img);
  if (ok && qemu && !dirty) {
    crashcheck_stats.qemu++;
    r = crashcheck_qemu (files, out, sizeof out);
    if (r != 0 && r != 3) {
      crashcheck_fail (f, "qemu-img", "qemu-img check exit %d (our check: %"
                PRIu64 " leaks):\n%s", r, res.leaks, out);
      ok = false;
    }
  }
  if (ok && qemu && dirty)
    ok = crashcheck_qemu_repair (setup, files, data, m->size, f);
  if (!ok)
    return false;

  /* Repair, then use the image again. */
  ok = false;
  if ((r = wl_run_start (&run, setup, files, data)) < 0)
    crashcheck_fail (f, "repair", "the crash image does not open read-write: %s",
              memenv_last_error (setup->me));
  else if ((r = wl_exec (&run, &(struct wl_op) { .kind = WL_REPAIR })) < 0)
    crashcheck_fail (f, "repair", "repair: %s (%" PRIu64 " corruptions)",
              errstr (-r), run.check.corruptions);
  else if ((r = wl_exec (&run, &(struct wl_op) { .kind = WL_CHECK })) < 0 ||
           run.check.leaks)
    crashcheck_fail (f, "repair", "after the repair: %s, %" PRIu64 " corruptions, %"
              PRIu64 " leaks", errstr (-r), run.check.corruptions,
              run.check.leaks);
  else if (!(again = wl_read_all (run.img, &buf_again)))
    crashcheck_fail (f, "repair", "reading after the repair: %s", errstr (errno));
  else if (memcmp (again, data, m->size) != 0) {
    uint64_t i = crashcheck_first_difference (again, data, m->size);
    crashcheck_fail (f, "repair", "the repair changed guest byte %#" PRIx64
              " from %#x to %#x", i, data[i], again[i]);
  }
  else
    ok = crashcheck_after_repair (&run, &rng, qemu, f);
  wl_run_end (&run);
  return ok;
}

static void
crashcheck_remove_workdir (void)
{
  char path[4096];

  if (!workdir)
    return;
  for (const char *const *n = (const char *const[]) { "crash.qcow2",
         "check.out", "backing.img", "data.raw", NULL }; *n; n++) {
    snprintf (path, sizeof path, "%s/%s", workdir, *n);
    unlink (path);
  }
  rmdir (workdir);
}

void
crashcheck_init (void)
{
  char tmpl[] = "/tmp/crash-sim.XXXXXX";
  char *p = getenv ("PATH"), *copy, *dir;
  bool found = false;

  for (copy = strdup (p ? p : ""), dir = strtok (copy, ":"); dir;
       dir = strtok (NULL, ":")) {
    char path[4096];
    snprintf (path, sizeof path, "%s/qemu-img", dir);
    if (access (path, X_OK) == 0)
      found = true;
  }
  free (copy);
  /* qemu-img check is the oracle of the images: no test without it. */
  if (!found) {
    printf ("test skipped: qemu-img not found\n");
    exit (77);
  }
  workdir = mkdtemp (tmpl) ? strdup (tmpl) : NULL;
  if (!workdir) {
    fprintf (stderr, "mkdtemp: %s\n", errstr (errno));
    exit (EXIT_FAILURE);
  }
  atexit (crashcheck_remove_workdir);
}
