/* SPDX-License-Identifier: BSD-3-Clause */
/* An export's gate: every client request passes it (an atomic count,
 * nothing more while it is open); the control socket holds it shut
 * while it changes the export's image (a snapshot, a commit's switch:
 * requests then wait, those in flight finish first) or closes it for
 * good (block-export-del: requests then fail with ESHUTDOWN).  The
 * waits are on one lock and condition for all exports: they are rare.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>

#include "lock.h"
#include "plugin.h"

static struct lock gate_lock = LOCK_INITIALIZER;
static pthread_cond_t gate_changed = PTHREAD_COND_INITIALIZER;

bool
gate_enter (struct plugin_export *e)
{
  for (;;) {
    int g;

    __atomic_add_fetch (&e->inflight, 1, __ATOMIC_SEQ_CST);
    g = __atomic_load_n (&e->gate, __ATOMIC_SEQ_CST);
    if (g == GATE_OPEN)
      return true;
    gate_leave (e);
    if (g == GATE_CLOSED) {
      errno = ESHUTDOWN;
      return false;
    }
    lock_acquire (&gate_lock);
    while (__atomic_load_n (&e->gate, __ATOMIC_SEQ_CST) == GATE_HELD)
      lock_wait (&gate_lock, &gate_changed);
    lock_release (&gate_lock);
  }
}

void
gate_leave (struct plugin_export *e)
{
  if (__atomic_sub_fetch (&e->inflight, 1, __ATOMIC_SEQ_CST) == 0 &&
      __atomic_load_n (&e->gate, __ATOMIC_SEQ_CST) != GATE_OPEN) {
    lock_acquire (&gate_lock);
    pthread_cond_broadcast (&gate_changed);
    lock_release (&gate_lock);
  }
}

void
gate_shut (struct plugin_export *e, enum gate_state how)
{
  lock_acquire (&gate_lock);
  __atomic_store_n (&e->gate, how, __ATOMIC_SEQ_CST);
  while (__atomic_load_n (&e->inflight, __ATOMIC_SEQ_CST) > 0)
    lock_wait (&gate_lock, &gate_changed);
  lock_release (&gate_lock);
}

void
gate_open (struct plugin_export *e)
{
  lock_acquire (&gate_lock);
  __atomic_store_n (&e->gate, GATE_OPEN, __ATOMIC_SEQ_CST);
  pthread_cond_broadcast (&gate_changed);
  lock_release (&gate_lock);
}
