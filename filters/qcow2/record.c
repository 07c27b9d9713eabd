/* SPDX-License-Identifier: BSD-3-Clause */
/* What an overlay's FILE records of the disk below it, as its backing
 * file name (format raw): the name given (qcow2-overlay-backing=), or
 * one of ours, naming the plugin and the filters and keys below it; and
 * the checks of a FILE continued against what nbdkit is given, with
 * the commands that would make them agree.  It keeps no state: the
 * overlay (overlay.c) says what is given.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <nbdkit-filter.h>

#include "errstr.h"
#include "filter.h"
#include "glue.h"
#include "qcow2.h"

/* What a FILE made without qcow2-overlay-backing= records as its
 * backing file (format raw): a json: name of a driver QEMU does not
 * have, so that QEMU refuses FILE ("Unknown driver") rather than read
 * it as a whole disk, holding what the plugin below is (see
 * below_identity) and what is between (below_stack).  FILEs made
 * before the stack was recorded have no "stack" (record_read).
 */
#define RECORD_JSON_HEAD \
  "json:{\"driver\":\"raw\",\"file\":{\"driver\":\"nbdkit-qcow2-overlay\"," \
  "\"plugin\":\""
#define RECORD_JSON_STACK "\",\"stack\":\""
#define RECORD_JSON_TAIL "\"}}"

/* Writes what, JSON-escaped, at p.  Returns the end. */
static char *
record_json_escape (char *p, const char *what)
{
  for (const unsigned char *c = (const unsigned char *) what; *c; c++) {
    if (*c == '"' || *c == '\\')
      *p++ = '\\', *p++ = *c;
    else if (*c < 0x20)
      p += sprintf (p, "\\u%04x", *c);
    else
      *p++ = *c;
  }
  return p;
}

/* RECORD_JSON_HEAD, plugin, RECORD_JSON_STACK, stack (both
 * JSON-escaped), RECORD_JSON_TAIL.
 */
char *
record_name (const char *plugin, const char *stack)
{
  size_t len = strlen (RECORD_JSON_HEAD) + 6 * strlen (plugin) +
    strlen (RECORD_JSON_STACK) + 6 * strlen (stack) +
    strlen (RECORD_JSON_TAIL) + 1;
  char *name = malloc (len), *p;

  if (!name) {
    nbdkit_error ("malloc: %s", errstr (errno));
    return NULL;
  }
  p = record_json_escape (stpcpy (name, RECORD_JSON_HEAD), plugin);
  p = record_json_escape (stpcpy (p, RECORD_JSON_STACK), stack);
  assert ((size_t) (p - name) + strlen (RECORD_JSON_TAIL) < len);
  strcpy (p, RECORD_JSON_TAIL);
  return name;
}

/* Reads the JSON string at p, as record_json_escape wrote it, up to
 * its closing quote, into *out (malloc'd).  Returns the end, past the
 * quote, or NULL if it is not one of ours (or on error, *out NULL).
 */
static const char *
record_json_string (const char *p, char **out)
{
  char *q = *out = malloc (strlen (p) + 1);
  unsigned c;
  int n;

  if (!q)
    return NULL;
  for (; *p != '"'; p++) {
    if (*p == '\0')
      return NULL;
    if (*p != '\\')
      *q++ = *p;
    else if (p[1] == '"' || p[1] == '\\')
      *q++ = *++p;
    else if (sscanf (p, "\\u%4x%n", &c, &n) == 1 && n == 6 && c && c < 0x20) {
      *q++ = c;
      p += 5;
    }
    else
      return NULL;
  }
  *q = '\0';
  return p + 1;
}

/* Reads what a name of ours records.  Returns true, with *plugin and
 * *stack (NULL in a FILE made before the stack was recorded), or false
 * if name is not one of ours.  Both malloc'd.
 */
static bool
record_read (const char *name, char **plugin, char **stack)
{
  size_t head = strlen (RECORD_JSON_HEAD);
  const char *p;

  *plugin = *stack = NULL;
  if (strncmp (name, RECORD_JSON_HEAD, head) == 0 &&
      (p = record_json_string (name + head, plugin))) {
    if (strcmp (p - 1, RECORD_JSON_TAIL) == 0)
      return true;
    if (strncmp (p - 1, RECORD_JSON_STACK,
                 strlen (RECORD_JSON_STACK)) == 0 &&
        (p = record_json_string (p - 1 + strlen (RECORD_JSON_STACK),
                                  stack)) &&
        strcmp (p - 1, RECORD_JSON_TAIL) == 0)
      return true;
  }
  free (*plugin);
  free (*stack);
  *plugin = *stack = NULL;
  return false;
}

/* Returns s as one shell word, for a command to paste: as it is if it
 * needs no quotes (always: in single quotes), else in single quotes;
 * NULL on error (logged).
 */
static char *
record_shell_word (const char *s, bool always)
{
  char *word = malloc (4 * strlen (s) + 3), *p = word;

  if (!word) {
    nbdkit_error ("malloc: %s", errstr (errno));
    return NULL;
  }
  if (!always && s[0] &&
      strspn (s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
              "0123456789_/.,:+=@%-") == strlen (s))
    return strcpy (word, s);
  *p++ = '\'';
  for (; *s; s++)
    p = *s == '\'' ? stpcpy (p, "'\\''") : (*p = *s, p + 1);
  strcpy (p, "'");
  return word;
}


/* Returns 1 if paths a and b are one file, 0 if two, -1 if either is
 * missing.
 */
static int
record_same_file (const char *a, const char *b)
{
  struct stat sa, sb;

  if (stat (a, &sa) == -1 || stat (b, &sb) == -1)
    return -1;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* It would hold the changes to itself. */
bool
record_is_below (const char *file)
{
  const char *served = below_served_file ();

  if (!served || record_same_file (file, served) != 1)
    return false;
  nbdkit_error ("qcow2-overlay=%s is the file the plugin serves", file);
  glue_hint ("FILE keeps the changes to the plugin's disk: name another "
             "file (a new one is made)");
  return true;
}


/* Where the plugin's file is the disk (no filter between makes another
 * disk of it, as the xz or partition filters do).  A name that is not
 * a local file (a URL, a file since moved) cannot be compared.
 */
bool
record_other_file (const char *file, const char *name)
{
  const char *served = below_served_file ();
  char *path;
  bool other;

  if (!served || below_stack ()[0] ||
      (name[0] != '/' && !qcow2_name_is_relative (name)))
    return false;
  if (name[0] == '/')
    path = strdup (name);
  else if (asprintf (&path, "%.*s/%s",
                     (int) (strrchr (file, '/') - file), file, name) == -1)
    path = NULL;
  if (!path)
    return false;
  other = record_same_file (path, served) == 0;
  free (path);
  return other;
}

/* Checks a name of ours recorded.  Returns NULL if it names this disk,
 * else why not.
 * One made before the stack below was recorded names the plugin only:
 * *unchecked, the stack not compared.
 */
static const char *
record_our_mismatch (const char *name, bool *unchecked)
{
  char *plugin, *stack;
  const char *why = NULL;

  if (!record_read (name, &plugin, &stack))
    why = "another disk below it";
  else if (!below_same_plugin (plugin))
    why = "another disk below it";
  else if (stack && strcmp (stack, below_stack ()) != 0)
    why = "other filters or keys below it";
  else
    *unchecked = !stack && below_stack ()[0];
  free (plugin);
  free (stack);
  return why;
}

/* Compares what FILE's backing file name says of the disk below it with
 * what is given.  Returns NULL if it is this disk, else why not.
 */
static const char *
record_mismatch (const struct qcow2_info *i, const struct record_given *g,
                 bool *unchecked)
{
  const char *why;

  *unchecked = false;
  if (!i->backing)
    return "a standalone image, whose unallocated clusters read as zeros "
      "in QEMU";
  if (i->backing_format && strcmp (i->backing_format, "raw") != 0)
    return "a chain of its own, which QEMU reads and the plugin's disk "
      "would stand in for";
  if (g->backing) {
    if (strcmp (i->backing, g->backing) != 0)
      return "another disk below it";
  }
  else if (strncmp (i->backing, RECORD_JSON_HEAD,
                    strlen (RECORD_JSON_HEAD)) == 0 &&
           (why = record_our_mismatch (i->backing, unchecked)))
    return why;
  if (record_other_file (g->file, i->backing))
    return "another file below it than the plugin's";
  return NULL;
}

void
record_not_qcow2 (const char *file)
{
  nbdkit_error ("qcow2-overlay: %s is not a qcow2 image: name a new file, "
                "or remove it", file);
}

/* Returns FILE as QEMU opens it alone, without its backing file, as one
 * shell word (a json: name), or NULL on error (logged).
 */
static char *
record_file_alone (const char *file)
{
  static const char head[] =
    "json:{\"driver\":\"qcow2\",\"backing\":null,"
    "\"file\":{\"driver\":\"file\",\"filename\":\"";
  char *name = malloc (strlen (head) + 6 * strlen (file) + 4), *word;

  if (!name) {
    nbdkit_error ("malloc: %s", errstr (errno));
    return NULL;
  }
  strcpy (record_json_escape (stpcpy (name, head), file), "\"}}");
  word = record_shell_word (name, true);
  free (name);
  return word;
}

/* It must be the backing name given, else ours naming this plugin and
 * the stack below, or, with qcow2-overlay-stream=true given again,
 * none (FILE streamed and detached).
 */
int
record_check (struct qcow2_image *img, const struct record_given *g)
{
  const char *given = g->backing ? g->backing : g->own_name;
  char *b = NULL, *f = NULL;
  struct qcow2_info i;
  const char *why, *format;
  bool unchecked;

  qcow2_get_info (img, &i);
  /* A format without a name (left by a detach) says nothing. */
  format = i.backing ? i.backing_format : NULL;
  if (!i.backing && glue_stream.on && glue_stream.detach)
    return 1;                   /* logged by overlay_open, as it serves */
  if (!(why = record_mismatch (&i, g, &unchecked))) {
    if (unchecked && (b = record_shell_word (g->own_name, true)) &&
        (f = record_shell_word (g->file, false)))
      glue_noticef (g->file, "FILE records the plugin only (made by an "
                    "earlier version): what is between, %s, is not checked; "
                    "\"qemu-img rebase -u -b %s -F raw %s\" records it",
                    below_stack (), b, f);
    free (b);
    free (f);
    return 0;
  }
  if (g->force) {
    glue_noticef (g->file, "qcow2-overlay-force=true: served over "
                  "%s although FILE records %s%s%s%s%s",
                  below_description (),
                  i.backing ? "\"" : "no backing file", i.backing ?
                  i.backing : "", i.backing ? "\"" : "",
                  format ? " format " : "", format ? format : "");
    return 0;
  }
  nbdkit_error ("qcow2-overlay: %s records %s%s%s%s%s (%s), but the "
                "plugin serves %s", g->file,
                i.backing ? "\"" : "no backing file", i.backing ? i.backing
                : "", i.backing ? "\"" : "", format ? " format " : "",
                format ? format : "", why, below_description ());
  if (!(f = record_shell_word (g->file, false)))
    return -1;
  if (!i.backing)
    glue_hint ("\"nbdkit qcow2 %s\" serves it; one streamed in by "
               "qcow2-overlay-stream=true holds the whole disk, and the "
               "filter with that key serves it alone", f);
  else if ((b = record_shell_word (given, true)))
    glue_hint ("if FILE's changes belong over it, \"qemu-img rebase -u -b "
               "%s -F raw %s\" records it; else name a new FILE "
               "(qcow2-overlay-force=true serves it anyway)", b, f);
  free (b);
  free (f);
  return -1;
}

int
record_check_size (struct qcow2_image *img, const char *file, int64_t size)
{
  uint64_t want = (size + 511) & ~INT64_C (511);
  struct qcow2_info i;
  char *f;

  qcow2_get_info (img, &i);
  if (i.size == want)
    return 0;
  nbdkit_error ("qcow2-overlay: %s holds a disk of %" PRIu64 " bytes, but "
                "the plugin's disk is %" PRId64 " bytes", file,
                i.size, size);
  /* QEMU opens FILE only without its backing file (ours it cannot
   * open); shrinking drops what FILE holds past the new end.
   */
  if (!(f = record_file_alone (file)))
    return -1;
  glue_hint ("an overlay is as large as the disk below it: if the "
             "plugin's disk has %s, \"qemu-img resize%s %s %" PRIu64 "\" %s "
             "FILE%s", i.size < want ? "grown" : "shrunk",
             i.size < want ? "" : " --shrink", f, want,
             i.size < want ? "grows" : "shrinks",
             i.size < want ? "" : " (what it holds past the new end is "
             "lost)");
  free (f);
  return -1;
}
