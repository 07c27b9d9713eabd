/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdio's names (see nbdio.c): an NBD URL made absolute, and the nbdkit
 * command that serves an http(s) or ssh URL.  It calls no other file
 * of nbdio.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "nbdio-internal.h"

/* Append "key=value" (or value if key is NULL) to the argv being
 * built.
 */
static int
nbdio_arg (char ***argv, size_t *n, const char *key, const char *value)
{
  char **a = realloc (*argv, (*n + 2) * sizeof **argv);

  if (!a)
    return -1;
  *argv = a;
  if ((key ? asprintf (&a[*n], "%s=%s", key, value)
       : asprintf (&a[*n], "%s", value)) < 0) {
    a[*n] = NULL;
    return -1;
  }
  a[++*n] = NULL;
  return 0;
}

/* An NBD URL with its socket= made absolute, against the folder we are
 * in now (as QEMU, which connects before it forks): nbdkit forking into
 * the background changes to /, and connects again from there.
 */
char *
nbdio_socket_uri (const char *url)
{
  const char *q = strchr (url, '?'), *sock = NULL;
  char *cwd, *r = NULL;
  FILE *fp;
  size_t len;

  for (const char *p = q; p; p = strchr (p + 1, '&'))
    if (strncmp (p + 1, "socket=", 7) == 0)
      sock = p + 8;
  if (!sock || *sock == '/' || strncasecmp (sock, "%2f", 3) == 0)
    return strdup (url);
  if (!(cwd = getcwd (NULL, 0)) || !(fp = open_memstream (&r, &len))) {
    free (cwd);
    return NULL;
  }
  fprintf (fp, "%.*s", (int) (sock - url), url);
  /* The folder percent-encoded, as libnbd decodes the query. */
  for (const char *c = cwd; *c; c++) {
    if (isalnum ((unsigned char) *c) || strchr ("/-._~", *c))
      fputc (*c, fp);
    else
      fprintf (fp, "%%%02X", (unsigned char) *c);
  }
  fprintf (fp, "/%s", sock);
  free (cwd);
  if (fclose (fp) != 0) {
    free (r);
    return NULL;
  }
  return r;
}

/* Sets the arguments of the nbdkit serving an http(s) or ssh URL
 * (relay.c then gives it the relay's pipe as stderr, so that its lines
 * are logged with the backing file's name and its repeats counted: a
 * base down gives a line and a count, not a line per read, as
 * test-remote-http.sh checks).  Returns 0, or -errno with *why.
 */
int
nbdio_nbdkit_argv (struct nbdio *io, const struct qcow2_remote *remote,
                   char **why)
{
  const char *url = remote->url;
  char ***argv = &io->argv;
  size_t n = 0;
  bool ssh = remote->ssh.host != NULL;
  int r = 0;

  for (const char *a = "nbdkit\0-r\0--exit-with-parent\0"; *a;
       a += strlen (a) + 1)
    r |= nbdio_arg (argv, &n, NULL, a);
  io->plugin = ssh ? "ssh" : "curl";
  if (!ssh) {
    char t[32];
    r |= nbdio_arg (argv, &n, NULL, "curl");
    r |= nbdio_arg (argv, &n, "url", url);
    if (!remote->sslverify)
      r |= nbdio_arg (argv, &n, "sslverify", "false");
    if (remote->timeout) {
      snprintf (t, sizeof t, "%u", remote->timeout);
      r |= nbdio_arg (argv, &n, "timeout", t);
    }
    /* The curl plugin reads "+FILE", "-FD" and "-" as where to find the
     * cookie (nbdkit_read_password): a name in an image must not make
     * the server read its files or descriptors.  QEMU sends the string
     * as it is; nbdkit has no way to, so such a cookie is refused, as
     * is a line break, which would end the header.
     */
    if (remote->cookie &&
        (remote->cookie[0] == '+' || remote->cookie[0] == '-')) {
      if (asprintf (why, "the cookie \"%s\" is refused: nbdkit's curl "
                    "plugin would read it as the name of a file or "
                    "descriptor to read the cookie from, not as the "
                    "cookie", remote->cookie) < 0)
        *why = NULL;
      return -EINVAL;
    }
    if (remote->cookie && strpbrk (remote->cookie, "\r\n")) {
      *why = strdup ("the cookie is refused: it holds a line break");
      return -EINVAL;
    }
    if (remote->cookie)
      r |= nbdio_arg (argv, &n, "cookie", remote->cookie);
    /* Redirects stay on the web (libcurl may follow them elsewhere),
     * and within what the admin allows: an https base redirecting to
     * http:// is not read in clear when only https is.
     */
    r |= nbdio_arg (argv, &n, "protocols", io->opts.web_protocols
                    ? io->opts.web_protocols : "http,https");
    return r ? -ENOMEM : 0;
  }

  /* The URL's parts, as the engine split it. */
  r |= nbdio_arg (argv, &n, NULL, "ssh");
  r |= nbdio_arg (argv, &n, "host", remote->ssh.host);
  if (remote->ssh.port)
    r |= nbdio_arg (argv, &n, "port", remote->ssh.port);
  if (remote->ssh.user)
    r |= nbdio_arg (argv, &n, "user", remote->ssh.user);
  r |= nbdio_arg (argv, &n, "path", remote->ssh.path);
  if (!remote->ssh.verify_host)
    r |= nbdio_arg (argv, &n, "verify-remote-host", "false");
  return r ? -ENOMEM : 0;
}
