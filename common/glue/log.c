/* SPDX-License-Identifier: BSD-3-Clause */
/* The glue's messages: the engine's and fileio's errors, debug lines
 * and notices to nbdkit's log (notices where introspect.c finds
 * it), and what is logged of an image once open (read-only, repaired,
 * the cache's and flushes' totals, --dump-plugin).
 */
#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "errstr.h"
#include "fileio.h"
#include "glue.h"

/* The module's name, in notices. */
static const char *module_name = "qcow2";

void
glue_load (const char *name, const char *password_key, unsigned io_threads)
{
  assert (io_threads <= GLUE_IO_THREADS_MAX);
  module_name = name;
  glue_env.password_key = password_key;
  glue.engine.io_threads = io_threads;
  glue_introspect_load ();
}

void
glue_error (void *opaque, const char *msg)
{
  nbdkit_error ("%s", msg);
}

void
glue_env_hint (void *opaque, const char *msg)
{
  nbdkit_error ("hint: %s", msg);
}

void
glue_debug (void *opaque, const char *msg)
{
  nbdkit_debug ("%s", msg);
}

void
glue_notice (void *opaque, const char *path, const char *msg)
{
  glue_log_notice (module_name, path, msg);
}

void
glue_noticef (const char *path, const char *fmt, ...)
{
  va_list ap;
  char *msg;

  va_start (ap, fmt);
  if (vasprintf (&msg, fmt, ap) >= 0) {
    glue_notice (NULL, path, msg);
    free (msg);
  }
  va_end (ap);
}

void
glue_hint (const char *fmt, ...)
{
  va_list ap;
  char *msg;

  va_start (ap, fmt);
  if (vasprintf (&msg, fmt, ap) >= 0) {
    nbdkit_error ("hint: %s", msg);
    free (msg);
  }
  va_end (ap);
}

const char *
glue_why_remedy (char *why)
{
  char *nl = why ? strchr (why, '\n') : NULL;

  if (!nl)
    return NULL;
  *nl = '\0';
  return nl + 1;
}

void
glue_file_error (char *why, int err, const char *fmt, ...)
{
  const char *remedy = glue_why_remedy (why);
  va_list ap;
  char *what;

  va_start (ap, fmt);
  if (vasprintf (&what, fmt, ap) >= 0) {
    nbdkit_error ("%s: %s", what, why ? why : errstr (err));
    free (what);
  }
  va_end (ap);
  if (remedy)
    glue_hint ("%s", remedy);
  free (why);
}

/* A password given, when no layer is encrypted: the admin believes the
 * disk encrypted, and every write would be stored in clear.  Refused
 * rather than logged as a notice, which may go unread in a log (QEMU
 * says nothing of a key secret given for a clear image, but refuses
 * encrypt.format=luks for one).  Returns 0, or -1 after logging an
 * error.
 */
static int
glue_opened_password (struct qcow2_image *img, const char *name)
{
  const char *key;

  /* With encrypt-format=luks, the password is for the image to make,
   * and create=if-missing says if the one found is not encrypted.
   */
  if ((!glue.password_given && !glue.backing_password_given) ||
      glue.create.opts.luks || qcow2_chain_encrypted (img))
    return 0;
  key = glue.password_given ? glue_env.password_key
      : glue_env.backing_password_key ? glue_env.backing_password_key
      : "backing-password";
  nbdkit_error ("%s is not encrypted, nor is any backing file, but %s= "
                "was given: the disk is stored in clear", name, key);
  glue_hint ("without %s= it is served as it is; an encrypted copy: "
             "\"qemu-img convert --object secret,id=sec0,file=KEYFILE "
             "-O qcow2 -o encrypt.format=luks,encrypt.key-secret=sec0 "
             "IMAGE COPY.qcow2\"", key);
  return -1;
}

int
glue_opened_check (struct qcow2_image *img, const char *name,
                   bool asked_readonly)
{
  if (glue_opened_password (img, name) == -1)
    return -1;
  if (qcow2_is_corrupt (img) && !asked_readonly && !glue.engine.snapshot) {
    qcow2_check_writable (img);         /* says why, and what to do */
    return -1;
  }
  return 0;
}

int
glue_opened (struct qcow2_image *img, const char *name, bool asked_readonly,
             const char *why)
{
  const char *reason;

  if (glue_opened_check (img, name, asked_readonly) == -1)
    return -1;
  if (why)
    glue_noticef (name, "served read-only: %s", why);
  else if (glue.engine.snapshot)        /* asked for: not news */
    nbdkit_debug ("%s: snapshot %s served read-only", name,
                  glue.engine.snapshot);
  else if (!asked_readonly && (reason = qcow2_readonly_reason (img)))
    glue_noticef (name, "served read-only: %s", reason);
  return 0;
}

void
glue_close_stats (struct qcow2_image *img)
{
  struct qcow2_cache_stats st;

  if (!qcow2_debug_cache)
    return;
  qcow2_cache_stats (img, &st);
  nbdkit_debug ("L2 cache: %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
                " evictions (%" PRIu64 " slices of %" PRIu64 " bytes)",
                st.hits, st.misses, st.evictions, st.slices, st.slice_size);
}

void
glue_flushed (struct qcow2_image *img)
{
  if (qcow2_debug_flush)
    nbdkit_debug ("flush: %" PRIu64 " host flushes so far",
                  qcow2_host_flushes (img));
}

void
glue_dump_plugin (void)
{
  printf ("qcow2_version=%s\n", PACKAGE_VERSION);
  printf ("qcow2_zlib=yes\n");
  printf ("qcow2_zstd=yes\n");
  printf ("qcow2_versions=2,3\n");
  /* Values are tokens, as nbdkit's own keys: no spaces. */
  printf ("qcow2_read=qemu-img-images,luks\n");
  printf ("qcow2_write=qemu-img-images,luks,compressed\n");
  printf ("qcow2_features=backing,data-file,extended-l2,lazy-refcounts,"
          "persistent-bitmaps,snapshot-export,create,create-if-missing,"
          "locking,overlap-check,repair-leaks,stream,backing-policy,"
          "cache-none,fast-zero,luks,compressed-writes,persistent-overlay\n");
  printf ("qcow2_encryption=luks\n");
  printf ("qcow2_compressed_writes=zlib,zstd\n");
  printf ("qcow2_io_threads_max=%d\n", GLUE_IO_THREADS_MAX);
  printf ("qcow2_remote_backing=nbd,nbds,nbd+unix,nbds+unix,http,https,"
          "ssh,json\n");
  /* stream=true (the filter's qcow2-overlay-stream=true), and the
   * backing-protocols=, backing-root=, backing-insecure= policy.
   */
  printf ("qcow2_stream=yes\n");
  printf ("qcow2_backing_policy=yes\n");
}

/* Leaked clusters (a crash leaves some) are reclaimed, and a dirty
 * image gets its refcounts rebuilt, before any client connects; what
 * qcow2_check cannot repair is refused.
 */
int
glue_repair (struct qcow2_image *img, const char *name)
{
  struct qcow2_check_result res;

  if (!qcow2_can_write (img)) {
    nbdkit_error ("repair=leaks: %s cannot be written: %s", name,
                  qcow2_readonly_reason (img));
    return -1;
  }
  if (qcow2_check (img, true, &res) < 0)
    return -1;
  if (res.corruptions) {
    nbdkit_error ("repair=leaks: %s: %" PRIu64 " errors remain: not served",
                  name, res.corruptions);
    glue_hint ("a leak repair cannot fix them: \"qemu-img check\" tells "
               "more");
    return -1;
  }
  nbdkit_debug ("repair=leaks: %" PRIu64 " leaked clusters reclaimed",
                res.leaks_fixed);
  return 0;
}

/* Files not locked where locking=auto finds no OFD locks. */
static void
glue_lock_notice (const char *path, const char *msg)
{
  glue_notice (NULL, path, msg);
}

static void
glue_lock_debug (const char *path, const char *msg)
{
  nbdkit_debug ("%s: %s", path, msg);
}

struct fileio_options glue_file_options = {
  .notice = glue_lock_notice,
  .debug = glue_lock_debug,
};
