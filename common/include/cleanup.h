/* SPDX-License-Identifier: BSD-3-Clause */
/* Scoped cleanup, as nbdkit's common/include/cleanup.h: a pointer
 * declared CLEANUP_FREE is freed when it goes out of scope, on every
 * return, so that a function needs no chain of gotos to free its
 * buffers.  Set it to NULL to hand the buffer over.
 */
#ifndef QCOW2_CLEANUP_H
#define QCOW2_CLEANUP_H

#include <stdlib.h>

static inline void
cleanup_free (void *ptr)
{
  free (*(void **) ptr);
}
#define CLEANUP_FREE __attribute__ ((cleanup (cleanup_free)))

#endif /* QCOW2_CLEANUP_H */
