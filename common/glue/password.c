/* SPDX-License-Identifier: BSD-3-Clause */
/* The glue's passwords (password=, backing-password=, and the filter's
 * qcow2-* spellings): read as nbdkit reads them, kept for the engine
 * until the image is open, then wiped.
 */
#include <assert.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "checked.h"
#include "glue.h"

/* Wipe and free a string holding a secret. */
static void
glue_wipe (const char *p)
{
  if (p) {
    explicit_bzero ((char *) p, strlen (p));
    free ((char *) p);
  }
}

/* Returns the whole of the file a +FILE password came from, if it holds
 * more than nbdkit read (its first line, without the newline), else
 * NULL, also if it cannot be read (nbdkit's reading stands).
 */
static char *
glue_read_whole_file (const char *path, const char *text)
{
  char buf[4096];
  size_t n = 0;
  FILE *fp = fopen (path, "r");
  char *whole = NULL;

  if (!fp)
    return NULL;
  n = fread (buf, 1, sizeof buf - 1, fp);
  if (!ferror (fp) && feof (fp)) {
    buf[n] = '\0';
    if (strlen (buf) == n && strcmp (buf, text) != 0)
      whole = strdup (buf);
  }
  fclose (fp);
  explicit_bzero (buf, sizeof buf);
  return whole;
}

/* Read a password (SECRET, -, +FILE or -FD) into layer i's. */
static int
glue_read_password (const char *value, unsigned i)
{
  struct qcow2_password *pw;
  char *text, *whole = NULL;

  /* The image's is 0 (perhaps given after a backing layer's), each
   * backing layer's the next: none skipped.
   */
  assert (i <= MAX (glue.passwords_len, 1));

  if (nbdkit_read_password (value, &text) == -1)
    return -1;
  if (value[0] == '+')
    whole = glue_read_whole_file (value + 1, text);
  /* nbdkit takes the newline off what -FD holds, which cannot be read
   * again: it is tried with one too, as QEMU reads a secret file.
   */
  else if (value[0] == '-' && isdigit ((unsigned char) value[1]) &&
           asprintf (&whole, "%s\n", text) == -1)
    whole = NULL;
  if (i >= glue.passwords_len) {
    pw = realloc (glue.passwords, (i + 1) * sizeof *pw);
    if (!pw) {
      nbdkit_error ("%s: out of memory", value);
      glue_wipe (text);
      glue_wipe (whole);
      return -1;
    }
    memset (pw + glue.passwords_len, 0,
            (i + 1 - glue.passwords_len) * sizeof *pw);
    glue.passwords = pw;
    glue.passwords_len = i + 1;
  }
  pw = &glue.passwords[i];
  glue_wipe (pw->text);
  glue_wipe (pw->whole_file);
  pw->text = text;
  pw->whole_file = whole;
  return 0;
}

int
glue_config_password (const char *key, const char *value)
{
  glue.password_given = true;
  return glue_read_password (value, 0);
}

int
glue_config_backing_password (const char *key, const char *value)
{
  glue.backing_password_given = true;
  return glue_read_password (value, MAX (glue.passwords_len, 1));
}

void
glue_forget_password (void)
{
  for (unsigned i = 0; i < glue.passwords_len; i++) {
    glue_wipe (glue.passwords[i].text);
    glue_wipe (glue.passwords[i].whole_file);
  }
  free (glue.passwords);
  glue.passwords = NULL;
  glue.passwords_len = 0;
  glue.engine.passwords = NULL;
  glue.engine.passwords_len = 0;
  glue.create.luks.password = NULL;
}
