/* SPDX-License-Identifier: BSD-3-Clause */
/* The qcow2 filter's keys: its own (backing=, backing-dir=, create=,
 * the passwords), the glue's (shared with the plugin) and the
 * overlay's, told apart from the plugin's (passed on); the checks
 * after the last key; and where relative backing file names are.
 */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "errstr.h"
#include "filter.h"
#include "glue.h"
#include "qcow2.h"

bool config_create;

/* backing-dir=: where backing files named by a relative name are.
 * Without it: the image's folder when the plugin serves a local file,
 * else the current directory (taken at config_complete, before nbdkit
 * runs in the background in "/").
 */
static char *backing_dir;
static char *start_dir;

/* backing=FILE, in the order given: the chain below the image, as
 * written, then (at open) resolved where backing files are.
 */
static char **backing_chain;
static unsigned backing_chain_len;

/* How often nbdkit loaded the filter: the same filter given twice is
 * one shared object, loaded twice, whose state the two would share.
 */
static unsigned load_count;

static int
config_backing (const char *key, const char *value)
{
  char **chain;

  if (glue.engine.no_backing) {
    nbdkit_error ("backing=%s: backing=none ends the chain, so nothing "
                  "can follow it", value);
    return -1;
  }
  if (strcmp (value, "none") == 0) {
    glue.engine.no_backing = true;
    return 0;
  }
  if (value[0] == '\0') {
    nbdkit_error ("backing: empty file name (backing=none serves the image "
                  "without its backing file)");
    return -1;
  }
  chain = realloc (backing_chain, (backing_chain_len + 1) * sizeof *chain);
  if (!chain) {
    nbdkit_error ("realloc: %s", errstr (errno));
    return -1;
  }
  backing_chain = chain;
  chain[backing_chain_len] = strdup (value);
  if (!chain[backing_chain_len]) {
    nbdkit_error ("strdup: %s", errstr (errno));
    return -1;
  }
  backing_chain_len++;
  return 0;
}

/* The filter's own keys (glue.c has those shared with the plugin). */
static const struct glue_option filter_options[] = {
  { "backing", GLUE_FN, .fn = config_backing },
  { "backing-dir", GLUE_PATH, .dest = &backing_dir },
  { "create", GLUE_BOOL, .dest = &config_create },
  { "virtual-size", GLUE_FN, true, .fn = glue_config_create_size },
  { "qcow2-password", GLUE_FN, .any_value = true,
    .fn = glue_config_password },
  { "qcow2-passphrase", GLUE_FN, .any_value = true,
    .fn = glue_config_password },
  { "qcow2-backing-password", GLUE_FN, .any_value = true,
    .fn = glue_config_backing_password },
  { "qcow2-backing-passphrase", GLUE_FN, .any_value = true,
    .fn = glue_config_backing_password },
};

const char config_help[] =
  "backing=none                    Serve the image without its backing file.\n"
  "backing=<NAME>                  The image's backing file, a file or a URL\n"
  "                                (repeat for the chain below it;\n"
  "                                backing=none ends it).\n"
  "backing-dir=<DIR>               Where relative backing file names are\n"
  "                                (default: the folder of the file the\n"
  "                                plugin serves, else the current directory).\n"
  "qcow2-password=<PASSWORD>|-|+FILE|-FD  The password of a LUKS image\n"
  "                                (also qcow2-passphrase=).\n"
  "qcow2-backing-password=<PASSWORD>  That of the next backing file.\n"
  OVERLAY_CONFIG_HELP
  GLUE_CONFIG_HELP
  "io-threads=<N>                  Threads doing the pieces of a fragmented\n"
  "                                request at once (default 16, 0: none).\n"
  "create=true                     Make a new image in the export, which\n"
  "                                must hold no data, as below (which a new\n"
  "                                qcow2-overlay= FILE takes too).\n"
  "virtual-size=<SIZE>             Its virtual size.\n"
  GLUE_CREATE_HELP
  "preallocation=off|metadata|full  As qemu-img's (off).  A new\n"
  "                                qcow2-overlay= FILE: falloc too, each\n"
  "                                with extended-l2=on.\n"
  GLUE_CREATE_SPELLINGS_HELP;

void
config_load (void)
{
  glue_load ("qcow2", "qcow2-password", GLUE_IO_THREADS_FILTER);
  glue_env.backing_password_key = "qcow2-backing-password";
  load_count++;
}

void
config_unload (void)
{
  free (backing_dir);
  free (start_dir);
  for (unsigned i = 0; i < backing_chain_len; i++)
    free (backing_chain[i]);
  free (backing_chain);
}

int
config_key (const char *key, const char *value)
{
  int r = overlay_config (key, value);

  if (r == 0)
    r = glue_config (filter_options,
                     sizeof filter_options / sizeof *filter_options,
                     key, value, NULL);
  if (r == 0 && below_config (key, value) == -1)
    return -1;
  return r;
}

/* create=true's keys, checked before anything is written. */
static int
config_check_create (void)
{
  if (!config_create && glue.create.first_key && !overlay_active ()) {
    nbdkit_error ("%s= describes an image to make: it needs create=true",
                  glue.create.first_key);
    return -1;
  }
  if (config_create && glue.create.size == -1) {
    nbdkit_error ("create=true needs virtual-size=");
    glue_hint ("virtual-size= is the size of the disk the image made in "
               "the plugin's export holds");
    return -1;
  }
  if (config_create && glue_create_check_password ("create=true") == -1)
    return -1;
  if (config_create && backing_chain_len > 0) {
    nbdkit_error ("create=true makes an image without a backing file");
    glue_hint ("backing= names the chain of an image served: give one of "
               "create=true and backing=");
    return -1;
  }
  /* The export of a plugin has no way to give space without writing
   * it.
   */
  if (glue.create.opts.preallocation == QCOW2_PREALLOC_FALLOC &&
      !overlay_active ()) {
    nbdkit_error ("preallocation=falloc: a plugin's export cannot allocate "
                  "space");
    glue_hint ("preallocation=full can: it writes the space");
    return -1;
  }
  glue.create.opts.size = (glue.create.size + 511) & ~INT64_C (511);
  if (config_create && qcow2_create_check (&glue_env, &glue.create.opts) < 0)
    return -1;
  return 0;
}

int
config_complete (void)
{
  if (load_count > 1) {
    nbdkit_error ("--filter=qcow2 is given %u times", load_count);
    glue_hint ("one qcow2 filter serves the image (the same filter loaded "
               "twice would share its state)");
    return -1;
  }
  if (below_config_complete () == -1)
    return -1;
  if (glue_config_complete () == -1 ||
      overlay_config_complete (config_create, backing_chain_len > 0) == -1)
    return -1;
  if (config_check_create () == -1)
    return -1;
  if (!backing_dir && !(start_dir = nbdkit_realpath (".")))
    return -1;
  return 0;
}

int
config_names (const char *file, const char **name, char **names_dir)
{
  char *dir;

  if (backing_dir || !file)
    dir = strdup (backing_dir ? backing_dir : start_dir);
  else {
    assert (file[0] == '/');    /* nbdkit_absolute_path made it */
    dir = strndup (file, strrchr (file, '/') - file);
  }
  if (!dir) {
    nbdkit_error ("strdup: %s", errstr (errno));
    return -1;
  }
  *name = file ? file : below_name ();
  for (unsigned i = 0; i < backing_chain_len; i++) {
    char *path;

    if (!qcow2_name_is_relative (backing_chain[i]))
      continue;
    if (asprintf (&path, "%s%s%s", dir, strcmp (dir, "/") ? "/" : "",
                  backing_chain[i]) == -1) {
      nbdkit_error ("asprintf: %s", errstr (errno));
      free (dir);
      return -1;
    }
    free (backing_chain[i]);
    backing_chain[i] = path;
  }
  glue.engine.backing_chain = (const char *const *) backing_chain;
  glue.engine.backing_chain_len = backing_chain_len;
  /* The engine finds the image's own folder itself. */
  if (file && !backing_dir) {
    free (dir);
    dir = NULL;
  }
  *names_dir = dir;
  return 0;
}
