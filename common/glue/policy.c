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

int
glue_config_backing_protocols (const char *key, const char *value)
{
  struct glue_policy *p = &glue.policy;
  const char *s = value;

  p->protocols = 0;
  p->protocols_set = true;
  while (*s) {
    size_t n = strcspn (s, ",");
    unsigned i;

    for (i = 0; glue_protocols[i]; i++)
      if (strlen (glue_protocols[i]) == n &&
          strncmp (s, glue_protocols[i], n) == 0)
        break;
    if (!glue_protocols[i]) {
      nbdkit_error ("%s: \"%.*s\" is not a protocol here (file, nbd, nbds, "
                    "http, https and ssh are)", key, (int) n, s);
      return -1;
    }
    p->protocols |= 1u << i;
    s += n + (s[n] == ',');
  }
  free (p->protocols_text);
  p->protocols_text = strdup (value);
  return p->protocols_text ? 0 : -1;
}

int
glue_config_backing_root (const char *key, const char *value)
{
  char *root = realpath (value, NULL);
  struct stat st;

  if (!root || stat (root, &st) == -1 || !S_ISDIR (st.st_mode)) {
    nbdkit_error ("%s: %s: %s", key, value,
                  root ? "not a folder" : errstr (errno));
    free (root);
    return -1;
  }
  free (glue.policy.root);
  glue.policy.root = root;
  return 0;
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
 * glue_protocols); if not, *why says so.
 */
static bool
glue_policy_allows (const char *protocol, size_t len, char **why)
{
  const struct glue_policy *p = &glue.policy;

  if (!p->protocols_set)
    return true;
  for (unsigned i = 0; glue_protocols[i]; i++)
    if (strlen (glue_protocols[i]) == len &&
        strncmp (protocol, glue_protocols[i], len) == 0 &&
        (p->protocols & 1u << i))
      return true;
  if (asprintf (why, "%s %.*s is refused by backing-protocols=%s",
                len == 4 && strncmp (protocol, "file", 4) == 0
                ? "a local file, protocol" : "protocol", (int) len, protocol,
                p->protocols_text) < 0)
    *why = NULL;
  errno = EACCES;
  return false;
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

/* A local file (glue_env.open): allowed by backing-protocols=, and
 * under backing-root= once every symbolic link is followed.  The file
 * opened is the one checked, by its resolved name (a name changed in
 * between by someone who may write under the root is not what this
 * guards against: names in images are).
 */
struct qcow2_io *
glue_policy_open (void *opaque, const char *path, bool readonly, char **id)
{
  const char *root = glue.policy.root;
  size_t n = root ? strlen (root) : 0;
  struct qcow2_io *io;
  char *real;

  *id = NULL;
  if (!glue_policy_allows ("file", 4, id))
    return NULL;
  if (!root)
    return fileio_env_open (opaque, path, readonly, id);
  if (!(real = realpath (path, NULL)))
    return NULL;
  /* "/" holds everything; else root, then a '/'. */
  if (n > 1 && (strncmp (real, root, n) != 0 || real[n] != '/')) {
    if (asprintf (id, "it is %s, not under backing-root=%s: refused", real,
                  root) < 0)
      *id = NULL;
    free (real);
    errno = EACCES;
    return NULL;
  }
  io = fileio_env_open (opaque, real, readonly, id);
  free (real);
  return io;
}

/* Remote storage: allowed by backing-protocols=, its checks left on
 * unless backing-insecure=true, with the admin's TLS credentials.
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
  };

  *why = NULL;
  if (!glue_policy_allows (url, n, why))
    return NULL;
  if (p->refuse_insecure &&
      (!remote->sslverify ||
       (remote->ssh.host && !remote->ssh.verify_host))) {
    if (asprintf (why, "the name turns off %s: refused with "
                  "backing-insecure=false", remote->sslverify
                  ? "the ssh host key check (host_key_check=no)"
                  : "the check of the server's certificate "
                    "(\"sslverify\": false)") < 0)
      *why = NULL;
    errno = EACCES;
    return NULL;
  }
  return nbdio_open (remote, &opts, why);
}
