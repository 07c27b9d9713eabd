/* SPDX-License-Identifier: BSD-3-Clause */
/* Messages: the bottom of the engine, which every module calls.  They
 * go to the environment's callbacks (qcow2_env), never to a stream.
 */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

/* Format a message, prefixed if prefix is not NULL, for emit (one of
 * env's callbacks, which may be NULL).
 */
static void __attribute__ ((format (printf, 4, 0)))
log_vmsg (const struct qcow2_env *env,
          void (*emit) (void *opaque, const char *msg), const char *prefix,
          const char *fmt, va_list ap)
{
  char msg[1024];
  int n = 0;

  if (prefix)
    n = snprintf (msg, sizeof msg, "%s: ", prefix);
  if (n < 0 || (size_t) n >= sizeof msg)
    n = 0;
  vsnprintf (msg + n, sizeof msg - n, fmt, ap);
  if (emit)
    emit (env->opaque, msg);
}

void
env_err (const struct qcow2_env *env, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  log_vmsg (env, env->error, NULL, fmt, ap);
  va_end (ap);
}

void
log_named_error (const struct qcow2_env *env, const char *name,
                 const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  log_vmsg (env, env->error, name, fmt, ap);
  va_end (ap);
}

void
log_named_debug (const struct qcow2_env *env, const char *name,
                 const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  log_vmsg (env, env->debug, name, fmt, ap);
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
  log_vmsg (img->env, img->env->error, img->path, fmt, ap);
  va_end (ap);
}

void
log_notice (const struct qcow2_image *img, const char *fmt, ...)
{
  char msg[1024];
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (msg, sizeof msg, fmt, ap);
  va_end (ap);
  if (img->env->notice)
    img->env->notice (img->env->opaque, img->path, msg);
}

void
log_debug (const struct qcow2_image *img, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  log_vmsg (img->env, img->env->debug, img->path, fmt, ap);
  va_end (ap);
}
