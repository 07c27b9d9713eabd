/* SPDX-License-Identifier: BSD-3-Clause */
/* The admin's policy for the files and servers images name (backing
 * files, external data files): backing-protocols=, backing-root=,
 * backing-insecure=, and the TLS credentials of nbds:// bases
 * (backing-tls-*=).  Without them, as in QEMU, an image may name any
 * local file and any server.  Enforced where the engine opens what a
 * name says (glue_env's open and open_remote), so a name from any
 * layer, local or remote, and backing= too, meets it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <nbdkit-plugin.h>

#include "errstr.h"
#include "fileio.h"
#include "glue.h"
#include "nbdio.h"

/* What backing-protocols= names, in the order of the bits. */
static const char *const glue_protocols[] = {
  "file", "nbd", "nbds", "http", "https", "ssh", NULL
};

/* Returns the bit of the protocol [s, s+n), compared without case as URL
 * schemes are (RFC 3986), or 0 if it is none of glue_protocols.
 */
static unsigned
glue_protocol_bit (const char *s, size_t n)
{
  for (unsigned i = 0; glue_protocols[i]; i++)
    if (strlen (glue_protocols[i]) == n &&
        strncasecmp (s, glue_protocols[i], n) == 0)
      return 1u << i;
  return 0;
}

int
glue_config_backing_protocols (const char *key, const char *value)
{
  struct glue_policy *p = &glue.policy;
  const char *s = value;

  p->protocols = 0;
  p->protocols_set = true;
  while (*s) {
    size_t n = strcspn (s, ",");
    unsigned bit = glue_protocol_bit (s, n);

    if (!bit) {
      nbdkit_error ("%s: \"%.*s\" is not a protocol here (file, nbd, nbds, "
                    "http, https and ssh are)", key, (int) n, s);
      return -1;
    }
    p->protocols |= bit;
    s += n + (s[n] == ',');
  }
  free (p->protocols_text);
  p->protocols_text = strdup (value);
  return p->protocols_text ? 0 : -1;
}

int
glue_config_backing_root (const char *key, const char *value)
{
  return glue_parse_folder (key, value, &glue.policy.root);
}

int
glue_config_backing_insecure (const char *key, const char *value)
{
  bool insecure;

  if (glue_parse_bool (key, value, &insecure) == -1)
    return -1;
  glue.policy.refuse_insecure = !insecure;
  return 0;
}

void
glue_policy_free (void)
{
  struct glue_policy *p = &glue.policy;

  free (p->protocols_text);
  free (p->root);
  free (p->tls_certificates);
  free (p->tls_psk_file);
  free (p->tls_username);
}

/* Whether backing-protocols= lets names reach protocol (one of
 * glue_protocols); if not, *why says so, and after a newline which
 * value allows it (the engine sends that as a hint).
 */
static bool
glue_policy_allows (const char *protocol, size_t len, char **why)
{
  const struct glue_policy *p = &glue.policy;
  const char *t = p->protocols_text;

  if (!p->protocols_set || (p->protocols & glue_protocol_bit (protocol, len)))
    return true;
  if (asprintf (why, "%s %.*s is refused by backing-protocols=%s\n"
                "backing-protocols=%s%s%.*s allows it",
                len == 4 && strncasecmp (protocol, "file", 4) == 0
                ? "a local file, protocol" : "protocol", (int) len, protocol,
                t, t, *t ? "," : "", (int) len, protocol) < 0)
    *why = NULL;
  errno = EACCES;
  return false;
}

/* Returns the protocols nbdkit's curl helper may use, redirects included
 * (its protocols=): those of http and https that backing-protocols=
 * allows.  A name is refused before if its own is not, so one at least
 * is.
 */
static const char *
glue_policy_web_protocols (void)
{
  const struct glue_policy *p = &glue.policy;
  bool http = !p->protocols_set ||
    (p->protocols & glue_protocol_bit ("http", 4));
  bool https = !p->protocols_set ||
    (p->protocols & glue_protocol_bit ("https", 5));

  return http && https ? "http,https" : https ? "https" : "http";
}

static void
glue_policy_error (const char *msg)
{
  nbdkit_error ("%s", msg);
}

static void
glue_policy_debug (const char *msg)
{
  nbdkit_debug ("%s", msg);
}

static void
glue_policy_notice (const char *name, const char *msg)
{
  glue_notice (NULL, name, msg);
}

/* Opens a local file (glue_env.open) if backing-protocols= allows it and
 * it lies under backing-root= once every symbolic link is followed.  The
 * file opened is the one checked, by its resolved name (a name changed in
 * between by someone who may write under the root is not what this guards
 * against: names in images are); but one in a folder that others may
 * change (the options' beneath, dir='s) is opened beneath it by the name
 * given, and must then be the file checked.
 */
struct qcow2_io *
glue_policy_open (void *opaque, const char *path, bool readonly, char **id)
{
  const char *root = glue.policy.root;
  const struct fileio_options *opts = opaque;
  struct qcow2_io *io;
  struct stat st, got;
  char *real;

  *id = NULL;
  if (!glue_policy_allows ("file", 4, id))
    return NULL;
  if (!root)
    return fileio_env_open (opaque, path, readonly, id);
  if (!(real = realpath (path, NULL)))
    return NULL;
  if (!glue_in_folder (real, root)) {
    /* The remedy keeps what the root holds: the folder holding both. */
    size_t k = 0;
    for (size_t i = 0; root[i] && root[i] == real[i]; i++)
      if (root[i] == '/')
        k = i;
    if (asprintf (id, "it is %s, not under backing-root=%s: refused\n"
                  "backing-root=%.*s allows it", real, root,
                  k ? (int) k : 1, k ? root : "/") < 0)
      *id = NULL;
    free (real);
    errno = EACCES;
    return NULL;
  }
  if (!fileio_is_beneath (path, opts)) {
    io = fileio_env_open (opaque, real, readonly, id);
    free (real);
    return io;
  }
  io = fileio_env_open (opaque, path, readonly, id);
  if (io && (stat (real, &st) == -1 || fileio_stat (io, &got) == -1 ||
             st.st_dev != got.st_dev || st.st_ino != got.st_ino)) {
    free (*id);
    if (asprintf (id, "it changed while it was opened: refused") < 0)
      *id = NULL;
    io->ops->close (io);
    io = NULL;
    errno = EAGAIN;
  }
  free (real);
  return io;
}

/* Opens remote storage if backing-protocols= allows it, its checks left
 * on unless backing-insecure=true, with the admin's TLS credentials.
 */
struct qcow2_io *
glue_policy_open_remote (void *opaque, const struct qcow2_remote *remote,
                         char **why)
{
  const struct glue_policy *p = &glue.policy;
  const char *url = remote->url;
  size_t n = strcspn (url, ":+");
  struct nbdio_options opts = {
    .timeout = glue.remote_timeout,
    .error = glue_policy_error,
    .debug = glue_policy_debug,
    .notice = glue_policy_notice,
    .tls_certificates = p->tls_certificates,
    .tls_psk_file = p->tls_psk_file,
    .tls_username = p->tls_username,
    .web_protocols = glue_policy_web_protocols (),
  };

  *why = NULL;
  if (!glue_policy_allows (url, n, why))
    return NULL;
  if (p->refuse_insecure &&
      (!remote->sslverify ||
       (remote->ssh.host && !remote->ssh.verify_host))) {
    if (asprintf (why, "the name turns off %s: refused with "
                  "backing-insecure=false\n"
                  "backing-insecure=true allows it", remote->sslverify
                  ? "the ssh host key check (host_key_check=no)"
                  : "the check of the server's certificate "
                    "(\"sslverify\": false)") < 0)
      *why = NULL;
    errno = EACCES;
    return NULL;
  }
  return nbdio_open (remote, &opts, why);
}
