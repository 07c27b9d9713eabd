/* SPDX-License-Identifier: BSD-3-Clause */
/* The one mutex wrapper of the tree: a mutex that clang's thread-safety
 * analysis knows as a capability (pthread_mutex_t itself cannot be
 * marked: see tsa.h), its condition variables, and a hold of it for the
 * rest of a scope, as nbdkit's ACQUIRE_LOCK_FOR_CURRENT_SCOPE: released
 * as the scope ends, on every return.
 *
 * Clang 14 does not follow a cleanup function, so the analysis is told
 * of a scoped hold as an assertion: the lock is held from there on, to
 * the end of the function.  Use it only where the lock is held to the
 * end of the function, and call functions that TSA_REQUIRES it under
 * it: those calls are checked.
 *
 * These primitives are the only bodies the analysis does not check.
 */
#ifndef QCOW2_LOCK_H
#define QCOW2_LOCK_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#include "tsa.h"

struct TSA_CAPABILITY ("mutex") lock {
  pthread_mutex_t mutex;
};
#define LOCK_INITIALIZER { PTHREAD_MUTEX_INITIALIZER }

static inline void
lock_init (struct lock *l)
  TSA_NO_TSA
{
  pthread_mutex_init (&l->mutex, NULL);
}

static inline void
lock_destroy (struct lock *l)
  TSA_NO_TSA
{
  pthread_mutex_destroy (&l->mutex);
}

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

/* A condition variable waited on with a lock (lock_wait,
 * lock_wait_until).  Its deadlines are on the monotonic clock, so that
 * a change of the time of day neither ends a wait early nor stretches
 * it.
 */
static inline void
lock_cond_init (pthread_cond_t *cond)
{
  pthread_condattr_t attr;

  pthread_condattr_init (&attr);
  pthread_condattr_setclock (&attr, CLOCK_MONOTONIC);
  pthread_cond_init (cond, &attr);
  pthread_condattr_destroy (&attr);
}

/* Wait on cond, which releases l meanwhile; held again on return. */
static inline void
lock_wait (struct lock *l, pthread_cond_t *cond)
  TSA_REQUIRES (l) TSA_NO_TSA
{
  pthread_cond_wait (cond, &l->mutex);
}

/* The same, until the monotonic clock reaches deadline at most.
 * Returns whether the deadline passed (else the wait was woken, or
 * woke spuriously: the caller checks its condition again).
 */
static inline bool
lock_wait_until (struct lock *l, pthread_cond_t *cond,
                 const struct timespec *deadline)
  TSA_REQUIRES (l) TSA_NO_TSA
{
  return pthread_cond_timedwait (cond, &l->mutex, deadline) == ETIMEDOUT;
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
