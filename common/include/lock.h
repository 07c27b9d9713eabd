/* SPDX-License-Identifier: BSD-3-Clause */
/* A mutex that clang's thread-safety analysis knows as a capability
 * (pthread_mutex_t itself cannot be marked: see tsa.h), and a hold of
 * it for the rest of a scope, as nbdkit's ACQUIRE_LOCK_FOR_CURRENT_SCOPE:
 * released as the scope ends, on every return.
 *
 * Clang 14 does not follow a cleanup function, so the analysis is told
 * of a scoped hold as an assertion: the lock is held from there on, to
 * the end of the function.  Use it only where the lock is held to the
 * end of the function, and call functions that TSA_REQUIRES it under
 * it: those calls are checked.
 */
#ifndef QCOW2_LOCK_H
#define QCOW2_LOCK_H

#include <pthread.h>
#include <stdbool.h>

#include "tsa.h"

struct TSA_CAPABILITY ("mutex") lock {
  pthread_mutex_t mutex;
};
#define LOCK_INITIALIZER { PTHREAD_MUTEX_INITIALIZER }

static inline void
lock_acquire (struct lock *l)
  TSA_ACQUIRE (l) TSA_NO_TSA
{
  pthread_mutex_lock (&l->mutex);
}

static inline void
lock_release (struct lock *l)
  TSA_RELEASE (l) TSA_NO_TSA
{
  pthread_mutex_unlock (&l->mutex);
}

/* The scoped hold's primitives: take says whether the lock is needed
 * at all (a lock only some configurations need is still checked as
 * held wherever it would be).
 */
static inline struct lock *
lock_hold (struct lock *l, bool take)
  TSA_ATTR (assert_capability (l)) TSA_NO_TSA
{
  if (!take)
    return NULL;
  pthread_mutex_lock (&l->mutex);
  return l;
}

static inline void
lock_unhold (struct lock **held)
  TSA_NO_TSA
{
  if (*held)
    pthread_mutex_unlock (&(*held)->mutex);
}

#define LOCK_CONCAT_(a, b) a ## b
#define LOCK_CONCAT(a, b) LOCK_CONCAT_ (a, b)
#define ACQUIRE_LOCK_FOR_CURRENT_SCOPE_IF(l, take)                      \
  __attribute__ ((cleanup (lock_unhold), unused))                       \
  struct lock *LOCK_CONCAT (lock_held_, __LINE__) = lock_hold ((l), (take))
#define ACQUIRE_LOCK_FOR_CURRENT_SCOPE(l) \
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE_IF (l, true)

#endif /* QCOW2_LOCK_H */
