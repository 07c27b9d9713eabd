/* SPDX-License-Identifier: BSD-3-Clause */
/* The description of an errno value, without strerror's locale
 * machinery: thread-safe, and it never takes glibc's locale lock (which,
 * under AddressSanitizer, can be left held and deadlock nbdkit at exit).
 */
#ifndef QCOW2_ERRSTR_H
#define QCOW2_ERRSTR_H

#include <string.h>

static inline const char *
errstr (int err)
{
  const char *s = strerrordesc_np (err);
  return s ? s : "Unknown error";
}

#endif /* QCOW2_ERRSTR_H */
