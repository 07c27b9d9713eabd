/* SPDX-License-Identifier: BSD-3-Clause */
/* A read-only qcow2_io backend over libnbd: remote storage that QEMU
 * names by URL.  NBD servers (nbd://, nbds://, nbd+unix://,
 * nbds+unix://) are opened with libnbd; http://, https:// and ssh://
 * are served by nbdkit's own curl and ssh plugins, started by libnbd
 * (systemd socket activation of "nbdkit -r --exit-with-parent").
 */
#ifndef QCOW2_NBDIO_H
#define QCOW2_NBDIO_H

#include "io.h"

/* Seconds a request may wait without the server answering anything,
 * and connecting (the handshake included) may take, by default.
 */
#define NBDIO_TIMEOUT 30

struct nbdio_options {
  /* Seconds (see NBDIO_TIMEOUT; 0: the default).  A request waiting
   * that long without the server answering anything fails with EIO,
   * with every other request on its connection: the connection is
   * dropped, and the next request connects again.
   */
  unsigned timeout;
  /* Optional: told what happens to a connection after the open (lost,
   * timed out, back), and debug messages.
   */
  void (*error) (const char *msg);
  void (*debug) (const char *msg);
  /* Optional: what is logged about the storage (its URL: name) that is
   * not an error, such as a connection lost and made again (the error
   * callback without it).
   */
  void (*notice) (const char *name, const char *msg);
  /* Optional: TLS credentials for nbds:// and nbds+unix:// (libnbd's
   * nbd_set_tls_certificates, nbd_set_tls_psk_file and
   * nbd_set_tls_username), given by the admin, never by an image.
   */
  const char *tls_certificates, *tls_psk_file, *tls_username;
  /* Optional: the protocols nbdkit's curl plugin may use for http://
   * and https:// storage, redirects included (its protocols=: "http",
   * "https" or "http,https", the default), given by the admin.
   */
  const char *web_protocols;
};

/* Open remote storage (opts may be NULL: the defaults), connected
 * once, so that what is wrong is logged now.  On failure returns NULL
 * with errno set and, if why is not NULL, *why a malloc'd message
 * saying what failed and what to do (or NULL).
 *
 * Reads of the storage are all in flight together (pread_many, and
 * requests from several threads), on up to NBDIO_MAX_CONNS
 * connections, made as the load needs: to nbdkit's curl and ssh
 * plugins, which each serve one request at a time, and to NBD servers
 * that allow several (multi-conn: one is enough where a server serves
 * as many requests at once as it gets).  status reports the server's
 * base:allocation (everything data without it).
 */
#define NBDIO_MAX_CONNS 4
extern struct qcow2_io *nbdio_open (const struct qcow2_remote *remote,
                                    const struct nbdio_options *opts,
                                    char **why);

#endif /* QCOW2_NBDIO_H */
