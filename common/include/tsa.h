/* SPDX-License-Identifier: BSD-3-Clause */
/* Clang's thread-safety analysis (-Wthread-safety), as QEMU's
 * include/qemu/clang-tsa.h: a lock is a "capability", and a function
 * says whether it needs it held, takes it or releases it.  Clang then
 * checks every call against what the caller holds.  Other compilers see
 * nothing.  https://clang.llvm.org/docs/ThreadSafetyAnalysis.html
 *
 * In C, clang 14 resolves a capability named in a function's attribute
 * against its parameters (TSA_REQUIRES (img->lock)), but not against
 * the other members of a struct: fields cannot be marked guarded.  A
 * variable at file scope can (TSA_GUARDED_BY (&lock)): data shared
 * under one lock is best kept so, where clang sees every access.
 */
#ifndef QCOW2_TSA_H
#define QCOW2_TSA_H

#if defined (__clang__)
#define TSA_ATTR(x) __attribute__ ((x))
#else
#define TSA_ATTR(x)
#endif

/* A type whose objects are locks. */
#define TSA_CAPABILITY(name) TSA_ATTR (capability (name))
/* The function is called with these held, and returns with them held. */
#define TSA_REQUIRES(...) TSA_ATTR (requires_capability (__VA_ARGS__))
/* The function takes these, and returns with them held. */
#define TSA_ACQUIRE(...) TSA_ATTR (acquire_capability (__VA_ARGS__))
/* The function is called with these held, and returns without them. */
#define TSA_RELEASE(...) TSA_ATTR (release_capability (__VA_ARGS__))
/* The function is called without these held (it takes them itself). */
#define TSA_EXCLUDES(...) TSA_ATTR (locks_excluded (__VA_ARGS__))
/* The same for a lock held shared (a reader's hold of a rwlock). */
#define TSA_REQUIRES_SHARED(...) \
  TSA_ATTR (requires_shared_capability (__VA_ARGS__))
#define TSA_ACQUIRE_SHARED(...) \
  TSA_ATTR (acquire_shared_capability (__VA_ARGS__))
/* Releases a lock however it is held. */
#define TSA_RELEASE_GENERIC(...) \
  TSA_ATTR (release_generic_capability (__VA_ARGS__))
/* The variable is read and written only with the lock held; the
 * object a pointer variable points to, likewise (TSA_PT_GUARDED_BY).
 */
#define TSA_GUARDED_BY(x) TSA_ATTR (guarded_by (x))
#define TSA_PT_GUARDED_BY(x) TSA_ATTR (pt_guarded_by (x))
/* The function's body is not checked: only for the few functions that
 * implement a lock's primitives.
 */
#define TSA_NO_TSA TSA_ATTR (no_thread_safety_analysis)

#endif /* QCOW2_TSA_H */
