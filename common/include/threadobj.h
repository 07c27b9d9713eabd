/* SPDX-License-Identifier: BSD-3-Clause */
/* A thread's own object, made on its first use (a buffer, a ring, a
 * compression context), freed by its key's destructor.  The key must
 * have been made: a user checks what pthread_key_create returned and
 * fails what needs the key (fileio: an O_DIRECT open; compress.c: each
 * compressed cluster), rather than pass this a key that is not one.
 */
#ifndef QCOW2_THREADOBJ_H
#define QCOW2_THREADOBJ_H

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

/* Returns this thread's object under key, size bytes zeroed if it had
 * none (then *made, if given, is set), or NULL (out of memory).
 */
static inline void *
thread_object (pthread_key_t key, size_t size, bool *made)
{
  void *t = pthread_getspecific (key);

  if (made)
    *made = false;
  if (t)
    return t;
  t = calloc (1, size);
  if (t && pthread_setspecific (key, t) != 0) {
    free (t);
    return NULL;
  }
  if (made)
    *made = t != NULL;
  return t;
}

#endif /* QCOW2_THREADOBJ_H */
