/* SPDX-License-Identifier: BSD-3-Clause */
/* Messages: the bottom of the engine, which every module calls.  They
 * go to the environment's callbacks (qcow2_env), never to a stream.
 * A message is one line, what failed and where; what the user can do
 * about it may follow after a newline, and is sent on its own, as a
 * hint (nbdkit would print a second line of one message without its
 * prefix, and syslog keeps one line a message).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

enum log_kind { LOG_ERROR, LOG_DEBUG, LOG_NOTICE };

/* line, its control bytes (but the newlines that split it) as \xHH in
 * safe (4 times its size): names from images and clients must not
 * forge a log line nor carry a terminal's escape sequence.
 */
static char *
log_unforged (char *line, char *safe)
{
  const unsigned char *c = (const unsigned char *) line;
  size_t n = 0;

  while (*c && *c >= 0x20 && *c != 0x7f)
    c++;
  if (!*c)
    return line;
  for (c = (const unsigned char *) line; *c; c++)
    if (*c < 0x20 || *c == 0x7f)
      n += sprintf (safe + n, "\\x%02x", *c);
    else
      safe[n++] = *c;
  safe[n] = '\0';
  return safe;
}

/* Format a message, prefixed if prefix is not NULL, and send its first
 * line as kind says; each further line is a hint: to env->hint after
 * an error (dropped without one), as a notice or debug line of its
 * own, starting "hint: ", after those.
 */
static void __attribute__ ((format (printf, 5, 0)))
log_vmsg (const struct qcow2_env *env, enum log_kind kind, const char *path,
          const char *prefix, const char *fmt, va_list ap)
{
  char msg[1024], hint[sizeof msg * 4 + 8], safe[sizeof msg * 4];
  void (*emit) (void *opaque, const char *msg);
  char *line = msg, *nl;
  int n = 0;

  if (prefix)
    n = snprintf (msg, sizeof msg, "%s: ", prefix);
  if (n < 0 || (size_t) n >= sizeof msg)
    n = 0;
  vsnprintf (msg + n, sizeof msg - n, fmt, ap);
  for (bool first = true; line; first = false, line = nl) {
    if ((nl = strchr (line, '\n')))
      *nl++ = '\0';
    line = log_unforged (line, safe);
    if (!first && kind != LOG_ERROR) {
      snprintf (hint, sizeof hint, "hint: %s", line);
      line = hint;
    }
    if (kind == LOG_NOTICE) {
      if (env->notice)
        env->notice (env->opaque, path, line);
      continue;
    }
    emit = kind == LOG_DEBUG ? env->debug : first ? env->error : env->hint;
    if (emit)
      emit (env->opaque, line);
  }
}

void
env_err (const struct qcow2_env *env, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  log_vmsg (env, LOG_ERROR, NULL, NULL, fmt, ap);
  va_end (ap);
}

void
log_named_error (const struct qcow2_env *env, const char *name,
                 const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  log_vmsg (env, LOG_ERROR, NULL, name, fmt, ap);
  va_end (ap);
}

void
log_named_debug (const struct qcow2_env *env, const char *name,
                 const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  log_vmsg (env, LOG_DEBUG, NULL, name, fmt, ap);
  va_end (ap);
}

/* Errors name the file they are about: in a backing chain the user
 * needs to know which layer is bad.
 */
void
log_error (const struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  log_vmsg (img->env, LOG_ERROR, NULL, img->path, fmt, ap);
  va_end (ap);
}

void
log_notice (const struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  log_vmsg (img->env, LOG_NOTICE, img->path, NULL, fmt, ap);
  va_end (ap);
}

void
log_debug (const struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  log_vmsg (img->env, LOG_DEBUG, NULL, img->path, fmt, ap);
  va_end (ap);
}
